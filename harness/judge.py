"""Judge: each request's verdict from its completion and evidence, then each pairing's from its arms.

Public so that everything that judges served results judges them the same
way: the runner as arms finish, ``records merge`` when it joins shards.

A request of an arm that drafts is ``match`` only when its text equals the
reference's and there is evidence the drafter ran (``not_engaged`` without),
``declined`` with a decline line, ``diverged`` with the first difference, and
``error`` without a completion. A pairing whose two baselines disagree is
``inconclusive``: no speculative arm is judged against a reference that does
not reproduce. A pairing where no arm ran a drafter is ``not_run``: two
baselines that agree prove nothing about speculative decoding.
"""

from __future__ import annotations

import shlex

from specparity.completions import Side, first_difference
from specparity.harness.client import Completion, Request
from specparity.harness.evidence import Evidence
from specparity.harness.plan import BASELINE_END, BASELINE_START, ArmKind, ArmPlan
from specparity.harness.results import ArmResult, PairingResult, RequestResult
from specparity.verdicts import SERVED_VERDICTS, Verdict, combine

SELF_DRAFT_MIN_ACCEPTANCE = 0.9
NOTHING_SPECULATIVE = ("nothing speculative was tested: no arm ran a drafter (the pairing has no draft"
                       " model, and no self-draft arm ran)")


def speculative(arm: ArmResult) -> bool:
    """The arm ran a drafter: a width, self-draft or control arm, or the drafted distribution arm."""
    return arm.drafts or (arm.kind == ArmKind.DISTRIBUTION and arm.width is not None)


def side(name: str, completion: Completion) -> Side:
    """A completion as the one comparison (specparity.completions) sees it."""
    return Side(name, completion.text, completion.token_ids, completion.logprobs, completion.top)


def judge_request(plan: ArmPlan, req: Request, comp: Completion, ev: Evidence, base: Completion | None,
                  target: str, trust_remote_code: bool) -> RequestResult:
    """One request's verdict: ``base`` is baseline-start's completion of the same request."""
    res = RequestResult(req.id, req.kind, Verdict.ERROR, "", comp, req.to_dict(), ev)
    if not comp.ok:
        res.reason = comp.error or "no completion"
        return res
    if plan.name == BASELINE_START:
        res.verdict, res.reason = Verdict.MATCH, "the reference"
        return res
    if base is None or not base.ok:
        res.verdict, res.reason = Verdict.INCONCLUSIVE, f"{BASELINE_START} has no completion of this request"
        return res
    if ev.declined:
        res.verdict = Verdict.DECLINED
        res.reason = "declined: " + "; ".join(ev.lines[:2])
        return res
    # served parity is byte-identical text: the same text by other token ids is not a divergence here
    d = None if base.sha256 == comp.sha256 else first_difference(side("baseline", base), side("arm", comp))
    if d is not None:
        res.verdict, res.divergence = Verdict.DIVERGED, d
        res.reason = d.line()
        res.replay = replay_command(plan, req, ev, target, trust_remote_code)
        return res
    if plan.drafts and not ev.engaged:
        res.verdict = Verdict.NOT_ENGAGED
        res.reason = "same text as the baseline, but no evidence the drafter ran (no witness, log or response field)"
        return res
    res.verdict = Verdict.MATCH
    res.reason = "; ".join(ev.lines[:1]) if plan.drafts else ""
    return res


def replay_command(plan: ArmPlan, req: Request, ev: Evidence, target: str, trust_remote_code: bool) -> str | None:
    """``specparity replay`` of this request's witnessed rounds (None without rounds or a plain prompt)."""
    prompt = req.prompt_text()
    if not ev.accepts or prompt is None or plan.width is None:
        return None
    argv = ["specparity", "replay", "--model", target, "--prompt", prompt,
            "--accepts", ",".join(map(str, ev.accepts)), "--width", str(plan.width.rows),
            "--max-tokens", str(req.body.get("max_tokens", 0))]
    if trust_remote_code:
        argv.append("--trust-remote-code")
    return shlex.join(argv)


def judge_arm(arm: ArmResult, plan: ArmPlan) -> None:
    """The arm's verdict, reason and acceptance from its judged requests."""
    evs = [r.evidence for r in arm.requests]
    proposed = sum(w - 1 for e in evs for w in e.widths)
    if proposed:
        arm.acceptance = sum(a for e in evs for a in e.accepts) / proposed
    arm.verdict = combine([r.verdict for r in arm.requests], empty=Verdict.ERROR)
    bad = [r for r in arm.requests if r.verdict != Verdict.MATCH]
    if not arm.requests:
        arm.reason = "no requests were sent"
    elif bad:
        arm.reason = f"{len(bad)} of {len(arm.requests)} requests not match"
    if plan.kind == ArmKind.SELF_DRAFT and arm.acceptance is not None \
            and arm.acceptance < SELF_DRAFT_MIN_ACCEPTANCE:
        arm.verdict = combine([arm.verdict, Verdict.DIVERGED])
        arm.reason = (f"serving-loop defect: the target drafting for itself had {arm.acceptance:.1%} of its"
                      f" proposals accepted at temperature 0 (expected >= {SELF_DRAFT_MIN_ACCEPTANCE:.0%})")


def judge_pairing(res: PairingResult) -> None:
    """The pairing's verdict, reason and findings from its arms (each already judged)."""
    start, end = res.arm(BASELINE_START), res.arm(BASELINE_END)
    if start is None or start.verdict == Verdict.ERROR or not start.requests:
        res.verdict = Verdict.ERROR
        res.reason = f"{BASELINE_START} did not run: nothing can be compared"
        return
    if end is not None and end.verdict not in (Verdict.MATCH, Verdict.ERROR):
        bad = [r for r in end.requests if r.verdict != Verdict.MATCH]
        res.verdict = Verdict.INCONCLUSIVE
        res.reason = (f"the two baselines disagree on {len(bad)} of {len(end.requests)} requests"
                      f" ({', '.join(r.id for r in bad)}): classic decode is not reproducible across processes,"
                      " so no speculative arm is judged")
        res.findings += [f"{BASELINE_END} {r.id}: {r.reason}" for r in bad]
        for a in res.arms:
            if a.kind != ArmKind.BASELINE and a.verdict != Verdict.ERROR:
                a.reason = f"not judged ({a.verdict} against {BASELINE_START}); " + a.reason
                a.verdict = Verdict.INCONCLUSIVE
        return
    if end is None or end.verdict == Verdict.ERROR:
        res.findings.append(f"{BASELINE_END} did not run: the noise floor is unknown")
    reps = [a for a in res.arms if a.kind == ArmKind.REPEAT]
    if reps:
        uniq = {a.digest for a in [start, *reps]}
        res.findings.append(f"{len(reps) + 1} baseline trials: {len(uniq)} unique output"
                            f"{'s' if len(uniq) != 1 else ''}")
    for a in res.arms:
        if a.kind == ArmKind.SELF_DRAFT and a.acceptance is not None and a.acceptance < SELF_DRAFT_MIN_ACCEPTANCE:
            res.findings.append(a.reason)
    # -- issue 20, class 6: nothing speculative ran, nothing passed ---------------------------------
    if not any(speculative(a) for a in res.arms):
        res.verdict, res.reason = Verdict.NOT_RUN, NOTHING_SPECULATIVE
        return
    # ----------------------------------------------------------------------------------------------
    judged = [a.verdict for a in res.arms if a.kind != ArmKind.BASELINE or a.name == BASELINE_END]
    res.verdict = combine(judged or [Verdict.MATCH])
    assert res.verdict in (*SERVED_VERDICTS, Verdict.NOT_RUN)
