"""specparity e2e: mlx-lm's own entry points with vs without the drafter, on the real fixture pair."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli
from specparity.probes.e2e import E2EOptions, first_text_difference, first_token_difference, run_e2e

from specparity.checkpoint import load_checkpoint
from specparity.processors import ProcessorOptions
from specparity.verdicts import Verdict

PROMPT = "The quick brown fox jumps over the lazy dog, and then"


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
        assert not e.dropped and e.tokens_diff is None and e.text_diff is None
    stream, gen, cli = run.entries
    # the three entry points emit the same greedy stream
    assert stream.classic.tokens == gen.classic.tokens == cli.classic.tokens
    # the in-process entry points leave prefill_step_size to each step function's default
    assert stream.default_changes == {"prefill_step_size": (2048, 512)}
    assert cli.default_changes == {}  # the CLI passes its own 2048 to both
    assert cli.drafter.argv[-2:] == ["--draft-model", str(draft.fingerprint.path)]
    assert run.verdict == Verdict.MATCH and run.exit_code == 0


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
    d = stream.tokens_diff
    assert d is not None and d.index > 0
    assert stream.classic.tokens[: d.index] == stream.drafter.tokens[: d.index]
    assert stream.classic.tokens[d.index] != stream.drafter.tokens[d.index]
    assert f"token ids differ first at index {d.index}" in "\n".join(stream.lines())
    # the CLI has no processor flags: stated, and its arms ran without them (so they agree)
    assert cli.not_accepted == ["logits_processors"] and cli.tokens_diff is None
    assert run.exit_code == 1


def test_first_difference_context():
    assert first_token_difference([1, 2, 3], [1, 2, 3]) is None
    d = first_token_difference([1, 2, 3, 4, 5], [1, 2, 9, 4])
    assert (d.index, d.before, d.classic, d.drafter) == (2, [1, 2], [3, 4, 5], [9, 4])
    d = first_token_difference([1, 2], [1, 2, 7])  # one output is a prefix of the other
    assert (d.index, d.classic, d.drafter, d.classic_len, d.drafter_len) == (2, [], [7], 2, 3)
    t = first_text_difference("hello world", "hello there")
    assert t.index == 6 and t.before == "hello " and t.classic.startswith("world")


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
