"""Classic decode's building blocks, shared by every probe.

A :class:`Decoder` prefills the way mlx-lm's ``generate_step`` does (the prompt
minus its last token in ``prefill_step_size`` chunks, each evaluated, then the
last token as the first decode step), applies the same KV-cache quantization
after every call, and exposes single steps and W-row blocks over one cache.
Caches can be copied exactly, snapshotted to arrays, and trimmed with a check
that the trim took effect.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

DEFAULT_PREFILL_STEP = 2048  # mlx-lm generate_step's default
DEFAULT_QUANTIZED_KV_START = 5000


@dataclass
class CacheOptions:
    """The cache configuration a server runs, applied exactly as mlx-lm does.

    kv_bits / kv_group_size / quantized_kv_start: mlx-lm's quantized KV cache
      (None bits = not quantized); quantization starts once a layer holds
      ``quantized_kv_start`` positions.
    max_kv_size: a rotating KV cache of this many positions (models without
      their own ``make_cache``), None = unbounded.
    prefill_step_size: prompt chunk size of classic prefill.
    """

    kv_bits: int | None = None
    kv_group_size: int = 64
    quantized_kv_start: int = DEFAULT_QUANTIZED_KV_START
    max_kv_size: int | None = None
    prefill_step_size: int = DEFAULT_PREFILL_STEP

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_argv(self) -> list[str]:
        """The command-line flags that rebuild exactly these options (``cache_options`` parses them)."""
        argv = ["--prefill-step-size", str(self.prefill_step_size),
                "--quantized-kv-start", str(self.quantized_kv_start),
                "--kv-group-size", str(self.kv_group_size)]
        if self.kv_bits is not None:
            argv += ["--kv-bits", str(self.kv_bits)]
        if self.max_kv_size is not None:
            argv += ["--max-kv-size", str(self.max_kv_size)]
        return argv

    def describe(self) -> str:
        parts = [f"prefill_step_size={self.prefill_step_size}"]
        if self.kv_bits is not None:
            parts.append(
                f"kv_bits={self.kv_bits} kv_group_size={self.kv_group_size}"
                f" quantized_kv_start={self.quantized_kv_start}"
            )
        if self.max_kv_size is not None:
            parts.append(f"max_kv_size={self.max_kv_size}")
        return " ".join(parts)


def make_cache(model: Any, opts: CacheOptions) -> list[Any]:
    from mlx_lm.models.cache import make_prompt_cache

    return make_prompt_cache(model, max_kv_size=opts.max_kv_size)


def quantize_if_due(cache: list[Any], opts: CacheOptions) -> None:
    """mlx-lm's ``maybe_quantize_kv_cache``; a group size the model's head size does not divide is the
    user's ``--kv-group-size`` (UsageError naming it), not an internal error."""
    from mlx_lm.generate import maybe_quantize_kv_cache

    try:
        maybe_quantize_kv_cache(cache, opts.quantized_kv_start, opts.kv_group_size, opts.kv_bits)
    except ValueError as err:
        if "[quantize]" not in str(err) or "group size" not in str(err):
            raise
        import re

        from specparity.errors import Name, UsageError

        dims = re.findall(r"\d+", str(err).rsplit("shape", 1)[-1]) if "shape" in str(err) else []
        head = int(dims[-1]) if dims else None
        fits = [g for g in (128, 64, 32) if head is not None and head % g == 0]
        raise UsageError(Name("kv-group-size"), f" {opts.kv_group_size}: does not divide the KV cache's head size"
                         + (f" {head}" if head is not None else "")
                         + " (mlx quantizes the KV cache in groups along the head)"
                         + (f": pass --kv-group-size {fits[0]}" if fits else "")) from err


def tree_items(tree: Any) -> list[tuple[str, Any]]:
    """``mlx.utils.tree_flatten`` as (name, leaf) pairs (its annotation also admits a dict)."""
    from mlx.utils import tree_flatten

    items = tree_flatten(tree)
    assert isinstance(items, list)
    return items


# mlx-lm's cache classes whose arrays are their own attributes: evaluating those buffers is
# evaluating the state (``state`` would slice them anew on every call, and classic decode
# evaluates a cache on every step of a probe's chain). Any other class goes through ``state``.
_BUFFER_ATTRS = {
    "KVCache": ("keys", "values"),
    "RotatingKVCache": ("keys", "values"),
    "QuantizedKVCache": ("keys", "values"),
    "ChunkedKVCache": ("keys", "values"),
    "ArraysCache": ("cache",),
    "MambaCache": ("cache",),
}


def _buffers(c: Any) -> list[Any] | None:
    """The arrays a known mlx-lm cache holds, read from its attributes; None for any other class."""
    cls = type(c)
    attrs = _BUFFER_ATTRS.get(cls.__name__)
    if attrs is None or not cls.__module__.startswith("mlx_lm."):
        return None
    out: list[Any] = []
    for name in attrs:
        value = getattr(c, name, None)
        for a in value if isinstance(value, (list, tuple)) else (value,):
            if hasattr(a, "shape"):
                out.append(a)
            elif a is not None:
                return None  # a layout this reader does not know: ask ``state``
    return out


def cache_arrays(cache: list[Any]) -> list[Any]:
    """Every array a cache list holds (for mx.eval)."""
    out: list[Any] = []
    for c in cache:
        fast = _buffers(c)
        out.extend(fast if fast is not None else (v for _, v in tree_items(c.state) if hasattr(v, "shape")))
    return out


def copy_cache(cache: list[Any]) -> list[Any]:
    """An exact, independent copy of a cache list (evaluated first)."""
    import mlx.core as mx

    mx.eval(cache_arrays(cache))
    return copy.deepcopy(cache)


def layer_kind(c: Any) -> str:
    return type(c).__name__


def cache_offset(c: Any) -> int | None:
    off = getattr(c, "offset", None)
    return int(off) if isinstance(off, int) else None


@dataclass
class LayerState:
    """One layer's cache contents, logically (valid positions only).

    kind: the cache class (KVCache, RotatingKVCache, QuantizedKVCache, ArraysCache...).
    offset: positions the layer has seen (None for caches without one).
    arrays: name -> array (``keys``, ``values``; ``keys.scales``; ``state.0`` ...).
    """

    kind: str
    offset: int | None
    arrays: dict[str, Any] = field(default_factory=dict)


def snapshot(cache: list[Any], evaluate: bool = True) -> list[LayerState]:
    """Each layer's valid cache contents, for byte comparison. ``evaluate`` False: the caller evaluates
    them (:func:`state_arrays`) together with its own arrays, before the cache changes."""
    import mlx.core as mx

    from specparity.mlx_compat import temporal_order

    out = []
    for c in cache:
        kind, off = layer_kind(c), cache_offset(c)
        arrays: dict[str, Any] = {}
        if hasattr(c, "keys") and hasattr(c, "values"):
            k, v = c.keys, c.values
            if kind == "RotatingKVCache" and k is not None:
                k, v = temporal_order(c, k), temporal_order(c, v)
            for name, arr in (("keys", k), ("values", v)):
                if arr is None:
                    continue
                parts = arr if isinstance(arr, (tuple, list)) else (arr,)
                for i, a in enumerate(parts):
                    n = a.shape[2] if kind == "RotatingKVCache" or off is None else min(off, a.shape[2])
                    arrays[name if len(parts) == 1 else f"{name}.{i}"] = a[..., :n, :]
        elif hasattr(c, "cache") and isinstance(getattr(c, "cache"), list):
            for i, a in enumerate(c.cache):
                if a is not None:
                    arrays[f"state.{i}"] = a
        else:
            for name, a in tree_items(c.state):
                if hasattr(a, "shape"):
                    arrays[name or "state"] = a
        out.append(LayerState(kind, off, arrays))
    if evaluate:
        mx.eval(state_arrays(out))  # every layer's slices in one evaluation
    return out


def state_arrays(state: list[LayerState]) -> list[Any]:
    """Every array of a snapshot."""
    return [a for layer in state for a in layer.arrays.values()]


def trimmable(cache: list[Any]) -> bool:
    return all(c.is_trimmable() for c in cache)


class Decoder:
    """Forwards over one model and one cache list, the way classic decode runs them."""

    def __init__(self, model: Any, opts: CacheOptions | None = None):
        self.model = model
        self.opts = opts or CacheOptions()
        self.cache: list[Any] = make_cache(model, self.opts)

    def forward(self, tokens: list[int], then: Callable[[Any], list[Any]] | None = None) -> Any:
        """One model call over ``tokens`` (len = rows); returns logits (rows, vocab), evaluated.

        ``then``: what the caller computes from the logits (a row, its pick), built by ``then(logits)``
        and evaluated with them: one synchronisation instead of two."""
        import mlx.core as mx

        logits = self.model(mx.array(tokens, dtype=mx.uint32)[None], cache=self.cache)[0]
        quantize_if_due(self.cache, self.opts)
        mx.eval(logits, cache_arrays(self.cache), then(logits) if then is not None else [])
        return logits

    def step(self, token: int) -> tuple[Any, int]:
        """One single-token forward and classic decode's greedy token after it, evaluated together.

        The same call and the same pick as ``forward([token])[-1]`` then :func:`greedy_token`,
        in one evaluation instead of two (the chain of every probe runs this).
        """
        import mlx.core as mx

        logits = self.model(mx.array([token], dtype=mx.uint32)[None], cache=self.cache)[0]
        quantize_if_due(self.cache, self.opts)
        row = logits[-1]
        pick = _greedy_pick_lazy(row)
        mx.eval(logits, pick, cache_arrays(self.cache))
        return row, int(pick.item())

    def prefill(self, prompt: list[int]) -> int:
        """Classic prefill of all but the last prompt token; returns that last token."""
        if not prompt:
            from specparity.errors import UsageError

            raise UsageError("empty prompt")
        rest = list(prompt)
        step = max(1, int(self.opts.prefill_step_size))
        while len(rest) > 1:
            n = min(step, len(rest) - 1)
            self.forward(rest[:n])
            rest = rest[n:]
        return rest[0]

    def fork(self) -> Decoder:
        """A decoder over an exact copy of this cache."""
        other = Decoder.__new__(Decoder)
        other.model, other.opts = self.model, self.opts
        other.cache = copy_cache(self.cache)
        return other

    def offsets(self) -> list[int | None]:
        return [cache_offset(c) for c in self.cache]


def classic_logprobs(logits_row: Any) -> Any:
    """Classic decode's logprobs of one logits row, exactly as mlx-lm's ``generate_step`` forms them.

    ``logits - logsumexp(logits)`` over a (1, vocab) row, in the model's dtype:
    in bfloat16 or float16 two different logits can round to the same logprob,
    and the greedy sampler then keeps the lower id. Returns shape (1, vocab).
    """
    import mlx.core as mx

    logits = logits_row.reshape(1, -1)
    return logits - mx.logsumexp(logits, keepdims=True)


def greedy_token(logits_row: Any) -> int:
    """The token mlx-lm's classic greedy decode emits after ``logits_row``.

    The one place the reference chain (probe, walk, replay, bisect) picks a
    token: mlx-lm's greedy sampler (``sample_utils.make_sampler(0.0)``, an argmax:
    ``greedy_sampler`` in 0.32, a lambda in 0.31) over :func:`classic_logprobs`. Logits
    processors, when a reference applies them, act on the logits before this call, as in
    ``generate_step``.
    """
    return int(_greedy_pick_lazy(logits_row).item())


def _greedy_pick_lazy(logits_row: Any) -> Any:
    """:func:`greedy_token` as an unevaluated one-element array."""
    return _greedy_of(classic_logprobs(logits_row))


def _greedy_of(logprobs: Any) -> Any:
    """mlx-lm's greedy sampler over classic logprobs, as an unevaluated one-element array."""
    from mlx_lm.sample_utils import make_sampler

    return make_sampler(0.0)(logprobs).reshape(-1)


def greedy_tokens(rows: list[Any]) -> list[Any]:
    """:func:`greedy_token` of each logits row, row by row as mlx-lm's verify picks, unevaluated (one-element
    arrays): the caller evaluates them in one go with its own arrays, then reads each (``int(p.item())``)."""
    return [_greedy_pick_lazy(row) for row in rows]


@dataclass
class GreedyPick:
    """Classic decode's greedy choice at one row, and how near a tie it was.

    token: what classic decode emits (argmax of logprobs in the model's dtype).
    raw_argmax: argmax of the raw logits (what a reference without the sampler picks).
    runner_up: the best other token in logprob space.
    margin: top-1 minus top-2 logprob, in the model's dtype's values (0.0: an
      exact tie, which the sampler breaks toward the lower id).
    logprob: the chosen token's logprob.
    """

    token: int
    raw_argmax: int
    runner_up: int
    margin: float
    logprob: float

    @property
    def tie_flip(self) -> bool:
        """Raw-logit argmax and classic's logprob argmax disagree (a tie the dtype made)."""
        return self.token != self.raw_argmax

    def describe(self) -> str:
        if self.tie_flip:
            return (f"exact tie in logprob space: ids {self.token} and {self.raw_argmax} both"
                    f" {self.logprob:.6g}; classic keeps the lower id {self.token}, raw-logit argmax"
                    f" would pick {self.raw_argmax}")
        return (f"classic token {self.token} (logprob {self.logprob:.6g}), runner-up {self.runner_up},"
                f" top-2 logprob margin {self.margin:.6g}")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "tie_flip": self.tie_flip}


def greedy_pick_parts(logits_row: Any) -> list[Any]:
    """:func:`greedy_pick`'s arrays, unevaluated: classic's pick (:func:`greedy_token`'s own computation),
    the raw-logit argmax and the logprobs as float32 (exact for every float dtype mlx-lm emits)."""
    import mlx.core as mx

    lp = classic_logprobs(logits_row)
    return [_greedy_of(lp), mx.argmax(logits_row.reshape(-1)), lp.reshape(-1).astype(mx.float32)]


def greedy_pick(logits_row: Any, parts: list[Any] | None = None) -> GreedyPick:
    """:func:`greedy_token` with the evidence a near-tie flip needs. ``parts``: :func:`greedy_pick_parts`
    of ``logits_row``, already built (and evaluated with the forward that made the row)."""
    import mlx.core as mx
    import numpy as np

    pick, raw, lp = parts if parts is not None else greedy_pick_parts(logits_row)
    mx.eval(pick, raw, lp)  # one evaluation for the three (nothing left to do when evaluated already)
    token = int(pick.item())
    values = np.array(lp)
    chosen = values[token]  # a float32 scalar, kept before its place is masked
    values[token] = -np.inf
    runner = int(np.argmax(values))
    return GreedyPick(token, int(raw.item()), runner, float(chosen - values[runner]), float(chosen))


def advance_to_depth(model: Any, prompt: list[int], depth: int,
                     opts: CacheOptions | None = None) -> tuple[Decoder, int, list[int]]:
    """Prefill ``prompt`` as classic decode does, then decode ``depth`` tokens greedily (:func:`greedy_token`).

    Returns the decoder (its cache holds prompt[:-1] + the fed tokens), the next
    token to feed, and the ``depth`` tokens emitted so far.
    """
    dec = Decoder(model, opts)
    y = dec.prefill(prompt)
    emitted: list[int] = []
    for _ in range(depth):
        y = dec.step(y)[1]
        emitted.append(y)
    return dec, y, emitted


def greedy_chain(dec: Decoder, first: int, n: int) -> tuple[list[int], Any]:
    """``n`` single-token steps from ``first``, each feeding classic decode's greedy token.

    Returns the ``n`` fed tokens (first, then greedy tokens) and the (n, vocab) logits:
    exactly what a full-accept W-row verify block must reproduce.
    """
    import mlx.core as mx

    tokens, rows = [first], []
    for i in range(n):
        row = dec.forward([tokens[-1]])[-1]
        rows.append(row)
        if i < n - 1:
            tokens.append(greedy_token(row))
    return tokens, mx.stack(rows)


# --- classic decode's tokens: the one call every side that needs them makes -------------------------

def classic_steps(model: Any, prompt: Any, max_tokens: int, **options: Any) -> Any:
    """Classic decode: mlx-lm's ``generate_step`` on ``prompt`` without a drafter (a fresh cache unless
    ``prompt_cache`` is given), yielding (token, logprobs). ``options``: ``generate_step``'s own (sampler,
    logits_processors, prompt_cache, prefill_step_size, kv_bits...), each left at its default when not given,
    as ``stream_generate`` leaves it.

    The one home of classic decode's tokens: the served reference and the in-process server
    (:func:`specparity.mlx_server.decode_classic`) and every engine's e2e (its classic arm,
    :class:`specparity.probes.engine_e2e.Classic`) call it; the probes' forwards (:class:`Decoder`: the
    chain, the replay's :class:`~specparity.probes.replay.classic.ClassicChain`) are its prefill and steps
    one forward at a time, where a row's raw logits are compared.
    """
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    ids = prompt if isinstance(prompt, mx.array) else mx.array(list(prompt))
    return generate_step(ids, model, max_tokens=max_tokens, **options)


@dataclass
class Step:
    """One generated token as the server's response loop receives it (``stream_generate``'s fields)."""

    token: int
    text: str
    logprobs: Any
    finish_reason: str | None = None


def stream_steps(tokenizer: Any, steps: Any, max_tokens: int, finalize: bool = True) -> Any:
    """``generate_step``'s (token, logprobs) as ``stream_generate`` turns them into responses.

    The same rules without its timing and memory readings: an EOS token ends the stream
    (finish ``stop``, not detokenized), the ``max_tokens``-th token ends it (``length``),
    each text segment is the detokenizer's ``last_segment``. ``finalize=False``: the last
    token's segment without the detokenizer's held bytes, as mlx-lm 0.31's batched path
    sends it (it never finalizes: a trailing partial character is dropped).
    """
    detok = tokenizer.detokenizer
    eos = tokenizer.eos_token_ids
    for n, (token, logprobs) in enumerate(steps):
        if token in eos:
            detok.finalize()
            yield Step(token, detok.last_segment, logprobs, "stop")
            return
        detok.add_token(token)
        if n + 1 == max_tokens:
            if finalize:
                detok.finalize()
            yield Step(token, detok.last_segment, logprobs, "length")
            return
        yield Step(token, detok.last_segment, logprobs)


def stream_text(tokenizer: Any, token_ids: Sequence[int]) -> str:
    """The text ``stream_generate`` gives for ``token_ids`` (its detokenizer, its eos stop): what classic
    decode writes for them, so an engine's ids are turned into text as classic decode's are."""
    steps = ((int(t), None) for t in token_ids)
    return "".join(s.text for s in stream_steps(tokenizer, steps, max(len(token_ids), 1)))
