"""A child process tied to this one's life: the one way specparity starts a process that runs for long.

A tied child runs in a session and process group of its own, behind an exec
wrapper that asks for the parent-death signal (Linux), forked from one thread
that lives as long as the process, with a watcher (:mod:`specparity.watchdog`)
that stops its group once this process is gone, however it died (SIGKILL
included). Every tied child is registered: Ctrl-C, SIGTERM and exit stop it
and its group. Servers (:mod:`specparity.harness.lifecycle`), the classic
reference's worker, a command re-run in an engine's environment, e2e's CLI
arms and bisect's control arms all start here.

:func:`spawn_tied` starts one and hands it back; :func:`run_tied` runs one to
its end (its exit code); :func:`run_tied_captured` runs one to its end with its
output captured and a timeout, in place of ``subprocess.run``.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

from specparity import watchdog
from specparity.errors import Terminated

log = logging.getLogger(__name__)

DEFAULT_STOP_TIMEOUT = 10.0


def signal_group(pgid: int, sig: int) -> None:
    """Send ``sig`` to process group ``pgid``; one already gone (or not ours any more) is no error."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# -- tying each child's life to this process's (see specparity.watchdog) ----------------------------
WATCHDOG = str(Path(watchdog.__file__).resolve())
# Linux only: the server's first program asks for SIGKILL when its parent dies (tests turn it off
# to exercise the watcher alone, as on macOS)
PARENT_DEATH_SIGNAL = sys.platform.startswith("linux")
_PIPE: tuple[int, int] | None = None
_PIPE_LOCK = threading.Lock()


def wait_group_gone(pgid: int, timeout: float = 5.0) -> bool:
    """Wait until no process of group ``pgid`` is left (its leader reaped, every other member gone),
    at most ``timeout`` seconds: a member the leader left behind still holds its memory, and the next
    copy of a model must not load beside it. True: gone."""
    deadline = time.monotonic() + timeout
    while watchdog.group_alive(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def _pipe_read_end() -> int:
    """The read end of the pipe whose write end this process holds until it dies (made once)."""
    global _PIPE
    with _PIPE_LOCK:
        if _PIPE is None:
            _PIPE = os.pipe()  # close-on-exec: no other child inherits the write end
        return _PIPE[0]


def spawn_tied(argv: Sequence[str], grace: float, watcher_out: Any = subprocess.DEVNULL,
               parent_death: bool | None = None, **popen: Any
               ) -> tuple[subprocess.Popen, subprocess.Popen | None, BaseException | None]:
    """Start ``argv`` (``popen``: subprocess.Popen's keywords) tied to this process's life: in a
    session and process group of its own, behind the exec wrapper that asks for the parent-death
    signal (Linux), forked from the spawner thread, with a watcher (writing to ``watcher_out``)
    that stops its group ``grace`` seconds after SIGTERM once this process is gone, however it died.

    Returns the process, its watcher (None when it could not start: a warning says so) and the
    Ctrl-C / SIGTERM that arrived while it was forked (register the process, then raise it).
    parent_death: ask for the parent-death signal (default :data:`PARENT_DEATH_SIGNAL`; off, the watcher
    alone ties it, as on macOS). Every server starts so (harness.lifecycle's ``Server``), and the
    classic reference's worker (harness.oracle).
    """
    _install_handlers()
    pdeath = PARENT_DEATH_SIGNAL if parent_death is None else parent_death
    wrapped = list(argv)
    if pdeath:
        wrapped = [sys.executable, "-I", "-S", WATCHDOG, "exec", str(os.getpid()), "--", *wrapped]
    proc, interrupted = _SPAWNER.popen(wrapped, pdeath, start_new_session=True, **popen)
    watcher = _watch(proc.pid, grace, str(popen.get("cwd") or tempfile.gettempdir()), watcher_out)
    return proc, watcher, interrupted


class _TiedRun:
    """A child that runs to its end (:func:`run_tied`), stoppable by :func:`stop_all` meanwhile."""

    def __init__(self, name: str, proc: subprocess.Popen, watcher: subprocess.Popen | None, grace: float):
        self._name, self.proc, self.watcher, self.grace = name, proc, watcher, grace

    @property
    def name(self) -> str:
        return self._name

    def stop(self) -> None:
        """SIGTERM to its group, SIGKILL after ``grace`` seconds: it and anything it started end."""
        if self.proc.poll() is None:
            signal_group(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(self.grace)
            except subprocess.TimeoutExpired:
                pass
        signal_group(self.proc.pid, signal.SIGKILL)
        try:
            self.proc.wait(DEFAULT_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            log.error("%s (pid %d) survived SIGKILL", self._name, self.proc.pid)


def run_tied(argv: Sequence[str], name: str, grace: float = 5.0, timeout: float | None = None,
             **popen: Any) -> int:
    """Run ``argv`` to its end tied to this process (:func:`spawn_tied`): Ctrl-C, SIGTERM or any
    error here stops it and its group; SIGKILL here has its watcher stop it. Its exit code.

    timeout: seconds it may run; past them it and its group are stopped and
    ``subprocess.TimeoutExpired`` is raised, as ``subprocess.run`` does.
    For a command re-run in an engine's environment: the one way the toolkit runs a child to completion.
    """
    proc, watcher, interrupted = spawn_tied(argv, grace, **popen)
    deadline = None if timeout is None else time.monotonic() + timeout
    run = _TiedRun(name, proc, watcher, grace)
    register(run)
    try:
        if interrupted is not None:
            raise interrupted
        while True:
            # short waits: a blocking one holds Popen's wait lock, and the SIGTERM handler's stop_all,
            # which runs in this thread, could not reap the child until its own timeouts ran out
            try:
                return proc.wait(0.2)
            except subprocess.TimeoutExpired:
                if deadline is not None and time.monotonic() > deadline:
                    raise subprocess.TimeoutExpired(list(argv), float(timeout or 0)) from None
                continue
    finally:
        try:
            if proc.poll() is None:
                run.stop()
            else:
                # the child has exited: anything it left in its group goes too
                signal_group(proc.pid, signal.SIGKILL)
        finally:
            unregister(run)
            if watcher is not None:
                end_watcher(watcher)


def _watch(pgid: int, grace: float, cwd: str, log_file: Any) -> subprocess.Popen | None:
    """Start the watcher of group ``pgid``, in a session of its own; None (and a warning) if it cannot run."""
    fd = _pipe_read_end()
    try:
        return subprocess.Popen(
            [sys.executable, "-I", "-S", WATCHDOG, "watch", str(os.getpid()), str(pgid), str(fd), f"{grace:g}"],
            pass_fds=(fd,), cwd=cwd, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
            start_new_session=True)
    except OSError as err:
        log.warning("no watcher for process group %d (%s): it relies on the parent-death signal", pgid, err)
        return None


def end_watcher(proc: subprocess.Popen) -> None:
    """Kill and reap a watcher of ours, once what it guards is stopped (never a reused pid: it is
    ours until reaped)."""
    if proc.poll() is None:
        try:
            proc.kill()
        except ProcessLookupError:
            pass
    try:
        proc.wait(DEFAULT_STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        log.error("watcher pid %d survived SIGKILL", proc.pid)


def read_json_line(stdout: Any, sel: Any, timeout: float) -> dict[str, Any] | None:
    """A JSON-lines worker's next object on ``stdout`` (registered with the selector ``sel``); lines that are not
    JSON objects are skipped. None: it ended, or nothing came within ``timeout`` seconds."""
    import json

    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not sel.select(left):
            return None
        line = stdout.readline()
        if not line:
            return None
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            return obj


def end_worker(proc: subprocess.Popen, watcher: subprocess.Popen | None, sel: Any, graceful: bool,
               timeout: float) -> None:
    """End a tied JSON-lines worker: EOF on its input first where ``graceful`` (its own way out, ``timeout``
    seconds), then SIGKILL to its group, which is waited for (its memory back before the next copy of a model
    loads); its watcher ended, its pipes and the selector ``sel`` closed."""
    try:
        if graceful and proc.stdin is not None:
            try:
                proc.stdin.close()
                proc.wait(timeout)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait(timeout)
        wait_group_gone(proc.pid, timeout)
    finally:
        if watcher is not None:
            end_watcher(watcher)
        for f in (proc.stdin, proc.stdout):
            if f is not None and not f.closed:
                try:
                    f.close()
                except OSError:
                    pass
        if sel is not None:
            sel.close()


class _Spawner:
    """Forks every server from one thread that lives as long as the process.

    Linux sends the parent-death signal when the *thread* that forked a child
    exits, not the process: a server started from a worker thread would be
    killed when that worker ended.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._jobs: queue.SimpleQueue[tuple[Future[subprocess.Popen], list[str], dict[str, Any]]] = \
            queue.SimpleQueue()

    def popen(self, argv: list[str], parent_death: bool, **kwargs: Any
              ) -> tuple[subprocess.Popen, BaseException | None]:
        """The process, and the Ctrl-C / SIGTERM that arrived while it was forked (the caller
        registers the process, then raises it). Without the parent-death signal any thread may fork."""
        if not parent_death or threading.current_thread() is self._thread:
            return subprocess.Popen(argv, **kwargs), None
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="specparity-spawner", daemon=True)
                self._thread.start()
        fut: Future[subprocess.Popen] = Future()
        self._jobs.put((fut, argv, kwargs))
        interrupted: BaseException | None = None
        while True:
            try:
                proc = fut.result()
                break
            except KeyboardInterrupt as err:
                # the fork goes on in the spawner: wait for the process, so that it is registered
                # and stopped, then let the interruption through
                interrupted = err
        return proc, interrupted

    def _serve(self) -> None:
        while True:
            fut, argv, kwargs = self._jobs.get()
            try:
                fut.set_result(subprocess.Popen(argv, **kwargs))
            except BaseException as err:  # noqa: BLE001 (handed to the caller)
                fut.set_exception(err)


_SPAWNER = _Spawner()


# -- the registry: every live server, stopped at exit and on SIGINT / SIGTERM -------------------
class Stoppable(Protocol):
    """What the registry stops: a :class:`Server`, the classic reference's worker."""

    @property
    def name(self) -> str: ...

    def stop(self) -> Any: ...


class _Registry:
    def __init__(self) -> None:
        # reentrant: a signal handler runs stop_all in the main thread, maybe while it holds the lock
        self._lock = threading.RLock()
        self._live: list[Stoppable] = []

    def add(self, s: Stoppable) -> None:
        with self._lock:
            self._live.append(s)

    def discard(self, s: Stoppable) -> None:
        with self._lock:
            if s in self._live:
                self._live.remove(s)

    def live(self) -> list[Stoppable]:
        with self._lock:
            return list(self._live)


_REGISTRY = _Registry()
_AT_EXIT = False
_SIGNALS = False
_TERMINATING = False
# the signals that end a run as Ctrl-C does, with its record closed and its servers stopped
_TERMINATING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def live() -> list[Stoppable]:
    """Every registered process not stopped yet, oldest first."""
    return _REGISTRY.live()


def register(s: Stoppable) -> None:
    """``s`` is stopped by :func:`stop_all` (at exit, on SIGINT / SIGTERM) until :func:`unregister`."""
    _REGISTRY.add(s)


def unregister(s: Stoppable) -> None:
    _REGISTRY.discard(s)


def stop_all() -> None:
    """Stop every server (and other registered process) this process started and has not stopped yet."""
    for s in reversed(_REGISTRY.live()):
        try:
            s.stop()
        except Exception:  # stopping the others matters more than this one's error
            log.exception("stopping %s", s.name)


def _install_handlers() -> None:
    global _AT_EXIT, _SIGNALS
    if not _AT_EXIT:
        _AT_EXIT = True
        atexit.register(stop_all)
    # signal handlers can only be set from the main thread: a server started from another
    # thread leaves them to the next start from the main thread
    if _SIGNALS or threading.current_thread() is not threading.main_thread():
        return
    _SIGNALS = True
    for sig in (signal.SIGINT, *_TERMINATING_SIGNALS):
        previous = signal.getsignal(sig)
        if previous == signal.SIG_IGN:
            continue  # ignored by whoever started us (nohup, a background job): it stays ignored
        signal.signal(sig, _make_handler(sig, previous))


def _make_handler(sig: int, previous: Any) -> Callable[[int, FrameType | None], None]:
    def handler(signum: int, frame: FrameType | None) -> None:
        if signum != signal.SIGINT and _TERMINATING:
            _die(signum)  # a second SIGTERM (or SIGHUP) while stopping: at once (the watchers take the servers)
        stop_all()
        if callable(previous):
            previous(signum, frame)
        elif sig == signal.SIGINT:
            raise KeyboardInterrupt
        else:
            _terminate(signum, frame)
    return handler


def _terminate(signum: int, frame: FrameType | None) -> None:
    """SIGTERM or SIGHUP as an exception in the main thread, as SIGINT raises KeyboardInterrupt: context
    managers and ``finally`` blocks run, a record closes as interrupted. A second one kills."""
    global _TERMINATING
    if _TERMINATING:
        _die(signum)
    _TERMINATING = True
    raise Terminated(signum)


def _die(signum: int) -> None:
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def catch_sigterm() -> None:
    """From now on SIGTERM and SIGHUP (a closed terminal) raise :class:`~specparity.errors.Terminated` in the
    main thread (every command that writes a record calls this, so a run stopped before any server
    started closes its record too). A handler someone else set, or an ignored signal (``nohup``), is
    left alone."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in _TERMINATING_SIGNALS:
        if signal.getsignal(sig) == signal.SIG_DFL:
            signal.signal(sig, _terminate)


def run_tied_captured(argv: Sequence[str], name: str, timeout: float | None = None, input: str | None = None,
                      grace: float = 5.0, **popen: Any) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout)`` (UTF-8, bad
    bytes replaced), tied (:func:`run_tied`): the child and its group end with this process.

    Input and output go through temporary files, not pipes, so the wait polls without a reader thread
    and a child that fills a pipe cannot hang. ``subprocess.TimeoutExpired`` past ``timeout`` (the
    child and its group stopped first); ``OSError`` when it cannot start.
    """
    def scratch() -> Any:
        return tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")

    with scratch() as stdin, scratch() as out, scratch() as err:
        if input is not None:
            stdin.write(input)
            stdin.flush()
            stdin.seek(0)
        code = run_tied(argv, name, grace, timeout=timeout, stdin=stdin, stdout=out, stderr=err, **popen)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(list(argv), code, out.read(), err.read())
