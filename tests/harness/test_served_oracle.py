"""Served completions judged against classic decode computed in process, on real servers.

mlx-lm 0.32.2's own bugs are the faults here, found by the harness without being
told: a ``seed`` sends a request down the server's sequential path, whose logits
processors see only the uncached suffix on a prompt-cache hit, so a repeated
request with a repetition penalty leaves classic decode on the drafter-less
baseline as much as on the drafter arm ("every server of this engine"); a
drafter server files cache entries one position short ("only with the
drafter"). Every printed reproduction of every diverged request is run and must
exit 1 at the same index, or the record says why there is none
(tests/reproductions.py). The clean fixtures in float32, bfloat16 and float16
raise no false alarm, every request compared.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import build
from reproductions import check_reproductions
from specparity.fixtures import FixtureInfo
from specparity.harness.config import Job, Pairing
from specparity.harness.run import ServedRun
from specparity.verdicts import Verdict

PROMPTS = ["Speculative decoding drafts several tokens with a small model and verifies them",
           "The cache holds keys and values for every position; a rewind trims the rejected rows."]

pytestmark = [pytest.mark.model, pytest.mark.server]


def _arms(report):
    return {a.name: a for a in report.pairings[0].arms}


@pytest.mark.slow
def test_a_fault_every_server_shares_is_found_against_classic_decode(llama_pair: FixtureInfo, tmp_path: Path,
                                                                   cli_bin: str) -> None:
    """seed + repetition_penalty, repeated: mlx-lm's sequential path on a prompt-cache hit. The
    drafter-less baseline itself differs from classic decode; the report says it concerns every
    server of this engine, names the request against its own fresh answer, and the printed
    command reproduces it in process at the same token."""
    job = Job(pairings=[Pairing("p", llama_pair.target, llama_pair.draft)], widths=[2], max_tokens=24,
              prompts=PROMPTS[:1], sequence=["fresh", "repeat"],
              params={"repetition_penalty": 1.3, "seed": 0})
    report = ServedRun(job, workdir=tmp_path / "w").run()
    a = _arms(report)
    start = {r.id: r for r in a["baseline-start"].requests}
    assert start["p0"].verdict == Verdict.MATCH and start["p0"].classic is None
    again = start["p0-again"]
    assert again.verdict == Verdict.DIVERGED and again.classic is not None and again.classic.token_index is not None
    assert again.cold is not None and again.cold.token_index == again.classic.token_index  # its own fresh answer
    assert a["baseline-start"].verdict == a["baseline-end"].verdict == Verdict.DIVERGED
    p = report.pairings[0]
    assert p.verdict == Verdict.DIVERGED and report.exit_code == 1
    scope = [f for f in p.findings if "p0-again" in f and "differs from classic decode" in f]
    assert scope and "every server of this engine" in scope[0], p.findings
    assert any("differs from its own fresh answer (p0)" in f for f in p.findings)
    # one distinct request (the repeat sends the same body; the drafter arm's num_draft_tokens is
    # delivery, not generation): decoded once, before any server started; all six answers from its cache
    assert p.reference_cost is not None and (p.reference_cost["computed"], p.reference_cost["hits"]) == (1, 6)
    # every diverged request of every arm: both baselines' repeats (sequence replays through one prompt
    # cache), the drafter arm's fresh request (its processors see the last prompt token only) and its repeat
    ran = check_reproductions(report, cli_bin)
    assert {(x.arm, x.request) for x in ran} == {("baseline-start", "p0-again"), ("baseline-end", "p0-again"),
                                                 ("w2", "p0"), ("w2", "p0-again")}
    assert all(x.command for x in ran)


@pytest.mark.slow
def test_drafter_warm_cache_findings_reproduce_and_clean_requests_match(llama_pair: FixtureInfo, tmp_path: Path,
                                                                      cli_bin: str) -> None:
    """The drafter server's prompt cache (mlx-lm 0.32.2): repeat, shared prefix and second turn leave
    classic decode only with the drafter; fresh and streamed requests match; every printed command
    (a sequence replay through one prompt cache) exits 1 at the same index."""
    job = Job(pairings=[Pairing("p", llama_pair.target, llama_pair.draft)], widths=[3], max_tokens=24,
              prompts=PROMPTS + PROMPTS)
    report = ServedRun(job, workdir=tmp_path / "w").run()
    a = _arms(report)
    w3 = {r.id: r for r in a["w3"].requests}
    assert w3["p0"].verdict == Verdict.MATCH and w3["p1-stream"].verdict == Verdict.MATCH
    assert a["baseline-start"].verdict == Verdict.MATCH
    diverged = [r for r in a["w3"].requests if r.verdict == Verdict.DIVERGED]
    assert {r.id for r in diverged} >= {"p0-again"}
    p = report.pairings[0]
    assert any("p0-again" in f and "only with the drafter" in f and "only on a warm cache in w3" in f
               for f in p.findings), p.findings
    assert p.groups()[0][:2] == ["classic decode", "baseline-start"]
    ran = check_reproductions(report, cli_bin)
    assert {x.request for x in ran} == {r.id for r in diverged} and all(x.command for x in ran)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_no_false_alarm_on_clean_fixtures(fixture_root: Path, tmp_path: Path, dtype: str) -> None:
    """Fresh requests (a penalty, a logit bias, a stop word; completions, streamed, chat) on the clean pair:
    every arm, baselines included, equals classic decode; bf16 / f16 ties are classic decode's own.
    (Warm-cache requests are left out: on a drafter server they meet mlx-lm 0.32.2's cache bug, and
    so does any second chat request, whose chat template is a prefix the first one cached: one chat
    request per server here.)"""
    pair = build(fixture_root, f"llama-{dtype}", arch="llama", dtype=dtype)
    # two widths and the self-drafting arm in float32; one width in the half dtypes (their ties)
    half = dtype != "float32"
    job = Job(pairings=[Pairing("p", pair.target, pair.draft)], widths=[3] if half else [2, 4], max_tokens=32,
              prompts=PROMPTS, sequence=["fresh", "stream"], self_draft=not half,
              params={"presence_penalty": 0.2, "logit_bias": {"5": -1.0}, "stop": ["\n\n"]})
    chat = Job(pairings=job.pairings, widths=[2], max_tokens=32, prompts=PROMPTS[1:], sequence=["fresh"],
               endpoint="chat", params=job.params)
    for j, where in ((job, "w"), (chat, "chat")):
        report = ServedRun(j, workdir=tmp_path / where).run()
        for arm in report.pairings[0].arms:
            for r in arm.requests:
                assert r.classic is None and r.verdict in (Verdict.MATCH, Verdict.NOT_ENGAGED), (arm.name, r.reason)
                # compared, not merely answered: a prompt formed otherwise keeps the sha and drops the comparison
                assert r.reference is not None and r.reference.get("sha256") and r.reference["compared"] is True, \
                    (arm.name, r.id, r.reference)
        assert report.exit_code == 0, "\n".join(report.lines())


@pytest.mark.slow
def test_without_the_reference_the_baseline_decides(llama_pair: FixtureInfo, tmp_path: Path, cli_bin: str) -> None:
    """``reference: false`` (served --no-reference): the drafter-less server is the reference again, and
    the fault every server shares reads as a match (the reason the reference exists). What the drafter
    changes is still diverged, and its reproduction carries every request parameter: the server's
    sequence replayed (no classic decode ran, so no prompt ids), which exits 1 at the same token."""
    job = Job(pairings=[Pairing("p", llama_pair.target, llama_pair.draft)], widths=[2], max_tokens=24,
              prompts=PROMPTS[:1], sequence=["fresh", "repeat"], self_draft=False,
              params={"repetition_penalty": 1.3, "seed": 0}, reference=False)
    report = ServedRun(job, workdir=tmp_path / "w").run()
    start = _arms(report)["baseline-start"]
    assert all(r.reference is None and r.verdict == Verdict.MATCH for r in start.requests)
    assert report.pairings[0].reference_cost is None
    w2 = {r.id: r for r in _arms(report)["w2"].requests}
    assert w2["p0"].verdict == Verdict.DIVERGED and w2["p0"].classic is None
    ran = check_reproductions(report, cli_bin)
    assert ("w2", "p0") in {(x.arm, x.request) for x in ran} and all(x.command for x in ran)


@pytest.mark.slow
def test_a_request_without_an_earlier_twin_is_judged_against_its_cold_answer(
        llama_pair: FixtureInfo, scaled_rows4_pair: FixtureInfo, cli_bin: str) -> None:
    """A shared-prefix request that left classic decode is compared with the same request answered cold,
    computed in process by mlx_lm.server's own loop with the arm's drafter and width: on the clean pair
    (mlx-lm 0.32.2's drafter cache bug) the cold answer equals classic decode, so the finding is named
    state-dependent; on the rows >= 4 fault the cold answer differs too, so it is not state-dependent.
    (A loop no replay rebuilds: tests/harness/test_judge.py.) Run without a record: the first request of the rows
    fault's drafter server replays alone (its command is run), the later ones say why nothing does."""
    job = Job(pairings=[Pairing("clean", llama_pair.target, llama_pair.draft),
                        Pairing("rows", scaled_rows4_pair.target, scaled_rows4_pair.draft)],
              widths=[4], max_tokens=24, prompts=PROMPTS, sequence=["fresh", "shared-prefix"])
    report = ServedRun(job).run()  # no record: a scratch folder, removed at exit
    by = {p.name: p for p in report.pairings}

    def finding(p: str) -> str:
        return next(f for f in by[p].findings if "p0-prefix" in f and "differs from classic decode" in f)

    def prefix(p: str):
        return next(r for r in by[p].arm("w4").requests if r.id == "p0-prefix")  # type: ignore[union-attr]

    assert prefix("clean").verdict == Verdict.DIVERGED and prefix("clean").reference["cold"]["equals_classic"]
    assert "only on a warm cache in w4: the same request answered cold there equals classic decode" in finding("clean")
    assert "differs from its cold answer in process" in " ".join(by["clean"].findings)
    assert by["clean"].reference_cost is not None and by["clean"].reference_cost["cold"] == 1
    assert prefix("rows").verdict == Verdict.DIVERGED
    assert "not state-dependent in w4: the same request answered cold there differs from classic decode too" \
        in finding("rows")
    assert "only on a warm cache" not in finding("rows")
    ran = {(x.pairing, x.request): x for x in check_reproductions(report, cli_bin)}
    assert ran[("rows", "p0")].command and ran[("rows", "p0")].code == 1
    for key in (("clean", "p0-prefix"), ("rows", "p0-prefix")):
        assert ran[key].command is None and "the run keeps no files (pass --record-dir)" in str(ran[key].reason)

