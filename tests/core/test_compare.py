"""Unit tests of the one comparison function (pure arrays, no model)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from specparity.compare import compare_arrays, sha256_of


def test_equal_arrays_report_all_bytes_equal():
    a = mx.arange(12, dtype=mx.float32).reshape(3, 4)
    d = compare_arrays(a, mx.array(a))
    assert d.equal and d.differing_bytes == 0 and d.total_bytes == 48


def test_one_ulp_in_bfloat16_is_found_with_row_and_ulp():
    a = mx.ones((3, 8), dtype=mx.bfloat16)
    bits = np.array(a.view(mx.uint16))
    bits[2, 5] += 1  # next representable bfloat16 above 1.0
    b = mx.array(bits).view(mx.bfloat16)
    d = compare_arrays(a, b, logits=True)
    assert not d.equal
    assert d.dtype == "bfloat16"
    assert d.first_row == 2
    assert d.max_ulp == 1
    assert d.differing_elements == 1
    assert d.max_abs_diff == 2.0**-7
    assert d.argmax_a == 0 and d.argmax_b == 5  # a tie in a, broken by the 1-ulp bump in b


def test_ulp_distance_across_zero_and_argmax_flip():
    a = mx.array([[0.0, 1.0, 0.5]], dtype=mx.float32)
    b = mx.array([[-0.0, 0.5, 1.0]], dtype=mx.float32)
    d = compare_arrays(a, b, logits=True)
    assert not d.equal
    assert d.argmax_a == 1 and d.argmax_b == 2 and d.argmax_agree is False
    assert d.margin_a == 0.5 and d.margin_b == 0.5


def test_shape_mismatch_is_an_error():
    import pytest

    with pytest.raises(ValueError):
        compare_arrays(mx.zeros((2, 2)), mx.zeros((2, 3)))


def test_sha256_depends_on_bytes_and_dtype():
    a = mx.zeros((4,), dtype=mx.float32)
    assert sha256_of(a) == sha256_of(mx.zeros((4,), dtype=mx.float32))
    assert sha256_of(a) != sha256_of(mx.zeros((4,), dtype=mx.float16))


# ---------------------------------------------------------------- cache states

def _kv(seed: int, positions: int, dim: int = 64) -> mx.array:
    return mx.random.normal((1, 2, positions, dim), key=mx.random.key(seed))


def _caches(bump_position: int | None = None, rotating_rows: int = 1) -> list:
    """Real mlx-lm caches, one of each kind, fed 12 positions (one bumped, optionally)."""
    from mlx_lm.models.cache import ArraysCache, KVCache, QuantizedKVCache, RotatingKVCache

    keys, values = _kv(1, 12), _kv(2, 12)
    if bump_position is not None:
        keys = keys.at[:, :, bump_position, :].add(1.0)
    kv, rot, quant = KVCache(), RotatingKVCache(max_size=8), QuantizedKVCache(group_size=64, bits=4)
    kv.update_and_fetch(keys, values)
    quant.update_and_fetch(keys, values)
    for i in range(0, 12, rotating_rows):
        rot.update_and_fetch(keys[:, :, i : i + rotating_rows], values[:, :, i : i + rotating_rows])
    arrays = ArraysCache(size=2)
    arrays[0] = mx.random.normal((1, 3, 16), key=mx.random.key(3))  # conv state
    recurrent = mx.random.normal((1, 2, 4, 4), key=mx.random.key(4))
    arrays[1] = recurrent if bump_position is None else recurrent + 1.0
    return [kv, rot, quant, arrays]


def test_cache_states_of_every_kind_compare_equal_with_their_sequence_axis():
    from specparity.compare import compare_states
    from specparity.decode import snapshot

    diffs = compare_states(snapshot(_caches()), snapshot(_caches()))
    assert diffs and not any(d.differs for d in diffs)
    axes = {(d.kind, d.name): d.row_axis for d in diffs}
    assert axes[("KVCache", "keys")] == axes[("RotatingKVCache", "values")] == 2
    assert axes[("QuantizedKVCache", "keys.0")] == axes[("QuantizedKVCache", "values.2")] == 2
    # conv and recurrent state summarise every position: no axis of them is a position
    assert axes[("ArraysCache", "state.0")] is None and axes[("ArraysCache", "state.1")] is None


def test_cache_state_difference_is_placed_at_its_position_or_compared_whole():
    from specparity.compare import compare_states
    from specparity.decode import snapshot

    diffs = compare_states(snapshot(_caches()), snapshot(_caches(bump_position=5)))
    bad = {(d.kind, d.name): d for d in diffs if d.differs}
    kv = bad[("KVCache", "keys")].diff
    assert kv is not None and kv.first_row == 5
    quantized = bad[("QuantizedKVCache", "keys.0")].diff
    assert quantized is not None and quantized.first_row == 5
    # the rotating window (8 of 12) holds positions 4..11: position 5 is its row 1
    rotating = bad[("RotatingKVCache", "keys")].diff
    assert rotating is not None and rotating.first_row == 1
    assert ("KVCache", "values") not in bad  # only the keys were bumped
    state = bad[("ArraysCache", "state.1")]
    assert state.row_axis is None and "compared whole" in state.note
    assert ("ArraysCache", "state.0") not in bad


def test_rotating_caches_fed_in_different_row_counts_compare_their_common_window():
    from specparity.compare import compare_states
    from specparity.decode import snapshot

    # one 12-row update keeps all 12 positions; 12 single steps keep the window of 8
    diffs = compare_states(snapshot(_caches(rotating_rows=1)), snapshot(_caches(rotating_rows=12)))
    rot = [d for d in diffs if d.kind == "RotatingKVCache"]
    assert rot and not any(d.differs for d in rot)
    assert rot[0].note == "last 8 positions compared (8 vs 12 held)"


def test_cache_offsets_and_missing_arrays_are_reported():
    from specparity.compare import compare_states
    from specparity.decode import LayerState

    a = [LayerState("KVCache", 4, {"keys": mx.zeros((1, 1, 4, 2))})]
    b = [LayerState("KVCache", 5, {"keys": mx.zeros((1, 1, 4, 2)), "values": mx.zeros((1, 1, 4, 2))})]
    diffs = compare_states(a, b, ("chain", "block"))
    assert [(d.name, d.differs, d.note) for d in diffs] == [
        ("offset", True, "offset 4 vs 5"), ("keys", False, ""), ("values", True, "only in block")]


@pytest.mark.filterwarnings("ignore:All-NaN slice")  # the numpy path describing two NaNs
def test_one_flipped_bit_of_any_dtype_differs_and_mx_and_numpy_inputs_report_alike():
    """A single flipped bit, -0.0 vs 0.0 and a NaN's payload differ; an equal pair reports the same from
    mx.arrays as from numpy arrays; a strided slice compares by its own elements."""
    for dtype, uint in ((mx.float32, mx.uint32), (mx.bfloat16, mx.uint16), (mx.float16, mx.uint16),
                        (mx.int8, mx.uint8)):
        a = mx.arange(24).reshape(4, 6).astype(dtype)
        bits = np.array(a.view(uint))
        bits[3, 1] ^= 1  # the lowest bit of one element
        d = compare_arrays(a, mx.array(bits).view(dtype))
        assert not d.equal and d.first_row == 3 and d.differing_elements == 1, dtype
    assert not compare_arrays(mx.array([0.0]), mx.array([-0.0])).equal
    nan_bits = np.array([0x7FC00000, 0x7FC00001], dtype=np.uint32)
    n = mx.array(nan_bits).view(mx.float32)
    assert not compare_arrays(n[:1], n[1:]).equal and compare_arrays(n[:1], n[:1]).equal
    a = mx.arange(12, dtype=mx.float32).reshape(3, 4)
    assert compare_arrays(a, mx.array(a)) == compare_arrays(np.array(a), np.array(a))
    # a strided slice (a snapshot's valid positions) compares by its own elements
    assert compare_arrays(a[:, :2], mx.array(np.array(a)[:, :2])).equal


def test_a_one_bit_difference_in_a_recurrent_state_is_named_with_its_layer():
    from specparity.compare import first_state_difference
    from specparity.decode import snapshot

    assert first_state_difference(snapshot(_caches()), snapshot(_caches())) == (None, [])
    other = _caches()
    rec = other[3][1]
    bits = np.array(rec.view(mx.uint32))
    bits.reshape(-1)[7] ^= 1
    other[3][1] = mx.array(bits).view(mx.float32)
    first, layers = first_state_difference(snapshot(_caches()), snapshot(other))
    assert first is not None and (first.layer, first.name) == (3, "state.1") and layers == [3]


def test_identical_snapshots_are_settled_at_once_and_agree_with_the_full_comparison():
    """states_identical (first_state_difference's fast path) says True only where compare_states finds no
    difference: a flipped bit of any dtype, -0.0 vs 0.0, a NaN's payload, an offset, a missing array and
    a strided slice's own elements are all seen."""
    from specparity.compare import compare_states, states_identical
    from specparity.decode import LayerState, snapshot

    def agree(a: list, b: list) -> bool:
        same = states_identical(a, b)
        assert same == (not any(d.differs for d in compare_states(a, b))), (a, b)
        return same

    assert agree(snapshot(_caches()), snapshot(_caches()))
    for dtype, uint in ((mx.float32, mx.uint32), (mx.bfloat16, mx.uint16), (mx.float16, mx.uint16),
                        (mx.int8, mx.uint8)):
        a = mx.arange(24).reshape(1, 1, 4, 6).astype(dtype)
        bits = np.array(a.view(uint))
        bits[0, 0, 3, 1] ^= 1
        b = mx.array(bits).view(dtype)
        assert agree([LayerState("KVCache", 4, {"keys": a})], [LayerState("KVCache", 4, {"keys": mx.array(a)})])
        assert not agree([LayerState("KVCache", 4, {"keys": a})], [LayerState("KVCache", 4, {"keys": b})])
        # a strided slice: only its own positions count
        assert agree([LayerState("KVCache", 3, {"keys": a[..., :3, :]})],
                     [LayerState("KVCache", 3, {"keys": b[..., :3, :]})])
    z = mx.zeros((1, 1, 2, 2))
    assert not agree([LayerState("KVCache", 2, {"keys": z})], [LayerState("KVCache", 2, {"keys": -z})])
    n = mx.array(np.array([0x7FC00000, 0x7FC00001], dtype=np.uint32)).view(mx.float32)
    assert not agree([LayerState("ArraysCache", None, {"state.0": n[:1]})],
                     [LayerState("ArraysCache", None, {"state.0": n[1:]})])
    assert agree([LayerState("ArraysCache", None, {"state.0": n})], [LayerState("ArraysCache", None, {"state.0": n})])
    assert not agree([LayerState("KVCache", 2, {"keys": z})], [LayerState("KVCache", 3, {"keys": z})])
    assert not agree([LayerState("KVCache", 2, {"keys": z, "values": z})], [LayerState("KVCache", 2, {"keys": z})])


def test_a_vocabulary_wide_row_compares_in_place_with_the_same_answer():
    """Rows past IN_PLACE_ELEMENTS are settled in mlx when identical, with the Diff numpy inputs give; a
    flipped bit, -0.0 and a NaN payload still differ, at the right row."""
    from specparity.compare import IN_PLACE_ELEMENTS

    rows = 2
    width = IN_PLACE_ELEMENTS // rows + 7
    for dtype, uint in ((mx.float32, mx.uint32), (mx.bfloat16, mx.uint16)):
        a = mx.random.normal((rows, width)).astype(dtype)
        same = compare_arrays(a, mx.array(a), logits=True)
        assert same.equal and (same.dtype, same.shape) == (str(dtype).replace("mlx.core.", ""), (rows, width))
        assert (same.total_elements, same.total_bytes) == (rows * width, rows * width * a.dtype.size)
        if dtype == mx.float32:  # what numpy inputs give (they take the copying path)
            assert same == compare_arrays(np.array(a), np.array(a), logits=True)
        bits = np.array(a.view(uint))
        bits[1, width - 1] ^= 1
        d = compare_arrays(a, mx.array(bits).view(dtype), logits=True)
        assert not d.equal and d.first_row == 1 and d.differing_elements == 1
    z = mx.zeros((rows, width))
    assert not compare_arrays(z, -z).equal
    # a large cache array in a snapshot, settled in mlx beside small ones settled by their bytes
    from specparity.compare import states_identical
    from specparity.decode import LayerState

    big = mx.random.normal((1, 2, width, 2))
    small = mx.arange(8).reshape(1, 1, 4, 2).astype(mx.float32)
    bits = np.array(big.view(mx.uint32))
    bits[0, 1, width - 1, 1] ^= 1
    flipped = mx.array(bits).view(mx.float32)
    state = [LayerState("KVCache", width, {"keys": big, "values": small})]
    assert states_identical(state, [LayerState("KVCache", width, {"keys": mx.array(big), "values": small})])
    assert not states_identical(state, [LayerState("KVCache", width, {"keys": flipped, "values": small})])
    # a small identical pair of mx.arrays: settled by its bytes, the Diff numpy inputs give
    row = mx.random.normal((3, 17))
    assert compare_arrays(row[1:], mx.array(row[1:])) == compare_arrays(np.array(row[1:]), np.array(row[1:]))
