"""Per-user locations ($SPECPARITY_HOME, else the platform's user cache dir), and names safe as file names."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path


def home() -> Path:
    """``$SPECPARITY_HOME``, else ``<user cache dir>/specparity``: a directory this user can use (or create).

    A file there, or a directory this user cannot read and write, is a UsageError naming it (bad
    configuration, exit 2), not the OSError every later write would raise."""
    env = os.environ.get("SPECPARITY_HOME")
    if env:
        from specparity.inputs import expand_user

        return usable_dir(expand_user(env, "SPECPARITY_HOME"), "SPECPARITY_HOME")
    if sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return usable_dir(base / "specparity", "specparity's cache directory (set SPECPARITY_HOME to move it)")


def usable_dir(path: Path, what: str) -> Path:
    """``path`` when it is a directory this user can read and write, or can be created as one (its nearest
    existing ancestor is such a directory); else a UsageError naming ``what`` and the path. Nothing is created."""
    from specparity.errors import UsageError

    for p in [path, *path.absolute().parents]:
        try:
            exists = os.path.lexists(p)
            if not exists:
                continue
            if not p.is_dir():
                said = "is not a directory" if p == path else f"cannot be created: {p} is not a directory"
                raise UsageError(f"{what} {path} {said} (a file?): point it at a directory")
        except OSError as err:
            raise UsageError(f"{what} {path}: cannot be read ({err.strerror or type(err).__name__})") from None
        need = os.R_OK | os.W_OK | os.X_OK if p == path else os.W_OK | os.X_OK
        if not os.access(p, need):
            raise UsageError(f"{what} {path}: {'it' if p == path else p} is not readable and writable by this"
                             " user: point it at a directory of your own")
        return path
    return path


def slugify(s: str) -> str:
    """``s`` as a file name: each run of characters other than letters, digits, ``._-`` made one ``-``."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", s).strip("-") or "record"
