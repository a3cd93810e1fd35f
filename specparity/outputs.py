"""Checks on output locations, run before any work starts.

A run that can only fail when it writes its result fails at once instead, and
nothing that exists is overwritten without ``--force``: a ``--record-dir`` must
be a directory that exists or can be created; a file output (``--save-log``,
``bisect dump --out`` and its manifest) must not exist, unless forced, and its
directory must be writable.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specparity.errors import UsageError
from specparity.inputs import expand_user
from specparity.store import name_too_long


def _probe_write(directory: Path) -> str | None:
    """Why a file cannot be created in ``directory``, or None (tried for real: root passes
    every permission check, a read-only mount or /proc does not)."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".specparity-write-check-", dir=directory)
    except OSError as err:
        return err.strerror or type(err).__name__
    os.close(fd)
    os.unlink(tmp)
    return None


def check_record_dir(path: str | os.PathLike | None, flag: str = "--record-dir") -> Path | None:
    """``path`` is a writable directory, or can be created as one.

    Directories this check had to create are removed again: the record creates them
    when it is written.
    """
    if path is None:
        return None
    if str(path).strip() == "":
        raise UsageError(f"{flag} {str(path)!r}: empty path")
    p = expand_user(path, flag).absolute()
    if p.exists() and not p.is_dir():
        raise UsageError(f"{flag} {path}: exists and is not a directory")
    created: list[Path] = []
    try:
        missing = [d for d in [p, *p.parents] if not d.exists()]
        for d in reversed(missing):
            try:
                d.mkdir()
            except OSError as err:
                raise UsageError(f"{flag} {path}: cannot be created ({d}:"
                                 f" {err.strerror or type(err).__name__})") from None
            created.append(d)
        why = _probe_write(p)
        if why is not None:
            raise UsageError(f"{flag} {path}: cannot write there ({why})")
    finally:
        for d in reversed(created):
            try:
                d.rmdir()
            except OSError:
                pass
    return p


def check_new_file(path: str | os.PathLike | None, flag: str, force: bool = False,
                   also: tuple[str | os.PathLike, ...] = (), make_parents: bool = False) -> Path | None:
    """``path`` (and each companion file in ``also``, e.g. a manifest) may be written.

    It must not exist unless ``force`` (and even then must not be a directory);
    a symbolic link counts as existing (a write would clobber its target). Its
    directory must exist and take a new file; with ``make_parents`` it may be
    missing, and then its nearest existing ancestor must be a directory that
    takes one (the writer creates the rest).
    """
    if path is None:
        return None
    if str(path).strip() == "":
        raise UsageError(f"{flag} {str(path)!r}: empty path")
    p = expand_user(path, flag)
    for target in [p, *(expand_user(a, flag) for a in also)]:
        long = name_too_long(target)
        if long is not None:
            raise UsageError(f"{flag} {target}: {long}")
        if target.is_dir():
            raise UsageError(f"{flag} {target}: is a directory")
        if (target.exists() or target.is_symlink()) and not force:
            what = "exists as a link" if target.is_symlink() else "exists"
            raise UsageError(f"{flag} {target}: {what} (pass --force to overwrite it)")
    parent = p.absolute().parent
    if make_parents:
        while not parent.exists() and not parent.is_symlink() and parent != parent.parent:
            parent = parent.parent
        if not parent.is_dir():
            raise UsageError(f"{flag} {path}: {parent} is not a directory")
    elif parent.exists() and not parent.is_dir():
        raise UsageError(f"{flag} {path}: {parent} is not a directory")
    elif not parent.is_dir():
        raise UsageError(f"{flag} {path}: directory {parent} does not exist")
    why = _probe_write(parent)
    if why is not None:
        raise UsageError(f"{flag} {path}: cannot write in {parent} ({why})")
    return p


def record_dir_callback(ctx: Any, param: Any, value: str | None) -> str | None:
    """click callback for ``--record-dir``: checked while the options are parsed."""
    check_record_dir(value, "--record-dir")
    return value


def force_option(f: Callable) -> Callable:
    import click

    return click.option("--force", is_flag=True,
                        help="Overwrite an existing output file.")(f)
