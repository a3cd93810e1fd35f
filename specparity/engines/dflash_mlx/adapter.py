"""dflash-mlx as an engine: its own target adapter, verify forward, rollback and loop.

dflash-mlx (``pip install dflash-mlx``) verifies a DFlash drafter's block with
its own target adapter (``TargetOps``: ``QwenGdnTargetOps`` for ``qwen3_5``
and ``qwen3`` targets): its own forward over the target's layers
(``forward_with_hidden_capture``), its own caches (``RecurrentRollbackCache``
for the gated-delta layers), a rollback that trims the attention KV and
rebuilds the recurrent state by replaying an innovation tape recorded during
the verify (``restore_after_acceptance``), and it patches mlx-lm's attention
and gated-delta classes in place (``install_speculative_hooks``). Everything
here calls those, never mlx-lm's own verify:

- :class:`DflashSession` prefills as ``SpeculativeSession`` does (the prompt
  but its last token in ``prefill_step_size`` chunks, then the last token),
  arms the rollback and verifies through ``TargetOps.verify_block``, rolls back
  through ``TargetOps.restore_after_acceptance``;
- :meth:`DflashEngine.generate` runs the engine's own loop
  (``stream_dflash_generate``: drafting, copy-from-history speculation,
  adaptive block size, prefetch) with a recording wrapper around its target
  adapter and draft backend, which it takes as arguments;
- :meth:`DflashEngine.classic` takes dflash-mlx's class patches out while
  classic decode runs, so the reference is mlx-lm as mlx-lm ships it.

The target is loaded twice from the same files: once by dflash-mlx's loader
(``load_target_bundle``) for the engine, once by ``mlx_lm.load`` for classic
decode, so nothing the engine does to its model object reaches the reference.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
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

NAME = "dflash-mlx"
# the class attributes dflash-mlx sets on the mlx-lm classes it patches
_HOOK_FLAGS = ("_dflash_speculative_call_installed", "_dflash_full_attention_gqa_installed")
# the adaptive verify policy's reduced block (dflash_mlx.engine.spec_epoch._AdaptiveBlockPolicy)
REDUCED_BLOCK = 4


def available() -> bool:
    """dflash-mlx imports in this interpreter (asked of the engine registry)."""
    from specparity.engines import get

    return get(NAME).importable()


def _original_call(cls: type) -> Any:
    """mlx-lm's own ``__call__`` of a class dflash-mlx patched (it keeps it as ``original_call``)."""
    fn = cls.__dict__.get("__call__")
    code = getattr(fn, "__code__", None)
    if fn is None or code is None or "original_call" not in code.co_freevars:
        raise EngineUnavailable(f"cannot find mlx-lm's own {cls.__name__}.__call__ under dflash-mlx's patch"
                                " (a dflash-mlx version this adapter does not know)")
    return fn.__closure__[code.co_freevars.index("original_call")].cell_contents


def _module_classes(model: Any) -> list[type]:
    """The classes of ``model``'s modules, each once, in order."""
    return list(dict.fromkeys(type(m) for _, m in model.named_modules()))


def _patched_classes(classes: list[type]) -> list[type]:
    """Those of ``classes`` dflash-mlx patched (checked each time: its hooks may be installed later)."""
    return [cls for cls in classes if any(cls.__dict__.get(f) for f in _HOOK_FLAGS)]


class DflashSession(CacheListSession):
    """The engine's target state for one request, driven through its ``TargetOps`` (its caches are
    mlx-lm's own, its recurrent ones the engine's rollback caches: adopt maps one onto the other)."""

    def __init__(self, engine: DflashEngine):
        self.engine = engine
        self.ops = engine.target_ops
        self.model = engine.target_model
        self.cache: list[Any] = self.ops.make_cache(self.model, enable_speculative_linear_cache=True,
                                                    quantize_kv_cache=False, target_fa_window=0)
        self.start = 0
        self._block: list[int] = []

    def _forward(self, ids: list[int], what: str) -> Any:
        import mlx.core as mx

        try:
            logits, hidden = self.ops.forward_with_hidden_capture(
                self.model, input_ids=mx.array(ids, dtype=mx.uint32)[None], cache=self.cache,
                capture_layer_ids=self.engine.capture_layer_ids, logits_last_only=True)
            mx.eval(logits, *(hidden.values() if isinstance(hidden, dict) else hidden))
        except Exception as err:  # noqa: BLE001  (the engine's own error is the finding)
            raise EngineCannotRun(what, err) from err
        return logits

    def prefill(self, prompt: list[int]) -> Any:
        step = self.engine.prefill_step_size
        for lo in range(0, len(prompt) - 1, step):
            hi = min(lo + step, len(prompt) - 1)
            self._forward(prompt[lo:hi], f"a {hi - lo}-token prefill chunk at position {lo}")
        logits = self._forward(prompt[-1:], f"the last prompt token at position {len(prompt) - 1}")
        self.start = len(prompt)
        return logits[0, -1:]

    def verify(self, tokens: list[int]) -> Any:
        import mlx.core as mx

        self._block = list(tokens)
        what = f"a {len(tokens)}-row verify block after {self.start} positions"
        try:
            self.ops.arm_rollback(self.cache, prefix_len=self.start)
            logits, hidden = self.ops.verify_block(
                target_model=self.model, verify_ids=mx.array(tokens, dtype=mx.uint32)[None],
                target_cache=self.cache, capture_layer_ids=self.engine.capture_layer_ids)
            mx.eval(logits, *(hidden.values() if isinstance(hidden, dict) else hidden))
        except Exception as err:  # noqa: BLE001
            raise EngineCannotRun(what, err) from err
        return logits[0]

    def rollback(self, accepted: int) -> None:
        import mlx.core as mx

        from specparity.decode import cache_arrays

        drafted = len(self._block) - 1
        self.start += accepted + 1
        try:
            self.ops.restore_after_acceptance(self.cache, target_len=self.start, acceptance_length=accepted,
                                              drafted_tokens=drafted)
            mx.eval(cache_arrays(self.cache))
        except Exception as err:  # noqa: BLE001
            raise EngineCannotRun(f"a rollback to {accepted} of {drafted} proposals", err) from err

    def adopt(self, cache: list[Any]) -> None:
        from specparity.decode import cache_offset, copy_cache

        classic = copy_cache(cache)
        out = []
        for mine, theirs in zip(self.cache, classic):
            if hasattr(mine, "conv_kernel_size") and hasattr(theirs, "cache"):
                mine.cache = list(theirs.cache)  # RecurrentRollbackCache from ArraysCache
                out.append(mine)
            else:
                out.append(theirs)
        self.cache = out
        self.start = max([o for o in (cache_offset(c) for c in classic) if o is not None], default=0)


class _FaultyOps:
    """The engine's target adapter with a known defect injected (:data:`FAULT_ENV`)."""

    def __init__(self, ops: Any, fault: str):
        self._ops, self.fault = ops, fault

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ops, name)

    def verify_block(self, **kwargs: Any) -> Any:
        logits, hidden = self._ops.verify_block(**kwargs)
        if self.fault == "verify-row" and logits.shape[1] > 1:
            logits = logits.at[:, 1:].multiply(1.0 + 2.0 ** -6)
        return logits, hidden

    def restore_after_acceptance(self, cache_entries: list[Any], *, target_len: int, acceptance_length: int,
                                 drafted_tokens: int = 0) -> int:
        if self.fault == "stale-row" and acceptance_length < drafted_tokens:
            # one rejected row kept: KV trimmed to one row more, the tape replayed one step further
            return self._ops.restore_after_acceptance(cache_entries, target_len=target_len + 1,
                                                      acceptance_length=acceptance_length + 1,
                                                      drafted_tokens=drafted_tokens)
        return self._ops.restore_after_acceptance(cache_entries, target_len=target_len,
                                                  acceptance_length=acceptance_length, drafted_tokens=drafted_tokens)


class _RecordingOps:
    """The engine's target adapter, with every verify block and rollback recorded."""

    def __init__(self, ops: Any, rec: _Recorder):
        self._ops, self._rec = ops, rec

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ops, name)

    def verify_block(self, **kwargs: Any) -> Any:
        out = self._ops.verify_block(**kwargs)
        self._rec.on_verify([int(t) for t in kwargs["verify_ids"].reshape(-1).tolist()], out[0])
        return out

    def restore_after_acceptance(self, cache_entries: list[Any], **kwargs: Any) -> int:
        out = self._ops.restore_after_acceptance(cache_entries, **kwargs)
        self._rec.on_restore(cache_entries, int(kwargs["acceptance_length"]))
        return out


class _RecordingBackend:
    """The engine's draft backend, noting who proposed each block (``source``: its drafter's name)."""

    def __init__(self, backend: Any, rec: _Recorder, source: str = "dflash"):
        self._backend, self._rec, self._source = backend, rec, source

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def draft_greedy(self, **kwargs: Any) -> Any:
        self._rec.source = self._source
        return self._backend.draft_greedy(**kwargs)

    def advance_context(self, **kwargs: Any) -> Any:
        # called exactly when copy-from-history speculation drafted the block instead
        self._rec.source = "copyspec"
        return self._backend.advance_context(**kwargs)


class _Recorder(RoundRecorder):
    """Each verify block with the drafting source that proposed it; the round once the engine restored its
    cache to ``accepted``."""

    def __init__(self, prompt_len: int, record_states: bool):
        super().__init__(prompt_len, record_states)
        self.source = "none"
        self._block: tuple[list[int], Any, str] | None = None

    def on_verify(self, tokens: list[int], logits: Any) -> None:
        self._block = (tokens, logits, self.source if len(tokens) > 1 else "none")
        self.source = "none"

    def on_restore(self, cache: list[Any], accepted: int) -> None:
        assert self._block is not None
        tokens, logits, source = self._block
        self._block = None
        self.record(tokens, logits, accepted, source, cache)


class DflashEngine(Engine):
    """dflash-mlx loaded on a target (and a DFlash drafter).

    An engine built on dflash-mlx's runtime (dfly-mlx) subclasses it: ``name`` (its package), ``source`` (its
    drafter's name in the round record), ``reduced_block`` (None: no adaptive policy) and :meth:`_load`
    (its own loader, setting the same attributes)."""

    name = NAME
    source = "dflash"
    reduced_block: int | None = REDUCED_BLOCK
    # set by _load: the engine's bundle (None without a drafter), target model, target adapter and drafter
    bundle: Any
    target_model: Any
    target_ops: Any
    draft_model: Any

    def __init__(self, target: str | Path, draft: str | Path | None = None,
                 prefill_step_size: int | None = None, verify_mode: str | None = None):
        from specparity.engines import get

        if not get(self.name).importable():
            raise EngineUnavailable(f"{self.name} is not installed in this interpreter")
        from importlib.metadata import version

        import mlx.core as mx
        import mlx_lm
        from dflash_mlx.runtime.context import build_offline_runtime_context

        self.runtime_context = build_offline_runtime_context(prefill_step_size=prefill_step_size,
                                                             verify_mode=verify_mode)
        self.prefill_step_size = int(self.runtime_context.runtime.prefill_step_size)
        try:
            self._load(target, draft)
        except Exception as err:  # noqa: BLE001  (the loader's own words)
            raise EngineUnavailable(f"{self.name} will not load {target}"
                                    f"{' with drafter ' + str(draft) if draft else ''}:"
                                    f" {type(err).__name__}: {err}") from err
        import os

        fault = os.environ.get(FAULT_ENV) or None
        if fault is not None:
            if fault not in FAULTS:
                from specparity.errors import UsageError

                raise UsageError(f"{FAULT_ENV}={fault!r}: choose from {', '.join(FAULTS)}")
            self.target_ops = _FaultyOps(self.target_ops, fault)
            if self.bundle is not None:
                import dataclasses

                self.bundle = dataclasses.replace(self.bundle, target_ops=self.target_ops)
            log.warning("%s: injected fault %s", self.name, fault)
        self._classic = mlx_lm.load(str(target))[0]
        # walked once: classic() runs around every classic step
        self._classic_classes = _module_classes(self._classic)
        ids = list(getattr(self.draft_model, "target_layer_ids", []) or [])
        self.capture_layer_ids = {i + 1 for i in ids} or None
        block = int(self.draft_model.block_size) if self.draft_model is not None else None
        reduced = self.reduced_block
        widths = sorted({w for w in (block, reduced if block and reduced and block > reduced else None) if w})
        notes = [f"verify mode {self.runtime_context.runtime.verify_mode}, prefill step {self.prefill_step_size}"]
        if not mx.metal.is_available():
            notes.append(f"no Metal on this machine ({mx.default_device()}): dflash-mlx runs its pure-MLX"
                         " fallbacks, not its Metal kernels")
        if fault is not None:
            notes.append(f"injected fault: {fault}")
        names = dict.fromkeys((self.name, "dflash-mlx", "mlx", "mlx-lm"))  # dfly-mlx: its own, then dflash-mlx's
        packages: dict[str, str | None] = {p: version(p) for p in names}
        self.info = EngineInfo(self.name, version(self.name), str(target), str(draft) if draft else None, block,
                               widths, family=str(self.target_ops.family(self.target_model)), notes=notes,
                               packages=packages, fault=fault)
        self.info.notes.append(f"mlx {version('mlx')}, mlx-lm {version('mlx-lm')}")

    def _load(self, target: str | Path, draft: str | Path | None) -> None:
        """dflash-mlx's own loaders: sets ``bundle``, ``target_model``, ``target_ops``, ``draft_model``."""
        if draft is not None:
            from dflash_mlx.runtime.bundle import load_runtime_bundle

            self.bundle = load_runtime_bundle(model_ref=str(target), draft_ref=str(draft),
                                                   verify_config=self.runtime_context.verify)
            self.target_model, self.target_ops = self.bundle.target_model, self.bundle.target_ops
            self.draft_model = self.bundle.draft_model
        else:
            from dflash_mlx.runtime.loading import load_target_bundle

            tb = load_target_bundle(str(target), verify_config=self.runtime_context.verify)
            self.bundle, self.target_model, self.target_ops = None, tb.model, tb.target_ops
            self.draft_model = None

    def loop_options(self) -> dict[str, Any]:
        """Arguments its own loop passes ``stream_dflash_generate`` beyond the toolkit's (dflash-mlx: none)."""
        return {}

    def session(self) -> DflashSession:
        return DflashSession(self)

    def classic_model(self) -> Any:
        return self._classic

    def engine_model(self) -> Any:
        return self.target_model

    @contextlib.contextmanager
    def classic(self) -> Iterator[None]:
        """mlx-lm's own ``__call__`` on every class dflash-mlx patched, for the duration."""
        patched = {cls: cls.__dict__["__call__"] for cls in _patched_classes(self._classic_classes)}
        originals = {cls: _original_call(cls) for cls in patched}
        try:
            for cls, fn in originals.items():
                cls.__call__ = fn  # type: ignore[method-assign]
            yield
        finally:
            for cls, fn in patched.items():
                cls.__call__ = fn  # type: ignore[method-assign]

    def loop(self, prompt: list[int], max_tokens: int) -> None:
        from dflash_mlx.runtime import stream_dflash_generate

        assert self.bundle is not None
        for _ in stream_dflash_generate(
                target_model=self.target_model, target_ops=self.target_ops, tokenizer=self.bundle.tokenizer,
                draft_model=self.draft_model, draft_backend=self.bundle.draft_backend, prompt="",
                prompt_tokens_override=list(prompt), max_new_tokens=max_tokens, stop_token_ids=[],
                runtime_context=self.runtime_context, **self.loop_options()):
            pass

    def generate(self, prompt: list[int], max_tokens: int, record_states: bool = True) -> EngineRun:
        import mlx.core as mx
        from dflash_mlx.engine.events import TokenEvent
        from dflash_mlx.runtime import stream_dflash_generate

        from specparity.errors import UsageError

        if self.bundle is None:
            raise UsageError(f"{self.name}'s loop needs its drafter (--draft-model)")
        rec = _Recorder(len(prompt), record_states)
        tokens: list[int] = []
        t0 = time.perf_counter()
        stream = stream_dflash_generate(
            target_model=self.target_model, target_ops=_RecordingOps(self.target_ops, rec),
            tokenizer=self.bundle.tokenizer, draft_model=self.draft_model,
            draft_backend=_RecordingBackend(self.bundle.draft_backend, rec, self.source), prompt="",
            prompt_tokens_override=list(prompt), max_new_tokens=max_tokens, stop_token_ids=[],
            runtime_context=self.runtime_context, **self.loop_options())
        error = None
        try:
            for event in stream:
                if isinstance(event, TokenEvent):
                    tokens.append(int(event.token_id))
        except Exception as err:  # noqa: BLE001  (the engine's own error is the finding)
            error = EngineCannotRun(f"its own loop over a {len(prompt)}-token prompt, in round {len(rec.rounds)}",
                                    err)
        finally:
            stream.close()
        mx.eval(rec.logits)
        return EngineRun(list(prompt), tokens, rec.rounds, first_from_prefill=True, logits=rec.logits,
                         states=rec.states, seconds=time.perf_counter() - t0,
                         error=None if error is None else str(error))
