"""The fixture builder makes real, deterministic, loadable mlx-lm checkpoints."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx_lm
import pytest

from conftest import ROWS4, build, run_cli
from specparity.checkpoint import fingerprint
from specparity.fixtures import FixtureInfo, build_pair, build_plain_constant

pytestmark = pytest.mark.model


@pytest.mark.parametrize("arch", ["llama", "qwen3_5", "gemma3_text", "qwen3_moe"])
def test_each_arch_loads_offline_with_a_round_tripping_tokenizer(fixture_root, arch):
    info = build(fixture_root, f"{arch}-float32", arch=arch)
    model, tok = mlx_lm.load(info.target)  # type: ignore[misc]  # mlx-lm types load() as a 2- or 3-tuple Union
    text = "The quick brown fox, def add(a, b): 42"
    assert tok.decode(tok.encode(text)) == text
    assert model.model_type == json.load(open(f"{info.target}/config.json"))["model_type"]
    # a drafter that agrees often but not always (measured along the target's trajectory)
    assert info.agreement is not None and 0.3 <= info.agreement <= 0.8, info.agreement


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    a = build_pair(tmp_path / "a", seed=3, with_draft=False)
    b = build_pair(tmp_path / "b", seed=3, with_draft=False)
    c = build_pair(tmp_path / "c", seed=4, with_draft=False)
    fa, fb, fc = (fingerprint(x.target) for x in (a, b, c))
    assert fa.weight_files == fb.weight_files
    assert fa.weight_files != fc.weight_files


def test_the_test_session_cache_keys_on_every_argument(tmp_path: Path) -> None:
    """conftest.build: a name reused with other arguments gets its own pair, never the first one."""
    a = build(tmp_path, "reused", seed=3, with_draft=False)
    b = build(tmp_path, "reused", seed=4, with_draft=False)
    faulty = build(tmp_path, "reused", seed=3, with_draft=False, faults=[ROWS4])
    assert (a.seed, b.seed, a.faults, faulty.faults) == (3, 4, [], [ROWS4])
    assert len({a.target, b.target, faulty.target}) == 3
    assert fingerprint(a.target).weight_files != fingerprint(b.target).weight_files
    assert "model_file" not in json.loads((Path(a.target) / "config.json").read_text())
    assert build(tmp_path, "reused", with_draft=False, seed=3) is a  # keyword order is not a new pair


def test_bfloat16_and_4bit_fixtures(fixture_root):
    bf = build(fixture_root, "llama-bfloat16", arch="llama", dtype="bfloat16")
    q4 = build(fixture_root, "llama-q4", arch="llama", bits=4)
    assert fingerprint(bf.target).dtype == "bfloat16"
    fq = fingerprint(q4.target)
    assert fq.quantization and fq.quantization["bits"] == 4
    model, _ = mlx_lm.load(q4.target)  # type: ignore[misc]  # (the same Union)
    assert any("scales" in k for k, _ in __import__("mlx.utils").utils.tree_flatten(model.parameters()))


def test_fault_fixture_needs_trust_remote_code(rows4_pair: FixtureInfo) -> None:
    info = rows4_pair
    with pytest.raises(ValueError, match="trust_remote_code"):
        mlx_lm.load(info.target)
    model = mlx_lm.load(info.target, trust_remote_code=True)[0]
    assert len(model.layers) == 6


def test_cli_make_reports_agreement_and_refuses_a_foreign_dir(cli_bin, tmp_path):
    out = run_cli(cli_bin, "fixtures", "make", str(tmp_path / "fx"), "--arch", "qwen3_5")
    assert out.returncode == 0, out.stderr
    assert "agreement" in out.stdout
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    out = run_cli(cli_bin, "fixtures", "make", str(foreign))
    assert out.returncode == 2
    assert out.stderr.strip().startswith("Error:") and "not a specparity fixture" in out.stderr


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every entry under ``root`` (itself a directory, not followed through links): path -> bytes (None: a
    directory), so a comparison says whether anything was deleted, added or rewritten."""
    return {str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))}


def test_overwrite_replaces_only_a_fixture_and_never_a_users_directory(cli_bin, tmp_path):
    """issue 30.1: --overwrite on a directory of the user's deleted it; now it, a link, and stray DFlash
    options are each refused before any work (one line, exit 2), and a fixture is still replaced."""
    mine = tmp_path / "notes"
    (mine / "deep").mkdir(parents=True)
    (mine / "a.txt").write_text("keep me\n")
    (mine / "deep" / "b.bin").write_bytes(bytes(range(256)))
    (mine / "fixture.json").mkdir()  # a name alone does not make a fixture
    before = _tree(mine)
    link = tmp_path / "link"
    link.symlink_to(mine)
    other = tmp_path / "other-kind"  # a fixture of another kind is not read as a plain pair (it raised TypeError)
    other.mkdir()
    (other / "fixture.json").write_text(json.dumps({"kind": "dflash", "target": "target", "draft": "draft"}))
    for args, names in [
        ((str(other),), f"{other} holds a dflash fixture, not a plain pair"),
        ((str(mine), "--overwrite"), str(mine)),
        ((str(mine), "--overwrite", "--dflash", "qwen3"), str(mine)),
        ((str(mine), "--dflash", "qwen3"), str(mine)),
        ((str(link), "--overwrite", "--dflash", "qwen3"), str(link)),
        ((str(link), "--overwrite"), str(link)),
        ((str(tmp_path / "new"), "--tied-head", "--block-size", "8"), "--block-size and --tied-head"),
    ]:
        out = run_cli(cli_bin, "fixtures", "make", *args)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("Error:"), (args, out.stderr)
        assert names in lines[0] and "building" not in out.stderr, (args, out.stderr)
        assert _tree(mine) == before and link.is_symlink(), args
    assert not (tmp_path / "new").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "notes", "other-kind"]  # no build begun beside

    fx = tmp_path / "fx"
    out = run_cli(cli_bin, "fixtures", "make", str(fx), "--no-draft", "--seed", "3")
    assert out.returncode == 0, out.stderr
    first = (fx / "target" / "model.safetensors").read_bytes()
    out = run_cli(cli_bin, "fixtures", "make", str(fx), "--no-draft", "--seed", "4", "--overwrite")
    assert out.returncode == 0, out.stderr
    assert (fx / "target" / "model.safetensors").read_bytes() != first
    assert json.loads((fx / "fixture.json").read_text())["seed"] == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fx", "link", "notes", "other-kind"]  # nothing left aside


def test_a_directory_that_appears_during_a_build_is_never_replaced(tmp_path):
    """The swap itself re-checks what it replaces: a user's directory created while the fixture was being
    built is left byte for byte, the build refused; a fixture there is replaced, unless it is this very
    fixture published by a concurrent build (kept, without overwrite)."""
    from specparity.errors import UsageError
    from specparity.fixtures import publishing

    out = tmp_path / "fx"
    with pytest.raises(UsageError, match="not a specparity fixture"):
        with publishing(out, overwrite=True) as tmp:
            (tmp / "fixture.json").write_text('{"target": "target"}')
            out.mkdir()
            (out / "mine.txt").write_text("mine")
    assert _tree(out) == {"mine.txt": b"mine"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fx"]

    (out / "mine.txt").unlink()
    (out / "fixture.json").write_text('{"target": "target", "seed": 1}')
    (out / "theirs").write_text("a concurrent build of the same fixture published first")
    with publishing(out) as tmp:
        (tmp / "fixture.json").write_text('{"target": "target", "seed": 1}')
    assert (out / "theirs").exists()  # the same record: kept as it is
    with publishing(out) as tmp:
        (tmp / "fixture.json").write_text('{"target": "target", "seed": 2}')
    assert json.loads((out / "fixture.json").read_text())["seed"] == 2 and not (out / "theirs").exists()
    with publishing(out, overwrite=True) as tmp:
        (tmp / "fixture.json").write_text('{"target": "target", "seed": 2}')
        (tmp / "new").write_text("")
    assert (out / "new").exists()  # overwrite: replaced, the same record or not
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fx"]


def test_the_weight_digest_cache_keeps_only_files_still_there_as_they_were(tmp_path, monkeypatch):
    """$SPECPARITY_HOME/digests.json: a fingerprint computed after a checkpoint's folder was removed, or a
    file of it rewritten, leaves those entries out (it grew by every temporary checkpoint ever digested)."""
    monkeypatch.setenv("SPECPARITY_HOME", str(tmp_path / "home"))
    first = build_plain_constant(tmp_path / "a", (1.0, 0.5))
    second = build_plain_constant(tmp_path / "b", (2.0, 0.5))
    fingerprint(first)
    cache = tmp_path / "home" / "digests.json"
    keys = set(json.loads(cache.read_text()))
    assert keys and all(k.startswith(str(Path(first).resolve())) for k in keys)
    fingerprint(second)
    assert set(json.loads(cache.read_text())) > keys  # both checkpoints, while both are there
    shutil.rmtree(Path(first).parent)  # a temporary checkpoint, gone
    weights = Path(second) / "model.safetensors"
    weights.write_bytes(weights.read_bytes() + b" ")  # rewritten: its old entry is stale
    fingerprint(second)
    now = json.loads(cache.read_text())
    assert not any(k.startswith(str(Path(first).resolve())) for k in now)
    assert all(k.startswith(str(Path(second).resolve())) for k in now)
    st = weights.stat()
    stamps = [k for k in now if k.startswith(str(weights.resolve()) + "|")]
    assert stamps == [f"{weights.resolve()}|{st.st_size}|{st.st_mtime_ns}"]
