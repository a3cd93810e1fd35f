"""Served mlx-dspark divergences and their printed reproductions, run: the engine's own loop in process.

``mlx-dspark serve`` live (profile ``mlx-dspark``: ``--max-draft W-1 --no-lookup-drafts``) on DSpark
fixtures; every diverged request of a drafted arm prints ``specparity replay --engine mlx-dspark
--verify-mode max-draft-N ...`` (its loop as that server ran it), which must exit 1 at the served
token; the drafter-less arms (its baseline mode) say why none exists. Two findings:

- bfloat16: the server takes the raw logits' argmax where classic decode's bfloat16 logprobs tie
  exactly (token 21 of the first nightly prompt, at both widths, and in its baseline mode too);
- float32, ``max_tokens`` 9: its last round commits every accepted draft, one token past
  ``max_tokens`` (the served answer has 10 tokens; classic decode stops at 9).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fixture_cache import cached
from reproductions import check_reproductions
from builds import REAL_CACHE, warmed

from specparity.environments import ENV_CACHE_VAR
from specparity.harness.config import Job, Pairing
from specparity.harness.judge import EXACT_TIE
from specparity.harness.results import ServedReport
from specparity.harness.run import ServedRun
from specparity.verdicts import Verdict

PROMPT = "The quick brown fox jumps over the lazy dog, and then"
WIDTHS = [3, 8]


@pytest.fixture(autouse=True)
def real_environments(monkeypatch: pytest.MonkeyPatch) -> None:
    """The harness and the printed command find the environments where scripts/build-env put them."""
    monkeypatch.setenv(ENV_CACHE_VAR, str(REAL_CACHE))


def _served(tmp_path: Path, name: str, info: dict, max_tokens: int) -> tuple[dict, ServedReport]:
    job = Job(pairings=[Pairing(name, info["target"], info["draft"], "mlx-dspark")], widths=WIDTHS,
              max_tokens=max_tokens, prompts=[PROMPT], sequence=["fresh"])
    report = ServedRun(job, workdir=tmp_path / name).run()
    return {a.name: a for a in report.pairings[0].arms}, report


@pytest.mark.slow
@pytest.mark.build
@pytest.mark.server
@pytest.mark.model
def test_served_mlx_dspark_divergences_print_a_reproduction_that_reproduces(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, cli_bin: str) -> None:
    from specparity.fixtures.dspark import build_dspark_pair

    warmed("mlx-dspark")  # its servers' first start on a machine calibrates (scripts/warm-engines)
    root = tmp_path_factory.mktemp("dspark-served")
    bf16 = cached(build_dspark_pair, root, "bf16", dtype="bfloat16").to_dict()
    f32 = cached(build_dspark_pair, root, "f32").to_dict()

    arms, report = _served(tmp_path, "bf16", bf16, 32)
    for w in WIDTHS:
        (r,) = arms[f"w{w}"].requests
        assert r.verdict == Verdict.DIVERGED and r.evidence.engaged and r.classic is not None, r.reason
        assert r.tie is not None and r.tie["kind"] == EXACT_TIE, r.tie
        command = (r.reproduction or {}).get("command") or ""
        assert command.startswith("specparity replay --engine mlx-dspark --model ") and \
            f"--verify-mode max-draft-{w - 1}" in command, r.reproduction
    (base,) = arms["baseline-start"].requests
    assert base.verdict == Verdict.DIVERGED and "baseline mode" in (base.reproduction or {}).get("reason", "")
    ran = check_reproductions(report, cli_bin)  # each command: exit 1 at the served token
    assert sorted((x.arm, x.index) for x in ran if x.command) == [(f"w{w}", 21) for w in WIDTHS], ran
    assert all(x.reason for x in ran if not x.command)

    arms, report = _served(tmp_path, "f32", f32, 9)
    assert arms["baseline-start"].requests[0].verdict == Verdict.MATCH
    for w in WIDTHS:
        (r,) = arms[f"w{w}"].requests
        assert r.verdict == Verdict.DIVERGED and r.classic is not None and r.classic.token_index == 9, r.reason
        # named as the length class it is (issue 46: it read as a text divergence at the end)
        assert r.reason.startswith(f"a length finding: w{w} emitted 10 tokens where max_tokens is 9 (1 past it)"), \
            r.reason
    ran = check_reproductions(report, cli_bin)  # the replay names the token past max_tokens=9
    assert sorted((x.arm, x.code, x.index) for x in ran) == [(f"w{w}", 1, 9) for w in WIDTHS], ran


@pytest.mark.slow
@pytest.mark.build
@pytest.mark.server
@pytest.mark.model
def test_a_server_that_keeps_the_leading_space_matches_classic_decode(tmp_path: Path,
                                                                     tmp_path_factory: pytest.TempPathFactory) -> None:
    """mlx-dspark serve writes a completion's text with ``tokenizer.decode`` (its leading space kept), classic
    decode with mlx-lm's streaming detokenizer (dropped): on the built-in prompts, whose first completion
    token carries a space, every arm (both baselines) was `diverged at token 0, char 0` (issue 46 item 3).
    The same ids written another way are named and judged equal; a real difference is still placed where
    it is (the arms' length finding stays, at the end of classic decode's text, not at char 0)."""
    from specparity.fixtures.dspark import build_dspark_pair

    warmed("mlx-dspark")
    f32 = cached(build_dspark_pair, tmp_path_factory.mktemp("dspark-lead"), "f32").to_dict()
    # the job's own prompts (the built-in job's): the first one's completion starts with a space
    job = Job(pairings=[Pairing("lead", f32["target"], f32["draft"], "mlx-dspark")], widths=[2], max_tokens=32,
              sequence=["fresh"])
    arms = {a.name: a for a in ServedRun(job, workdir=tmp_path).run().pairings[0].arms}
    for name in ("baseline-start", "baseline-end"):
        (r,) = arms[name].requests
        assert r.completion.text.startswith(" ") and r.verdict == Verdict.MATCH, r.reason
        assert r.reference is not None and "tokenizer.decode" in r.reference["detokenized"], r.reference
        assert "this server's detokenizer" in r.reason
    (w2,) = arms["w2"].requests
    assert w2.classic is not None and w2.classic.written_as == "tokenizer.decode" and (w2.classic.char_offset or 0) > 0
