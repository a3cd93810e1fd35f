"""The suite's CLI runs, forked from a process that has already imported mlx-lm.

A CLI run the suite makes (``conftest.run_cli``) is a real process running the real ``specparity``
entry point: its own exit code, stdout, stderr, working directory and environment, its own servers
and children. What costs most in most of them is not specparity but importing mlx-lm and what it
pulls in (transformers, huggingface_hub, httpx, numpy: ~1.2 CPU seconds per process, with the import
tables of tests/startup), hundreds of times a run. Here one process per pytest worker (the *zygote*)
imports those third-party packages once, never uses them, and forks for each run; the child sets the
run's working directory, environment and argv, puts the caller's pipes on 0, 1 and 2, and calls the
console script's entry point, ``specparity.cli.main()``, ending as a Python process ends (what an
exception or exit code prints, non-daemon threads joined, atexit handlers, streams flushed: ``_end``).

What a forked run does not re-do is the interpreter's start and those packages' import; specparity's
own modules are imported in the child, each run. So the zygote serves only runs where that cannot
change the outcome (:func:`forkable`):

- the commands that import mlx-lm when they get past their arguments (``FORKED_COMMANDS``); the
  others (``records``, which must not import mlx; ``served``, whose harness stays free of mlx;
  ``serve``, ``env``, ``--version``, start-up) are exec'd as before;
- an environment equal to the zygote's but for specparity's own variables (read when used, never at
  import); anything else (``HF_*``, ``PYTHONPATH``, pip's) could have been read at an import the zygote
  already made, and that run is exec'd.

``SPECPARITY_TEST_EXEC=1`` runs every CLI run by exec (the check that both ways pass alike); so does
every platform but Linux (a fork after Metal or Accelerate started is unsafe on macOS).
"""

from __future__ import annotations

import json
import locale
import os
import select
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

# the commands that import mlx-lm once their arguments are read (the first argument of the run)
FORKED_COMMANDS = frozenset({"probe", "replay", "bisect", "gate", "accept", "dist", "e2e", "fixtures"})
# what the zygote imports: what those runs import that specparity does not own
PRELOAD = ("numpy", "mlx.core", "mlx.nn", "mlx_lm", "mlx_lm.generate", "mlx_lm.sample_utils",
           "mlx_lm.models.cache", "mlx_lm.tokenizer_utils", "mlx_lm.server", "transformers", "tokenizers",
           "jinja2", "yaml", "httpx", "scipy.special", "jsonschema")
# read by specparity when used, never at import: a run may differ from the zygote's environment in these
OWN_PREFIX = "SPECPARITY_"
READ_AT_START = frozenset({"SPECPARITY_TEST_IMPORT_TABLES"})  # tests/startup/sitecustomize.py
# pytest's own, set anew for each phase of each test; nothing reads it at an import
PYTEST_OWN = frozenset({"PYTEST_CURRENT_TEST"})


def forkable(args: list[str], env: dict[str, str], zygote_env: dict[str, str]) -> bool:
    """Whether a run of ``specparity *args`` with ``env`` may be forked from a zygote started with
    ``zygote_env`` (else it is exec'd)."""
    if sys.platform != "linux":  # fork after Metal's or Accelerate's start is unsafe on macOS: exec'd there
        return False
    if os.environ.get("SPECPARITY_TEST_EXEC") == "1" or not args or args[0] not in FORKED_COMMANDS:
        return False
    differ = {k for k in env.keys() | zygote_env.keys() if env.get(k) != zygote_env.get(k)} - PYTEST_OWN
    return all(k.startswith(OWN_PREFIX) and k not in READ_AT_START for k in differ)


class Zygote:
    """One zygote process (started on first use, tied to this one as every server is: specparity.tied)
    and the runs it forks."""

    def __init__(self) -> None:
        from specparity.tied import spawn_tied

        self.env = dict(os.environ)
        self.dir = tempfile.mkdtemp(prefix="specparity-zygote-")
        self.path = os.path.join(self.dir, "socket")
        self.proc, self.watcher, interrupted = spawn_tied(
            [sys.executable, "-P", __file__, self.path], 5.0, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            env=self.env)
        if interrupted is not None:
            self.close()
            raise interrupted
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline()
        if ready.strip() != b"ready":
            raise RuntimeError(f"the CLI zygote did not start: {ready!r}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def run(self, argv: list[str], env: dict[str, str], cwd: str, timeout: float) -> subprocess.CompletedProcess:
        """What ``subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)``
        returns, the process forked from the zygote instead of exec'd."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        null = os.open(os.devnull, os.O_RDONLY)
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
            sock.connect(self.path)
            socket.send_fds(sock, [json.dumps({"argv": argv, "env": env, "cwd": cwd}).encode()],
                            [null, out_w, err_w])
            for fd in (null, out_w, err_w):
                os.close(fd)
            pid = int(sock.recv(64))
            deadline = time.monotonic() + timeout
            chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
            with selectors.DefaultSelector() as sel:
                for fd in chunks:
                    sel.register(fd, selectors.EVENT_READ)
                while sel.get_map():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        os.kill(pid, signal.SIGKILL)
                        raise subprocess.TimeoutExpired(argv, timeout)
                    for key, _ in sel.select(left):
                        data = os.read(key.fd, 1 << 16)
                        if data:
                            chunks[key.fd].append(data)
                        else:
                            sel.unregister(key.fd)
                            os.close(key.fd)
            sock.settimeout(max(1.0, deadline - time.monotonic()))
            code = int(sock.recv(64))
        encoding = locale.getpreferredencoding(False)
        text = [b"".join(chunks[fd]).decode(encoding).replace("\r\n", "\n").replace("\r", "\n")
                for fd in (out_r, err_r)]
        return subprocess.CompletedProcess(argv, code, text[0], text[1])

    def close(self) -> None:
        from specparity.tied import end_watcher

        if self.alive():
            self.proc.terminate()
            self.proc.wait(30)
        if self.watcher is not None:
            end_watcher(self.watcher)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        shutil.rmtree(self.dir, ignore_errors=True)


_zygote: Zygote | None = None
ways: dict[str, int] = {"forked": 0, "exec'd": 0}  # how this process's runs started (tests/core/test_cli_runs.py)


def run(argv: list[str], env: dict[str, str], cwd: str | None, timeout: float) -> subprocess.CompletedProcess:
    """A CLI run (``argv[0]`` the console script): forked where :func:`forkable`, else exec'd."""
    global _zygote
    if forkable(argv[1:], env, env):  # else no environment makes it forkable: no zygote needed
        if _zygote is not None and _zygote.alive() and not forkable(argv[1:], env, _zygote.env):
            # started while an earlier test had changed the environment (a HOME, a pip variable): a new one, so a
            # run is never exec'd for an earlier test's sake
            _zygote.close()
            _zygote = None
        if _zygote is None or not _zygote.alive():
            _zygote = Zygote()
        if forkable(argv[1:], env, _zygote.env):
            ways["forked"] += 1
            return _zygote.run(argv, env, cwd or os.getcwd(), timeout)
    ways["exec'd"] += 1
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)


def stop() -> None:
    global _zygote
    if _zygote is not None:
        _zygote.close()
        _zygote = None


# ---- the zygote itself (run as a script: ``python -P forkcli.py SOCKET``) ----

def _child(request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: become the CLI run, and end as a Python process ends."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    # sys.stdin/stdout/stderr are the zygote's, made at its start-up with this environment: the same
    # encodings and buffering as a process started on pipes, now on the run's (nothing was buffered)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = list(request["argv"])
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os._exit(_end(_main))


def _main() -> Any:
    from specparity.cli import main

    return main()


def _end(main: Any) -> int:
    """``sys.exit(main())`` at a script's top, and the interpreter's end, but for its last step: what
    an exception, SystemExit or its code prints, non-daemon threads joined, atexit handlers run, the
    standard streams flushed; the modules' teardown (the zygote's thousands, which a run of its own
    would not hold: ~0.2 CPU s, and nothing a run writes) is left to the process's exit."""
    import atexit
    import threading
    import traceback

    try:
        code: Any = main()
    except SystemExit as e:
        code = e.code
    except KeyboardInterrupt:
        traceback.print_exc()
        code = -signal.SIGINT
    except BaseException:  # what Python prints for an uncaught exception, and exits 1
        sys.excepthook(*sys.exc_info())
        code = 1
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    threading._shutdown()  # type: ignore[attr-defined]  # as at the interpreter's end
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if code < 0:  # killed by a signal (KeyboardInterrupt: SIGINT, as Python does)
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code & 0xFF


def _serve(path: str) -> None:
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    import gc

    gc.freeze()  # what it imported: no run's collections walk it, no run's copy-on-write touches it
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(16)
    os.write(1, b"ready\n")
    while True:
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:  # reap the reporters
                pass
        except ChildProcessError:
            pass
        ready, _, _ = select.select([listener], [], [], 1.0)
        if not ready:
            continue
        conn, _ = listener.accept()
        message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        if os.fork() == 0:  # the reporter: forks the run, says its pid, then its exit code
            listener.close()
            pid = os.fork()
            if pid == 0:
                conn.close()
                _child(json.loads(message), fds)
            for fd in fds:
                os.close(fd)
            conn.send(str(pid).encode())
            _, status = os.waitpid(pid, 0)
            conn.send(str(os.waitstatus_to_exitcode(status)).encode())
            os._exit(0)
        conn.close()
        for fd in fds:
            os.close(fd)


if __name__ == "__main__":
    _serve(sys.argv[1])
