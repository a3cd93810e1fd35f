"""scripts/build-test-fixtures: build tests/fixture_pairs.py's pairs into the tests' fixture cache (see the
shell script). Exit 0 when every pair is built or found, 2 for an unknown name, 1 when a build failed."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"


def _build(name: str, scratch: str) -> tuple[str, float, str]:
    """Build (or find) pair ``name``: (name, seconds, "" or the error). Runs in a pool process (spawned: it
    imports the tests' modules afresh)."""
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    import fixture_pairs

    started = time.monotonic()
    try:
        fixture_pairs.pair(name, Path(scratch) / name)
    except Exception as exc:  # a failed build is reported and the others go on
        return name, time.monotonic() - started, f"{type(exc).__name__}: {exc}"
    return name, time.monotonic() - started, ""


def main(argv: list[str]) -> int:
    # this script is where the listed pairs are built: never "a test building one" (tests/fixture_cache.py's CI
    # check), even when a test runs it
    os.environ.pop("PYTEST_CURRENT_TEST", None)
    sys.path.insert(0, str(TESTS))
    import fixture_cache
    import fixture_pairs

    if not fixture_cache.enabled():
        print(f"build-test-fixtures: {fixture_cache.OFF_VAR}=0: the cache is off, each test session builds its own "
              "pairs", file=sys.stderr)
        return 0
    names = argv or list(fixture_pairs.PAIRS)
    unknown = [n for n in names if n not in fixture_pairs.PAIRS]
    if unknown:
        print(f"build-test-fixtures: unknown pair {unknown[0]!r} (tests/fixture_pairs.py lists "
              f"{', '.join(fixture_pairs.PAIRS)})", file=sys.stderr)
        return 2
    print(f"build-test-fixtures: {len(names)} pair(s) into {fixture_cache.ROOT}", file=sys.stderr)
    started, failed = time.monotonic(), 0
    workers = min(len(names), os.cpu_count() or 1)
    with tempfile.TemporaryDirectory(prefix="test-fixtures-") as scratch, \
            concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        jobs = [pool.submit(_build, name, scratch) for name in names]  # PAIRS lists the longest first
        for job in concurrent.futures.as_completed(jobs):
            name, seconds, error = job.result()
            failed += bool(error)
            print(f"build-test-fixtures: {name}: {error or 'ready'} ({seconds:.1f} s)", file=sys.stderr)
    print(f"build-test-fixtures: {len(names) - failed} of {len(names)} ready in {time.monotonic() - started:.1f} s",
          file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
