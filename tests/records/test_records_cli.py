"""Records: every command writes the same record; `records show/list` read any of them;
an interrupted run leaves a readable, visibly incomplete record."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import run_cli


@pytest.fixture(scope="module")
def five_records(tmp_path_factory, llama_pair, cli_bin):
    """One record from each of probe, bisect, replay, dist and accept, in one directory."""
    rec = tmp_path_factory.mktemp("records")
    m = ["--model", llama_pair.target]
    runs = {
        "probe": ["probe", *m, "--widths", "2,4", "--depths", "0", "--walk", "8", "--no-prefill"],
        "bisect": ["bisect", *m, "--width", "3"],
        "replay": ["replay", *m, "--accepts", "1,2,0,3", "--width", "4"],
        "dist": ["dist", "--samples", "20000"],
        "accept": ["accept", *m, "--draft-model", llama_pair.draft, "--positions", "24",
                   "--draws", "200", "--temperature", "0.1"],
    }
    out = {}
    for kind, args in runs.items():
        r = run_cli(cli_bin, *args, "--json", "--record-dir", str(rec))
        assert r.returncode in (0, 1, 3), (kind, r.stderr)
        data = json.loads(r.stdout)
        assert data["verdict"] and data["exit_code"] == r.returncode, kind
        out[kind] = (data, r.returncode)
    return rec, out


@pytest.mark.model
def test_every_command_json_carries_verdict_and_exit_code(five_records):
    _, out = five_records
    for kind, (data, code) in out.items():
        assert isinstance(data["verdict"], str) and data["exit_code"] == code, kind
        assert data["record"].endswith(".md"), kind


@pytest.mark.model
def test_records_list_and_show_read_every_kind(five_records, cli_bin):
    rec, out = five_records
    r = run_cli(cli_bin, "records", "list", str(rec), "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["records"]
    assert sorted(x["kind"] for x in rows) == ["accept", "bisect", "dist", "probe", "replay"]
    assert all(x["status"] == "complete" for x in rows)
    for kind, (data, code) in out.items():
        r = run_cli(cli_bin, "records", "show", data["record"])
        assert r.returncode == 0, r.stderr
        assert f"verdict: {data['verdict']} (exit {code})" in r.stdout, kind
        shown = json.loads(run_cli(cli_bin, "records", "show", data["record"], "--json").stdout)
        report = shown["report"]  # the record's own; the top is the process's (exit 0)
        assert (shown["verdict"], shown["exit_code"]) == ("pass", 0)
        assert report["kind"] == kind and report["verdict"] == data["verdict"] and report["exit_code"] == code
        assert report["summary"]["verdict"] == data["verdict"]
        assert shown["results"], f"{kind}: no per-part results in the record"
    probe_text = run_cli(cli_bin, "records", "show", out["probe"][0]["record"]).stdout
    assert "cells: 2 finished (2 equal)" in probe_text and "walks: 2 finished" in probe_text


@pytest.mark.model
def test_records_show_imports_no_mlx(five_records, repo_root):
    rec, out = five_records
    code = ("import sys\nfrom specparity.cli import main\n"
            "try:\n    main(['records', 'show', sys.argv[1]])\nexcept SystemExit:\n    pass\n"
            "assert 'mlx' not in sys.modules and 'mlx_lm' not in sys.modules, 'mlx imported'\n")
    r = subprocess.run([sys.executable, "-P", "-c", code, out["dist"][0]["record"]],
                       capture_output=True, text=True, cwd=str(repo_root), timeout=60)
    assert r.returncode == 0, r.stderr
    assert "verdict: pass" in r.stdout


def test_records_show_bad_path_is_a_usage_error(cli_bin, tmp_path):
    r = run_cli(cli_bin, "records", "show", str(tmp_path / "nope"))
    assert r.returncode == 2 and r.stderr.strip().startswith("Error:") and "nope" in r.stderr
    r = run_cli(cli_bin, "records", "show", str(tmp_path))
    assert r.returncode == 2 and "not a record" in r.stderr


@pytest.mark.model
def test_sigint_mid_grid_leaves_a_readable_incomplete_record(cli_bin, llama_pair, tmp_path):
    rec = tmp_path / "rec"
    env = dict(os.environ)
    proc = subprocess.Popen(
        [cli_bin, "probe", "--model", llama_pair.target, "--widths", "2-16", "--depths", "0,64,128,192",
         "--walk", "0", "--record-dir", str(rec)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        comparisons = None
        while time.monotonic() < deadline:
            found = list((rec / "data").glob("*/comparisons.jsonl")) if (rec / "data").exists() else []
            if found and len(found[0].read_text().splitlines()) >= 3:
                comparisons = found[0]
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        assert comparisons is not None, "the probe wrote no comparison within 120 s"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    (md,) = rec.glob("probe-*.md")
    text = md.read_text()
    assert "INCOMPLETE (interrupted)" in text and "verdict: none" in text
    assert "Ctrl-C" in text
    report = json.loads((rec / "data" / md.stem / "report.json").read_text())
    assert report["status"] == "interrupted" and report["verdict"] is None and report["exit_code"] is None
    done = len(comparisons.read_text().splitlines())
    assert 3 <= done < 15 * 4 * 3, done  # finished some, not all, of the grid's comparisons
    r = run_cli(cli_bin, "records", "show", str(md))
    assert r.returncode == 0, r.stderr
    assert "INCOMPLETE record (interrupted)" in r.stdout and "verdict: equal" not in r.stdout
    assert f"comparisons: {done} finished" in r.stdout
