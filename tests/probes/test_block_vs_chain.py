"""Block-vs-chain probe, long walk and prefill parity on real fixtures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import assert_report, build, run_cli
from specparity.checkpoint import load_checkpoint
from specparity.decode import CacheOptions
from specparity.fixtures import FixtureInfo
from specparity.identity import device
from specparity.probes.forward.blockchain import probe_block_vs_chain
from specparity.probes.forward.prefill import prefill_parity

# Fixed prompt ids make absolute positions exact: the cache holds 15 positions after prefill.
PROMPTS = [list(range(20, 36)), list(range(100, 140, 2)), [7, 300, 41, 9, 77, 250, 3, 19, 480, 66]]
ON_CPU = device() == "cpu"
cpu_only = pytest.mark.skipif(not ON_CPU, reason="pins the CPU backend's measured exactness")


def _load(info, trust=False):
    return load_checkpoint(info.target, trust_remote_code=trust).model


@pytest.mark.model
@pytest.mark.parametrize("arch", ["llama", "qwen3_5", "qwen3_moe"])
@cpu_only
def test_clean_fixtures_equal_at_depth_zero(fixture_root, arch):
    model = _load(build(fixture_root, f"{arch}-float32", arch=arch))
    report = probe_block_vs_chain(model, [2, 4, 8, 16], [0], PROMPTS)
    assert [c.verdict for c in report.cells] == ["equal"] * 4
    assert all(c.prompts_tested == len(PROMPTS) for c in report.cells)
    assert report.exit_code == 0


@pytest.mark.model
def test_rows_fault_divergent_exactly_at_widths_past_its_threshold(rows4_pair: FixtureInfo) -> None:
    info = rows4_pair
    report = probe_block_vs_chain(_load(info, True), [2, 3, 4, 8, 16], [0, 8], PROMPTS)
    for c in report.cells:
        if c.width < 4:
            assert c.verdict == "equal", c
        else:
            assert c.verdict == "divergent", c
            assert c.prompt_index == 0 and c.first_row == 0
            assert c.absolute_position == 15 + c.depth
            assert c.diff is not None and c.diff.differing_bytes > 0 and c.diff.max_abs_diff > 0
    assert report.exit_code == 1
    # the same defect is visible to prefill parity (a 16-row prefill runs the faulty kernel)
    pre = prefill_parity(_load(info, True), PROMPTS[:1])
    assert pre[0].verdict == "divergent"
    assert assert_report(pre[0])["exit_code"] == 1
    tbt = [a for a in pre[0].arms if a.name == "token_by_token"][0]
    assert tbt.layers_differing and min(tbt.layers_differing) == 3  # layer 2's MLP feeds layer 3's KV


@pytest.mark.model
def test_depth_fault_missed_at_depth_zero_caught_deeper_and_by_the_walk(fixture_root):
    info = build(fixture_root, "llama-depth40", arch="llama",
                 faults=[{"kind": "depth", "layer": 1, "subop": "self_attn",
                          "min_offset": 40, "min_rows": 2}])
    report = probe_block_vs_chain(_load(info, True), [4], [0, 8, 32], PROMPTS[:1],
                                  walk_positions=128, walk_widths=[4])
    assert report.cell(4, 0).verdict == "equal"
    assert report.cell(4, 8).verdict == "equal"
    deep = report.cell(4, 32)
    assert deep.verdict == "divergent" and deep.first_row == 0 and deep.absolute_position == 47
    (walk,) = report.walks
    # blocks start at cache offsets 15, 19, ... 39, 43: the first past 40 is block 7
    assert walk.verdict == "divergent"
    assert (walk.block_index, walk.row, walk.first_step, walk.first_position) == (7, 0, 28, 43)
    assert assert_report(report)["exit_code"] == 1 and assert_report(walk)["exit_code"] == 1


@pytest.mark.model
@cpu_only
def test_clean_walk_equal_over_128_positions(fixture_root):
    model = _load(build(fixture_root, "llama-float32", arch="llama"))
    report = probe_block_vs_chain(model, [4, 16], [0], PROMPTS[:1], walk_positions=128)
    assert [(w.width, w.verdict, w.positions) for w in report.walks] == [
        (4, "equal", 128), (16, "equal", 128)]


@pytest.mark.model
@cpu_only
def test_gemma3_sliding_window_diverges_only_past_the_window(fixture_root):
    """Measured on CPU: once the rotating cache of the sliding layers wraps (position 32),
    the in-place single-step buffer and the block's concatenated keys sum in another order."""
    model = _load(build(fixture_root, "gemma3_text-float32", arch="gemma3_text"))
    report = probe_block_vs_chain(model, [2, 4, 8, 16], [0, 8, 32], PROMPTS[:1],
                                  walk_positions=64, walk_widths=[4])
    for c in report.cells:
        last_row_position = 15 + c.depth + c.width - 1
        if last_row_position < 32:
            assert c.verdict == "equal", c
        if c.verdict == "divergent":
            assert c.absolute_position is not None and c.absolute_position >= 32, c
            assert c.diff is not None and c.diff.max_abs_diff < 1e-3 and c.diff.argmax_agree
    assert report.cell(16, 32).verdict == "divergent"
    assert report.walks[0].first_position == 32


@pytest.mark.model
@cpu_only
def test_moe_in_bfloat16_is_not_run_on_cpu_with_its_reason(fixture_root):
    info = build(fixture_root, "qwen3_moe-bfloat16", arch="qwen3_moe", dtype="bfloat16",
                 with_draft=False)
    report = probe_block_vs_chain(_load(info), [2, 4], [0], PROMPTS[:1])
    assert [c.verdict for c in report.cells] == ["not_run", "not_run"]
    assert report.cells[0].reason is not None and "GatherMM" in report.cells[0].reason
    assert report.exit_code == 3


@pytest.mark.model
def test_width_one_is_not_run_never_a_pass(fixture_root):
    model = _load(build(fixture_root, "llama-float32", arch="llama"))
    report = probe_block_vs_chain(model, [1], [0], PROMPTS[:1])
    reason = report.cells[0].reason
    assert report.cells[0].verdict == "not_run" and reason is not None and "W < 2" in reason
    assert report.exit_code == 3


@pytest.mark.model
@cpu_only
def test_quantized_kv_block_straddling_quantized_kv_start_diverges(fixture_root):
    """Measured: classic decode quantizes the KV cache after the call that reaches
    quantized_kv_start; a verify block crossing it sees unquantized rows the chain did not."""
    model = _load(build(fixture_root, "llama-float32", arch="llama"))
    opts = CacheOptions(kv_bits=4, kv_group_size=32, quantized_kv_start=20)
    report = probe_block_vs_chain(model, [4, 8], [0, 16], PROMPTS[:1], opts)
    assert report.cell(4, 0).verdict == "equal"          # rows 15..18: all before the start
    crossing = report.cell(8, 0)                          # rows 15..22 straddle position 20
    assert crossing.verdict == "divergent" and crossing.absolute_position == 20
    assert report.cell(8, 16).verdict == "equal"          # fully past it: both arms quantized
    plain = probe_block_vs_chain(model, [8], [0], PROMPTS[:1], CacheOptions(kv_bits=8,
                                 kv_group_size=32, quantized_kv_start=0))
    assert plain.cells[0].verdict == "equal"


@pytest.mark.model
@pytest.mark.slow
@cpu_only
@pytest.mark.parametrize("arch", ["llama", "qwen3_5", "gemma3_text", "qwen3_moe"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_measured_verdicts_every_arch_and_dtype(fixture_root, arch, dtype):
    """Widths 2-16, depths 0-128 on the CPU backend, pinned as measured (see CHANGELOG)."""
    info = build(fixture_root, f"{arch}-{dtype}", arch=arch, dtype=dtype,
                 with_draft=arch == "llama")
    report = probe_block_vs_chain(_load(info), list(range(2, 17)), [0, 32, 128], PROMPTS[:1])
    verdicts = {c.verdict for c in report.cells}
    if arch == "qwen3_moe" and dtype != "float32":
        assert verdicts == {"not_run"}
    elif arch == "gemma3_text":
        assert all(c.absolute_position is not None and c.absolute_position >= 32
                   for c in report.cells if c.verdict == "divergent")
        if dtype == "float32":
            assert "divergent" in verdicts  # bfloat16 rounding hid it on this prompt
        assert all(c.verdict == "equal" for c in report.cells if c.depth == 0)
    else:
        assert verdicts == {"equal"}, [c for c in report.cells if c.verdict != "equal"][:1]


@pytest.mark.model
def test_cli_probe_json_and_record(cli_bin: str, rows4_pair: FixtureInfo, tmp_path: Path) -> None:
    info = rows4_pair
    rec = tmp_path / "records"
    out = run_cli(cli_bin, "probe", "--model", info.target, "--trust-remote-code",
                  "--widths", "2,4", "--depths", "0", "--walk", "8", "--json",
                  "--record-dir", str(rec))
    assert out.returncode == 1, out.stderr
    data = json.loads(out.stdout)
    assert data["verdict"] == "divergent"
    assert [(c["width"], c["verdict"]) for c in data["cells"]] == [(2, "equal"), (4, "divergent")]
    mds = list(rec.glob("probe-llama-*.md"))
    assert len(mds) == 1 and "| 4 | 0 | divergent |" in mds[0].read_text()
    ident = json.loads((rec / "data" / mds[0].stem / "identity.json").read_text())
    assert ident["model"]["digest"] and ident["mlx"] and ident["cache"]["prefill_step_size"] == 2048
    cells = (rec / "data" / mds[0].stem / "cells.jsonl").read_text().splitlines()
    assert len(cells) == 2
    # a second run never overwrites the first record
    out2 = run_cli(cli_bin, "probe", "--model", info.target, "--trust-remote-code",
                   "--widths", "2", "--depths", "0", "--walk", "0", "--no-prefill",
                   "--record-dir", str(rec))
    assert out2.returncode == 0, out2.stderr
    assert len(list(rec.glob("probe-llama-*.md"))) == 2
    assert "| 4 | 0 | divergent |" in mds[0].read_text()


@pytest.mark.parametrize("args,code,needle", [
    (["--model", "/nonexistent/ckpt"], 2, "no such file or directory"),
    (["--widths", "0"], 2, "--widths"),
    (["--widths", "two"], 2, "--widths"),
    (["--depths", "-3"], 2, "--depths"),
    (["--prompt-ids", "1,x"], 2, "--prompt-ids"),
])
def test_cli_bad_input_one_line(cli_bin, args, code, needle):
    out = run_cli(cli_bin, "probe", *args)
    assert out.returncode == code, out.stderr
    assert needle in out.stderr and "Traceback" not in out.stderr
    assert len([ln for ln in out.stderr.splitlines() if ln.startswith("Error:")]) == 1


@pytest.mark.model
def test_cli_not_a_checkpoint_and_malformed_config(cli_bin, tmp_path, fixture_root):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = run_cli(cli_bin, "probe", "--model", str(empty))
    assert out.returncode == 2 and "not a checkpoint" in out.stderr
    info = build(fixture_root, "llama-float32", arch="llama")
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (broken / f).symlink_to(f"{info.target}/{f}")
    (broken / "config.json").write_text('{"model_type": "llama", "hidden_size": ')
    out = run_cli(cli_bin, "probe", "--model", str(broken))
    assert out.returncode == 4 and "malformed config" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.model
def test_without_model_the_embedded_default_is_built_once_then_reused(cli_bin, isolated_home):
    env = {"SPECPARITY_HOME": str(isolated_home)}
    args = ("probe", "--widths", "2", "--depths", "0", "--walk", "0", "--no-prefill", "--json")
    first = run_cli(cli_bin, *args, env=env)
    assert first.returncode == 0, first.stderr
    target = isolated_home / "fixtures" / "default-llama-float32" / "target"
    assert json.loads(first.stdout)["model"]["path"] == str(target.resolve())
    stamp = (target / "model.safetensors").stat().st_mtime_ns
    second = run_cli(cli_bin, *args, env=env)
    assert second.returncode == 0
    assert (target / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not rebuilt
