"""specparity dist: lossless rules pass, known-wrong ones are caught, with power shown."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import chi2

from conftest import assert_report, run_cli
from specparity.errors import UsageError
from specparity.probes.sampling import dist, montecarlo, stats
from specparity.probes.sampling.rules import ALL_NAMED, BUILTIN, CONTROLS, Rule, reference, resolve_rule
from specparity.verdicts import Verdict

TESTS = Path(__file__).resolve().parents[1]
SAMPLE_RULES = TESTS / "sample_rules.py"


@pytest.fixture(scope="module")
def prob() -> dist.Problem:
    return dist.make_problem()


def test_default_problem_has_dof_5_and_exact_threshold(prob):
    assert prob.p[6] == 0 and prob.p[7] == 0  # top-k 6
    assert prob.q[6] == 0 and prob.q[7] == 0  # float32 underflow
    rep = dist.run_dist(BUILTIN["mrs"], prob, samples=20_000)
    c = rep.arms[0].chi
    assert c.dof == 5 and c.samples == 20_000
    assert c.threshold == pytest.approx(chi2.ppf(1 - 1e-4, 5))
    assert c.threshold is not None and 25 < c.threshold < 26


@pytest.mark.parametrize("name", ["mrs", "sampler-match", "greedy-delta"])
def test_builtin_lossless_rules_pass_and_every_control_is_rejected(prob, name):
    rep = dist.run_dist(BUILTIN[name], prob)
    text = dist.render_text(rep)
    print(text)
    assert rep.verdict == Verdict.PASS and rep.exit_code == 0, rep.reason
    rule, *controls = rep.arms
    assert rule.chi.threshold is not None and rule.chi.statistic < rule.chi.threshold
    assert rule.support_violation is None and rule.residual_violation is None
    assert [a.name for a in controls] == list(CONTROLS)
    for a in controls:
        assert a.verdict == dist.REJECTED
        assert a.chi.threshold is not None
        assert a.chi.statistic > 100 * a.chi.threshold  # far past it, not by luck
        # each control's statistic is printed beside the threshold, dof and n
        assert f"{a.name}" in text and "threshold 25.7 (dof 5, n 200000" in text
    # the measured acceptance sits on the rule's closed form
    form = {"mrs": rule.sum_min, "sampler-match": rule.sum_prod, "greedy-delta": rule.sum_min}
    assert rule.acceptance == pytest.approx(form[name], abs=0.005)


@pytest.mark.parametrize("name", list(CONTROLS) + ["greedy"])
def test_known_wrong_rule_under_test_is_divergent(prob, name):
    rep = dist.run_dist(ALL_NAMED[name], prob, samples=50_000)
    assert rep.verdict == Verdict.DIVERGENT and rep.exit_code == 1
    assert rep.arms[0].verdict == Verdict.DIVERGENT
    assert "divergent" in dist.render_text(rep)


def test_residual_check_names_the_first_resample_with_p_le_q(prob):
    rep = dist.run_dist(CONTROLS["resample-from-p"], prob, samples=50_000)
    v = rep.arms[0].residual_violation
    assert v is not None and v.check == "residual" and v.phase == "monte_carlo"
    assert prob.p[v.token] <= prob.q[v.token]
    assert v.p == pytest.approx(prob.p[v.token]) and v.q == pytest.approx(prob.q[v.token])
    assert f"Monte-Carlo draw {v.draw}" in dist.render_text(rep)


def test_support_violation_fires_on_the_rule_without_the_p_gt_0_conjunct(prob):
    rep = dist.run_dist(ALL_NAMED["mrs-no-support-guard"], prob)
    rule = rep.arms[0]
    # its token histogram is perfect: no goodness-of-fit test can see this bug
    assert not rule.chi.rejected
    v = rule.support_violation
    assert v is not None and v.phase == "sweep"
    # the first offending draw: the first forced draft with p = q = 0 is token 6,
    # accepted on its first draw, i.e. sweep draw 6 * 256
    assert (v.token, v.draft, v.draw, v.p, v.q) == (6, 6, 6 * dist.DEFAULT_SWEEP_DRAWS, 0.0, 0.0)
    assert rep.verdict == Verdict.DIVERGENT
    assert "sweep draw 1536 (forced draft token 6)" in rep.reason
    assert "emitted token 6 with p=0 q=0, outside the target's filtered support" in rep.reason
    # the same sweep is silent on the rule with the conjunct
    ok = dist.run_dist(BUILTIN["mrs"], prob)
    assert ok.arms[0].support_violation is None and ok.verdict == Verdict.PASS


def test_support_check_names_the_first_offending_monte_carlo_draw():
    # top-p filtering drops tokens the drafter does propose (q > 0 there)
    prob = dist.make_problem([2.0, 1.0, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0], temperature=1.0,
                             top_p=0.8)
    assert prob.p[3] == 0 and prob.q[3] > 0

    def accept_all(p, q, draft, rng):
        """Accepts every draft."""
        return draft

    rule = Rule("accept-all", "accepts every draft", lossless=True, per_sample=accept_all)
    rng = np.random.default_rng(0)
    checker = montecarlo.Checker(rule, "monte_carlo")
    montecarlo.simulate(rule, prob, 2000, rng, checker)
    v = checker.support
    assert v is not None
    # recompute the same drafts: the violation is the first draw that drafted a p = 0 token
    drafts = montecarlo.draw_drafts(rule, prob.q, 2000, np.random.default_rng(0))
    first = int(np.nonzero(prob.p[drafts] == 0)[0][0])
    assert (v.draw, v.token) == (first, int(drafts[first]))


@pytest.mark.slow
def test_joint_test_of_a_chain_sees_what_the_first_token_cannot(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    prob = dist.make_problem(num_draft=2)
    good = dist.run_dist(BUILTIN["mrs"], prob)
    assert good.verdict == Verdict.PASS and good.law == "joint 2-prefix"
    assert good.arms[0].chi.dof == 35
    user_good = dist.run_dist(resolve_rule("sample_rules:mrs_chain"), prob, samples=20_000)
    assert user_good.verdict == Verdict.PASS, user_good.reason
    bad = dist.run_dist(resolve_rule("sample_rules:first_position_only_chain"), prob,
                        samples=20_000)
    assert bad.verdict == Verdict.DIVERGENT
    # its first emitted token alone is exact: only the joint law exposes it
    rng = np.random.default_rng(1)
    mc = montecarlo.simulate(resolve_rule("sample_rules:first_position_only_chain"), prob, 20_000, rng)
    first = mc.counts.reshape(prob.vocab, prob.vocab).sum(axis=1)
    assert not stats.chi_square(first, prob.p, 1e-4).rejected


def test_user_rule_by_module_path_in_process(monkeypatch, prob):
    monkeypatch.syspath_prepend(str(TESTS))
    for spec in ("sample_rules:mrs", "sample_rules:mrs_vectorized"):
        rep = dist.run_dist(resolve_rule(spec), prob, samples=20_000)
        assert rep.verdict == Verdict.PASS, rep.reason
    bad = dist.run_dist(resolve_rule("sample_rules:resample_from_p"), prob, samples=20_000)
    assert bad.verdict == Verdict.DIVERGENT
    assert resolve_rule("sample_rules:mrs_vectorized").vectorized


def test_reference_per_sample_form_matches_the_vectorized_law(prob):
    one = reference(BUILTIN["mrs"])
    rng = np.random.default_rng(3)
    drafts = montecarlo.draw_drafts(BUILTIN["mrs"], prob.q, 4000, rng)
    out = [one(prob.p, prob.q, int(d), rng) for d in drafts]
    assert not stats.chi_square(np.bincount(out, minlength=prob.vocab), prob.p, 1e-4).rejected


def test_underpowered_run_is_inconclusive_never_a_pass(prob):
    rep = dist.run_dist(BUILTIN["mrs"], prob, samples=300)
    assert rep.verdict == Verdict.INCONCLUSIVE and rep.exit_code == 3
    assert_report(rep)
    assert "drafted-only-residual" in rep.reason


def test_a_temperature_too_small_for_the_arithmetic_is_an_input_error_not_a_nan_law():
    from specparity.errors import InputError

    with pytest.raises(InputError, match="temperature 1e-40: too small") as err:
        dist.make_problem(temperature=1e-40)  # logits / T overflow float32: the law would be NaN
    assert err.value.param == "temperature"
    with pytest.raises(InputError, match="overflows float64"):
        dist.softmax64(np.array([3.0, 1.0]), 1e-308)
    tiny = dist.make_problem(temperature=1e-30)  # no overflow: the law is one token, exactly
    p = dist.softmax32(tiny.target_logits, tiny.temperature)
    assert np.isfinite(p).all() and sorted(p.tolist())[-1] == 1.0


def test_temperature_zero_is_the_exact_check():
    prob = dist.make_problem(temperature=0)
    rep = dist.run_dist(BUILTIN["greedy"], prob, samples=10_000)
    assert rep.verdict == Verdict.PASS and not rep.controls_run and len(rep.arms) == 1
    bad = dist.run_dist(ALL_NAMED["mrs-no-support-guard"], prob, samples=10_000)
    assert bad.verdict == Verdict.DIVERGENT and bad.arms[0].support_violation is not None


def test_chi_square_pools_rare_cells():
    law = np.array([0.5, 0.49, 0.004, 0.004, 0.002, 0.0])
    counts = np.array([500, 490, 4, 4, 2, 0])
    c = stats.chi_square(counts, law, 1e-4)
    assert c.pooled_cells == 3 and c.bins == 3 and c.dof == 2
    assert c.statistic == pytest.approx(0.0)


# ---------------------------------------------------------------- the CLI


def test_cli_pass_and_json(cli_bin, repo_root):
    r = run_cli(cli_bin, "dist", "--rule", "mrs", "--json", cwd=str(repo_root))
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["verdict"] == "pass" and d["seed"] == 0 and d["exit_code"] == 0
    assert [a["verdict"] for a in d["arms"][1:]] == ["rejected"] * 3


def test_cli_user_rule_from_a_file_path(cli_bin, repo_root, tmp_path):
    r = run_cli(cli_bin, "dist", "--rule", "tests/sample_rules.py:mrs", "--samples", "50000",
                "--record-dir", str(tmp_path / "rec"), cwd=str(repo_root))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verdict: pass" in r.stdout
    mds = list((tmp_path / "rec").glob("dist-mrs-*.md"))
    assert len(mds) == 1 and "verdict: pass" in mds[0].read_text()
    data = tmp_path / "rec" / "data" / mds[0].stem
    assert {p.name for p in data.iterdir()} >= {"identity.json", "rule.jsonl", "control.jsonl",
                                                 "report.json"}


def test_cli_user_rule_by_module_path_divergent(cli_bin, repo_root):
    r = run_cli(cli_bin, "dist", "--rule", "sample_rules:resample_from_p", "--samples", "20000",
                env={"PYTHONPATH": str(TESTS)}, cwd=str(repo_root))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "divergent" in r.stdout


def test_cli_underpowered_exit_3(cli_bin):
    r = run_cli(cli_bin, "dist", "--samples", "300")
    assert r.returncode == 3 and "inconclusive" in r.stdout


@pytest.mark.parametrize("args, needle", [
    (["--rule", "nope"], "--rule 'nope': not a built-in rule"),
    (["--rule", "a:b:"], "malformed"),
    (["--rule", "no_such_module_xyz:f"], "no module named 'no_such_module_xyz'"),
    (["--rule", "no/such/file.py:f"], "no such file"),
    (["--rule", f"{SAMPLE_RULES}:missing"], "has no attribute 'missing'"),
    (["--rule", f"{SAMPLE_RULES}:raises"], "raised RuntimeError at draw 0"),
    (["--temperature", "-1"], "--temperature -1.0: must be a finite number >= 0"),
    (["--temperature", "nan"], "--temperature nan"),
    (["--temperature", "1e-40"], "--temperature 1e-40: too small for these logits"),  # was NaN laws, 'pass'
    (["--target-logits", "1,2,x", "--draft-logits", "1,2,3"], "'x' is not a number"),
    (["--target-logits", "1,2,3", "--draft-logits", "1,2"], "has 3 entries"),
    (["--target-logits", "1,2,3"], "go together"),
    (["--samples", "10"], "--samples 10"),
    (["--alpha", "2"], "--alpha 2"),
])
def test_cli_bad_input_is_one_line_exit_2(cli_bin, args, needle):
    r = run_cli(cli_bin, "dist", *args)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("Error: ") and needle in lines[-1], r.stderr
    assert "Traceback" not in r.stderr


def test_resolve_rule_errors_are_usage_errors():
    with pytest.raises(UsageError, match="malformed"):
        resolve_rule(":f")
