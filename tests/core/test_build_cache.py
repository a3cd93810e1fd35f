"""The fixture build cache (specparity/fixtures/build_cache.py): `fixtures make --dflash` asked again with the same
arguments, into any folder, is a copy of the build made before; a changed entry, other code, other arguments or the
cache turned off build anew; a bad cache setting is one line and exit 2. Run as a user types it (the CLI), with the
DSpark format, whose fitted drafter builds in seconds."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import run_cli
from specparity.fixtures import build_cache

pytestmark = pytest.mark.model
MAKE = ("fixtures", "make")
ARGS = ("--dflash", "qwen3", "--drafter-format", "dspark", "--block-size", "8")


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def entries(cache: Path) -> list[Path]:
    return sorted(p.parent for p in cache.glob(f"*/*/*/{build_cache.MANIFEST}"))


def test_the_same_build_again_is_a_copy_and_a_changed_entry_is_built_anew(cli_bin: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = {build_cache.CACHE_VAR: str(cache)}
    first = run_cli(cli_bin, *MAKE, str(tmp_path / "a"), *ARGS, env=env)
    assert first.returncode == 0, first.stderr
    assert "building a DSpark qwen3 pair" in first.stderr and "build cache" not in first.stderr
    [entry] = entries(cache)
    assert entry.parent.parent.name == "dspark"
    again = run_cli(cli_bin, *MAKE, str(tmp_path / "b"), *ARGS, env=env)
    assert again.returncode == 0, again.stderr
    assert "building" not in again.stderr and f"copied from the build cache {entry}" in again.stderr
    assert again.stdout == first.stdout.replace(str(tmp_path / "a"), str(tmp_path / "b"))
    assert files(tmp_path / "b") == files(tmp_path / "a") != {}
    # --json says the same record either way
    as_json = run_cli(cli_bin, *MAKE, str(tmp_path / "c"), *ARGS, "--json", env=env)
    record = json.loads(as_json.stdout)
    assert record["exit_code"] == 0 and record["kind"] == "dspark" and record["target"].endswith("c/target"), record
    # other arguments: another entry, built
    seeded = run_cli(cli_bin, *MAKE, str(tmp_path / "d"), *ARGS, "--seed", "1", env=env)
    assert "building" in seeded.stderr and len(entries(cache)) == 2
    assert files(tmp_path / "d") != files(tmp_path / "a")
    # an entry whose file changed is removed and the fixture built again (and kept again), never copied
    weights = next((entry / build_cache.FIXTURE / "draft").glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-1] + b"\1")
    rebuilt = run_cli(cli_bin, *MAKE, str(tmp_path / "e"), *ARGS, env=env)
    assert rebuilt.returncode == 0 and "building" in rebuilt.stderr and "build cache" not in rebuilt.stderr
    assert files(tmp_path / "e") == files(tmp_path / "a")  # the same build: the fit is deterministic
    assert build_cache.intact(entry) and files(entry / build_cache.FIXTURE) == files(tmp_path / "a")


def test_a_folder_there_already_goes_to_the_builder_and_the_cache_can_be_turned_off(
        cli_bin: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = {build_cache.CACHE_VAR: str(cache)}
    assert run_cli(cli_bin, *MAKE, str(tmp_path / "a"), *ARGS, env=env).returncode == 0
    # a fixture built with other arguments is refused as before, the cache holding these ones notwithstanding
    other = run_cli(cli_bin, *MAKE, str(tmp_path / "a"), *ARGS[:-1], "16", env=env)
    # (said in the command's flags: 8 verify rows, not the 7 proposals the record holds)
    assert other.returncode == 2 and other.stderr == (
        f"Error: OUT_DIR {tmp_path / 'a'} holds a DSpark pair built with --block-size 8 (asked 16): --overwrite"
        " rebuilds it, or choose another OUT_DIR\n"), other.stderr
    # --overwrite of it with the cached arguments: the copy takes its place
    over = run_cli(cli_bin, *MAKE, str(tmp_path / "a"), *ARGS, "--overwrite", env=env)
    assert over.returncode == 0 and "copied from the build cache" in over.stderr, over.stderr
    # off: built, nothing kept
    off = run_cli(cli_bin, *MAKE, str(tmp_path / "b"), *ARGS, env={build_cache.CACHE_VAR: "0"})
    assert off.returncode == 0 and "building" in off.stderr and "cache" not in off.stderr
    assert files(tmp_path / "b") == files(tmp_path / "a") and len(entries(cache)) == 1
    # by default: in $SPECPARITY_HOME (the suite's: this test's own)
    home = Path(os.environ["SPECPARITY_HOME"])
    assert run_cli(cli_bin, *MAKE, str(tmp_path / "c"), *ARGS).returncode == 0
    assert len(entries(home / "fixture-builds")) == 1


def test_a_cache_that_is_a_file_is_one_line_and_exit_2_before_any_work(cli_bin: str, tmp_path: Path) -> None:
    bad = tmp_path / "cache-file"
    bad.write_text("not a folder")
    run = run_cli(cli_bin, *MAKE, str(tmp_path / "a"), *ARGS, env={build_cache.CACHE_VAR: str(bad)})
    assert run.returncode == 2 and run.stderr.startswith("Error: ") and len(run.stderr.strip().splitlines()) == 1
    assert build_cache.CACHE_VAR in run.stderr and str(bad) in run.stderr
    assert not (tmp_path / "a").exists() and bad.read_text() == "not a folder"


def test_the_closure_reaches_every_specparity_module_a_builder_imports_at_any_depth() -> None:
    closure = build_cache.module_closure("specparity.fixtures.dflash")
    # imported at the top (fixtures), inside a function (prompts, fixture_models), and their parents
    for name in ("specparity", "specparity.fixtures.dflash", "specparity.fixtures", "specparity.prompts",
                 "specparity.fixture_models.dflash_draft", "specparity.errors"):
        assert name in closure, name
    assert all(p.suffix == ".py" and p.is_file() for p in closure.values())
    assert not any(n.startswith(("mlx", "tokenizers")) for n in closure)  # libraries go by their version


def test_an_outside_builders_own_modules_are_in_its_closure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine published as its own distribution: its builder's package is followed as specparity's is."""
    pkg = tmp_path / "outside_engine"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "fixtures.py").write_text("def build():\n    from outside_engine import shapes\n    import json\n")
    (pkg / "shapes.py").write_text("from specparity.errors import UsageError\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    closure = build_cache.module_closure("outside_engine.fixtures")
    assert {"outside_engine", "outside_engine.shapes", "specparity.errors"} <= set(closure)
    assert "json" not in closure
    before = build_cache.code_digest.__wrapped__("outside_engine.fixtures")
    (pkg / "shapes.py").write_text("from specparity.errors import UsageError\nX = 1\n")
    assert build_cache.code_digest.__wrapped__("outside_engine.fixtures") != before


def test_the_code_digest_moves_with_any_module_of_the_closure_and_with_a_library_version(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    digest = build_cache.code_digest.__wrapped__  # uncached
    before = digest("specparity.fixtures.dflash")
    assert digest("specparity.fixtures.dflash") == before
    prompts = build_cache._module_file("specparity.prompts")
    assert prompts is not None
    changed = tmp_path / "prompts.py"
    changed.write_text(prompts.read_text() + "\n# one more line\n")
    real = build_cache._module_file
    monkeypatch.setattr(build_cache, "_module_file",
                        lambda name: changed if name == "specparity.prompts" else real(name))
    assert digest("specparity.fixtures.dflash") != before
    monkeypatch.setattr(build_cache, "_module_file", real)
    real_version = build_cache.metadata.version
    monkeypatch.setattr(build_cache.metadata, "version",
                        lambda lib: "0.0.0" if lib == "mlx" else real_version(lib))
    assert digest("specparity.fixtures.dflash") != before
