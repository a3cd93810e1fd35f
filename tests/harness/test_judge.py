"""The judge's wording and labels over synthetic results: whom a difference concerns, ties, cold answers.

Each case builds the arms' answers as a served job would hand them to the judge
(harness.judge.judge_request over a real ReferenceCompletion for classic decode),
then reads the verdict, the tie label and the pairing's findings. No model, no
server: the served tests run the same code on real ones.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from specparity.harness.client import Completion, Request
from specparity.harness.evidence import Evidence
from specparity.harness.judge import (
    EXACT_TIE, EXACT_TIE_WORDS, ClassicAnswer, Cold, classic_answer, judge_pairing, judge_request, prompt_findings,
    scope_findings,
)
from specparity.harness.plan import ArmKind, ArmPlan, Drafter
from specparity.harness.profiles import Width
from specparity.reference import PromptCheck, ReferenceCompletion
from specparity.harness.results import ArmResult, PairingResult, RequestResult
from specparity.verdicts import Verdict

PIECES = ["The", " cache", " holds", " keys", ".", ""]  # the last token (EOS) adds no text
IDS = [11, 12, 13, 14, 15, 2]
LOGPROBS = [-0.5, -0.25, -1.0, -4.625, -0.75, -0.125]
TOP = [[(11, -0.5), (40, -2.0)], [(12, -0.25), (41, -3.0)], [(13, -1.0), (42, -1.5)],
       [(14, -4.625), (44, -4.625)],  # an exact tie: classic decode keeps the lower id
       [(15, -0.75), (45, -2.5)], [(2, -0.125), (46, -4.0)]]
REQ = Request("p0", "fresh", "completions", {"prompt": "x", "max_tokens": 6, "temperature": 0})


def _classic(**overrides: object) -> ClassicAnswer:
    ref = ReferenceCompletion(key="k", endpoint="completions", prompt_ids=[1, 2, 3], token_ids=list(IDS),
                              text="".join(PIECES), pieces=list(PIECES), logprobs=list(LOGPROBS),
                              top=[list(t) for t in TOP], finish_reason="stop", path="batched",
                              prefill_segments=[3], deterministic=True, params={}, settings={})
    for k, v in overrides.items():
        setattr(ref, k, v)
    return classic_answer(ref)


def _comp(pieces: list[str], ids: list[int] | None) -> Completion:
    text = "".join(pieces)
    return Completion(text=text, sha256=hashlib.sha256(text.encode()).hexdigest(), token_ids=ids,
                      finish_reason="stop")


CLEAN = _comp(PIECES, IDS)
TIED = _comp(["The", " cache", " holds", " values", ".", ""], [11, 12, 13, 44, 15, 2])  # took the runner-up
THIRD = _comp(["The", " cache", " holds", " rows", ".", ""], [11, 12, 13, 99, 15, 2])  # neither tied token
OFF = _comp(["The", " cache", " kept", " keys", ".", ""], [11, 12, 77, 14, 15, 2])  # a confident flip at 2


def _plan(name: str) -> ArmPlan:
    if name.startswith("baseline"):
        return ArmPlan(name, ArmKind.BASELINE, server_key=name)
    rows = int(name[1:])
    return ArmPlan(name, ArmKind.WIDTH, Width(rows, rows - 1, "num_draft_tokens"), Drafter.DRAFT,
                   server_key=name)


def _engaged() -> Evidence:
    return Evidence(verify_calls=2, accepts=[1, 2], widths=[3, 3], sources=["witness"], lines=["witnessed"])


def _judge(name: str, comp: Completion, classic: ClassicAnswer | None = None, req: Request = REQ,
           cold: Cold | None = None, exact: bool = True, dtype: str = "bfloat16",
           base: Completion = CLEAN) -> RequestResult:
    """``comp`` as arm ``name``'s answer; ``base``: baseline-start's answer to the same request."""
    plan = _plan(name)
    return judge_request(plan, req, comp, _engaged() if plan.drafts else Evidence(), base,
                         classic if classic is not None else _classic(), cold, exact=exact, dtype=dtype)


def _pairing(answers: dict[str, RequestResult]) -> PairingResult:
    res = PairingResult("p", "mlx-lm", "/t", "/d")
    for name, r in answers.items():
        plan = _plan(name)
        res.arms.append(ArmResult(name, plan.kind, plan.width, r.verdict, requests=[r]))
    return res


def _scope(answers: dict[str, RequestResult]) -> str:
    found = scope_findings(_pairing(answers))
    assert len([f for f in found if "differs from classic decode" in f]) == 1, found
    return found[0]


def test_every_server_without_the_drafter_and_which_drafter_arms_did_not_differ() -> None:
    """Both baselines leave classic decode, one drafter arm does not: not "some servers without the drafter"."""
    answers = {"baseline-start": _judge("baseline-start", OFF), "w2": _judge("w2", CLEAN),
               "w4": _judge("w4", OFF), "baseline-end": _judge("baseline-end", OFF)}
    assert answers["w2"].verdict == Verdict.MATCH and answers["baseline-start"].verdict == Verdict.DIVERGED
    scope = _scope(answers)
    assert "every server without the drafter, and not w2 (with the drafter" in scope, scope
    assert "some servers" not in scope
    # every arm off: every server of the engine; only drafter arms off: only with the drafter
    every = {n: _judge(n, OFF) for n in ("baseline-start", "w2", "baseline-end")}
    assert "every server of this engine" in _scope(every)
    drafter = {"baseline-start": _judge("baseline-start", CLEAN), "w2": _judge("w2", OFF),
               "baseline-end": _judge("baseline-end", CLEAN)}
    assert "only with the drafter" in _scope(drafter)
    # one baseline of two off: some servers without the drafter, named
    some = {"baseline-start": _judge("baseline-start", OFF), "w2": _judge("w2", OFF),
            "baseline-end": _judge("baseline-end", CLEAN)}
    assert "some servers without the drafter too (baseline-start)" in _scope(some)


def test_an_exact_tie_broken_the_other_way_is_diverged_labelled_and_scoped() -> None:
    r = _judge("w4", TIED)
    assert r.verdict == Verdict.DIVERGED and r.classic is not None and r.classic.token_index == 3
    assert r.tie is not None and r.tie["kind"] == EXACT_TIE
    assert (r.tie["classic_token"], r.tie["other_token"], r.tie["tied"], r.tie["logprob"]) == (14, 44, [14, 44], -4.625)
    assert EXACT_TIE_WORDS in r.reason and "classic decode took 14 (the lower id), w4 took 44" in r.reason
    scope = _scope({"baseline-start": _judge("baseline-start", CLEAN), "w4": r})
    assert scope.endswith(f"{EXACT_TIE_WORDS}, only with the drafter"), scope
    # a margin above zero there, or a third token: a plain divergence, no tie label
    assert _judge("w4", THIRD).tie is None and _judge("w4", THIRD).verdict == Verdict.DIVERGED
    untied = [list(t) for t in TOP]
    untied[3] = [(14, -4.5), (44, -4.625)]
    plain = _judge("w4", TIED, _classic(top=untied))
    assert plain.verdict == Verdict.DIVERGED and plain.tie is None and EXACT_TIE_WORDS not in plain.reason
    assert EXACT_TIE_WORDS not in _scope({"baseline-start": _judge("baseline-start", CLEAN), "w4": plain})


def test_a_near_tie_between_engines_is_reported_apart() -> None:
    """An engine whose arithmetic is not MLX's (exact=False): the baseline decides, the difference from
    classic decode is a near tie where a side's top-2 margin is inside the dtype's band."""
    near = [list(t) for t in TOP]
    near[2] = [(13, -1.0), (42, -1.01)]  # 0.01 nats: inside bfloat16's band
    classic = _classic(top=near)
    served = _comp(["The", " cache", " kept", " keys", ".", ""], [11, 12, 42, 14, 15, 2])
    answers = {n: _judge(n, served, classic, exact=False, base=served) for n in ("baseline-start", "w2")}
    assert answers["baseline-start"].verdict == answers["w2"].verdict == Verdict.MATCH  # the baseline decides
    assert answers["w2"].tie is not None and answers["w2"].tie["kind"] == "near_tie"
    assert "a near tie between this engine's arithmetic and MLX's" in _scope(answers)
    confident = {n: _judge(n, OFF, exact=False, base=OFF) for n in ("baseline-start", "w2")}
    assert confident["w2"].tie is not None and confident["w2"].tie["kind"] == "confident"
    assert "near tie" not in _scope(confident) and "every server of this engine" in _scope(confident)


def test_a_streamed_divergence_gets_its_token_index_from_classic_decodes_pieces() -> None:
    streamed = _comp(["The", " cache", " kept", " keys", ".", ""], None)
    r = _judge("w2", streamed)
    assert r.verdict == Verdict.DIVERGED and r.classic is not None
    assert r.classic.char_offset == len("The cache ") == 10  # " holds" vs " kept"
    assert r.classic.token_index == 2  # the token whose piece holds char 10, not the char offset
    scope = _scope({"baseline-start": _judge("baseline-start", CLEAN), "w2": r})
    assert "(first at token 2)" in scope


def test_cold_answers_say_whether_a_difference_depends_on_the_servers_state() -> None:
    base = _judge("baseline-start", CLEAN)
    warm = _judge("w3", OFF, cold=Cold(CLEAN, "its cold answer in process (mlx_lm.server's loop)"))
    assert warm.cold is not None and warm.cold.token_index == 2
    assert (warm.reference or {})["cold"]["equals_classic"] is True
    scope = _scope({"baseline-start": base, "w3": warm})
    assert "only on a warm cache in w3: the same request answered cold there equals classic decode" in scope
    assert any("in w3 differs from its cold answer in process" in f and "at token 2" in f
               for f in scope_findings(_pairing({"baseline-start": base, "w3": warm})))
    cold_too = _judge("w3", OFF, cold=Cold(OFF, "its cold answer in process (mlx_lm.server's loop)"))
    assert cold_too.cold is None and "gives this same answer: not state-dependent" in cold_too.reason
    scope = _scope({"baseline-start": base, "w3": cold_too})
    assert "not state-dependent in w3: the same request answered cold there differs from classic decode too" in scope
    assert "only on a warm cache" not in scope
    none = _judge("w3", OFF, cold=Cold(None, "its cold answer in process", "dflash-mlx's loop is not rebuilt"))
    assert "no cold answer in w3: dflash-mlx's loop is not rebuilt" in _scope({"baseline-start": base, "w3": none})


def test_a_prompt_the_server_formed_otherwise_is_not_compared_and_an_own_tokenization_mismatch_is_a_finding(
        ) -> None:
    """usage.prompt_tokens against classic decode's prompt: a mismatch means another prompt, so no comparison
    (and no false divergence); the harness's own tokenization against a server's own ids (classic decode
    decoded from those ids): a finding, the comparison stands."""
    other = _classic(prompt_check=PromptCheck(reference_count=3, server_count=4, equal=False))
    r = _judge("w2", OFF, other)
    assert r.classic is None and r.reference is not None and r.reference["compared"] is False
    assert "its prompt is not the server's" in str(r.reference.get("unavailable"))
    res = _pairing({"baseline-start": _judge("baseline-start", CLEAN), "w2": r})
    assert [f for f in prompt_findings(res) if "w2" in f] == [
        "request p0 (w2): classic decode's prompt is not the server's, so it is not compared:"
        " prompt tokens: reference 3, server 4"]
    assert not [f for f in scope_findings(res) if "differs from classic decode" in f]
    own = _classic(own_prompt=PromptCheck(reference_count=3, server_count=3, server_ids_given=True, equal=False,
                                          first_mismatch=1, reference_ids=[2, 3], server_ids=[9, 3]))
    r = _judge("w2", OFF, own)
    assert r.classic is not None and r.verdict == Verdict.DIVERGED and r.reference is not None
    res = _pairing({"baseline-start": _judge("baseline-start", CLEAN, own), "w2": r})
    judge_pairing(res)
    assert any(f.startswith("request p0: the harness's own tokenization (mlx_lm.server's tokenize step) is not the"
                            " server's prompt: prompt tokens differ from the server's at position 1")
               for f in res.findings), res.findings
    # one finding for the request, not one per arm
    assert sum("own tokenization" in f for f in res.findings) == 1

def test_a_loop_no_replay_rebuilds_has_no_cold_answer(tmp_path: Path) -> None:
    """Where the server's loop is not mlx_lm.server's (specparity serve, dflash-mlx, or a profile's own
    ``loop``), no cold answer is made up: it says why, and the finding carries that line. (The oracle's
    worker is never asked: nothing runs here.)"""
    import yaml

    from specparity.harness.config import Job, Pairing
    from specparity.harness.profiles import load_profile
    from specparity.harness.run import Exchange, PairingRun, ServedRun

    other = tmp_path / "other-loop.yaml"
    other.write_text(yaml.safe_dump({"extends": "mlx-lm", "name": "other-loop", "loop": "not-rebuilt"}))
    plan = ArmPlan("w4", ArmKind.WIDTH, Width(4, 3, "num_draft_tokens"), Drafter.DRAFT, server_key="w4")
    ex = Exchange(Request("p0-prefix", "shared-prefix", "completions", {"prompt": "x"}), Completion(text="y"))
    for profile, words in ((str(other), "other-loop runs the serving loop not-rebuilt"),
                           ("specparity-serve", "specparity-serve runs the serving loop specparity-serve"),
                           ("dflash-mlx", "dflash-mlx runs the serving loop dflash-mlx")):
        job = Job(pairings=[Pairing("p", "/t", "/d", profile)])
        run = PairingRun(ServedRun(job, workdir=tmp_path / "w"), job.pairings[0], load_profile(profile))
        cold = run.cold(None, 1, plan, ex, {})  # type: ignore[arg-type]
        assert cold.completion is None and cold.why is not None and cold.why.startswith(words), cold.why
        assert "which no in-process replay rebuilds" in cold.why
        first = run.cold(None, 0, plan, ex, {})  # type: ignore[arg-type]
        assert first.completion is ex.completion and "the first request its server received" in first.source


def test_a_documented_lossy_mode_is_lossy_by_design_with_what_it_changed_never_a_pass_or_a_defect() -> None:
    """A profile's ``lossy`` (its authors' words for a lossy mode): a drafted answer that left classic decode is
    ``lossy_by_design`` with its first difference kept as what it changed; one that did not is ``lossy_by_design``
    too (it proves nothing about lossless decoding); a baseline, an answer that drafted nothing and a failed
    request keep their own verdicts; the pairing's verdict is not a pass (exit 3) and lists no defect. Without
    ``lossy`` the same diverged answer is a divergence."""
    from specparity.verdicts import exit_code

    mode = "--mtp-optimistic: it skips the verify"
    plan = _plan("w4")
    changed = judge_request(plan, REQ, OFF, _engaged(), CLEAN, _classic(), lossy=mode)
    assert changed.verdict == Verdict.LOSSY and changed.divergence is not None, changed
    assert changed.reason.startswith(f"lossy by design ({mode}): it changed the answer: ")
    assert "first difference at token 2" in changed.reason and changed.reason.endswith("not a pass, not a defect")
    same = judge_request(plan, REQ, CLEAN, _engaged(), CLEAN, _classic(), lossy=mode)
    assert same.verdict == Verdict.LOSSY and "it changed nothing here" in same.reason, same.reason
    assert judge_request(_plan("baseline-start"), REQ, CLEAN, Evidence(), CLEAN, _classic(),
                         lossy=mode).verdict == Verdict.MATCH
    assert judge_request(plan, REQ, CLEAN, Evidence(), CLEAN, _classic(), lossy=mode).verdict == Verdict.NOT_ENGAGED
    failed = Completion(error="HTTP 500")
    assert judge_request(plan, REQ, failed, _engaged(), CLEAN, _classic(), lossy=mode).verdict == Verdict.ERROR
    assert judge_request(plan, REQ, OFF, _engaged(), CLEAN, _classic()).verdict == Verdict.DIVERGED
    res = _pairing({"baseline-start": _judge("baseline-start", CLEAN), "w4": changed,
                    "baseline-end": _judge("baseline-end", CLEAN)})
    judge_pairing(res)
    assert res.verdict == Verdict.LOSSY and exit_code(res.verdict) == 3, (res.verdict, res.reason)
    assert not any("w4" in f for f in res.findings), res.findings
