"""``specparity gate check`` through the shared command frame: its record, ``verdict:`` last, ``--json``.

Real parts: the CLI in a subprocess on the rows-4 fault pair (the gate declines width 4 there),
probed once, then answered from the store.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli

from specparity.fixtures import FixtureInfo
from specparity.records.record import read_record

pytestmark = pytest.mark.model


def test_gate_check_writes_its_record_and_prints_the_verdict_last(cli_bin: str, rows4_pair: FixtureInfo,
                                                                   isolated_home: Path, tmp_path: Path) -> None:
    env = {"SPECPARITY_HOME": str(isolated_home)}
    args = ["gate", "check", "--model", rows4_pair.target, "--trust-remote-code", "--width", "4"]
    probed = run_cli(cli_bin, *args, "--record-dir", str(tmp_path / "rec"), env=env)
    assert probed.returncode == 1, probed.stderr  # decline
    lines = probed.stdout.strip().splitlines()
    assert lines[0] == "decline" and lines[-1] == "verdict: divergent", probed.stdout
    assert "probed now" in probed.stdout
    (md,) = (tmp_path / "rec").glob("*.md")
    assert f"record written: {md}" in probed.stderr
    rec, identity, _ = read_record(md)
    assert (rec.kind, rec.status, rec.verdict, rec.exit_code) == ("gate", "complete", "divergent", 1)
    assert rec.summary is not None and rec.summary["decision"] == "DECLINE" and rec.summary["width"] == 4
    assert identity["cache"]["prefill_step_size"] == 2048  # the command's own identity keys
    assert "verdict: **divergent** (exit 1)" in md.read_text()

    # answered from the store: still a record of its own (none overwritten), and the same contract in --json
    hit = run_cli(cli_bin, *args, "--record-dir", str(tmp_path / "rec"), "--json", env=env)
    assert hit.returncode == 1, hit.stderr
    out = json.loads(hit.stdout)
    assert (out["verdict"], out["exit_code"], out["hit"]) == ("divergent", 1, True)
    assert Path(out["record"]).is_file() and out["record"] != str(md) and md.is_file()
    assert "verdict: divergent" not in hit.stdout  # --json: the JSON alone on stdout
