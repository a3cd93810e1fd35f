"""specparity accept: mlx-lm's measured acceptance on its closed form, and its stream on p."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import assert_report, run_cli
from specparity.probes.sampling import accept as am
from specparity.probes.sampling import dist, stats
from specparity.probes.sampling import accept_e2e as ee
from specparity.probes.sampling.rules import ALL_NAMED, BUILTIN, closed_forms
from specparity.verdicts import Verdict


@pytest.fixture(scope="module")
def e2e(fixture_root) -> ee.EndToEndReport:
    """mlx-lm's speculative_generate_step at T = 0.7 on the constant-logits pair, in process."""
    return ee.run_end_to_end(temperature=0.7, root=fixture_root)


@pytest.mark.model
@pytest.mark.slow
def test_mlx_lm_speculative_stream_at_t07_is_exact(e2e):
    text = ee.render_end_to_end(e2e)
    print(text)
    assert e2e.verdict == Verdict.PASS and e2e.exit_code == 0, e2e.reason
    assert_report(e2e)
    assert e2e.tokens == ee.E2E_TOKENS and sum(e2e.counts) == e2e.tokens
    assert e2e.live_tokens == list(range(10, 16)) and e2e.outside_support is None
    stream, *controls = e2e.arms
    assert stream.chi.dof == 5 and not stream.chi.rejected
    assert [a.verdict for a in controls] == [dist.REJECTED] * 3
    for a in controls:  # printed beside the threshold at the same sample size
        assert a.chi.samples == e2e.tokens and a.chi.statistic > a.chi.threshold
        assert a.name in text
    # the drafter was really used: drafts were accepted, at the sampler-match rate
    m = e2e.acceptance
    assert m.accepted > 50 and m.sits_on == "sum_prod" and m.verdict == am.OK


@pytest.mark.model
@pytest.mark.slow
def test_end_to_end_stream_test_would_notice_a_wrong_p(e2e):
    # The same emitted stream against the law mlx-lm would sample at T = 1.0 instead
    # of 0.7, and against p with two tokens swapped: both rejected.
    live = np.array(ee.E2E_TARGET)
    p_t1 = np.exp(live) / np.exp(live).sum()
    assert stats.chi_square(np.array(e2e.counts), p_t1, 1e-4).rejected
    swapped = np.array(e2e.p)[[1, 0, 2, 3, 4, 5]]
    assert stats.chi_square(np.array(e2e.counts), swapped, 1e-4).rejected


@pytest.fixture(scope="module")
def real(llama_pair) -> am.AcceptReport:
    return am.run_accept(
        llama_pair.target, llama_pair.draft, temperature=0.1, positions=96,
        rules=[BUILTIN["sampler-match"], BUILTIN["mrs"], BUILTIN["greedy-delta"],
               ALL_NAMED["resample-from-p"], BUILTIN["greedy"]],
        draws=400,
    )


@pytest.mark.model
@pytest.mark.slow
def test_mlx_lm_acceptance_sits_on_sum_prod(real):
    print(am.render_accept(real))
    mlx = real.measurements[0]
    assert mlx.source == am.MLX_LM and mlx.tested == real.positions_tested >= 96
    # the two forms are far apart here, so "sits on" is decisive
    assert real.mean_sum_min - real.mean_sum_prod > 0.2
    assert mlx.sits_on == "sum_prod" and mlx.verdict == am.OK
    assert mlx.accepted == sum(1 for p in real.per_position if p["accepted"])
    assert 0 < mlx.acceptance_rate <= mlx.per_position_acceptance
    assert mlx.mean_accepted_len == pytest.approx(mlx.accepted / mlx.rounds)
    assert real.inconsistent == []


@pytest.mark.model
@pytest.mark.slow
def test_simulated_rules_sit_on_their_forms_and_a_wrong_one_is_flagged(real):
    by = {m.rule: m for m in real.measurements[1:]}
    assert by["sampler-match"].sits_on == "sum_prod"
    assert by["mrs"].sits_on == "sum_min"
    assert by["greedy-delta"].verdict == am.OK  # one-hot q: both forms are p(argmax q)
    # resample-from-p accepts like mrs: acceptance cannot see its bias (dist can)
    assert by["resample-from-p"].sits_on == "sum_min"
    assert by["greedy"].sits_on == "neither" and by["greedy"].verdict == Verdict.DIVERGENT
    assert real.verdict == Verdict.DIVERGENT and real.exit_code == 1
    assert_report(real)
    assert real.reason.startswith("greedy (simulated) sits on neither")


def test_inconsistent_pair_is_flagged():
    p = np.array([[0.5, 0.5], [0.9, 0.1]])
    q_ok = np.array([[0.2, 0.8], [0.5, 0.5]])
    q_bad = np.array([[1.5, 1.5], [0.5, 0.5]])  # not a distribution
    assert am.inconsistent_positions(*closed_forms(p, q_ok)) == []
    assert am.inconsistent_positions(*closed_forms(p, q_bad)) == [0]


@pytest.mark.model
def test_cli_accept_default_rules_pass_with_record(cli_bin, llama_pair, tmp_path):
    r = run_cli(cli_bin, "accept", "--model", llama_pair.target, "--draft-model",
                llama_pair.draft, "--temperature", "0.1", "--positions", "48", "--draws", "200",
                "--json", "--record-dir", str(tmp_path / "rec"))
    assert r.returncode == 0, r.stdout + r.stderr
    d = json.loads(r.stdout)
    assert d["verdict"] == "pass" and d["positions_tested"] >= 48
    assert [m["sits_on"] for m in d["measurements"]] == ["sum_prod", "sum_prod", "sum_min"]
    mds = list((tmp_path / "rec").glob("accept-*.md"))
    assert len(mds) == 1 and "mlx-lm speculative_generate_step" in mds[0].read_text()


@pytest.mark.parametrize("args, needle", [
    (["--temperature", "0"], "--temperature 0.0: must be a finite number > 0"),
    (["--temperature", "-0.5"], "--temperature -0.5"),
    (["--rule", "bad:"], "--rule 'bad:': malformed"),
    (["--rule", "nope"], "not a built-in rule"),
    (["--model", "/no/such/dir"], "--model needs --draft-model"),
    (["--model", "/no/such/dir", "--draft-model", "/no/such/dir"],
     "--model /no/such/dir: no such file or directory"),
    (["--positions", "0"], "--positions 0"),
])
def test_cli_bad_input_is_one_line_exit_2(cli_bin, args, needle):
    r = run_cli(cli_bin, "accept", *args)
    assert r.returncode == 2, r.stdout + r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: ") and needle in last, r.stderr
    assert "Traceback" not in r.stderr
