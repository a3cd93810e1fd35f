"""Per-user locations ($SPECPARITY_HOME, else the platform's user cache dir), and names safe as file names."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path


def home() -> Path:
    env = os.environ.get("SPECPARITY_HOME")
    if env:
        from specparity.inputs import expand_user

        return expand_user(env, "SPECPARITY_HOME")
    if sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "specparity"


def slugify(s: str) -> str:
    """``s`` as a file name: each run of characters other than letters, digits, ``._-`` made one ``-``."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", s).strip("-") or "record"
