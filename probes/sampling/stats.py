"""Goodness of fit for sampled tokens: Pearson chi-square, total variation, its noise floor.

Used by ``specparity dist`` (Monte-Carlo draws of a rule) and ``accept
--end-to-end`` (mlx-lm's emitted stream). Nothing here knows about rules.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from specparity.probes.sampling.laws import brentq, chi2_ppf, chi2_sf, ncx2_sf, norm_isf, norm_ppf

MIN_EXPECTED = 5.0


@dataclass
class ChiSquare:
    """Pearson goodness of fit of emitted tokens against the target law.

    statistic: sum (observed - expected)^2 / expected over the bins.
    dof: bins - 1 (0 when the law has one token: then no statistic decides).
    threshold: chi2.ppf(1 - alpha, dof), the exact quantile (None when dof = 0).
    alpha: the false-rejection probability of a lossless rule.
    samples: emitted tokens (or k-prefixes) tested.
    p_value: chi2.sf(statistic, dof).
    bins: bins used; pooled_cells: support cells with expected count < 5, pooled
      into one bin.
    rejected: statistic > threshold.
    tv: total variation between the empirical law and the target law.
    tv_floor: the expected total variation of an exact sampler at this many
      samples (normal approximation), the Monte-Carlo noise floor.
    """

    statistic: float
    dof: int
    threshold: float | None
    alpha: float
    samples: int
    p_value: float
    bins: int
    pooled_cells: int
    rejected: bool
    tv: float
    tv_floor: float


def bin_groups(law: np.ndarray, n: float) -> list[np.ndarray]:
    """The cells of each chi-square bin at ``n`` samples (cells with expected count < 5 pooled).

    Every support cell with expected count >= 5 is a bin; the rest are pooled into
    one bin, or folded into the smallest kept bin when the pool itself is rare.
    """
    law = np.asarray(law, dtype=np.float64)
    expected = law * float(n)
    support = law > 0
    big = np.nonzero(support & (expected >= MIN_EXPECTED))[0]
    small = np.nonzero(support & (expected < MIN_EXPECTED))[0]
    groups = [np.array([i]) for i in big]
    if small.size:
        if expected[small].sum() >= MIN_EXPECTED or not groups:
            groups.append(small)
        else:
            i = int(np.argmin([expected[g].sum() for g in groups]))
            groups[i] = np.concatenate([groups[i], small])
    return groups


def chi_square(counts: np.ndarray, law: np.ndarray, alpha: float) -> ChiSquare:
    """Chi-square of ``counts`` (over all cells) against ``law`` (same cells)."""
    counts = np.asarray(counts, dtype=np.float64)
    n = float(counts.sum())
    expected = law * n
    groups = bin_groups(law, n)
    o = np.array([counts[g].sum() for g in groups])
    e = np.array([expected[g].sum() for g in groups])
    pooled = int(((law > 0) & (expected < MIN_EXPECTED)).sum())
    dof = len(e) - 1
    stat = float(((o - e) ** 2 / e).sum()) if dof > 0 else 0.0
    threshold = chi2_ppf(1.0 - alpha, dof) if dof > 0 else None
    p_value = chi2_sf(stat, dof) if dof > 0 else 1.0
    return ChiSquare(
        statistic=stat, dof=dof, threshold=threshold, alpha=alpha, samples=int(n),
        p_value=p_value, bins=len(e), pooled_cells=pooled,
        rejected=bool(threshold is not None and stat > threshold),
        tv=total_variation(counts, law), tv_floor=tv_noise_floor(law, n),
    )


def total_variation(counts: np.ndarray, law: np.ndarray) -> float:
    """Total variation between the empirical law of ``counts`` and ``law`` (same cells)."""
    counts = np.asarray(counts, dtype=np.float64)
    n = float(counts.sum())
    return 0.5 * float(np.abs(counts / max(n, 1.0) - law).sum())


def tv_noise_floor(law: np.ndarray, samples: float) -> float:
    """The expected total variation of an exact sampler after ``samples`` draws from ``law``.

    Each cell's empirical frequency is ~ normal(law, law (1 - law) / n), whose
    mean absolute deviation is sqrt(2 law (1 - law) / (pi n)).
    """
    n = max(float(samples), 1.0)
    return 0.5 * float(np.sqrt(2.0 * law * (1.0 - law) / (math.pi * n)).sum())


# ---------------------------------------------------------------- power

DEFAULT_POWER = 0.99


@dataclass
class Power:
    """What a chi-square run at ``samples`` draws could have detected, from its own test.

    Under an alternative law p', Pearson's statistic is approximately non-central
    chi-square with ``dof`` degrees of freedom and non-centrality
    n * sum_bins (p' - p)^2 / p. ``noncentrality`` is the smallest one rejected
    (statistic > threshold) with probability ``power`` (scipy.stats.ncx2).

    min_tv: every law whose total variation from p over the test's bins is at
      least this is rejected with >= ``power``: the least detectable direction at
      TV t has non-centrality n * 4 t^2 (half the mass raised, half lowered, both
      in proportion to p), so min_tv = sqrt(noncentrality / (4 n)).
    rel_error: per bin, the smallest relative error on that bin's probability
      (compensated in proportion over the other bins) rejected with >= ``power``:
      sqrt(noncentrality (1 - p_bin) / (n p_bin)). rel_error_best / rel_error_worst:
      the most and the least probable bin's.
    """

    power: float
    alpha: float
    samples: int
    dof: int
    threshold: float
    noncentrality: float
    min_tv: float
    rel_error: list[float]
    rel_error_best: float
    rel_error_worst: float

    def describe(self) -> str:
        return (f"detects, with {self.power:.0%} power at alpha {self.alpha:g}, any law at TV >="
                f" {self.min_tv:.4g} from the target over {self.dof + 1} bins, or a relative error >="
                f" {self.rel_error_best:.3g} on the most probable bin ({self.rel_error_worst:.3g} on the"
                f" least), at {self.samples} samples")


def noncentrality_for_power(dof: int, threshold: float, power: float = DEFAULT_POWER) -> float:
    """The non-centrality lambda with P(ncx2(dof, lambda) > threshold) = power."""
    hi = max(1.0, threshold)
    while ncx2_sf(threshold, dof, hi) < power:
        hi *= 2.0
    return brentq(lambda lam: ncx2_sf(threshold, dof, lam) - power, 0.0, hi, xtol=1e-9)


def power_statement(law: np.ndarray, samples: int, alpha: float,
                    power: float = DEFAULT_POWER) -> Power | None:
    """The smallest effects a chi-square at ``samples`` draws rejects with ``power`` (None: dof 0)."""
    law = np.asarray(law, dtype=np.float64)
    groups = bin_groups(law, samples)
    dof = len(groups) - 1
    if dof < 1:
        return None
    threshold = chi2_ppf(1.0 - alpha, dof)
    lam = noncentrality_for_power(dof, threshold, power)
    mass = np.array([law[g].sum() for g in groups])
    rel = np.sqrt(lam * (1.0 - mass) / (samples * mass))
    return Power(power=power, alpha=alpha, samples=int(samples), dof=dof, threshold=threshold,
                 noncentrality=lam, min_tv=math.sqrt(lam / (4.0 * samples)),
                 rel_error=[float(x) for x in rel], rel_error_best=float(rel.min()),
                 rel_error_worst=float(rel.max()))


def samples_for_tv(law: np.ndarray, tv: float, alpha: float, power: float = DEFAULT_POWER) -> int:
    """The fewest samples (at least 100) at which :func:`power_statement`'s min_tv is at most ``tv``."""
    if not 0 < tv < 1:
        raise ValueError(f"a TV to detect must be in (0, 1), got {tv}")
    n = 100
    for _ in range(64):  # the bins (so dof and the threshold) depend on n: grow to a fixed point
        st = power_statement(law, n, alpha, power)
        if st is None:
            n *= 4
            continue
        need = math.ceil(st.noncentrality / (4.0 * tv * tv))
        if need <= n:
            return n
        n = need
    return n


def min_detectable_shift(var_sum: float, n: float, alpha: float, power: float = DEFAULT_POWER) -> float:
    """The smallest shift of a mean of ``n`` Bernoullis (variance sum ``var_sum``) that a two-sided
    z test at ``alpha`` detects with ``power`` (normal approximation)."""
    if n <= 0 or var_sum <= 0:
        return math.inf
    return float((norm_isf(alpha / 2.0) + norm_ppf(power)) * math.sqrt(var_sum) / n)


def near_miss_law(law: np.ndarray, samples: int, tv: float) -> np.ndarray:
    """A law at exactly ``tv`` from ``law`` over the test's bins, in its least detectable direction.

    The bins are split into two groups of mass as close to 1/2 as possible; one
    group's cells are raised and the other's lowered, in proportion to ``law``.
    """
    law = np.asarray(law, dtype=np.float64)
    groups = bin_groups(law, samples)
    mass = [float(law[g].sum()) for g in groups]
    up: list[int] = []
    down: list[int] = []
    m_up = m_down = 0.0
    for j in sorted(range(len(groups)), key=lambda j: -mass[j]):
        if m_up <= m_down:
            up.append(j)
            m_up += mass[j]
        else:
            down.append(j)
            m_down += mass[j]
    if tv > m_down:
        raise ValueError(f"TV {tv} exceeds the lowered group's mass {m_down}")
    out = law.copy()
    for j in up:
        out[groups[j]] *= 1.0 + tv / m_up
    for j in down:
        out[groups[j]] *= 1.0 - tv / m_down
    return out / out.sum()


@dataclass
class NearMiss:
    """A control drawn from a law at the run's own min_tv (the power statement checked).

    tv: its TV from the target. predicted_power: ncx2 power at its non-centrality.
    chi: its chi-square. rejected: whether the test rejected it (it must).
    """

    tv: float
    predicted_power: float
    chi: ChiSquare
    rejected: bool


def near_miss_control(law: np.ndarray, samples: int, alpha: float, st: Power,
                      rng: np.random.Generator) -> NearMiss:
    """Draw ``samples`` tokens from a law at ``st.min_tv`` and test them like the rule."""
    alt = near_miss_law(law, samples, st.min_tv)
    counts = rng.multinomial(samples, alt)
    groups = bin_groups(law, samples)
    lam = samples * sum((alt[g].sum() - law[g].sum()) ** 2 / law[g].sum() for g in groups)
    chi = chi_square(counts, law, alpha)
    return NearMiss(tv=st.min_tv, predicted_power=ncx2_sf(st.threshold, st.dof, float(lam)), chi=chi,
                    rejected=chi.rejected)


# -- two samples (the served distribution arms) ---------------------------------------------
@dataclass
class Homogeneity:
    """Pearson chi-square homogeneity of two histograms over the same cells.

    statistic / dof / threshold (chi2.ppf(1 - alpha, dof); None at dof 0) / p_value.
    samples: (n1, n2); n_eff: n1 n2 / (n1 + n2), the one-sample size of equal power.
    bins: bins after pooling cells with expected count (at n_eff) < 5.
    tv: total variation between the two empirical laws. rejected: statistic > threshold.
    """

    statistic: float
    dof: int
    threshold: float | None
    alpha: float
    samples: tuple[int, int]
    n_eff: float
    p_value: float
    bins: int
    rejected: bool
    tv: float


def homogeneity(a: np.ndarray, b: np.ndarray, alpha: float) -> Homogeneity:
    """Chi-square homogeneity of counts ``a`` and ``b`` (same cells), bins as ``stats.bin_groups``."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    n1, n2 = float(a.sum()), float(b.sum())
    pooled = (a + b) / max(n1 + n2, 1.0)
    n_eff = n1 * n2 / max(n1 + n2, 1.0)
    groups = bin_groups(pooled, n_eff)
    oa = np.array([a[g].sum() for g in groups])
    ob = np.array([b[g].sum() for g in groups])
    pg = np.array([pooled[g].sum() for g in groups])
    dof = len(groups) - 1
    stat = float((((oa - n1 * pg) ** 2) / (n1 * pg) + ((ob - n2 * pg) ** 2) / (n2 * pg)).sum()) if dof > 0 else 0.0
    threshold = chi2_ppf(1.0 - alpha, dof) if dof > 0 else None
    tv = 0.5 * float(np.abs(a / max(n1, 1.0) - b / max(n2, 1.0)).sum())
    return Homogeneity(statistic=stat, dof=dof, threshold=threshold, alpha=alpha, samples=(int(n1), int(n2)),
                       n_eff=n_eff, p_value=chi2_sf(stat, dof) if dof > 0 else 1.0, bins=len(groups),
                       rejected=bool(threshold is not None and stat > threshold), tv=tv)
