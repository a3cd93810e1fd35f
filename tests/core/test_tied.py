"""specparity.tied: the one way a process that runs for long is started, and every spawn site uses it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from specparity.tied import run_tied_captured

ROOT = Path(__file__).resolve().parents[2]
TESTS = str(Path(__file__).resolve().parents[1])

# a child that ignores SIGTERM and starts a child of its own: the hardest to stop
STUBBORN = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
            " subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); time.sleep(600)")

# dflash-mlx's `dflash generate` e2e arm (its e2e.run_dflash_cli), its console script replaced by the stubborn child
OWNER = textwrap.dedent("""
    import sys
    from specparity.engines.dflash_mlx import e2e as e2e_dflash
    e2e_dflash.dflash_cli_argv = lambda *a: [sys.executable, "-c", {stubborn!r}]
    print("spawning", flush=True)
    e2e_dflash.run_dflash_cli("target", "draft", "prompt", 1)
""")


def test_sigkill_of_a_probe_leaves_no_cli_arm_or_its_child(tmp_path: Path) -> None:
    """e2e's CLI arm ran under plain subprocess.run: a SIGKILLed e2e left `dflash generate` running.

    The tie as this platform gets it (parent-death signal and watcher on Linux); the watcher alone, as on
    macOS, is shown for the same mechanism by test_harness_lifecycle's servers."""
    import uuid

    sys.path.insert(0, TESTS)
    from fakeserver import MARK_ENV, marked, wait_gone

    mark = uuid.uuid4().hex
    owner = subprocess.Popen([sys.executable, "-P", "-c", OWNER.format(stubborn=STUBBORN)],
                             stdout=subprocess.PIPE, text=True, cwd=tmp_path, env={**os.environ, MARK_ENV: mark})
    try:
        assert owner.stdout is not None and owner.stdout.readline().strip() == "spawning"
        # the owner, the arm, the arm's child and the arm's watcher (none, untied: the wait runs out)
        deadline = time.monotonic() + 30
        while len(marked(mark)) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(marked(mark)) >= 3, marked(mark)
        owner.kill()
        owner.wait(30)
        left = wait_gone(mark)
        assert not left, f"still running after the probe was SIGKILLed: {left}"
    finally:
        for pid in marked(mark):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_run_tied_captured_is_subprocess_run_with_a_timeout_that_stops_the_group() -> None:
    echo = run_tied_captured([sys.executable, "-c", "import sys; t = sys.stdin.read(); print(t.upper());"
                              " print('e', file=sys.stderr); sys.exit(3)"], "echo", timeout=60, input="héllo")
    assert (echo.returncode, echo.stdout, echo.stderr) == (3, "HÉLLO\n", "e\n")
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_tied_captured([sys.executable, "-c", STUBBORN], "stubborn", timeout=1.0, grace=0.5)
    assert time.monotonic() - t0 < 30


# the spawn sites that may call subprocess directly, each with why: a short tool invocation that ends by
# itself in seconds (a version line, git, an import probe), or an environment's build (venv, pip)
ALLOWED = {
    "specparity/tied.py": "the tied mechanism itself",
    "specparity/identity.py": "git rev-parse, 5 s timeout",
    "specparity/environments.py": "an environment's build: python -m venv, pip install / download, import probes"
                                  " with timeouts; no child serves or outlives the build",
    "specparity/engines/llama_cpp/served.py": "llama-server --version, 30 s timeout",
    "harness/run.py": "a profile's version command, short, timed out",
    "harness/memory.py": "ps and sysctl (macOS) for memory figures, 10 s timeouts",
}
CALL = re.compile(r"\bsubprocess\.(Popen|run|call|check_call|check_output)\(")


def test_no_module_outside_tied_starts_a_child_with_plain_subprocess() -> None:
    found = {}
    for folder in ("specparity", "probes", "bisect", "harness", "records"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            calls = sorted({m.group(1) for m in CALL.finditer(path.read_text())})
            if calls and rel not in ALLOWED:
                found[rel] = calls
    assert not found, f"start these through specparity.tied (or allow them here, saying why): {found}"


def test_the_spawn_check_fires_on_a_plain_popen_and_allows_nothing_stale() -> None:
    assert CALL.search("proc = subprocess.Popen(argv)")
    assert CALL.search("subprocess.run([x], timeout=3)")
    assert not CALL.search("proc: subprocess.Popen[str] | None = None")
    # an allowance whose module no longer calls subprocess is dropped, not kept as a blind spot
    assert all(CALL.search((ROOT / rel).read_text()) for rel in ALLOWED), ALLOWED


def test_wait_group_gone_waits_for_members_the_leader_left_behind() -> None:
    """A leader reaped is not a group gone: a member it left keeps its memory until it ends, and the next
    copy of a model must not load beside it (Server.stop and the reference worker's end wait for this)."""
    import subprocess
    import time

    from specparity.tied import wait_group_gone
    from specparity.watchdog import group_alive

    proc = subprocess.Popen(["sh", "-c", "sleep 0.6 & exit 0"], start_new_session=True)
    proc.wait(5)
    assert group_alive(proc.pid)  # the leader is reaped, its child still runs in the group
    assert not wait_group_gone(proc.pid, timeout=0.05)
    t0 = time.monotonic()
    assert wait_group_gone(proc.pid, timeout=5)
    assert 0.3 < time.monotonic() - t0 < 4 and not group_alive(proc.pid)
