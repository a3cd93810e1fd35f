"""The probe's two arms, run once each with every layer captured, for any engine.

From the state after prefill and ``depth`` decoded tokens, the chain arm feeds
``width`` single tokens (greedy, classic decode), and the block arm feeds the
same ``width`` tokens in one verify block through the engine's adapter, exactly
as the probe does (mlx-lm's own adapter for a bare model). The chain's per-step captures
(one row each) are stacked along their row axis so they line up with the
block's ``width`` rows.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from specparity.bisect.capture import CaptureMap, capture, layer_kind, model_layers
from specparity.compare import compare_arrays
from specparity.decode import CacheOptions, LayerState
from specparity.reproducibility import Bracket, repeat_chain

log = logging.getLogger(__name__)

ARMS = ("chain", "block")


@dataclass
class ArmCapture:
    """Everything one arm computed, rows stacked.

    arm: ``chain`` (W single steps) or ``block`` (one W-row call).
    order: capture names in execution pre-order (``embed``, ``layers.0``,
      ``layers.0.input_layernorm``, ..., ``final_norm``, ``logits``).
    arrays: name -> array holding all W rows.
    row_axes: name -> the axis that indexes rows (None: the output does not grow with rows).
    cache: every layer's cache after the arm (``specparity.decode.snapshot``).
    """

    arm: str
    order: list[str]
    arrays: dict[str, Any]
    row_axes: dict[str, int | None]
    cache: list[LayerState]

    @property
    def logits(self) -> Any:
        return self.arrays["logits"]

    def activation_bytes(self) -> int:
        """Bytes of the captured outputs (W rows each; the logits included)."""
        return int(sum(a.nbytes for a in self.arrays.values()))

    def cache_bytes(self) -> int:
        """Bytes of the cache snapshot (all positions, like the cache itself)."""
        return int(sum(a.nbytes for s in self.cache for a in s.arrays.values()))

    def nbytes(self) -> int:
        return self.activation_bytes() + self.cache_bytes()


@dataclass
class BisectCapture:
    """Both arms of one bisect, plus what they ran on.

    width / depth / prompt: the probe coordinates; tokens: the W tokens both arms fed.
    layer_kinds: per decoder layer, a name from the layer-type table.
    arms: ``chain`` and/or ``block`` -> ArmCapture.
    capture_map: which modules were wrapped.
    seconds: wall time of each arm (``advance`` = prefill + depth, uncaptured).
    capture_bytes: bytes held by all captures and cache snapshots.
    bracket: the chain arm repeated from the same state (reproducibility.Bracket);
      its ``where`` names the first capture whose repeat differed.
    """

    width: int
    depth: int
    prompt: list[int]
    tokens: list[int]
    layer_kinds: list[str]
    arms: dict[str, ArmCapture]
    capture_map: CaptureMap
    seconds: dict[str, float] = field(default_factory=dict)
    bracket: Bracket | None = None

    @property
    def capture_bytes(self) -> int:
        return sum(a.nbytes() for a in self.arms.values())


def row_axis(step_shape: tuple[int, ...], block_shape: tuple[int, ...], width: int) -> int | None:
    """The axis that is 1 in a single step and ``width`` in the block."""
    if len(step_shape) != len(block_shape):
        return None
    if width == 1:
        if step_shape != block_shape:
            return None
        ones = [i for i, n in enumerate(step_shape) if n == 1]
        # (batch, rows, ...) is the common layout: the second unit axis is the row axis
        return ones[1] if len(ones) > 1 else (ones[0] if ones else None)
    axes = [i for i, (s, b) in enumerate(zip(step_shape, block_shape)) if s != b]
    if len(axes) == 1 and step_shape[axes[0]] == 1 and block_shape[axes[0]] == width:
        return axes[0]
    return None


def _paired(chain_calls: list[list[tuple[str, Any]]], block_calls: list[list[tuple[str, Any]]],
            width: int) -> tuple[list[str], dict[str, Any], dict[str, Any], dict[str, int | None]]:
    """The block's captures in order and by name, and the chain's stacked to match (W calls against 1)."""
    if len(chain_calls) != width or len(block_calls) != 1:
        raise RuntimeError(f"expected {width} chain calls and 1 block call, recorded"
                           f" {len(chain_calls)} and {len(block_calls)}")
    block_order = [n for n, _ in block_calls[0]]
    block = dict(block_calls[0])
    chain_arrays, axes = _stack_chain(chain_calls, block, width)
    return block_order, block, chain_arrays, axes


def _stack_chain(calls: list[list[tuple[str, Any]]], block: dict[str, Any],
                 width: int) -> tuple[dict[str, Any], dict[str, int | None]]:
    import mlx.core as mx

    steps = [dict(c) for c in calls]
    arrays: dict[str, Any] = {}
    axes: dict[str, int | None] = {}
    for name, barr in block.items():
        parts = [p for s in steps if (p := s.get(name)) is not None]
        if len(parts) != len(steps):
            log.warning("capture %s is missing from some chain steps; skipped", name)
            continue
        shapes = {tuple(p.shape) for p in parts}
        axis = (row_axis(tuple(parts[0].shape), tuple(barr.shape), width)
                if len(shapes) == 1 else None)
        axes[name] = axis
        arrays[name] = mx.concatenate(parts, axis=axis) if axis is not None else parts[-1]
    return arrays, axes


def _engine_block_calls(engine: Any, session: Any, tokens: list[int],
                        subop_depth: int = 2) -> list[list[tuple[str, Any]]]:
    """The engine's verify over ``tokens`` (``session.verify``) with capture on the model its forward runs
    through (``engine.engine_model()``): the recorded model calls."""
    with capture(engine.engine_model(), subop_depth=subop_depth) as (rec, _):
        # the engine's verify returns (rows, vocab); the chain arm's model calls (1, rows, vocab)
        rec.model_call(lambda _m, toks: session.verify(toks)[None], None, (tokens,), {})
        return rec.pop_calls()


def run_arms(model: Any, prompt: list[int], width: int, depth: int,
             opts: CacheOptions | None = None, arms: tuple[str, ...] = ARMS,
             subop_depth: int = 2, accepted: int | None = None) -> BisectCapture:
    """Classic decode's chain against an engine's own verify block, every layer and sub-op captured.

    model: an engine adapter (:class:`specparity.probes.engines.base.Engine`), or a bare mlx-lm model
    (through mlx-lm's own adapter, with ``opts``). Classic decode (mlx-lm's own path,
    :meth:`Engine.classic`) prefills, decodes ``depth`` tokens and runs the chain with capture on; the
    engine starts from an exact copy of that state (its own cache types) and runs its verify forward
    over the same ``width`` tokens with capture on its own model. The chain arm always runs (it decides
    the tokens both arms feed); ``arms`` says which captures are kept. The chain arm is also repeated
    once from the same state (the reproducibility bracket, ``BisectCapture.bracket``). With
    ``accepted``, the engine then rolls back to ``accepted`` its own way and the block arm's cache is
    its state after the rollback, the chain arm's is classic decode's after the ``accepted + 1`` kept
    tokens: the per-layer report then names the first layer whose state the rollback got wrong.
    """
    import mlx.core as mx

    from specparity.decode import advance_to_depth, greedy_chain, snapshot
    from specparity.probes.forward.blockchain import as_engine

    engine = as_engine(model, opts)
    seconds: dict[str, float] = {}
    cmodel = engine.classic_model()
    t0 = time.perf_counter()
    with engine.classic():
        dec, first, _ = advance_to_depth(cmodel, prompt, depth, engine.cache_options())
        seconds["advance"] = time.perf_counter() - t0
        with capture(cmodel, subop_depth=subop_depth) as (rec, cmap):
            t0 = time.perf_counter()
            chain_dec = dec.fork()
            kept = chain_dec.fork() if accepted is not None else None
            tokens, chain_logits = greedy_chain(chain_dec, first, width)
            chain_calls = rec.pop_calls()
            seconds["chain"] = time.perf_counter() - t0
            bracket = repeat_chain(dec, tokens, chain_logits, len(prompt) - 1 + depth,
                                   f"width {width}, depth {depth}")
            repeat_calls = rec.pop_calls()
        if kept is not None and accepted is not None:
            for t in tokens[: accepted + 1]:
                kept.forward([t])
    session = engine.session()
    session.adopt(dec.cache)
    t0 = time.perf_counter()
    block_calls = _engine_block_calls(engine, session, tokens, subop_depth)
    if accepted is not None:
        session.rollback(accepted)
    seconds["block"] = time.perf_counter() - t0
    block_order, block, chain_arrays, axes = _paired(chain_calls, block_calls, width)
    if not bracket.reproducible:
        repeat_arrays, _ = _stack_chain(repeat_calls, block, width)
        differing = next((n for n in block_order if n in chain_arrays and n in repeat_arrays
                          and not compare_arrays(chain_arrays[n], repeat_arrays[n]).equal), None)
        if differing is not None:
            bracket.where += f"; first differing capture: {differing}"
    order = [n for n in block_order if n in chain_arrays]
    mx.eval(list(chain_arrays.values()), list(block.values()))
    chain_cache = snapshot((kept if kept is not None else chain_dec).cache)
    block_cache = session.state()
    layers = model_layers(cmodel)
    # a cache list shorter than the layers (nemotron_h: no cache for MLP blocks) cannot be
    # matched to them by index: each block's own modules decide its kind then
    aligned = len(chain_cache) == len(layers)
    kinds = [layer_kind(layer, chain_cache[i].kind if aligned else None) for i, layer in enumerate(layers)]
    out: dict[str, ArmCapture] = {}
    if "chain" in arms:
        out["chain"] = ArmCapture("chain", order, chain_arrays, axes, chain_cache)
    if "block" in arms:
        out["block"] = ArmCapture("block", order, {n: block[n] for n in order}, axes, block_cache)
    return BisectCapture(width, depth, list(prompt), list(tokens), kinds, out, cmap, seconds, bracket)
