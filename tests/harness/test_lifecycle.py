"""The server lifecycle on real processes: a real mlx_lm.server, a server that dies, one that ignores SIGTERM."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest
from specparity.harness.lifecycle import (
    PORT_ARG,
    Server,
    ServerStartError,
    group_alive,
    live_servers,
    stop_all,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


def mlx_lm_argv(model: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "mlx_lm", "server", "--model", model, "--port", PORT_ARG, *extra]


@pytest.mark.model
@pytest.mark.server
def test_real_mlx_lm_server_ready_serves_and_stops_with_its_group(llama_pair, tmp_path):
    log = tmp_path / "logs" / "srv.log"
    with Server(mlx_lm_argv(llama_pair.target), log_path=log, name="plain") as srv:
        assert srv.alive() and srv.times.start is not None
        assert srv.pid is not None and os.getpgid(srv.pid) == srv.pid  # its own process group
        assert srv.cwd is not None and not Path(srv.cwd).resolve().is_relative_to(REPO_ROOT)
        r = httpx.post(srv.url + "/v1/completions", timeout=60,
                       json={"prompt": "The quick brown fox", "max_tokens": 8, "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8
        assert srv in live_servers()
        pgid = srv.pgid
    assert pgid is not None and not group_alive(pgid)
    assert srv not in live_servers()
    assert "POST /v1/completions" in log.read_text()  # the log is kept


@pytest.mark.server
def test_server_that_exits_raises_at_once_with_its_log_tail(tmp_path):
    """A real mlx_lm.server that exits before it listens (its own argument error). Not a missing model: mlx-lm
    0.32's server loads its model on its generation thread and answers /health 200 while that thread is alive, so
    a poll answered before the load fails is a start (its requests then fail: 404, "generation thread died");
    which comes first is the scheduler's call (a loaded worker's poll won it once)."""
    t0 = time.perf_counter()
    srv = Server(mlx_lm_argv(str(tmp_path / "no-such-model"), "--max-tokens", "many"), start_timeout=60,
                 name="broken", fail_regex=r"^Traceback \(most recent call last\)")
    with pytest.raises(ServerStartError) as err:
        srv.start()
    assert time.perf_counter() - t0 < 30  # did not wait for the deadline
    assert "exited with code 2 before it was ready" in str(err.value), err.value
    assert "argument --max-tokens: invalid int value: 'many'" in err.value.log_tail, err.value.log_tail
    assert srv.pgid is not None and not group_alive(srv.pgid)


# an engine whose loader raises on a worker thread while the process waits on (dflash serve's way): the
# traceback's first line is written first, its exception line a moment later
RAISES_AND_WAITS = textwrap.dedent("""
    import sys, time
    print("loading the target", flush=True)
    print("Traceback (most recent call last):", flush=True)
    time.sleep(0.5)
    print('  File "target_ops.py", line 141, in check', file=sys.stderr)
    print("    raise ValueError(", file=sys.stderr)
    print("ValueError: Unsupported target architecture for DFlash target ops: model_type=llama", file=sys.stderr,
          flush=True)
    time.sleep(600)
""")


# an http.server whose first health answer comes after the poll gave up (a loaded machine): socketserver logs that
# request's BrokenPipeError traceback, and the server goes on answering
SLOW_FIRST_HEALTH = textwrap.dedent("""
    import sys, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    polls, logged = [], []
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            polls.append(1)
            first = len(polls) == 1
            if first:
                time.sleep(POLL + 1.5)  # the poller has closed its connection by now
            self.send_response(200 if first or logged else 503)  # ready once that request's traceback is logged
            self.end_headers()
            for _ in range(50 if first else 1):  # a write after the peer's close may still succeed: keep writing
                self.wfile.write(b'{"status": "ok"}' * (4096 if first else 1))
                time.sleep(0.01)
    class Server(ThreadingHTTPServer):
        def handle_error(self, request, client_address):
            super().handle_error(request, client_address)
            sys.stderr.flush()
            logged.append(1)
    Server(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
""")


@pytest.mark.server
def test_a_health_poll_that_gave_up_early_is_not_a_failed_start(tmp_path):
    """A /health poll cut off at its READY_POLL seconds (the nightly matrix's w3 server under a loaded CI run)
    leaves socketserver's request traceback (BrokenPipeError) in the log; the profile's fail_regex matched it and
    the start failed. That traceback is one request's: the server answers the next poll and is ready; a traceback
    of its own still fails the start (start_failures, both ways)."""
    from specparity.harness.lifecycle import PORT_ARG, READY_POLL, start_failures

    script = SLOW_FIRST_HEALTH.replace("POLL", repr(READY_POLL))
    log = tmp_path / "server.log"
    with Server([sys.executable, "-c", script, PORT_ARG], name="slow-health", start_timeout=60, log_path=log,
                fail_regex=r"^Traceback \(most recent call last\)") as srv:
        assert srv.alive() and srv.times.start is not None and srv.times.start > READY_POLL
    text = log.read_text()
    assert "Exception occurred during processing of request from" in text and "Traceback" in text, text
    assert start_failures(r"^Traceback", text) == []
    own = text + "Traceback (most recent call last):\nValueError: no such model\n"
    assert [m.group() for m in start_failures(r"^Traceback", own)] == ["Traceback"]
    # the request's thread and the next poll's write to the log at once: a line may fall between the two (as
    # it did here under SCHED_BATCH); each request line still excuses one traceback, never more
    poll = '127.0.0.1 - - [07/Dec/2026 02:30:31] "GET /health HTTP/1.1" 503 -\n'
    block = ("-" * 40 + "\nException occurred during processing of request from ('127.0.0.1', 48788)\n" + poll
             + "Traceback (most recent call last):\nBrokenPipeError: [Errno 32] Broken pipe\n" + "-" * 40 + "\n")
    assert start_failures(r"^Traceback", poll + block + poll) == []
    assert len(start_failures(r"^Traceback", block + "Traceback (most recent call last):\nOSError: x\n")) == 1
    assert len(start_failures(r"^Traceback", "Traceback (most recent call last):\nOSError: x\n" + block)) == 1


@pytest.mark.server
def test_a_failed_start_says_the_engines_own_error_and_where_its_log_is_kept(tmp_path):
    """issue 30.10: the message said only that the log matched Traceback, and named a log removed at
    exit. It now gives the engine's last error line, and says when the log goes at exit; a server that
    exits says its error line beside its code."""
    from specparity.harness.lifecycle import remove_scratch, scratch_dir

    work = scratch_dir()  # where a served run without --record-dir keeps its servers' logs
    try:
        srv = Server([sys.executable, "-c", RAISES_AND_WAITS], name="dflash", start_timeout=60,
                     log_path=work / "server-dflash.log", fail_regex=r"^Traceback \(most recent call last\)")
        with pytest.raises(ServerStartError) as err:
            srv.start()
        assert str(err.value) == (
            "dflash failed while starting: ValueError: Unsupported target architecture for DFlash target ops:"
            f" model_type=llama; log {srv.log_path} (removed at exit: --record-dir keeps it)")
        assert srv.log_path is not None and Path(srv.log_path).is_file()
        assert srv.pgid is not None and not group_alive(srv.pgid)
    finally:
        remove_scratch(work)
    kept = Server([sys.executable, "-c", "import sys; sys.exit('Error: no such model: x')"], name="quits",
                  log_path=tmp_path / "quits.log")
    with pytest.raises(ServerStartError) as err:
        kept.start()
    assert str(err.value) == (f"quits exited with code 1 before it was ready: Error: no such model: x;"
                              f" log {kept.log_path}")


HANG = textwrap.dedent("""
    import signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print("child", child.pid, flush=True)
    time.sleep(600)
""")


@pytest.mark.server
def test_process_that_exits_raises_with_its_exit_code(tmp_path):
    srv = Server([sys.executable, "-c", "import sys; print('bad flag --x'); sys.exit(3)"], name="quits")
    with pytest.raises(ServerStartError, match="exited with code 3") as err:
        srv.start()
    assert err.value.returncode == 3 and "bad flag --x" in err.value.log_tail


@pytest.mark.slow
@pytest.mark.server
def test_never_ready_times_out_and_sigkill_takes_the_whole_group(tmp_path):
    # SIGTERM ignored from the shell's first line on, and across the exec (an ignored signal stays ignored):
    # HANG's own line comes after Python's start-up, which a loaded machine can stretch past the 1.5 s
    srv = Server(["/bin/sh", "-c", f"trap '' TERM; exec {shlex.quote(sys.executable)} -c \"$0\"", HANG],
                 start_timeout=1.5, stop_timeout=0.5, name="hang", log_path=tmp_path / "hang.log")
    with pytest.raises(ServerStartError, match="not ready on /health after 1.5 s"):
        srv.start()
    assert srv.proc is not None and srv.proc.returncode == -signal.SIGKILL  # SIGTERM was ignored
    assert srv.pgid is not None and not group_alive(srv.pgid)  # the grandchild went with it


CLEAN_UP = textwrap.dedent("""
    import pathlib, signal, subprocess, sys, time
    def clean_up(*_):
        time.sleep(0.3)  # an engine's own shutdown work
        pathlib.Path(sys.argv[1]).write_text("cleaned up")
        sys.exit(0)
    signal.signal(signal.SIGTERM, clean_up)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print("ready", flush=True)
    time.sleep(600)
""")


@pytest.mark.server
@pytest.mark.parametrize("graceful", [True, False])
def test_a_server_not_stopped_gracefully_gets_sigkill_at_once_with_its_group(tmp_path: Path, graceful: bool) -> None:
    """A profile's ``stop: kill``: no SIGTERM, so the server's own shutdown handler never runs (its 0.3 s is not
    waited for) and the group, its child included, is gone; the default runs the handler to its exit code 0."""
    marker = tmp_path / "marker"
    srv = Server([sys.executable, "-c", CLEAN_UP, str(marker)], graceful=graceful, name="cleans",
                 log_path=tmp_path / "s.log")
    srv.spawn()
    deadline = time.monotonic() + 30
    while "ready" not in (tmp_path / "s.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    t0 = time.monotonic()
    code = srv.stop()
    took = time.monotonic() - t0
    assert srv.pgid is not None and not group_alive(srv.pgid)
    if graceful:
        assert code == 0 and marker.read_text() == "cleaned up" and took >= 0.3, (code, took)
    else:
        assert code == -signal.SIGKILL and not marker.exists() and took < 0.3 + 2.0, (code, took)
        assert srv.times.stop is not None and srv.times.stop < 0.3 + 2.0


@pytest.mark.server
def test_stop_all_stops_every_live_server(tmp_path):
    servers = [Server([sys.executable, "-c", "import time; time.sleep(600)"], name=f"s{i}") for i in range(2)]
    for s in servers:
        s.spawn()
    assert all(s in live_servers() for s in servers)
    stop_all()
    assert not live_servers()
    for s in servers:
        assert s.pgid is not None and not group_alive(s.pgid)


@pytest.mark.server
def test_a_ready_path_that_trickles_bytes_is_not_ready_by_the_deadline(tmp_path: Path) -> None:
    """Each poll had a 2 s per-read timeout and the deadline was checked only between polls: a
    /health that sends a byte every 0.2 s, forever, held start-up for good."""
    from fakeserver import argv, bounded

    srv = Server(argv("--trickle", "/health"), start_timeout=2.0, name="trickle", log_path=tmp_path / "t.log")
    t0 = time.monotonic()
    try:
        with pytest.raises(ServerStartError, match="trickle not ready on /health after 2 s"):
            bounded(srv.start, 60)
    finally:
        srv.stop()
    assert time.monotonic() - t0 < 30  # the deadline, with any slack a loaded machine needs
    assert "fakeserver: trickling /health" in (tmp_path / "t.log").read_text()  # it was polled, and answered so
    assert srv.pgid is not None and not group_alive(srv.pgid)


def test_marked_processes_are_found_through_ps_as_through_proc(tmp_path: Path) -> None:
    """The fallback macOS takes (no /proc), run here on procps: the same processes, zombies left out."""
    import uuid

    from fakeserver import MARK_ENV, marked, marked_by_ps

    mark = uuid.uuid4().hex
    env = {**os.environ, MARK_ENV: mark}
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=env) for _ in range(2)]
    try:
        want = {p.pid for p in procs}
        deadline = time.monotonic() + 30
        while set(marked_by_ps(mark)) != want and time.monotonic() < deadline:
            time.sleep(0.1)
        assert set(marked_by_ps(mark)) == want
        if Path("/proc").is_dir():
            assert set(marked(mark)) == want
        procs[0].kill()
        while not _is_zombie(procs[0].pid) and time.monotonic() < deadline:  # killed, not reaped yet
            time.sleep(0.05)
        assert set(marked_by_ps(mark)) == {procs[1].pid}
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert marked_by_ps(mark) == []


def _is_zombie(pid: int) -> bool:
    out = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True)
    return out.stdout.strip().startswith("Z")


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
        assert owner.stdout is not None
        pgid = int(owner.stdout.readline())
        assert group_alive(pgid)
        owner.send_signal(sig)
        owner.wait(30)
        assert not group_alive(pgid)
    finally:
        if owner.poll() is None:
            owner.kill()


# -- issue 20, class 5: no server outlives the harness, whatever kills it ------------------------
OWNER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {tests!r})
    import fakeserver
    from specparity.harness import lifecycle
    lifecycle.PARENT_DEATH_SIGNAL = {pdeath!r}
    # a server that ignores SIGTERM and has a child in its group: the hardest to stop
    srv = lifecycle.Server(fakeserver.argv("--child", "--ignore-term"), name="fake", stop_timeout=1.0)
    srv.start()
    print(srv.pid, flush=True)
    time.sleep(600)
""")
TESTS = str(Path(__file__).resolve().parents[1])


def _owner(tmp_path: Path, pdeath: bool) -> tuple[subprocess.Popen, str, int]:
    """A harness process owning one fake server; returns it, its mark and the server's pid."""
    import uuid

    from fakeserver import MARK_ENV

    mark = uuid.uuid4().hex
    owner = subprocess.Popen([sys.executable, "-P", "-c", OWNER.format(tests=TESTS, pdeath=pdeath)],
                             stdout=subprocess.PIPE, text=True, cwd=tmp_path, env={**os.environ, MARK_ENV: mark})
    try:
        line = owner.stdout.readline() if owner.stdout else ""
        assert line.strip().isdigit(), "the owner did not start its server"
        server = int(line)
        # owner, server, the server's child and the server's watcher
        assert server in _wait_marked(mark, 4)
    except BaseException:
        _kill_marked(mark)
        raise
    return owner, mark, server


@pytest.mark.server
@pytest.mark.parametrize("pdeath", [True, False], ids=["parent-death-signal-and-watcher", "watcher-only"])
def test_sigkill_of_the_harness_leaves_no_server_or_child(tmp_path: Path, pdeath: bool) -> None:
    """watcher-only is what macOS gets (no parent-death signal): the pipe alone must do it."""
    if pdeath and not sys.platform.startswith("linux"):
        pytest.skip("the parent-death signal is Linux's")
    owner, mark, server = _owner(tmp_path, pdeath)
    _kill_and_find_nothing_left(owner, mark)


def _wait_marked(mark: str, n: int) -> list[int]:
    """The processes carrying ``mark`` once there are ``n`` (a watcher starts after its child
    returns: polled, 30 s at most), asserted to be exactly ``n``."""
    from fakeserver import marked

    deadline = time.monotonic() + 30
    while len(marked(mark)) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    found = marked(mark)
    assert len(found) == n, found
    return found


def _kill_and_find_nothing_left(owner: subprocess.Popen, mark: str) -> None:
    """SIGKILL the harness standing in ``owner``; nothing carrying ``mark`` may outlive it."""
    from fakeserver import wait_gone

    try:
        owner.kill()
        owner.wait(30)
        left = wait_gone(mark)
        assert not left, f"still running after the harness was SIGKILLed: {left}"
    finally:
        _kill_marked(mark)


ORACLE_OWNER = textwrap.dedent("""
    import sys, time
    from specparity.harness import lifecycle
    from specparity.harness.oracle import Oracle
    lifecycle.PARENT_DEATH_SIGNAL = {pdeath!r}
    oracle = Oracle("/checkpoint", False, {busy!r})
    oracle.spawn()
    print(oracle.proc.pid, flush=True)
    time.sleep(600)
""")


def _busy_worker(tmp_path: Path) -> str:
    """A stand-in for the classic reference's interpreter: a worker that is busy (never reads its
    input, as one computing a large model's answer for minutes does not)."""
    busy = tmp_path / "busy-python"
    busy.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(600)\n")
    busy.chmod(0o755)
    return str(busy)


@pytest.mark.parametrize("pdeath", [True, False], ids=["parent-death-signal-and-watcher", "watcher-only"])
def test_sigkill_of_the_harness_takes_a_busy_classic_reference_worker(tmp_path: Path, pdeath: bool) -> None:
    """The worker lived on after SIGKILL of served until it next read its input (minutes on a big model)."""
    import uuid

    from fakeserver import MARK_ENV

    if pdeath and not sys.platform.startswith("linux"):
        pytest.skip("the parent-death signal is Linux's")
    mark = uuid.uuid4().hex
    owner = subprocess.Popen([sys.executable, "-P", "-c", ORACLE_OWNER.format(pdeath=pdeath,
                                                                              busy=_busy_worker(tmp_path))],
                             stdout=subprocess.PIPE, text=True, cwd=tmp_path, env={**os.environ, MARK_ENV: mark})
    try:
        line = owner.stdout.readline() if owner.stdout else ""
        assert line.strip().isdigit(), "the owner did not start its worker"
        worker = int(line)
        assert worker in _wait_marked(mark, 3)  # owner, worker, the worker's watcher
    except BaseException:
        _kill_marked(mark)
        raise
    _kill_and_find_nothing_left(owner, mark)


def test_stop_all_stops_the_classic_reference_worker(tmp_path: Path) -> None:
    """Ctrl-C and SIGTERM run stop_all: the worker (in a session of its own, so the terminal's
    Ctrl-C no longer reaches it) is stopped with the servers, and says so."""
    from specparity.harness.oracle import Oracle

    oracle = Oracle("/checkpoint", False, _busy_worker(tmp_path))
    oracle.spawn()
    assert oracle.proc is not None
    pid = oracle.proc.pid
    try:
        assert os.getpgid(pid) == pid  # its own group: the watcher stops all of it
        stop_all()
    finally:
        if oracle.proc is not None:
            oracle.proc.kill()
            oracle.proc.wait()
    assert oracle.proc is None and oracle.failed == "the classic reference was stopped"
    assert not group_alive(pid)
    answer = oracle.complete("completions", {"prompt": "x"})
    assert answer.completion is None and answer.error == "the classic reference was stopped"


@pytest.mark.slow
@pytest.mark.server
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_parent_death_signal_alone_takes_the_server(tmp_path: Path) -> None:
    """The watcher killed first: the kernel's signal still ends the server when the harness dies."""
    from fakeserver import marked

    owner, mark, server = _owner(tmp_path, True)
    try:
        watcher = [p for p in marked(mark) if b"watch" in Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")]
        assert len(watcher) == 1
        os.kill(watcher[0], signal.SIGKILL)
        owner.kill()
        owner.wait(30)
        deadline = time.monotonic() + 60
        while server in marked(mark) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server not in marked(mark)
    finally:
        _kill_marked(mark)


def _kill_marked(mark: str) -> None:
    from fakeserver import marked

    for pid in marked(mark):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.server
def test_a_server_started_from_a_thread_that_ends_keeps_running(tmp_path: Path) -> None:
    """Linux sends the parent-death signal when the forking *thread* exits: servers are forked from
    one thread that lives as long as the process, never from the caller's."""
    import threading

    import httpx
    from fakeserver import argv

    srv = Server(argv(), name="from-a-thread", log_path=tmp_path / "t.log")
    t = threading.Thread(target=srv.start)
    t.start()
    t.join(60)
    try:
        assert srv.alive()
        time.sleep(0.5)  # a parent-death signal would have arrived by now
        assert srv.alive() and httpx.get(srv.url + "/health", timeout=10).status_code == 200
    finally:
        srv.stop()
    assert srv.pgid is not None and not group_alive(srv.pgid)


# -- issue 20, class 10: placeholders only where they belong -------------------------------------
@pytest.mark.server
def test_a_model_path_holding_placeholders_reaches_the_server_as_it_is(tmp_path: Path) -> None:
    """The profile's {port} is the port; a {port} or {host} inside the model path is the path's."""
    import httpx
    import yaml
    from fakeserver import __file__ as fake_py
    from specparity.harness.lifecycle import HOST
    from specparity.harness.profiles import load_profile

    prof = tmp_path / "fake.yaml"
    prof.write_text(yaml.safe_dump({
        "name": "fake", "argv": ["{python}", "-I", fake_py, "--model", "{model}", "--host", "{host}",
                                 "--port", "{port}", "--url=http://{host}:{port}/v1"],
        "draft_argv": ["--draft-model", "{draft_model}", "--num-draft-tokens", "{num_draft}"]}))
    p = load_profile(str(prof))
    model = str(tmp_path / "m-{port}-{host}-{{x}}-{0}")
    draft = str(tmp_path / "d-{port}")
    # as harness.run.PairingRun.server_argv renders it
    argv = p.render(p.argv, model=model, host=HOST, port="{port}")
    argv += p.render(p.draft_argv, draft_model=draft, num_draft=3, width=4)
    with Server(argv, name="fake", log_path=tmp_path / "fake.log") as srv:
        got = httpx.get(srv.url + "/argv", timeout=10).json()
    assert got[got.index("--model") + 1] == model
    assert got[got.index("--draft-model") + 1] == draft
    assert got[got.index("--port") + 1] == str(srv.port)
    assert f"--url=http://{HOST}:{srv.port}/v1" in got
    # a plain item is never a template, even one that is exactly a placeholder
    with Server([*fake_argv_plain(fake_py), "--model", "{port}"], name="plain", log_path=tmp_path / "p.log") as srv:
        got = httpx.get(srv.url + "/argv", timeout=10).json()
    assert got[got.index("--model") + 1] == "{port}"


def fake_argv_plain(fake_py: str) -> list[str]:
    return [sys.executable, "-I", fake_py, "--port", PORT_ARG]


@pytest.mark.parametrize("item, words", [
    ("{0}", "placeholder {0}"), ("{}", "placeholder {}"), ("{model", "expected '}'"), ("x}", "Single '}'"),
    ("{model.__class__}", "placeholder {model.__class__}"), ("{nope}", "has no value here"),
    ("{model:>99999999999}", "argv: placeholder {model:>99999999999} in '{model:>99999999999}': no format spec"),
    ("{model!r}", "argv: placeholder {model!r} in '{model!r}': no format spec or conversion"),
])
def test_a_bad_template_item_is_a_usage_error_naming_the_profile(tmp_path: Path, item: str, words: str) -> None:
    import yaml
    from specparity.errors import UsageError
    from specparity.harness.profiles import load_profile

    prof = tmp_path / "bad.yaml"
    prof.write_text(yaml.safe_dump({"name": "bad", "argv": ["{python}", item]}))
    with pytest.raises(UsageError, match=f"profile bad .*{re.escape(words)}"):
        load_profile(str(prof))  # the dry render at load (issue 20, class 1): not when a server starts


@pytest.mark.server
def test_a_missing_executable_is_refused_at_spawn_behind_the_exec_wrapper(tmp_path: Path) -> None:
    for exe, words in (("specparity-no-such-server", "on PATH"), ("./no-such-server", "not an executable file")):
        srv = Server([exe, "--port", PORT_ARG], name="missing", log_path=tmp_path / "m.log", cwd=tmp_path)
        with pytest.raises(ServerStartError, match=f"missing: cannot run '{re.escape(exe)}': .*{words}"):
            srv.spawn()
        assert srv.proc is None and srv not in live_servers()
    # a relative path runs from the server's cwd, as Popen runs it
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "srv").symlink_to(sys.executable)
    srv = Server(["./bin/srv", "-c", "import time; time.sleep(60)"], name="relative", log_path=tmp_path / "r.log",
                 cwd=tmp_path)
    srv.spawn()
    try:
        assert srv.alive()
    finally:
        srv.stop()
