"""specparity e2e: mlx-lm's own entry points with vs without the drafter, on the real fixture pair."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli
from specparity.completions import Side, first_difference
from specparity.probes.e2e import E2EOptions, run_e2e

from specparity.checkpoint import load_checkpoint
from specparity.processors import ProcessorOptions
from specparity.verdicts import Verdict

PROMPT = "The quick brown fox jumps over the lazy dog, and then"


@pytest.fixture(scope="module")
def pair(llama_pair):
    return load_checkpoint(llama_pair.target), load_checkpoint(llama_pair.draft)


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
    # the in-process entry points leave prefill_step_size to each step function's default
    assert stream.default_changes == {"prefill_step_size": (2048, 512)}
    assert cli.default_changes == {}  # the CLI passes its own 2048 to both
    assert cli.drafter.argv is not None and cli.drafter.argv[-2:] == ["--draft-model", str(draft.fingerprint.path)]
    assert run.verdict == Verdict.MATCH and run.exit_code == 0


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
    assert f"first difference at token {d.token_index} " in "\n".join(stream.lines())
    # the CLI has no processor flags: stated, and its arms ran without them (so they agree)
    assert cli.not_accepted == ["logits_processors"] and cli.difference is None
    assert run.exit_code == 1


def test_first_difference_context():
    def ids(a, b):
        return first_difference(Side("classic", "x", a), Side("drafter", "x", b))

    assert ids([1, 2, 3], [1, 2, 3]) is None
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
