"""Classic decode's building blocks: one evaluation per chain step, and the cache reader it uses."""

from __future__ import annotations

from typing import Any

import pytest

from conftest import build
from specparity.checkpoint import load_checkpoint
from specparity.compare import compare_arrays
from specparity.decode import CacheOptions, Decoder, cache_arrays, greedy_token, tree_items

PROMPT = list(range(20, 44))


@pytest.mark.model
@pytest.mark.parametrize("arch,opts", [
    ("llama", CacheOptions()),
    ("llama", CacheOptions(kv_bits=4, kv_group_size=32, quantized_kv_start=28)),  # quantized from 28 on
    ("llama", CacheOptions(max_kv_size=30)),                    # rotating past 30 positions
    ("qwen3_5", CacheOptions()),                                # gated-delta state (ArraysCache)
    ("gemma3_text", CacheOptions()),                            # sliding-window layers
])
def test_step_is_forward_then_classic_greedy_pick(fixture_root, arch, opts):
    """``Decoder.step`` emits the tokens and rows of ``forward`` + ``greedy_token``, byte for byte."""
    model = load_checkpoint(build(fixture_root, f"dec-{arch}", arch=arch, with_draft=False).target).model
    a, b = Decoder(model, opts), Decoder(model, opts)
    ya, yb = a.prefill(PROMPT), b.prefill(PROMPT)
    for i in range(24):
        row_a, ya = a.step(ya)
        row_b = b.forward([yb])[-1]
        yb = greedy_token(row_b)
        assert ya == yb, f"step {i}"
        assert compare_arrays(row_a, row_b, logits=True).equal, f"step {i}"
    assert [type(c).__name__ for c in a.cache] == [type(c).__name__ for c in b.cache]
    for ca, cb in zip(a.cache, b.cache, strict=True):
        for (name, x), (_, y) in zip(tree_items(ca.state), tree_items(cb.state), strict=True):
            assert compare_arrays(x, y).equal if hasattr(x, "shape") else x == y, name


@pytest.mark.model
def test_cache_arrays_reads_known_caches_from_their_buffers_and_others_from_state(fixture_root):
    """mlx-lm's own cache classes are read from their attributes (no new slices per step); any
    other class, a subclass defined elsewhere included, from its ``state``."""
    from mlx_lm.models.cache import KVCache

    model = load_checkpoint(build(fixture_root, "dec-llama", arch="llama", with_draft=False).target).model
    dec = Decoder(model)
    dec.prefill(PROMPT)
    kv = dec.cache[0]
    assert type(kv) is KVCache
    got = cache_arrays([kv])
    assert len(got) == 2 and got[0] is kv.keys and got[1] is kv.values

    foreign = _Foreign(kv.keys, kv.values * 2)
    got = cache_arrays([foreign])
    assert len(got) == 2 and got[1] is foreign.extra
    assert tuple(got[0].shape) == (*kv.keys.shape[:2], 4, kv.keys.shape[3])


class _Foreign:
    """A cache class named like mlx-lm's but from another module (an engine's own): only its
    ``state`` is trusted."""

    def __init__(self, keys: Any, extra: Any):
        self.keys, self.values, self.extra = keys, keys, extra

    @property
    def state(self) -> tuple[Any, Any]:
        return self.keys[..., :4, :], self.extra


_Foreign.__name__ = "KVCache"
