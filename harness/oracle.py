"""The oracle: classic decode computed in process, reached from the harness.

Every served completion is judged against what the engine's classic path
computes for the same request on the same weights (specparity.reference). The
reference runs in a worker process started with the interpreter the pairing's
servers run in (``python -m specparity.harness.reference_worker``), so a server in a
pinned environment (mlx-lm 0.31.3, dflash-mlx) is judged by that environment's
mlx-lm, and the harness itself never imports mlx. The worker loads the
checkpoint once and answers each distinct request once (its cache); it exits
when the harness closes its input. It starts as the servers do
(harness.lifecycle.spawn_tied): stopped with them on Ctrl-C and SIGTERM, and
unable to outlive the harness, SIGKILL included, even while it computes (a
large model's answer can take minutes before it reads its input again).

    oracle = Oracle(checkpoint, trust_remote_code, python, env)
    answer = oracle.complete("completions", body, settings, server_prompt_tokens=17)
    answer.completion   # a ReferenceCompletion, or None with answer.error
    oracle.cost(); oracle.close()

The worker holds a copy of the target, so by default the runner keeps it loaded only while
no server is (harness.run): it imports mlx-lm beside the first server (``spawn(load=False)``, no
weights held), decodes what it can once that server is gone, and :meth:`Oracle.release` has it drop
the weights before the next server starts (it stays, imports done, where what it then holds fits what
the job's budget gives a worker importing beside a server; else it ends); while servers still come, the
runner asks it :attr:`Oracle.offline` (answers already decoded only, :class:`NeedsWorker` otherwise), and
the arms that need more are judged at the end (the same worker loading again once the last server is
gone, or a new one imported beside that server: ``spawn(load=False)``). The
oracle keeps every answer it was given (the same request under the same settings is decoded once
per job, whichever worker decoded it), what each worker cost, and each worker's peak resident
memory (``ReferenceStats`` plus ``workers``,
``peak_rss_bytes`` and ``worker_peaks`` in :meth:`Oracle.cost_dict`).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import selectors
import subprocess
import tempfile
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, fields
from typing import Any, Protocol

from specparity.harness.lifecycle import register, spawn_tied, unregister
from specparity.harness.memory import IMPORTING_BYTES
from specparity.tied import end_worker, read_json_line
from specparity.mlx_server import ServerSettings
from specparity.reference import (
    ColdAnswer,
    PromptCheck,
    ReferenceCompletion,
    ReferenceStats,
    check_prompt,
    request_key,
)

log = logging.getLogger(__name__)

LOAD_TIMEOUT = 300.0


class Phases(Protocol):
    """Where the oracle's waits are counted (harness.timing.Clock)."""

    def phase(self, name: str) -> AbstractContextManager[None]: ...


class _Untimed:
    def phase(self, name: str) -> AbstractContextManager[None]:
        return nullcontext()
CLOSE_TIMEOUT = 10.0  # seconds the worker has to exit once its input is closed


class NeedsWorker(Exception):
    """An offline oracle (:attr:`Oracle.offline`) was asked what only a loaded worker can answer."""


@dataclass
class Answer:
    """The oracle's answer to one request: the completion, or why there is none."""

    completion: ReferenceCompletion | None = None
    error: str | None = None


class Oracle:
    """A classic-reference worker for one checkpoint (see the module docstring).

    checkpoint: the original checkpoint the servers load (not a witness wrapper or a GGUF).
    python / env: the interpreter and the environment variables the servers run with.
    settings: the server flags the worker loads its tokenizer with (chat template).
    timeout: seconds one answer may take.
    batches: the servers batch the requests they can, as mlx_lm.server does (False: every request
      on the sequential path, as dflash serve's target-only path, mlx_lm.server's ``_serve_single``).
    """

    def __init__(self, checkpoint: str, trust_remote_code: bool, python: str, env: dict[str, str | None] | None = None,
                 settings: ServerSettings | None = None, timeout: float = 600.0, batches: bool = True):
        self.batches = batches
        self.checkpoint = checkpoint
        self.trust_remote_code = trust_remote_code
        self.python = python
        self.env = env or {}
        self.settings = settings or ServerSettings()
        self.timeout = timeout
        self.proc: subprocess.Popen[str] | None = None
        self.failed: str | None = None
        self.load_seconds: float | None = None
        self._sel: selectors.BaseSelector | None = None
        self._watcher: subprocess.Popen | None = None
        # answers kept across workers: a released worker's cache goes with it
        self._answers: dict[str, ReferenceCompletion] = {}
        # for an answer decoded from the server's own ids: the server ids the harness's own tokenization
        # was checked against, and that check (own_prompt, own_prompt_error): the same key and the same
        # ids give the same check, so a later worker need not decode the request again to repeat it
        self._own: dict[str, tuple[list[int], PromptCheck | None, str | None]] = {}
        self._colds: dict[str, ColdAnswer] = {}
        self._spent = ReferenceStats()  # what the workers already ended cost
        self._hits = 0
        self.worker_peaks: list[int | None] = []  # each ended worker's peak resident bytes
        self.workers = 0  # workers started
        self.loads = 0  # loads of the target, every worker together
        self.kept_bytes: list[int] = []  # what a worker that dropped its weights held, each time, waiting to load again
        self.waiting = False  # the live worker was started with --wait-load and has not been told to load
        self.clock: Phases = _Untimed()  # the runner's: waits on the worker counted by phase
        # True: answer only from what earlier workers decoded; a question needing a loaded worker raises
        # NeedsWorker instead of starting one (the runner judges such arms later, all with one worker)
        self.offline = False

    @property
    def name(self) -> str:
        return f"classic reference of {self.checkpoint}"

    def spawn(self, load: bool = True) -> None:
        """Start the worker now, without waiting for it (``load``: it loads while servers start, a second
        copy of the target beside them; otherwise it only imports mlx-lm, holding no weights, and loads
        at the first question: its start-up overlaps a server's, one copy of the target kept)."""
        if self.proc is not None or self.failed is not None:
            return
        argv = [self.python, "-P", "-m", "specparity.harness.reference_worker", self.checkpoint,
                "--settings", json.dumps(self.settings.to_dict())]
        if not load:
            argv.append("--wait-load")
        if self.trust_remote_code:
            argv.append("--trust-remote-code")
        if not self.batches:
            argv.append("--sequential")
        env = dict(os.environ)
        for k, v in self.env.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        try:
            self.proc, self._watcher, interrupted = spawn_tied(
                argv, CLOSE_TIMEOUT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                text=True, env=env, cwd=tempfile.gettempdir())
        except OSError as err:
            self.failed = f"the classic reference could not start ({err})"
            return
        register(self)
        self.workers += 1
        self.waiting = not load
        self._sel = selectors.DefaultSelector()
        assert self.proc.stdout is not None
        self._sel.register(self.proc.stdout, selectors.EVENT_READ)
        if interrupted is not None:
            raise interrupted

    def _start(self) -> None:
        with self.clock.phase("reference_load"):
            self._load()

    def _load(self) -> None:
        self.spawn()
        if self.proc is None or self.load_seconds is not None:
            return
        if self.waiting:  # started beside a server, imports done or under way: now no server holds the target
            self.waiting = False
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write("{\"load\": true}\n")
                self.proc.stdin.flush()
            except OSError:
                pass  # it exited: the read below says so
        hello = self._read(LOAD_TIMEOUT)
        if hello is None or not hello.get("ready"):
            why = (hello or {}).get("message") or "it exited or did not answer while loading"
            self.failed = f"the classic reference could not load {self.checkpoint}: {why}"
            self.close()
            return
        self.load_seconds = float(hello.get("load_seconds") or 0.0)
        self.loads += 1

    def _read(self, timeout: float) -> dict[str, Any] | None:
        """The worker's next JSON line (lines that are not JSON objects are skipped); None: it ended or timed out."""
        assert self.proc is not None and self.proc.stdout is not None and self._sel is not None
        return read_json_line(self.proc.stdout, self._sel, timeout)

    @property
    def hits_so_far(self) -> int:
        """Answers given from the oracle's own cache so far (a deferred judgment puts its count back)."""
        return self._hits

    @hits_so_far.setter
    def hits_so_far(self, n: int) -> None:
        self._hits = n

    def _ask(self, request: dict[str, Any]) -> dict[str, Any] | None:
        if self.failed is None and (self.proc is None or self.load_seconds is None):
            if self.offline:
                raise NeedsWorker(self.name)
            self._start()
        if self.failed is not None or self.proc is None or self.proc.stdin is None:
            return None
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except OSError:
            self.failed = "the classic reference process exited"
            return None
        reply = self._read(self.timeout)
        if reply is None:
            self.failed = f"the classic reference gave no answer within {self.timeout:g} s, or exited"
            self.close()
        return reply

    def complete(self, endpoint: str, body: dict[str, Any], settings: ServerSettings | None = None,
                 server_prompt_tokens: int | None = None, prompt_ids: list[int] | None = None,
                 server_prompt_ids: list[int] | None = None) -> Answer:
        """Classic decode's answer to ``body`` (on ``endpoint``, under the server's ``settings``);
        ``prompt_ids``: decode from exactly these (an engine that tokenizes on its own said so);
        ``server_prompt_ids``: the server's own ids, checked against the harness's tokenization."""
        key = request_key(endpoint, body, settings or self.settings, prompt_ids)
        hit = self._answers.get(key)
        own = self._own.get(key)
        if prompt_ids is not None and server_prompt_ids is not None and (
                own is None or own[0] != list(server_prompt_ids)):
            hit = None  # the harness's own tokenization not yet checked against these ids: the worker's to do
        if hit is not None:  # the worker's own checks, on the answer an earlier worker gave
            self._hits += 1
            out = copy.copy(hit)
            if prompt_ids is None:
                if server_prompt_ids is not None or server_prompt_tokens is not None:
                    out.prompt_check = check_prompt(out.prompt_ids, server_prompt_ids, server_prompt_tokens)
                return Answer(out)
            if server_prompt_tokens is not None:
                out.prompt_check = check_prompt(out.prompt_ids, None, server_prompt_tokens)
            if server_prompt_ids is not None and own is not None:
                out.own_prompt, out.own_prompt_error = copy.deepcopy(own[1]), own[2]
            return Answer(out)
        req: dict[str, Any] = {"endpoint": endpoint, "body": body, "server_prompt_tokens": server_prompt_tokens,
                               "prompt_ids": prompt_ids, "server_prompt_ids": server_prompt_ids}
        if settings is not None:
            req["settings"] = settings.to_dict()
        with self.clock.phase("reference_decode"):
            reply = self._ask(req)
        if reply is None:
            return Answer(error=self.failed or "the classic reference is unavailable")
        if not reply.get("ok"):
            return Answer(error=f"the classic reference refused this request: {reply.get('message')}")
        out = ReferenceCompletion.from_dict(reply["completion"])
        if key not in self._answers:
            kept = copy.copy(out)
            kept.prompt_check = kept.own_prompt = None
            kept.own_prompt_error = None
            self._answers[key] = kept
        if prompt_ids is not None and server_prompt_ids is not None:
            self._own[key] = (list(server_prompt_ids), copy.deepcopy(out.own_prompt), out.own_prompt_error)
        return Answer(out)

    def cold(self, endpoint: str, body: dict[str, Any], settings: ServerSettings | None = None,
             draft_model: str | None = None) -> tuple[ColdAnswer | None, str | None]:
        """mlx_lm.server's loop answering ``body`` on a fresh prompt cache (ClassicReference.cold), or why not."""
        key = f"{request_key(endpoint, body, settings or self.settings)}|{draft_model}|{body.get('num_draft_tokens')}"
        if key in self._colds:
            return copy.copy(self._colds[key]), None
        req: dict[str, Any] = {"cold": True, "endpoint": endpoint, "body": body, "draft_model": draft_model}
        if settings is not None:
            req["settings"] = settings.to_dict()
        with self.clock.phase("reference_cold"):
            reply = self._ask(req)
        if reply is None:
            return None, self.failed or "the classic reference is unavailable"
        if not reply.get("ok"):
            return None, f"mlx_lm.server's loop did not answer it in process: {reply.get('message')}"
        self._colds[key] = ColdAnswer(**reply["cold"])
        return copy.copy(self._colds[key]), None

    def _worker_cost(self) -> tuple[ReferenceStats, int | None] | None:
        """The live worker's cost and peak resident bytes (None: no live, loaded worker)."""
        if self.proc is None or self.failed is not None or self.waiting:
            return None
        reply = self._ask({"cost": True})
        if reply is None or not reply.get("ok"):
            return None
        peak = reply.get("peak_rss_bytes")
        return ReferenceStats(**reply["cost"]), int(peak) if isinstance(peak, (int, float)) else None

    def cost(self) -> ReferenceStats | None:
        """What the reference cost so far, every worker together (None when none ever ran)."""
        live = self._worker_cost()
        if live is None and not self.worker_peaks:
            return None
        total = copy.copy(self._spent)
        if live is not None:
            for f in fields(ReferenceStats):
                setattr(total, f.name, getattr(total, f.name) + getattr(live[0], f.name))
        total.hits += self._hits
        return total

    def cost_dict(self) -> dict[str, Any] | None:
        """:meth:`cost` as the record keeps it, with ``workers`` (how many worker processes were started: one
        unless one that dropped its weights held more than a worker importing beside a server may),
        ``loads`` (how many times the target was loaded: once per stretch without a server, unless the
        reference runs beside the servers), ``worker_peaks`` (each load's peak resident bytes: ``VmHWM``,
        started anew at each load on Linux; the process's ``ru_maxrss`` elsewhere), ``kept_bytes`` (what a
        worker that dropped its weights held, waiting to load again) and ``peak_rss_bytes`` (the largest)."""
        live = self._worker_cost()
        cost = self.cost()
        if cost is None:
            return None
        peaks = self.worker_peaks + ([live[1]] if live is not None else [])
        known = [p for p in peaks if p is not None]
        return {**cost.to_dict(), "workers": self.workers, "loads": self.loads, "worker_peaks": peaks,
                "kept_bytes": list(self.kept_bytes), "peak_rss_bytes": max(known) if known else None}

    def release(self) -> None:
        """Give back the worker's copy of the target now, keeping its answers, its cost and its peak memory (a
        server is about to start: the two would hold two copies of the target). The worker drops the weights
        and stays, imports done, waiting to load at the next question, where what it then holds fits the
        share of the job's budget a worker importing beside a server has (``memory.IMPORTING_BYTES``); else it
        ends and the next question starts a new one. A worker still waiting to load holds no weights: it stays."""
        if self.waiting and self.proc is not None and self.proc.poll() is None:
            return
        live = self._worker_cost()
        if live is not None:
            for f in fields(ReferenceStats):
                setattr(self._spent, f.name, getattr(self._spent, f.name) + getattr(live[0], f.name))
            self.worker_peaks.append(live[1])
        if self.proc is not None and not self._unload():
            self._end(graceful=True)
        self.load_seconds = None

    def _unload(self) -> bool:
        """Ask the live, loaded worker to drop its weights; True where it did and now holds no more than
        ``memory.IMPORTING_BYTES`` (it waits for the next load), False where it must end."""
        if self.proc is None or self.failed is not None or self.load_seconds is None:
            return False
        with self.clock.phase("reference_stop"):
            reply = self._ask({"unload": True})
        held = (reply or {}).get("rss_bytes")
        if not (reply or {}).get("unloaded") or not isinstance(held, int) or held > IMPORTING_BYTES:
            return False
        self.waiting = True
        self.kept_bytes.append(held)
        return True

    def close(self) -> None:
        """Close the worker's input and let it exit (killed after CLOSE_TIMEOUT)."""
        self._end(graceful=True)

    def stop(self) -> None:
        """Kill the worker's process group now (harness.lifecycle.stop_all: Ctrl-C, SIGTERM, exit)."""
        if self.proc is not None and self.failed is None:
            self.failed = "the classic reference was stopped"
        self._end(graceful=False)

    def _end(self, graceful: bool) -> None:
        if self.proc is None:
            return
        with self.clock.phase("reference_stop"):
            self._end_now(graceful)

    def _end_now(self, graceful: bool) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        watcher, sel, self._watcher, self._sel = self._watcher, self._sel, None, None
        try:  # its group waited for: its memory back before a server loads the target
            end_worker(proc, watcher, sel, graceful, CLOSE_TIMEOUT)
        finally:
            unregister(self)
