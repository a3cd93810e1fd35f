"""Monte-Carlo draws of an acceptance rule (numpy, vectorized for the built-ins).

:func:`simulate` draws rounds of one rule on a :class:`~specparity.probes.sampling.problem.Problem`
and counts the emitted tokens (single position) or emitted k-prefixes (chains:
rounds of k drafts run until k tokens are emitted). A :class:`Checker` keeps the
first draw that breaks a zero-tolerance check: an emitted token outside p's
support, or (residual rules) a resample of a token with p <= q. ``forced``
fixes the first draft, for the support sweep. :func:`draw_drafts` and
:func:`single_step` are the one-position primitives ``accept`` reuses.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from specparity.errors import InputError, UsageError
from specparity.probes.sampling.problem import Problem
from specparity.probes.sampling.rules import Rule, check_tokens, sample_rows

CHUNK = 1 << 16


@dataclass
class Violation:
    """The first draw that broke a zero-tolerance check.

    check: ``support`` (emitted token with p = 0) or ``residual`` (a resample with p <= q).
    phase: ``monte_carlo`` (drafts drawn from q) or ``sweep`` (draft forced).
    draw: index of the draw (sample) in that phase, 0-based.
    round / position: the round of that sample and the position inside it (0-based).
    token: the emitted token; draft: the draft at that position (None past the drafts).
    p / q: the target's and the rule's drafter probability of ``token`` there.
    """

    check: str
    phase: str
    draw: int
    round: int
    position: int
    token: int
    draft: int | None
    p: float
    q: float

    def describe(self) -> str:
        what = ("outside the target's filtered support" if self.check == "support"
                else "resampled although p <= q")
        where = (f"sweep draw {self.draw} (forced draft token {self.draft})"
                 if self.phase == "sweep" else f"Monte-Carlo draw {self.draw}")
        return (f"{where}, round {self.round} position {self.position}: emitted token"
                f" {self.token} with p={self.p:.3g} q={self.q:.3g}, {what}")


class Checker:
    """Keeps the first support / residual violation (lowest draw index)."""

    def __init__(self, rule: Rule, phase: str):
        self.rule, self.phase = rule, phase
        self.support: Violation | None = None
        self.residual: Violation | None = None

    def check(self, base: int, rnd: int, pos: int, rows: np.ndarray, tokens: np.ndarray,
              p_rows: np.ndarray, q_rows: np.ndarray, drafts: np.ndarray | None,
              resampled: np.ndarray) -> None:
        """tokens emitted at ``pos`` by sample rows ``rows`` (indices inside the chunk)."""
        if len(rows) == 0:
            return
        v = p_rows.shape[-1]
        safe = np.clip(tokens, 0, v - 1)
        pt = _pick(p_rows, safe)
        qt = _pick(q_rows, safe) if q_rows is not None else np.zeros(len(rows))
        bad = (tokens < 0) | (tokens >= v) | (pt <= 0)
        if bad.any() and self.support is None:
            i = int(np.nonzero(bad)[0][0])
            self.support = self._violation("support", base, rnd, pos, rows, i, tokens, drafts,
                                           pt, qt)
        if self.rule.residual and self.residual is None and resampled.any():
            q_eff = np.zeros_like(qt) if self.rule.onehot_q else qt
            rbad = resampled & ~bad & (pt <= q_eff)
            if rbad.any():
                i = int(np.nonzero(rbad)[0][0])
                self.residual = self._violation("residual", base, rnd, pos, rows, i, tokens,
                                                drafts, pt, q_eff)

    def _violation(self, check, base, rnd, pos, rows, i, tokens, drafts, pt, qt) -> Violation:
        return Violation(check=check, phase=self.phase, draw=int(base + rows[i]), round=rnd,
                         position=pos, token=int(tokens[i]),
                         draft=None if drafts is None else int(drafts[i]),
                         p=float(pt[i]), q=float(qt[i]))

    def merge(self, other: Checker) -> None:
        self.support = self.support or other.support
        self.residual = self.residual or other.residual


def _pick(rows: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    if rows.ndim == 1:
        return rows[tokens]
    return np.take_along_axis(rows, tokens[:, None], axis=1)[:, 0]


def _user_token(value: Any, rule: Rule, draw: int, vocab: int) -> int:
    if isinstance(value, (list, tuple, np.ndarray)):
        if len(value) == 0:
            raise InputError("rule", f"{rule.name}: returned no token at draw {draw}")
        value = value[0]
    return int(check_tokens(rule.name, value, vocab, draw))


def _call_user(rule: Rule, draw: int, *args: Any) -> Any:
    assert rule.per_sample is not None
    try:
        return rule.per_sample(*args)
    except UsageError:
        raise
    except Exception as err:
        shapes = " ".join(f"{getattr(a, 'shape', None) or type(a).__name__}" for a in args[:3])
        raise InputError("rule", f"{rule.name}: raised {type(err).__name__} at draw {draw}"
                         f" (called with p, q, draft(s) of shapes {shapes}): {err}") from err


def single_step(rule: Rule, p: np.ndarray, q: np.ndarray, drafts: np.ndarray,
                 rng: np.random.Generator, base: int) -> tuple[np.ndarray, np.ndarray]:
    """(emitted, accepted) at one position for a batch of drafts; p, q (V,) or (N, V)."""
    if rule.step is not None:
        return rule.step(p, q, drafts, rng)
    n = len(drafts)
    if rule.vectorized:
        pp = np.broadcast_to(p, (n, p.shape[-1])) if p.ndim == 1 else p
        qq = np.broadcast_to(q, (n, q.shape[-1])) if q.ndim == 1 else q
        out = _call_user(rule, base, pp, qq, drafts, rng)
        out = check_tokens(rule.name, out, p.shape[-1], base)
        if out.shape != (n,):
            raise InputError("rule", f"{rule.name}: a vectorized rule returned shape"
                             f" {out.shape}, expected ({n},)")
    else:
        out = np.empty(n, dtype=np.int64)
        for i in range(n):
            pi = p if p.ndim == 1 else p[i]
            qi = q if q.ndim == 1 else q[i]
            out[i] = _user_token(_call_user(rule, base + i, pi, qi, int(drafts[i]), rng), rule,
                                 base + i, p.shape[-1])
    return out, out == drafts


def draw_drafts(rule: Rule, q: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    if rule.greedy_draft:
        return np.argmax(q, axis=-1).astype(np.int64) if q.ndim == 2 else np.full(
            n, int(np.argmax(q)), dtype=np.int64)
    return sample_rows(q, rng, n) if q.ndim == 1 else sample_rows(q, rng)


@dataclass
class MonteCarlo:
    """What one rule emitted over ``samples`` draws.

    counts: emitted tokens per cell (single position: per token; chain: per
      flattened k-prefix), length V or V**k.
    accepted / proposed: drafts accepted and drafts proposed, over all rounds.
    rounds: rounds run (single position: = samples).
    seconds: wall time of the draws.
    """

    counts: np.ndarray
    accepted: int
    proposed: int
    rounds: int
    seconds: float


def simulate(rule: Rule, prob: Problem, samples: int, rng: np.random.Generator,
             checker: Checker | None = None, forced: int | None = None) -> MonteCarlo:
    """Run ``samples`` draws of ``rule`` on ``prob``; ``forced`` fixes the first draft."""
    t0 = time.perf_counter()
    if prob.num_draft == 1:
        mc = _simulate_single(rule, prob, samples, rng, checker, forced)
    else:
        mc = _simulate_chain(rule, prob, samples, rng, checker, forced)
    mc.seconds = time.perf_counter() - t0
    return mc


def _simulate_single(rule, prob, samples, rng, checker, forced) -> MonteCarlo:
    p, q, v = prob.p, prob.q, prob.vocab
    counts = np.zeros(v, dtype=np.int64)
    accepted = 0
    chunk = samples if rule.builtin else min(samples, CHUNK)
    chunk = max(1, min(chunk, 1 << 22))
    base = 0
    while base < samples:
        n = min(chunk, samples - base)
        d = np.full(n, forced, dtype=np.int64) if forced is not None else draw_drafts(rule, q, n, rng)
        out, acc = single_step(rule, p, q, d, rng, base)
        inside = (out >= 0) & (out < v)
        counts += np.bincount(out[inside], minlength=v)
        accepted += int(acc.sum())
        if checker is not None:
            # a one-hot-q rule sees q = 0 at every token but the draft
            checker.check(base, 0, 0, np.arange(n), out, p, None if rule.onehot_q else q, d,
                          ~acc)
        base += n
    return MonteCarlo(counts=counts, accepted=accepted, proposed=samples, rounds=samples,
                      seconds=0.0)


def _chain_emit(rule: Rule, P: np.ndarray, Q: np.ndarray, D: np.ndarray,
                rng: np.random.Generator, base: int) -> np.ndarray:
    """(m, k+1) emitted tokens, -1 after the last, for one round of every sample."""
    m, k = D.shape
    if rule.step is not None:
        em = np.full((m, k + 1), -1, dtype=np.int64)
        alive = np.ones(m, dtype=bool)
        for j in range(k):
            idx = np.nonzero(alive)[0]
            if idx.size == 0:
                break
            e, a = rule.step(P[idx, j], Q[idx, j], D[idx, j], rng)
            em[idx, j] = e
            alive[idx[~a]] = False
        idx = np.nonzero(alive)[0]
        if idx.size:
            em[idx, k] = sample_rows(P[idx, k], rng)
        return em
    if rule.vectorized:
        out = check_tokens(rule.name, _call_user(rule, base, P, Q, D, rng), P.shape[-1], base,
                           padded=True)
        if out.shape != (m, k + 1):
            raise InputError("rule", f"{rule.name}: a vectorized chain rule returned shape"
                             f" {out.shape}, expected ({m}, {k + 1})")
        return out
    em = np.full((m, k + 1), -1, dtype=np.int64)
    for i in range(m):
        res = _call_user(rule, base + i, P[i], Q[i], D[i].copy(), rng)
        toks = np.atleast_1d(check_tokens(rule.name, res, P.shape[-1], base + i)).reshape(-1)
        if np.ndim(res) > 1 or not 1 <= len(toks) <= k + 1:
            raise InputError("rule", f"{rule.name}: returned {len(toks)} tokens at draw"
                             f" {base + i}, expected 1..{k + 1}")
        em[i, : len(toks)] = toks
    return em


def _simulate_chain(rule, prob, samples, rng, checker, forced) -> MonteCarlo:
    v, k = prob.vocab, prob.num_draft
    pt, qt = prob.p_table, prob.q_table
    counts = np.zeros(v**k, dtype=np.int64)
    accepted = proposed = rounds = 0
    chunk = CHUNK if rule.builtin or rule.vectorized else 4096
    base = 0
    while base < samples:
        n = min(chunk, samples - base)
        out = np.full((n, k), -1, dtype=np.int64)
        got = np.zeros(n, dtype=np.int64)
        last = np.zeros(n, dtype=np.int64)
        rnd = 0
        while (got < k).any():
            act = np.nonzero(got < k)[0]
            m = act.size
            P = np.empty((m, k + 1, v))
            Q = np.empty((m, k, v))
            D = np.empty((m, k), dtype=np.int64)
            prev = last[act]
            for j in range(k):
                P[:, j], Q[:, j] = pt[prev], qt[prev]
                d = draw_drafts(rule, Q[:, j], m, rng)
                if forced is not None and rnd == 0 and j == 0:
                    d[:] = forced
                D[:, j] = d
                prev = d
            P[:, k] = pt[prev]
            em = _chain_emit(rule, P, Q, D, rng, base)
            n_em = (em >= 0).sum(axis=1)
            if (n_em == 0).any():
                i = int(np.nonzero(n_em == 0)[0][0])
                raise InputError("rule", f"{rule.name}: emitted no token at draw {base + act[i]}")
            n_acc = np.cumprod(em[:, :k] == D, axis=1).sum(axis=1)
            accepted += int(n_acc.sum())
            proposed += m * k
            rounds += m
            for j in range(k + 1):
                has = n_em > j
                if not has.any():
                    break
                rows = np.nonzero(has)[0]
                tok = em[rows, j]
                if checker is not None:
                    resampled = (j < k) & (j == n_acc[rows])
                    qrows = Q[rows, j] if j < k else np.zeros((rows.size, v))
                    if rule.onehot_q:
                        qrows = np.zeros((rows.size, v))
                    checker.check(base, rnd, j, act[rows], tok, P[rows, j], qrows,
                                  D[rows, j] if j < k else None,
                                  np.broadcast_to(resampled, rows.shape))
                # append to the k-prefix of samples that still need tokens
                dest = act[rows]
                need = got[dest] < k
                dest, tok = dest[need], tok[need]
                out[dest, got[dest]] = np.clip(tok, 0, v - 1)
                got[dest] += 1
            last[act] = em[np.arange(m), n_em - 1].clip(0, v - 1)
            rnd += 1
        codes = np.zeros(n, dtype=np.int64)
        for j in range(k):
            codes = codes * v + out[:, j]
        counts += np.bincount(codes, minlength=v**k)
        base += n
    return MonteCarlo(counts=counts, accepted=accepted, proposed=proposed, rounds=rounds,
                      seconds=0.0)


