"""The served distribution arm: at temperature > 0, drafted and undrafted servers emit the same law.

Greedy parity compares completions byte for byte; at temperature > 0 a
lossless speculative server only promises that its output has the same
distribution as classic decode. This module sends many seeded requests of
``prefix`` tokens to two servers of a pairing, the target alone and the target
with its drafter (the widest width), and compares the histograms of the
emitted first token (or ``prefix``-token prefix):

- ``dist-baseline``: no drafter, seeds ``seed .. seed+N-1``. On the same
  server, ``N`` more requests at a known-wrong temperature (``T / 2``): a real
  served sampler known to be wrong, the run's power control.
- ``dist-w<T>``: the drafter at T verify rows, seeds ``seed+N .. seed+2N-1``
  (disjoint from the baseline's, so the two samples are independent).

Tests (``probes.sampling.stats``):

- homogeneity: Pearson chi-square of the two histograms (bins with expected
  count < 5 pooled); two samples of n1 and n2 draws have the power of one
  sample of n1 n2 / (n1 + n2) against the pooled law, so the power statement is
  ``power_statement(pooled, n_eff)``: the smallest TV rejected with 99% power.
- goodness of fit, when the target's logits are known (a constant-logits
  fixture: ``specparity`` key in its config.json): each arm against the exact
  law p = softmax32(logits / T) (its product over the prefix), plus the support
  check (no emitted token with p = 0).

Controls, each of which must be rejected or the arm is ``inconclusive``:

- wrong temperature (served): baseline at T vs baseline at T / 2 by
  homogeneity, and, with a known p, the served baseline histogram against the
  law at T / 2 by goodness of fit. Proves these requests can tell a sampler at
  the wrong temperature apart, on this model, at this N.
- near miss (simulated): two samples of the same sizes, one from the pooled
  law and one from a law at exactly the power statement's TV in its least
  detectable direction. Proves the stated power holds at these bins.
- known-wrong acceptance rules (simulated, ``rules.CONTROLS``), when both the
  target's and the drafter's logits are known: what a wrong rule would emit,
  drawn at the drafted arm's sample size. Proves the goodness of fit would
  have caught those rules had the server used them.

The drafted arm is ``match`` (with the power statement in its reason),
``diverged`` (a test rejected, or a token outside the support),
``not_engaged`` (no evidence the drafter ran), ``inconclusive`` (a control not
rejected: underpowered) or ``error``.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from specparity.harness.client import Request
from specparity.harness.job import DistSpec
from specparity.harness.lifecycle import ServerStartError
from specparity.harness.plan import DIST_WRONG_T, ArmKind, ArmPlan
from specparity.harness.results import ArmResult, RequestResult
from specparity.probes.sampling.stats import Homogeneity, homogeneity
from specparity.verdicts import Verdict

if TYPE_CHECKING:
    from specparity.harness.job import Job, Pairing
    from specparity.harness.session import Exchange, Session
    from specparity.probes.sampling.stats import ChiSquare, Power


class Notes(Protocol):
    def arm_started(self, pairing: str, arm: str) -> None: ...

    def note(self, message: str) -> None: ...


class PairingRunner(Protocol):
    """What the distribution arms use of the runner: :class:`specparity.harness.run.PairingRun`, which
    calls :func:`run_distribution` with itself (so this module needs no import of the runner)."""

    @property
    def job(self) -> Job: ...

    @property
    def pairing(self) -> Pairing: ...

    @property
    def endpoint(self) -> str: ...

    @property
    def run_(self) -> Notes: ...

    def too_wide(self, plan: ArmPlan) -> str | None: ...

    def new_session(self, plan: ArmPlan) -> Session: ...

    def start(self, session: Session) -> None: ...

    def request_fields(self, plan: ArmPlan) -> dict[str, Any]: ...

    def send(self, client: Any, session: Session, req: Request, fields: dict[str, Any],
             plan: ArmPlan | None = None) -> Exchange: ...

    def stop_session(self, session: Session) -> int | None: ...

log = logging.getLogger(__name__)

KIND = ArmKind.DISTRIBUTION
WRONG_T_FACTOR = 0.5
# the request fields this module owns (a job's params may not override them)
OWN_FIELDS = ("temperature", "seed", "max_tokens", "logprobs", "top_logprobs", "stream")
FILTERS = ("top_k", "top_p", "min_p")


# -- tests -------------------------------------------------------------------------------------
@dataclass
class Control:
    """A known-wrong control: what it is, the test that judged it, and whether it was rejected (it must be).

    kind: ``served`` (real requests) or ``simulated`` (draws at the same sample size).
    test: ``homogeneity`` or ``goodness of fit``. statistic / threshold: that test's.
    """

    name: str
    kind: str
    test: str
    proves: str
    statistic: float
    threshold: float | None
    rejected: bool

    def line(self) -> str:
        thr = f"{self.threshold:.1f}" if self.threshold is not None else "n/a"
        return (f"{self.name} ({self.kind}, {self.test}): {'rejected' if self.rejected else 'NOT rejected'},"
                f" chi2 {self.statistic:.1f} vs threshold {thr}")


@dataclass
class DistResult:
    """The tests of one pairing's distribution arms (both arms' ``dist``, as a dict).

    temperature / wrong_temperature / prefix / alpha / seeds: the settings.
    cells: the observed k-prefixes (token ids joined by ``,``); counts: per arm, per cell.
    known_law: the target's exact law is known (constant-logits fixture): the GOF ran.
    gof: per arm, goodness of fit against p (None without a known law).
    outside_support: per arm, the first emitted prefix with p = 0 (None: none).
    homogeneity: drafted vs baseline. power: what it detects at 99% power.
    gof_power: what the GOF detects at 99% power (known law only).
    controls: every known-wrong control and whether it was rejected.
    """

    temperature: float
    wrong_temperature: float
    prefix: int
    alpha: float
    seeds: dict[str, list[int]]
    cells: list[str]
    counts: dict[str, list[int]]
    known_law: bool
    homogeneity: Homogeneity | None = None
    power: Power | None = None
    gof: dict[str, ChiSquare] = field(default_factory=dict)
    gof_power: Power | None = None
    outside_support: dict[str, str | None] = field(default_factory=dict)
    controls: list[Control] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- the run -----------------------------------------------------------------------------------
def known_logits(checkpoint: str) -> list[float] | None:
    """The full logits row of a constant-logits fixture (``specparity.constant_logits``), else None."""
    try:
        cfg = json.loads((Path(checkpoint) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    row = (cfg.get("specparity") or {}).get("constant_logits")
    return [float(x) for x in row] if isinstance(row, list) else None


def known_law(logits: list[float], temperature: float, params: dict[str, Any]) -> np.ndarray:
    """The law a lossless server emits from a constant-logits target: float32 softmax, then its filters."""
    from specparity.probes.sampling.problem import apply_filters, softmax32

    p = softmax32(np.array(logits), temperature)
    return apply_filters(p, int(params.get("top_k") or 0), float(params.get("top_p") or 0.0),
                         float(params.get("min_p") or 0.0))


def _bodies(spec: DistSpec, endpoint: str, prompt: str, params: dict[str, Any], temperature: float,
            seeds: range, tag: str) -> list[Request]:
    common = {k: v for k, v in params.items() if k not in OWN_FIELDS}
    out = []
    for s in seeds:
        body: dict[str, Any] = {**common, "max_tokens": spec.prefix, "temperature": temperature, "seed": s,
                                "logprobs": True, "top_logprobs": 0}
        if endpoint == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        out.append(Request(f"{tag}-s{s}", KIND, endpoint, body))
    return out


def _key(r: RequestResult, prefix: int) -> str | None:
    """The emitted k-prefix of one draw: its token ids (its text where the server gives no ids)."""
    c = r.completion
    if not c.ok:
        return None
    if c.token_ids is not None:
        # a completion that ended before the prefix (end of sequence) is an outcome of its own
        return ",".join(str(t) for t in c.token_ids[:prefix]) + ("" if len(c.token_ids) >= prefix else ",end")
    return "text:" + c.text


def run_distribution(pr: PairingRunner, plans: list[ArmPlan]) -> list[ArmResult]:
    """The two distribution arms of one pairing as planned (plan.plan_arms: dist-baseline, then the
    drafted arm), judged; the drafted arm carries the verdict."""
    from specparity.harness.transport import loopback_client

    job = pr.job
    spec = job.distribution
    assert spec is not None and len(plans) == 2 and not plans[0].drafts and plans[1].drafts
    n = spec.requests
    wrong_t = spec.temperature * WRONG_T_FACTOR
    prompt = job.prompts[0]
    params = dict(job.params)
    seeds = {"baseline": range(spec.seed, spec.seed + n), "drafted": range(spec.seed + n, spec.seed + 2 * n),
             "wrong-temperature": range(spec.seed + 2 * n, spec.seed + 3 * n)}
    arms: list[ArmResult] = []
    wrong: list[RequestResult] = []
    # the engine's widest block applies here as to every drafted arm: never clamped, so not run
    too_wide = pr.too_wide(plans[1])
    for plan in plans:
        pr.run_.arm_started(pr.pairing.name, plan.name)
        arm = ArmResult(plan.name, KIND, plan.width)
        arms.append(arm)
        if too_wide:
            arm.verdict = Verdict.NOT_RUN
            arm.reason = too_wide if plan.drafts else f"its drafted arm {plans[1].name} is not run"
            continue
        t0 = time.perf_counter()
        session = pr.new_session(plan)
        try:
            try:
                pr.start(session)
            except ServerStartError as err:
                arm.verdict, arm.reason = Verdict.ERROR, str(err)
                arm.server = dict(session.info)
                continue
            arm.server = dict(session.info)
            fields = pr.request_fields(plan)
            batches = [(_bodies(spec, pr.endpoint, prompt, params, spec.temperature,
                                seeds["drafted" if plan.drafts else "baseline"], plan.name), arm.requests)]
            if not plan.drafts:
                batches.append((_bodies(spec, pr.endpoint, prompt, params, wrong_t, seeds["wrong-temperature"],
                                        DIST_WRONG_T), wrong))
            arm.verdict = Verdict.NOT_RUN  # until judged
            with loopback_client() as client:
                for reqs, into in batches:
                    pr.run_.note(f"  {len(reqs)} requests at temperature {reqs[0].body['temperature']:g}")
                    for req in reqs:
                        ex = pr.send(client, session, req, fields, plan)
                        ok = Verdict.MATCH if ex.completion.ok else Verdict.ERROR
                        into.append(RequestResult(req.id, KIND, ok, ex.completion.error or "", ex.completion,
                                                  req.to_dict(), ex.evidence))
                        arm.generation_seconds += ex.completion.seconds
            # no acceptance: a draw of a few tokens ends in a round cut by max_tokens, whose
            # accepts the witness can only infer from the token count
        finally:
            pr.stop_session(session)
            arm.server["returncode"] = session.server.proc.returncode if session.server.proc else None
            arm.seconds = time.perf_counter() - t0
    if too_wide:
        return arms
    judge(arms[0], arms[1], wrong, spec, wrong_t, seeds, known_logits(pr.pairing.target),
          known_logits(pr.pairing.draft) if pr.pairing.draft else None, params)
    return arms


def judge(base: ArmResult, drafted: ArmResult, wrong: list[RequestResult], spec: DistSpec, wrong_t: float,
          seeds: dict[str, range], target_row: list[float] | None, draft_row: list[float] | None,
          params: dict[str, Any]) -> None:
    """Set both arms' verdicts and reasons from their draws (``wrong``: the wrong-temperature control)."""
    from specparity.probes.sampling.stats import near_miss_law, power_statement

    k = spec.prefix
    for arm in (base, drafted):
        if arm.verdict == Verdict.ERROR:
            continue
        failed = [r for r in arm.requests if _key(r, k) is None]
        if not arm.requests or failed:
            why = failed[0].reason if failed else "no requests were sent"
            arm.verdict, arm.reason = Verdict.ERROR, f"{len(failed)} of {len(arm.requests)} draws failed: {why}"
    if base.verdict == Verdict.ERROR or drafted.verdict == Verdict.ERROR:
        if drafted.verdict != Verdict.ERROR:
            drafted.verdict, drafted.reason = Verdict.ERROR, "no baseline sample to compare with: " + base.reason
        return
    keys = {name: [_key(r, k) for r in reqs] for name, reqs in
            (("baseline", base.requests), ("drafted", drafted.requests), ("wrong-temperature", wrong))}
    cells = sorted({c for ks in keys.values() for c in ks if c is not None})
    index = {c: i for i, c in enumerate(cells)}
    counts = {name: np.bincount([index[c] for c in ks if c is not None], minlength=len(cells))
              for name, ks in keys.items()}
    res = DistResult(spec.temperature, wrong_t, k, spec.alpha, {n: [s.start, s.stop - 1] for n, s in seeds.items()},
                     cells, {n: [int(x) for x in c] for n, c in counts.items()}, target_row is not None)
    rng = np.random.default_rng(np.random.SeedSequence(spec.seed).spawn(1)[0])
    hom = res.homogeneity = homogeneity(counts["baseline"], counts["drafted"], spec.alpha)
    pooled = (counts["baseline"] + counts["drafted"]) / (hom.samples[0] + hom.samples[1])
    res.power = power_statement(pooled, max(int(hom.n_eff), 1), spec.alpha)
    if wrong and all(c is not None for c in keys["wrong-temperature"]):
        h = homogeneity(counts["baseline"], counts["wrong-temperature"], spec.alpha)
        res.controls.append(Control(
            f"baseline at temperature {wrong_t:g}", "served", "homogeneity",
            f"these requests tell a server sampling at T={wrong_t:g} from one at T={spec.temperature:g}",
            h.statistic, h.threshold, h.rejected))
    if res.power is not None:
        name = f"near miss at TV {res.power.min_tv:.3g}"
        proves = "the stated power holds at these bins: a law at the stated TV, least detectable direction, is caught"
        try:
            alt = near_miss_law(pooled, max(int(hom.n_eff), 1), res.power.min_tv)
        except ValueError:  # the stated TV is more than the law can move: the statement says nothing
            res.controls.append(Control(name, "simulated", "homogeneity", proves, math.nan, None, False))
        else:
            n1, n2 = hom.samples
            h = homogeneity(rng.multinomial(n1, pooled), rng.multinomial(n2, alt), spec.alpha)
            res.controls.append(Control(name, "simulated", "homogeneity", proves, h.statistic, h.threshold,
                                        h.rejected))
    if target_row is not None:
        _known_law_tests(res, base, drafted, spec, wrong_t, target_row, draft_row, params, counts, cells, rng)
    _verdicts(res, base, drafted)
    base.dist = drafted.dist = res.to_dict()
    drafted.notes = lines(res)


def _known_law_tests(res: DistResult, base: ArmResult, drafted: ArmResult, spec: DistSpec, wrong_t: float,
                     target_row: list[float], draft_row: list[float] | None, params: dict[str, Any],
                     counts: dict[str, np.ndarray], cells: list[str], rng: np.random.Generator) -> None:
    """Goodness of fit of each arm against the exact law of the k-prefix, and the controls that need p."""
    from specparity.probes.sampling.dist import run_arm
    from specparity.probes.sampling.problem import make_problem
    from specparity.probes.sampling.rules import CONTROLS
    from specparity.probes.sampling.stats import chi_square, power_statement

    k = spec.prefix
    p1 = known_law(target_row, spec.temperature, params)
    live = [int(i) for i in np.nonzero(p1 > 0)[0]]
    joint_cells = [",".join(str(live[i]) for i in t) for t in np.ndindex(*([len(live)] * k))]

    def joint(p: np.ndarray) -> np.ndarray:
        j = p[live]
        for _ in range(1, k):
            j = np.outer(j, p[live]).reshape(-1)
        return j

    law, law_wrong = joint(p1), joint(known_law(target_row, wrong_t, params))
    pos = {c: i for i, c in enumerate(joint_cells)}
    hist = {}
    for name, c in counts.items():
        h = np.zeros(len(joint_cells))
        for cell, x in zip(cells, c):
            if x and cell in pos:
                h[pos[cell]] += x
            elif x and res.outside_support.get(name) is None:
                res.outside_support[name] = cell
        hist[name] = h
    for name in ("baseline", "drafted"):
        res.outside_support.setdefault(name, None)
        res.gof[name] = chi_square(hist[name], law, spec.alpha)
    n = int(hist["drafted"].sum())
    res.gof_power = power_statement(law, n, spec.alpha)
    wrong_gof = chi_square(hist["baseline"], law_wrong, spec.alpha)
    res.controls.append(Control(
        f"law at temperature {wrong_t:g}", "served", "goodness of fit",
        f"the served baseline sample tells p at T={spec.temperature:g} from p at T={wrong_t:g}",
        wrong_gof.statistic, wrong_gof.threshold, wrong_gof.rejected))
    if res.gof_power is not None:
        from specparity.probes.sampling.stats import near_miss_control

        name, proves = (f"near miss at TV {res.gof_power.min_tv:.3g} from p",
                        "the stated goodness-of-fit power holds at these bins")
        try:
            nm = near_miss_control(law, n, spec.alpha, res.gof_power, rng)
        except ValueError:  # the stated TV is more than the law can move
            res.controls.append(Control(name, "simulated", "goodness of fit", proves, math.nan, None, False))
        else:
            res.controls.append(Control(name, "simulated", "goodness of fit", proves, nm.chi.statistic,
                                        nm.chi.threshold, nm.rejected))
    if draft_row is not None and k == 1 and not any(params.get(f) for f in FILTERS):
        prob = make_problem(target_logits=np.array([target_row[i] for i in live]),
                            draft_logits=np.array([draft_row[i] for i in live]),
                            temperature=spec.temperature, top_k=0)
        for ctl in CONTROLS.values():
            arm = run_arm(ctl, prob, n, spec.alpha, rng, "control")
            res.controls.append(Control(
                ctl.name, "simulated", "goodness of fit",
                f"a server using the known-wrong rule {ctl.name!r} with this p and q would be caught at n={n}",
                arm.chi.statistic, arm.chi.threshold, arm.chi.rejected))


def _verdicts(res: DistResult, base: ArmResult, drafted: ArmResult) -> None:
    base.verdict, base.reason = Verdict.MATCH, "the reference sample"
    if res.known_law:
        g = res.gof["baseline"]
        if res.outside_support["baseline"] is not None or g.rejected:
            base.verdict = Verdict.DIVERGED
            base.reason = (f"classic decode's own sample is not the target's law: prefix"
                           f" {res.outside_support['baseline']} has p = 0" if res.outside_support["baseline"]
                           else f"classic decode's own sample fails the fit: chi-square {g.statistic:.1f} >"
                                f" {g.threshold:.1f} at dof {g.dof}")
        else:
            base.reason = f"the reference sample; fits p: chi-square {g.statistic:.1f} <= {g.threshold:.1f}"
    hom = res.homogeneity
    assert hom is not None
    n1, n2 = hom.samples
    if res.known_law and res.outside_support["drafted"] is not None:
        drafted.verdict = Verdict.DIVERGED
        drafted.reason = f"emitted prefix {res.outside_support['drafted']} has p = 0 under the target's law"
        return
    if res.known_law and res.gof["drafted"].rejected:
        g = res.gof["drafted"]
        drafted.verdict = Verdict.DIVERGED
        drafted.reason = (f"the drafted sample does not fit the target's law: chi-square {g.statistic:.1f} >"
                          f" {g.threshold:.1f} at dof {g.dof} (TV {g.tv:.3f}, noise floor {g.tv_floor:.3f})")
        return
    if hom.rejected:
        drafted.verdict = Verdict.DIVERGED
        drafted.reason = (f"drafted and baseline samples differ: homogeneity chi-square {hom.statistic:.1f} >"
                          f" {hom.threshold:.1f} at dof {hom.dof} (TV {hom.tv:.3f}, n {n1} vs {n2})")
        return
    if not any(r.evidence.engaged for r in drafted.requests):
        drafted.verdict = Verdict.NOT_ENGAGED
        drafted.reason = f"no evidence the drafter ran in any of {n2} draws (no witness, log or response field)"
        return
    if hom.dof < 1:
        drafted.verdict = Verdict.INCONCLUSIVE
        drafted.reason = ("every draw of both arms emitted the same prefix: no test has power at this"
                          " temperature (raise it, or lengthen the prefix)")
        return
    weak = [c for c in res.controls if not c.rejected]
    if weak:
        drafted.verdict = Verdict.INCONCLUSIVE
        drafted.reason = (f"underpowered: control(s) not rejected at {n2} draws: {'; '.join(c.line() for c in weak)}"
                          " (more requests, or a higher temperature)")
        return
    drafted.verdict = Verdict.MATCH
    reach = []
    if res.power is not None:
        reach.append(f"homogeneity rejects any law at TV >= {res.power.min_tv:.3g} from the baseline's"
                     f" (n_eff {hom.n_eff:.0f})")
    fit = ""
    if res.known_law:
        g = res.gof["drafted"]
        fit = f", fits the target's law (chi-square {g.statistic:.1f} <= {g.threshold:.1f}, dof {g.dof})"
        if res.gof_power is not None:
            reach.append(f"the fit rejects any law at TV >= {res.gof_power.min_tv:.3g} from p (n {n2})")
    drafted.reason = (f"{res.prefix}-token prefix law equal to the baseline's (homogeneity chi-square"
                      f" {hom.statistic:.1f} <= {hom.threshold:.1f}, dof {hom.dof}, n {n1} vs {n2}){fit},"
                      f" all {len(res.controls)} known-wrong controls rejected; with 99% power at alpha"
                      f" {res.alpha:g}, " + (" and ".join(reach) or "no power statement"))


def lines(res: DistResult) -> list[str]:
    """Report lines of the drafted distribution arm: the settings, the power, the controls and what they prove."""
    out = [f"distribution: temperature {res.temperature:g}, {res.prefix}-token prefix, alpha {res.alpha:g},"
           f" seeds {res.seeds}"]
    if res.power is not None:
        out.append(f"power (homogeneity): {res.power.describe()} (the two samples' effective size)")
    if res.gof_power is not None:
        out.append(f"power (fit to the known p): {res.gof_power.describe()}")
    for c in res.controls:
        out.append(f"control {c.line()}: proves {c.proves}")
    return out
