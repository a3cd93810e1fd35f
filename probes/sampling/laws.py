"""The few distribution functions the statistical tests read, without importing scipy.stats.

``dist``, ``accept`` and the served distribution arms each need a chi-square
quantile and tail, a non-central chi-square tail, two normal quantiles and a
root finder. Importing ``scipy.stats`` costs about 1.9 CPU seconds and
``scipy.optimize`` 1.0 (a ``dist`` run computes for 1.1); ``scipy.special``
costs 0.8. Each function here is the ufunc that scipy.stats' own method calls
for these arguments (scipy 1.17: ``chi2._ppf``, ``chi2._sf``, ``ncx2._sf``,
``norm._ppf``, ``norm._isf``), so it returns the same bits; :func:`brentq` is
scipy's ``brentq`` (Brent's method as in its ``brentq.c``), the same steps in
Python. ``tests/probes/test_laws.py`` holds each against scipy.stats and
scipy.optimize.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

# scipy.optimize.brentq's defaults
RTOL = 4 * 2.220446049250313e-16
MAXITER = 100


def chi2_ppf(q: float, dof: float) -> float:
    """``scipy.stats.chi2.ppf(q, dof)``, for 0 < q < 1."""
    from scipy.special import gammaincinv

    return float(2 * gammaincinv(dof / 2, q))


def chi2_sf(x: float, dof: float) -> float:
    """``scipy.stats.chi2.sf(x, dof)``."""
    from scipy.special import chdtrc

    return 1.0 if x <= 0 else float(chdtrc(dof, x))


def ncx2_sf(x: float, dof: float, nc: float) -> float:
    """``scipy.stats.ncx2.sf(x, dof, nc)``, for x > 0 and nc >= 0 (the central law's at nc 0)."""
    if nc == 0:
        return chi2_sf(x, dof)
    import numpy as np

    with np.errstate(over="ignore"):
        return float(_ncx2_sf()(x, dof, nc))


def _ncx2_sf() -> Callable[..., Any]:
    """The Boost ufunc ``ncx2._sf`` calls (scipy keeps it in ``scipy.special._ufuncs``); where a
    scipy has none, scipy.stats' own method."""
    import scipy.special

    found = getattr(getattr(scipy.special, "_ufuncs", None), "_ncx2_sf", None)
    if found is not None:
        return found
    from scipy.stats import ncx2

    return ncx2.sf


def norm_ppf(q: float) -> float:
    """``scipy.stats.norm.ppf(q)``."""
    from scipy.special import ndtri

    return float(ndtri(q))


def norm_isf(q: float) -> float:
    """``scipy.stats.norm.isf(q)``."""
    from scipy.special import ndtri

    return float(-ndtri(q))


def brentq(f: Callable[[float], float], a: float, b: float, xtol: float = 2e-12, rtol: float = RTOL,
           maxiter: int = MAXITER) -> float:
    """A root of ``f`` in [a, b] (f(a) and f(b) of opposite signs), as ``scipy.optimize.brentq`` finds it.

    Each step keeps the root bracketed between the current estimate and a "block"
    point, and tries inverse quadratic (or secant) interpolation, taking the
    step only while it shrinks fast enough; otherwise it bisects.
    """
    if xtol <= 0 or rtol < RTOL:
        raise ValueError(f"xtol {xtol} must be > 0 and rtol {rtol} >= {RTOL}")
    xpre, xcur = float(a), float(b)
    fpre, fcur = float(f(xpre)), float(f(xcur))
    if fpre == 0:
        return xpre
    if fcur == 0:
        return xcur
    if math.copysign(1.0, fpre) == math.copysign(1.0, fcur):
        raise ValueError("f(a) and f(b) must have different signs")
    xblk = fblk = spre = scur = 0.0
    for _ in range(maxiter):
        if fpre != 0 and fcur != 0 and math.copysign(1.0, fpre) != math.copysign(1.0, fcur):
            xblk, fblk = xpre, fpre
            spre = scur = xcur - xpre
        if abs(fblk) < abs(fcur):
            xpre, xcur, xblk = xcur, xblk, xcur
            fpre, fcur, fblk = fcur, fblk, fcur
        delta = (xtol + rtol * abs(xcur)) / 2
        sbis = (xblk - xcur) / 2
        if fcur == 0 or abs(sbis) < delta:
            return xcur
        if abs(spre) > delta and abs(fcur) < abs(fpre):
            if xpre == xblk:  # interpolate (secant)
                stry = -fcur * (xcur - xpre) / (fcur - fpre)
            else:  # extrapolate (inverse quadratic)
                dpre = (fpre - fcur) / (xpre - xcur)
                dblk = (fblk - fcur) / (xblk - xcur)
                stry = -fcur * (fblk * dblk - fpre * dpre) / (dblk * dpre * (fblk - fpre))
            if 2 * abs(stry) < min(abs(spre), 3 * abs(sbis) - delta):  # a good short step
                spre, scur = scur, stry
            else:
                spre = scur = sbis
        else:
            spre = scur = sbis
        xpre, fpre = xcur, fcur
        xcur += scur if abs(scur) > delta else (delta if sbis > 0 else -delta)
        fcur = float(f(xcur))
    raise RuntimeError(f"brentq: no convergence in {maxiter} iterations")
