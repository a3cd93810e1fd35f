"""The problem a distribution run draws from: a target's and a drafter's laws, p and q, from logits.

The target's p is the float64 softmax at the temperature with its sampler's
filters (top-k, top-p, min-p); the drafter's q is what an engine computes, the
unfiltered float32 softmax (tiny probabilities underflow to exactly 0). Chains
(``num_draft`` > 1) roll the logits by the previous token, so each position's
law depends on the one before (:class:`Problem`). The run over a problem is
:mod:`specparity.probes.sampling.dist`'s; one round of a rule is
:mod:`specparity.probes.sampling.montecarlo`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specparity.errors import InputError, UsageError

# The default single-position problem: 8 tokens, the target keeps its top 6 (so
# p = 0 at tokens 6 and 7), the drafter's logits there are so low that its float32
# q underflows to exactly 0. dof = 5.
DEFAULT_TARGET_LOGITS = (2.0, 1.4, 1.0, 0.6, 0.1, -0.3, -0.6, -1.0)
DEFAULT_DRAFT_LOGITS = (0.8, 2.0, 0.2, 1.2, -0.6, 0.6, -1.0e4, -1.0e4)
DEFAULT_TOP_K = 6
DEFAULT_TEMPERATURE = 0.7


# ---------------------------------------------------------------- distributions


def softmax64(logits: np.ndarray, temperature: float) -> np.ndarray:
    """Exact-ish reference softmax in float64; temperature 0 = one-hot argmax."""
    x = np.asarray(logits, dtype=np.float64)
    if temperature == 0:
        out = np.zeros_like(x)
        out[..., :] = 0.0
        idx = np.argmax(x, axis=-1)
        np.put_along_axis(out, np.expand_dims(idx, -1), 1.0, axis=-1)
        return out
    z = _scaled(x, temperature, np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def _scaled(x: np.ndarray, temperature: float, dtype: Any) -> np.ndarray:
    """``x / temperature`` in ``dtype``; a temperature so small that a finite logit overflows is an
    input error (the law would be NaN, and a NaN law must never read as a pass)."""
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        z = (np.asarray(x, dtype=dtype) / dtype(temperature)).astype(dtype)
    if not np.isfinite(z[np.isfinite(x)]).all():
        big = float(np.max(np.abs(x[np.isfinite(x)])))
        raise InputError("temperature", f"{temperature:g}: too small for these logits: a logit of"
                         f" magnitude {big:g} / {temperature:g} overflows {np.dtype(dtype).name}"
                         " (0 means greedy)")
    return z


def softmax32(logits: np.ndarray, temperature: float) -> np.ndarray:
    """What an engine computes: float32 softmax (tiny probabilities underflow to 0)."""
    if temperature == 0:
        return softmax64(logits, 0)
    z = _scaled(np.asarray(logits, dtype=np.float32), temperature, np.float32)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z, dtype=np.float32)
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float64)


def apply_filters(p: np.ndarray, top_k: int = 0, top_p: float = 0.0,
                  min_p: float = 0.0) -> np.ndarray:
    """top-k, top-p (nucleus) and min-p on (..., V) probabilities, renormalised."""
    p = np.array(p, dtype=np.float64, copy=True)
    flat = p.reshape(-1, p.shape[-1])
    for row in flat:
        keep = row > 0
        if top_k and top_k < row.size:
            order = np.argsort(-row, kind="stable")
            mask = np.zeros(row.size, dtype=bool)
            mask[order[:top_k]] = True
            keep &= mask
        if 0 < top_p < 1:
            order = np.argsort(-row, kind="stable")
            csum = np.cumsum(row[order])
            n_keep = int(np.searchsorted(csum, top_p, side="left")) + 1
            mask = np.zeros(row.size, dtype=bool)
            mask[order[:n_keep]] = True
            keep &= mask
        if min_p > 0:
            keep &= row >= min_p * row.max()
        row[~keep] = 0.0
        row /= row.sum()
    return p


@dataclass
class Problem:
    """The target and drafter a dist run draws from.

    target_logits / draft_logits: (V,) as given.
    temperature, top_k, top_p, min_p: the target's sampler (filters apply to p only;
      the drafter samples its unfiltered float32 softmax q).
    num_draft: k drafted tokens per round (1 = single position).
    p_table / q_table: (V, V) row c = the conditional after previous token c (the
      logits rolled by c); the single-position problem is row 0 (context token 0).
    """

    target_logits: np.ndarray
    draft_logits: np.ndarray
    temperature: float
    top_k: int = 0
    top_p: float = 0.0
    min_p: float = 0.0
    num_draft: int = 1
    p_table: np.ndarray = field(init=False, repr=False)
    q_table: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        v = self.vocab
        tl = np.stack([np.roll(self.target_logits, c) for c in range(v)])
        dl = np.stack([np.roll(self.draft_logits, c) for c in range(v)])
        self.p_table = apply_filters(softmax64(tl, self.temperature), self.top_k, self.top_p,
                                     self.min_p)
        self.q_table = softmax32(dl, self.temperature)

    @property
    def vocab(self) -> int:
        return len(self.target_logits)

    @property
    def p(self) -> np.ndarray:
        return self.p_table[0]

    @property
    def q(self) -> np.ndarray:
        return self.q_table[0]

    def joint(self) -> np.ndarray:
        """The exact law of the first ``num_draft`` emitted tokens, flattened (V**k,)."""
        v = self.vocab
        j = self.p_table[0].copy()
        for _ in range(1, self.num_draft):
            j = (j[:, None] * self.p_table[np.arange(j.size) % v]).reshape(-1)
        return j

    def describe(self) -> dict[str, Any]:
        return {
            "vocab": self.vocab,
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "min_p": self.min_p,
            "num_draft": self.num_draft,
            "target_logits": [float(x) for x in self.target_logits],
            "draft_logits": [float(x) for x in self.draft_logits],
            "p": [float(x) for x in self.p],
            "q": [float(x) for x in self.q],
        }


def parse_logits(value: str | None, flag: str) -> np.ndarray | None:
    """``"2,1.5,-inf"`` -> float64 array; a bad item names the flag and item."""
    if value is None:
        return None
    items = [s.strip() for s in str(value).split(",") if s.strip()]
    try:
        arr = np.array([float(s) for s in items], dtype=np.float64)
    except ValueError:
        bad = next(s for s in items if not _is_float(s))
        raise UsageError(f"{flag} {value!r}: {bad!r} is not a number") from None
    if arr.size < 2:
        raise UsageError(f"{flag} {value!r}: need at least 2 logits")
    if np.isnan(arr).any() or np.isposinf(arr).any():
        raise UsageError(f"{flag} {value!r}: NaN or +inf logit")
    if np.isneginf(arr).all():
        raise UsageError(f"{flag} {value!r}: every logit is -inf")
    return arr


def _is_float(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def check_temperature(t: float, flag: str = "--temperature") -> float:
    if t is None or not math.isfinite(t) or t < 0:
        raise UsageError(f"{flag} {t}: must be a finite number >= 0")
    return float(t)


def make_problem(target_logits=None, draft_logits=None, temperature: float = DEFAULT_TEMPERATURE,
                 top_k: int | None = None, top_p: float = 0.0, min_p: float = 0.0,
                 num_draft: int = 1) -> Problem:
    """Validated Problem; defaults are the documented 8-token problem."""
    temperature = check_temperature(temperature)
    tl = np.asarray(DEFAULT_TARGET_LOGITS if target_logits is None else target_logits,
                    dtype=np.float64)
    dl = np.asarray(DEFAULT_DRAFT_LOGITS if draft_logits is None else draft_logits,
                    dtype=np.float64)
    if tl.shape != dl.shape:
        raise UsageError(
            f"--target-logits has {tl.size} entries but --draft-logits has {dl.size}")
    if top_k is None:
        top_k = DEFAULT_TOP_K if target_logits is None else 0
    if top_k < 0:
        raise InputError("top-k", f"{top_k}: must be >= 0")
    if not 0 <= top_p <= 1:
        raise InputError("top-p", f"{top_p}: must be in [0, 1]")
    if not 0 <= min_p <= 1:
        raise InputError("min-p", f"{min_p}: must be in [0, 1]")
    if num_draft < 1:
        raise InputError("num-draft", f"{num_draft}: must be >= 1")
    if num_draft * math.log(max(tl.size, 2)) > math.log(200_000):
        raise InputError("num-draft", f"{num_draft}: {tl.size}**{num_draft} joint cells is too"
                         " many for a chi-square; use fewer tokens or a shorter chain")
    return Problem(tl, dl, temperature, top_k, top_p, min_p, num_draft)
