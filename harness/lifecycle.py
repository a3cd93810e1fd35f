"""The one server lifecycle: spawn, wait until ready, stop with the whole process group.

Every server specparity starts (the served job's arms, ``specparity serve`` in
tests, bisect's control arms) goes through :class:`Server`:

- started from an argv list, never a shell, on 127.0.0.1 and a free port: the
  items :data:`PORT_ARG` and :data:`HOST_ARG` (and any :class:`ArgTemplate`,
  whose only fields are ``{port}`` and ``{host}``) are filled in at spawn;
  every other item is passed as it is, so a model path holding ``{port}`` stays
  that path;
- with a working directory outside the repository root (the root ``bisect/``
  shadows the standard library for ``python -m``, ``mlx_lm.server`` included);
- in its own process group (``start_new_session=True``), stdout and stderr to a
  log file that is kept;
- ready when an HTTP path answers 200 (polled with httpx; a process that has
  already exited raises at once with its log tail; an explicit deadline);
- stopped with SIGTERM to the group, a wait, then SIGKILL to the group;
- unable to outlive the harness, however it dies (SIGKILL included): on Linux
  the server gets SIGKILL when the harness dies (a parent-death signal), and on
  every system a watcher process stops its whole group when a pipe only the
  harness holds closes (see :mod:`specparity.watchdog`).

:func:`spawn_tied` starts each such process (the servers, and the classic
reference's worker of harness.oracle) through :mod:`specparity.tied`, the one
way any long-running child starts (probes' CLI arms and bisect's control arms
too); its registry remembers every live one: :func:`stop_all` stops them, and is run at interpreter exit and on SIGINT /
SIGTERM (the handlers are installed the first time one starts and chain to the
previous ones).
SIGTERM then raises :class:`~specparity.errors.Terminated` in the main thread,
as SIGINT raises KeyboardInterrupt, so records close as interrupted.
:func:`scratch_dir` gives a temporary directory removed at exit, after the
servers that ran in it.

    with Server(["mlx_lm.server", "--model", m, "--port", PORT_ARG], log_path=log) as srv:
        httpx.post(srv.url + "/v1/completions", json={...}, timeout=60)
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from specparity.errors import InfrastructureError, UsageError
from specparity import tied
from specparity.tied import (
    DEFAULT_STOP_TIMEOUT,
    Stoppable,
    signal_group,
    catch_sigterm,
    end_watcher,
    register,
    run_tied,
    stop_all,
    unregister,
)
from specparity.watchdog import group_alive

__all__ = ["ArgTemplate", "HOST", "HOST_ARG", "PORT_ARG", "Server", "ServerStartError", "ServerTimes", "Stoppable",
           "catch_sigterm", "end_watcher", "free_port", "group_alive", "live_servers", "log_tail", "register",
           "remove_scratch", "resolve_argv", "run_tied", "scratch_dir", "spawn_tied", "stop_all", "unregister"]

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
DEFAULT_READY_PATH = "/health"
DEFAULT_START_TIMEOUT = 120.0
LOG_TAIL_LINES = 30
READY_POLL = 2.0  # seconds one readiness poll may take in total (never past the start deadline)
READY_MAX_BYTES = 1 << 20


# how long a start that failed waits for the engine's own error line after the fail_regex matched
FAILURE_LINE_WAIT = 2.0
# a Python exception line (``ValueError: ...``, ``pkg.mod.SomeError: ...``), argparse's ``prog: error: ...``,
# or a plain ``Error: ...`` line
_ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)\b|[\w.-]+: error:|(?:error|Error|ERROR"
                         r"|FATAL)\b)[^\n]*$", re.MULTILINE)


def last_error_line(text: str) -> str | None:
    """The last line of ``text`` that states an error (a traceback's exception line), at most 300
    characters; None when there is none."""
    found = [m.group(0).strip() for m in _ERROR_LINE.finditer(text)]
    if not found:
        return None
    line = found[-1]
    return line if len(line) <= 300 else line[:300] + " ..."


# what Python's socketserver (http.server, mlx_lm.server) prints before the traceback of one request that failed;
# the server goes on serving: a health poll that gave up early (a loaded machine) leaves one in the log
REQUEST_ERROR = "Exception occurred during processing of request from"


def start_failures(regex: str, text: str) -> list[re.Match[str]]:
    """The matches of a profile's ``fail_regex`` in a starting server's log that say it will never be ready:
    every one but those that open the traceback of a single request the server failed to answer, which it
    survives. socketserver prints ``Exception occurred during processing of request from ...`` before each such
    traceback, from the request's own thread: another thread's lines may fall between the two (the log line of
    the next health poll did, on a loaded machine), so each such line excuses the next match after it, in order,
    wherever it lands."""
    opened = [m.start() for m in re.finditer("^" + re.escape(REQUEST_ERROR), text, re.MULTILINE)]
    found, excused = [], 0
    for m in re.finditer(regex, text, re.MULTILINE):
        if sum(1 for at in opened if at < m.start()) > excused:
            excused += 1
        else:
            found.append(m)
    return found


class ServerStartError(InfrastructureError):
    """A server exited before it was ready, or was not ready by the deadline.

    ``log_tail`` holds the last lines of its log; ``returncode`` is None when
    it was still running (and has been stopped) at the deadline.
    """

    def __init__(self, message: str, log_tail: str = "", returncode: int | None = None):
        super().__init__(message)
        self.log_tail = log_tail
        self.returncode = returncode


class ArgTemplate(str):
    """An argv item the lifecycle completes at spawn, in ``str.format`` syntax: ``{port}`` and
    ``{host}`` are its only fields, every other brace is doubled. A plain ``str`` item is never
    read as a template (a path holding ``{port}`` is a path)."""

    def fill(self, port: int, host: str = HOST) -> str:
        return self.format(port=port, host=host)


PORT_ARG = ArgTemplate("{port}")
HOST_ARG = ArgTemplate("{host}")
_PLACEHOLDERS = ("{port}", "{host}")


def resolve_argv(argv: Sequence[str], port: int, host: str = HOST) -> list[str]:
    """``argv`` as the process gets it: each :class:`ArgTemplate` filled, every other item as it is."""
    return [a.fill(port, host) if isinstance(a, ArgTemplate) else str(a) for a in argv]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def log_tail(path: str | os.PathLike | None, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file ('' when there is none)."""
    if path is None or not Path(path).exists():
        return ""
    data = Path(path).read_bytes()[-64 * 1024:]
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


@dataclass
class ServerTimes:
    """Seconds a server spent, measured by the harness.

    start: from spawn to the first 200 on the ready path.
    stop: from the first signal (SIGTERM, or SIGKILL for a server not stopped gracefully) to the group's exit.
    """

    start: float | None = None
    stop: float | None = None


@dataclass
class Server:
    """One server process and its group.

    argv: the command; :data:`PORT_ARG`, :data:`HOST_ARG` and other :class:`ArgTemplate` items are
      filled in (:func:`resolve_argv`), plain strings are passed as they are.
    log_path: where stdout and stderr go (a temp file when None; kept either way).
    cwd: working directory (default: a fresh temp directory, never the repo root; removed at exit
      when the log is elsewhere).
    env: extra environment variables over ``os.environ`` (None values unset one).
    ready_path: HTTP GET path that answers 200 when the server can serve.
    fail_regex: a log pattern that means the server will never be ready although it
      still runs (mlx_lm.server keeps answering 503 after its model failed to load).
    start_timeout / stop_timeout: seconds for readiness and for a graceful stop.
    graceful: stop with SIGTERM first (False: SIGKILL at once, for a server whose shutdown writes nothing the
      caller reads).
    name: how logs and errors name it.
    """

    argv: list[str]
    log_path: str | os.PathLike | None = None
    cwd: str | os.PathLike | None = None
    env: dict[str, str | None] | None = None
    ready_path: str = DEFAULT_READY_PATH
    fail_regex: str | None = None
    start_timeout: float = DEFAULT_START_TIMEOUT
    stop_timeout: float = DEFAULT_STOP_TIMEOUT
    graceful: bool = True
    name: str = "server"
    port: int = 0
    proc: subprocess.Popen | None = None
    times: ServerTimes = field(default_factory=ServerTimes)
    resolved_argv: list[str] = field(default_factory=list)
    _log_file: Any = None
    _watcher: subprocess.Popen | None = None

    def __post_init__(self) -> None:
        from specparity.schema import seconds_problem

        for key in ("start_timeout", "stop_timeout"):  # a nan deadline is never reached: a wait forever
            problem = seconds_problem(getattr(self, key))
            if problem is not None:
                raise UsageError(f"{self.name}: {key}: {problem}")

    # -- properties --------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def pgid(self) -> int | None:
        """The process group id (== pid: the server leads its own session)."""
        return self.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return log_tail(self.log_path, lines)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> Self:
        """Spawn, then wait until ready; raises ServerStartError (and stops the group) if not."""
        self.spawn()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def spawn(self) -> None:
        if self.proc is not None:
            raise RuntimeError(f"{self.name} already started")
        self.port = self.port or free_port()
        self.resolved_argv = resolve_argv(self.argv, self.port)
        for a in self.argv:
            if not isinstance(a, ArgTemplate) and a in _PLACEHOLDERS:
                log.warning("%s: argv item %r is passed as it is: the placeholder is PORT_ARG / HOST_ARG",
                            self.name, a)
        if self.cwd is None:
            self.cwd = (tempfile.mkdtemp(prefix="specparity-server-") if self.log_path is None
                        else scratch_dir("specparity-server-"))
        if self.log_path is None:
            self.log_path = Path(self.cwd) / f"{self.name}.log"
        Path(self.log_path).parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        for k, v in (self.env or {}).items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        env.setdefault("PYTHONUNBUFFERED", "1")
        # checked here: behind the exec wrapper, Popen itself would no longer raise for it
        exe = self.resolved_argv[0] if self.resolved_argv else ""
        at = os.path.join(str(self.cwd), exe)  # a relative path runs from cwd, as Popen runs it
        found = shutil.which(exe, path=env.get("PATH", os.defpath)) if os.sep not in exe else (
            at if os.access(at, os.X_OK) and not os.path.isdir(at) else None)
        if not found:
            raise ServerStartError(f"{self.name}: cannot run {exe!r}: not an executable file"
                                   + ("" if os.sep in exe else " on PATH"))
        self._log_file = open(self.log_path, "ab")  # noqa: SIM115 (open for the life of the process)
        log.info("starting %s on port %d: %s", self.name, self.port, " ".join(self.resolved_argv))
        self._t0 = time.perf_counter()
        try:
            self.proc, self._watcher, interrupted = spawn_tied(
                self.resolved_argv, self.stop_timeout, self._log_file, cwd=str(self.cwd), env=env,
                stdin=subprocess.DEVNULL, stdout=self._log_file, stderr=subprocess.STDOUT)
        except OSError as err:
            self._log_file.close()
            raise ServerStartError(f"{self.name}: cannot run {self.resolved_argv[0]!r}: {err}") from None
        register(self)
        if interrupted is not None:
            raise interrupted

    def wait_ready(self) -> None:
        """Poll ``ready_path`` until 200; raise at once if the process exits. ``start_timeout`` is a
        deadline for the whole wait, each poll included (a ready path that trickles bytes, or
        stalls, answers nothing by then)."""
        import httpx

        from specparity.harness.transport import BadResponse, Late, fetch, loopback_client

        assert self.proc is not None
        deadline = self._t0 + self.start_timeout
        delay = 0.05
        with loopback_client() as client:
            while True:
                rc = self.proc.poll()
                if rc is not None:
                    cause = last_error_line(self.tail(200))
                    raise ServerStartError(
                        f"{self.name} exited with code {rc} before it was ready"
                        f"{': ' + cause if cause else ''}; {self._log_note()}", self.tail(), rc)
                if self.fail_regex and start_failures(self.fail_regex, self.tail(200)):
                    cause = self._failure_line()
                    said = f": {cause}" if cause else f" (its log matches {self.fail_regex!r})"
                    raise ServerStartError(f"{self.name} failed while starting{said}; {self._log_note()}",
                                           self.tail())
                left = deadline - time.perf_counter()
                try:
                    status, _ = fetch(client, "GET", self.url + self.ready_path, max(0.05, min(READY_POLL, left)),
                                      max_bytes=READY_MAX_BYTES)
                    if status == 200:
                        self.times.start = time.perf_counter() - self._t0
                        log.info("%s ready in %.2f s", self.name, self.times.start)
                        return
                except (httpx.TransportError, Late, BadResponse):
                    pass  # not ready yet: no answer, no whole answer in time, or not a health answer
                if time.perf_counter() > deadline:
                    raise ServerStartError(
                        f"{self.name} not ready on {self.ready_path} after {self.start_timeout:g} s;"
                        f" log {self.log_path}", self.tail())
                time.sleep(delay)
                delay = min(delay * 1.5, 0.25)

    def _failure_line(self) -> str | None:
        """The engine's own error line after the log's last ``fail_regex`` match (a traceback's exception
        line), waited for a moment: the match is the traceback's first line, its cause comes last."""
        assert self.proc is not None and self.fail_regex
        until = time.perf_counter() + FAILURE_LINE_WAIT
        while True:
            text = self.tail(200)
            matches = start_failures(self.fail_regex, text)
            cause = last_error_line(text[matches[-1].end():] if matches else text)
            if cause or time.perf_counter() > until:
                return cause
            if self.proc.poll() is not None:
                return last_error_line(self.tail(200))
            time.sleep(0.05)

    def _log_note(self) -> str:
        """Where the log is, and that it goes at exit when it is in a scratch directory."""
        path = Path(self.log_path).resolve() if self.log_path else None
        with _SCRATCH_LOCK:
            scratch = path is not None and any(d in path.parents for d in _SCRATCH)
        return f"log {self.log_path}" + (" (removed at exit: --record-dir keeps it)" if scratch else "")

    def stop(self) -> int | None:
        """SIGTERM the group, wait ``stop_timeout``, then SIGKILL it (``graceful`` False: SIGKILL at once). Returns
        the exit code."""
        proc = self.proc
        if proc is None:
            return None
        t0 = time.perf_counter()
        try:
            if proc.poll() is None and self.graceful:
                signal_group(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(self.stop_timeout)
                except subprocess.TimeoutExpired:
                    log.warning("%s ignored SIGTERM for %g s: SIGKILL", self.name, self.stop_timeout)
            # the leader may have exited while children of its group live on
            signal_group(proc.pid, signal.SIGKILL)
            # SIGKILL cannot be ignored, but the kernel's teardown of a process holding gigabytes
            # (or on a loaded machine) can outlast a short stop_timeout: wait for it, boundedly
            reap = max(self.stop_timeout, KILL_WAIT)
            try:
                proc.wait(reap)
            except subprocess.TimeoutExpired:
                log.error("%s (pid %d) survived SIGKILL for %g s", self.name, proc.pid, reap)
            # the group's other members too: the next server or the reference's worker loads its own
            # copy of the target once this one's memory is back (one copy at a time)
            if not tied.wait_group_gone(proc.pid, reap):
                log.error("%s: processes of its group (%d) outlived SIGKILL", self.name, proc.pid)
        finally:
            unregister(self)
            if self._watcher is not None:
                end_watcher(self._watcher)
                self._watcher = None
            if self._log_file is not None and not self._log_file.closed:
                self._log_file.close()
            if self.times.stop is None:
                self.times.stop = time.perf_counter() - t0
        return proc.returncode

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


KILL_WAIT = 10.0  # seconds a stop waits, at least, for a SIGKILLed group to be gone

# Linux only: a server's first program asks for SIGKILL when its parent dies (tests turn it off
# to exercise the watcher alone, as on macOS)
PARENT_DEATH_SIGNAL = tied.PARENT_DEATH_SIGNAL


def spawn_tied(argv: Sequence[str], grace: float, watcher_out: Any = subprocess.DEVNULL, **popen: Any
               ) -> tuple[subprocess.Popen, subprocess.Popen | None, BaseException | None]:
    """:func:`specparity.tied.spawn_tied` under this module's :data:`PARENT_DEATH_SIGNAL` switch."""
    return tied.spawn_tied(argv, grace, watcher_out, parent_death=PARENT_DEATH_SIGNAL, **popen)


def live_servers() -> list[Server]:
    return [s for s in tied.live() if isinstance(s, Server)]


# -- scratch directories: removed at exit, after the servers that ran in them ----------------------
_SCRATCH: list[Path] = []
_SCRATCH_LOCK = threading.Lock()
_SCRATCH_HOOK = False


def scratch_dir(prefix: str = "specparity-") -> Path:
    """A new temporary directory (absolute), removed when this process exits, after
    :func:`stop_all` (servers run in it and write their logs there), or by :func:`remove_scratch`.

    Exit includes Ctrl-C and SIGTERM; only a SIGKILL of the process leaves it behind.
    """
    global _SCRATCH_HOOK
    path = Path(tempfile.mkdtemp(prefix=prefix)).resolve()
    with _SCRATCH_LOCK:
        if not _SCRATCH_HOOK:
            _SCRATCH_HOOK = True
            atexit.register(_remove_all_scratch)
        _SCRATCH.append(path)
    return path


def remove_scratch(path: str | os.PathLike) -> None:
    """Remove a :func:`scratch_dir` now (stop the servers that use it first)."""
    p = Path(path)
    with _SCRATCH_LOCK:
        if p in _SCRATCH:
            _SCRATCH.remove(p)
    shutil.rmtree(p, ignore_errors=True)


def _remove_all_scratch() -> None:
    stop_all()
    with _SCRATCH_LOCK:
        paths = list(_SCRATCH)
        _SCRATCH.clear()
    for p in paths:
        shutil.rmtree(p, ignore_errors=True)
