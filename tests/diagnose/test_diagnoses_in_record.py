"""Diagnoses written into the served record they diagnose (served --diagnose, the nightly job), and read
back where people look: `records show` and the page's drill-down. Records are written as `served` lays
them out; their findings need no model (no in-process reproduction, or a length finding), so the tree
settles them from the record and nothing is loaded. The live path (a served job with --diagnose on two
fault fixtures) is in test_diagnose.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conftest import run_cli
from served_records import served_record_of
from specparity.commands.diagnose import read_reproduction
from specparity.diagnose.record import RecordDiagnoses, diagnose_record

NIGHT1, NIGHT2, NIGHT3 = "served-host-2026-01-01", "served-host-2026-01-02", "served-host-2026-01-03"


def _finding(sha: str = "s1", reason: str = "w2 differs from classic decode: first difference at token 3") -> dict:
    """A diverged request whose record has no in-process reproduction (the tree stops at step 1)."""
    return {"id": "p0", "kind": "fresh", "verdict": "diverged", "reason": reason,
            "request": {"body": {"prompt": "x", "max_tokens": 8}},
            "completion": {"text": "abc", "sha256": sha, "token_ids": [1, 2, 3, 4], "usage": {"completion_tokens": 4}},
            "classic": {"token_index": 3, "reference": "classic decode", "other": "w2"},
            "reproduction": {"command": None, "reason": "a warm-cache request: replay --sequence is not rerun"}}


def _diagnose(md: Path) -> RecordDiagnoses:
    return diagnose_record(md, read_reproduction)


def _night(root: Path, name: str, day: int, **kw: Any) -> Path:
    return served_record_of(root, [_finding(**kw)], verdict="diverged", name=name, started=f"2026-01-0{day}T02:00:00")


def _lines(md: Path) -> list[dict[str, Any]]:
    f = md.parent / "data" / md.stem / "diagnoses.jsonl"
    return [json.loads(x) for x in f.read_text().splitlines()]


def test_a_finding_is_diagnosed_into_its_record_once_and_an_earlier_nights_diagnosis_is_copied_not_rerun(
        tmp_path: Path, cli_bin: str) -> None:
    one = _night(tmp_path, NIGHT1, 1)
    done = _diagnose(one)
    assert [x["finding"] for x in done.ran] == ["p/w2/p0"] and not done.reused
    (line,) = _lines(one)
    assert line["diagnosed_in"] == NIGHT1 and len(line["key"]) == 64
    assert line["diagnosis"]["phase"] == "undetermined" and line["diagnosis"]["steps"][0]["status"] == "not_run"
    assert "## Diagnoses" in one.read_text() and "p/w2/p0:" in one.read_text()
    # run again on the same record: the finding it holds is left as it is, nothing appended
    again = _diagnose(one)
    assert again.held == ["p/w2/p0"] and not again.ran and len(_lines(one)) == 1
    assert one.read_text().count("## Diagnoses") == 1

    # the next night, the same request answered the same way: its diagnosis is copied, naming the night that ran it
    two = _night(tmp_path, NIGHT2, 2)
    nxt = _diagnose(two)
    assert not nxt.ran and [x["diagnosed_in"] for x in nxt.reused] == [NIGHT1]
    assert nxt.lines()[:2] == [f"diagnose: {NIGHT2}: 0 diagnosed, 1 taken from an earlier night, 0 already in the"
                               " record", "  p/w2/p0:"]
    assert _lines(two)[0]["key"] == line["key"] and _lines(two)[0]["diagnosis"] == line["diagnosis"]
    # a night whose answer changed (another sha256) is another finding: diagnosed afresh
    three = _night(tmp_path, NIGHT3, 3, sha="s2")
    fresh = _diagnose(three)
    assert len(fresh.ran) == 1 and not fresh.reused and _lines(three)[0]["key"] != line["key"]

    # records show prints each diagnosis under its finding, and says where a copied one was made
    show = run_cli(cli_bin, "records", "show", str(two))
    assert run_cli(cli_bin, "records", "show", str(two), "--json").returncode == 0  # its schema: the line's
    assert show.returncode == 0, show.stderr
    out = show.stdout
    assert "  w2 p0: diverged:" in out and "    diagnosis: phase undetermined: not reproduced in process" in out
    assert "      steps: 1 reproduce not_run; 2 prefill skipped" in out
    assert (f"diagnosed in {NIGHT1} (another record of the same finding: an earlier night, or a shard;"
            " not re-run)") in out


def test_the_pages_drill_down_shows_a_findings_diagnosis_escaped_and_cut(tmp_path: Path, cli_bin: str) -> None:
    reason = ("a length finding: w2 emitted 6 tokens where max_tokens is 4 (2 past it); differs from classic"
              " decode: first difference at token 4")
    md = served_record_of(tmp_path, [{**_finding(reason=reason), "request": {"body": {"prompt": "x", "max_tokens": 4}},
                                      "completion": {"text": "abcdef", "sha256": "s", "token_ids": [1, 2, 3, 4, 5, 6],
                                                     "usage": {"completion_tokens": 6}}}],
                          verdict="diverged", name=NIGHT1)
    _diagnose(md)
    # a hostile line beside it: markup in the summary, a command and a location value, an overlong evidence line
    hostile = {"finding": "p/w2/p1", "key": None, "diagnosed_in": NIGHT1, "diagnosis": {
        "phase": "<b>verify</b>", "location": {"width": "<i>4</i>", "layer": 2}, "summary": "<script>x()</script>",
        "steps": [{"number": 1, "name": "reproduce", "status": "ran", "verdict": "divergent",
                   "evidence": ["e" * 5000], "command": "specparity replay '<img src=x>'", "data": {"big": [0] * 9}}],
        "open": ["<u>open</u>"]}}
    data = tmp_path / "data" / NIGHT1
    with open(data / "diagnoses.jsonl", "a") as f:
        f.write(json.dumps(hostile) + "\n")
    with open(data / "p-w2.jsonl", "a") as f:
        f.write(json.dumps({**_finding(), "id": "p1"}) + "\n")
    page = tmp_path / "page.html"
    r = run_cli(cli_bin, "records", "html", str(md), "--out", str(page))
    assert r.returncode == 0, r.stderr
    html = page.read_text()
    # the length finding's diagnosis: phase, location and its steps
    assert '<div class="diag" id="arm-1-r1-diag">' in html
    assert "phase <b>length</b> at max_tokens 4, tokens emitted 6" in html
    assert "the server emitted 6 tokens where max_tokens is 4" in html
    assert "1 reproduce</td><td>skipped</td>" in html
    # every text from the record escaped; evidence cut at the page's bound, the step's data never held
    assert "<script>x()" not in html and "&lt;script&gt;x()&lt;/script&gt;" in html
    assert "phase <b>&lt;b&gt;verify&lt;/b&gt;</b> at width &lt;i&gt;4&lt;/i&gt;, layer 2" in html
    assert "specparity replay &#x27;&lt;img src=x&gt;&#x27;" in html and "<img src=x>" not in html
    assert "e" * 2000 + "\u2026" in html and "e" * 2001 not in html
    assert "&lt;u&gt;open&lt;/u&gt;" in html


def test_served_diagnose_needs_a_record_dir(cli_bin: str) -> None:
    r = run_cli(cli_bin, "served", "--diagnose", "--widths", "2")
    assert r.returncode == 2 and r.stderr.strip().endswith("--diagnose writes each diagnosis into the job's record:"
                                                           " give --record-dir"), r.stderr


def test_a_diagnosis_in_a_record_elsewhere_is_copied_when_named_and_only_then(tmp_path: Path) -> None:
    # last night's record in its own folder (the nightly job's --previous), tonight's in another
    last = _night(tmp_path / "last", NIGHT1, 1)
    assert len(_diagnose(last).ran) == 1
    tonight = _night(tmp_path / "tonight", NIGHT2, 2)
    done = diagnose_record(tonight, read_reproduction, also=(last,))
    assert not done.ran and [x["diagnosed_in"] for x in done.reused] == [NIGHT1]
    assert _lines(tonight)[0]["diagnosis"] == _lines(last)[0]["diagnosis"]
    # not named: the same finding in a folder of its own is run afresh
    alone = _night(tmp_path / "alone", NIGHT3, 3)
    assert len(_diagnose(alone).ran) == 1
    # a named record that is tonight's own, or cannot be read, adds nothing and stops nothing
    other = _night(tmp_path / "other", NIGHT3, 3)
    (tmp_path / "junk.md").write_text("not a record\n")
    assert len(diagnose_record(other, read_reproduction, also=(other, tmp_path / "junk.md")).ran) == 1


def test_served_diagnoses_from_is_checked_before_the_job(tmp_path: Path, cli_bin: str) -> None:
    probe_like = tmp_path / "notes.md"
    probe_like.write_text("# notes\n")
    for argv, said in (
            (["--diagnoses-from", str(tmp_path / "gone.md"), "--diagnose"], f"--diagnoses-from {tmp_path / 'gone.md'}:"
                                                                         " no such record"),
            (["--diagnoses-from", str(probe_like), "--diagnose"], f"--diagnoses-from {probe_like}: not a record"),
            (["--diagnoses-from", str(_night(tmp_path / "n", NIGHT1, 1))], "--diagnoses-from: only with --diagnose")):
        r = run_cli(cli_bin, "served", "--widths", "2", "--record-dir", str(tmp_path / "out"), *argv)
        assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, (argv, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "out").exists()  # nothing made: refused before the job


def test_a_diagnosis_line_not_as_written_is_named_with_its_file_and_entry(tmp_path: Path, cli_bin: str) -> None:
    md = _night(tmp_path, NIGHT1, 1)
    (tmp_path / "data" / NIGHT1 / "diagnoses.jsonl").write_text(json.dumps({"finding": "p/w2/p0", "diagnosis": "x"})
                                                                + "\n")
    for argv in (["records", "show", str(md)], ["records", "html", str(md), "--out", str(tmp_path / "p.html")]):
        r = run_cli(cli_bin, *argv)
        assert r.returncode == 2 and "diagnoses.jsonl, entry 1: diagnosis: expected" in r.stderr, (argv, r.stderr)


def test_a_finding_carries_the_jobs_environment_toggles_for_its_control_arms(tmp_path: Path) -> None:
    from specparity.diagnose.findings import read_findings

    md = _night(tmp_path, NIGHT1, 1)
    job = {"controls": [{"name": "no-compile", "env": {"MLX_DISABLE_COMPILE": "1"}, "width": 4},
                        {"name": "fast", "env": {"MLX_FAST": "0"}, "width": 2}]}
    (tmp_path / "data" / NIGHT1 / "identity.json").write_text(json.dumps({"job": job}))
    _, (f,) = read_findings(md)
    assert f.env_controls == [("MLX_DISABLE_COMPILE", "1"), ("MLX_FAST", "0")]
    assert f.to_dict()["env_controls"] == ["MLX_DISABLE_COMPILE=1", "MLX_FAST=0"]
