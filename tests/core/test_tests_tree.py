"""The tests' own tree mirrors the packages: a folder per package, files named by subject.

A test file dropped in ``tests/`` itself, in a folder no package owns, or named after
the issue that added it fails here; so does a basename used twice (pytest imports
test modules by basename: the second would shadow the first).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
# tests/<folder> -> the source folder it mirrors (core: specparity's own top-level modules)
MIRRORS = {
    "core": "specparity", "commands": "specparity/commands", "engines": "specparity/engines",
    "probes": "probes", "bisect": "bisect", "harness": "harness", "harness/gated": "harness/gated",
    "records": "records", "scripts": "scripts", "docs": "docs", "diagnose": "specparity/diagnose",
}


def _test_files() -> list[Path]:
    return sorted(TESTS.rglob("test_*.py"))


def test_every_test_file_sits_in_a_package_folder() -> None:
    stray = [str(p.relative_to(TESTS)) for p in _test_files()
             if str(p.parent.relative_to(TESTS)) not in MIRRORS]
    assert not stray, f"test files outside a package folder (tests/<package>/): {stray}"


def test_every_folder_mirrors_a_source_folder() -> None:
    for folder, source in MIRRORS.items():
        assert (TESTS / folder).is_dir(), folder
        assert (ROOT / source).is_dir(), f"tests/{folder} mirrors {source}, which is gone"


def test_files_are_named_by_subject_and_once() -> None:
    files = _test_files()
    assert len(files) > 40  # the tree is really read
    by_issue = [p.name for p in files if re.search(r"issue|_\d+\.py$", p.name)]
    assert not by_issue, f"named after an issue, not a subject: {by_issue}"
    twice = [n for n, c in Counter(p.name for p in files).items() if c > 1]
    assert not twice, f"basenames used twice: {twice}"
