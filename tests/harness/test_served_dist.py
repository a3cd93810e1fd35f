"""The served distribution arms (temperature > 0) on real mlx_lm.server processes.

The target is a constant-logits fixture (its law p is known exactly); the
drafter is a plain llama checkpoint with constant logits (mlx-lm's server loads
drafters without trust_remote_code). Clean: both arms fit p, the histograms
agree, every control is rejected, the power statement is in the reason. Fault:
a drafter server started with ``--top-k 3`` (a real server whose sampler is
known-wrong) is rejected.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import run_cli
from fixture_cache import cached
from specparity.errors import UsageError
from specparity.harness.client import Completion
from specparity.harness.config import DistSpec, Job, Pairing, load_job, parse_spec
from specparity.harness.distribution import homogeneity, judge
from specparity.harness.evidence import Evidence
from specparity.harness.plan import ArmKind
from specparity.harness.profiles import Width
from specparity.harness.results import ArmResult, RequestResult
from specparity.harness.run import ServedRun
from specparity.probes.sampling.accept_e2e import E2E_DRAFT, E2E_TARGET
from specparity.probes.sampling.stats import chi_square
from specparity.records.record import read_record
from specparity.verdicts import Verdict

T = 0.7
PROMPT = ["Speculative decoding drafts several tokens with a small model and verifies them"]


@pytest.fixture(scope="module")
def constant_pair(fixture_root):
    from specparity.fixtures import build_constant_pair, build_plain_constant

    target, _ = cached(build_constant_pair, fixture_root, "constant", E2E_TARGET, E2E_DRAFT)
    return target, cached(build_plain_constant, fixture_root, "plain-constant", E2E_DRAFT)


def law(temperature: float) -> np.ndarray:
    from specparity.fixtures import constant_logits
    from specparity.probes.sampling.dist import softmax32

    p = softmax32(np.array(constant_logits(E2E_TARGET)), temperature)
    return p / p.sum()


# -- units --------------------------------------------------------------------------------------
def test_homogeneity_fires_on_a_shifted_law_and_is_silent_on_the_same_law():
    rng = np.random.default_rng(0)
    p = np.array([0.4, 0.3, 0.2, 0.1])
    q = np.array([0.25, 0.25, 0.25, 0.25])
    same = [homogeneity(rng.multinomial(500, p), rng.multinomial(500, p), 1e-3).rejected for _ in range(50)]
    assert sum(same) <= 1
    assert homogeneity(rng.multinomial(500, p), rng.multinomial(500, q), 1e-3).rejected
    h = homogeneity(np.array([10, 0]), np.array([10, 0]), 1e-3)
    assert h.dof == 0 and not h.rejected


def _draws(ids: np.ndarray, engaged: bool) -> list[RequestResult]:
    ev = Evidence()
    if engaged:
        ev.verify_calls = 1
    return [RequestResult(f"s{i}", "distribution", Verdict.MATCH, "", Completion(text="x", token_ids=[int(t)]), {}, ev)
            for i, t in enumerate(ids)]


def _judged(target_row, draft_law, engaged=True, n=600):
    rng = np.random.default_rng(1)
    base = ArmResult("dist-baseline", ArmKind.DISTRIBUTION, None)
    drafted = ArmResult("dist-w4", ArmKind.DISTRIBUTION, Width(4, 3, "num_draft_tokens"))
    base.verdict = drafted.verdict = Verdict.NOT_RUN
    base.requests = _draws(rng.choice(512, n, p=law(T)), False)
    drafted.requests = _draws(rng.choice(512, n, p=draft_law), engaged)
    wrong = _draws(rng.choice(512, n, p=law(T / 2)), False)
    spec = DistSpec(temperature=T, requests=n)
    from specparity.fixtures import constant_logits

    judge(base, drafted, wrong, spec, T / 2, {"baseline": range(0, n)}, target_row,
          constant_logits(E2E_DRAFT), {})
    return base, drafted


def test_judge_passes_a_lossless_sample_and_rejects_a_wrong_one_and_an_unwitnessed_one():
    from specparity.fixtures import constant_logits

    row = constant_logits(E2E_TARGET)
    base, drafted = _judged(row, law(T))
    assert base.verdict == "match" and drafted.verdict == "match", drafted.reason
    assert "with 99% power" in drafted.reason and "TV >=" in drafted.reason
    assert drafted.dist is not None
    assert all(c["rejected"] for c in drafted.dist["controls"]) and len(drafted.dist["controls"]) >= 5
    # the drafted server samples at the wrong temperature: the fit and the homogeneity see it
    _, bad = _judged(row, law(2.0))
    assert bad.verdict == "diverged", bad.reason
    # the same clean draws, judged against a wrong p: even the baseline is diverged
    wrong_row = constant_logits(tuple(reversed(E2E_TARGET)))
    base_w, drafted_w = _judged(wrong_row, law(T))
    assert base_w.verdict == "diverged" and drafted_w.verdict == "diverged"
    # no evidence the drafter ran: not a pass
    _, blind = _judged(row, law(T), engaged=False)
    assert blind.verdict == "not_engaged"
    # too few draws for the controls: inconclusive, never a pass
    _, weak = _judged(row, law(T), n=50)
    assert weak.verdict == "inconclusive" and "underpowered" in weak.reason


@pytest.mark.parametrize("raw, message", [
    ({"temperature": 0}, "distribution.temperature 0"),
    ({"temperature": 0.7, "requests": 10}, "distribution.requests 10"),
    ({"prefix": 9}, "distribution.prefix 9"),
    ({"alpha": 2}, "distribution.alpha 2"),
    ({"tempreature": 1}, "unknown key 'tempreature'"),
    ("hot", "a mapping"),
])
def test_bad_distribution_keys_name_the_key(raw, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        parse_spec(raw, "--config job.yaml")


@pytest.mark.model  # a job file without pairings runs the built-in job: the embedded pair is built
def test_the_job_key_reads_into_a_spec(tmp_path):
    cfg = tmp_path / "job.yaml"
    cfg.write_text(yaml.safe_dump({"distribution": {"temperature": 0.9, "requests": 200, "prefix": 2}}))
    spec = load_job(cfg).distribution
    assert spec == DistSpec(temperature=0.9, requests=200, prefix=2)


@pytest.mark.parametrize("args, message", [
    (["--temperature", "0"], "--temperature"),
    (["--dist-requests", "5"], "--dist-requests"),
    (["--dist-prefix", "7"], "--dist-prefix"),
])
def test_bad_flags_are_one_line_and_exit_2(cli_bin, args, message):
    r = run_cli(cli_bin, "served", *args)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


def test_no_drafter_to_compare_is_a_usage_error(cli_bin, tmp_path, isolated_home):
    r = run_cli(cli_bin, "served", "--model", str(tmp_path), "--temperature", "0.7")
    assert r.returncode == 2 and "no pairing has a drafter" in r.stderr
    assert not (isolated_home / "fixtures").exists()  # --model given: the embedded pair is never built


# -- real servers -------------------------------------------------------------------------------
@pytest.mark.model
@pytest.mark.server
@pytest.mark.slow
def test_clean_constant_pair_passes_fit_and_homogeneity_with_power_on_real_servers(
        constant_pair, tmp_path, cli_bin):
    target, draft = constant_pair
    cfg = tmp_path / "job.yaml"
    cfg.write_text(yaml.safe_dump({
        "pairings": [{"name": "const", "target": target, "draft": draft, "trust_remote_code": True}],
        "widths": [4], "max_tokens": 4, "sequence": ["fresh"], "prompts": PROMPT,
        "distribution": {"temperature": T}}))
    r = run_cli(cli_bin, "served", "--config", str(cfg), "--dist-requests", "400", "--json",
                "--record-dir", str(tmp_path / "rec"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = json.loads(r.stdout)
    arms = {a["name"]: a for a in out["summary"]["pairings"][0]["arms"]} if "summary" in out else \
        {a["name"]: a for a in out["pairings"][0]["arms"]}
    base, drafted = arms["dist-baseline"], arms["dist-w4"]
    assert base["verdict"] == "match" and drafted["verdict"] == "match", drafted["reason"]
    assert "with 99% power" in drafted["reason"] and "TV >=" in drafted["reason"]
    d = drafted["dist"]
    assert d["known_law"] and not d["gof"]["baseline"]["rejected"] and not d["gof"]["drafted"]["rejected"]
    assert d["homogeneity"]["samples"] == [400, 400] and not d["homogeneity"]["rejected"]
    assert all(c["rejected"] for c in d["controls"])
    assert {c["kind"] for c in d["controls"]} == {"served", "simulated"}
    assert d["power"]["min_tv"] < 0.25 and d["gof_power"]["min_tv"] < 0.2
    assert d["seeds"]["baseline"] == [0, 399] and d["seeds"]["drafted"] == [400, 799]
    # the served draws, compared against a wrong p (the target's logits reversed), are rejected
    cells = d["cells"]
    counts = np.zeros(512)
    for c, x in zip(cells, d["counts"]["drafted"]):
        counts[int(c)] += x
    from specparity.fixtures import constant_logits
    from specparity.probes.sampling.dist import softmax32

    wrong = softmax32(np.array(constant_logits(tuple(reversed(E2E_TARGET)))), T)
    assert chi_square(counts, wrong, 1e-3).rejected and not chi_square(counts, law(T), 1e-3).rejected
    # the record: one arms.jsonl line per distribution arm, one line per draw
    files = {p.name for p in (tmp_path / "rec" / "data").rglob("*.jsonl")}
    assert "const-dist-w4.jsonl" in files and "const-dist-baseline.jsonl" in files, files
    rec, _, lines = read_record(next((tmp_path / "rec" / "data").rglob("report.json")).parent)
    assert rec.verdict == "match" and len(lines["const-dist-w4"]) == 400
    assert [a["name"] for a in lines["arms"]][-2:] == ["dist-baseline", "dist-w4"]
    draws = (next((tmp_path / "rec" / "data").rglob("const-dist-w4.jsonl"))).read_text().splitlines()
    assert len(draws) == 400 and json.loads(draws[0])["request"]["body"]["temperature"] == T
    # the drafter ran on every draw: one 2-row target forward (last prompt token + 1 draft) per draw.
    # (Read from the witness log itself: mlx-lm 0.32's prompt cache hands later draws a cache shorter
    # than the prompt, so per-request evidence, which counts forwards past the prompt, misses most.)
    witness = Path(lines["arms"][-1]["server"]["witness"]).read_text().split()
    rows = [int(r) for role, r in zip(witness[1::4], witness[2::4]) if role == "target"]
    assert sum(r == 2 for r in rows) == 400


@pytest.mark.model
@pytest.mark.server
@pytest.mark.slow
def test_a_drafter_server_with_a_wrong_sampler_is_diverged(constant_pair, tmp_path):
    """The drafted server runs with ``--top-k 3``: a real served sampler known to be wrong."""
    target, draft = constant_pair
    prof = yaml.safe_load((Path(__file__).parents[2] / "harness" / "profiles" / "mlx-lm.yaml").read_text())
    prof["name"] = "mlx-lm-topk3"
    prof["draft_argv"] = [*prof["draft_argv"], "--top-k", "3"]
    pf = tmp_path / "topk3.yaml"
    pf.write_text(yaml.safe_dump(prof))
    job = Job(pairings=[Pairing("topk3", target, draft, str(pf), True)], widths=[4], max_tokens=4,
              sequence=["fresh"], prompts=PROMPT, distribution=DistSpec(temperature=T, requests=150))
    report = ServedRun(job, workdir=tmp_path / "w").run()
    arms = {a.name: a for a in report.pairings[0].arms}
    assert arms["dist-baseline"].verdict == "match"
    assert arms["dist-w4"].verdict == "diverged", arms["dist-w4"].reason
    assert "does not fit the target's law" in arms["dist-w4"].reason
    assert report.exit_code == 1
    text = "\n".join(report.lines())
    assert "control " in text and "power (homogeneity)" in text
