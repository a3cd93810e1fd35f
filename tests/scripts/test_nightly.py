"""The nightly job: scripts/nightly-parity on real servers, its JUnit XML, and the unexercised profiles.

The loop a CI schedule runs: the same job twice on a clean pair (exit 0,
JUnit all passed), then a fault fixture swapped in (a rows fault at 4+
verify rows, scale 1.5, so a greedy token flips): exit 1 and a JUnit
failure naming the width and the first differing token. Once on llama.cpp's
llama-server too (conftest's llama_server_bin: skipped locally when not built, failed in CI).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from junitparser import Error, Failure, JUnitXml, Skipped
from specparity.fixtures import FixtureInfo
from specparity.harness.profiles import NOT_EXERCISED, load_profile
from specparity.records.junit import junit_xml
from specparity.records.record import Record
from specparity.records.served import ServedRecord

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "nightly-parity"
PROMPT = "Speculative decoding drafts several tokens with a small model and verifies them"
WIDTHS = [3, 4]


def _config(tmp_path: Path, name: str, pair, profile: str = "mlx-lm", **extra) -> Path:
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump({
        "pairings": [{"name": "p", "target": pair.target, "draft": pair.draft}],
        "profile": profile, "widths": WIDTHS, "max_tokens": 24, "sequence": ["fresh"],
        "prompts": [PROMPT], **extra}))
    return cfg


def nightly(cli_bin: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SPECPARITY": cli_bin}
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=600)


def _record(out: Path, err: str) -> Path:
    line = next(ln for ln in err.splitlines() if ln.startswith("nightly-parity: record "))
    return Path(line.split("record ", 1)[1].rsplit(", exit", 1)[0])


def _cases(path: Path) -> dict[str, list]:
    xml = JUnitXml.fromfile(str(path))
    out: dict[str, list] = {}
    for suite in xml:
        for case in suite:
            out[f"{case.classname}/{case.name}"] = case.result
    return out


def _has_compare(cli_bin: str) -> bool:
    return subprocess.run([cli_bin, "records", "compare", "--help"], capture_output=True).returncode == 0


@pytest.mark.model
@pytest.mark.server
@pytest.mark.slow
def test_nightly_loop_clean_twice_then_a_fault_fails_with_width_and_first_token(
        llama_pair: FixtureInfo, scaled_rows4_pair: FixtureInfo, tmp_path: Path, cli_bin: str) -> None:
    out = tmp_path / "records"
    clean = _config(tmp_path, "clean", llama_pair)
    records = []
    for night in (1, 2):
        junit = tmp_path / f"night{night}.xml"
        run = nightly(cli_bin, str(clean), "--out", str(out), "--junit", str(junit), "--quiet")
        assert run.returncode == 0, run.stderr
        records.append(_record(out, run.stderr))
        xml = JUnitXml.fromfile(str(junit))
        # baseline-start, w3, w4, baseline-end: one case each for the one request
        assert (xml.tests, xml.failures, xml.errors, xml.skipped) == (4, 0, 0, 0)
        cases = _cases(junit)
        assert set(cases) == {f"p.{a}/p0 (fresh)" for a in ("baseline-start", "w3", "w4", "baseline-end")}
        assert all(r == [] for r in cases.values())
    assert records[0] != records[1]  # never overwritten: night 2 is its own record
    assert len(list(out.glob("*.md"))) == 2

    fault = scaled_rows4_pair
    junit = tmp_path / "night3.xml"
    args = [str(_config(tmp_path, "fault", fault)), "--out", str(out), "--junit", str(junit), "--quiet"]
    if _has_compare(cli_bin):
        args += ["--previous", str(records[1])]
    run = nightly(cli_bin, *args)
    assert run.returncode == 1, run.stderr
    assert "nightly-parity: record " in run.stderr and ", exit 1" in run.stderr
    xml = JUnitXml.fromfile(str(junit))
    assert (xml.tests, xml.failures, xml.errors, xml.skipped) == (4, 1, 0, 0)
    cases = _cases(junit)
    assert cases["p.w3/p0 (fresh)"] == []
    (failure,) = cases["p.w4/p0 (fresh)"]
    assert isinstance(failure, Failure) and failure.type == "diverged"
    assert "width 4" in failure.message and "first difference at token " in failure.message
    report = json.loads((out / "data" / _record(out, run.stderr).stem / "report.json").read_text())
    w4 = next(a for a in report["summary"]["pairings"][0]["arms"] if a["name"] == "w4")
    rows = [json.loads(x) for x in (out / "data" / _record(out, run.stderr).stem / "p-w4.jsonl").read_text()
            .splitlines()]
    token = rows[0]["divergence"]["token_index"]
    assert w4["verdict"] == "diverged" and f"token {token}," in failure.message
    assert "reproduce in process: specparity replay" in failure.text
    # the night's finding diagnosed into its record (the nightly default: served --diagnose), and on the page
    (diag,) = [json.loads(x) for x in (out / "data" / _record(out, run.stderr).stem / "diagnoses.jsonl")
               .read_text().splitlines()]
    assert diag["finding"] == "p/w4/p0" and diag["diagnosis"]["phase"] == "verify"
    assert diag["diagnosis"]["location"]["width"] == 4, diag["diagnosis"]["location"]
    # beside the JUnit file, the page of the three nights: the newest one's w4 diverged, since night 3
    page = junit.with_suffix(".html").read_text()
    assert page.count('class="v v-diverged changed"') == 1 and 'data-arm="w4"' in page
    assert page.count('<div class="diag" id=') == 1 and "phase <b>verify</b> at width 4" in page
    assert [n for n in re.findall(r'<th title="[^"]*">([^<]+)<br>', page)] == [r.stem for r in [*records,
                                                                                             _record(out, run.stderr)]]
    if "--previous" in args:
        assert "w4" in run.stdout and "regress" in run.stdout.lower()
        # last night's diagnoses offered to tonight's (it had none: the finding above was run)
        assert f"--diagnose --diagnoses-from {records[1]} " in run.stderr, run.stderr


@pytest.mark.model
def test_nightly_bad_input_is_one_line_and_exit_2(cli_bin, tmp_path, llama_pair):
    for args, message in (([], "CONFIG: give a served job YAML"),
                          ([str(tmp_path / "nope.yaml")], "no such file"),
                          ([str(_config(tmp_path, "c", llama_pair)), "--record-dir", "x"], "sets it itself")):
        run = nightly(cli_bin, *args)
        assert run.returncode == 2 and run.stderr.startswith("Error: ") and message in run.stderr, run.stderr
        assert "Traceback" not in run.stderr
    if not _has_compare(cli_bin):
        run = nightly(cli_bin, str(_config(tmp_path, "c", llama_pair)), "--previous", str(tmp_path))
        assert run.returncode == 2 and "no 'records compare'" in run.stderr


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.server
@pytest.mark.build
def test_nightly_on_llama_server_matches_with_draft_n_evidence(llama_server_bin: str, llama_pair: FixtureInfo,
                                                               tmp_path: Path, cli_bin: str) -> None:
    out = tmp_path / "records"
    junit = tmp_path / "llama.xml"
    run = nightly(cli_bin, str(_config(tmp_path, "llama", llama_pair, profile="llama.cpp")), "--out", str(out),
                  "--junit", str(junit), "--quiet")
    assert run.returncode == 0, run.stderr + run.stdout
    xml = JUnitXml.fromfile(str(junit))
    assert (xml.tests, xml.failures, xml.errors, xml.skipped) == (4, 0, 0, 0)
    data = out / "data" / _record(out, run.stderr).stem
    for arm in ("w3", "w4"):
        (row,) = [json.loads(x) for x in (data / f"p-{arm}.jsonl").read_text().splitlines()]
        assert row["verdict"] == "match" and row["completion"]["raw"]["timings"]["draft_n"] > 0


# -- JUnit mapping of every verdict (one function, synthetic record) ------------------------------
def test_junit_maps_each_verdict_and_keeps_the_xml_valid(tmp_path):
    arms: list[dict[str, Any]] = [
        {"name": "baseline-start", "kind": "baseline", "width": None, "setting": None, "verdict": "match"},
        {"name": "w2", "kind": "width", "width": 2, "setting": 1, "verdict": "not_engaged"},
        {"name": "w3", "kind": "width", "width": 3, "setting": 2, "verdict": "declined"},
        {"name": "w8", "kind": "width", "width": 8, "setting": 7, "verdict": "error",
         "reason": "w8 server exited with code 2", "server": {"log_tail": "unknown flag"}},
        {"name": "self-draft", "kind": "self-draft", "width": 3, "setting": 2, "verdict": "diverged",
         "reason": "serving-loop defect: 40.0% accepted"},
    ]

    def req(verdict, reason=""):
        return {"id": "p0", "kind": "fresh", "verdict": verdict, "reason": reason, "completion": {"seconds": 0.5}}

    parts = {"x-baseline-start": [req("match")], "x-w2": [req("not_engaged", "no evidence \x01 ran")],
             "x-w3": [req("declined", "declined: gate")], "x-self-draft": [req("match")],
             # every arm the summary judged has its line, as served writes it (a record without one is damaged)
             "arms": [{"pairing": "x", **a} for a in arms]}
    rec = Record(kind="served", title="t", argv=[], status="complete", path=str(tmp_path / "r.md"),
                 summary={"pairings": [{"name": "x", "verdict": "diverged", "profile": "mlx-lm", "arms": arms}]})
    path = tmp_path / "j.xml"
    junit_xml(ServedRecord.of(rec.path, rec, {}, parts)).write(str(path))
    cases = _cases(path)
    assert cases["x.baseline-start/p0 (fresh)"] == []
    (r,) = cases["x.w2/p0 (fresh)"]
    assert isinstance(r, Skipped) and "not_engaged" in r.message and "\\x01" in r.message
    (r,) = cases["x.w3/p0 (fresh)"]
    assert isinstance(r, Skipped) and "declined: gate" in r.message
    (r,) = cases["x.w8/server"]
    assert isinstance(r, Error) and "exited with code 2" in r.message and "width 8" in r.message
    (r,) = cases["x.self-draft/arm"]
    assert isinstance(r, Failure) and "serving-loop defect" in r.message
    xml = JUnitXml.fromfile(str(path))
    assert (xml.tests, xml.failures, xml.errors, xml.skipped) == (6, 1, 1, 2)
    # an inconclusive pairing judges nothing: its arms are skipped with the pairing's reason
    assert rec.summary is not None
    rec.summary["pairings"][0].update(verdict="inconclusive", reason="the two baselines disagree")
    cases = {k: v for k, v in _cases_of(junit_xml(ServedRecord.of(rec.path, rec, {}, parts)), tmp_path).items()}
    (r,) = cases["x.w2/p0 (fresh)"]
    assert isinstance(r, Skipped) and "the two baselines disagree" in r.message


def _cases_of(xml, tmp_path: Path) -> dict[str, list]:
    path = tmp_path / "again.xml"
    xml.write(str(path))
    return _cases(path)


def test_junit_refuses_a_record_of_another_kind(cli_bin, tmp_path):
    from specparity.errors import UsageError

    rec = Record(kind="probe", title="t", argv=[], path="r.md")
    with pytest.raises(UsageError, match="served records"):
        junit_xml(ServedRecord.of(rec.path, rec, {}, {}))
    run = subprocess.run([cli_bin, "records", "junit", str(tmp_path), "--out", str(tmp_path / "x.xml")],
                         capture_output=True, text=True)
    assert run.returncode == 2 and run.stderr.startswith("Error: ") and "Traceback" not in run.stderr


# -- profiles written from documentation ----------------------------------------------------------
@pytest.mark.model
@pytest.mark.parametrize("name,flags", [
    ("vllm", ["serve", "--speculative-config"]),
    pytest.param("sglang", ["sglang.launch_server", "--speculative-draft-model-path",
                            "--speculative-num-draft-tokens"], marks=pytest.mark.slow),
    pytest.param("mlxcel", ["--model-draft", "--draft"], marks=pytest.mark.slow),
])
def test_unexercised_profiles_load_render_and_say_so(name, flags, cli_bin):
    prof = load_profile(name)
    assert prof.exercised is False and prof.ready_path == "/health"
    argv = prof.render(prof.argv, model="/m/target", host="127.0.0.1", port=8000)
    argv += prof.render(prof.draft_argv, draft_model="/m/draft", num_draft=prof.width(4).setting, width=4)
    assert "/m/target" in argv and "/m/draft" in " ".join(argv) and all(f in argv for f in flags), argv
    if name == "vllm":
        spec = json.loads(argv[argv.index("--speculative-config") + 1])
        assert spec == {"model": "/m/draft", "num_speculative_tokens": 3}
        assert prof.metrics_counter == "vllm:spec_decode_num_draft_tokens"
    if name == "sglang":
        assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "4"
        assert argv[argv.index("--speculative-num-steps") + 1] == "3"
    run = subprocess.run([cli_bin, "served", "--profile", name, "--widths", "2", "--max-tokens", "2", "-q"],
                         capture_output=True, text=True, timeout=120)
    assert f"profile {name} {NOT_EXERCISED}" in run.stderr
    if prof.available() is not None:  # not installed here: a clear error, never a hang or a traceback
        assert run.returncode == 4 and "cannot run here" in run.stdout, run.stdout + run.stderr
        assert "0 groups" not in run.stdout, run.stdout  # no arm answered: no empty groups line
    assert load_profile("mlx-lm").exercised is True


@pytest.mark.model
@pytest.mark.server
@pytest.mark.slow
def test_a_prometheus_counter_rise_is_engagement_evidence_and_none_is_not(llama_pair, tmp_path):
    """vLLM's evidence path (counters at /metrics), proven on specparity serve's vLLM-named counters."""
    from specparity.harness.config import Job, Pairing
    from specparity.harness.run import ServedRun

    profiles = {}
    for name, counter in (("metrics", "spec_decode_num_draft_tokens"), ("no-counter", "no_such_counter")):
        prof = tmp_path / f"{name}.yaml"
        prof.write_text(yaml.safe_dump({"extends": "specparity-serve", "name": name, "witness": [],
                                        "evidence": {"log_engaged": None, "response_field": None,
                                                     "metrics_counter": counter}}))
        profiles[name] = str(prof)
    job = Job(pairings=[Pairing(n, llama_pair.target, llama_pair.draft, p) for n, p in profiles.items()],
              widths=[2], max_tokens=8, sequence=["fresh"], prompts=[PROMPT])
    report = ServedRun(job, workdir=tmp_path / "w").run()
    seen = {p.name: {a.name: a for a in p.arms} for p in report.pairings}
    ev = seen["metrics"]["w2"].requests[0].evidence
    assert seen["metrics"]["w2"].verdict == "match" and ev.sources == ["metrics"], ev
    assert ev.lines[0].startswith("spec_decode_num_draft_tokens: +")
    assert seen["no-counter"]["w2"].verdict == "not_engaged"


@pytest.mark.model
# -- issue 20, class 7: outputs and --previous checked before the job runs -------------------------
def test_nightly_checks_junit_previous_and_out_before_the_job(cli_bin: str, tmp_path: Path, llama_pair: Any) -> None:
    from served_records import served_record as _served_record

    cfg = str(_config(tmp_path, "c", llama_pair))
    out = tmp_path / "records"
    junit = tmp_path / "parity.xml"
    junit.write_text("last night's")

    def refused(*args: str, message: str) -> None:
        run = nightly(cli_bin, cfg, "--out", str(out), *args)
        assert run.returncode == 2 and run.stderr.startswith("Error: ") and message in run.stderr, run.stderr
        assert run.stderr.count("\n") == 1, run.stderr
        assert not out.exists()  # the job never ran

    refused("--junit", str(junit), message=f"--junit {junit}: exists (pass --force")
    assert junit.read_text() == "last night's"
    link = tmp_path / "link.xml"
    link.symlink_to(junit)
    refused("--junit", str(link), message=f"--junit {link}: exists as a link (pass --force")
    refused("--junit", str(tmp_path), message="is a directory")
    refused("--junit", str(junit / "x.xml"), message="cannot create its directory")
    if _has_compare(cli_bin):
        not_a_record = tmp_path / "notes.txt"
        not_a_record.write_text("x")
        refused("--previous", str(not_a_record), message="--previous")
        incomplete = _served_record(tmp_path / "old")
        report = tmp_path / "old" / "data" / incomplete.stem / "report.json"
        report.write_text(report.read_text().replace('"complete"', '"interrupted"'))
        refused("--previous", str(incomplete), message="not complete")
        # complete, but a probe's: compare reads it (with itself), the nightly compare could not
        probe = _served_record(tmp_path / "probe")
        report = tmp_path / "probe" / "data" / probe.stem / "report.json"
        report.write_text(report.read_text().replace('"kind": "served"', '"kind": "probe"'))
        refused("--previous", str(probe), message=f"--previous {probe}: a probe record, not a served one")
        good = _served_record(tmp_path / "good")
        # a readable complete record passes its check: the run stops at the next one
        refused("--previous", str(good), "--junit", str(junit), message="--junit")
    run = nightly(cli_bin, cfg, "--out", str(junit / "records"))
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "--out" in run.stderr, run.stderr
    # a refused run creates nothing: the JUnit file's folder was made before --out was checked
    run = nightly(cli_bin, cfg, "--out", str(junit / "sub"), "--junit", str(tmp_path / "new" / "x.xml"))
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "--out" in run.stderr, run.stderr
    assert not (tmp_path / "new").exists()


FAKE = str(Path(__file__).resolve().parents[1] / "fakeserver.py")


def _fake_night(tmp_path: Path) -> Path:
    """A job on the fake server (no model): its drafted arm says it drafted, so the night passes (exit 0)."""
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "config.json").write_text("{}")
    prof = tmp_path / "fake.yaml"
    prof.write_text(yaml.safe_dump({
        "name": "fake", "argv": ["{python}", "-I", FAKE, "--model", "{model}", "--host", "{host}", "--port", "{port}"],
        "draft_argv": ["--draft-model", "{draft_model}", "--num-draft-tokens", "{num_draft}"],
        "evidence": {"response_field": "drafted"}}))
    cfg = tmp_path / "night.yaml"
    cfg.write_text(yaml.safe_dump({"pairings": [{"name": "p", "target": str(ck), "draft": str(ck),
                                                 "profile": str(prof)}],
                                   "widths": [2], "sequence": ["fresh"], "max_tokens": 4, "reference": False,
                                   "self_draft": False, "concurrency": 0}))
    return cfg


@pytest.mark.slow
@pytest.mark.server
def test_nightly_force_replaces_an_existing_junit_file_and_a_link_not_its_target(cli_bin: str,
                                                                                 tmp_path: Path) -> None:
    cfg = str(_fake_night(tmp_path))
    junit = tmp_path / "parity.xml"
    junit.write_text("last night's")
    run = nightly(cli_bin, cfg, "--out", str(tmp_path / "rec"), "--junit", str(junit), "--force", "--quiet")
    assert run.returncode == 0, run.stderr
    assert JUnitXml.fromfile(str(junit)).tests == 3  # baseline-start, w2, baseline-end: tonight's
    target = tmp_path / "keep.xml"
    target.write_text("not ours")
    link = tmp_path / "link.xml"
    link.symlink_to(target)
    run = nightly(cli_bin, cfg, "--out", str(tmp_path / "rec"), "--junit", str(link), "--force", "--quiet")
    assert run.returncode == 0, run.stderr
    assert not link.is_symlink() and JUnitXml.fromfile(str(link)).tests == 3  # the link itself replaced
    assert target.read_text() == "not ours"  # never written through
