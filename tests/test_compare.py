"""Unit tests of the one comparison function (pure arrays, no model)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

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
