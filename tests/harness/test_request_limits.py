"""A request's time limit follows what the job measured (harness.limits), and the user's limit wins.

A slow server (tests/fakeserver.py --seconds-per-token: one answer at a time, as a compute-bound
server) answers the sequence's three requests in about a second each, and the three sent at once
(the concurrent arm) in about one, two and three seconds. A fixed limit of 2.2 s, enough for every
request alone, ends the third; the derived limit is the same request's measured time times the
arm's concurrency (and the margin), and the job completes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from specparity.harness.client import Request
from specparity.harness.job import Job, Pairing
from specparity.harness.limits import CLASSIC, LimitRule, RequestLimits, limits_line, plan_line
from specparity.harness.plan import ArmKind, ArmPlan
from specparity.harness.profiles import Width
from specparity.harness.run import ServedRun
from specparity.verdicts import Verdict

FAKE = str(Path(__file__).resolve().parents[1] / "fakeserver.py")
SECONDS_PER_TOKEN = 0.25
TOKENS = 4  # about 1 s a request
FIXED = 2.2  # every request alone fits; the third of three sent at once does not


def _job(tmp_path: Path, request_timeout: float | None) -> Job:
    ck = tmp_path / "ck"
    ck.mkdir(parents=True, exist_ok=True)
    (ck / "config.json").write_text("{}")  # the fake loads nothing: a folder the harness accepts
    prof = tmp_path / "slow.yaml"
    prof.write_text(yaml.safe_dump({
        "name": "slow", "argv": ["{python}", "-I", FAKE, "--model", "{model}", "--host", "{host}", "--port",
                                 "{port}", "--seconds-per-token", str(SECONDS_PER_TOKEN)]}))
    return Job([Pairing("slow", str(ck), None, str(prof))], widths=[2], max_tokens=TOKENS,
               sequence=["fresh", "repeat", "shared-prefix"], concurrency=3, reference=False,
               request_timeout=request_timeout)


def _run(tmp_path: Path, request_timeout: float | None):
    # the floor below the fixed limit: the test's slow server is seconds slow, not minutes
    rule = LimitRule(margin=4.0, floor=1.0, unmeasured=60.0)
    report = ServedRun(_job(tmp_path, request_timeout), tmp_path / "work", limit_rule=rule).run()
    return report.pairings[0]


@pytest.mark.server
@pytest.mark.slow
def test_a_slow_servers_limits_follow_its_measured_time_and_the_users_limit_wins(tmp_path: Path) -> None:
    fixed = _run(tmp_path / "fixed", FIXED)
    arms = {a.name: a for a in fixed.arms}
    assert [a.name for a in fixed.arms] == ["baseline-start", "concurrent", "baseline-end"]
    assert arms["baseline-start"].verdict == Verdict.MATCH and arms["baseline-end"].verdict == Verdict.MATCH
    late = [r for r in arms["concurrent"].requests if r.verdict == Verdict.ERROR]
    assert late and all(r.reason.startswith(f"no complete answer within the request timeout of {FIXED:g} s")
                        for r in late), [r.reason for r in arms["concurrent"].requests]
    assert fixed.request_limits is not None and fixed.request_limits["source"] == "override"
    assert all(r.completion.limit_seconds == FIXED for a in fixed.arms for r in a.requests)

    derived = _run(tmp_path / "derived", None)
    arms = {a.name: a for a in derived.arms}
    assert {a.name: a.verdict for a in derived.arms} == {"baseline-start": Verdict.MATCH,
                                                         "concurrent": Verdict.MATCH,
                                                         "baseline-end": Verdict.MATCH}, \
        [(a.name, a.reason) for a in derived.arms]
    concurrent = arms["concurrent"].requests
    # it needed more than the fixed limit, and its limit was derived from its measured time alone
    assert max(r.completion.seconds for r in concurrent) > FIXED
    limits = derived.request_limits
    assert limits is not None and limits["source"] == "derived" and limits["floor"] == 1.0
    measured = limits["measured"]
    for r in concurrent:
        alone = measured[r.id]["seconds"]
        assert measured[r.id]["source"] in ("baseline-start", "baseline-end")
        assert alone >= SECONDS_PER_TOKEN * TOKENS
        limit = r.completion.limit_seconds
        # margin x concurrency x its time alone (measured before it was sent: at least the fake's own time)
        assert limit is not None and limit >= 4.0 * 3 * SECONDS_PER_TOKEN * TOKENS
    assert limits["arms"]["concurrent"]["factor"] == 3
    assert limits["arms"]["baseline-start"]["most_s"] == 60.0  # its first request: nothing measured yet
    line = limits_line(limits)
    assert line is not None and "request time limits: derived" in line and "concurrent" in line


def _plan(name: str, kind: ArmKind, rows: int | None = None, concurrency: int = 0) -> ArmPlan:
    from specparity.harness.plan import Drafter

    width = Width(rows, rows - 1, "num_draft_tokens") if rows else None
    return ArmPlan(name, kind, width, Drafter.DRAFT if rows else None, concurrency=concurrency, server_key=name)


def test_a_limit_is_the_measured_time_times_concurrency_and_rows_with_a_floor_and_an_override() -> None:
    req = Request("p0", "fresh", "completions", {"prompt": "x", "max_tokens": 32})
    other = Request("p1", "fresh", "completions", {"prompt": "y", "max_tokens": 16})
    limits = RequestLimits(LimitRule(margin=4.0, floor=120.0, unmeasured=600.0))
    base = _plan("baseline-start", ArmKind.BASELINE)
    assert limits.limit(base, req) == 600.0  # nothing measured
    limits.observe("p0", 40.0, 32, CLASSIC)
    assert limits.limit(base, req) == 160.0
    assert limits.limit(_plan("concurrent", ArmKind.CONCURRENT, concurrency=3), req) == 480.0
    assert limits.limit(_plan("w4", ArmKind.WIDTH, rows=4), req) == 640.0
    assert limits.limit(base, other) == 120.0  # 1.25 s a token x 16 x 4 = 80 s: the floor
    limits.observe("p0", 20.0, 32, "baseline-start")  # a faster measurement does not lower it
    assert limits.limit(base, req) == 160.0
    assert limits.arms["baseline-start"] == {"least_s": 120.0, "most_s": 600.0, "factor": 1}
    user = RequestLimits(LimitRule(), override=30.0)
    user.observe("p0", 400.0, 32, CLASSIC)
    assert user.limit(_plan("concurrent", ArmKind.CONCURRENT, concurrency=3), req) == 30.0
    line = limits_line(user.to_dict())
    assert line is not None and line.startswith("  request time limit: 30 s, set by the user")
    # what the command states before it starts
    assert plan_line(None).startswith("request time limits: derived from what the job measures")
    assert plan_line(30.0) == "request time limit: 30 s for every request (set by the user)"
