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
    from specparity.dspark_fixtures import build_dspark_pair

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
    ran = check_reproductions(report, cli_bin)  # the replay names the token past max_tokens=9
    assert sorted((x.arm, x.code, x.index) for x in ran) == [(f"w{w}", 1, 9) for w in WIDTHS], ran
