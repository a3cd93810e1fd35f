"""The fixture pairs the tests build, kept from one run to the next in specparity's own cache.

A pair is a pure function of its builder's code, its arguments and the libraries that compute it (the
DFlash and DSpark drafters are fitted with MLX ops: 5 to 30 CPU seconds each, and every worker of every
run built its own). :func:`cached` keeps it under ``$SPECPARITY_HOME/test-fixtures/MODULE/CODE/NAME-ARGS``:

- MODULE is the builder's module; CODE digests its source and that of every specparity module it imports, however
  deep (imports inside functions included), with the versions of Python, MLX, mlx-lm, tokenizers and
  NumPy and the machine: change any of them and the pairs are built anew, never read from an older build;
- NAME-ARGS names the builder and digests its arguments;
- the builder builds it, atomically, as it builds any fixture, once: a lock beside it keeps the other
  workers waiting for it, and they read what it built;
- a manifest of every file (its size and modification time) is written once it is built and checked on
  its first use in each process: a pair a test changed, or one half removed, is removed and built
  again, never used (a folder an export added beside the pair, pair_gguf's ``gguf-vN/``, is no change).

Only the two most recently used CODE folders of each MODULE are kept. ``SPECPARITY_TEST_FIXTURE_CACHE=0`` builds every
pair in the session's own folder, as before (what a first run on a fresh machine does anyway).
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from specparity import paths
from specparity.fixtures.build_cache import code_digest, prune  # the product's own: one digest for both

T = TypeVar("T")

OFF_VAR = "SPECPARITY_TEST_FIXTURE_CACHE"

# read once, at collection: the real cache, before any test points $SPECPARITY_HOME elsewhere
ROOT = paths.home() / "test-fixtures"
_CHECKED: set[str] = set()


def enabled() -> bool:
    return os.environ.get(OFF_VAR, "1") != "0"


def _manifest(folder: Path) -> dict[str, list[int]]:
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and not p.is_symlink():
            st = p.stat()
            out[str(p.relative_to(folder))] = [st.st_size, st.st_mtime_ns]
    return out


def _unchanged(stored: dict[str, list[int]], now: dict[str, list[int]]) -> bool:
    """Every file the build wrote is there as written, and no file was added to a folder the build wrote.

    A new folder is what an export made from the pair after it was built (pair_gguf's ``gguf-vN/``): it
    derives from the pair, so the pair stays good. Rebuilding for it removed the pair under another
    worker's feet (a test read a half-removed target: "no config.json")."""
    built = {os.path.dirname(name) for name in stored}
    return all(now.get(name) == stat for name, stat in stored.items()) and all(
        name in stored for name in now if os.path.dirname(name) in built)


def _siblings(folder: Path) -> list[Path]:
    """Folders a builder made beside ``folder`` (``NAME.something``: build_dfly_pair's DFlash pair, which it
    copies from): built from the same arguments, so never kept past a rebuild of ``folder``."""
    return [p for p in folder.parent.glob(glob.escape(folder.name) + ".*") if p.is_dir() and not p.is_symlink()]


def spec_of(builder: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """What a pair is built from: the builder and its arguments (a folder's manifest stores it)."""
    return json.dumps({"builder": f"{builder.__module__}.{builder.__qualname__}", "args": args, "kwargs": kwargs},
                      sort_keys=True, default=str)


def _built_before_pytest(name: str, spec: str) -> None:
    """Under CI, inside a test: a pair scripts/build-test-fixtures builds (tests/fixture_pairs.py) is never built
    here: the script was not run, or the test changed what it built (its manifest no longer matched)."""
    if not (os.environ.get("CI") and os.environ.get("PYTEST_CURRENT_TEST")):
        return
    from fixture_pairs import listed

    if (name, spec) in listed():
        import pytest

        pytest.fail(f"fixture pair {name} is not built: scripts/build-test-fixtures builds it before pytest "
                    f"(or a test changed it after it was built)", pytrace=False)


def cached(builder: Callable[..., T], fallback_root: Path, name: str, *args: Any, **kwargs: Any) -> T:
    """``builder(FOLDER, *args, **kwargs)``, FOLDER kept in the cache (above), or ``fallback_root / name``
    when the cache is off. ``builder`` builds into FOLDER, or returns what a build of these arguments left
    there (every fixture builder here does both)."""
    if not enabled():
        return builder(fallback_root / name, *args, **kwargs)
    code = code_digest(builder.__module__)
    spec = spec_of(builder, args, kwargs)
    code_dir = ROOT / builder.__module__ / code
    folder = code_dir / f"{name}-{hashlib.sha256(spec.encode()).hexdigest()[:10]}"
    code_dir.mkdir(parents=True, exist_ok=True)
    if str(code_dir) not in _CHECKED:
        _CHECKED.add(str(code_dir))
        prune(code_dir)
    manifest = folder.with_name(folder.name + ".manifest.json")
    with open(folder.with_name(folder.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if str(folder) not in _CHECKED:
                try:
                    stored = json.loads(manifest.read_text())
                    good = stored["spec"] == spec and _unchanged(stored["files"], _manifest(folder))
                except (OSError, ValueError, TypeError, KeyError):
                    good = False
                if not good:  # never built, built in part, or changed since: built again
                    _built_before_pytest(name, spec)
                    manifest.unlink(missing_ok=True)
                    shutil.rmtree(folder, ignore_errors=True)
                    for aside in _siblings(folder):  # what the builder made beside it goes too
                        shutil.rmtree(aside, ignore_errors=True)
            started = time.monotonic()
            built = builder(folder, *args, **kwargs)
            if str(folder) not in _CHECKED:
                if not manifest.exists():
                    manifest.write_text(json.dumps({"spec": spec, "files": _manifest(folder),
                                                    "build_seconds": round(time.monotonic() - started, 1)}))
                _CHECKED.add(str(folder))
            return built
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
