"""Per-user locations: $SPECPARITY_HOME, else the platform's user cache dir."""

from __future__ import annotations

import os
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
