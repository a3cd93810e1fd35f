"""probes/sampling/laws.py returns what scipy.stats and scipy.optimize return, to the bit, without
importing them (a ``dist`` run's CPU time halves: scipy.stats alone is ~1.9 s to import)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from scipy.optimize import brentq as scipy_brentq
from scipy.stats import chi2, ncx2, norm

from specparity.probes.sampling import laws


@pytest.mark.parametrize("dof", [1, 2, 5, 20, 100, 511])
def test_chi_square_and_its_non_central_tail_are_scipys(dof: int) -> None:
    for alpha in (0.05, 1e-4, 1e-9):
        threshold = float(chi2.ppf(1 - alpha, dof))
        assert laws.chi2_ppf(1 - alpha, dof) == threshold
        for x in (0.0, 0.5, threshold, 3 * threshold):
            assert laws.chi2_sf(x, dof) == float(chi2.sf(x, dof))
        for power in (0.5, 0.99):
            hi = max(1.0, threshold)
            while ncx2.sf(threshold, dof, hi) < power:
                hi *= 2.0
            for lam in (0.0, 0.3, hi / 2, hi):
                assert laws.ncx2_sf(threshold, dof, lam) == float(ncx2.sf(threshold, dof, lam))
            ours = laws.brentq(lambda lam: laws.ncx2_sf(threshold, dof, lam) - power, 0.0, hi, xtol=1e-9)
            assert ours == float(scipy_brentq(lambda lam: ncx2.sf(threshold, dof, lam) - power, 0.0, hi, xtol=1e-9))


def test_normal_quantiles_are_scipys() -> None:
    for q in (1e-9, 0.005, 0.5, 0.99, 0.999999):
        assert laws.norm_ppf(q) == float(norm.ppf(q)) and laws.norm_isf(q) == float(norm.isf(q))


def test_brentq_takes_scipys_steps_on_other_functions_and_refuses_what_scipy_refuses() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        c, k = rng.uniform(-5, 5), rng.uniform(0.1, 3)

        def f(x: float, c: float = c, k: float = k) -> float:
            return float(np.tanh(k * (x - c)) + 0.1 * (x - c) ** 3)

        assert laws.brentq(f, -10, 10) == float(scipy_brentq(f, -10, 10))
    with pytest.raises(ValueError, match="different signs"):
        laws.brentq(lambda x: x * x + 1, -1, 1)
    with pytest.raises(RuntimeError, match="no convergence"):
        laws.brentq(lambda x: x - 0.3, 0, 1, maxiter=1)


def test_the_statistics_import_no_scipy_stats_or_optimize() -> None:
    code = ("import sys, numpy as np\n"
            "from specparity.probes.sampling import stats\n"
            "st = stats.power_statement(np.array([0.5, 0.3, 0.2]), 10000, 1e-4)\n"
            "stats.chi_square(np.array([5000, 3000, 2000]), np.array([0.5, 0.3, 0.2]), 1e-4)\n"
            "stats.min_detectable_shift(1.0, 100, 0.01)\n"
            "print(sorted(m for m in sys.modules if m.startswith(('scipy.stats', 'scipy.optimize'))))\n")
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
