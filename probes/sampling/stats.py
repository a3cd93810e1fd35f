"""Goodness of fit for sampled tokens: Pearson chi-square, total variation, its noise floor.

Used by ``specparity dist`` (Monte-Carlo draws of a rule) and ``accept
--end-to-end`` (mlx-lm's emitted stream). Nothing here knows about rules.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

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


def chi_square(counts: np.ndarray, law: np.ndarray, alpha: float) -> ChiSquare:
    """Chi-square of ``counts`` (over all cells) against ``law`` (same cells)."""
    from scipy.stats import chi2

    counts = np.asarray(counts, dtype=np.float64)
    n = float(counts.sum())
    expected = law * n
    support = law > 0
    big = support & (expected >= MIN_EXPECTED)
    small = support & ~big
    obs = list(counts[big])
    exp = list(expected[big])
    pooled = int(small.sum())
    if pooled:
        if expected[small].sum() >= MIN_EXPECTED or not exp:
            obs.append(counts[small].sum())
            exp.append(expected[small].sum())
        else:  # the pool itself is rare: fold it into the smallest kept bin
            i = int(np.argmin(exp))
            obs[i] += counts[small].sum()
            exp[i] += expected[small].sum()
    o, e = np.array(obs), np.array(exp)
    dof = len(e) - 1
    stat = float(((o - e) ** 2 / e).sum()) if dof > 0 else 0.0
    threshold = float(chi2.ppf(1.0 - alpha, dof)) if dof > 0 else None
    p_value = float(chi2.sf(stat, dof)) if dof > 0 else 1.0
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
