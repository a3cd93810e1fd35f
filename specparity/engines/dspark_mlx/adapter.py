"""dspark-mlx as an engine: its host adapter's prefill, verify forward and KV rollback, and its own loop.

dspark-mlx (``pip install dspark-mlx``) drives the target through its host adapter
(``MlxLmHostAdapter``, ``dspark_mlx.hosts.mlx_lm``): its own forward over the
target's layers with the drafter's tapped layers captured (``_run``),
``prefill`` (the whole prompt in one forward), ``verify_forward`` ([anchor,
drafts] in one forward) and ``kv_rollback(n_keep)`` (every cache trimmed to
``n_keep`` absolute positions; a cache without an offset, the gated-delta
layers' ``ArraysCache``, has no such rollback). Everything here calls those:

- :class:`DsparkMlxSession` keeps its own cache and lends it to the adapter for
  each call (the adapter holds one sequence's cache, ``_cache``);
- :meth:`DsparkMlxEngine.generate` runs ``generate_eager`` (one verify of
  [anchor, drafts] per round, ``greedy_accept``) on a recording proxy of the
  adapter (which the loop takes as an argument): each round's verify block,
  kept logits and post-rollback state are the engine's own. Its first token
  comes from round 0's first row (the prompt's last token is the first anchor).

The target is loaded twice from the same files: by ``load_host`` for the engine,
by ``mlx_lm.load`` for classic decode.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from specparity.probes.engines.base import (
    FAULT_ENV,
    FAULTS,
    Engine,
    EngineCannotRun,
    EngineInfo,
    EngineRun,
    EngineUnavailable,
    CacheListSession,
    RoundRecorder,
)

log = logging.getLogger(__name__)

NAME = "dspark-mlx"


# dspark-mlx 0.1.0's MlxLmHostAdapter keeps the sequence's KV caches in a private attribute and has no
# public accessor: the one place this adapter reaches into the engine's private state (checked on 0.1.0).
HOST_CACHE = "_cache"


def host_cache(host: Any) -> list[Any]:
    """The host adapter's per-layer KV caches (mlx-lm's own cache objects)."""
    cache: list[Any] = getattr(host, HOST_CACHE)
    return cache


class _FaultyHost:
    """The engine's host adapter with a known defect injected (:data:`FAULT_ENV`)."""

    def __init__(self, host: Any, fault: str):
        self._host, self.fault = host, fault
        self.last_block = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._host, name)

    def verify_forward(self, block_tokens: Any) -> Any:
        out = self._host.verify_forward(block_tokens)
        self.last_block = int(block_tokens.shape[1])
        if self.fault == "verify-row" and out.per_pos_logits.shape[1] > 1:
            out.per_pos_logits = out.per_pos_logits.at[:, 1:].multiply(1.0 + 2.0 ** -6)
        return out

    def kv_rollback(self, n_keep: int) -> None:
        if self.fault == "stale-row" and self.last_block and n_keep < self._host.offset:
            n_keep += 1  # one rejected row kept
        self.last_block = 0
        self._host.kv_rollback(n_keep)


class _RecordingHost:
    """The engine's host adapter, every verify block and rollback recorded (the loop sees the same calls)."""

    def __init__(self, host: Any, rec: _Recorder):
        self._host, self._rec = host, rec

    def __getattr__(self, name: str) -> Any:
        return getattr(self._host, name)

    def verify_forward(self, block_tokens: Any) -> Any:
        out = self._host.verify_forward(block_tokens)
        self._rec.on_verify([int(t) for t in block_tokens.reshape(-1).tolist()], out.per_pos_logits)
        return out

    def kv_rollback(self, n_keep: int) -> None:
        self._host.kv_rollback(n_keep)
        self._rec.on_rollback(host_cache(self._host), n_keep)


class _Recorder(RoundRecorder):
    def __init__(self, prompt_len: int, record_states: bool):
        super().__init__(prompt_len - 1, record_states)  # the prompt's last token is round 0's anchor

    def on_rollback(self, cache: list[Any], n_keep: int) -> None:
        pending = self.take()
        if pending is None:
            return  # the prefill's: the anchor dropped before round 0
        tokens, logits = pending
        self.record(tokens, logits, n_keep - self.start - 1, "dspark" if len(tokens) > 1 else "none", cache)


class DsparkMlxSession(CacheListSession):
    """The engine's target state for one request, lent to its host adapter for each call."""

    def __init__(self, engine: DsparkMlxEngine):
        self.engine = engine
        self.host = engine.host
        self.host.reset()
        self.cache: list[Any] = host_cache(self.host)
        self.start = 0

    def _lend(self) -> None:
        # on the adapter itself, under an injected fault's proxy (an attribute set on the proxy reaches nothing)
        setattr(getattr(self.host, "_host", self.host), HOST_CACHE, self.cache)

    def prefill(self, prompt: list[int]) -> Any:
        import mlx.core as mx

        from specparity.decode import cache_arrays

        self._lend()
        try:
            step = self.host.prefill(mx.array([prompt], dtype=mx.int32))
            mx.eval(step.logits, cache_arrays(self.cache))
        except Exception as err:  # noqa: BLE001  (the engine's own error is the finding)
            raise EngineCannotRun(f"a {len(prompt)}-token prefill", err) from err
        self.start = len(prompt)
        return step.logits

    def verify(self, tokens: list[int]) -> Any:
        import mlx.core as mx

        self._lend()
        try:
            out = self.host.verify_forward(mx.array([tokens], dtype=mx.int32))
            mx.eval(out.per_pos_logits)
        except Exception as err:  # noqa: BLE001
            raise EngineCannotRun(f"a {len(tokens)}-row verify block after {self.start} positions", err) from err
        return out.per_pos_logits[0]

    def rollback(self, accepted: int) -> None:
        import mlx.core as mx

        from specparity.decode import cache_arrays

        self._lend()
        self.start += accepted + 1
        try:
            self.host.kv_rollback(self.start)
            mx.eval(cache_arrays(self.cache))
        except Exception as err:  # noqa: BLE001
            raise EngineCannotRun(f"a rollback to {accepted} accepted", err) from err


class DsparkMlxEngine(Engine):
    """dspark-mlx loaded on a target and its DSpark drafter."""

    def __init__(self, target: str | Path, draft: str | Path | None):
        from specparity.engines import get
        from specparity.errors import UsageError

        if not get(NAME).importable():
            raise EngineUnavailable("dspark-mlx is not installed in this interpreter")
        if draft is None:
            raise UsageError("--engine dspark-mlx: its host adapter taps the drafter's layers: give --draft-model")
        from importlib.metadata import version

        import mlx_lm
        from dspark_mlx import load_draft, load_host

        try:
            self.drafter, cfg = load_draft(str(draft))
            _, self.tokenizer, self.host = load_host(str(target), cfg)
        except Exception as err:  # noqa: BLE001  (the loader's own words)
            raise EngineUnavailable(f"dspark-mlx will not load {target} with drafter {draft}:"
                                    f" {type(err).__name__}: {err}") from err
        fault = os.environ.get(FAULT_ENV) or None
        if fault is not None:
            if fault not in FAULTS:
                raise UsageError(f"{FAULT_ENV}={fault!r}: choose from {', '.join(FAULTS)}")
            self.host = _FaultyHost(self.host, fault)
            log.warning("dspark-mlx: injected fault %s", fault)
        self._classic = mlx_lm.load(str(target))[0]
        block = int(self.drafter.block_size) + 1
        notes = [f"host adapter {type(getattr(self.host, '_host', self.host)).__name__}, tapped layers"
                 f" {list(cfg['target_layer_ids'])}; rollback: kv_rollback (trim to n_keep)",
                 "its loop: generate_eager (one verify of [anchor, drafts] per round, greedy_accept)"]
        if fault is not None:
            notes.append(f"injected fault: {fault}")
        notes.append(f"mlx {version('mlx')}, mlx-lm {version('mlx-lm')}")
        self.info = EngineInfo(NAME, version("dspark-mlx"), str(target), str(draft), block, [block],
                               family=str(cfg.get("model_type", "")), notes=notes,
                               packages={"dspark-mlx": version("dspark-mlx"), "mlx": version("mlx"),
                                         "mlx-lm": version("mlx-lm")}, fault=fault)

    def session(self) -> DsparkMlxSession:
        return DsparkMlxSession(self)

    def classic_model(self) -> Any:
        return self._classic

    def engine_model(self) -> Any:
        return self.host.model

    def loop(self, prompt: list[int], max_tokens: int) -> None:
        from dspark_mlx import generate_eager

        self.host.reset()
        for _ in generate_eager(self.host, self.drafter, [list(prompt)], max_new_tokens=max_tokens):
            pass

    def generate(self, prompt: list[int], max_tokens: int, record_states: bool = True) -> EngineRun:
        import mlx.core as mx
        from dspark_mlx import generate_eager
        from dspark_mlx.events import TokenEvent

        rec = _Recorder(len(prompt), record_states)
        tokens: list[int] = []
        error = None
        t0 = time.perf_counter()
        self.host.reset()
        try:
            for ev in generate_eager(_RecordingHost(self.host, rec), self.drafter, [list(prompt)],
                                     max_new_tokens=max_tokens):
                if isinstance(ev, TokenEvent):
                    tokens.append(int(ev.token))
        except Exception as err:  # noqa: BLE001  (the engine's own error is the finding)
            error = EngineCannotRun(f"its own loop over a {len(prompt)}-token prompt, in round {len(rec.rounds)}",
                                    err)
        mx.eval(rec.logits)
        return EngineRun(list(prompt), tokens, rec.rounds, first_from_prefill=False, logits=rec.logits,
                         states=rec.states, seconds=time.perf_counter() - t0,
                         error=None if error is None else str(error))
