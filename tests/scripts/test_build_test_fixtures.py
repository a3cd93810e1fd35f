"""scripts/build-test-fixtures: the pairs tests/fixture_pairs.py lists are built before pytest into the tests'
fixture cache, where the tests then find them; a second run builds nothing."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import fixture_pairs

CHEAP = fixture_pairs.built_pair("gemma3_text-float32", arch="gemma3_text")  # the cheapest listed: seconds


def run(repo_root: Path, home: Path, *names: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(repo_root / "scripts" / "build-test-fixtures"), *names], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "SPECPARITY_HOME": str(home)})


def test_an_unknown_pair_is_a_usage_error_that_lists_the_pairs(repo_root: Path, tmp_path: Path) -> None:
    proc = run(repo_root, tmp_path / "home", "no-such-pair")
    assert proc.returncode == 2 and proc.stderr.startswith("build-test-fixtures: unknown pair 'no-such-pair'")
    assert CHEAP.name in proc.stderr and not (tmp_path / "home").exists()


@pytest.mark.slow
@pytest.mark.model
def test_a_listed_pair_is_built_into_the_cache_the_tests_read_and_a_second_run_builds_nothing(
        repo_root: Path, tmp_path: Path) -> None:
    assert CHEAP.name in fixture_pairs.PAIRS
    home = tmp_path / "home"
    proc = run(repo_root, home, CHEAP.name)
    assert proc.returncode == 0 and "1 of 1 ready" in proc.stderr, proc.stderr
    [manifest] = (home / "test-fixtures").glob(f"*/*/{CHEAP.name}-*.manifest.json")
    stored = json.loads(manifest.read_text())
    assert (CHEAP.name, stored["spec"]) == CHEAP.key() and stored["build_seconds"] > 0  # what the tests ask for
    stamp = manifest.stat().st_mtime_ns
    again = run(repo_root, home, CHEAP.name)
    assert again.returncode == 0 and "1 of 1 ready" in again.stderr, again.stderr
    assert manifest.stat().st_mtime_ns == stamp  # found, not built again
