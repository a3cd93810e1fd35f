"""Measured acceptance on real models, against its closed forms.

For a target and a drafter at temperature T, a lossless rule's per-position
acceptance probability has a closed form: sum_x min(p, q) for modified
rejection sampling (the ceiling, 1 - TV), sum_x p(x) q(x) for sampler-match
(accept when the draft equals a fresh draw from the target: mlx-lm's rule).

``run_accept`` runs mlx-lm's own speculative generation
(``mlx_lm.generate.speculative_generate_step`` with a temperature sampler) from a
prompt, reconstructs its rounds from the ``from_draft`` flags, recomputes p and
q at every tested position by teacher forcing the emitted sequence through both
models, and tests the accepted count against each closed form. Each tested
position's acceptance is a Bernoulli of probability alpha_t given the history,
so (accepted - sum alpha_t) / sqrt(sum alpha_t (1 - alpha_t)) is a martingale z
score; the measurement *sits on* a form when |z| <= the two-sided normal
quantile at ``alpha``. The same tested positions also drive a Monte-Carlo
measurement of each ``--rule`` (built-in or user) so a rule can be placed on a
form, or flagged when it sits on neither.

The end-to-end test of mlx-lm's emitted stream against a known p is ``e2e.py``.
"""


from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from specparity.errors import InputError
from specparity.probes.sampling.montecarlo import draw_drafts, single_step
from specparity.probes.sampling.rules import BUILTIN, SUM_MIN, SUM_PROD, Rule, closed_forms, rule_q
from specparity.probes.sampling.stats import min_detectable_shift
from specparity.verdicts import ReportMixin, Verdict

log = logging.getLogger(__name__)

# a measurement that sits on the form it should (a measurement outcome, not a run verdict)
OK = "ok"
DEFAULT_TEMPERATURE = 0.7
DEFAULT_POSITIONS = 192
DEFAULT_NUM_DRAFT = 2
DEFAULT_DRAWS = 1000
DEFAULT_ALPHA = 1e-4
MLX_LM = "mlx-lm speculative_generate_step"


# ---------------------------------------------------------------- closed forms


def inconsistent_positions(sum_min: np.ndarray, sum_prod: np.ndarray,
                           tol: float = 1e-9) -> list[int]:
    """Positions where sum min(p, q) < sum p q: impossible for two distributions."""
    return [int(i) for i in np.nonzero(sum_min + tol < sum_prod)[0]]


@dataclass
class Measurement:
    """One measured acceptance beside both closed forms at the same positions.

    source: ``mlx-lm speculative_generate_step`` or ``simulated``.
    rule: the rule measured (mlx-lm's is sampler-match).
    expected: the closed form the rule should sit on (None: no claim).
    accepted: drafts accepted. tested: positions tested (a position is tested when
      its draft was compared: accepted ones plus the rejected one of each round).
    proposed: drafts proposed. rounds: verify rounds (simulated: draws).
    per_position_acceptance: accepted / tested. acceptance_rate: accepted / proposed.
    mean_accepted_len: accepted / rounds.
    mean_sum_min / mean_sum_prod: the closed forms' mean over the tested positions
      (with the q the rule sees: one-hot at argmax q for greedy drafters).
    z_min / z_prod: martingale z score of accepted against each form.
    z_crit: the two-sided normal quantile at alpha.
    sits_on: ``sum_min``, ``sum_prod``, ``both`` (the forms are too close to tell
      apart here) or ``neither``.
    verdict: ``ok`` or ``divergent`` (on neither, or not on the expected form).
    min_shift: the smallest shift of per-position acceptance off the expected form
      (sum_min when none is expected) this measurement detects with 99% power
      (two-sided z test at alpha, normal approximation).
    """

    source: str
    rule: str
    expected: str | None
    accepted: int
    tested: int
    proposed: int
    rounds: int
    per_position_acceptance: float
    acceptance_rate: float
    mean_accepted_len: float
    mean_sum_min: float
    mean_sum_prod: float
    z_min: float
    z_prod: float
    z_crit: float
    sits_on: str
    verdict: str
    min_shift: float = math.inf


def _z(accepted: float, alphas: np.ndarray, weight: float = 1.0) -> float:
    mean = float(alphas.sum()) * weight
    var = float((alphas * (1.0 - alphas)).sum()) * weight
    if var <= 0:
        return 0.0 if abs(accepted - mean) < 1e-9 else math.copysign(math.inf, accepted - mean)
    return (accepted - mean) / math.sqrt(var)


def measure(source: str, rule: str, expected: str | None, accepted: int, tested: int,
            proposed: int, rounds: int, a_min: np.ndarray, a_prod: np.ndarray,
            alpha: float, weight: float = 1.0) -> Measurement:
    """Place ``accepted`` on the closed forms; ``weight`` = draws per tested position."""
    from specparity.probes.sampling.laws import norm_isf

    z_crit = norm_isf(alpha / 2.0)
    z_min = _z(accepted, a_min, weight)
    z_prod = _z(accepted, a_prod, weight)
    on_min, on_prod = abs(z_min) <= z_crit, abs(z_prod) <= z_crit
    sits = "both" if on_min and on_prod else SUM_MIN if on_min else SUM_PROD if on_prod else (
        "neither")
    bad = sits == "neither" or (expected is not None and sits not in (expected, "both"))
    ref = a_prod if expected == SUM_PROD else a_min
    return Measurement(
        source=source, rule=rule, expected=expected, accepted=accepted, tested=tested,
        proposed=proposed, rounds=rounds,
        per_position_acceptance=accepted / max(tested, 1),
        acceptance_rate=accepted / max(proposed, 1),
        mean_accepted_len=accepted / max(rounds, 1),
        mean_sum_min=float(a_min.mean()) if a_min.size else 0.0,
        mean_sum_prod=float(a_prod.mean()) if a_prod.size else 0.0,
        z_min=z_min, z_prod=z_prod, z_crit=z_crit, sits_on=sits,
        verdict=Verdict.DIVERGENT if bad else OK,
        min_shift=min_detectable_shift(float((ref * (1.0 - ref)).sum()) * weight, ref.size * weight, alpha),
    )


# ---------------------------------------------------------------- mlx-lm's speculative path


@dataclass
class SpecRun:
    """What mlx-lm's speculative generation emitted.

    tokens: emitted token ids. from_draft: mlx-lm's flag per token (an accepted draft).
    rounds: per round, the number of drafts accepted.
    tested: stream indices of the tested positions (accepted drafts, and the
      target's token where a draft was rejected; a bonus token is not tested).
    seconds: wall time of the generation.
    """

    tokens: list[int]
    from_draft: list[bool]
    rounds: list[int]
    tested: list[int]
    seconds: float


def speculative_run(target: Any, draft: Any, prompt: list[int], temperature: float,
                    num_draft: int, stop_after_tested: int | None = None,
                    max_tokens: int = 100_000, seed: int = 0) -> SpecRun:
    """Run mlx-lm's speculative_generate_step with make_sampler(temp=temperature).

    Stops at a round boundary once ``stop_after_tested`` positions were tested
    (or after ``max_tokens`` emitted tokens, at a round boundary).
    """
    import mlx.core as mx
    from mlx_lm.generate import speculative_generate_step
    from mlx_lm.sample_utils import make_sampler

    mx.random.seed(seed)
    sampler = make_sampler(temp=temperature)
    tokens: list[int] = []
    flags: list[bool] = []
    rounds: list[int] = []
    tested: list[int] = []
    run_acc = 0
    t0 = time.perf_counter()
    gen = speculative_generate_step(
        mx.array(prompt, dtype=mx.uint32), target, draft, num_draft_tokens=num_draft,
        max_tokens=max_tokens + num_draft + 1, sampler=sampler,
    )
    try:
        for tok, _, from_draft in gen:
            idx = len(tokens)
            tokens.append(int(tok))
            flags.append(bool(from_draft))
            if from_draft:
                run_acc += 1
                tested.append(idx)
                continue
            if run_acc < num_draft:
                tested.append(idx)  # the target's token where the draft was rejected
            rounds.append(run_acc)
            run_acc = 0
            if stop_after_tested is not None and len(tested) >= stop_after_tested:
                break
            if len(tokens) >= max_tokens:
                break
    finally:
        gen.close()
    return SpecRun(tokens=tokens, from_draft=flags, rounds=rounds, tested=tested,
                   seconds=time.perf_counter() - t0)


def teacher_forced_probs(model: Any, prompt: list[int], tokens: list[int],
                         temperature: float) -> np.ndarray:
    """(len(tokens), V) float64: the distribution each emitted token was drawn from."""
    import mlx.core as mx

    seq = mx.array(list(prompt) + list(tokens), dtype=mx.uint32)[None]
    logits = model(seq)[0, len(prompt) - 1: len(prompt) - 1 + len(tokens)]
    mx.eval(logits)
    x = np.array(logits.astype(mx.float32), dtype=np.float64) / temperature
    x -= x.max(axis=-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


# ---------------------------------------------------------------- accept on real models


@dataclass
class AcceptReport(ReportMixin):
    """Measured acceptance against its closed forms on a real target/drafter pair.

    target / draft: checkpoint paths; target_digest / draft_digest: fingerprints.
    temperature, num_draft, seed, alpha, draws: the run's settings (draws =
      Monte-Carlo draws per tested position for the simulated rules).
    prompt: the prompt's token ids. emitted: tokens mlx-lm generated.
    positions_tested: tested positions (closed forms are averaged over these).
    mean_sum_min / mean_sum_prod: the closed forms' mean over the tested positions.
    per_position: [{index, round, accepted, sum_min, sum_prod}] per tested position.
    inconsistent: tested positions where sum_min < sum_prod (p or q is wrong).
    measurements: mlx-lm's own first, then one per simulated rule.
    verdict: ``pass`` or ``divergent``; reason: one line.
    seconds: wall time.
    """

    target: str
    draft: str
    target_digest: str
    draft_digest: str
    temperature: float
    num_draft: int
    seed: int
    alpha: float
    draws: int
    prompt: list[int]
    emitted: list[int]
    positions_tested: int
    mean_sum_min: float
    mean_sum_prod: float
    per_position: list[dict[str, Any]]
    inconsistent: list[int]
    measurements: list[Measurement]
    verdict: Verdict
    reason: str
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["exit_code"] = self.exit_code
        return d

    def lines(self) -> list[str]:
        return render_accept(self).splitlines()


def simulate_at_positions(rule: Rule, P: np.ndarray, Q: np.ndarray, draws: int,
                          rng: np.random.Generator) -> int:
    """Accepted drafts of ``rule`` over ``draws`` drafts at each position (P, Q rows)."""
    accepted = 0
    for i in range(P.shape[0]):
        d = draw_drafts(rule, Q[i], draws, rng)
        _, acc = single_step(rule, P[i], Q[i], d, rng, i * draws)
        accepted += int(acc.sum())
    return accepted


def run_accept(target_dir: str, draft_dir: str, temperature: float = DEFAULT_TEMPERATURE,
               positions: int = DEFAULT_POSITIONS, num_draft: int = DEFAULT_NUM_DRAFT,
               rules: list[Rule] | None = None, draws: int = DEFAULT_DRAWS,
               alpha: float = DEFAULT_ALPHA, seed: int = 0, prompt: list[int] | None = None,
               trust_remote_code: bool = False) -> AcceptReport:
    """mlx-lm's speculative acceptance and each rule's, placed on the closed forms."""
    from specparity.checkpoint import load_checkpoint
    from specparity.prompts import DEFAULT_PROMPTS, encode_prompts

    check_args(temperature, positions, num_draft, draws, alpha)
    t0 = time.perf_counter()
    tgt = load_checkpoint(target_dir, trust_remote_code=trust_remote_code)
    drf = load_checkpoint(draft_dir, trust_remote_code=trust_remote_code, flag="--draft-model")
    _check_trimmable(tgt.model, target_dir)
    if prompt is not None:
        from specparity.inputs import check_prompts

        check_prompts([prompt], tgt)
        check_prompts([prompt], drf, "--prompt-ids (--draft-model's vocabulary)")
    if prompt is None:
        prompt = encode_prompts(tgt.tokenizer, [DEFAULT_PROMPTS[0]])[0]
    log.info("accept: mlx-lm speculative generation until %d positions are tested", positions)
    run = speculative_run(tgt.model, drf.model, prompt, temperature, num_draft,
                          stop_after_tested=positions, max_tokens=positions * (num_draft + 1),
                          seed=seed)
    P_all = teacher_forced_probs(tgt.model, prompt, run.tokens, temperature)
    Q_all = teacher_forced_probs(drf.model, prompt, run.tokens, temperature)
    if P_all.shape[-1] != Q_all.shape[-1]:
        raise InputError("model", f"has {P_all.shape[-1]} logits but --draft-model has"
                         f" {Q_all.shape[-1]}: a drafter must share the target's vocabulary")
    idx = np.array(run.tested, dtype=np.int64)
    P, Q = P_all[idx], Q_all[idx]
    a_min, a_prod = closed_forms(P, Q)
    accepted_flags = [run.from_draft[i] for i in run.tested]
    round_of = _round_index(run)
    per_position = [
        {"index": int(i), "round": round_of[int(i)], "accepted": bool(a),
         "sum_min": float(m), "sum_prod": float(pq)}
        for i, a, m, pq in zip(idx, accepted_flags, a_min, a_prod)
    ]
    accepted = int(sum(run.rounds))
    meas = [measure(MLX_LM, "sampler-match", SUM_PROD, accepted, len(idx),
                    num_draft * len(run.rounds), len(run.rounds), a_min, a_prod, alpha)]
    rules = [BUILTIN["sampler-match"], BUILTIN["mrs"]] if rules is None else rules
    streams = np.random.SeedSequence(seed).spawn(len(rules))
    for rule, ss in zip(rules, streams):
        rq = rule_q(rule, Q)
        r_min, r_prod = closed_forms(P, rq)
        acc = simulate_at_positions(rule, P, Q, draws, np.random.default_rng(ss))
        n = draws * len(idx)
        meas.append(measure("simulated", rule.name, rule.closed_form, acc, n, n, n, r_min,
                            r_prod, alpha, weight=float(draws)))
    bad_pos = inconsistent_positions(a_min, a_prod)
    verdict, reason = _accept_verdict(meas, bad_pos)
    return AcceptReport(
        target=str(tgt.path), draft=str(drf.path), target_digest=tgt.fingerprint.short,
        draft_digest=drf.fingerprint.short, temperature=temperature, num_draft=num_draft,
        seed=seed, alpha=alpha, draws=draws, prompt=list(prompt), emitted=run.tokens,
        positions_tested=len(idx), mean_sum_min=float(a_min.mean()),
        mean_sum_prod=float(a_prod.mean()), per_position=per_position, inconsistent=bad_pos,
        measurements=meas, verdict=verdict, reason=reason, seconds=time.perf_counter() - t0,
    )


def _round_index(run: SpecRun) -> dict[int, int]:
    out, r = {}, 0
    for i, fd in enumerate(run.from_draft):
        out[i] = r
        if not fd:
            r += 1
    return out


def _accept_verdict(meas: list[Measurement], bad_pos: list[int]) -> tuple[Verdict, str]:
    if bad_pos:
        return Verdict.DIVERGENT, (f"sum_min < sum_prod at {len(bad_pos)} tested position(s), first"
                           f" {bad_pos[0]}: p or q is not a distribution")
    bad = [m for m in meas if m.verdict == Verdict.DIVERGENT]
    if bad:
        m = bad[0]
        want = f", expected {m.expected}" if m.expected else ""
        return Verdict.DIVERGENT, (f"{m.rule} ({m.source}) sits on {m.sits_on}{want}: z_min"
                           f" {m.z_min:.1f}, z_prod {m.z_prod:.1f}, |z| limit {m.z_crit:.2f}")
    reach = max(m.min_shift for m in meas) if meas else math.inf
    return Verdict.PASS, (f"every measurement sits on its closed form; each detects a shift >= {reach:.3g}"
                          " of per-position acceptance off its form with 99% power")


def check_args(temperature: float, positions: int, num_draft: int, draws: int,
                alpha: float) -> None:
    if temperature is None or not math.isfinite(temperature) or temperature <= 0:
        raise InputError("temperature", f"{temperature}: must be a finite number > 0"
                         " (acceptance at temperature 0 is exact agreement, see probe)")
    if positions < 1:
        raise InputError("positions", f"{positions}: must be >= 1")
    if num_draft < 1:
        raise InputError("num-draft", f"{num_draft}: must be >= 1")
    if draws < 1:
        raise InputError("draws", f"{draws}: must be >= 1")
    if not 0 < alpha < 1:
        raise InputError("alpha", f"{alpha}: must be in (0, 1)")
    from specparity.inputs import check_limit, check_positions, check_width

    check_positions(positions, "--positions")
    check_width(num_draft + 1, "--num-draft + 1 (verify rows)")
    check_limit(draws, "--draws", "max_samples")


def _check_trimmable(model: Any, path: str) -> None:
    from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache

    if not can_trim_prompt_cache(make_prompt_cache(model)):
        raise InputError("model", f"{path}: its cache cannot be trimmed, and mlx-lm's"
                         " speculative generation needs a trimmable cache")


def render_accept(rep: AcceptReport) -> str:
    lines = [
        f"accept: target {rep.target} ({rep.target_digest}), drafter {rep.draft}"
        f" ({rep.draft_digest})",
        f"  temperature {rep.temperature:g}, num_draft {rep.num_draft}, seed {rep.seed},"
        f" {len(rep.emitted)} tokens emitted, {rep.positions_tested} positions tested",
        f"  closed forms over the tested positions: mean sum_min {rep.mean_sum_min:.4f},"
        f" mean sum_prod {rep.mean_sum_prod:.4f}",
    ]
    for m in rep.measurements:
        lines.append(
            f"  {m.source:33s} {m.rule:16s} {m.verdict:9s} sits on {m.sits_on:8s}"
            f" (expected {m.expected or 'n/a'}): per_position_acceptance"
            f" {m.per_position_acceptance:.4f} ({m.accepted}/{m.tested}), acceptance_rate"
            f" {m.acceptance_rate:.4f}, mean_accepted_len {m.mean_accepted_len:.3f};"
            f" sum_min {m.mean_sum_min:.4f} (z {m.z_min:+.1f}), sum_prod {m.mean_sum_prod:.4f}"
            f" (z {m.z_prod:+.1f}), |z| limit {m.z_crit:.2f}; detects a shift >= {m.min_shift:.3g}"
            " with 99% power"
        )
    if rep.inconsistent:
        lines.append(f"  sum_min < sum_prod at tested positions {rep.inconsistent[:10]}")
    lines.append(f"verdict: {rep.verdict}: {rep.reason}  ({rep.seconds:.1f} s)")
    return "\n".join(lines)
