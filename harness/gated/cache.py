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

And what it reuses follows the checkpoint's prompt-cache policy (the gate's
prefill-parity decision, ``specparity.probes.gate.prompt_cache_policy``). A
warm request prefills only its uncached suffix: a chunked prefill. Where
one-shot and chunked prefill agree (``reuse``) any exact entry serves; where
they differ (``re-prefill``) a cached prefix is reused only where the calls
that computed it are the calls a fresh classic prefill of the new prompt makes
(:func:`proven_prefix`), and otherwise the prompt is prefilled again. Under
either policy a quantized entry is not cut back below ``quantized_kv_start``
(a fresh request attends there over the unquantized cache), and an exact hit
keeps one token to feed (mlx-lm 0.32 feeds none, and generation fails).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mlx_lm.models.cache import LRUPromptCache, can_trim_prompt_cache, trim_prompt_cache

from specparity.mlx_compat import prompt_cache_trie
from specparity.verdicts import CachePolicy

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


def proven_prefix(held: int | None, prompt_len: int, shared: int, step: int) -> int:
    """How much of a cached entry a fresh classic prefill of the new prompt would compute alike.

    ``held``: the entry's first ``held`` positions were computed exactly as a fresh
    classic prefill of a ``held + 1``-token prompt computes them (chunks of ``step``
    from position 0, the last one ending at ``held``); None when nothing is known.
    Classic prefill of a ``prompt_len``-token prompt computes positions
    ``[0, prompt_len - 1)`` in chunks of ``step`` from 0. The two make the same calls
    up to every full chunk they share, and up to ``held`` itself when both end there
    (the same prompt again, or one that differs only in its last token).
    """
    if held is None or step <= 0:
        return 0
    usable = min(shared, prompt_len - 1)
    if held == prompt_len - 1 and usable >= held:
        return held
    return (min(usable, held) // step) * step


@dataclass
class CacheLookup:
    """What the prompt cache did for one request (the response's ``prompt_cache`` field).

    policy: the checkpoint's prompt-cache policy (reuse | re-prefill).
    prompt_tokens: the prompt's length. shared: the most prompt tokens a cached entry
    holds (at most prompt_tokens - 1: one is always fed). reused: the tokens served
    from the cache. prefilled: prompt_tokens - reused. reason: why fewer than
    ``shared`` were reused ('' when none were held back).
    """

    policy: str
    prompt_tokens: int
    shared: int = 0
    reused: int = 0
    reason: str = ""

    @property
    def prefilled(self) -> int:
        return self.prompt_tokens - self.reused

    @property
    def outcome(self) -> str:
        """miss (nothing shared) | hit (all shared reused) | partial | re-prefilled (none reused)."""
        if self.shared == 0:
            return "miss"
        if self.reused == self.shared:
            return "hit"
        return "partial" if self.reused else "re-prefilled"

    def to_dict(self) -> dict[str, Any]:
        # by hand: dataclasses.asdict copies every field recursively, on every request
        return {"policy": self.policy, "prompt_tokens": self.prompt_tokens, "shared": self.shared,
                "reused": self.reused, "reason": self.reason, "prefilled": self.prefilled,
                "outcome": self.outcome}


class ExactPromptCache(LRUPromptCache):
    """mlx-lm's LRU prompt cache whose entries hold exactly the tokens they are filed under,
    and reuse what the checkpoint's prompt-cache policy allows.

    policy_for(model_key): the policy of the model mlx-lm files entries under.
    step: ``--prefill-step-size``. quantized_kv_start: ``--quantized-kv-start`` when
    ``--kv-bits`` is set, else None. on_lookup: told what each fetch did.
    ``held_next``: set by the server before it files an entry: how many leading
    positions were computed as a fresh classic prefill computes them (None: unknown).
    """

    def __init__(self, max_size: int, policy_for: Callable[[Any], CachePolicy] | None = None,
                 step: int = 2048, quantized_kv_start: int | None = None,
                 on_lookup: Callable[[CacheLookup], None] | None = None):
        super().__init__(max_size)
        self.policy_for = policy_for or (lambda _model: CachePolicy.REUSE)
        self.step = step
        self.quantized_kv_start = quantized_kv_start
        self.on_lookup = on_lookup
        self.held_next: int | None = None

    def insert_cache(self, model: Any, tokens: list[int], prompt_cache: list[Any],
                     *, cache_type: str = "assistant") -> None:
        held, self.held_next = self.held_next, None
        key = exact_entry(list(tokens), prompt_cache)
        if key is None:
            log.debug("specparity-serve: cache entry of %d tokens not filed (cannot be made exact)",
                      len(tokens))
            return
        super().insert_cache(model, key, prompt_cache, cache_type=cache_type)
        entry = prompt_cache_trie(self).get(model, key)
        entry.specparity_held = None if held is None else min(held, len(key))

    def fetch_nearest_cache(self, model: Any, tokens: list[int]) -> tuple[list[Any] | None, list[int]]:
        tokens = list(tokens)
        policy = self.policy_for(model)
        lookup = CacheLookup(str(policy), len(tokens))
        options: list[tuple[int, int, str, list[int], Any]] = []  # (reusable, shared, why, key, entry)
        found = prompt_cache_trie(self).search(model, tokens)
        for candidate in (found.exact, found.longer, found.shorter):
            if not candidate:
                continue
            key = list(candidate)
            entry = prompt_cache_trie(self).get(model, key)
            shared = _common(key, tokens, len(tokens) - 1)
            m, why = shared, ""
            if policy == CachePolicy.REPREFILL:
                m = proven_prefix(getattr(entry, "specparity_held", None), len(tokens), shared,
                                  self.step)
                if m < shared:
                    why = (f"re-prefill policy: {m} of the {shared} cached tokens were computed"
                           " as a fresh prefill computes them")
            if m and self._quantized_below_start(entry.prompt_cache, m):
                m, why = 0, (f"the entry is quantized and {m} < --quantized-kv-start"
                             f" {self.quantized_kv_start}, where a fresh request is not")
            if 0 < m < len(key) and not can_trim_prompt_cache(entry.prompt_cache):
                m, why = 0, f"the entry's cache cannot be cut back to {m} tokens"
            options.append((m, shared, why, key, entry))
        if options:
            lookup.shared = max(o[1] for o in options)
            m, _, _, key, entry = max(options, key=lambda o: (o[0], o[1]))
            lookup.reused = m
            if m < lookup.shared:
                lookup.reason = next((o[2] for o in sorted(options, key=lambda o: -o[1]) if o[2]), "")
        if self.on_lookup is not None:
            self.on_lookup(lookup)
        if not lookup.reused:
            return None, tokens
        cache = copy.deepcopy(entry.prompt_cache)
        if len(key) > m:
            trim_prompt_cache(cache, len(key) - m)
        return cache, tokens[m:]

    def _quantized_below_start(self, cache: list[Any], m: int) -> bool:
        from mlx_lm.models.cache import QuantizedKVCache

        start = self.quantized_kv_start
        return start is not None and m < start and any(isinstance(c, QuantizedKVCache) for c in cache)


def _common(a: list[int], b: list[int], limit: int) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y or n >= limit:
            break
        n += 1
    return n


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
