"""specparity e2e: mlx-lm's own entry points with vs without the drafter, on the real fixture pair."""

from __future__ import annotations

import re
import json

import pytest
from conftest import run_cli
from specparity.completions import CompletionDifference, Side, first_difference
from specparity.probes.e2e import E2EOptions, run_e2e

from specparity.checkpoint import load_checkpoint
from specparity.processors import ProcessorOptions
from specparity.verdicts import Verdict

PROMPT = "The quick brown fox jumps over the lazy dog, and then"
LONG_TEXT = " ".join(["Speculative decoding drafts several tokens with a small model and verifies them."] * 60)


@pytest.fixture(scope="module")
def pair(llama_pair):
    return load_checkpoint(llama_pair.target), load_checkpoint(llama_pair.draft)


@pytest.mark.model
@pytest.mark.slow
def test_clean_pair_matches_on_every_entry_point(pair):
    target, draft = pair
    run = run_e2e(target, draft, PROMPT, E2EOptions(max_tokens=24))
    assert [e.entry for e in run.entries] == ["stream_generate", "generate", "cli"]
    for e in run.entries:
        assert e.verdict == Verdict.MATCH, e.lines()
        assert e.classic.step == "generate_step" and e.drafter.step == "speculative_generate_step"
        assert len(e.classic.tokens) == 24 and e.classic.tokens == e.drafter.tokens
        assert e.drafter.drafted > 0 and e.classic.text and e.classic.text == e.drafter.text
        assert not e.dropped and e.difference is None
    stream, gen, cli = run.entries
    # the three entry points emit the same greedy stream
    assert stream.classic.tokens == gen.classic.tokens == cli.classic.tokens
    # the in-process entry points leave prefill_step_size to each step function's default; on a
    # prompt shorter than the smaller step that cannot matter, so it is kept apart, not reported
    assert stream.default_changes == {} and stream.defaults_moot == {"prefill_step_size": (2048, 512)}
    assert "default differs" not in "\n".join(run.lines())
    assert cli.defaults_moot == {}  # the CLI passes its own 2048 to both
    assert (cli.drafter.argv or [])[-2:] == ["--draft-model", str(draft.fingerprint.path)]
    # every arm decoded the same prompt tokens; the CLI read the raw prompt from stdin
    argv = cli.classic.argv or []
    assert "--ignore-chat-template" in argv and argv[argv.index("--prompt") + 1] == "-"
    assert cli.classic.prompt == cli.drafter.prompt == stream.classic.prompt == list(target.tokenizer.encode(PROMPT))
    assert run.verdict == Verdict.MATCH and run.exit_code == 0


@pytest.mark.slow
@pytest.mark.model
def test_dropped_option_and_processor_history_are_caught(pair):
    target, draft = pair
    opts = E2EOptions(max_tokens=32, max_kv_size=64,
                      processors=ProcessorOptions(repetition_penalty=1.5))
    run = run_e2e(target, draft, PROMPT, opts, ["stream_generate", "cli"])
    stream, cli = run.entries
    # mlx-lm's speculative path drops max_kv_size, in process and from the CLI alike
    for e in (stream, cli):
        (f,) = e.dropped
        assert (f.option, f.passed, f.received, f.classic_received) == ("max_kv_size", 64, None, 64)
        assert e.verdict == Verdict.DIVERGED
    # its processors see another history than classic decode's (prompt + emitted): tokens differ
    d = stream.difference
    assert d is not None and d.token_index is not None and d.token_index > 0
    assert stream.classic.tokens[: d.token_index] == stream.drafter.tokens[: d.token_index]
    assert stream.classic.tokens[d.token_index] != stream.drafter.tokens[d.token_index]
    assert re.search(rf"first difference at token {d.token_index}\b", "\n".join(stream.lines()))
    # and the cause is named: which history the drafter path's processors saw
    prompt = stream.classic.prompt
    assert prompt is not None
    assert stream.classic.history == prompt and stream.drafter.history == prompt[-1:]
    assert stream.cause is not None and f"1 token(s) [{prompt[-1]}]" in stream.cause
    # the CLI has no processor flags: stated, and its arms ran without them (so they agree)
    assert cli.not_accepted == ["logits_processors"] and cli.difference is None
    assert run.exit_code == 1


def test_first_difference_context():
    def ids(a: list[int], b: list[int]) -> CompletionDifference:
        d = first_difference(Side("classic", "x", a), Side("drafter", "x", b))
        assert d is not None
        return d

    assert first_difference(Side("classic", "x", [1, 2, 3]), Side("drafter", "x", [1, 2, 3])) is None
    d = ids([1, 2, 3, 4, 5], [1, 2, 9, 4])
    assert (d.token_index, d.tokens_before, d.reference_tokens, d.other_tokens) == (2, [1, 2], [3, 4, 5], [9, 4])
    assert d.char_offset is None and "only the token ids differ" in d.line()
    d = ids([1, 2], [1, 2, 7])  # one output is a prefix of the other
    assert (d.token_index, d.reference_tokens, d.other_tokens, d.reference_token_count, d.other_token_count) \
        == (2, [], [7], 2, 3)
    t = first_difference(Side("classic", "hello world"), Side("drafter", "hello there"))
    assert t is not None
    assert t.char_offset == 6 and t.text_before == "hello " and t.reference_snippet.startswith("world")
    assert t.token_index is None and t.index == 6


@pytest.mark.model
def test_cli_json_record_and_bad_input(llama_pair, tmp_path, cli_bin):
    rec = tmp_path / "rec"
    r = run_cli(cli_bin, "e2e", "--model", llama_pair.target, "--draft-model", llama_pair.draft,
                "--entry-points", "generate", "--max-tokens", "16", "--logit-bias", "5:1.5",
                "--json", "--record-dir", str(rec), cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["verdict"] == "match" and out["exit_code"] == 0
    (entry,) = out["entries"]
    assert entry["drafter"]["received"]["logits_processors"] == ["logit_bias_processor"]
    assert len(list(rec.glob("e2e-llama-*.md"))) == 1
    r = run_cli(cli_bin, "e2e", "--entry-points", "stream_generate,bogus")
    assert r.returncode == 2 and "Error: --entry-points" in r.stderr and "'bogus'" in r.stderr
    r = run_cli(cli_bin, "e2e", "--model", llama_pair.target, "--draft-model", llama_pair.draft,
                "--logit-bias", "5=1")
    assert r.returncode == 2 and "Error: --logit-bias '5=1': '5=1' is not TOKEN_ID:BIAS" in r.stderr


@pytest.mark.model
@pytest.mark.slow
def test_ids_the_cli_cannot_take_are_not_run_and_the_others_run_in_every_arm(pair):
    target, draft = pair
    tok = target.tokenizer
    ids = list(tok.encode(LONG_TEXT))[:700]
    # (700 ids in every entry, the in-process ones and the CLI's: the next test, through the command)
    # ids whose text holds a NUL byte (once exit 70, "embedded null byte"): the CLI reads them from stdin
    nul = next(i for i in range(tok.vocab_size) if tok.decode([i]) == "\x00")
    odd = [nul] + ids[:40] + [nul]
    run = run_e2e(target, draft, odd, E2EOptions(max_tokens=8), ["stream_generate", "cli"])
    assert [e.classic.prompt for e in run.entries] == [odd, odd]
    assert not any(a.error for e in run.entries for a in (e.classic, e.drafter))
    # ids whose text encodes to other ids: the CLI cannot take them; its entry is not_run, the others kept
    import random

    rnd = random.Random(1)
    scrambled = [rnd.randrange(1, tok.vocab_size) for _ in range(60)]
    assert tok.encode(tok.decode(scrambled)) != scrambled
    run = run_e2e(target, draft, scrambled, E2EOptions(max_tokens=8), ["stream_generate", "cli"])
    stream, cli = run.entries
    assert stream.verdict != Verdict.NOT_RUN and stream.classic.prompt == scrambled
    assert cli.verdict == Verdict.NOT_RUN and "other prompt tokens" in str(cli.refused)
    assert not any(a.error for e in run.entries for a in (e.classic, e.drafter))


@pytest.mark.model
@pytest.mark.slow
def test_cli_takes_700_prompt_ids_in_every_arm(llama_pair, pair, cli_bin, tmp_path):
    """Through the command (it once exited 70 on the CLI arm, "embedded null byte"): every arm decodes
    the 700 ids, the CLI arm included."""
    tok = pair[0].tokenizer
    ids = list(tok.encode(LONG_TEXT))[:700]
    assert tok.encode(tok.decode(ids)) == ids  # text the CLI can take back
    r = run_cli(cli_bin, "e2e", "--model", llama_pair.target, "--draft-model", llama_pair.draft,
                "--prompt-ids", ",".join(map(str, ids)), "--max-tokens", "16", "--json",
                "--record-dir", str(tmp_path / "rec"), cwd=str(tmp_path))
    # a verdict's exit code, never a crash (70) or a usage / infrastructure error (a drafter that proposed
    # nothing in an arm is not_engaged, 3: not what this checks)
    assert r.returncode in (0, 1, 3), r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert [e["entry"] for e in out["entries"]] == ["stream_generate", "generate", "cli"]
    for e in out["entries"]:
        assert e["verdict"] != "not_run" and e["classic"]["prompt"] == e["drafter"]["prompt"] == ids, e["entry"]
        assert not e["classic"]["error"] and not e["drafter"]["error"]
        assert len(e["classic"]["tokens"]) == 16, e["entry"]
    # 700 prompt tokens: the drafter's default prefill step (512) splits it where classic's (2048) does not
    assert out["entries"][0]["default_changes"] == {"prefill_step_size": [2048, 512]}
    record = next((tmp_path / "rec").glob("*.md")).read_text()
    assert "default differs with the drafter: prefill_step_size 2048 (generate_step) vs 512" in record, record


@pytest.mark.model
@pytest.mark.slow
def test_chat_template_goes_to_every_arm_or_to_none(llama_pair, tmp_path):
    import shutil

    target_dir = tmp_path / "target"
    shutil.copytree(llama_pair.target, target_dir)
    cfg = json.loads((target_dir / "tokenizer_config.json").read_text())
    cfg["chat_template"] = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
                            "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
    (target_dir / "tokenizer_config.json").write_text(json.dumps(cfg))
    target, draft = load_checkpoint(target_dir), load_checkpoint(llama_pair.draft)
    raw = run_e2e(target, draft, PROMPT, E2EOptions(max_tokens=8), ["stream_generate", "cli"])
    templated = run_e2e(target, draft, PROMPT, E2EOptions(max_tokens=8), ["stream_generate", "cli"],
                        chat_template=True)
    assert len(templated.entries[0].classic.prompt or []) > len(raw.entries[0].classic.prompt or [])
    for run in (raw, templated):
        stream, cli = run.entries
        # the CLI's prompt tokens equal the in-process arms': its indices are comparable
        assert cli.classic.prompt == stream.classic.prompt and cli.verdict != Verdict.NOT_RUN, cli.lines()
        assert cli.classic.tokens == stream.classic.tokens
    assert "--ignore-chat-template" in (raw.entries[1].classic.argv or [])
    assert "--ignore-chat-template" not in (templated.entries[1].classic.argv or [])


@pytest.mark.model
@pytest.mark.slow
def test_kv_bits_reaches_the_cli_arm(pair):
    """A quantized KV cache that starts inside a verify block: every entry point, the CLI included, shows it."""
    target, draft = pair
    opts = E2EOptions(max_tokens=40, num_draft_tokens=3, kv_bits=4, kv_group_size=32, quantized_kv_start=24)
    run = run_e2e(target, draft, PROMPT, opts)
    idx = {e.entry: (e.difference.token_index if e.difference else None) for e in run.entries}
    assert idx["cli"] is not None and idx["cli"] == idx["stream_generate"] == idx["generate"], idx
    assert run.entries[2].classic.received["kv_bits"] == 4


@pytest.mark.model
def test_an_engine_checks_classic_reference_is_one_stream_generate_run_that_stops_at_eos(pair):
    """``e2e --engine``'s classic decode (probes/engine_e2e.Classic) is mlx-lm's own stream_generate, run once
    per prompt: its arm judges every engine loop and is the command's classic arm. It is the greedy chain on
    these weights, and where the tokenizer's eos comes up it stops there, as mlx-lm's classic path does."""
    from specparity.decode import advance_to_depth
    from specparity.probes.engine_e2e import Classic

    target, _ = pair
    ids = list(target.tokenizer.encode(PROMPT))
    ref = Classic(max_tokens=12, loaded=target)
    arm = ref.arm(ids)
    assert ref.arm(list(ids)) is arm and arm.step == "generate_step" and not arm.error  # decoded once
    chain = advance_to_depth(target.model, ids, 12)[2]
    assert ref.tokens(ids) == chain and len(chain) == 12
    saved = set(target.tokenizer.eos_token_ids)
    try:
        target.tokenizer.eos_token_ids = {chain[4]}
        stops = Classic(max_tokens=12, loaded=target)
        assert stops.tokens(ids) == chain[: chain.index(chain[4]) + 1] and stops.eos == {chain[4]}
    finally:
        target.tokenizer.eos_token_ids = saved


def test_an_engine_loop_is_judged_against_where_classic_decode_stopped():
    """An engine that emits past classic decode's eos diverges at that token; one that stops there matches;
    one that runs past max_tokens diverges one token past it (mlx-dspark's last round)."""
    from specparity.probes.engine_e2e import Finding, judge

    rounds = [{"drafted": 2, "accepted": 2, "committed": 3, "source": "draft"}] * 3
    classic, eos = [5, 6, 7, 2], {2}
    past = judge(Finding("e", "loop", tokens=[5, 6, 7, 2, 9], rounds=rounds, accepted=6, drafted=6), classic, eos, 0)
    assert past.verdict == Verdict.DIVERGED and past.index == 4 and past.classic_token is None
    assert "classic stopped at its eos token 2 after 4 tokens" in past.reason and past.round == 2
    stops = judge(Finding("e", "loop", tokens=[5, 6, 7, 2], rounds=rounds, accepted=6, drafted=6), classic, eos, 0)
    assert stops.verdict == Verdict.MATCH
    over = judge(Finding("e", "loop", tokens=[5, 6, 7, 8, 9], rounds=rounds, accepted=6, drafted=6), [5, 6, 7, 8],
                 eos, 0)
    assert over.verdict == Verdict.DIVERGED and over.index == 4 and "max_tokens=4" in over.reason


@pytest.mark.parametrize(("engine_logit", "said", "near"), [
    (3.0, "an exact tie in mlx.core.bfloat16 logprobs", False),
    (2.984375, "a near tie, not an exact one: classic decode's token leads by 0.015625 in its raw bfloat16 logits"
               " (1 ULP)", True),
    (1.5, "not a tie: logprobs", False),
])
def test_a_parted_token_is_labelled_an_exact_tie_a_near_tie_or_not_a_tie(engine_logit: float, said: str,
                                                                      near: bool) -> None:
    """The own-loop e2e's label at a diverged token, from classic decode's raw bfloat16 logits of both tokens: equal
    (an exact tie, broken toward the lower id), one bfloat16 ULP apart (a near tie, which a kernel's arithmetic
    moves: mlx-vlm's finding on the equal-heads hybrid, 3.0 against 2.984375), or far apart (not a tie)."""
    from types import SimpleNamespace

    import mlx.core as mx

    from specparity.probes.engine_e2e import Finding, label_tie
    from specparity.verdicts import Verdict

    values = [0.0] * 8
    values[2], values[5] = 3.0, engine_logit  # classic decode's token 2; the engine took 5
    logits = mx.array(values, dtype=mx.bfloat16)
    classic = SimpleNamespace(loaded=SimpleNamespace(model=lambda ids: mx.broadcast_to(logits, (1, ids.shape[1], 8))))
    f = Finding("toy", "loop", verdict=Verdict.DIVERGED, tokens=[1, 5], classic=[1, 2], index=1, engine_token=5,
                classic_token=2, reason="token 1: engine 5, classic 2")
    label_tie(f, classic, [7, 7])  # type: ignore[arg-type]
    assert said in f.reason, f.reason
    assert f.tie is not None and f.tie["near_tie"] is near and f.tie["logprob_tie"] is (engine_logit == 3.0), f.tie
    if near:
        assert f.tie["ulps"] == 1 and f.tie["margin"] == 0.015625
