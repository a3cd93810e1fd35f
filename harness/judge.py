"""Judge: each request's verdict from its completion and evidence, then each pairing's from its arms.

Public so that everything that judges served results judges them the same
way: the runner as arms finish, ``records merge`` when it joins shards.

Who is compared with whom (every request of every arm, baselines included):

- **classic decode** computed in process (harness.oracle): the reference. On an
  engine that computes with MLX (``arithmetic: mlx``, the default) a completion
  whose text differs from it is ``diverged``, whatever the arm;
- **baseline-start**, the drafter-less server's own answer: a second opinion
  (and the reference itself where no classic answer could be computed, or the
  engine's arithmetic is not MLX's: then a difference from classic decode is a
  finding, a near tie told apart from a confident one, never hidden);
- **the same request answered cold**: a request that repeats an earlier one of
  the same arm (``Request.repeats``) is compared with that first answer; a
  later request that left classic decode with no earlier twin, with the arm's
  cold answer computed in process where the server's loop can be rebuilt
  (harness.run), so a state-dependent difference is named as such, and one
  that is there cold too is named as not state-dependent.

Where classic decode's top two logprobs tie exactly at the first differing
token (in the model's dtype) and the other side took the runner-up, the
divergence stays ``diverged`` and is labelled an exact tie broken the other
way (``RequestResult.tie``, kind ``exact_tie``), with its own scope.
Reproductions are not the judge's: every diverged request gets one from
harness.reproduce, whoever decided it.

A request of an arm that drafts is ``match`` only with evidence the drafter
ran (``not_engaged`` without), ``declined`` with a decline line (when its text
is classic decode's), ``error`` without a completion. A pairing whose two
baselines disagree is ``inconclusive``: classic decode is not reproducible
across processes, and nothing is blamed on the drafter.
A pairing where no arm ran a drafter is ``not_run`` (two baselines that agree with classic
decode prove nothing about speculative decoding), unless a baseline left classic decode.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specparity.completions import CompletionDifference, Side, first_difference
from specparity.harness.client import Completion, Request
from specparity.harness.evidence import Evidence
from specparity.harness.plan import BASELINE_END, BASELINE_START, DRAFTING_KINDS, ArmKind, ArmPlan
from specparity.harness.results import CLASSIC, ArmResult, PairingResult, RequestResult
from specparity.verdicts import SERVED_VERDICTS, Verdict, combine

SELF_DRAFT_MIN_ACCEPTANCE = 0.9
# request kinds that can meet a warm prompt cache (an earlier request shares their prefix)
WARM_KINDS = ("repeat", "shared-prefix", "multi-turn")
NOTHING_SPECULATIVE = ("nothing speculative was tested: no arm ran a drafter (the pairing has no draft"
                       " model, and no self-draft arm ran)")
EXACT_TIE = "exact_tie"
EXACT_TIE_WORDS = "an exact tie in classic decode's logprobs, broken the other way"


def speculative(arm: ArmResult) -> bool:
    """The arm ran a drafter: a width, self-draft or control arm, or the drafted distribution arm."""
    return arm.drafts or (arm.kind == ArmKind.DISTRIBUTION and arm.width is not None)


def side(name: str, completion: Completion) -> Side:
    """A completion as the one comparison (specparity.completions) sees it."""
    return Side(name, completion.text, completion.token_ids, completion.logprobs, completion.top)


def text_difference(ref: Side, ref_sha: str, other: Completion, other_name: str) -> CompletionDifference | None:
    """Where ``other`` first leaves ``ref``; None when the texts are byte-identical (served parity is
    the text: the same text by other token ids is not a divergence here)."""
    if ref_sha == other.sha256:
        return None
    return first_difference(ref, side(other_name, other))


@dataclass
class ClassicAnswer:
    """Classic decode's answer to one request, as the judge needs it (what classic decode is lives in
    specparity.decode and specparity.mlx_server; this is only its answer, judged against).

    side: its tokens, text, logprobs and top-2 (completions.Side). sha256: of its text.
    summary: what the record keeps (tokens, finish reason, path, the prompt check).
    index_at: a first differing character of its text -> the token there (for streamed answers).
    error: why there is no answer (side None).
    """

    side: Side | None
    sha256: str
    summary: dict[str, object]
    index_at: Callable[[int | None], int | None] | None = None
    error: str | None = None

    def token_index_at(self, char_offset: int | None) -> int | None:
        return self.index_at(char_offset) if self.index_at is not None else None


@dataclass
class Cold:
    """The same request answered cold, as the judge compares an answer with it.

    completion: that answer (None: there is none; ``why`` says why). source: what it is
    (``p0 (its first answer)``, ``its cold answer in process (...)``).
    """

    completion: Completion | None
    source: str
    why: str | None = None


def classic_answer(completion: object | None, error: str | None = None) -> ClassicAnswer:
    """A specparity.reference.ReferenceCompletion (or an error) as the judge reads it."""
    if completion is None:
        return ClassicAnswer(None, "", {"unavailable": error or "no answer"}, None, error or "no answer")
    from specparity.reference import ReferenceCompletion

    assert isinstance(completion, ReferenceCompletion)
    sha = hashlib.sha256(completion.text.encode("utf-8")).hexdigest()
    summary: dict[str, object] = {"sha256": sha, "tokens": len(completion.token_ids),
                                  "finish_reason": completion.finish_reason, "path": completion.path,
                                  "prompt_tokens": len(completion.prompt_ids),
                                  "prompt_check": completion.prompt_check.line() if completion.prompt_check else None,
                                  "prompt_equal": completion.prompt_check.equal if completion.prompt_check else None}
    if completion.own_prompt is not None or completion.own_prompt_error:
        own = completion.own_prompt
        summary["own_prompt_check"] = own.line() if own is not None else completion.own_prompt_error
        summary["own_prompt_equal"] = own.equal if own is not None else None
    return ClassicAnswer(completion.side(CLASSIC), sha, summary, completion.token_index_at)


def judge_request(plan: ArmPlan, req: Request, comp: Completion, ev: Evidence, base: Completion | None,
                  classic: ClassicAnswer | None = None, cold: Cold | None = None, exact: bool = True,
                  dtype: str = "float32", lossy: str | None = None) -> RequestResult:
    """One request's verdict.

    base: baseline-start's completion of the same request. classic: classic decode's answer
    (None: no reference asked for). cold: the same request answered cold (its first answer in
    the arm, or computed in process), or why there is none (None: not asked).
    exact: the engine computes with MLX, so classic decode decides; else it is a finding.
    dtype: the model's dtype (the near-tie band of an engine whose arithmetic differs).
    lossy: the profile's documented lossy mode (:attr:`Profile.lossy`): a drafted answer is ``lossy_by_design``.
    """
    res = RequestResult(req.id, req.kind, Verdict.ERROR, "", comp, req.to_dict(), ev)
    if not comp.ok:
        res.reason = comp.error or "no completion"
        return res
    if classic is not None and classic.side is not None and classic.summary.get("prompt_equal") is False:
        # classic decode answered another prompt than the server did: nothing to compare
        classic = ClassicAnswer(None, "", dict(classic.summary), None,
                          f"its prompt is not the server's ({classic.summary.get('prompt_check')})")
    if classic is not None:
        res.reference = {**classic.summary, "compared": classic.side is not None}
        if classic.error:
            res.reference["unavailable"] = classic.error
        if classic.side is not None:
            res.classic = text_difference(classic.side, classic.sha256, comp, plan.name)
            if res.classic is not None and res.classic.token_index is None:
                # a streamed answer has no ids: its token index comes from classic decode's pieces
                res.classic.token_index = classic.token_index_at(res.classic.char_offset)
            d = res.classic
            if d is not None and d.text_only:
                # the server emitted classic decode's very tokens; only its detokenizer wrote other text. Without
                # the drafter too (its baseline writes them so, or this is a baseline): the server's way, no
                # finding. With the drafter only (its baseline writes classic decode's text): other output with
                # the drafter, a finding named as text only
                res.reference["detokenized"] = (f"the same tokens, other text from char {d.char_offset}:"
                                                f" {d.detokenization}")
                with_drafter_only = plan.drafts and base is not None and base.ok and base.sha256 == classic.sha256
                res.reference["detokenized_with_drafter_only"] = bool(with_drafter_only)
                if not with_drafter_only:
                    res.classic = None
    if base is not None and base.ok and plan.name != BASELINE_START:
        res.baseline = text_difference(side(BASELINE_START, base), base.sha256, comp, plan.name)
    if cold is not None:
        _compare_cold(res, cold, classic, plan.name)
    decided_by_classic = exact and classic is not None and classic.side is not None
    if decided_by_classic:
        assert classic is not None
        return _as_lossy(_by_classic(res, plan, ev, classic, dtype), plan, lossy)
    return _as_lossy(_by_baseline(res, plan, ev, base, classic, dtype), plan, lossy)


def _as_lossy(res: RequestResult, plan: ArmPlan, lossy: str | None) -> RequestResult:
    """A drafted answer of a mode its authors document as lossy: ``lossy_by_design`` with what it changed (its
    divergence is kept as the evidence), never a pass and never a defect. A request that drafted nothing, was
    declined or failed keeps its verdict: the lossy mode did not answer it."""
    if lossy is None or not plan.drafts or res.verdict not in (Verdict.MATCH, Verdict.DIVERGED):
        return res
    changed = (f"it changed the answer: {res.reason}" if res.verdict == Verdict.DIVERGED
               else f"it changed nothing here ({res.reason})")
    res.verdict, res.reason = Verdict.LOSSY, f"lossy by design ({lossy}): {changed}; not a pass, not a defect"
    return res


def _compare_cold(res: RequestResult, cold: Cold, classic: ClassicAnswer | None, name: str) -> None:
    """The answer against the same request answered cold, and that cold answer against classic decode
    (``res.reference["cold"]``: whether the difference is state-dependent)."""
    c = cold.completion
    if c is None or not c.ok:
        if res.reference is not None:
            res.reference["cold"] = {"source": cold.source, "unavailable": cold.why or (c.error if c else None)}
        return
    res.cold = text_difference(side(cold.source, c), c.sha256, res.completion, name)
    if res.reference is None or classic is None or classic.side is None:
        return
    off = text_difference(classic.side, classic.sha256, c, cold.source)
    if off is not None and off.token_index is None:
        off.token_index = classic.token_index_at(off.char_offset)
    res.reference["cold"] = {"source": cold.source, "equals_classic": off is None,
                             "token_index": off.token_index if off is not None else None}


def exact_tie(d: CompletionDifference, classic: ClassicAnswer, dtype: str) -> dict[str, Any] | None:
    """The tie label when classic decode's top two logprobs are equal where ``d`` parts (in the model's
    dtype: the floats it computed) and the other side took the runner-up (None: no exact tie there)."""
    i = d.token_index
    top = classic.side.top if classic.side is not None else None
    if i is None or top is None or i >= len(top) or len(top[i]) < 2 or top[i][0][1] != top[i][1][1]:
        return None
    (kept, logprob), (other, _) = top[i][0], top[i][1]
    took = d.other_tokens[0] if d.other_tokens else None
    if took is not None and took != other:
        return None  # the other side took a third token: not this tie broken the other way
    return {"kind": EXACT_TIE, "token_index": i, "logprob": logprob, "dtype": dtype,
            "classic_token": kept, "other_token": took, "tied": [kept, other],
            "other_known": took is not None}


def past_max_tokens(d: CompletionDifference, comp: Completion, body: dict[str, Any], name: str) -> str | None:
    """The length class (None: not it): ``comp`` holds classic decode's whole text and goes on past it, with
    more tokens than the request's max_tokens: the server did not stop where classic decode stops."""
    limit = body.get("max_tokens", body.get("max_completion_tokens"))
    n = comp.usage.get("completion_tokens") if isinstance(comp.usage, dict) else None
    if n is None and comp.token_ids is not None:
        n = len(comp.token_ids)
    if d.reference_snippet or not d.other_snippet or not isinstance(limit, int) or not isinstance(n, int) \
            or isinstance(n, bool) or n <= limit:
        return None
    return (f"a length finding: {name} emitted {n} tokens where max_tokens is {limit} ({n - limit} past it);"
            " its text up to there is classic decode's, which stops at max_tokens")


def _by_classic(res: RequestResult, plan: ArmPlan, ev: Evidence, classic: ClassicAnswer, dtype: str) -> RequestResult:
    d = res.classic
    if d is not None:
        res.verdict, res.divergence = Verdict.DIVERGED, d
        res.reason = "differs from classic decode: " + d.line()
        if d.text_only:  # its baseline writes classic decode's text: the drafter changed only the text
            res.reason = ("text only, with the drafter: classic decode's token ids written as other text (the"
                          f" baseline writes classic decode's text); {d.line()}")
        length = past_max_tokens(d, res.completion, res.request.get("body") or {}, plan.name)
        if length is not None:
            res.reason = f"{length}; {res.reason}"
        tie = exact_tie(d, classic, dtype)
        if tie is not None:
            res.tie = tie
            took = (f"{plan.name} took {tie['other_token']}" if tie["other_known"]
                    else f"{plan.name}'s token there is not known (it gave text only)")
            res.reason += (f"; {EXACT_TIE_WORDS}: logprob {tie['logprob']} for tokens {tie['tied'][0]} and"
                           f" {tie['tied'][1]} in {dtype}, classic decode took {tie['classic_token']} (the"
                           f" lower id), {took}")
        if ev.declined:
            res.reason = "declined (served by its classic path), yet " + res.reason
        cold = (res.reference or {}).get("cold") or {}
        if res.cold is not None:
            res.reason += f"; differs from {res.cold.reference} too, at token {res.cold.token_index}"
        elif cold.get("equals_classic") is False:
            res.reason += f"; {cold['source']} gives this same answer: not state-dependent"
        return res
    if ev.declined:
        res.verdict = Verdict.DECLINED
        res.reason = "declined (its text is classic decode's): " + "; ".join(ev.lines[:2])
        return res
    if plan.drafts and not ev.engaged:
        res.verdict = Verdict.NOT_ENGAGED
        res.reason = "equals classic decode, but " + _not_engaged(ev, "no witness, log, response field, counter or"
                                                                   " engine evidence")
        return res
    res.verdict = Verdict.MATCH
    res.reason = "; ".join(ev.lines[:1]) if plan.drafts else "equals classic decode"
    if (res.reference or {}).get("detokenized"):  # named, never a divergence of the tokens
        res.reason += f"; classic decode's tokens ({(res.reference or {})['detokenized']}: this server's detokenizer)"
    return res


def _not_engaged(ev: Evidence, sources: str) -> str:
    """Why a drafted request that equals its reference is not a pass: what its evidence said (a drafter that ran
    with none of its drafts accepted), or that nothing said anything."""
    if ev.lines:
        return f"nothing shows a draft of it was accepted ({ev.lines[0]})"
    return f"no evidence the drafter ran ({sources})"


def _by_baseline(res: RequestResult, plan: ArmPlan, ev: Evidence, base: Completion | None,
                 classic: ClassicAnswer | None, dtype: str) -> RequestResult:
    """The verdict against baseline-start (no classic answer, or an engine whose arithmetic is not MLX's)."""
    note = ""
    if classic is not None and classic.error:
        note = f"; no classic decode to compare with ({classic.error})"
    elif res.classic is not None:
        from specparity.reference import near_tie

        dc = res.classic
        lps = classic.side.logprobs if classic is not None and classic.side is not None else None
        i = dc.token_index
        call = near_tie(dc.margin_reference, dc.margin_other, dtype=dtype,
                        logprob=lps[i] if lps is not None and i is not None and i < len(lps) else None)
        res.tie = call.to_dict()
        note = f"; differs from classic decode in MLX at token {i}: {call.line()}"
    elif res.reference and res.reference.get("detokenized"):
        note = f"; classic decode's tokens in MLX ({res.reference['detokenized']}: this engine's detokenizer)"
    if plan.name == BASELINE_START:
        res.verdict, res.reason = Verdict.MATCH, "the reference" + note
        return res
    if base is None or not base.ok:
        res.verdict, res.reason = Verdict.INCONCLUSIVE, f"{BASELINE_START} has no completion of this request"
        return res
    if ev.declined:
        res.verdict = Verdict.DECLINED
        res.reason = "declined: " + "; ".join(ev.lines[:2]) + note
        return res
    d = res.baseline
    if d is not None:
        res.verdict, res.divergence = Verdict.DIVERGED, d
        res.reason = d.line() + note
        return res
    if plan.drafts and not ev.engaged:
        res.verdict = Verdict.NOT_ENGAGED
        res.reason = "same text as the baseline, but " + _not_engaged(ev, "no witness, log or response field")
        return res
    res.verdict = Verdict.MATCH
    res.reason = ("; ".join(ev.lines[:1]) if plan.drafts else "") + note
    return res


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
    noisy = [r for r in (end.requests if end is not None else []) if r.baseline is not None]
    if end is not None and noisy:
        res.verdict = Verdict.INCONCLUSIVE
        res.reason = (f"the two baselines disagree on {len(noisy)} of {len(end.requests)} requests"
                      f" ({', '.join(r.id for r in noisy)}): classic decode is not reproducible across processes,"
                      " so no speculative arm is judged")
        res.findings += [f"{BASELINE_END} {r.id}: {r.baseline.line()}" for r in noisy if r.baseline is not None]
        for a in res.arms:
            if a.kind != ArmKind.BASELINE and a.verdict != Verdict.ERROR:
                a.reason = f"not judged ({a.verdict}); " + a.reason
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
    res.causes = request_causes(res)
    res.findings += prompt_findings(res) + scope_findings(res)
    res.verdict = combine([a.verdict for a in res.arms] or [Verdict.MATCH])
    # -- issue 20, class 6: nothing speculative ran, nothing passed (a baseline that left classic
    # decode is still that finding) ---------------------------------------------------------------
    if not any(speculative(a) for a in res.arms) and res.verdict != Verdict.DIVERGED:
        res.verdict, res.reason = Verdict.NOT_RUN, NOTHING_SPECULATIVE
    # ----------------------------------------------------------------------------------------------
    assert res.verdict in (*SERVED_VERDICTS, Verdict.NOT_RUN)


def scope_findings(res: PairingResult) -> list[str]:
    """Per request that left classic decode: whom it concerns and whether it depends on the server's
    state (:func:`request_causes`), and where a request differs from the same request answered cold."""
    out: list[str] = []
    for c in request_causes(res):
        out.append(c["finding"])
        out += c["cold"]
    return out


def request_causes(res: PairingResult) -> list[dict[str, Any]]:
    """Per request that left classic decode, the cause its finding names, as fields.

    request, kind, position (1-based in the sequence), first_token (the earliest differing token over
    the arms, None: unknown), arms (those that differ), whom (every server of the engine, only with
    the drafter, every server without it, an exact or a near tie), state (only on a warm cache, not
    state-dependent, or no cold answer and why; "" when nothing is known), cause (whom + state: what
    the finding says after the colon), finding (the line), cold (the lines where an arm's answer
    differs from the same request answered cold).
    """
    out: list[dict[str, Any]] = []
    arms = [a for a in res.arms if a.kind != ArmKind.DISTRIBUTION and a.requests]
    order: list[str] = []
    for a in arms:
        order += [r.id for r in a.requests if r.id not in order]
    for rid in order:
        # the arms whose answer was compared with classic decode (a prompt the server formed otherwise is not; a
        # documented lossy mode's answer is what its authors said it may be, no finding)
        rows = [(a, r) for a in arms for r in a.requests if r.id == rid and r.completion.ok
                and r.reference and r.reference.get("compared") and r.verdict != Verdict.LOSSY]
        off = [(a, r) for a, r in rows if r.classic is not None]
        if not off:
            continue
        kind = rows[0][1].kind
        position = order.index(rid) + 1
        indices = [r.classic.token_index for _, r in off if r.classic is not None and r.classic.token_index is not None]
        first = min(indices) if indices else None
        at = f" (first at token {first})" if first is not None else ""
        names = [a.name for a, _ in off]
        what = f"request {position} {rid} ({kind})"
        whom, state = _whom(rows, off), _state(kind, off)
        out.append({"request": rid, "kind": kind, "position": position, "first_token": first, "arms": names,
                    "whom": whom, "state": state.removeprefix("; "), "cause": whom + state,
                    "finding": f"{what} differs from classic decode{at} in {', '.join(names)}: {whom + state}",
                    "cold": [f"{what} in {a.name} differs from {r.cold.reference} at token {r.cold.token_index}"
                             for a, r in rows if r.cold is not None]})
    return out


def _whom(rows: list[tuple[ArmResult, RequestResult]], off: list[tuple[ArmResult, RequestResult]]) -> str:
    """Which servers a difference concerns, and an exact or near tie where every differing arm has one."""
    plain = [a for a, _ in rows if a.kind not in DRAFTING_KINDS]
    plain_off = [a for a, _ in off if a.kind not in DRAFTING_KINDS]
    drafted_same = [a.name for a, r in rows if a.kind in DRAFTING_KINDS and r.classic is None]
    ties = [r.tie for _, r in off if r.tie]
    if ties and all(t.get("kind") == "near_tie" for t in ties):
        return "a near tie between this engine's arithmetic and MLX's (margins in each request's reason)"
    if plain and len(plain_off) == len(plain) and len(off) == len(rows):
        who = "every server of this engine"
    elif not plain_off:
        who = "only with the drafter"
    elif len(plain_off) == len(plain):
        who = (f"every server without the drafter, and not {', '.join(drafted_same)} (with the drafter:"
               " they equal classic decode)")
    else:
        who = f"some servers without the drafter too ({', '.join(a.name for a in plain_off)})"
    if len(ties) == len(off) and all(t.get("kind") == EXACT_TIE for t in ties):
        return f"{EXACT_TIE_WORDS}, {who}"
    return who


def _state(kind: str, off: list[tuple[ArmResult, RequestResult]]) -> str:
    """Whether the difference depends on the server's state, from each arm's cold answer."""
    cold = [(a.name, (r.reference or {}).get("cold")) for a, r in off]
    warm_only = [n for n, c in cold if c and c.get("equals_classic") is True]
    cold_too = [n for n, c in cold if c and c.get("equals_classic") is False]
    why: dict[str, list[str]] = {}
    for n, c in cold:
        if c and c.get("unavailable"):
            why.setdefault(str(c["unavailable"]), []).append(n)
    out = ""
    if warm_only:
        out += ("; only on a warm cache in " + ", ".join(warm_only)
                + ": the same request answered cold there equals classic decode")
    if cold_too:
        out += ("; not state-dependent in " + ", ".join(cold_too)
                + ": the same request answered cold there differs from classic decode too")
    for reason, who in why.items():
        out += f"; no cold answer in {', '.join(who)}: {reason}"
    if not out and kind in WARM_KINDS:
        out = f"; a request that can meet a warm prompt cache ({kind})"
    return out


def prompt_findings(res: PairingResult) -> list[str]:
    """Where classic decode's prompt is not the server's (that request is not compared), and where the
    harness's own tokenization is not the prompt ids a server reported (a finding; the comparison,
    from the server's own ids, stands)."""
    out: dict[str, None] = {}
    for a in res.arms:
        for r in a.requests:
            ref = r.reference or {}
            if ref.get("prompt_equal") is False:
                out[f"request {r.id} ({a.name}): classic decode's prompt is not the server's, so it is not"
                    f" compared: {ref.get('prompt_check')}"] = None
            if ref.get("own_prompt_equal") is False:
                out[f"request {r.id}: the harness's own tokenization (mlx_lm.server's tokenize step) is not the"
                    f" server's prompt: {ref.get('own_prompt_check')}; classic decode decoded from the server's"
                    " ids"] = None
    return list(out)
