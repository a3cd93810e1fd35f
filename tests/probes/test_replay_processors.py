"""replay with logits processors, and mlx-lm's own output compared after a rewind finding."""

from __future__ import annotations

import pytest
from conftest import build, run_cli
from specparity.probes.replay.core import replay
from specparity.probes.replay.recorder import record_speculative

from specparity.checkpoint import load_checkpoint
from specparity.decode import advance_to_depth
from specparity.processors import ProcessorOptions, parse_logit_bias

PROMPT = list(range(20, 36))
TEXT = "The quick brown fox jumps over the lazy dog, and then"
PENALTIES = ProcessorOptions(repetition_penalty=1.5, presence_penalty=0.5, logit_bias={7: 2.0},
                             repetition_context_size=24)


@pytest.fixture(scope="module")
def pair(llama_pair):
    return load_checkpoint(llama_pair.target).model, load_checkpoint(llama_pair.draft).model


@pytest.fixture(scope="module")
def text_prompt(llama_pair):
    return list(load_checkpoint(llama_pair.target).tokenizer.encode(TEXT))


def _mlx_classic(model, prompt, n, procs):
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    return [t for t, _ in generate_step(mx.array(prompt), model, max_tokens=n,
                                        logits_processors=procs.make() or None)]


@pytest.mark.model
def test_reference_with_processors_is_mlx_lm_classic_decode(pair):
    target, _ = pair
    # one round of width 1 per token: the chain is the reference, compared at every position
    report = replay(target, PROMPT, [0] * 40, width=1, processors=PENALTIES.make())
    assert report.classic_tokens == _mlx_classic(target, PROMPT, 40, PENALTIES)
    assert report.disagreements == 0 and report.exit_code == 0
    # and the processors change the stream (the test can fail)
    _, _, plain = advance_to_depth(target, PROMPT, 40)
    assert plain != report.classic_tokens


@pytest.mark.model
def test_speculative_with_processors_diverges_from_the_reference(pair, text_prompt):
    """mlx-lm's speculative path feeds its processors the last prompt token and what it
    emitted, not the whole prompt: a penalty on a prompt token applies in one path only."""
    target, draft = pair
    procs = ProcessorOptions(repetition_penalty=1.5)
    req = record_speculative(target, draft, text_prompt, num_draft_tokens=3, max_tokens=40,
                             processors=procs)
    report = replay(target, text_prompt, req.accepts, widths=req.widths, served_tokens=req.tokens,
                    processors=procs.make())
    # the target's verify rows agree with classic decode; mlx-lm's own output does not
    assert report.disagreements == 0 and report.rewind_finding is None
    classic = _mlx_classic(target, text_prompt, 40, procs)
    assert req.tokens is not None  # the recorder keeps what mlx-lm emitted
    first = next(i for i, (a, b) in enumerate(zip(req.tokens, classic)) if a != b)
    assert report.served_first_mismatch == first and report.exit_code == 1
    # control: the same run without processors is identical to classic decode
    req = record_speculative(target, draft, text_prompt, num_draft_tokens=3, max_tokens=40)
    report = replay(target, text_prompt, req.accepts, widths=req.widths, served_tokens=req.tokens)
    assert report.served_first_mismatch is None and report.exit_code == 0


@pytest.mark.slow
@pytest.mark.model
def test_served_tokens_compared_after_a_rewind_finding(fixture_root):
    info = build(fixture_root, "llama-stale-trim-pair", arch="llama", faults=[{"kind": "stale_trim"}])
    assert info.draft is not None
    target = load_checkpoint(info.target, trust_remote_code=True).model
    draft = load_checkpoint(info.draft).model
    req = record_speculative(target, draft, PROMPT, num_draft_tokens=3, max_tokens=40)
    report = replay(target, PROMPT, req.accepts, widths=req.widths, served_tokens=req.tokens)
    assert report.rewind_finding is not None and report.rounds < report.rounds_total
    # mlx-lm's own speculative output, over its whole length, against classic decode
    _, _, classic = advance_to_depth(target, PROMPT, 40)
    assert req.tokens is not None  # the recorder keeps what mlx-lm emitted
    first = next(i for i, (a, b) in enumerate(zip(req.tokens, classic)) if a != b)
    assert report.served_checked == 40 and report.served_first_mismatch == first
    assert f"served tokens: differ from classic first at emitted index {first}" in "\n".join(report.lines())


@pytest.mark.model
def test_cli_processor_flags(llama_pair, cli_bin):
    r = run_cli(cli_bin, "replay", "--model", llama_pair.target, "--draft-model", llama_pair.draft,
                "--prompt", TEXT, "--max-tokens", "32",
                "--repetition-penalty", "1.5")
    assert r.returncode == 1, r.stderr
    assert "logits processors: repetition_penalty=1.5 (context 20)" in r.stdout
    assert "target agrees with classic at all" in r.stdout
    assert "served tokens: differ from classic first at emitted index" in r.stdout
    r = run_cli(cli_bin, "replay", "--model", llama_pair.target, "--accepts", "1", "--width", "2",
                "--logit-bias", "99999:1")
    assert r.returncode == 2 and "Error: --logit-bias: token id 99999 is outside the vocabulary" in r.stderr


def test_parse_logit_bias():
    assert parse_logit_bias("5:2.5, 17:-100") == {5: 2.5, 17: -100.0}
    from specparity.errors import UsageError

    for bad in ("5", "x:1", "-3:1"):
        with pytest.raises(UsageError, match="--logit-bias"):
            parse_logit_bias(bad)
