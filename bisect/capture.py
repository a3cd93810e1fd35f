"""Generic capture of every layer's and sub-op's output during one model call.

:func:`capture` wraps, for the duration of a ``with`` block, the model's
embedding, every decoder layer in ``model.layers``, each layer's direct
submodules (``self_attn``, ``mlp``, ``linear_attn``, the norms... whatever
exists) and their direct submodules (``q_proj``, ``rope``, ``gate``...), and
the final norm. Wrapping swaps an instance's class for a subclass whose
``__call__`` calls the original and keeps a frozen copy of its output (a new
array handle on the same buffer, taken at once: code that later changes the
output in place, such as mlx-lm's quantized attention scaling ``queries *=
scale``, rebinds the module's handle, never the copy). Nothing is recomputed,
so the numbers are the ones the plain forward computes. The original classes
are restored on exit, also on error.

The only per-architecture knowledge is :data:`LAYER_KINDS` and
:data:`MOE_MARKERS`, two small tables of names.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Iterator

log = logging.getLogger(__name__)

EMBED = "embed"
FINAL_NORM = "final_norm"
LOGITS = "logits"
_FINAL_NORM_NAMES = ("norm", "final_layernorm", "final_norm", "norm_f", "ln_f")

# Attention kind of a decoder layer, first match wins: (kind, child attribute names,
# class-name fragments of the layer's children, cache classes). A generic child
# name (``mixer``) says nothing alone: its class decides (nemotron_h's blocks hold
# a Mamba mixer, an attention or an MLP under the same name).
LAYER_KINDS: tuple[tuple[str, tuple[str, ...], tuple[str, ...], tuple[str, ...]], ...] = (
    ("linear attention (gated delta)", ("linear_attn",), ("GatedDelta",), ()),
    ("linear attention / SSM", ("mamba", "ssm"), ("Mamba", "SSM"),
     ("ArraysCache", "MambaCache")),
    ("sliding attention", (), (), ("RotatingKVCache",)),
    ("full attention", (), (), ()),
)
# A block whose only mixer is a feed-forward (nemotron_h's "-" and "E" blocks).
_ATTN_FRAGMENTS = ("Attention", "Attn")
_MLP_FRAGMENTS = ("MLP", "MoE", "Moe", "FeedForward", "Expert")
# A layer's feed-forward is a mixture of experts when any module under it has one
# of these class-name fragments or attribute names.
MOE_MARKERS = ("SwitchGLU", "SwitchMLP", "SparseMoe", "MoE", "Moe")
MOE_ATTRS = ("experts", "switch_mlp", "shared_expert")
_FFN_NAMES = ("mlp", "feed_forward", "block_sparse_moe", "moe", "ffn")


def _is_array(x: Any) -> bool:
    import mlx.core as mx

    return isinstance(x, mx.array)


def _first_array(out: Any) -> Any:
    """The output's first array, frozen: ``mx.array(x)`` is a new handle that in-place ops on x never reach."""
    import mlx.core as mx

    if _is_array(out):
        return mx.array(out)
    if isinstance(out, (tuple, list)):
        for item in out:
            if _is_array(item):
                return mx.array(item)
    return None


class Recorder:
    """Collects the outputs of wrapped modules, one list per model call.

    calls: per completed model call, (name, output array) in execution pre-order
      (a module before its children), ending with the logits.
    """

    def __init__(self) -> None:
        self.calls: list[list[tuple[str, Any]]] = []
        self._events: list[tuple[int, str, Any]] = []
        self._seq = 0
        self._layer: list[int] = []
        self._counts: dict[str, int] = {}
        # inside a model call: an adapter's verify that calls the wrapped model itself is one call
        self._in_model = False

    def _name(self, rel: str) -> str:
        base = f"layers.{self._layer[-1]}.{rel}" if self._layer else rel
        n = self._counts.get(base, 0)
        self._counts[base] = n + 1
        return base if n == 0 else f"{base}#{n}"

    def model_call(self, orig: Any, module: Any, args: tuple, kwargs: dict) -> Any:
        if self._in_model:
            return orig(module, *args, **kwargs)
        self._events, self._seq, self._layer, self._counts = [], 0, [], {}
        self._in_model = True
        try:
            out = orig(module, *args, **kwargs)
        finally:
            self._in_model = False
        events = [(n, a) for _, n, a in sorted(self._events, key=lambda e: e[0])]
        arr = _first_array(out)
        if arr is not None:
            events.append((LOGITS, arr))
        self.calls.append(events)
        self._events = []
        return out

    def call(self, orig: Any, module: Any, rel: str, layer: int | None,
             args: tuple, kwargs: dict) -> Any:
        seq = self._seq
        self._seq += 1
        if layer is not None:
            name = f"layers.{layer}"
            self._layer.append(layer)
            try:
                out = orig(module, *args, **kwargs)
            finally:
                self._layer.pop()
        else:
            name = self._name(rel)
            out = orig(module, *args, **kwargs)
        arr = _first_array(out)
        if arr is not None:
            self._events.append((seq, name, arr))
        return out

    def pop_calls(self) -> list[list[tuple[str, Any]]]:
        """The model calls recorded since the last pop."""
        out, self.calls = self.calls, []
        return out


class _Swapper:
    """Wraps modules for one :func:`capture`: one wrapper class per module class, each instance's name in a map.

    One class per class, not per instance: an engine that patches ``type(module).__call__`` for a forward
    (mlx-dspark records every gated-delta layer's conv input that way) reaches every instance, as it
    would unwrapped. The wrapper claims its original's module: an engine that finds its model's functions
    through ``sys.modules[type(layer).__module__]`` (mlx-dspark's ``gated_delta_update``) still finds them.
    """

    def __init__(self, recorder: Recorder):
        self.recorder = recorder
        self.swapped: list[tuple[Any, type]] = []
        self._classes: dict[type, type] = {}
        self._where: dict[int, tuple[str, int | None, bool]] = {}

    def __call__(self, module: Any, rel: str, layer: int | None, top: bool = False) -> None:
        cls = type(module)
        self._where[id(module)] = (rel, layer, top)
        wrapper = self._classes.get(cls)
        if wrapper is None:
            recorder, where, orig = self.recorder, self._where, cls.__call__

            def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
                at = where.get(id(self))
                if at is None:  # made during the capture (a copy): not one of the model's modules
                    return orig(self, *args, **kwargs)
                if at[2]:
                    return recorder.model_call(orig, self, args, kwargs)
                return recorder.call(orig, self, at[0], at[1], args, kwargs)

            wrapper = type(cls.__name__, (cls,), {"__call__": __call__, "__qualname__": cls.__qualname__,
                                                  "__module__": cls.__module__})
            self._classes[cls] = wrapper
        module.__class__ = wrapper
        self.swapped.append((module, cls))


def module_children(module: Any) -> list[tuple[str, Any]]:
    """A module's direct submodules (not lists of them), in definition order."""
    import mlx.nn as nn

    return [(k, v) for k, v in module.items() if isinstance(v, nn.Module)]


def find_embedding(model: Any) -> tuple[str, Any] | None:
    """The first ``nn.Embedding`` (or quantized embedding) under the model."""
    import mlx.nn as nn

    kinds = tuple(k for k in (nn.Embedding, getattr(nn, "QuantizedEmbedding", None)) if k)
    for name, mod in sorted(model.named_modules(), key=lambda nm: nm[0].count(".")):
        if isinstance(mod, kinds):
            return name, mod
    return None


def find_final_norm(model: Any) -> tuple[str, Any] | None:
    """The norm applied after the last layer: a norm-named sibling of the embedding."""
    emb = find_embedding(model)
    if emb is None:
        return None
    owner_path = emb[0].rsplit(".", 1)[0] if "." in emb[0] else ""
    owner = model
    for part in [p for p in owner_path.split(".") if p]:
        owner = owner[part] if isinstance(owner, dict) else getattr(owner, part)
    children = dict(module_children(owner))
    for name in _FINAL_NORM_NAMES:
        if name in children:
            return (f"{owner_path}.{name}" if owner_path else name), children[name]
    return None


def model_layers(model: Any) -> list[Any]:
    layers = getattr(model, "layers", None)
    if layers is None:
        from specparity.errors import UsageError

        raise UsageError("this model has no .layers list: bisect cannot find its decoder layers")
    return list(layers)


def _class_names(module: Any) -> list[str]:
    return [type(m).__name__ for _, m in module.named_modules()]


def layer_kind(layer: Any, cache_kind: str | None) -> str:
    """``<attention kind> + <feed-forward kind>`` from :data:`LAYER_KINDS` / :data:`MOE_MARKERS`."""
    children = dict(module_children(layer))
    child_classes = [type(m).__name__ for m in children.values()]
    mixer = children.get("mixer")
    if mixer is not None:  # one generic slot: its class is the block's kind
        name = type(mixer).__name__
        if not any(f in name for f in _ATTN_FRAGMENTS + ("Mamba", "SSM")) \
                and any(f in name for f in _MLP_FRAGMENTS):
            moe = any(m in c for m in MOE_MARKERS for c in _class_names(mixer))
            return "MoE only (no attention)" if moe else "MLP only (no attention)"
    attn = "full attention"
    for kind, attrs, fragments, caches in LAYER_KINDS:
        if (any(a in children for a in attrs)
                or any(f in c for f in fragments for c in child_classes)
                or (cache_kind in caches)
                or (kind == "sliding attention" and _is_sliding(layer))):
            attn = kind
            break
    ffn = next((children[n] for n in _FFN_NAMES if n in children), None)
    if ffn is None:
        return attn
    names = _class_names(ffn)
    ffn_attrs = set(ffn.keys()) if hasattr(ffn, "keys") else set()
    moe = any(m in c for m in MOE_MARKERS for c in names) or bool(ffn_attrs & set(MOE_ATTRS))
    return f"{attn} + {'MoE' if moe else 'dense MLP'}"


def _is_sliding(layer: Any) -> bool:
    for obj in [layer] + [m for _, m in module_children(layer)]:
        for attr in ("is_sliding", "use_sliding", "sliding"):
            v = getattr(obj, attr, None)
            if isinstance(v, bool) and v:
                return True
    return False


@dataclass
class CaptureMap:
    """What :func:`capture` wrapped.

    embedding / final_norm: module paths found (None if not found).
    n_layers: decoder layers wrapped.
    wrapped: number of module instances wrapped.
    """

    embedding: str | None
    final_norm: str | None
    n_layers: int
    wrapped: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


@contextlib.contextmanager
def capture(model: Any, subop_depth: int = 2) -> Iterator[tuple[Recorder, CaptureMap]]:
    """Wrap the model's modules so every call records its output; restore on exit.

    ``subop_depth``: 1 wraps each layer's direct submodules, 2 also theirs.
    """
    recorder = Recorder()
    swap = _Swapper(recorder)
    emb = find_embedding(model)
    norm = find_final_norm(model)
    layers = model_layers(model)
    try:
        seen: set[int] = set()
        if emb is not None:
            swap(emb[1], EMBED, None)
            seen.add(id(emb[1]))
        if norm is not None:
            swap(norm[1], FINAL_NORM, None)
            seen.add(id(norm[1]))
        for i, layer in enumerate(layers):
            for rel, child in module_children(layer):
                if subop_depth >= 2:
                    for rel2, grand in module_children(child):
                        if id(grand) not in seen:
                            seen.add(id(grand))
                            swap(grand, f"{rel}.{rel2}", None)
                if id(child) not in seen:
                    seen.add(id(child))
                    swap(child, rel, None)
            swap(layer, "", i)
        swap(model, "", None, top=True)
        cmap = CaptureMap(emb[0] if emb else None, norm[0] if norm else None, len(layers),
                          len(swap.swapped))
        log.info("capture: wrapped %d modules over %d layers", len(swap.swapped), len(layers))
        yield recorder, cmap
    finally:
        for module, cls in reversed(swap.swapped):
            module.__class__ = cls
