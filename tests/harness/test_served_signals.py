"""Whatever stops `specparity served`, no server outlives it, the record says
how the run ended, and a run without --record-dir leaves no temporary folder.

Servers are tests/fakeserver.py (a stalled request holds the job mid-request) and, once,
mlx-lm's real server. Every process a test starts carries a mark in its environment; what
is left is found by scanning /proc (fakeserver.marked), re-parented or not.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import own_tmpdir
from fakeserver import MARK_ENV, marked, wait_gone
from specparity.records.record import read_record

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds processes through /proc")
FAKE = str(Path(__file__).resolve().parents[1] / "fakeserver.py")


def _profile(tmp_path: Path, mode: str) -> Path:
    prof = tmp_path / f"fake-{mode}.yaml"
    prof.write_text(yaml.safe_dump({
        "name": "fake", "argv": ["{python}", "-I", FAKE, "--model", "{model}", "--host", "{host}", "--port", "{port}",
                                 "--mode", mode],
        "draft_argv": ["--draft-model", "{draft_model}", "--num-draft-tokens", "{num_draft}"]}))
    return prof


def _served(cli_bin: str, pair: Any, tmp_path: Path, mode: str, *extra: str) -> tuple[subprocess.Popen, str, Path]:
    """`specparity served` on the fake server, in its own TMPDIR, marked."""
    mark = uuid.uuid4().hex
    tmp = tmp_path / "tmpdir"
    if not tmp.exists():
        own_tmpdir(tmp)
    env = {**os.environ, MARK_ENV: mark, "TMPDIR": str(tmp)}
    proc = subprocess.Popen([cli_bin, "served", "--model", pair.target, "--draft-model", pair.draft,
                             "--profile", str(_profile(tmp_path, mode)), "--widths", "2", "--max-tokens", "4",
                             "--quiet", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    return proc, mark, tmp


def _wait_for_request(mark: str, proc: subprocess.Popen, seconds: float = 120) -> None:
    """Until a fake server of this run has received a request (its log says so)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        if _requested(mark):
            return
        time.sleep(0.1)
    pytest.fail("no request reached the server")


def _requested(mark: str) -> bool:
    """Whether a fake server of this run has received a request (its log says so)."""
    for pid in marked(mark):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            log = Path(f"/proc/{pid}/fd/1").read_text() if FAKE.encode() in cmd else ""
        except OSError:
            continue
        if "fakeserver: /v1/" in log:
            return True
    return False


def _left_in(tmp: Path) -> list[str]:
    """What the run left in its TMPDIR, apart from mlx's own compiled-kernel cache (TMPDIR/mlx)."""
    return [p.name for p in tmp.iterdir() if p.name != "mlx"]


def _cleanup(proc: subprocess.Popen, mark: str) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.communicate()
    for pid in marked(mark):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.server
def test_a_run_without_record_dir_leaves_no_temporary_folder(cli_bin: str, llama_pair: Any, tmp_path: Path) -> None:
    proc, mark, tmp = _served(cli_bin, llama_pair, tmp_path, "ok")
    try:
        _, err = proc.communicate(timeout=300)
    finally:
        _cleanup(proc, mark)
    assert proc.returncode in (0, 3), err  # the fake never shows a drafter: not_engaged
    assert not _left_in(tmp)
    assert not wait_gone(mark)


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.server
@pytest.mark.parametrize(("sig", "code", "line"),
                         [(signal.SIGTERM, 143, "Terminated."), (signal.SIGHUP, 129, "Hung up (SIGHUP).")],
                         ids=["SIGTERM", "SIGHUP"])
def test_a_signal_mid_request_marks_the_record_interrupted_stops_every_server_and_prints_one_json_object(
        cli_bin: str, llama_pair: Any, tmp_path: Path, sig: signal.Signals, code: int, line: str) -> None:
    """SIGTERM, and a closed terminal's SIGHUP (which left the record `running`: killed by the default action, no
    handler ran), end the run as Ctrl-C does: every server stops, the record is interrupted naming the signal,
    one line on stderr, and with --json stdout is the error object."""
    rec = tmp_path / "rec"
    proc, mark, tmp = _served(cli_bin, llama_pair, tmp_path, "stall", "--record-dir", str(rec), "--json")
    try:
        _wait_for_request(mark, proc)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
        left = wait_gone(mark)
    finally:
        _cleanup(proc, mark)
    assert proc.returncode == code, (proc.returncode, err)
    assert err.strip().splitlines()[-1] == line
    assert json.loads(out) == {"verdict": "error", "exit_code": code, "error": line}
    assert not left, f"still running: {left}"
    assert not _left_in(tmp)
    record, _, _ = read_record(next(rec.glob("*.md")))
    assert record.status == "interrupted" and record.error == sig.name


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.server
def test_a_closed_terminal_ends_the_run_with_129_and_an_interrupted_record(
        cli_bin: str, llama_pair: Any, tmp_path: Path) -> None:
    """The real thing: served on a pseudo-terminal it controls, closed mid-request. The kernel sends SIGHUP,
    and what the run prints on its way out meets a terminal that is gone (click's own newline before its
    Abort raised OSError: exit 70)."""
    import fcntl
    import select
    import termios

    master, slave = os.openpty()
    mark, rec = uuid.uuid4().hex, tmp_path / "rec"
    proc = subprocess.Popen([cli_bin, "served", "--model", llama_pair.target, "--draft-model", llama_pair.draft,
                             "--profile", str(_profile(tmp_path, "stall")), "--widths", "2", "--max-tokens", "4",
                             "--record-dir", str(rec)],
                            stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
                            preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),  # the terminal it controls
                            env={**os.environ, MARK_ENV: mark})
    os.close(slave)
    try:
        deadline = time.monotonic() + 120
        while not _requested(mark):
            assert proc.poll() is None and time.monotonic() < deadline, proc.returncode
            if select.select([master], [], [], 0.1)[0]:
                os.read(master, 65536)  # the progress lines, read as a terminal would show them
        os.close(master)
        master = -1
        proc.wait(120)
        left = wait_gone(mark)
    finally:
        if master >= 0:
            os.close(master)
        _cleanup(proc, mark)
    assert proc.returncode == 129, proc.returncode
    assert not left, f"still running: {left}"
    record, _, _ = read_record(next(rec.glob("*.md")))
    assert record.status == "interrupted" and record.error == "SIGHUP"


def test_an_ignored_sighup_stays_ignored() -> None:
    """`nohup specparity served ...` keeps running when its terminal closes: only a SIGHUP left at its
    default action is caught."""
    code = ("import signal\nfrom specparity.tied import catch_sigterm\n"
            "signal.signal(signal.SIGHUP, signal.SIG_IGN)\ncatch_sigterm()\n"
            "assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN\n"
            "signal.signal(signal.SIGHUP, signal.SIG_DFL)\ncatch_sigterm()\n"
            "assert signal.getsignal(signal.SIGHUP) not in (signal.SIG_IGN, signal.SIG_DFL)\n")
    r = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.server
def test_sigterm_without_record_dir_leaves_no_temporary_folder(cli_bin: str, llama_pair: Any, tmp_path: Path) -> None:
    proc, mark, tmp = _served(cli_bin, llama_pair, tmp_path, "stall")
    try:
        _wait_for_request(mark, proc)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=120)
    finally:
        _cleanup(proc, mark)
    assert proc.returncode == 143
    assert not _left_in(tmp)


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.server
def test_sigkill_mid_request_leaves_no_server_and_no_reference_worker(cli_bin: str, llama_pair: Any,
                                                                      tmp_path: Path) -> None:
    """The classic reference's worker too: stopped (SIGSTOP) as one busy computing a large model's
    answer is, it never reads the EOF of its input, and lived on after served's SIGKILL.

    --reference-beside: the worker runs only while no server is resident unless the job keeps it
    beside the servers; so both a server (holding the stalled request) and the worker are alive at the
    kill, and neither may outlive it."""
    proc, mark, _ = _served(cli_bin, llama_pair, tmp_path, "stall", "--reference-beside")
    try:
        _wait_for_request(mark, proc)
        workers = [p for p in marked(mark) if b"specparity.harness.reference" in _cmdline(p)]
        assert len(workers) == 1, [(p, _cmdline(p)) for p in marked(mark)]
        assert any(FAKE.encode() in _cmdline(p) for p in marked(mark))  # and the server, mid-request
        os.kill(workers[0], signal.SIGSTOP)
        proc.kill()
        proc.communicate(timeout=60)
        left = wait_gone(mark)
    finally:
        _cleanup(proc, mark)
    assert not left, f"survived the SIGKILL of served: {[(p, _cmdline(p)) for p in left]}"


@pytest.mark.slow
@pytest.mark.server
@pytest.mark.model
def test_sigkill_of_served_mid_job_leaves_no_real_mlx_lm_server(cli_bin: str, llama_pair: Any, tmp_path: Path) -> None:
    """The issue's must-show: a real `specparity served` on real mlx_lm.server processes, SIGKILLed
    between arms while a server runs; checked by process, on this OS."""
    cfg = tmp_path / "job.yaml"
    cfg.write_text(yaml.safe_dump({"pairings": [{"name": "p", "target": llama_pair.target,
                                                 "draft": llama_pair.draft}],
                                   "widths": [2, 3, 4], "max_tokens": 12, "sequence": ["fresh"]}))
    rec = tmp_path / "rec"
    mark = uuid.uuid4().hex
    proc = subprocess.Popen([cli_bin, "served", "--config", str(cfg), "--record-dir", str(rec), "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, MARK_ENV: mark})
    try:
        deadline = time.monotonic() + 300
        servers: list[int] = []
        while time.monotonic() < deadline:  # the first arm finished and the next server runs
            arms = list(rec.glob("data/*/arms.jsonl"))
            servers = [p for p in marked(mark) if p != proc.pid and b"mlx_lm" in _cmdline(p)]
            if arms and arms[0].read_text().count("\n") >= 1 and servers:
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        else:
            pytest.fail("the job never finished its first arm")
        proc.kill()
        proc.communicate(timeout=60)
        left = wait_gone(mark)
    finally:
        _cleanup(proc, mark)
    assert servers and not left, f"mlx_lm.server processes {servers}; still running: {left}"
    record, _, _ = read_record(next(rec.glob("*.md")))
    assert record.status == "running"  # killed outright: readers show it incomplete


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""



def test_a_record_stopped_by_sigterm_says_interrupted_by_sigterm(tmp_path: Path) -> None:
    from specparity.errors import Terminated
    from specparity.records.record import RecordSink

    with pytest.raises(Terminated), RecordSink(tmp_path, "probe", "t", {}, argv=["x"]) as sink:
        sink.append("cells", {"verdict": "equal"})
        raise Terminated(signal.SIGTERM)
    record, _, parts = read_record(next(tmp_path.glob("*.md")))
    assert (record.status, record.error, len(parts["cells"])) == ("interrupted", "SIGTERM", 1)


def test_sigterm_of_a_command_without_servers_closes_its_record(cli_bin: str, tmp_path: Path) -> None:
    """SIGTERM before any server starts (here: dist, inside a user rule) unwinds like Ctrl-C too."""
    from conftest import sleeping_dist

    rec = tmp_path / "rec"
    proc = sleeping_dist(cli_bin, tmp_path, "--record-dir", str(rec))
    try:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143, (proc.returncode, err)
    record, _, _ = read_record(next(rec.glob("*.md")))
    assert record.status == "interrupted" and record.error == "SIGTERM"


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.server
def test_the_reference_worker_imports_beside_the_first_server_and_holds_no_weights_there(
        cli_bin: str, llama_pair: Any, tmp_path: Path) -> None:
    """Issue 49: the classic reference's worker imports mlx-lm while the first server starts and answers (about a
    second of a 0.5B-class job's wall time, which ran before any server); it is told to load only once that server
    is gone (``--wait-load``: one copy of the target at a time). Before, no worker lived during the first request."""
    proc, mark, _ = _served(cli_bin, llama_pair, tmp_path, "stall")
    try:
        _wait_for_request(mark, proc)
        cmdlines = [_cmdline(p) for p in marked(mark)]
    finally:
        _cleanup(proc, mark)
    workers = [c.split(b"\0") for c in cmdlines if b"specparity.harness.reference" in c]
    assert len([c for c in cmdlines if FAKE.encode() in c]) == 1, cmdlines
    assert len(workers) == 1 and b"--wait-load" in workers[0], cmdlines
