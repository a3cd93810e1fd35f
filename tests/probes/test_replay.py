"""Rollback replay on real fixtures: clean paths agree, injected faults are caught in place."""

from __future__ import annotations

import json

import pytest

from conftest import assert_report, build, run_cli
from specparity.checkpoint import load_checkpoint
from specparity.decode import CacheOptions, advance_to_depth
from specparity.errors import Inconclusive, UsageError
from specparity.identity import device
from specparity.probes.replay.core import MODE_SNAPSHOT, MODE_TRIM, replay
from specparity.probes.replay.logs import read_log

pytestmark = pytest.mark.model

PROMPT = list(range(20, 36))  # 16 tokens: the cache holds 15 positions after prefill
# width 4: 140 rounds, 120 of them rewind (only the full accepts of 3 do not)
MANY = [0, 1, 2, 3, 1, 0, 2] * 20
cpu_only = pytest.mark.skipif(device() != "cpu",
                              reason="pins the CPU backend's measured block/chain exactness")


def _model(info, trust=False):
    return load_checkpoint(info.target, trust_remote_code=trust).model


@pytest.fixture(scope="module")
def llama(fixture_root):
    return _model(build(fixture_root, "llama-float32", arch="llama"))


@pytest.mark.slow
@cpu_only
@pytest.mark.parametrize("policy", ["wrong-id", "correct-token"])
def test_clean_fixture_agrees_over_100_rewinds(llama, policy):
    report = replay(llama, PROMPT, MANY, width=4, policy=policy, wrong_id=5)
    assert report.rewinds == 120 and report.rounds == 140
    assert report.positions == sum(a + 1 for a in MANY) == 320
    assert report.disagreements == 0 and report.first is None
    assert report.rewind_finding is None and report.mode == MODE_TRIM
    assert report.verdict == "equal" and report.exit_code == 0
    assert_report(report)
    assert report.target_tokens == report.classic_tokens
    assert report.summary() == (
        "140 rounds, 120 rewinds, 320 positions: target agrees with classic at all 320")
    # the chain it compared with is classic decode's own output
    _, _, emitted = advance_to_depth(llama, PROMPT, 320)
    assert report.classic_tokens == emitted


@cpu_only
def test_depth_fault_caught_at_its_round_and_row(fixture_root):
    info = build(fixture_root, "llama-depth40", arch="llama",
                 faults=[{"kind": "depth", "layer": 1, "subop": "self_attn",
                          "min_offset": 40, "min_rows": 2}])
    report = replay(_model(info, True), PROMPT, [1] * 20, width=4)
    # round r's block starts at cache offset 15 + 2r: the first at >= 40 is round 13
    f = report.first
    assert f is not None
    assert (f.round, f.row, f.emitted_index, f.position) == (13, 0, 26, 41)
    assert report.disagreements == 2 * (20 - 13)  # both kept rows of every later round
    assert not f.diff.equal and f.diff.differing_bytes > 0
    assert report.rewind_finding is None and report.exit_code == 1
    assert report.summary().startswith(
        "20 rounds, 20 rewinds, 40 positions: target disagrees with classic at 14 (first at"
        " round 13, row 0, emitted index 26, absolute position 41: ")


@cpu_only
def test_stale_trim_caught_at_first_rewind_while_block_vs_chain_is_equal(fixture_root):
    from specparity.probes.forward.blockchain import probe_block_vs_chain

    info = build(fixture_root, "llama-stale-trim", arch="llama",
                 faults=[{"kind": "stale_trim"}], with_draft=False)
    model = _model(info, True)
    probe = probe_block_vs_chain(model, [2, 4], [0, 8], [PROMPT])
    assert [c.verdict for c in probe.cells] == ["equal"] * 4

    # rounds 0 and 1 accept everything (no rewind); round 2 is the first to rewind
    report = replay(model, PROMPT, [3, 3, 1, 2, 0], width=4)
    finding = report.rewind_finding
    assert finding is not None and finding.round == 2
    assert finding.rows == 2 and finding.trimmed == 2  # trim claims it dropped both
    assert finding.expected_offset == 15 + 4 + 4 + 2
    assert set(finding.offsets) == {finding.expected_offset + 1}  # one stale row per layer
    assert finding.layers == list(range(6))
    assert report.rounds == 3 and report.rounds_total == 5  # stopped there
    assert report.disagreements == 0  # the rows before the failed rewind matched
    assert report.verdict == "divergent" and report.exit_code == 1
    assert "rewind failed at round 2" in report.summary()
    assert "left 6 of 6 layers at offset 26 (+1 rows) where 25 was expected" in "\n".join(
        report.lines())


@cpu_only
def test_hybrid_replays_by_snapshot_and_recompute(fixture_root):
    model = _model(build(fixture_root, "qwen3_5-float32", arch="qwen3_5"))
    report = replay(model, PROMPT, [0, 2, 3, 1, 0, 1] * 4, width=4, policy="wrong-id")
    assert report.mode == MODE_SNAPSHOT and "ArraysCache cannot be trimmed" in report.mode_reason
    assert report.rewinds == 20 and report.positions == 52
    assert report.disagreements == 0 and report.rewind_finding is None
    assert report.target_tokens == report.classic_tokens
    assert "snapshot-and-recompute (ArraysCache cannot be trimmed)" in report.lines()[1]


@cpu_only
def test_quantized_kv_cache_replays(llama):
    opts = CacheOptions(kv_bits=8, kv_group_size=32, quantized_kv_start=0)
    report = replay(llama, PROMPT, [2, 0, 1, 3, 0] * 4, width=4, opts=opts)
    assert report.disagreements == 0 and report.rewind_finding is None
    assert report.rewinds == 16 and report.opts["kv_bits"] == 8


def test_sliding_window_cache_that_stops_rewinding_is_a_finding(fixture_root):
    """gemma3's sliding layers use mlx-lm's RotatingKVCache (window 32), which reports itself
    untrimmable once it holds 32 positions; trim_prompt_cache then trims nothing, silently."""
    model = _model(build(fixture_root, "gemma3_text-float32", arch="gemma3_text"))
    report = replay(model, PROMPT, [1] * 15, width=4)
    f = report.rewind_finding
    assert report.mode == MODE_TRIM  # trimmable after prefill (15 positions)
    # round r's block runs from offset 15 + 2r to 19 + 2r: round 7 is the first to reach 32
    assert f is not None and (f.round, f.rows, f.trimmed) == (7, 2, 0)
    assert f.expected_offset == 31 and set(f.offsets) == {33}
    assert report.rounds == 8 and report.exit_code == 1
    assert "(trim reported 0)" in f.describe()


def test_bad_inputs(llama):
    with pytest.raises(Inconclusive, match="empty"):
        replay(llama, PROMPT, [], width=4)
    with pytest.raises(UsageError, match="round 1: accept 4 does not fit width 4"):
        replay(llama, PROMPT, [1, 4], width=4)
    with pytest.raises(UsageError, match="pass width") as err:  # the library's word; the CLI's flag
        replay(llama, PROMPT, [1])
    assert "pass --width" in err.value.as_flag()
    with pytest.raises(UsageError, match="^wrong-id 9999: outside the vocabulary"):
        replay(llama, PROMPT, [1], width=4, wrong_id=9999)


@cpu_only
def test_draft_model_record_then_replay(fixture_root):
    from specparity.probes.replay.recorder import record_speculative

    info = build(fixture_root, "llama-float32", arch="llama")
    assert info.draft is not None
    target, draft = _model(info), load_checkpoint(info.draft).model
    req = record_speculative(target, draft, PROMPT, num_draft_tokens=3, max_tokens=40)
    assert req.tokens is not None and len(req.tokens) == 40
    assert sum(a + 1 for a in req.accepts[:-1]) + req.accepts[-1] <= 40 <= sum(
        a + 1 for a in req.accepts)
    assert 0 < sum(req.accepts) < 40  # the drafter agrees sometimes, not always
    report = replay(target, PROMPT, req.accepts, widths=req.widths, served_tokens=req.tokens)
    assert report.disagreements == 0 and report.rewind_finding is None
    assert report.served_checked == 40 and report.served_first_mismatch is None
    assert report.exit_code == 0


@pytest.mark.slow
@cpu_only
def test_cli_draft_model_writes_log_and_record(fixture_root, tmp_path, cli_bin):
    info = build(fixture_root, "llama-float32", arch="llama")
    assert info.draft is not None
    log, rec = tmp_path / "run.jsonl", tmp_path / "rec"
    r = run_cli(cli_bin, "replay", "--model", info.target, "--draft-model", info.draft,
                "--prompt-ids", ",".join(map(str, PROMPT)), "--max-tokens", "24",
                "--save-log", str(log), "--record-dir", str(rec))
    assert r.returncode == 0, r.stderr
    assert "target agrees with classic at all" in r.stdout
    assert "served tokens: identical to classic over 24" in r.stdout
    (req,) = read_log(log)
    assert req.prompt_ids == PROMPT and req.width == 4
    assert req.tokens is not None and len(req.tokens) == 24
    assert len(list(rec.glob("replay-llama-*.md"))) == 1
    (data,) = (rec / "data").iterdir()
    assert (data / "accepts.jsonl").exists() and (data / "replay.jsonl").exists()

    # the written log replays the same way, as --json
    r = run_cli(cli_bin, "replay", "--model", info.target, "--log", str(log), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["verdict"] == "equal" and out["requests"][0]["positions"] >= 24


@pytest.mark.slow
def test_cli_exit_codes(fixture_root, tmp_path, cli_bin):
    info = build(fixture_root, "llama-stale-trim", arch="llama",
                 faults=[{"kind": "stale_trim"}], with_draft=False)
    args = ("--prompt-ids", ",".join(map(str, PROMPT)))
    r = run_cli(cli_bin, "replay", "--model", info.target, "--trust-remote-code",
                "--accepts", "3,1,2", "--width", "4", *args)
    assert r.returncode == 1 and "rewind failed at round 1" in r.stdout, r.stderr
    r = run_cli(cli_bin, "replay", "--model", info.target, "--trust-remote-code",
                "--accepts", "", "--width", "4", *args)
    assert r.returncode == 3 and "not run: the accept vector is empty" in r.stdout, r.stderr
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "llama"}')
    (broken / "model.safetensors").write_bytes(b"not safetensors")
    r = run_cli(cli_bin, "replay", "--model", str(broken), "--accepts", "1", "--width", "2")
    assert r.returncode == 4 and "would not load" in r.stderr


def _dflash_transcript(emitted: list[int], accepts: list[int], bs: int) -> str:
    """mlxcel-style transcript lines for a served run that matched classic decode."""
    lines, s = [], 0  # s: index in ``emitted`` of the round's bonus
    for r, a in enumerate(accepts):
        nxt = emitted[s + 1: s + bs + 1]
        wrong = [(t + 1) % 512 for t in nxt]
        draft = nxt[:a] + wrong[a: bs - 1]
        target = nxt[: a + 1] + wrong[a + 1: bs]
        lines.append(f"DEBUG DFlash round transcript round={r} bs={bs} bonus={emitted[s]}"
                     f" draft_tokens={draft} target_tokens={target} accepted={a}"
                     f" new_tokens={nxt[: a + 1]}")
        s += a + 1
    return "\n".join(lines) + "\n"


@cpu_only
def test_dflash_transcript_replays_with_first_token_from_prefill(llama, tmp_path):
    from specparity.probes.replay.algebra import check_rounds

    accepts = [1, 3, 0, 2, 0, 1, 3, 2]
    _, _, emitted = advance_to_depth(llama, PROMPT, 1 + sum(a + 1 for a in accepts) + 4)
    log = tmp_path / "server.log"
    log.write_text(_dflash_transcript(emitted, accepts, 4))
    (req,) = read_log(log)
    assert req.prefill_emits and req.rounds is not None and check_rounds(req.rounds) == []
    report = replay(llama, PROMPT, req.accepts, width=req.width, served_tokens=req.tokens,
                    prefill_emits=True)
    assert report.positions == 1 + sum(a + 1 for a in accepts) == report.served_checked
    assert report.disagreements == 0 and report.served_first_mismatch is None
    assert report.classic_tokens == emitted[: report.positions] and report.exit_code == 0

    assert req.tokens is not None
    served = list(req.tokens)
    served[6] += 1  # a serving loop that emitted another token than its target computed
    report = replay(llama, PROMPT, req.accepts, width=4, served_tokens=served,
                    prefill_emits=True)
    assert report.disagreements == 0 and report.served_first_mismatch == 6
    assert report.exit_code == 1
    assert report.served_mismatch_at == (1, 3)  # tokens 0 | 1, 2 | 3, 4, 5, 6: round 1, row 3
    assert "served tokens: differ from classic first at emitted index 6 (round 1, row 3;" in (
        report.lines()[-1])
    assert report.summary().endswith("; served tokens differ from classic at emitted index 6")
