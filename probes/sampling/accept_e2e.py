"""mlx-lm's speculative stream at temperature T, tested end to end against a known p.

A fixture target whose logits ignore its input (``fixtures.constant_logits``)
makes every emitted token an i.i.d. draw from softmax(logits / T), whatever the
drafter (a second constant-logits fixture) proposes. The emitted stream is
then tested like ``specparity dist`` tests a rule: chi-square and TV against p,
the support check, and the known-wrong controls simulated at the same sample
size; its acceptance is placed on the closed forms like ``accept`` does.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specparity.errors import InputError
from specparity.probes.sampling.accept import (
    DEFAULT_ALPHA, DEFAULT_NUM_DRAFT, DEFAULT_TEMPERATURE, MLX_LM, Measurement, check_args, measure,
    speculative_run,
)
from specparity.probes.sampling.dist import NOT_REJECTED, MonteCarloArm, run_arm
from specparity.probes.sampling.problem import make_problem, softmax32
from specparity.probes.sampling.rules import CONTROLS, SUM_PROD, closed_forms
from specparity.probes.sampling.stats import NearMiss, Power, chi_square, near_miss_control, power_statement
from specparity.verdicts import ReportMixin, Verdict


# End to end: six live tokens (ids 10..15), everything else -1e4 (exp underflows to
# exactly 0 in float32 at T = 0.7, so p has six cells and chi-square dof 5). The
# drafter's q is chosen far from p so every known-wrong control is rejected at a
# few hundred tokens.
E2E_TARGET = (1.0, 0.6, 0.3, 0.0, -0.4, -0.8)
E2E_DRAFT = (1.9, -3.0, -1.9, 1.1, 0.1, 1.9)
E2E_TOKENS = 600


@dataclass
class EndToEndReport(ReportMixin):
    """mlx-lm's speculative stream at temperature T against a known p.

    target / draft: the constant-logits fixtures (their logits ignore the input).
    temperature, num_draft, seed, alpha: settings. tokens: emitted tokens tested.
    live_tokens: the token ids p gives mass to (every other id has p = 0).
    p / q: the target's and drafter's distributions over ``live_tokens``.
    counts: emitted count per live token.
    outside_support: [stream index, token] of the first emitted token with p = 0, or None.
    arms: the mlx-lm stream's MonteCarloArm (role ``rule``) then the simulated controls' MonteCarloArms.
    acceptance: mlx-lm's measured acceptance placed on the closed forms.
    verdict: ``pass``, ``divergent`` or ``inconclusive`` (a control not rejected).
    reason: one line. seconds: wall time (generation_seconds: the mlx-lm part).
    power: the smallest TV / relative error this stream's test rejects with 99% power;
      near_miss: the control drawn at that TV (it must be rejected, else inconclusive).
    """

    target: str
    draft: str
    temperature: float
    num_draft: int
    seed: int
    alpha: float
    tokens: int
    live_tokens: list[int]
    p: list[float]
    q: list[float]
    counts: list[int]
    outside_support: list[int] | None
    arms: list[Any]
    acceptance: Measurement
    verdict: Verdict
    reason: str
    seconds: float
    generation_seconds: float
    power: Power | None = None
    near_miss: NearMiss | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["exit_code"] = self.exit_code
        return d

    def lines(self) -> list[str]:
        return render_end_to_end(self).splitlines()


def run_end_to_end(temperature: float = DEFAULT_TEMPERATURE, tokens: int = E2E_TOKENS,
                   num_draft: int = DEFAULT_NUM_DRAFT, alpha: float = DEFAULT_ALPHA,
                   seed: int = 0, root: Path | None = None,
                   target_live: tuple[float, ...] = E2E_TARGET,
                   draft_live: tuple[float, ...] = E2E_DRAFT) -> EndToEndReport:
    """Test mlx-lm's speculative stream at ``temperature`` against the fixture's p."""
    from specparity.checkpoint import load_checkpoint
    from specparity.fixtures import VOCAB_SIZE, build_constant_pair, constant_logits, fixtures_home
    from specparity.prompts import DEFAULT_PROMPTS, encode_prompts

    check_args(temperature, 1, num_draft, 1, alpha)
    if tokens < 50:
        raise InputError("tokens", f"{tokens}: need at least 50")
    from specparity.inputs import check_positions

    check_positions(tokens, "--tokens")
    t0 = time.perf_counter()
    tdir, ddir = build_constant_pair(root or fixtures_home(), target_live, draft_live)
    tgt = load_checkpoint(tdir, trust_remote_code=True)
    drf = load_checkpoint(ddir, trust_remote_code=True)
    prompt = encode_prompts(tgt.tokenizer, [DEFAULT_PROMPTS[0]])[0]
    run = speculative_run(tgt.model, drf.model, prompt, temperature, num_draft,
                          max_tokens=tokens, seed=seed)
    stream = np.array(run.tokens[:tokens], dtype=np.int64)
    vocab = VOCAB_SIZE
    p_full = softmax32(np.array(constant_logits(target_live, vocab)), temperature)
    q_full = softmax32(np.array(constant_logits(draft_live, vocab)), temperature)
    live = [int(i) for i in np.nonzero(p_full > 0)[0]]
    counts_full = np.bincount(stream, minlength=vocab)
    off = np.nonzero(p_full[stream] <= 0)[0]
    outside = [int(off[0]), int(stream[off[0]])] if off.size else None
    chi = chi_square(counts_full, p_full, alpha)
    a_min, a_prod = closed_forms(p_full, q_full)
    arm_stream = MonteCarloArm(
        name=MLX_LM, description="mlx-lm's speculative stream (sampler-match)", role="rule",
        verdict=Verdict.DIVERGENT if (chi.rejected or outside) else Verdict.PASS, chi=chi,
        acceptance=sum(run.rounds) / max(num_draft * len(run.rounds), 1),
        sum_min=float(a_min), sum_prod=float(a_prod), seconds=run.seconds,
        draws_per_second=len(stream) / run.seconds if run.seconds > 0 else 0.0,
    )
    # Controls: the same p and q over the live tokens, at the same sample size.
    prob = make_problem(target_logits=np.array(target_live), draft_logits=np.array(draft_live),
                        temperature=temperature, top_k=0)
    streams = np.random.SeedSequence(seed).spawn(len(CONTROLS) + 1)  # the controls, the near miss
    arms: list[Any] = [arm_stream]
    for ctl, ss in zip(CONTROLS.values(), streams):
        arms.append(run_arm(ctl, prob, len(stream), alpha, np.random.default_rng(ss), "control"))
    n_tested = len(run.tested)
    acc_meas = measure(MLX_LM, "sampler-match", SUM_PROD, int(sum(run.rounds)), n_tested,
                       num_draft * len(run.rounds), len(run.rounds),
                       np.full(n_tested, float(a_min)), np.full(n_tested, float(a_prod)), alpha)
    power = power_statement(p_full, len(stream), alpha)
    near = (near_miss_control(p_full, len(stream), alpha, power, np.random.default_rng(streams[-1]))
            if power is not None else None)
    if outside:
        verdict, reason = Verdict.DIVERGENT, (f"emitted token {outside[1]} at stream index"
                                      f" {outside[0]} has p = 0")
    elif chi.rejected:
        verdict, reason = Verdict.DIVERGENT, (f"chi-square {chi.statistic:.1f} > threshold"
                                      f" {chi.threshold:.1f} at dof {chi.dof}")
    elif any(a.verdict == NOT_REJECTED for a in arms[1:]):
        weak = [a.name for a in arms[1:] if a.verdict == NOT_REJECTED]
        verdict, reason = Verdict.INCONCLUSIVE, (f"underpowered: control(s) {', '.join(weak)} not"
                                         f" rejected at {len(stream)} tokens")
    elif near is not None and not near.rejected:
        verdict, reason = Verdict.INCONCLUSIVE, (f"the near-miss control at TV {near.tv:.4g} was not"
                                                 " rejected: the power statement does not hold")
    elif acc_meas.verdict == Verdict.DIVERGENT:
        verdict, reason = Verdict.DIVERGENT, (f"acceptance sits on {acc_meas.sits_on}, expected"
                                      f" sum_prod (z_prod {acc_meas.z_prod:.1f})")
    else:
        verdict, reason = Verdict.PASS, (f"chi-square {chi.statistic:.1f} <= {chi.threshold:.1f} at"
                                 f" dof {chi.dof}, every control rejected, acceptance on"
                                 " sum_prod" + (f"; {power.describe()}" if power is not None else ""))
    return EndToEndReport(
        target=tdir, draft=ddir, temperature=temperature, num_draft=num_draft, seed=seed,
        alpha=alpha, tokens=len(stream), live_tokens=live, p=[float(p_full[i]) for i in live],
        q=[float(q_full[i]) for i in live], counts=[int(counts_full[i]) for i in live],
        outside_support=outside, arms=arms, acceptance=acc_meas, verdict=verdict,
        reason=reason, seconds=time.perf_counter() - t0, generation_seconds=run.seconds,
        power=power, near_miss=near,
    )


def render_end_to_end(rep: EndToEndReport) -> str:
    lines = [
        f"accept --end-to-end: mlx-lm speculative_generate_step at temperature"
        f" {rep.temperature:g}, num_draft {rep.num_draft}, seed {rep.seed}, {rep.tokens} tokens",
        f"  target {rep.target} (constant logits), drafter {rep.draft} (constant logits)",
        f"  live tokens {rep.live_tokens}: p = [{', '.join(f'{x:.4f}' for x in rep.p)}],"
        f" q = [{', '.join(f'{x:.4f}' for x in rep.q)}]",
        f"  emitted counts {rep.counts}"
        + (f"; OUTSIDE SUPPORT at {rep.outside_support}" if rep.outside_support else ""),
    ]
    for a in rep.arms:
        c = a.chi
        thr = f"{c.threshold:.1f}" if c.threshold is not None else "n/a"
        lines.append(
            f"  {a.role:7s} {a.name:33s} {a.verdict:12s} chi2 {c.statistic:10.1f}  threshold"
            f" {thr} (dof {c.dof}, n {c.samples})  TV {c.tv:.4f} (noise floor {c.tv_floor:.4f})")
    m = rep.acceptance
    lines.append(
        f"  acceptance: per_position {m.per_position_acceptance:.4f} ({m.accepted}/{m.tested}),"
        f" acceptance_rate {m.acceptance_rate:.4f}, mean_accepted_len {m.mean_accepted_len:.3f};"
        f" sum_prod {m.mean_sum_prod:.4f} (z {m.z_prod:+.1f}), sum_min {m.mean_sum_min:.4f}"
        f" (z {m.z_min:+.1f}): sits on {m.sits_on}")
    if rep.power is not None:
        lines.append(f"  power: {rep.power.describe()}")
    if rep.near_miss is not None:
        lines.append(f"  near-miss control at TV {rep.near_miss.tv:.4g}:"
                     f" {'rejected' if rep.near_miss.rejected else 'NOT rejected'}")
    lines.append(f"verdict: {rep.verdict}: {rep.reason}  ({rep.seconds:.1f} s,"
                 f" generation {rep.generation_seconds:.1f} s)")
    return "\n".join(lines)
