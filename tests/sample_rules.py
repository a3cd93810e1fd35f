"""User acceptance rules for ``specparity dist --rule tests/sample_rules.py:NAME`` tests.

Each follows the documented per-sample signature (probes/sampling/rules.py): written the
way an engine author would, with no help from the toolkit.
"""

from __future__ import annotations

import numpy as np


def _draw(weights: np.ndarray, rng: np.random.Generator) -> int:
    cdf = np.cumsum(weights)
    return int(np.searchsorted(cdf, (1.0 - rng.random()) * cdf[-1], side="left"))


def mrs(p, q, draft, rng):
    """Modified rejection sampling, one position (lossless)."""
    if p[draft] > 0 and rng.random() * q[draft] <= p[draft]:
        return draft
    return _draw(np.maximum(p - q, 0.0), rng)


mrs.residual = True


def mrs_chain(p, q, drafts, rng):
    """Modified rejection sampling over k drafts, then a bonus token (lossless)."""
    out = []
    for i, d in enumerate(drafts):
        d = int(d)
        if p[i, d] > 0 and rng.random() * q[i, d] <= p[i, d]:
            out.append(d)
            continue
        out.append(_draw(np.maximum(p[i] - q[i], 0.0), rng))
        return out
    out.append(_draw(p[len(drafts)], rng))
    return out


mrs_chain.residual = True


def mrs_vectorized(P, Q, drafts, rng):
    """Modified rejection sampling over a batch (declares itself vectorized)."""
    n = len(drafts)
    rows = np.arange(n)
    pd, qd = P[rows, drafts], Q[rows, drafts]
    acc = (pd > 0) & (rng.random(n) * qd <= pd)
    r = np.maximum(P - Q, 0.0)
    cdf = np.cumsum(r, axis=1)
    t = (1.0 - rng.random(n)) * cdf[:, -1]
    res = (cdf < t[:, None]).sum(axis=1)
    return np.where(acc, drafts, res)


mrs_vectorized.vectorized = True
mrs_vectorized.residual = True


def resample_from_p(p, q, draft, rng):
    """A biased rule: on a rejection it resamples from p instead of the residual."""
    if p[draft] > 0 and rng.random() * q[draft] <= p[draft]:
        return draft
    return _draw(p, rng)


def first_position_only_chain(p, q, drafts, rng):
    """A chain rule that is exact at position 0 and wrong afterwards: it accepts the
    second draft whenever the first was accepted (no test at position 1)."""
    d0 = int(drafts[0])
    if not (p[0, d0] > 0 and rng.random() * q[0, d0] <= p[0, d0]):
        return [_draw(np.maximum(p[0] - q[0], 0.0), rng)]
    return [d0] + [int(d) for d in drafts[1:]] + [_draw(p[len(drafts)], rng)]


def raises(p, q, draft, rng):
    """A rule with a bug that raises."""
    raise RuntimeError("boom")


SUBTLE_EPS = 0.015


def subtle_residual(P, Q, drafts, rng):
    """Modified rejection sampling whose residual is subtly tilted: the most probable token's
    residual weight is raised by 1.5 %, every other's lowered by 1.5 % (total variation about 1.5x
    the default run's noise floor)."""
    n = len(drafts)
    rows = np.arange(n)
    pd, qd = P[rows, drafts], Q[rows, drafts]
    acc = (pd > 0) & (rng.random(n) * qd <= pd)
    top = np.arange(P.shape[1])[None, :] == np.argmax(P, axis=1)[:, None]
    r = np.maximum(P - Q, 0.0) * np.where(top, 1.0 + SUBTLE_EPS, 1.0 - SUBTLE_EPS)
    cdf = np.cumsum(r, axis=1)
    t = (1.0 - rng.random(n)) * cdf[:, -1]
    res = (cdf < t[:, None]).sum(axis=1)
    return np.where(acc, drafts, res)


subtle_residual.vectorized = True
subtle_residual.residual = True
