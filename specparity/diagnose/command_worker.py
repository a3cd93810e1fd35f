"""One interpreter per pinned environment that runs a diagnosis's printed commands in turn.

Step 8 (specparity.diagnose.steps.releases) reruns each finding's reproduction in every built environment
of its engine. Run as a fresh command each time, every rerun paid two interpreter starts and an mlx-lm
import (about 1.5 s of a 2 s replay on the tiny fixtures: 16 of them for one night of eight findings).
Inside :func:`command_workers`, step 8 hands each command to one worker per environment instead: the
environment's own interpreter (running ``specparity.cli.command_worker``, the process environment
a re-run there gets, marked as that re-run), started on first use, tied to this process, ended when the block
ends. The worker runs each command line as ``specparity ARGV`` would (specparity.cli's own runner, its exit
code and last stderr line), in the same interpreter one after another; the command printed beside the step
is unchanged, and running it alone gives the verdict the worker gave (tests/diagnose run them).

A worker that will not start, dies, or gives no answer within the step's time is ended, and that command
(and each later one for that environment) runs as its own process as before.

Protocol: one JSON line per command on the worker's stdin, ``{"argv": [...]}`` (argv without the leading
``specparity``); one JSON line back on the worker's private descriptor (its stdout, which the commands
cannot write to), ``{"exit_code": n, "said": "last stderr line"}``. End of input: it exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import subprocess
from collections.abc import Iterator
from typing import Any

CLOSE_TIMEOUT = 10.0
# the worker's loop lives with the CLI it runs (specparity.cli.command_worker)
WORKER_MAIN = "import sys; from specparity.cli import command_worker; sys.exit(command_worker())"

_ACTIVE: dict[str, CommandWorker] | None = None


class CommandWorker:
    """The worker of one environment (the module docstring)."""

    def __init__(self, environment: str, engine: str):
        self.environment, self.engine = environment, engine
        self.proc: subprocess.Popen[str] | None = None
        self.failed: str | None = None
        self._sel: selectors.BaseSelector | None = None
        self._watcher: subprocess.Popen | None = None
        self.commands = 0

    @property
    def name(self) -> str:
        return f"step 8's worker in {self.environment}"

    def _spawn(self) -> None:
        from specparity.engine_env import RERUN_MARK, engine_environment
        from specparity.harness.lifecycle import register, spawn_tied

        python, environ = engine_environment(self.engine, self.environment)
        argv = [python, "-P", "-c", WORKER_MAIN]
        self.proc, self._watcher, interrupted = spawn_tied(
            argv, CLOSE_TIMEOUT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, env={**environ, RERUN_MARK: self.engine}, cwd=os.getcwd())
        register(self)
        self._sel = selectors.DefaultSelector()
        assert self.proc.stdout is not None
        self._sel.register(self.proc.stdout, selectors.EVENT_READ)
        if interrupted is not None:
            raise interrupted

    def run(self, argv: list[str], timeout: float) -> tuple[int, str] | None:
        """``specparity argv`` run in the worker: (exit code, last stderr line); None where the worker cannot
        answer (it would not start, it exited, or no answer within ``timeout``: it is ended, and this
        environment's commands run as their own processes from here on)."""
        if self.failed is not None:
            return None
        try:
            if self.proc is None:
                self._spawn()
            assert self.proc is not None and self.proc.stdin is not None
            self.proc.stdin.write(json.dumps({"argv": list(argv)}) + "\n")
            self.proc.stdin.flush()
        except OSError as err:
            self.failed = f"it would not start or exited ({err})"
            self.close()
            return None
        reply = self._read(timeout)
        if reply is None or not isinstance(reply.get("exit_code"), int):
            self.failed = "it exited or gave no answer in time"
            self.close()
            return None
        self.commands += 1
        return int(reply["exit_code"]), str(reply.get("said") or "")

    def _read(self, timeout: float) -> dict[str, Any] | None:
        from specparity.tied import read_json_line

        assert self.proc is not None and self.proc.stdout is not None and self._sel is not None
        return read_json_line(self.proc.stdout, self._sel, timeout)

    def stop(self) -> None:
        """Ctrl-C, SIGTERM, exit (the tied registry): its group killed now."""
        self._end(graceful=False)

    def close(self) -> None:
        self._end(graceful=True)

    def _end(self, graceful: bool) -> None:
        from specparity.harness.lifecycle import unregister
        from specparity.tied import end_worker

        proc, self.proc = self.proc, None
        if proc is None:
            return
        watcher, sel, self._watcher, self._sel = self._watcher, self._sel, None, None
        try:
            end_worker(proc, watcher, sel, graceful, CLOSE_TIMEOUT)
        finally:
            unregister(self)


@contextlib.contextmanager
def command_workers() -> Iterator[dict[str, CommandWorker]]:
    """Within the block, step 8 runs its commands in one worker per environment (the module docstring); every
    worker started is ended when the block ends, however it ends. Nested blocks share the outer one's."""
    global _ACTIVE
    if _ACTIVE is not None:
        yield _ACTIVE
        return
    _ACTIVE = {}
    try:
        yield _ACTIVE
    finally:
        workers, _ACTIVE = _ACTIVE, None
        for w in workers.values():
            w.close()


def run_in_worker(environment: str, engine: str, argv: list[str], timeout: float) -> tuple[int, str] | None:
    """``specparity argv`` (argv without ``specparity``) run in ``environment``'s worker, where a
    :func:`command_workers` block is open and that worker can answer: (exit code, last stderr line); None
    otherwise (the caller runs the command as its own process)."""
    if _ACTIVE is None:
        return None
    worker = _ACTIVE.get(environment)
    if worker is None:
        worker = _ACTIVE[environment] = CommandWorker(environment, engine)
    return worker.run(argv, timeout)
