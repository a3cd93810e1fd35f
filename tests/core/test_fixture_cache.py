"""The tests' fixture cache (tests/fixture_cache.py): a pair is built once and read after, by every worker
and every later run; built again when its builder's code, its arguments or a file of it changed."""

from __future__ import annotations

import functools
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import fixture_cache
from specparity.fixtures import build_plain_constant
from specparity.fixtures.build_cache import code_digest

pytestmark = pytest.mark.model
LIVE = (1.0, 0.5)


@pytest.fixture
def cache_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The cache in a folder of this test's, as a fresh process sees it (nothing checked yet)."""
    monkeypatch.setattr(fixture_cache, "ROOT", tmp_path / "cache")
    monkeypatch.setattr(fixture_cache, "_CHECKED", set())
    monkeypatch.delenv(fixture_cache.OFF_VAR, raising=False)
    return tmp_path / "cache"


def counting(builder: Any, calls: list[bool]) -> Any:
    """``builder`` (its module and name kept: they key the cache), noting for each call whether its folder
    was there already (a read) or not (a build)."""

    @functools.wraps(builder)
    def wrapped(root: Path, *args: Any, **kwargs: Any) -> Any:
        calls.append(root.exists() and any(root.iterdir()))
        return builder(root, *args, **kwargs)

    return wrapped


def weights(target: str) -> Path:
    return Path(target) / "model.safetensors"


def test_built_once_then_read_by_a_later_process_and_built_again_when_a_file_changed(
        cache_root: Path, tmp_path: Path) -> None:
    calls: list[bool] = []
    builder = counting(build_plain_constant, calls)
    first = fixture_cache.cached(builder, tmp_path / "session", "plain", LIVE)
    assert Path(first).is_relative_to(cache_root) and calls == [False]
    stamp, content = weights(first).stat().st_mtime_ns, weights(first).read_bytes()
    # a later process (nothing checked yet): the same folder, read, not built
    fixture_cache._CHECKED.clear()
    assert fixture_cache.cached(builder, tmp_path / "session", "plain", LIVE) == first
    assert calls == [False, True] and weights(first).stat().st_mtime_ns == stamp
    # other arguments: another folder
    other = fixture_cache.cached(builder, tmp_path / "session", "plain", (2.0, 0.5))
    assert Path(other).parent.parent != Path(first).parent.parent
    assert Path(first).parents[3] == cache_root / "specparity.fixtures"
    # a test changed a file of it: the next process builds it again, and never reads the changed one
    weights(first).write_bytes(weights(first).read_bytes() + b"\0")
    fixture_cache._CHECKED.clear()
    again = fixture_cache.cached(builder, tmp_path / "session", "plain", LIVE)
    assert again == first and calls[-1] is False  # built again: the byte added is gone
    assert weights(first).stat().st_size == len(content) and weights(first).stat().st_mtime_ns != stamp
    assert not (tmp_path / "session").exists()


def test_an_export_beside_the_pair_keeps_it_and_a_file_added_to_it_builds_it_again(
        cache_root: Path, tmp_path: Path) -> None:
    """pair_gguf writes ``gguf-vN/`` into a built pair's folder: a later process must read the pair, not
    remove it while another worker reads it (the "no config.json" failures of a -n 4 run). A file added
    inside the checkpoint itself is a change."""
    calls: list[bool] = []
    builder = counting(build_plain_constant, calls)
    first = fixture_cache.cached(builder, tmp_path / "session", "plain", LIVE)
    export = Path(first).parent / "gguf-v1" / "target-f32.gguf"
    export.parent.mkdir()
    export.write_bytes(b"GGUF")
    fixture_cache._CHECKED.clear()
    assert fixture_cache.cached(builder, tmp_path / "session", "plain", LIVE) == first
    assert calls == [False, True] and export.exists()  # read, export kept
    (Path(first) / "stray.txt").write_text("x")
    fixture_cache._CHECKED.clear()
    fixture_cache.cached(builder, tmp_path / "session", "plain", LIVE)
    assert calls[-1] is False and not (Path(first) / "stray.txt").exists()  # built again


def test_a_rebuild_removes_what_the_builder_left_beside_its_folder(cache_root: Path, tmp_path: Path) -> None:
    """A builder that builds an intermediate pair beside its folder and copies from it (build_dfly_pair's
    ``NAME.dflash``) reads that intermediate again when it is there: a rebuild must not copy a stale one."""
    bases: list[str] = []

    def build_with_aside(root: Path, live: tuple[float, float]) -> str:
        base = build_plain_constant(root.with_name(root.name + ".base"), live)  # read when built, as they all do
        if not root.exists():
            shutil.copytree(base, root)
        bases.append(base)
        return str(root)

    build_with_aside.__module__ = build_plain_constant.__module__
    first = fixture_cache.cached(build_with_aside, tmp_path / "session", "aside", LIVE)
    good = weights(first).read_bytes()
    assert weights(bases[0]).read_bytes() == good
    # a test changed the folder beside it, then the folder itself
    weights(bases[0]).write_bytes(good + b"\0")
    weights(first).write_bytes(good + b"\0")
    fixture_cache._CHECKED.clear()
    assert fixture_cache.cached(build_with_aside, tmp_path / "session", "aside", LIVE) == first
    rebuilt = weights(bases[1]).read_bytes()
    assert len(bases) == 2 and rebuilt != good + b"\0"  # the intermediate was built again, not read
    assert weights(first).read_bytes() == rebuilt  # and the folder copied from it


def test_off_builds_in_the_sessions_folder(cache_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(fixture_cache.OFF_VAR, "0")
    target = fixture_cache.cached(build_plain_constant, tmp_path / "session", "plain", LIVE)
    assert Path(target).is_relative_to(tmp_path / "session" / "plain") and not cache_root.exists()


def test_workers_asking_at_once_wait_for_one_build(cache_root: Path, tmp_path: Path) -> None:
    calls: list[bool] = []
    builder = counting(build_plain_constant, calls)
    got: list[str] = []
    threads = [threading.Thread(target=lambda: got.append(
        fixture_cache.cached(builder, tmp_path / "session", "plain", LIVE))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(set(got)) == 1 and len(got) == 3
    assert calls.count(False) == 1  # one build; the others read it


def test_only_the_two_most_recently_used_code_folders_are_kept(cache_root: Path, tmp_path: Path) -> None:
    now = time.time()
    # unused for two hours (a, b), 30 s (c) and 60 s (d): d is third, but a run going on now may use it;
    # another module's builders keep their own (e)
    folders = cache_root / "specparity.fixtures"
    for name, age in (("a", 7200), ("b", 7300), ("c", 30), ("d", 60)):
        (folders / (name * 16)).mkdir(parents=True)
        os.utime(folders / (name * 16), (now - age, now - age))
    (cache_root / "specparity.fixtures.dflash" / ("e" * 16)).mkdir(parents=True)
    os.utime(cache_root / "specparity.fixtures.dflash" / ("e" * 16), (now - 7200, now - 7200))
    fixture_cache.cached(build_plain_constant, tmp_path / "session", "plain", LIVE)
    kept = sorted(p.name for p in folders.iterdir() if p.is_dir())
    assert kept == sorted([code_digest("specparity.fixtures"), "c" * 16, "d" * 16])
    assert (cache_root / "specparity.fixtures.dflash" / ("e" * 16)).is_dir()


@pytest.fixture
def listed_plain(monkeypatch: pytest.MonkeyPatch) -> Any:
    """tests/fixture_pairs.py listing one cheap pair only (build_plain_constant: a tenth of a second)."""
    import fixture_pairs

    plain = fixture_pairs.Pair("plain", "specparity.fixtures:build_plain_constant", args=(LIVE,))
    monkeypatch.setattr(fixture_pairs, "PAIRS", {"plain": plain})
    return fixture_pairs


def test_under_ci_a_test_never_builds_a_listed_pair_and_says_what_builds_it(
        cache_root: Path, tmp_path: Path, listed_plain: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A listed pair is built before pytest (scripts/build-test-fixtures); under CI a test that would build it
    fails with what to run, and builds nothing. Built (as the script builds it), it is read; a pair not listed is
    built where it is first used, CI or not; off CI a listed pair missing is built, as before."""
    monkeypatch.setenv("CI", "1")
    assert os.environ.get("PYTEST_CURRENT_TEST")  # inside a test, as every test's fixtures are
    with pytest.raises(pytest.fail.Exception, match="fixture pair plain is not built: scripts/build-test-fixtures"):
        listed_plain.pair("plain", tmp_path / "session")
    assert not any(cache_root.rglob("*.safetensors"))
    other = fixture_cache.cached(build_plain_constant, tmp_path / "session", "plain", (2.0, 0.5))
    assert weights(other).is_file()  # not listed (other arguments): built here
    with monkeypatch.context() as outside:  # the script: not inside a test
        outside.delenv("PYTEST_CURRENT_TEST")
        built = listed_plain.pair("plain", tmp_path / "session")
    fixture_cache._CHECKED.clear()  # a later process: the test's own run
    assert listed_plain.pair("plain", tmp_path / "session") == built
    monkeypatch.delenv("CI")
    shutil.rmtree(cache_root)
    fixture_cache._CHECKED.clear()
    assert weights(listed_plain.pair("plain", tmp_path / "session")).is_file()
