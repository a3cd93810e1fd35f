"""mlx-dspark as an engine: its own ``Target`` verify forward and rollback, and its own loop.

mlx-dspark (``pip install mlx-dspark``) wraps the target in its ``Target``
(``mlx_dspark.target``): its own forward over the target's layers with a
hidden-state tap (``Target.run``: the model's forward replicated, so the
drafter sees the tapped layers), its spec-round pair ``Target.verify`` /
``Target.rollback`` (a dense target's KV trimmed by the rejected tail; a
gated-delta target's recurrent state rebuilt by re-running
``gated_delta_update`` over the kept rows from the inputs recorded during the
verify) and its chunked ``Target.prefill`` (the vocab projection of the last
row only). Everything here calls those:

- :class:`MlxDsparkSession` prefills as ``speculative_generate`` does (one
  ``Target.prefill`` chunk per ``PREFILL_CHUNK`` tokens, the last one's logits),
  verifies through ``Target.verify`` with the drafter's tap and rolls back through
  ``Target.rollback``;
- :meth:`MlxDsparkEngine.generate` runs ``speculative_generate`` (its library
  defaults: cap 2, n-gram lookup drafts on) on a recording proxy of its
  ``Target`` (which the loop takes as an argument), so each round's verify block,
  kept logits and post-rollback state are the engine's own.

The target is loaded twice from the same files: by mlx-dspark's ``load_target``
for the engine, by ``mlx_lm.load`` for classic decode, so nothing the engine does
to its model object (its conv-capture flags) reaches the reference.
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

NAME = "mlx-dspark"
# speculative_generate's default max_draft_tokens: 2 drafts, a 3-row verify
DEFAULT_CAP = 2
# --verify-mode max-draft-N: its loop as the profile's drafted arm of ``mlx-dspark serve --max-draft N
# --no-lookup-drafts`` runs it (N drafts a round, every draft the drafter's); without it, its library defaults
# (cap 2, n-gram lookup drafts on). Up to 15: a DSpark block of 16 rows (the published drafters verify 8).
SERVED_MODE = "max-draft-"
SERVED_MAX_CAP = 15
SERVED_MODES = tuple(f"{SERVED_MODE}{n}" for n in range(1, SERVED_MAX_CAP + 1))


def served_cap(verify_mode: str | None) -> int | None:
    """The cap a ``max-draft-N`` verify mode pins (None: the library defaults)."""
    return int(verify_mode[len(SERVED_MODE):]) if verify_mode else None


def available() -> bool:
    """mlx-dspark imports in this interpreter (asked of the engine registry)."""
    from specparity.engines import get

    return get(NAME).importable()


class _FaultyTarget:
    """The engine's ``Target`` with a known defect injected (:data:`FAULT_ENV`)."""

    def __init__(self, target: Any, fault: str):
        self._target, self.fault = target, fault

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)

    def verify(self, ids: Any, cache: Any, tap: Any) -> Any:
        logits, fused = self._target.verify(ids, cache, tap)
        if self.fault == "verify-row" and logits.shape[1] > 1:
            logits = logits.at[:, 1:].multiply(1.0 + 2.0 ** -6)
        return logits, fused

    def rollback(self, cache: Any, n_rejected: int, accepted: list[int]) -> None:
        if self.fault == "stale-row" and n_rejected > 0:
            # one rejected row kept: the KV trimmed one row short, the recurrence re-run one row further
            return self._target.rollback(cache, n_rejected - 1, accepted)
        return self._target.rollback(cache, n_rejected, accepted)


class _RecordingTarget:
    """The engine's ``Target``, every verify block and rollback recorded (the loop sees the same calls)."""

    def __init__(self, target: Any, rec: _Recorder):
        self._target, self._rec = target, rec

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)

    def verify(self, ids: Any, cache: Any, tap: Any) -> Any:
        out = self._target.verify(ids, cache, tap)
        self._rec.on_verify([int(t) for t in ids.reshape(-1).tolist()], out[0])
        return out

    def rollback(self, cache: Any, n_rejected: int, accepted: list[int]) -> None:
        self._target.rollback(cache, n_rejected, accepted)
        self._rec.on_rollback(cache, n_rejected)


class _Recorder(RoundRecorder):
    def __init__(self, prompt_len: int, record_states: bool):
        super().__init__(prompt_len, record_states)
        self.source = "none"

    def on_round(self, **r: Any) -> None:
        # speculative_generate reports the round (its source) just before it rolls back
        self.source = str(r.get("source") or "none")

    def on_rollback(self, cache: list[Any], n_rejected: int) -> None:
        pending = self.take()
        assert pending is not None
        tokens, logits = pending
        source = self.source if len(tokens) > 1 else "none"
        self.source = "none"
        self.record(tokens, logits, len(tokens) - 1 - n_rejected, source, cache)


class MlxDsparkSession(CacheListSession):
    """The engine's target state for one request, driven through its ``Target``."""

    def __init__(self, engine: MlxDsparkEngine):
        self.engine = engine
        self.target = engine.target
        self.target.reset_spec()
        self.cache: list[Any] = self.target.make_cache()
        self.start = 0
        self._block: list[int] = []

    def prefill(self, prompt: list[int]) -> Any:
        import mlx.core as mx
        from mlx_dspark import generate as g

        from specparity.decode import cache_arrays

        chunk = int(g.PREFILL_CHUNK)
        logits = None
        for lo in range(0, len(prompt), chunk):
            hi = min(lo + chunk, len(prompt))
            try:
                logits, _ = self.target.prefill(mx.array([prompt[lo:hi]]), self.cache, self.engine.tap,
                                                want_logits=hi == len(prompt),
                                                head_last_row=g.PREFILL_LAST_ROW_HEAD)
                mx.eval(cache_arrays(self.cache))
            except Exception as err:  # noqa: BLE001  (the engine's own error is the finding)
                raise EngineCannotRun(f"a {hi - lo}-token prefill chunk at position {lo}", err) from err
        self.start = len(prompt)
        assert logits is not None
        return logits[0, -1:]

    def verify(self, tokens: list[int]) -> Any:
        import mlx.core as mx

        self._block = list(tokens)
        try:
            logits, _ = self.target.verify(mx.array([tokens]), self.cache, self.engine.tap)
            mx.eval(logits)
        except Exception as err:  # noqa: BLE001
            raise EngineCannotRun(f"a {len(tokens)}-row verify block after {self.start} positions", err) from err
        return logits[0]

    def rollback(self, accepted: int) -> None:
        import mlx.core as mx

        from specparity.decode import cache_arrays

        drafted = len(self._block) - 1
        self.start += accepted + 1
        try:
            self.target.rollback(self.cache, drafted - accepted, self._block[1:1 + accepted])
            mx.eval(cache_arrays(self.cache))
        except Exception as err:  # noqa: BLE001
            raise EngineCannotRun(f"a rollback to {accepted} of {drafted} proposals", err) from err


class MlxDsparkEngine(Engine):
    """mlx-dspark loaded on a target (and a DSpark drafter)."""

    def __init__(self, target: str | Path, draft: str | Path | None = None, cap: int | None = None):
        """``cap``: its loop as ``mlx-dspark serve --max-draft CAP --no-lookup-drafts`` runs it (None: the
        library defaults, cap 2 with n-gram lookup drafts)."""
        if not available():
            raise EngineUnavailable("mlx-dspark is not installed in this interpreter")
        from importlib.metadata import version

        import mlx.core as mx
        import mlx_lm
        from mlx_dspark.load import load_drafter, load_target

        try:
            # require_tap: the load-time probe that its replicated forward equals the model's own
            self.target, self.tokenizer = load_target(str(target), require_tap=draft is not None)
            self.drafter: Any = load_drafter(str(draft))[0] if draft is not None else None
        except Exception as err:  # noqa: BLE001  (the loader's own words)
            raise EngineUnavailable(f"mlx-dspark will not load {target}"
                                    f"{' with drafter ' + str(draft) if draft else ''}:"
                                    f" {type(err).__name__}: {err}") from err
        # the drafter's tapped layers: the verify forward speculative_generate runs (Target.run);
        # without a drafter, Target.verify's tap-less path (the model's own forward, lookup mode)
        self.tap = list(self.drafter.config.target_layer_ids) if self.drafter is not None else None
        fault = os.environ.get(FAULT_ENV) or None
        if fault is not None:
            if fault not in FAULTS:
                from specparity.errors import UsageError

                raise UsageError(f"{FAULT_ENV}={fault!r}: choose from {', '.join(FAULTS)}")
            self.target = _FaultyTarget(self.target, fault)
            log.warning("mlx-dspark: injected fault %s", fault)
        self._classic = mlx_lm.load(str(target))[0]
        block = int(self.drafter.max_draft) + 1 if self.drafter is not None else None
        if cap is not None and block is not None and cap + 1 > block:
            from specparity.errors import UsageError

            raise UsageError(f"--verify-mode max-draft-{cap}: this drafter proposes at most {block - 1} tokens a round")
        self.cap = cap
        widths = sorted({w for w in (DEFAULT_CAP + 1, block, cap + 1 if cap else None)
                         if w and (block is None or w <= block)})
        loop = (f"its loop: speculative_generate as mlx-dspark serve --max-draft {cap} --no-lookup-drafts runs it"
                f" (cap {cap}, lookup drafts off)" if cap is not None
                else f"its loop: speculative_generate defaults (cap {DEFAULT_CAP}, lookup drafts on)")
        notes = [f"verify forward: {'Target.run with the tap at layers ' + str(self.tap) if self.tap else 'the model'}"
                 f" ({self.target.family}{', gated-delta rollback' if self.target.is_hybrid else ', KV trim'})", loop]
        if not mx.metal.is_available():
            notes.append(f"no Metal on this machine ({mx.default_device()}): mlx-dspark's calibrated kernels"
                         " are off (as in its library defaults)")
        if fault is not None:
            notes.append(f"injected fault: {fault}")
        notes.append(f"mlx {version('mlx')}, mlx-lm {version('mlx-lm')}")
        self.info = EngineInfo(NAME, version("mlx-dspark"), str(target), str(draft) if draft else None, block,
                               widths, family=str(self.target.family), notes=notes,
                               packages={"mlx-dspark": version("mlx-dspark"), "mlx": version("mlx"),
                                         "mlx-lm": version("mlx-lm")}, fault=fault)

    def session(self) -> MlxDsparkSession:
        return MlxDsparkSession(self)

    def classic_model(self) -> Any:
        return self._classic

    def engine_model(self) -> Any:
        return self.target.model

    def loop(self, prompt: list[int], max_tokens: int) -> None:
        from mlx_dspark.generate import speculative_generate

        served = {} if self.cap is None else {"max_draft_tokens": self.cap, "lookup_drafts": False}
        speculative_generate(self.target, self.tokenizer, self.drafter, prompt_ids=list(prompt),
                             max_new_tokens=max_tokens, **served)

    def generate(self, prompt: list[int], max_tokens: int, record_states: bool = True) -> EngineRun:
        import mlx.core as mx
        from mlx_dspark.generate import speculative_generate

        from specparity.errors import UsageError

        if self.drafter is None:
            raise UsageError("mlx-dspark's loop needs its DSpark drafter (--draft-model)")
        rec = _Recorder(len(prompt), record_states)
        tokens: list[int] = []
        error = None
        t0 = time.perf_counter()
        try:
            served = {} if self.cap is None else {"max_draft_tokens": self.cap, "lookup_drafts": False}
            res = speculative_generate(_RecordingTarget(self.target, rec), self.tokenizer, self.drafter,
                                       prompt_ids=list(prompt), max_new_tokens=max_tokens, on_round=rec.on_round,
                                       **served)
            tokens = [int(t) for t in res.token_ids]
        except Exception as err:  # noqa: BLE001  (the engine's own error is the finding)
            error = EngineCannotRun(f"its own loop over a {len(prompt)}-token prompt, in round {len(rec.rounds)}",
                                    err)
        mx.eval(rec.logits)
        # its last round commits every accepted draft, past max_new_tokens too: the run says what it was asked
        return EngineRun(list(prompt), tokens, rec.rounds, first_from_prefill=True, logits=rec.logits,
                         states=rec.states, seconds=time.perf_counter() - t0,
                         error=None if error is None else str(error), max_tokens=max_tokens)
