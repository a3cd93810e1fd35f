"""Cache boundaries: the positions where the configuration changes how a position is computed.

A verify block that starts before such a position and ends after it is the
case a probe with ordinary prompts misses: with ``--kv-bits 4
--quantized-kv-start 25`` classic decode quantizes the cache once it holds 25
positions, while a block that starts at 24 computes its later rows on the
unquantized cache; a prompt longer than 25 crosses the switch during prefill
and never sees it. So every boundary the cache options and the architecture
define gets its own cells and walk blocks, placed to straddle it whatever the
prompts' lengths (the aimed prompt is the first prompt, cut or repeated):

- ``quantized_kv_start`` (with ``--kv-bits``): the offset where the KV cache turns quantized;
- ``max_kv_size``: the rotating cache's size, where it starts to evict (only
  for architectures without their own ``make_cache``: mlx-lm ignores the
  option for the others, and the report says so);
- each sliding window / attention chunk the architecture's own cache uses
  (``RotatingKVCache.max_size``, ``ChunkedKVCache.chunk_size``), and the
  config's ``sliding_window`` / ``attention_chunk_size`` fields;
- ``prefill_step_size``: a prompt of ``prefill_step_size + 2`` tokens, so
  classic prefill runs two chunks (prefill parity, one-shot vs chunked, and a
  block right after it).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from specparity.compare import index_ranges
from specparity.decode import CacheOptions, make_cache

QUANTIZED_KV_START = "quantized_kv_start"
MAX_KV_SIZE = "max_kv_size"
SLIDING_WINDOW = "sliding_window"
ATTENTION_CHUNK = "attention_chunk"
PREFILL_STEP = "prefill_step_size"
_CONFIG_WINDOWS = (("sliding_window", SLIDING_WINDOW), ("sliding_window_size", SLIDING_WINDOW),
                   ("attention_window", SLIDING_WINDOW), ("attention_chunk_size", ATTENTION_CHUNK))


@dataclass
class Boundary:
    """One configuration boundary.

    kind: quantized_kv_start | max_kv_size | sliding_window | attention_chunk | prefill_step_size.
    position: the cache offset where it takes effect (for prefill_step_size: the chunk size).
    source: where it comes from, in the user's words (a flag, a config field, a cache class).
    """

    kind: str
    position: int
    source: str

    @property
    def label(self) -> str:
        return f"{self.kind} {self.position}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _config_fields(model: Any) -> dict[str, Any]:
    """The model's config as a flat dict (mlx-lm models keep their ModelArgs as ``args``)."""
    out: dict[str, Any] = {}
    for obj in (model, getattr(model, "inner", None)):
        args = getattr(obj, "args", None)
        if args is None:
            continue
        if isinstance(getattr(args, "config", None), dict):
            out.update(args.config)
        if hasattr(args, "__dict__"):
            out.update({k: v for k, v in vars(args).items() if not k.startswith("_")})
        text = getattr(args, "text_config", None)
        if isinstance(text, dict):
            out.update({k: v for k, v in text.items() if k not in out})
    return out


def find_boundaries(model: Any, opts: CacheOptions) -> tuple[list[Boundary], list[str]]:
    """Every boundary ``opts`` and the architecture define, and notes on options that do nothing.

    The notes say, for example, that ``--max-kv-size`` is ignored by an
    architecture that builds its own cache (mlx-lm's ``make_prompt_cache``
    never passes it on), instead of printing it as applied.
    """
    found: list[Boundary] = []
    notes: list[str] = []
    own_cache = hasattr(model, "make_cache")
    cache = make_cache(model, opts)
    if opts.kv_bits is not None:
        if any(hasattr(c, "to_quantized") for c in cache):
            found.append(Boundary(QUANTIZED_KV_START, int(opts.quantized_kv_start),
                                  f"--kv-bits {opts.kv_bits} --quantized-kv-start {opts.quantized_kv_start}"))
        else:
            notes.append(f"--kv-bits {opts.kv_bits}: ignored by this architecture"
                         " (none of its caches can be quantized)")
    if opts.max_kv_size is not None:
        if own_cache:
            notes.append(f"--max-kv-size {opts.max_kv_size}: ignored by this architecture"
                         " (it builds its own cache; mlx-lm does not pass the option on)")
        else:
            found.append(Boundary(MAX_KV_SIZE, int(opts.max_kv_size),
                                  f"--max-kv-size {opts.max_kv_size} (RotatingKVCache)"))
    if own_cache:
        by_size: dict[tuple[str, int], list[int]] = {}
        for i, c in enumerate(cache):
            name = type(c).__name__
            if name == "RotatingKVCache" and getattr(c, "max_size", None):
                by_size.setdefault((SLIDING_WINDOW, int(c.max_size)), []).append(i)
            elif name == "ChunkedKVCache" and getattr(c, "chunk_size", None):
                by_size.setdefault((ATTENTION_CHUNK, int(c.chunk_size)), []).append(i)
        for (kind, size), layers in sorted(by_size.items()):
            cls = "RotatingKVCache(max_size" if kind == SLIDING_WINDOW else "ChunkedKVCache(chunk_size"
            found.append(Boundary(kind, size, f"{cls}={size}) in cache layers {index_ranges(layers)}"))
    config = _config_fields(model)
    for key, kind in _CONFIG_WINDOWS:
        v = config.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0 \
                and not any(b.kind == kind and b.position == v for b in found):
            found.append(Boundary(kind, v, f"config {key}={v}"))
    found.append(Boundary(PREFILL_STEP, int(opts.prefill_step_size),
                          f"--prefill-step-size {opts.prefill_step_size}"))
    return found, notes


@dataclass
class Aim:
    """Where to put a block of ``width`` rows so that it straddles ``boundary``.

    prompt_len: tokens of the aimed prompt. depth: tokens decoded before the straddling block.
    start: cache position of the straddling block's first row (start < position <= start + width - 1).
    walk_depth: depth the aimed walk starts from (it runs blocks before, across and after).
    walk_blocks: consecutive full-accept blocks of the aimed walk.
    """

    boundary: Boundary
    width: int
    prompt_len: int
    depth: int
    start: int
    walk_depth: int
    walk_blocks: int


def aim(boundary: Boundary, width: int) -> Aim:
    """The aimed prompt length and depth for one boundary and width.

    The block starts ``ceil(width / 2)`` rows before the boundary (at 0 when
    the boundary is nearer the start), after one clean block when there is
    room for it, so the aimed walk runs a block before, the straddling block
    and one after. A ``prefill_step_size`` boundary is a prompt of
    ``prefill_step_size + 2`` tokens and a block right after its prefill.
    """
    if boundary.kind == PREFILL_STEP:
        n = boundary.position + 2
        return Aim(boundary, width, n, 0, n - 1, 0, 2)
    start = max(0, boundary.position - (width + 1) // 2)
    before = 1 if start + 1 - width >= 1 else 0
    prompt_len = start + 1 - width * before
    depth = width * before
    return Aim(boundary, width, prompt_len, depth, start, 0, before + 2)


def aimed_prompt(prompt: list[int], length: int) -> list[int]:
    """``prompt`` cut or repeated to ``length`` tokens."""
    reps = -(-length // len(prompt))
    return (list(prompt) * reps)[:length]


def describe_cache(model: Any, opts: CacheOptions) -> str:
    """``opts.describe()`` plus what this architecture ignores, never an ignored option as applied."""
    _, notes = find_boundaries(model, opts)
    return opts.describe() + "".join(f"; {n}" for n in notes)
