"""Served parity on real mlx_lm.server processes and the embedded fixtures.

Jobs here are small (short completions, few requests) so each test starts a
handful of servers; the built-in job's own test runs it whole through the CLI.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from conftest import build, run_cli
from reproductions import check_reproductions
from specparity.fixtures import FixtureInfo
from specparity.harness.config import Job, Pairing
from specparity.harness.lifecycle import group_alive
from specparity.harness.run import ServedRun
from specparity.records.record import read_record

SMALL = {"max_tokens": 12, "sequence": ["fresh"],
         "prompts": ["Speculative decoding drafts several tokens with a small model and verifies them"]}


def job(pair, tmp_path=None, profile="mlx-lm", **kw) -> Job:
    args = {**SMALL, **kw}
    return Job(pairings=[Pairing("p", pair.target, pair.draft, profile)], **args)


def arms(report):
    return {a.name: a for a in report.pairings[0].arms}


@pytest.mark.model
@pytest.mark.server
def test_clean_pair_matches_one_group_witnessed_concurrency_matches_and_a_dead_server_is_an_error(
        llama_pair, tmp_path):
    j = job(llama_pair, widths=[2, 4], concurrency=2, extra_args={"w4": ["--no-such-flag"]})
    seen = []
    report = ServedRun(j, workdir=tmp_path, on_arm=lambda p, a: seen.append(a.name)).run()
    a = arms(report)
    for name in ("w2",):
        assert a[name].verdict == "match", a[name].reason
        ev = a[name].requests[0].evidence
        # the last round may be cut by max_tokens: the widest round is the arm's width
        assert ev.engaged and ev.verify_calls > 0 and max(ev.widths) == int(name[1:])
    assert a["concurrent"].verdict == "match"
    assert a["baseline-end"].verdict == "match"
    # the server that would not start: an error arm with its log tail, and every other arm still ran
    assert a["w4"].verdict == "error" and "exited with code 2" in a["w4"].reason
    assert "--no-such-flag" in a["w4"].server["log_tail"]
    assert seen == ["baseline-start", "w2", "w4", "concurrent", "baseline-end"]
    # one group, classic decode computed in process its member too
    assert report.pairings[0].groups() == [["classic decode", "baseline-start", "w2", "concurrent", "baseline-end"]]
    assert report.verdict == "error" and report.exit_code == 4


@pytest.mark.model
@pytest.mark.server
@pytest.mark.slow
def test_rows_fault_diverges_exactly_at_and_above_its_threshold(scaled_rows4_pair: FixtureInfo, tmp_path: Path,
                                                              cli_bin: str) -> None:
    pair = scaled_rows4_pair
    report = ServedRun(job(pair, widths=[3, 4, 5], max_tokens=24), workdir=tmp_path).run()
    a = arms(report)
    assert [a[f"w{w}"].verdict for w in (3, 4, 5)] == ["match", "diverged", "diverged"]
    groups = report.pairings[0].groups()
    base_group = next(g for g in groups if "baseline-start" in g)
    assert {"w3", "baseline-end"} <= set(base_group) and not {"w4", "w5"} & set(base_group)
    r = a["w4"].requests[0]
    assert r.divergence is not None and r.divergence.token_index is not None
    assert r.divergence.margin_reference is not None  # logprobs came back: the top-2 margin is reported
    # the first request of a fresh server: mlx-lm's own speculative path rerun in process at that width
    assert r.replay and r.replay.startswith("specparity replay --model ") and "--num-draft-tokens 3" in r.replay
    ran = check_reproductions(report, cli_bin)  # w4's and w5's, each exits 1 at its own first index
    assert [(x.arm, x.request) for x in ran] == [("w4", "p0"), ("w5", "p0")] and all(x.command for x in ran)
    assert report.exit_code == 1
    text = "\n".join(report.lines())
    assert "w4" in text and "first difference at token" in text and "reproduce in process" in text


@pytest.mark.model
@pytest.mark.server
@pytest.mark.slow
def test_forward_not_reproducible_across_processes_is_inconclusive(fixture_root, llama_pair, tmp_path):
    # a bias this large on one token decides every greedy token, and each process (each server, and
    # classic decode here) favours the next of these tokens: their texts differ for sure. A random
    # bias per process left two baselines agreeing about 1 time in 16: a quarter of this vocabulary
    # is lone UTF-8 bytes, which all reach the client as U+FFFD (scale 4 left them agreeing often).
    from mlx_lm.utils import load_tokenizer

    tok = load_tokenizer(Path(llama_pair.target))  # the fixture builder's tokenizer, the same below
    pieces = {i: tok.decode([i]) for i in range(tok.vocab_size)}
    tokens = [i for i, p in pieces.items() if p.strip() and "\ufffd" not in p and p.isprintable()][:8]
    assert len({pieces[i] for i in tokens}) == 8  # eight distinct pieces: 12 repeats of one are no other's
    pair = build(fixture_root, "llama-noise50-served", arch="llama",
                 faults=[{"kind": "process_noise", "scale": 50.0, "tokens": tokens}])
    report = ServedRun(job(pair, widths=[2]), workdir=tmp_path).run()
    p = report.pairings[0]
    assert p.verdict == "inconclusive" and "baselines disagree" in p.reason
    assert arms(report)["w2"].verdict == "inconclusive"  # not judged
    assert report.exit_code == 3


@pytest.mark.model
@pytest.mark.server
@pytest.mark.slow
def test_server_without_any_witness_is_not_engaged(llama_pair, tmp_path):
    prof = tmp_path / "blind.yaml"
    prof.write_text(yaml.safe_dump({"extends": "mlx-lm", "name": "blind-mlx-lm", "witness": []}))
    report = ServedRun(job(llama_pair, profile=str(prof), widths=[3]), workdir=tmp_path / "w").run()
    a = arms(report)
    assert a["w3"].verdict == "not_engaged"
    assert a["w3"].requests[0].completion.sha256 == a["baseline-start"].requests[0].completion.sha256
    assert report.exit_code == 3


def _children(pid: int) -> set[int]:
    out = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                rest = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(rest[1]) == pid:
                out.add(int(d.name))
    return out


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.server
def test_ctrl_c_mid_job_leaves_no_server_and_a_readable_record(llama_pair, tmp_path, cli_bin):
    cfg = tmp_path / "job.yaml"
    cfg.write_text(yaml.safe_dump({"pairings": [{"name": "p", "target": llama_pair.target,
                                                 "draft": llama_pair.draft}],
                                   "widths": [2, 3, 4], "max_tokens": 12, "sequence": ["fresh"]}))
    rec = tmp_path / "rec"
    proc = subprocess.Popen([cli_bin, "served", "--config", str(cfg), "--record-dir", str(rec), "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    groups: set[int] = set()
    try:
        deadline = time.time() + 180
        # wait until baseline-start is recorded and the next server is up
        while time.time() < deadline:
            arms_file = list(rec.glob("data/*/arms.jsonl"))
            groups |= {os.getpgid(c) for c in _children(proc.pid) if _safe_pgid(c)} - {os.getpgid(proc.pid)}
            if arms_file and arms_file[0].read_text().count("\n") >= 1 and _children(proc.pid):
                break
            time.sleep(0.2)
        else:
            pytest.fail("the job never finished its first arm")
        time.sleep(1.0)
        groups |= {os.getpgid(c) for c in _children(proc.pid) if _safe_pgid(c)} - {os.getpgid(proc.pid)}
        assert groups, "no server was running"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert not any(group_alive(g) for g in groups)
    md = next(rec.glob("*.md"))
    record, _, parts = read_record(md)
    assert record.status == "interrupted"
    assert parts["arms"][0]["name"] == "baseline-start"
    assert parts["p-baseline-start"][0]["sha256"]
    assert (rec / "data" / md.stem / "servers" / "p" / "server-baseline-start.log").exists()


def _safe_pgid(pid: int) -> bool:
    try:
        os.getpgid(pid)
        return True
    except ProcessLookupError:
        return False


@pytest.mark.parametrize("args, message", [
    (["--config", "/no/such.yaml"], "--config /no/such.yaml"),
    (["--profile", "nope"], "--profile 'nope'"),
    (["--draft-model", "/x"], "--draft-model needs --model"),
    (["--widths", "1"], "--widths '1': 1 is below the minimum 2"),
])
def test_bad_input_is_one_line_and_exit_2(cli_bin, args, message):
    r = run_cli(cli_bin, "served", *args)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") <= 1


def test_bad_config_keys_name_the_file_and_key(cli_bin, tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("widths: [2]\nwidht_mode: request\n")
    r = run_cli(cli_bin, "served", "--config", str(cfg))
    assert r.returncode == 2 and "unknown key 'widht_mode'" in r.stderr and str(cfg) in r.stderr

