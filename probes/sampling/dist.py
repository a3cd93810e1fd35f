"""Distributional exactness of an acceptance rule at temperature > 0.

A rule is lossless when every emitted token is a draw from the target's
distribution p, whatever mix of accepted drafts, resamples and bonus tokens
produced it. This module holds the run, on a problem (p and q from logits,
temperature and filters: ``problem``, whose names it re-exports for its
callers): it draws many rounds of one rule (``montecarlo``) and tests the
emitted tokens against p (``stats``):

- Pearson chi-square goodness of fit against p, threshold the exact chi-square
  quantile at ``alpha`` (scipy); cells whose expected count is below 5 are pooled
  into one bin. Total variation beside its Monte-Carlo noise floor.
- The known-wrong controls (``rules.CONTROLS``) run beside the rule at the
  same sample size; when one of them is not rejected the run is underpowered:
  ``inconclusive``, never a pass.
- Zero-tolerance checks a goodness-of-fit test cannot see: no emitted token
  outside p's support (top-k / top-p / min-p), also in a sweep that forces every
  vocabulary token as the draft (a q that underflowed to 0 still gets drafted);
  and, for residual rules, no resample of a token with p <= q.
- Chains (num_draft = k > 1): a toy target and drafter whose conditionals depend
  on the previous token (the logits rolled by that token id, a Markov chain from
  context token 0); rounds of k drafts run until k tokens are emitted, and the
  emitted k-prefix is tested as one joint categorical against the product of the
  target's conditionals.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from specparity.errors import InputError
from specparity.probes.sampling.montecarlo import Checker, Violation, simulate
# the problem's API, as dist's callers (the dist and accept commands) reach it
from specparity.probes.sampling.problem import (
    DEFAULT_TEMPERATURE as DEFAULT_TEMPERATURE,
    Problem as Problem,
    check_temperature as check_temperature,
    make_problem as make_problem,
    parse_logits as parse_logits,
    softmax32 as softmax32,
    softmax64 as softmax64,
)
from specparity.probes.sampling.rules import CONTROLS, Rule, closed_forms, rule_q
from specparity.probes.sampling.stats import (
    ChiSquare,
    NearMiss,
    Power,
    chi_square,
    near_miss_control,
    power_statement,
    samples_for_tv,
)
from specparity.verdicts import ReportMixin, Verdict

log = logging.getLogger(__name__)

# a control arm's outcome (not a run verdict): the test rejected it, as it must, or not
REJECTED, NOT_REJECTED = "rejected", "not_rejected"

DEFAULT_SAMPLES = 200_000
DEFAULT_ALPHA = 1e-4
DEFAULT_SWEEP_DRAWS = 256


# ---------------------------------------------------------------- one run


@dataclass
class MonteCarloArm:
    """One rule's result in a dist run.

    name / description: the rule.
    role: ``rule`` (the rule under test) or ``control`` (a known-wrong control).
    verdict: ``pass`` / ``divergent`` for the rule, ``rejected`` / ``not_rejected``
      for a control.
    chi: the goodness of fit (ChiSquare).
    acceptance: accepted / proposed drafts in the Monte Carlo.
    sum_min / sum_prod: the closed forms sum_x min(p, q) and sum_x p q at the first
      position, with the q this rule sees.
    support_violation / residual_violation: the first failing draw (rule only).
    seconds: wall time of its draws; draws_per_second: samples / seconds.
    """

    name: str
    description: str
    role: str
    verdict: str
    chi: ChiSquare
    acceptance: float
    sum_min: float
    sum_prod: float
    support_violation: Violation | None = None
    residual_violation: Violation | None = None
    seconds: float = 0.0
    draws_per_second: float = 0.0


@dataclass
class DistReport(ReportMixin):
    """A dist run: the rule under test beside the known-wrong controls.

    rule: the rule under test's name. problem: Problem.describe().
    samples / alpha / seed: the run's settings (every arm uses seed's own stream).
    sweep_draws: draws per forced draft token in the support sweep.
    law: ``token`` (single position) or ``joint k-prefix``.
    arms: the rule first, then the controls.
    controls_run: False when the law is one token (temperature 0, or filters that
      leave one token): the exact support check decides and there is nothing for a
      control to get wrong.
    verdict: ``pass``, ``divergent`` (the rule failed a check) or ``inconclusive``
      (a control was not rejected: the run had too little power to pass anything).
    reason: one line saying why.
    seconds: wall time of the whole run.
    power: the smallest effects this run rejects with 99% power (stats.Power; None
      when no chi-square decides, at temperature 0).
    near_miss: a control drawn at exactly ``power.min_tv`` from the law: it must be
      rejected, or the power statement does not hold (inconclusive).
    detect_tv: the TV ``--detect-tv`` sized the sample for (None: not sized).
    """

    rule: str
    problem: dict[str, Any]
    samples: int
    alpha: float
    seed: int
    sweep_draws: int
    law: str
    arms: list[MonteCarloArm]
    controls_run: bool
    verdict: Verdict
    reason: str
    seconds: float
    power: Power | None = None
    near_miss: NearMiss | None = None
    detect_tv: float | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["exit_code"] = self.exit_code
        return d

    def lines(self) -> list[str]:
        return render_text(self).splitlines()


def run_arm(rule: Rule, prob: Problem, samples: int, alpha: float, rng: np.random.Generator,
            role: str, sweep_draws: int = 0) -> MonteCarloArm:
    """Draw ``samples`` rounds of one rule and test them (checks for role ``rule``)."""
    law = prob.joint() if prob.num_draft > 1 else prob.p
    checker = Checker(rule, "monte_carlo") if role == "rule" else None
    mc = simulate(rule, prob, samples, rng, checker)
    chi = chi_square(mc.counts, law, alpha)
    if checker is not None and sweep_draws > 0:
        # Force every token as the draft, including those q gives 0 (an underflowed q).
        sweep = Checker(rule, "sweep")
        for tok in range(prob.vocab):
            sub = Checker(rule, "sweep")
            simulate(rule, prob, sweep_draws, rng, sub, forced=tok)
            for v in (sub.support, sub.residual):
                if v is not None:
                    v.draw += tok * sweep_draws  # sweep draws are numbered across tokens
            sweep.merge(sub)
        checker.merge(sweep)
    smin, sprod = closed_forms(prob.p, rule_q(rule, prob.q))
    verdict: str  # the rule's Verdict, or a control's REJECTED / NOT_REJECTED
    if checker is not None:
        failed = chi.rejected or checker.support is not None or checker.residual is not None
        verdict = Verdict.DIVERGENT if failed else Verdict.PASS
    else:
        verdict = REJECTED if chi.rejected else NOT_REJECTED
    return MonteCarloArm(
        name=rule.name, description=rule.description, role=role, verdict=verdict, chi=chi,
        acceptance=mc.accepted / max(mc.proposed, 1), sum_min=float(smin), sum_prod=float(sprod),
        support_violation=checker.support if checker else None,
        residual_violation=checker.residual if checker else None,
        seconds=mc.seconds, draws_per_second=samples / mc.seconds if mc.seconds > 0 else 0.0,
    )


def law_of(prob: Problem) -> np.ndarray:
    """The law a dist run tests against: p, or the joint law of the k-prefix."""
    return prob.joint() if prob.num_draft > 1 else prob.p


def samples_to_detect(prob: Problem, tv: float, alpha: float = DEFAULT_ALPHA) -> int:
    """``--detect-tv``: the sample size at which this problem's test rejects any law at TV >= ``tv``
    with 99% power."""
    if not 0 < tv < 0.5:
        raise InputError("detect-tv", f"{tv}: must be in (0, 0.5)")
    if prob.temperature == 0:
        raise InputError("detect-tv", ": at temperature 0 the law is one token and the exact check decides")
    return samples_for_tv(law_of(prob), tv, alpha)


def run_dist(rule: Rule, prob: Problem, samples: int = DEFAULT_SAMPLES,
             alpha: float = DEFAULT_ALPHA, seed: int = 0,
             sweep_draws: int = DEFAULT_SWEEP_DRAWS,
             controls: list[Rule] | None = None, detect_tv: float | None = None) -> DistReport:
    """Test ``rule`` on ``prob`` beside the known-wrong controls, at one sample size.

    A pass also states the smallest TV (and per-bin relative error) this run
    rejects with 99% power, checked by a near-miss control drawn at that TV.
    """
    if samples < 100:
        raise InputError("samples", f"{samples}: need at least 100")
    from specparity.inputs import check_limit

    check_limit(samples, "--samples", "max_samples")
    check_limit(sweep_draws, "--sweep-draws", "max_samples")
    if not 0 < alpha < 1:
        raise InputError("alpha", f"{alpha}: must be in (0, 1)")
    t0 = time.perf_counter()
    controls = list(CONTROLS.values()) if controls is None else controls
    ss = np.random.SeedSequence(seed)
    streams = ss.spawn(2 + len(controls))  # the rule, the controls, the near-miss control
    log.info("dist: %s, %d samples, seed %d", rule.name, samples, seed)
    arms = [run_arm(rule, prob, samples, alpha, np.random.default_rng(streams[0]), "rule",
                    sweep_draws)]
    controls_run = prob.temperature > 0 and arms[0].chi.dof > 0
    if controls_run:
        for ctl, s in zip(controls, streams[1:]):
            log.info("dist: control %s", ctl.name)
            arms.append(run_arm(ctl, prob, samples, alpha, np.random.default_rng(s), "control"))
    power = near = None
    if controls_run:
        power = power_statement(law_of(prob), samples, alpha)
    if power is not None:
        near = near_miss_control(law_of(prob), samples, alpha, power, np.random.default_rng(streams[-1]))
    verdict, reason = _verdict(arms, controls_run, power, near)
    return DistReport(
        rule=rule.name, problem=prob.describe(), samples=samples, alpha=alpha, seed=seed,
        sweep_draws=sweep_draws,
        law="token" if prob.num_draft == 1 else f"joint {prob.num_draft}-prefix",
        arms=arms, controls_run=controls_run, verdict=verdict, reason=reason,
        seconds=time.perf_counter() - t0, power=power, near_miss=near, detect_tv=detect_tv,
    )


def _verdict(arms: list[MonteCarloArm], controls_run: bool, power: Power | None = None,
             near: NearMiss | None = None) -> tuple[Verdict, str]:
    rule = arms[0]
    if rule.support_violation is not None:
        return Verdict.DIVERGENT, f"{rule.name}: {rule.support_violation.describe()}"
    if rule.residual_violation is not None:
        return Verdict.DIVERGENT, f"{rule.name}: {rule.residual_violation.describe()}"
    if rule.chi.rejected:
        return Verdict.DIVERGENT, (f"{rule.name}: chi-square {rule.chi.statistic:.1f} > threshold"
                           f" {rule.chi.threshold:.1f} at dof {rule.chi.dof}")
    weak = [a.name for a in arms[1:] if a.verdict == NOT_REJECTED]
    if weak:
        return Verdict.INCONCLUSIVE, (f"underpowered: control(s) {', '.join(weak)} not rejected at"
                              f" {rule.chi.samples} samples")
    if near is not None and not near.rejected:
        return Verdict.INCONCLUSIVE, (f"the near-miss control at TV {near.tv:.4g} was not rejected (chi-square"
                              f" {near.chi.statistic:.1f} <= {near.chi.threshold:.1f}): this run's"
                              " power statement does not hold")
    if not controls_run:
        return Verdict.PASS, (f"{rule.name}: the target's law is one token; every emitted token"
                              " was it")
    reach = f"; {power.describe()}" if power is not None else ""
    return Verdict.PASS, (f"{rule.name}: chi-square {rule.chi.statistic:.1f} <= {rule.chi.threshold:.1f}"
                          f" at dof {rule.chi.dof}, every control rejected{reach}")


def render_text(rep: DistReport) -> str:
    """The human report (stdout)."""
    pr = rep.problem
    lines = [
        f"dist: rule {rep.rule}, law {rep.law}, {rep.samples} samples, alpha {rep.alpha:g},"
        f" seed {rep.seed}",
        f"  target: {pr['vocab']} tokens, temperature {pr['temperature']:g}, top_k"
        f" {pr['top_k']}, top_p {pr['top_p']:g}, min_p {pr['min_p']:g};"
        f" p = [{', '.join(f'{x:.4f}' for x in pr['p'])}]",
        f"  drafter q (float32) = [{', '.join(f'{x:.4g}' for x in pr['q'])}]",
    ]
    for a in rep.arms:
        c = a.chi
        thr = f"{c.threshold:.1f}" if c.threshold is not None else "n/a"
        lines.append(
            f"  {a.role:7s} {a.name:22s} {a.verdict:12s} chi2 {c.statistic:12.1f}  threshold"
            f" {thr} (dof {c.dof}, n {c.samples}, bins {c.bins}, pooled {c.pooled_cells})"
            f"  TV {c.tv:.5f} (noise floor {c.tv_floor:.5f})"
            f"  acceptance {a.acceptance:.4f} (sum_min {a.sum_min:.4f}, sum_prod"
            f" {a.sum_prod:.4f})"
        )
        for v in (a.support_violation, a.residual_violation):
            if v is not None:
                lines.append(f"      {v.check} violation: {v.describe()}")
    if not rep.controls_run:
        why = ("temperature 0" if pr["temperature"] == 0
               else f"temperature {pr['temperature']:g} but the filters leave one token")
        lines.append(f"  controls: not run ({why}: one-token law, the exact check decides)")
    if rep.power is not None:
        lines.append(f"  power: {rep.power.describe()}")
    if rep.near_miss is not None:
        nm = rep.near_miss
        lines.append(f"  near-miss control at TV {nm.tv:.4g} (predicted power {nm.predicted_power:.3f}):"
                     f" {'rejected' if nm.rejected else 'NOT rejected'}, chi2 {nm.chi.statistic:.1f}"
                     f" vs threshold {nm.chi.threshold:.1f}")
    if rep.detect_tv is not None:
        n_arms = len(rep.arms) + (rep.near_miss is not None)
        lines.append(f"  sized by --detect-tv {rep.detect_tv:g}: {rep.samples} samples per arm x {n_arms}"
                     f" arms = {rep.samples * n_arms} draws, {rep.seconds:.2f} s")
    lines.append(f"verdict: {rep.verdict}: {rep.reason}  ({rep.seconds:.2f} s)")
    return "\n".join(lines)
