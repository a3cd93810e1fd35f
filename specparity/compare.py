"""The one comparison of the project: raw bytes in the computed dtype, no tolerance.

Everything that decides a verdict goes through :func:`compare_arrays`; the
float statistics it adds (max abs diff, ulp distance, argmax, margins) only
describe a difference, never decide one.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

_UINT_FOR_ITEMSIZE = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_INT_FOR_ITEMSIZE = {2: np.int16, 4: np.int32, 8: np.int64}


@dataclass
class Diff:
    """How two arrays of one shape and dtype differ.

    equal: every byte identical.
    dtype: the dtype both arms computed in (e.g. ``bfloat16``).
    shape: the compared shape.
    differing_bytes / total_bytes: bytes that differ, out of all bytes.
    differing_elements / total_elements: same, counted in elements.
    first_row: index along ``row_axis`` of the first differing element (None if equal).
    max_abs_diff: largest |a - b| in float64 over all elements (0.0 if equal).
    max_ulp: largest distance in units in the last place, in the array's own dtype.
    argmax_agree: for logits, whether both arms' argmax agree at ``first_row``.
    argmax_a / argmax_b: those argmaxes.
    margin_a / margin_b: top-1 minus top-2 logit at ``first_row`` in each arm.
    """

    equal: bool
    dtype: str
    shape: tuple[int, ...]
    differing_bytes: int
    total_bytes: int
    differing_elements: int
    total_elements: int
    first_row: int | None = None
    max_abs_diff: float = 0.0
    max_ulp: int = 0
    argmax_agree: bool | None = None
    argmax_a: int | None = None
    argmax_b: int | None = None
    margin_a: float | None = None
    margin_b: float | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["shape"] = list(self.shape)
        return d

    def summary(self, what: str = "bytes") -> str:
        if self.equal:
            return f"all {self.total_bytes} {what} equal"
        s = (
            f"{self.differing_bytes} of {self.total_bytes} {what} differ"
            f" (first at row {self.first_row}, max abs diff {self.max_abs_diff:.3g},"
            f" max {self.max_ulp} ulp"
        )
        if self.argmax_agree is not None:
            s += f", argmax {'agrees' if self.argmax_agree else 'flips'}"
            if self.margin_a is not None:
                s += f", top-2 margins {self.margin_a:.3g} vs {self.margin_b:.3g}"
        return s + ")"


def index_ranges(idx: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2, 5" (layers, rows, positions in a report line)."""
    parts: list[tuple[int, int]] = []
    for i in sorted(idx):
        if parts and parts[-1][1] == i - 1:
            parts[-1] = (parts[-1][0], i)
        else:
            parts.append((i, i))
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in parts)


_BITS = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}


def to_numpy(x: Any) -> np.ndarray:
    """An mx.array or numpy array as numpy, keeping the exact bits.

    bfloat16 has no numpy dtype: it comes back as a ``uint16`` view carrying the
    bits, with the original dtype name available from :func:`dtype_name`.
    """
    if isinstance(x, np.ndarray):
        return x
    import mlx.core as mx

    if x.dtype == mx.bfloat16:
        return np.array(x.view(mx.uint16))
    return np.array(x)


def dtype_name(x: Any) -> str:
    if isinstance(x, np.ndarray):
        return str(x.dtype)
    return str(x.dtype).replace("mlx.core.", "")


def _as_float64(bits: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":  # the uint16 view holds the top half of a float32
        return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return bits.astype(np.float64)


def _ordered_ints(bits: np.ndarray, itemsize: int) -> np.ndarray:
    """Map float bit patterns to integers whose difference counts ulps."""
    signed = bits.view(_INT_FOR_ITEMSIZE[itemsize]).astype(np.int64)
    sign_mask = np.int64(1) << (8 * itemsize - 1)
    magnitude = signed & (sign_mask - 1)
    return np.where(signed < 0, -magnitude, magnitude)


# from this many elements up, two mx.arrays' bits are compared in mlx first (a copy of each out to numpy costs
# 2-5 ms at a 150k vocabulary, the comparison in place 0.2-0.6 ms; below it the copy is the cheaper)
IN_PLACE_ELEMENTS = 65536


def _same_bits(a: Any, b: Any) -> Any:
    """Whether two mx.arrays of one shape and dtype (:func:`_bits_equal` checked both) hold the same bits,
    as an unevaluated mx scalar (the bits, not the values: -0.0 and 0.0 differ, a NaN equals only its own
    payload); None for an item size without an unsigned view."""
    import mlx.core as mx

    bits = getattr(mx, _BITS.get(a.dtype.size, ""), None)
    return None if bits is None else mx.all(a.view(bits) == b.view(bits))


def _raw_bytes(x: Any) -> bytes:
    """An evaluated array's bytes in logical order (a strided slice's too): its bits, whatever its dtype
    (bfloat16 included, which numpy has no type for)."""
    return memoryview(x).tobytes()


def _bits_equal(pairs: list[tuple[Any, Any]]) -> bool | None:
    """Whether every pair of mx.arrays holds the same bits (each pair one shape and dtype), settled with
    one evaluation: a small array by its bytes (a copy out costs about 1 us where an mx comparison is an
    op and a synchronisation), a large one in mlx without a copy. None where this cannot say (not
    mx.arrays, another shape or dtype)."""
    import mlx.core as mx

    for a, b in pairs:
        if not (isinstance(a, mx.array) and isinstance(b, mx.array)) or a.shape != b.shape or a.dtype != b.dtype:
            return None
    mx.eval([x for pair in pairs for x in pair])  # every pending slice of both sides, in one go
    flags = []
    for a, b in pairs:
        if a.size < IN_PLACE_ELEMENTS:
            if _raw_bytes(a) != _raw_bytes(b):
                return False
            continue
        same = _same_bits(a, b)
        if same is None:
            return None
        flags.append(same)
    return bool(mx.all(mx.stack(flags)).item()) if flags else True


def _evaluate_together(*arrays: Any) -> None:
    """Evaluate the mx.arrays among ``arrays`` in one go: a slice or a stack not yet computed would
    otherwise be computed on its own as it is copied out (one synchronisation each)."""
    import mlx.core as mx

    pending = [x for x in arrays if isinstance(x, mx.array)]
    if pending:
        mx.eval(*pending)


def compare_arrays(a: Any, b: Any, row_axis: int = 0, logits: bool = False) -> Diff:
    """Compare two arrays byte for byte.

    ``row_axis`` names the axis whose index is reported as ``first_row`` (for
    logits of shape (rows, vocab) that is 0). With ``logits=True`` the last axis
    is the vocabulary: argmax agreement and top-2 margins are reported at the
    first differing row.
    """
    dtype_a, dtype_b = dtype_name(a), dtype_name(b)
    if _bits_equal([(a, b)]):  # identical: settled without copying either out to numpy
        size = int(a.size)
        return Diff(True, dtype_a, tuple(a.shape), 0, size * a.dtype.size, 0, size)
    _evaluate_together(a, b)
    na, nb = to_numpy(a), to_numpy(b)
    if na.shape != nb.shape or dtype_a != dtype_b:
        raise ValueError(
            f"cannot compare {dtype_a}{list(na.shape)} with {dtype_b}{list(nb.shape)}"
        )
    na = np.ascontiguousarray(na)
    nb = np.ascontiguousarray(nb)
    itemsize = na.dtype.itemsize
    ba = na.reshape(-1).view(np.uint8)
    bb = nb.reshape(-1).view(np.uint8)
    differing_bytes = int(np.count_nonzero(ba != bb))
    total_bytes = int(ba.size)
    if differing_bytes == 0:
        return Diff(True, dtype_a, tuple(na.shape), 0, total_bytes, 0, int(na.size))

    ua = na.view(_UINT_FOR_ITEMSIZE[itemsize])
    ub = nb.view(_UINT_FOR_ITEMSIZE[itemsize])
    elem_diff = ua != ub
    idx = np.argwhere(elem_diff)
    first_row = int(idx[0][row_axis]) if na.ndim else 0
    fa = _as_float64(na, dtype_a)
    fb = _as_float64(nb, dtype_b)
    with np.errstate(invalid="ignore"):
        abs_diff = np.abs(fa - fb)
    finite = abs_diff[~np.isnan(abs_diff)]  # differing NaN payloads leave no number to compare
    max_abs = float(finite.max()) if finite.size else (float("nan") if abs_diff.size else 0.0)
    is_float = dtype_a in ("bfloat16", "float16", "float32", "float64")
    max_ulp = 0
    if is_float and itemsize in _INT_FOR_ITEMSIZE:
        oa, ob = _ordered_ints(ua, itemsize), _ordered_ints(ub, itemsize)
        max_ulp = int(np.max(np.abs(oa - ob)))
    diff = Diff(
        False,
        dtype_a,
        tuple(na.shape),
        differing_bytes,
        total_bytes,
        int(np.count_nonzero(elem_diff)),
        int(na.size),
        first_row=first_row,
        max_abs_diff=max_abs,
        max_ulp=max_ulp,
    )
    if logits and na.ndim >= 1:
        ra = np.take(fa, first_row, axis=row_axis).reshape(-1, fa.shape[-1])[0]
        rb = np.take(fb, first_row, axis=row_axis).reshape(-1, fb.shape[-1])[0]
        diff.argmax_a, diff.argmax_b = int(np.argmax(ra)), int(np.argmax(rb))
        diff.argmax_agree = diff.argmax_a == diff.argmax_b
        diff.margin_a, diff.margin_b = top2_margin(ra), top2_margin(rb)
    return diff


def top2_margin(row: np.ndarray) -> float:
    """Top-1 minus top-2 value of a 1-D row (0.0 for a row of fewer than 2)."""
    if row.size < 2:
        return 0.0
    top = np.partition(row, -2)[-2:]
    return float(top[1] - top[0])


def sha256_of(x: Any) -> str:
    """sha256 of an array's raw bytes (shape and dtype included)."""
    n = np.ascontiguousarray(to_numpy(x))
    h = hashlib.sha256(f"{dtype_name(x)}{list(n.shape)}".encode())
    h.update(n.reshape(-1).view(np.uint8).tobytes())
    return h.hexdigest()


# Cache arrays whose second-to-last axis is the sequence (one entry per position):
# KVCache / RotatingKVCache keys and values (B, heads, positions, dim), and each
# part of a QuantizedKVCache's (packed, scales, biases) tuple, named ``keys.0``...
_SEQUENCE_ARRAYS = ("keys", "values")


@dataclass
class Compared:
    """One named comparison of two arms' arrays.

    name: what was compared (``layers.3.mlp``, ``keys``, ``state.0``...).
    diff: the byte comparison (None: not comparable, or absent on one side; ``note`` says why).
    row_axis: the axis reported as ``diff.first_row`` (None: the array does not grow with
      rows or positions, and was compared whole).
    note: how it was compared, or why it was not.
    """

    name: str
    diff: Diff | None
    row_axis: int | None = None
    note: str = ""

    @property
    def differs(self) -> bool:
        return self.diff is None or not self.diff.equal

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "diff": self.diff.to_dict() if self.diff else None,
                "row_axis": self.row_axis, "note": self.note, "differs": self.differs}


@dataclass(kw_only=True)
class StateDiff(Compared):
    """One compared cache array (or a differing offset) of one layer.

    layer: layer index. kind: the cache class (``KVCache``, ``RotatingKVCache``,
      ``QuantizedKVCache``, ``ArraysCache``...). name: ``keys``, ``values``,
      ``keys.0`` (a quantized part), ``state.0`` (an ArraysCache entry) or ``offset``
      (then ``diff`` is None and ``note`` gives both offsets).
    """

    layer: int
    kind: str

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.layer, "kind": self.kind, **super().to_dict()}


def compare_named(name: str, a: Any, b: Any, row_axis: int | None, logits: bool = False) -> Compared:
    """:func:`compare_arrays` for two arms' arrays that may not be comparable.

    Different shapes or dtypes are reported, not raised; ``row_axis`` None
    compares the whole array (its rows are not the arms' rows).
    """
    sa, sb = tuple(a.shape), tuple(b.shape)
    if sa != sb or dtype_name(a) != dtype_name(b):
        return Compared(name, None, row_axis,
                        f"not comparable: {dtype_name(a)}{list(sa)} vs {dtype_name(b)}{list(sb)}")
    if row_axis is None:
        return Compared(name, compare_arrays(a, b, row_axis=0), None, "does not grow with rows: compared whole")
    return Compared(name, compare_arrays(a, b, row_axis=row_axis, logits=logits), row_axis)


def cache_row_axis(name: str, ndim: int) -> int | None:
    """The sequence axis of a snapshot array named ``name``; None when it has none.

    KV arrays (and quantized KV parts) hold one entry per position on axis
    ``ndim - 2``. Every other state (ArraysCache conv and recurrent state) is a
    summary of all positions: no axis of it is a position.
    """
    if name.split(".")[0] in _SEQUENCE_ARRAYS and ndim >= 3:
        return ndim - 2
    return None


def compare_cache_array(layer: int, kind: str, name: str, a: Any, b: Any) -> StateDiff:
    """Compare one cache array of two snapshots (:func:`specparity.decode.snapshot`).

    A RotatingKVCache after a multi-row update holds ``window + rows - 1``
    positions, so two arms fed the same tokens in different row counts hold
    different lengths: their common most recent positions are compared.
    """
    axis = cache_row_axis(name, len(a.shape))
    sa, sb = tuple(a.shape), tuple(b.shape)
    if (axis is not None and kind == "RotatingKVCache" and sa != sb and len(sa) == len(sb)
            and sa[:axis] == sb[:axis] and sa[axis + 1:] == sb[axis + 1:]):
        n = min(sa[axis], sb[axis])
        c = compare_named(name, a[..., -n:, :], b[..., -n:, :], axis)
        if c.diff is not None:
            c.note = f"last {n} positions compared ({sa[axis]} vs {sb[axis]} held)"
    else:
        c = compare_named(name, a, b, axis)
    return StateDiff(c.name, c.diff, c.row_axis, c.note, layer=layer, kind=kind)


def compare_states(a: list[Any], b: list[Any], labels: tuple[str, str] = ("a", "b")) -> list[StateDiff]:
    """Two cache snapshots (lists of ``LayerState``), layer by layer: every array compared.

    Equal arrays are included (``differs`` False); an offset appears only when
    the two differ; an array held by one side only is reported with ``labels``.
    """
    out: list[StateDiff] = []
    for i, (la, lb) in enumerate(zip(a, b)):
        if la.offset != lb.offset:
            out.append(StateDiff("offset", None, None, f"offset {la.offset} vs {lb.offset}", layer=i, kind=la.kind))
        for name in list(la.arrays) + [n for n in lb.arrays if n not in la.arrays]:
            xa, xb = la.arrays.get(name), lb.arrays.get(name)
            if xa is None or xb is None:
                out.append(StateDiff(name, None, None, f"only in {labels[0] if xb is None else labels[1]}",
                                     layer=i, kind=la.kind))
                continue
            out.append(compare_cache_array(i, la.kind, name, xa, xb))
    return out


def states_identical(a: list[Any], b: list[Any]) -> bool:
    """True when two cache snapshots hold the same layers, offsets, array names, shapes, dtypes and bits,
    settled with one mlx evaluation (:func:`_bits_equal`); False when they do not, or when this cannot say
    (arrays that are not mlx's, shapes that differ): :func:`compare_states` then says how."""
    if len(a) != len(b):
        return False
    pairs: list[tuple[Any, Any]] = []
    for la, lb in zip(a, b):
        if la.offset != lb.offset or la.kind != lb.kind or list(la.arrays) != list(lb.arrays):
            return False
        pairs.extend((xa, lb.arrays[name]) for name, xa in la.arrays.items())
    return bool(_bits_equal(pairs))


def first_state_difference(a: list[Any], b: list[Any], labels: tuple[str, str] = ("a", "b")
                           ) -> tuple[StateDiff | None, list[int]]:
    """Where two cache snapshots first differ (:func:`compare_states`' first differing array, in layer
    order; None: equal), and every layer that differs. Identical snapshots are settled at once
    (:func:`states_identical`)."""
    if states_identical(a, b):
        return None, []
    diffs = [d for d in compare_states(a, b, labels) if d.differs]
    return (diffs[0] if diffs else None), sorted({d.layer for d in diffs})
