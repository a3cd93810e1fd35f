"""The one-time builds the tests use (engines' pinned environments): where they are, and a skip, or
under CI a failure, when one is missing (``scripts/build-env NAME`` builds it; no test builds it)."""

from __future__ import annotations

import os

import pytest

from specparity import environments as envs

# read once, at collection: the real cache, before any test points $SPECPARITY_HOME elsewhere
REAL_CACHE = envs.cache_root()

def built(name: str) -> envs.Environment:
    """The packaged environment ``name`` from the real cache: skip when not built, fail under CI."""
    found = envs.find_environment(name, root=REAL_CACHE)
    if found is None:
        message = f"environment {name} is not built: run scripts/build-env {name}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found
