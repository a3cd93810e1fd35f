"""The server lifecycle on real processes: a real mlx_lm.server, a server that dies, one that ignores SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest
from specparity.harness.lifecycle import (
    Server,
    ServerStartError,
    group_alive,
    live_servers,
    stop_all,
)

REPO_ROOT = Path(__file__).resolve().parent.parent


def mlx_lm_argv(model: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "mlx_lm", "server", "--model", model, "--port", "{port}", *extra]


@pytest.mark.model
@pytest.mark.server
def test_real_mlx_lm_server_ready_serves_and_stops_with_its_group(llama_pair, tmp_path):
    log = tmp_path / "logs" / "srv.log"
    with Server(mlx_lm_argv(llama_pair.target), log_path=log, name="plain") as srv:
        assert srv.alive() and srv.times.start is not None
        assert os.getpgid(srv.pid) == srv.pid  # its own process group
        assert not Path(srv.cwd).resolve().is_relative_to(REPO_ROOT)
        r = httpx.post(srv.url + "/v1/completions", timeout=60,
                       json={"prompt": "The quick brown fox", "max_tokens": 8, "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8
        assert srv in live_servers()
        pgid = srv.pgid
    assert not group_alive(pgid)
    assert srv not in live_servers()
    assert "POST /v1/completions" in log.read_text()  # the log is kept


@pytest.mark.server
def test_server_that_exits_raises_at_once_with_its_log_tail(tmp_path):
    t0 = time.perf_counter()
    srv = Server(mlx_lm_argv(str(tmp_path / "no-such-model")), start_timeout=60, name="broken",
                 fail_regex=r"^Traceback \(most recent call last\)")
    with pytest.raises(ServerStartError) as err:
        srv.start()
    assert time.perf_counter() - t0 < 30  # did not wait for the deadline
    assert "failed while starting" in str(err.value) and "no-such-model" in err.value.log_tail
    assert not group_alive(srv.pgid)


HANG = textwrap.dedent("""
    import signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print("child", child.pid, flush=True)
    time.sleep(600)
""")


def test_process_that_exits_raises_with_its_exit_code(tmp_path):
    srv = Server([sys.executable, "-c", "import sys; print('bad flag --x'); sys.exit(3)"], name="quits")
    with pytest.raises(ServerStartError, match="exited with code 3") as err:
        srv.start()
    assert err.value.returncode == 3 and "bad flag --x" in err.value.log_tail


def test_never_ready_times_out_and_sigkill_takes_the_whole_group(tmp_path):
    srv = Server([sys.executable, "-c", HANG], start_timeout=1.5, stop_timeout=0.5, name="hang",
                 log_path=tmp_path / "hang.log")
    with pytest.raises(ServerStartError, match="not ready on /health after 1.5 s"):
        srv.start()
    assert srv.proc.returncode == -signal.SIGKILL  # SIGTERM was ignored
    assert not group_alive(srv.pgid)  # the grandchild went with it


def test_stop_all_stops_every_live_server(tmp_path):
    servers = [Server([sys.executable, "-c", "import time; time.sleep(600)"], name=f"s{i}") for i in range(2)]
    for s in servers:
        s.spawn()
    assert all(s in live_servers() for s in servers)
    stop_all()
    assert not live_servers()
    assert not any(group_alive(s.pgid) for s in servers)


PARENT = textwrap.dedent("""
    import sys, time
    from specparity.harness.lifecycle import Server
    srv = Server([sys.executable, "-c", "import time; time.sleep(600)"], name="child")
    srv.spawn()
    print(srv.pgid, flush=True)
    try:
        time.sleep(600)
    except KeyboardInterrupt:
        sys.exit(130)
""")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_the_owner_stops_its_servers(sig, tmp_path):
    owner = subprocess.Popen([sys.executable, "-P", "-c", PARENT], stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        pgid = int(owner.stdout.readline())
        assert group_alive(pgid)
        owner.send_signal(sig)
        owner.wait(30)
        assert not group_alive(pgid)
    finally:
        if owner.poll() is None:
            owner.kill()
