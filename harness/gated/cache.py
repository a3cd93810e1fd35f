"""Serving-loop cache state: an entry holds exactly the tokens it is filed under.

mlx-lm's server keeps one cache list per request, the target's layers then the
drafter's, and files it in an LRU prompt cache under the prompt plus every
emitted token. Three ways upstream (mlx-lm 0.32) breaks that, each fixed here:

1. After speculative decoding the target has not run its last emitted token
   (mlx-lm feeds it next round), so the entry holds one token fewer than its
   key. A later request sharing the prefix trims by the key's length and
   continues from a cache missing a token: its greedy text differs from a
   fresh process. :class:`ExactPromptCache` files every entry under exactly
   the tokens each of its layers holds (trimming a longer part down).
2. ``speculative_generate_step`` slices the cache list and quantizes KV
   (``--kv-bits``) in the slice, so the server's list keeps the stale
   unquantized layers. :class:`SplitCache` writes slice assignments back.
3. A request served by classic decode in a server with a drafter leaves the
   drafter's layers behind. :func:`catch_up` runs the drafter over the tokens
   it missed, so the entry serves the next speculative request whole.
"""

from __future__ import annotations

import logging
from typing import Any

from mlx_lm.models.cache import LRUPromptCache, can_trim_prompt_cache

log = logging.getLogger("specparity.serve")


def offsets(cache: list[Any]) -> list[int] | None:
    """Each layer's token count, or None when a layer does not say (recurrent state)."""
    out = []
    for c in cache:
        off = getattr(c, "offset", None)
        if not isinstance(off, int) or isinstance(off, bool):
            return None
        out.append(off)
    return out


def exact_entry(tokens: list[int], cache: list[Any]) -> list[int] | None:
    """The key under which ``cache`` holds exactly its tokens (trimming longer layers).

    None when it cannot be made exact (a layer too long and untrimmable, or nothing left).
    Caches whose layers do not report a token count are filed as they are.
    """
    offs = offsets(cache)
    if offs is None:
        return tokens
    n = min(min(offs, default=len(tokens)), len(tokens))
    if n == len(tokens) and all(o == n for o in offs):
        return tokens
    if any(o > n for o in offs) and not can_trim_prompt_cache(cache):
        return None
    for c, o in zip(cache, offs):
        if o > n:
            c.trim(o - n)
    if n <= 0:
        return None
    log.debug("specparity-serve: cache entry filed under %d of %d key tokens (layers held %s..%s)",
              n, len(tokens), min(offs), max(offs))
    return list(tokens[:n])


class ExactPromptCache(LRUPromptCache):
    """mlx-lm's LRU prompt cache whose entries hold exactly the tokens they are filed under."""

    def insert_cache(self, model: Any, tokens: list[int], prompt_cache: list[Any],
                     *, cache_type: str = "assistant") -> None:
        key = exact_entry(list(tokens), prompt_cache)
        if key is None:
            log.debug("specparity-serve: cache entry of %d tokens not filed (cannot be made exact)",
                      len(tokens))
            return
        super().insert_cache(model, key, prompt_cache, cache_type=cache_type)


class _Slice(list):
    def __init__(self, parent: SplitCache, index: range):
        super().__init__(list.__getitem__(parent, j) for j in index)
        self._parent = parent
        self._index = index

    def __setitem__(self, i: Any, value: Any) -> None:
        super().__setitem__(i, value)
        if isinstance(i, int):
            list.__setitem__(self._parent, self._index[i], value)


class SplitCache(list):
    """A cache list whose slices write element assignments back into it.

    mlx-lm's speculative loop works on ``cache[:n_target]`` and
    ``cache[n_target:]`` and quantizes KV by assigning into those slices.
    """

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return _Slice(self, range(len(self))[i])
        return super().__getitem__(i)


def catch_up(draft_model: Any, draft_cache: list[Any], tokens: list[int], *, step: int,
             kv_bits: int | None, kv_group_size: int, quantized_kv_start: int) -> int:
    """Run the drafter over ``tokens`` (its missed ones) as a prefill does; returns how many."""
    import mlx.core as mx
    from mlx_lm.generate import maybe_quantize_kv_cache

    done = 0
    while done < len(tokens):
        chunk = tokens[done:done + step]
        draft_model(mx.array(chunk, dtype=mx.uint32)[None], cache=draft_cache)
        maybe_quantize_kv_cache(draft_cache, quantized_kv_start, kv_group_size, kv_bits)
        mx.eval([c.state for c in draft_cache])
        done += len(chunk)
    return done
