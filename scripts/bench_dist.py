"""Bench figures for ``specparity dist`` (one per line, ``name: value unit``).

    mc_draws_per_second_<rule>: vectorized single-position Monte Carlo on the
        default 8-token problem (draft from q, rule decision, residual resample,
        histogram), best of 3 runs of 5 million draws each
    dist_default_wall: wall time of the default ``specparity dist`` test in process (rule
        mrs, 200000 samples, the three known-wrong controls and the support sweep)
    dist_default_cli_wall: the same as a fresh ``specparity dist`` process (imports included)

Run: .venv/bin/python -P scripts/bench_dist.py
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from specparity.probes.sampling import dist, montecarlo
from specparity.probes.sampling.rules import BUILTIN
from specparity.verdicts import Verdict

DRAWS = 5_000_000


def main() -> None:
    prob = dist.make_problem()
    for name in ("mrs", "sampler-match"):
        best = float("inf")
        for rep in range(3):
            rng = np.random.default_rng(rep)
            t0 = time.perf_counter()
            montecarlo.simulate(BUILTIN[name], prob, DRAWS, rng)
            best = min(best, time.perf_counter() - t0)
        print(f"mc_draws_per_second_{name.replace('-', '_')}: {DRAWS / best:.3g} draws/s")
    dist.run_dist(BUILTIN["mrs"], prob, samples=1000)  # warm imports (scipy)
    t0 = time.perf_counter()
    report = dist.run_dist(BUILTIN["mrs"], prob)
    wall = time.perf_counter() - t0
    assert report.verdict == Verdict.PASS, report.reason
    print(f"dist_default_wall: {wall:.3f} s")
    exe = Path(sys.executable).parent / "specparity"
    t0 = time.perf_counter()
    subprocess.run([str(exe), "dist"], check=True, capture_output=True, timeout=300)
    print(f"dist_default_cli_wall: {time.perf_counter() - t0:.2f} s")


if __name__ == "__main__":
    main()
