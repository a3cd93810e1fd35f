"""Statements of power: what a dist / accept pass could have detected, checked by near misses."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli
from specparity.probes.sampling import dist, stats
from specparity.probes.sampling.accept import measure
from specparity.probes.sampling.rules import resolve_rule
from specparity.verdicts import Verdict

TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def prob() -> dist.Problem:
    return dist.make_problem()


def test_smallest_detectable_tv_at_the_default_size_and_at_2m(prob):
    at_default = stats.power_statement(prob.p, dist.DEFAULT_SAMPLES, dist.DEFAULT_ALPHA)
    at_2m = stats.power_statement(prob.p, 2_000_000, dist.DEFAULT_ALPHA)
    assert at_default is not None and at_2m is not None  # None: a law with dof 0
    assert at_default.dof == at_2m.dof == 5
    # P(ncx2(5, lambda) > chi2.ppf(1 - 1e-4, 5)) = 0.99
    assert at_default.noncentrality == pytest.approx(49.93, abs=0.01)
    assert at_default.min_tv == pytest.approx(0.0079, abs=5e-5)
    assert at_2m.min_tv == pytest.approx(0.0025, abs=5e-5)
    assert at_default.rel_error_best < at_default.rel_error_worst
    # --detect-tv inverts it
    n = stats.samples_for_tv(prob.p, 0.0025, dist.DEFAULT_ALPHA)
    assert 1_990_000 < n < 2_000_000
    at_n = stats.power_statement(prob.p, n, dist.DEFAULT_ALPHA)
    assert at_n is not None and at_n.min_tv <= 0.0025


def test_near_miss_at_min_tv_is_rejected_at_the_stated_power_and_half_of_it_is_not(prob):
    n, alpha = dist.DEFAULT_SAMPLES, dist.DEFAULT_ALPHA
    st = stats.power_statement(prob.p, n, alpha)
    assert st is not None
    hits = [stats.near_miss_control(prob.p, n, alpha, st, np.random.default_rng(i)).rejected
            for i in range(400)]
    assert np.mean(hits) >= 0.97  # stated 0.99
    half = stats.Power(**{**st.__dict__, "min_tv": st.min_tv / 2})
    hits = [stats.near_miss_control(prob.p, n, alpha, half, np.random.default_rng(i)).rejected
            for i in range(400)]
    assert np.mean(hits) < 0.5  # the statement is tight, not vacuous
    alt = stats.near_miss_law(prob.p, n, 0.01)
    assert 0.5 * np.abs(alt - prob.p).sum() == pytest.approx(0.01)
    assert np.all(alt[prob.p == 0] == 0)  # the near miss stays on the support


def _subtle_law(prob) -> np.ndarray:
    """The exact emitted law of sample_rules.subtle_residual."""
    import sample_rules

    p, q = prob.p, prob.q
    r = np.maximum(p - q, 0.0)
    r = r * np.where(np.arange(p.size) == np.argmax(p), 1 + sample_rules.SUBTLE_EPS, 1 - sample_rules.SUBTLE_EPS)
    return np.minimum(p, q) + (1.0 - np.minimum(p, q).sum()) * r / r.sum()


def test_subtle_rule_passes_only_below_the_stated_reach_and_detect_tv_catches_it(monkeypatch, prob):
    monkeypatch.syspath_prepend(str(TESTS))
    rule = resolve_rule("sample_rules:subtle_residual")
    tv = 0.5 * np.abs(_subtle_law(prob) - prob.p).sum()
    floor = stats.tv_noise_floor(prob.p, dist.DEFAULT_SAMPLES)
    assert 1.4 * floor < tv < 1.6 * floor  # 1.5x the default run's noise floor

    rep = dist.run_dist(rule, prob)  # default size: the bare pass the issue reports ...
    assert rep.verdict == Verdict.PASS, rep.reason
    # ... now states that it could not have seen this rule
    assert rep.power is not None and rep.near_miss is not None
    assert rep.power.min_tv > tv and f"TV >= {rep.power.min_tv:.4g}" in rep.reason
    assert rep.near_miss.rejected

    n = dist.samples_to_detect(prob, tv)
    rep = dist.run_dist(rule, prob, samples=n, controls=[], detect_tv=tv)
    assert rep.verdict == Verdict.DIVERGENT and rep.arms[0].chi.rejected
    assert f"sized by --detect-tv {tv:g}: {n} samples per arm" in dist.render_text(rep)


def test_accept_measurement_states_its_reach_and_a_shift_of_that_size_is_seen():
    rng = np.random.default_rng(0)
    alphas = rng.uniform(0.2, 0.8, 400)
    m = measure("simulated", "x", "sum_min", int(alphas.sum()), 400, 800, 200, alphas, alphas * 0.5, 1e-4)
    want = (3.8906 + 2.3263) * math.sqrt((alphas * (1 - alphas)).sum()) / 400
    assert m.min_shift == pytest.approx(want, rel=1e-3)
    seen = []
    for _ in range(300):  # acceptances shifted by exactly min_shift are off the form
        acc = int((rng.random(400) < alphas + m.min_shift).sum())
        seen.append(measure("simulated", "x", "sum_min", acc, 400, 800, 200, alphas, alphas * 0.5,
                            1e-4).sits_on != "sum_min")
    assert np.mean(seen) >= 0.97


def test_cli_detect_tv(cli_bin):
    r = run_cli(cli_bin, "dist", "--detect-tv", "0.02", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["detect_tv"] == 0.02 and out["power"]["min_tv"] <= 0.02 and out["samples"] < 40_000
    assert out["near_miss"]["rejected"] and "needs" in r.stderr
    r = run_cli(cli_bin, "dist", "--detect-tv", "0.02", "--samples", "1000")
    assert r.returncode == 2 and "Error: give --samples or --detect-tv, not both" in r.stderr
    r = run_cli(cli_bin, "dist", "--detect-tv", "0.7")
    assert r.returncode == 2 and "Error: --detect-tv 0.7: must be in (0, 0.5)" in r.stderr
