"""A served dflash-mlx divergence and its printed reproduction, run: the engine's own loop in process.

On the bfloat16 hybrid DFlash fixture (qwen3_5 with as many linear value as key
heads, block 16) dflash serve's drafted arm emits the raw logits' argmax chain
and classic decode the argmax of bfloat16 logprobs (tests/engines/test_dflash_mlx_served.py
pins that chain): they part where two logits round to one logprob. The judge
keeps it ``diverged``, labels the exact tie, and prints ``specparity replay
--engine dflash-mlx ...`` for the first request on a fresh prefix cache, which
must exit 1 at the same first token.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_pairs import dflash_info, pair_dirs
from reproductions import check_reproductions
from builds import REAL_CACHE, built

from specparity.environments import ENV_CACHE_VAR
from specparity.harness.config import Job, Pairing
from specparity.harness.judge import EXACT_TIE, EXACT_TIE_WORDS
from specparity.harness.run import ServedRun
from specparity.verdicts import Verdict

PROMPT = "The quick brown fox jumps over the lazy dog, and then"
BLOCK = 16


@pytest.fixture(autouse=True)
def real_environments(monkeypatch: pytest.MonkeyPatch) -> None:
    """The harness and the printed command find the environments where scripts/build-env put them."""
    monkeypatch.setenv(ENV_CACHE_VAR, str(REAL_CACHE))


@pytest.mark.slow
@pytest.mark.build
@pytest.mark.server
@pytest.mark.model
def test_a_served_dflash_tie_divergence_is_labelled_and_its_command_reproduces_it(
        fixture_root: Path, tmp_path: Path, cli_bin: str) -> None:
    built("dflash-mlx")
    try:
        pair = pair_dirs(dflash_info(fixture_root, "qwen3_5-equal-heads", BLOCK, "bfloat16"))
    except LookupError as err:
        pytest.skip(str(err))
    job = Job(pairings=[Pairing("hybrid", pair["target"], pair["draft"], "dflash-mlx")], widths=[BLOCK],
              max_tokens=32, prompts=[PROMPT], sequence=["fresh"])
    report = ServedRun(job, workdir=tmp_path / "w").run()
    arms = {a.name: a for a in report.pairings[0].arms}
    assert arms["baseline-start"].verdict == Verdict.MATCH, arms["baseline-start"].requests[0].reason
    (r,) = arms[f"w{BLOCK}"].requests
    assert r.verdict == Verdict.DIVERGED and r.classic is not None and r.evidence.engaged, r.reason
    # classic decode's top two logprobs are equal there in bfloat16; the drafted path took the other id
    assert r.tie is not None and r.tie["kind"] == EXACT_TIE and r.tie["dtype"] == "bfloat16", r.tie
    assert r.tie["token_index"] == r.classic.token_index and r.tie["classic_token"] < r.tie["other_token"]
    assert EXACT_TIE_WORDS in r.reason
    assert any(EXACT_TIE_WORDS in f and "only with the drafter" in f for f in report.pairings[0].findings)
    command = (r.reproduction or {}).get("command")
    assert command and command.startswith("specparity replay --engine dflash-mlx --model "), r.reproduction
    ran = check_reproductions(report, cli_bin)  # exit 1 at the served token
    assert [(x.arm, x.request, x.index) for x in ran] == [(f"w{BLOCK}", "p0", r.classic.token_index)]
