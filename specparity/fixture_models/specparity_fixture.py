"""A checkpoint's ``model_file`` that injects known behaviour into a stock mlx-lm model.

The checkpoint's config.json carries a ``specparity`` section::

    {"base": "llama",                      # the mlx-lm module the weights belong to
     "faults": [                            # each fault multiplies an output by (1 + 2**-6)
        {"kind": "rows",  "layer": 3, "subop": "mlp", "min_rows": 4},
        {"kind": "depth", "layer": 1, "subop": "self_attn", "min_offset": 40, "min_rows": 2},
        {"kind": "prefill_path", "layer": 0, "min_rows": 2},  # the block that continues the prefill
        {"kind": "stale_trim"},             # cache trim(n) keeps one stale row
        {"kind": "noise", "layer": 2, "subop": "mlp"}],  # not reproducible call to call
     "constant_logits": [..],               # optional: logits that ignore the input
     "witness": "target",                   # optional: log every forward (see below)
     "module_file": "modeling.py"}          # optional: the checkpoint's own model_file,
                                            # wrapped instead of mlx_lm.models.<base>

``rows``: fires when the call has at least ``min_rows`` rows (a verify-width kernel).
``depth``: fires when the call has at least ``min_rows`` rows and the cache already
holds at least ``min_offset`` positions (a kernel that changes past a depth).
``prefill_path``: fires when the call has at least ``min_rows`` rows and continues, from the
position where it ended, a run of calls of 2+ rows that began at position 0: the prefill's own
kernel path taken on past the prompt (mlx-lm's speculative path prefills all of the prompt but
its last token, then carries that token in its first verify block; classic decode runs it
alone, so only the speculative path meets the fault; a chunked prefill's later chunks do too).
``noise``: adds 2**-8 * N(0, 1) noise (``"scale"``: another factor than 2**-8) drawn
from a key that counts the model's calls, so the same input gives other bytes on every
call (a forward that is not reproducible); ``layer`` null puts it on the logits.
``tie``: ``{"kind": "tie", "min_rows": 2}`` makes every row's top logit an exact tie with
the next id's (the next id's logit set to the top one's, in the model's dtype: classic
decode's argmax keeps the lower id); in calls of at least ``min_rows`` rows the next id's
logit is one step of the dtype above instead, so a verify block breaks the tie the other
way (a kernel whose last bit differs at a width, on a tied pair).
``process_noise``: ``{"kind": "process_noise", "scale": 4.0}`` adds to the logits a
bias drawn once per process from the OS's entropy: reproducible within a process,
not across processes (a served baseline that disagrees with itself). Two random
biases may favour ids that decode to the same text (two lone UTF-8 continuation
bytes both reach a client as U+FFFD); with ``"tokens": [a, b, ...]`` the bias is
``scale`` on one of those tokens instead, each model of this checkpoint taking the
next one at its first forward (claimed in a ``.process-noise`` folder beside this
file, across processes), so models up to ``len(tokens)`` apart favour different tokens.
``slow``: ``{"kind": "slow", "seconds": 0.05, "min_rows": 8}`` sleeps that long in every
call of at least ``min_rows`` rows (default 1): a forward that takes time, as a large
model's prefill does, without changing a byte.
``witness``: when the environment names a file in ``SPECPARITY_WITNESS_FILE``,
every forward appends ``<pid> <role> <rows> <cache offset>`` to it (the served
harness's engine-agnostic evidence of verify blocks and drafter calls).
``module_file``: a checkpoint that ships its own ``model_file`` is wrapped by
loading that file (next to this one, as mlx-lm loads a model_file: from its
path, unregistered) and wrapping its ``Model``; the server runs it only under
``--trust-remote-code``, the consent that checkpoint needs anyway.
An optional ``"scale"`` replaces the factor (1 + 2**-6 flips no greedy token on most
prompts; a served test that needs a flip uses e.g. 1.5).
``subop`` is an attribute of the decoder layer (``self_attn``, ``mlp``,
``linear_attn``, ``input_layernorm``...) or null for the layer's own output.

Weights and parameter names are the base model's: the faults swap the class of
one submodule for a subclass with a different ``__call__``, nothing else.
"""

import importlib
import os
import time
from typing import Any

import mlx.core as mx
import mlx.nn as nn

FAULT_SCALE = 1.0 + 2.0**-6


# mlx-lm loads this file without registering it in sys.modules, so no dataclasses here.
class ModelArgs:
    def __init__(self, config: dict):
        self.config = config

    @classmethod
    def from_dict(cls, params: dict) -> "ModelArgs":
        return cls(config=dict(params))


class _CallState:
    """Rows and starting cache offset of the model call in progress; calls made so far."""

    rows = 0
    offset = 0
    calls = 0
    continues_prefill = False  # the call goes on, where it ended, from a run of 2+ row calls begun at 0


NOISE_SCALE = 2.0**-8


def _call_noise(out: Any, scale: float = NOISE_SCALE) -> Any:
    """Noise keyed by the call counter: the same input differs from call to call."""
    x = out[0] if isinstance(out, tuple) else out
    noise = mx.random.normal(x.shape, key=mx.random.key(_CallState.calls)) * scale
    x = x + noise.astype(x.dtype)
    return (x,) + out[1:] if isinstance(out, tuple) else x


def _cache_offset(cache: Any) -> int:
    if not cache:
        return 0
    for c in cache:
        off = getattr(c, "offset", None)
        if isinstance(off, int):
            return off
    return 0


def _swap_call(module: nn.Module, make_call) -> None:
    cls = type(module)
    orig = cls.__call__
    module.__class__ = type(cls.__name__, (cls,), {"__call__": make_call(orig)})


def _continues_prefill(cache: Any, rows: int, offset: int) -> bool:
    """Whether this call goes on from where a run of 2+ row calls begun at position 0 ended, on this cache (the
    run's end is kept on the cache's first layer, so a copy of the cache carries it as its contents)."""
    holder = cache[0] if cache else None
    if holder is None:
        return False
    cont = offset > 0 and offset == getattr(holder, "_specparity_run_end", None)
    holder._specparity_run_end = offset + rows if rows >= 2 and (offset == 0 or cont) else None
    return cont


def _fires(fault: dict) -> bool:
    if _CallState.rows < int(fault.get("min_rows", 2)):
        return False
    if fault["kind"] == "depth":
        return _CallState.offset >= int(fault["min_offset"])
    if fault["kind"] == "prefill_path":
        return _CallState.continues_prefill
    return True


def _perturb(out: Any, scale: float = FAULT_SCALE) -> Any:
    if isinstance(out, tuple):
        return (out[0] * scale,) + out[1:]
    return out * scale


def _install_fault(layers: list, fault: dict) -> None:
    layer = layers[int(fault["layer"])]
    target = layer if fault.get("subop") in (None, "") else getattr(layer, fault["subop"])

    def make_call(orig):
        def __call__(self, *args, **kwargs):
            out = orig(self, *args, **kwargs)
            if fault["kind"] == "noise":
                return _call_noise(out, float(fault.get("scale", NOISE_SCALE)))
            return _perturb(out, float(fault.get("scale", FAULT_SCALE))) if _fires(fault) else out

        return __call__

    _swap_call(target, make_call)


def _stale_trim_cache(cache: Any) -> Any:
    """Make ``trim(n)`` drop only n - 1 rows while claiming n (a silent stale row)."""

    def make_call(orig):
        def trim(self, n):
            kept = orig(self, max(n - 1, 0))
            return n if n > 0 else kept

        return trim

    cls = type(cache)
    cache.__class__ = type(cls.__name__, (cls,), {"trim": make_call(cls.trim)})
    return cache


# one step of each dtype's mantissa: x + |x| * this moves x by one or two ULPs
_EPS = {"bfloat16": 2.0**-7, "float16": 2.0**-10, "float32": 2.0**-23}


def _tie_logits(out: Any, above: bool) -> Any:
    """Every row's top logit tied with the next id's (``above``: the next id one step higher instead)."""
    top = mx.argmax(out, axis=-1, keepdims=True)
    best = mx.take_along_axis(out, top, axis=-1)
    vocab = out.shape[-1]
    partner = mx.where(top + 1 < vocab, top + 1, top - 1)
    if above:
        eps = _EPS.get(str(out.dtype).replace("mlx.core.", ""), 2.0**-23)
        best = best + mx.maximum(mx.abs(best) * eps, mx.array(1e-30)).astype(out.dtype)
    hit = mx.arange(vocab) == partner
    return mx.where(hit, best, out)


def _witness_line(role: str, rows: int, offset: int) -> None:
    path = os.environ.get("SPECPARITY_WITNESS_FILE")
    if path:
        with open(path, "a") as f:
            f.write(f"{os.getpid()} {role} {rows} {offset}\n")


def _own_module(name: str) -> Any:
    """The checkpoint's own model file, loaded as mlx-lm loads a ``model_file``."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
    spec = importlib.util.spec_from_file_location("specparity_wrapped_model", path)
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot load the checkpoint's own model file {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _claim_index(folder: str) -> int:
    """The first index no other model of this checkpoint has claimed (an exclusive create)."""
    os.makedirs(folder, exist_ok=True)
    k = 0
    while True:
        try:
            os.close(os.open(os.path.join(folder, str(k)), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return k
        except FileExistsError:
            k += 1


def _process_bias(fault: dict, vocab: int) -> mx.array:
    """A process_noise fault's bias: a normal draw from the OS's entropy, or ``scale`` on the next
    of its ``tokens``."""
    scale = float(fault.get("scale", 4.0))
    tokens = fault.get("tokens")
    if not tokens:
        key = mx.random.key(int.from_bytes(os.urandom(4), "little"))
        return mx.random.normal((vocab,), key=key) * scale
    favoured = int(tokens[_claim_index(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                    ".process-noise")) % len(tokens)])
    return (mx.arange(vocab) == favoured).astype(mx.float32) * scale


class Model(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        config = dict(args.config)
        spec = config.get("specparity") or {}
        base = _own_module(spec["module_file"]) if spec.get("module_file") else \
            importlib.import_module(f"mlx_lm.models.{spec.get('base', 'llama')}")
        base_config = {k: v for k, v in config.items() if k not in ("model_file", "specparity")}
        self.inner = base.Model(base.ModelArgs.from_dict(base_config))
        self.model_type = getattr(self.inner, "model_type", config.get("model_type"))
        self._faults = list(spec.get("faults") or [])
        self._constant = spec.get("constant_logits")
        self._logit_noise: float | None = None
        self._witness = spec.get("witness")
        self._noise = next((f for f in self._faults if f["kind"] == "process_noise"), None)
        self._slow = [f for f in self._faults if f["kind"] == "slow"]
        self._tie = next((f for f in self._faults if f["kind"] == "tie"), None)
        self._bias: mx.array | None = None
        for fault in self._faults:
            layered = fault["kind"] in ("rows", "depth", "prefill_path")
            if layered or (fault["kind"] == "noise" and fault.get("layer") is not None):
                _install_fault(self.inner.layers, fault)
            elif fault["kind"] == "noise":
                self._logit_noise = float(fault.get("scale", NOISE_SCALE))

    @property
    def layers(self):
        return self.inner.layers

    def __call__(self, inputs, cache=None, **kwargs):
        _CallState.rows = int(inputs.shape[1])
        _CallState.offset = _cache_offset(cache)
        _CallState.calls += 1
        _CallState.continues_prefill = _continues_prefill(cache, _CallState.rows, _CallState.offset)
        if self._witness:
            _witness_line(self._witness, _CallState.rows, _CallState.offset)
        for f in self._slow:
            if _CallState.rows >= int(f.get("min_rows", 1)):
                time.sleep(float(f["seconds"]))
        out = self.inner(inputs, cache=cache, **kwargs)
        if self._logit_noise is not None:
            out = _call_noise(out, self._logit_noise)
        if self._noise is not None:
            if self._bias is None:
                self._bias = _process_bias(self._noise, out.shape[-1])
            out = out + self._bias.astype(out.dtype)
        if self._tie is not None:
            out = _tie_logits(out, _CallState.rows >= int(self._tie.get("min_rows", 2)))
        if self._constant is not None:
            logits = mx.array(self._constant, dtype=out.dtype)
            out = mx.broadcast_to(logits, out.shape[:-1] + logits.shape)
        return out

    def make_cache(self):
        from mlx_lm.models.cache import make_prompt_cache

        caches = make_prompt_cache(self.inner)
        if any(f["kind"] == "stale_trim" for f in self._faults):
            caches = [_stale_trim_cache(c) for c in caches]
        return caches

    def sanitize(self, weights):
        inner = {k[len("inner."):] if k.startswith("inner.") else k: v for k, v in weights.items()}
        if hasattr(self.inner, "sanitize"):
            inner = self.inner.sanitize(inner)
        return {f"inner.{k}": v for k, v in inner.items()}
