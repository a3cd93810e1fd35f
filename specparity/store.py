"""Small persistent stores: the one way a file is written, and an inter-process lock.

Every file the toolkit writes goes through :func:`new_files` (or its one-file forms
:func:`write_new` and :func:`atomic_write_text`): the content is written in a private
folder created exclusively (``mkdtemp``: a random name, mode 0700) beside the target, so
nothing that already sits beside the target (a link, a hard link, a folder, another
run's file) is ever written through; then each target is *claimed*:

- without ``force`` by a hard link (``link(2)`` fails when the name exists in any form,
  a dangling link included): two runs aimed at one name cannot both succeed, and
  nothing is replaced. Where the file system has no hard links, the name is claimed
  with ``O_CREAT | O_EXCL | O_NOFOLLOW`` and the content renamed over that claim.
- with ``force`` by ``rename(2)``: the name is replaced (a link there is replaced
  itself, never written through), readers see the old file or the new one.

The private folder is removed on every path out, an exception or Ctrl-C included, so
no temporary file is left behind.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from specparity.errors import UsageError

# errors of link(2) that mean "this file system has no hard links here", not "the name is taken"
_NO_HARD_LINKS = {errno.EPERM, errno.EXDEV, errno.EMLINK, errno.ENOSYS, errno.EOPNOTSUPP,
                  getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)}
_TMP_PREFIX = ".specparity-"  # short: the folder's name never nears the file-name limit


def name_too_long(path: Path) -> str | None:
    """Why ``path``'s last component cannot be created in its folder (None: it can, as far as its length goes)."""
    name = os.fsencode(path.name)
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        limit = os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    if len(name) > limit:
        return f"its name is {len(name)} bytes, more than the {limit} this file system allows"
    return None


@contextlib.contextmanager
def new_files(targets: Sequence[str | os.PathLike[str]], *, force: bool = False,
              flag: str = "--out") -> Iterator[list[Path]]:
    """Temporary paths for ``targets`` (one each, same names, in one private folder beside the first
    target); the block writes them, and when it ends each target is claimed (the module docstring).

    A target that exists is refused (UsageError naming ``flag``, exit 2) unless ``force``; a target that
    is a directory is refused either way. When a later claim fails, the targets this call created are
    removed again (a replaced file cannot be put back: ``force`` said it may go). The private folder is
    removed whatever happens.
    """
    paths = [Path(t) for t in targets]
    if not paths:
        raise ValueError("new_files: no targets")
    folder = paths[0].parent
    for p in paths:
        why = name_too_long(p)
        if why is not None:
            raise UsageError(f"{flag} {p}: {why}")
    try:
        private = Path(tempfile.mkdtemp(prefix=_TMP_PREFIX, dir=folder))
    except OSError as err:
        raise UsageError(f"{flag} {paths[0]}: cannot write in {folder} ({err.strerror or err})") from None
    try:
        tmps = []
        for i, p in enumerate(paths):  # a folder each: names may repeat, and none grows longer
            (private / str(i)).mkdir()
            tmps.append(private / str(i) / p.name)
        yield tmps
        claimed: list[Path] = []
        try:
            for tmp, target in zip(tmps, paths):
                if not tmp.exists():
                    raise FileNotFoundError(errno.ENOENT, "the writer made no file", str(tmp))
                if _claim(tmp, target, force, flag):
                    claimed.append(target)
        except BaseException:
            for target in claimed:
                with contextlib.suppress(OSError):
                    target.unlink()
            raise
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _claim(tmp: Path, target: Path, force: bool, flag: str) -> bool:
    """Give ``tmp`` the name ``target``; True when the name was new (created here), False when replaced."""
    existed = os.path.lexists(target)
    if force:
        if target.is_dir() and not target.is_symlink():
            raise UsageError(f"{flag} {target}: is a directory")
        try:
            os.replace(tmp, target)
        except OSError as err:
            raise UsageError(f"{flag} {target}: cannot write ({err.strerror or err})") from None
        return not existed
    try:
        os.link(tmp, target, follow_symlinks=False)
        return True
    except FileExistsError:
        raise UsageError(f"{flag} {target}: exists (written meanwhile by another run?); it is left as it is"
                         " (pass --force to overwrite it)") from None
    except OSError as err:
        if err.errno not in _NO_HARD_LINKS:
            raise UsageError(f"{flag} {target}: cannot write ({err.strerror or err})") from None
    try:
        fd = os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except FileExistsError:
        raise UsageError(f"{flag} {target}: exists (written meanwhile by another run?); it is left as it is"
                         " (pass --force to overwrite it)") from None
    except OSError as err:
        raise UsageError(f"{flag} {target}: cannot write ({err.strerror or err})") from None
    os.close(fd)
    try:
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            target.unlink()
        raise
    return True


def write_new(target: str | os.PathLike[str], data: str | bytes, *, force: bool = False,
              flag: str = "--out") -> Path:
    """Write ``data`` as the new file ``target`` (see :func:`new_files`); returns its path."""
    with new_files([target], force=force, flag=flag) as (tmp,):
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data, encoding="utf-8")
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
    return Path(target)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` so readers see the old or the new file, never half (a file of the
    toolkit's own, replaced as it is updated: a gate store, a digest memo)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    write_new(p, text, force=True, flag=str(p))


@contextlib.contextmanager
def locked(path: str | os.PathLike) -> Iterator[None]:
    """An exclusive advisory lock on ``path``.lock, held for the block."""
    import fcntl

    p = Path(str(path) + ".lock")
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
