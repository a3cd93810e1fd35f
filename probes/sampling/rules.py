"""Acceptance rules: the lossless references, the known-wrong controls, and user rules.

A rule decides, for one drafted position, which token is emitted there.

Per-sample signature (what a user's ``--rule module:function`` implements)::

    single position (num_draft = 1):
        rule(p, q, draft, rng) -> token, or a sequence whose first item is the token
            p: float64 (V,) the target's distribution (temperature and filters applied)
            q: float64 (V,) the drafter's distribution, as the engine sees it (it may
               have underflowed to 0 at a token the drafter still proposes)
            draft: int, the drafted token
            rng: numpy.random.Generator (the only source of randomness allowed)
    chain (num_draft = k > 1):
        rule(p, q, drafts, rng) -> sequence of 1..k+1 emitted tokens
            p: (k+1, V), row i = the target's conditional after the prefix + drafts[:i]
            q: (k, V),   row i = the drafter's conditional drafts[i] was drawn from
            drafts: int64 (k,)
            returns the accepted drafts, then a resample (on a rejection) or a bonus

A user rule may set attributes on the function:

    vectorized = True   called once per batch instead: single position
                        rule(P (N,V), Q (N,V), drafts (N,), rng) -> (N,) emitted tokens;
                        chain rule(P (N,k+1,V), Q (N,k,V), drafts (N,k), rng) ->
                        (N, k+1) emitted tokens, padded with -1 after the last one.
    residual = True     the rule resamples from a residual on a rejection, so the
                        zero-tolerance check "a resample never has p <= q" applies.

Accepted drafts are counted as the common prefix of the emitted tokens and the
drafts (exact for every built-in: none of them resamples the rejected token).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any

import numpy as np

from specparity.errors import InputError, Name, UsageError
from specparity.inputs import expand_user

log = logging.getLogger(__name__)

SUM_PROD, SUM_MIN = "sum_prod", "sum_min"


# ---------------------------------------------------------------- sampling helpers


def _uniform(rng: np.random.Generator, n: int) -> np.ndarray:
    """Uniforms in (0, 1]: never 0, so a zero-weight token can never be drawn."""
    return 1.0 - rng.random(n)


def sample_rows(weights: np.ndarray, rng: np.random.Generator, n: int | None = None) -> np.ndarray:
    """Inverse-CDF draws from (possibly unnormalised) weights.

    ``weights`` (V,) with ``n`` draws (the fast path: one searchsorted), or
    (N, V) with one draw per row. Tokens of weight 0 are never drawn.
    """
    if weights.ndim == 1:
        cdf = np.cumsum(weights)
        size = int(n) if n is not None else 1
        return np.searchsorted(cdf, _uniform(rng, size) * cdf[-1], side="left").astype(np.int64)
    cdf = np.cumsum(weights, axis=-1)
    t = _uniform(rng, weights.shape[0]) * cdf[:, -1]
    return (cdf < t[:, None]).sum(axis=1).astype(np.int64)


def _at(a: np.ndarray, d: np.ndarray) -> np.ndarray:
    """a[d] for a shared (V,) vector, a[i, d[i]] for per-row (N, V)."""
    if a.ndim == 1:
        return a[d]
    return np.take_along_axis(a, d[:, None], axis=1)[:, 0]


def _argmax(a: np.ndarray, n: int) -> np.ndarray:
    if a.ndim == 1:
        return np.full(n, int(np.argmax(a)), dtype=np.int64)
    return np.argmax(a, axis=1).astype(np.int64)


def _mrs_residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    r = np.maximum(p - q, 0.0)
    # p == q to the last bit leaves no residual mass; a rejection is then impossible
    # in exact arithmetic, so any rounding-born one falls back to p.
    if r.ndim == 1:
        return r if r.sum() > 0 else p
    empty = r.sum(axis=1) <= 0
    if empty.any():
        r[empty] = p[empty]
    return r


# ---------------------------------------------------------------- the rules


@dataclass
class Rule:
    """An acceptance rule with a vectorized fast path.

    name: the name ``--rule`` takes.
    description: one line for reports.
    lossless: True when the rule emits exactly p at temperature > 0.
    residual: the rule resamples from a residual, so "no resample with p <= q" applies.
    closed_form: which acceptance it should sit on: ``sum_prod`` (sum p*q),
      ``sum_min`` (sum min(p, q)), or None (no claim).
    greedy_draft: the drafter proposes argmax q instead of sampling q.
    onehot_q: the rule sees a one-hot q at the draft (greedy-delta).
    step: vectorized single position: step(p, q, drafts, rng) -> (emitted, accepted);
      p, q are (V,) shared by all draws or (N, V) one row per draw.
    per_sample: the documented per-sample signature, or None for the built-ins
      (their per-sample form is ``reference``).
    vectorized: a user rule that takes batches (see the module docstring).
    """

    name: str
    description: str
    lossless: bool
    residual: bool = False
    closed_form: str | None = None
    greedy_draft: bool = False
    onehot_q: bool = False
    step: Callable[..., tuple[np.ndarray, np.ndarray]] | None = None
    per_sample: Callable[..., Any] | None = None
    vectorized: bool = False

    @property
    def builtin(self) -> bool:
        return self.step is not None


def _sampler_match(p, q, d, rng):
    y = sample_rows(p, rng, len(d))
    return y, y == d


def _mrs(guard: bool):
    def step(p, q, d, rng):
        pd, qd = _at(p, d), _at(q, d)
        u = rng.random(len(d))
        acc = u * qd <= pd
        if guard:
            acc &= pd > 0
        out = d.copy()
        rej = ~acc
        if rej.any():
            r = _mrs_residual(p, q)
            out[rej] = sample_rows(r, rng, int(rej.sum())) if r.ndim == 1 else sample_rows(
                r[rej], rng)
        return out, acc

    return step


def _greedy_delta(p, q, d, rng):
    # MRS against a one-hot q at d: accept with p(d), else draw from p without d.
    pd = _at(p, d)
    acc = rng.random(len(d)) < pd
    out = d.copy()
    rej = ~acc
    if rej.any():
        rows = np.broadcast_to(p, (len(d), p.shape[-1]))[rej].copy()
        rows[np.arange(len(rows)), d[rej]] = 0.0
        out[rej] = sample_rows(rows, rng)
    return out, acc


def _argmax_vs_argmax(p, q, d, rng):
    y = _argmax(p, len(d))
    return y, y == d


def _resample_from_p(p, q, d, rng):
    pd, qd = _at(p, d), _at(q, d)
    acc = (rng.random(len(d)) * qd <= pd) & (pd > 0)
    out = d.copy()
    rej = ~acc
    if rej.any():
        out[rej] = sample_rows(p, rng, int(rej.sum())) if p.ndim == 1 else sample_rows(p[rej], rng)
    return out, acc


def _drafted_only_residual(p, q, d, rng):
    # The bug: only the drafted token's mass is removed, p elsewhere is left as is.
    pd, qd = _at(p, d), _at(q, d)
    acc = (rng.random(len(d)) * qd <= pd) & (pd > 0)
    out = d.copy()
    rej = ~acc
    if rej.any():
        rows = np.broadcast_to(p, (len(d), p.shape[-1]))[rej].copy()
        dr = d[rej]
        idx = np.arange(len(rows))
        rows[idx, dr] = np.maximum(rows[idx, dr] - _at(q, d)[rej], 0.0)
        out[rej] = sample_rows(rows, rng)
    return out, acc


BUILTIN: dict[str, Rule] = {
    r.name: r
    for r in (
        Rule("sampler-match", "accept when the draft equals a fresh draw from p (mlx-lm)",
             lossless=True, closed_form=SUM_PROD, step=_sampler_match),
        Rule("mrs", "modified rejection sampling: accept min(1, p/q), residual norm(max(p-q, 0))",
             lossless=True, residual=True, closed_form=SUM_MIN, step=_mrs(guard=True)),
        Rule("greedy-delta", "a greedy drafter (one-hot q at argmax q) under rejection sampling",
             lossless=True, residual=True, closed_form=SUM_MIN, greedy_draft=True, onehot_q=True,
             step=_greedy_delta),
        Rule("greedy", "argmax of p (lossless at temperature 0 only)",
             lossless=False, greedy_draft=True, step=_argmax_vs_argmax),
    )
}

CONTROLS: dict[str, Rule] = {
    r.name: r
    for r in (
        Rule("argmax-vs-argmax", "known wrong: the draft's argmax against the target's argmax",
             lossless=False, greedy_draft=True, step=_argmax_vs_argmax),
        Rule("resample-from-p", "known wrong: on a rejection, resample from p, not the residual",
             lossless=False, residual=True, closed_form=SUM_MIN, step=_resample_from_p),
        Rule("drafted-only-residual",
             "known wrong: the residual removes draft mass only at the drafted token",
             lossless=False, residual=True, closed_form=SUM_MIN, step=_drafted_only_residual),
    )
}

# Known wrong in a way no goodness-of-fit test can see: accepts u*q(d) <= p(d)
# without the p(d) > 0 conjunct, so a draft whose q underflowed to 0 outside the
# target's filtered support is accepted.
NO_SUPPORT_GUARD = Rule(
    "mrs-no-support-guard",
    "known wrong: rejection sampling without the p(d) > 0 conjunct",
    lossless=False, residual=True, closed_form=SUM_MIN, step=_mrs(guard=False),
)

ALL_NAMED: dict[str, Rule] = {**BUILTIN, **CONTROLS, NO_SUPPORT_GUARD.name: NO_SUPPORT_GUARD}


def reference(rule: Rule) -> Callable[..., Any]:
    """The per-sample form of a built-in (the documented signature), for reading and tests."""
    assert rule.step is not None
    step = rule.step

    def one(p, q, draft, rng):
        out, _ = step(np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64),
                      np.array([int(draft)], dtype=np.int64), rng)
        return int(out[0])

    one.__name__ = rule.name
    return one


# ---------------------------------------------------------------- resolving --rule


def resolve_rule(spec: str) -> Rule:
    """A built-in name, ``package.module:function`` or ``path/to/file.py:function``.

    Bad specs raise a one-line UsageError naming the spec.
    """
    spec = (spec or "").strip()
    if spec in ALL_NAMED:
        return ALL_NAMED[spec]
    if ":" not in spec:
        raise UsageError(
            f"--rule {spec!r}: not a built-in rule ({', '.join(ALL_NAMED)}) and not"
            " module:function"
        )
    mod_name, _, func_name = spec.rpartition(":")
    if not mod_name or not func_name or not func_name.isidentifier():
        raise InputError("rule", f"{spec!r}: malformed, expected module:function")
    module = _import_rule_module(spec, mod_name)
    fn = getattr(module, func_name, None)
    if fn is None:
        raise InputError("rule", f"{spec!r}: {mod_name} has no attribute {func_name!r}")
    if not callable(fn):
        raise InputError("rule", f"{spec!r}: {func_name!r} is not callable")
    return Rule(
        name=spec,
        description=(fn.__doc__ or "user rule").strip().splitlines()[0],
        lossless=True,
        residual=bool(getattr(fn, "residual", False)),
        closed_form=getattr(fn, "closed_form", None),
        per_sample=fn,
        vectorized=bool(getattr(fn, "vectorized", False)),
    )


def _import_rule_module(spec: str, mod_name: str):
    if mod_name.endswith(".py") or "/" in mod_name or "\\" in mod_name:
        path = expand_user(mod_name, Name("rule"))
        if not path.is_file():
            raise InputError("rule", f"{spec!r}: no such file {mod_name}")
        name = f"_specparity_rule_{abs(hash(str(path.resolve())))}"
        loader_spec = importlib.util.spec_from_file_location(name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise InputError("rule", f"{spec!r}: cannot import {mod_name}")
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[name] = module
        try:
            loader_spec.loader.exec_module(module)
        except Exception as err:
            sys.modules.pop(name, None)
            raise InputError("rule", f"{spec!r}: importing {mod_name} failed"
                             f" ({type(err).__name__}: {err})") from err
        return module
    if not all(part.isidentifier() for part in mod_name.split(".")):
        raise InputError("rule", f"{spec!r}: malformed module name {mod_name!r}")
    try:
        return importlib.import_module(mod_name)
    except ModuleNotFoundError as err:
        raise InputError("rule", f"{spec!r}: no module named {err.name!r}") from err
    except Exception as err:
        raise InputError("rule", f"{spec!r}: importing {mod_name} failed"
                         f" ({type(err).__name__}: {err})") from err


def closed_forms(p: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The lossless rules' acceptance probabilities, per row: (sum_x min(p, q), sum_x p q).

    ``SUM_MIN`` is modified rejection sampling's (the ceiling, 1 - TV);
    ``SUM_PROD`` is sampler-match's (the draft equals a fresh draw from p).
    """
    return np.minimum(p, q).sum(-1), (p * q).sum(-1)


def onehot_argmax(q: np.ndarray) -> np.ndarray:
    """One-hot at argmax over the last axis (what a greedy drafter's q is)."""
    e = np.zeros_like(q)
    np.put_along_axis(e, np.argmax(q, axis=-1)[..., None], 1.0, axis=-1)
    return e


def rule_q(rule: Rule, q: np.ndarray) -> np.ndarray:
    """The drafter distribution ``rule`` sees: one-hot at argmax q for greedy drafters."""
    return onehot_argmax(q) if (rule.greedy_draft or rule.onehot_q) else q


# ---------------------------------------------------------------- what a user rule returns


def check_tokens(rule: str, value: Any, vocab: int, draw: int, padded: bool = False) -> np.ndarray:
    """A user rule's emitted token(s) as int64, or a one-line UsageError naming the rule and draw.

    Impossible outputs are a usage error, never a verdict: a token outside
    0..vocab - 1, a non-integer (2.7, NaN, inf, a string), a bool. ``padded``: rows
    of a vectorized chain rule, where -1 after the last token means "no token".
    For a 1-D or 2-D batch, draw ``draw + i`` is row ``i``.
    """
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError) as err:
        raise InputError("rule", f"{rule}: returned {_short(value)} at draw {draw}, not token ids"
                         f" ({str(err).splitlines()[0] if str(err) else type(err).__name__})"
                         ) from None
    if arr.dtype.kind not in "iuf" or arr.dtype.kind == "b":
        raise InputError("rule", f"{rule}: returned {_short(value)} at draw {draw}, not token ids")
    flat = arr.reshape(-1)
    if arr.dtype.kind == "f":
        bad = ~np.isfinite(flat) | (flat != np.floor(flat))
        if bad.any():
            i = int(np.argmax(bad))
            raise InputError("rule", f"{rule}: returned {float(flat[i])!r} at draw"
                             f" {_draw(arr, draw, i)}, not an integer token id")
    lo = -1 if padded else 0
    out_of_range = (flat < lo) | (flat >= vocab)
    if out_of_range.any():
        i = int(np.argmax(out_of_range))
        raise InputError("rule", f"{rule}: emitted token {_num(flat[i])} at draw {_draw(arr, draw, i)},"
                         f" outside the vocabulary (0..{vocab - 1})")
    ints = arr.astype(np.int64)
    if padded and ints.ndim == 2:
        # -1 pads after the last token only: a token after a -1 is impossible
        seen_pad = np.maximum.accumulate(ints < 0, axis=1)
        bad = seen_pad & (ints >= 0)
        if bad.any():
            r = int(np.nonzero(bad.any(axis=1))[0][0])
            raise InputError("rule", f"{rule}: at draw {draw + r} a token follows the -1 padding"
                             f" ({ints[r].tolist()})")
    return ints


def _draw(arr: np.ndarray, draw: int, flat_index: int) -> int:
    return draw + (flat_index // int(np.prod(arr.shape[1:])) if arr.ndim > 1 else
                   flat_index if arr.ndim == 1 else 0)


def _num(x: Any) -> str:
    f = float(x)
    return str(int(f)) if f.is_integer() else repr(f)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
