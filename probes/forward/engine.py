"""The probe through an engine adapter: its verify block and its rollback against classic decode.

For each prompt and depth D, classic decode (mlx-lm's own path, on the same
weights, :meth:`Engine.classic`) prefills, decodes D greedy tokens and then
``max(widths)`` more single steps, keeping every step's logits and cache
state. From an exact copy of classic decode's cache at depth D (copied into
the engine's own cache types, :meth:`TargetSession.adopt`):

- **block vs chain** at each width W: the engine's verify forward over the
  chain's next W tokens against the chain's W single steps, logits as bytes;
- **rollback** at each width W and each accept k (0..W-1): the engine
  verifies [the chain's next k+1 tokens, W-1-k wrong ids], rolls back to k
  accepted its own way, and its state (every layer, every array) is compared
  with classic decode's state after those k+1 tokens;
- **prefill**: the engine prefills the prompt its own way; its last row's
  logits and its state against classic decode's after the same prompt.

A shape the engine cannot run is ``not_run`` with the engine's own error,
never a pass. The reproducibility bracket repeats classic decode's chain at
the first depth before anything counts.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from specparity.compare import Diff, StateDiff, compare_arrays, first_state_difference
from specparity.decode import Decoder, LayerState, snapshot
from specparity.probes.engines.base import Engine, EngineCannotRun
from specparity.probes.forward.blockchain import Cell
from specparity.progress import NULL, Observer
from specparity.reproducibility import Bracket, repeat_chain
from specparity.verdicts import ReportMixin, Verdict, combine

log = logging.getLogger(__name__)


# what an ArraysCache entry of a gated-delta layer holds (mlx-lm qwen3_5 / qwen3_next)
_STATE_NAMES = {"state.0": "conv state", "state.1": "recurrent state"}


def state_words(d: StateDiff) -> str:
    """``layer 0 (ArraysCache) state.1 (recurrent state): 3014 of 16384 bytes differ (...)``."""
    what = d.diff.summary() if d.diff is not None else d.note
    label = f" ({_STATE_NAMES[d.name]})" if d.name in _STATE_NAMES and "Cache" in d.kind \
        and "KV" not in d.kind else ""
    return f"layer {d.layer} ({d.kind}) {d.name}{label}: {what}"


@dataclass
class EngineCell(Cell):
    """Block vs chain for one (width, depth) through the engine's verify forward (blockchain.Cell's
    fields; reason: the engine's error when it could not run the block), with its report line."""

    def line(self) -> str:
        head = f"{self.width:>5} {self.depth:>5}  {self.verdict:<9} "
        if self.verdict == Verdict.EQUAL:
            return head + f"{self.prompts_tested} prompt(s), all logit bytes equal"
        if self.verdict == Verdict.NOT_RUN:
            return head + (self.reason or "")
        assert self.diff is not None
        return head + (f"prompt {self.prompt_index}, first at row {self.first_row} (position"
                       f" {self.absolute_position}): {self.diff.summary('logit bytes')}")


@dataclass
class RollbackCell:
    """The engine's state after a rollback to ``accepted`` of a ``width``-row block, vs classic decode.

    verdict: equal | divergent | not_run. prompt_index: the prompt compared (the first
    that differed, else the last). position: positions held after the rollback.
    first: the first differing array (layer, cache kind, name, bytes). layers: every
    layer that differs. rows_equal: the kept rows' logits equal classic decode's.
    reason: the engine's error when it could not run.
    """

    width: int
    depth: int
    accepted: int
    verdict: Verdict
    prompt_index: int = 0
    position: int = 0
    first: StateDiff | None = None
    layers: list[int] = field(default_factory=list)
    rows_equal: bool | None = None
    reason: str | None = None

    def words(self) -> str:
        if self.verdict == Verdict.NOT_RUN:
            return f"not_run: {self.reason}"
        if self.verdict == Verdict.EQUAL:
            return "state equal"
        assert self.first is not None
        return f"{len(self.layers)} layer(s) differ, first {state_words(self.first)}"

    def to_dict(self) -> dict[str, Any]:
        return {"width": self.width, "depth": self.depth, "accepted": self.accepted, "verdict": self.verdict,
                "prompt_index": self.prompt_index, "position": self.position,
                "first": self.first.to_dict() if self.first else None, "layers": self.layers,
                "rows_equal": self.rows_equal, "reason": self.reason, "words": self.words()}


@dataclass
class PrefillCheck:
    """The engine's own prefill against classic decode's, one prompt.

    logits: last row's logits compared. first / layers: the first differing state
    array and every differing layer (None / empty when equal).
    """

    prompt_index: int
    prompt_len: int
    verdict: Verdict
    logits: Diff | None = None
    first: StateDiff | None = None
    layers: list[int] = field(default_factory=list)
    reason: str | None = None

    def line(self) -> str:
        head = f"engine prefill, prompt {self.prompt_index} ({self.prompt_len} tokens): {self.verdict}"
        if self.verdict == Verdict.NOT_RUN:
            return head + f" ({self.reason})"
        if self.verdict == Verdict.EQUAL:
            return head + " (last-row logits and every layer's state equal)"
        parts = []
        if self.logits is not None and not self.logits.equal:
            parts.append(self.logits.summary("last-row logit bytes"))
        if self.first is not None:
            parts.append(f"state: {len(self.layers)} layer(s) differ, first {state_words(self.first)}")
        return head + ": " + "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"prompt_index": self.prompt_index, "prompt_len": self.prompt_len, "verdict": self.verdict,
                "logits": self.logits.to_dict() if self.logits else None,
                "first": self.first.to_dict() if self.first else None, "layers": self.layers,
                "reason": self.reason}


@dataclass
class EngineProbeReport(ReportMixin):
    """Everything one engine probe found.

    engine: the engine (EngineInfo.to_dict()). cells: block vs chain per (width, depth).
    rollbacks: per (width, depth, accepted). prefill: per prompt. bracket: classic
    decode's chain repeated from the same state. dtype: the logits' dtype. prompts:
    prompt lengths. seconds: wall time. forwards: engine verify forwards run.
    """

    engine: dict[str, Any]
    cells: list[EngineCell]
    rollbacks: list[RollbackCell]
    prefill: list[PrefillCheck]
    bracket: Bracket | None
    dtype: str = ""
    prompts: list[int] = field(default_factory=list)
    seconds: float = 0.0
    forwards: int = 0

    @property
    def verdict(self) -> Verdict:
        if self.bracket is not None and not self.bracket.reproducible:
            return Verdict.INCONCLUSIVE
        return combine([c.verdict for c in self.cells] + [r.verdict for r in self.rollbacks]
                       + [p.verdict for p in self.prefill])

    def rollback_lines(self) -> list[str]:
        """One line per (width, depth): which accepts leave the engine's state equal."""
        out = []
        keys = sorted({(r.width, r.depth) for r in self.rollbacks})
        for w, d in keys:
            group = [r for r in self.rollbacks if (r.width, r.depth) == (w, d)]
            bad = [r for r in group if r.verdict != Verdict.EQUAL]
            head = f"rollback width {w} depth {d}:"
            if not bad:
                out.append(f"{head} state equal after every accept 0-{w - 1}")
                continue
            from specparity.compare import index_ranges

            equal = [r.accepted for r in group if r.verdict == Verdict.EQUAL]
            by_verdict: dict[str, list[int]] = {}
            for r in bad:
                by_verdict.setdefault(str(r.verdict), []).append(r.accepted)
            parts = [f"{v} at accepted {index_ranges(ks)}" for v, ks in by_verdict.items()]
            if equal:
                parts.append(f"equal at accepted {index_ranges(equal)}")
            out.append(f"{head} {'; '.join(parts)}; first: accepted {bad[0].accepted}, {bad[0].words()}")
        return out

    def lines(self) -> list[str]:
        e = self.engine
        out = [f"engine {e['name']} {e['version']} ({e['family']}); " + "; ".join(e.get("notes", []))]
        if self.bracket is not None:
            out.append(self.bracket.line())
            if not self.bracket.reproducible:
                return out
        out += [p.line() for p in self.prefill]
        out.append(f"{'width':>5} {'depth':>5}  {'verdict':<9} detail (engine verify block vs classic chain)")
        out += [c.line() for c in self.cells]
        out += self.rollback_lines()
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "exit_code": self.exit_code, "engine": self.engine,
                "cells": [c.to_dict() for c in self.cells], "rollbacks": [r.to_dict() for r in self.rollbacks],
                "prefill": [p.to_dict() for p in self.prefill],
                "bracket": self.bracket.to_dict() if self.bracket else None, "dtype": self.dtype,
                "prompts": self.prompts, "seconds": self.seconds, "forwards": self.forwards}


class _Classic:
    """Classic decode's chain for one prompt: tokens, each step's logits, the cache before each step."""

    def __init__(self, model: Any, prompt: list[int], steps: int, keep: set[int]):
        dec = Decoder(model)
        y = dec.prefill(prompt)
        self.start = dec.fork()
        self.tokens: list[int] = []
        self.rows: list[Any] = []
        self.states: list[list[LayerState]] = []  # state after step i
        self.decoders: dict[int, Decoder] = {}
        for s in range(steps):
            if s in keep:
                self.decoders[s] = dec.fork()
            self.tokens.append(y)
            row, y = dec.step(y)
            self.rows.append(row)
            self.states.append(snapshot(dec.cache))
        self.tokens.append(y)


def _wrong(right: int, wrong_id: int, vocab: int) -> int:
    return wrong_id if wrong_id != right else (wrong_id + 1) % vocab


def probe_engine(engine: Engine, widths: list[int], depths: list[int], prompts: list[list[int]],
                 rollback: bool = True, wrong_id: int = 0, observer: Observer = NULL) -> EngineProbeReport:
    """Block vs chain, rollback and prefill through ``engine``, against classic decode."""
    import mlx.core as mx

    t0 = time.perf_counter()
    live = sorted({w for w in widths if w >= 2})
    cells = {(w, d): EngineCell(w, d, Verdict.EQUAL) for d in depths for w in widths}
    for w in widths:
        if w < 2:
            for d in depths:
                cells[(w, d)] = EngineCell(w, d, Verdict.NOT_RUN, reason=f"width {w} has no block to compare (W < 2)")
    rollbacks: dict[tuple[int, int, int], RollbackCell] = {}
    prefills: list[PrefillCheck] = []
    bracket: Bracket | None = None
    dtype = ""
    forwards = 0
    need = max(depths) + max(live, default=1)
    total = len(prompts) * (1 + len(depths) * sum(1 + (w if rollback else 0) for w in live))
    observer.begin("engine", total=total)
    for pi, prompt in enumerate(prompts):
        with engine.classic():
            chain = _Classic(engine.classic_model(), prompt, need, set(depths))
        base = len(prompt) - 1
        dtype = str(chain.rows[0].dtype).replace("mlx.core.", "")
        if pi == 0 and live:
            d0, w0 = min(depths), max(live)
            with engine.classic():
                bracket = repeat_chain(chain.decoders[d0], chain.tokens[d0:d0 + w0],
                                       mx.stack(chain.rows[d0:d0 + w0]), base + d0,
                                       f"width {w0}, depth {d0}, prompt 0")
            observer.result("bracket", bracket.to_dict())
            if not bracket.reproducible:
                break
        prefills.append(_prefill_check(engine, pi, prompt, chain))
        forwards += 1
        observer.item("engine")
        for d in depths:
            for w in live:
                cell = cells[(w, d)]
                if cell.verdict == Verdict.EQUAL:
                    forwards += 1
                    _block_cell(engine, cell, chain, pi, base)
                observer.item("engine")
                if not rollback:
                    continue
                for k in range(w):
                    key = (w, d, k)
                    if key in rollbacks and rollbacks[key].verdict != Verdict.EQUAL:
                        continue
                    forwards += 1
                    rollbacks[key] = _rollback_cell(engine, chain, w, d, k, pi, base, wrong_id)
                    observer.item("engine")
        for c in cells.values():
            observer.result("cells", c.to_dict())
    observer.end("engine")
    return EngineProbeReport(engine.info.to_dict(), [cells[(w, d)] for d in depths for w in widths],
                             [rollbacks[k] for k in sorted(rollbacks, key=lambda k: (k[1], k[0], k[2]))],
                             prefills, bracket, dtype, [len(p) for p in prompts], time.perf_counter() - t0,
                             forwards)


def _prefill_check(engine: Engine, pi: int, prompt: list[int], chain: _Classic) -> PrefillCheck:
    sess = engine.session()
    try:
        logits = sess.prefill(prompt)
    except EngineCannotRun as err:
        return PrefillCheck(pi, len(prompt), Verdict.NOT_RUN, reason=str(err))
    diff = compare_arrays(chain.rows[0][None], logits, logits=True)
    first, layers = first_state_difference(chain.states[0], sess.state(), ("classic", "engine"))
    ok = diff.equal and first is None
    return PrefillCheck(pi, len(prompt), Verdict.EQUAL if ok else Verdict.DIVERGENT, diff, first, layers)


def _block_cell(engine: Engine, cell: EngineCell, chain: _Classic, pi: int, base: int) -> None:
    import mlx.core as mx

    w, d = cell.width, cell.depth
    sess = engine.session()
    sess.adopt(chain.decoders[d].cache)
    try:
        block = sess.verify(chain.tokens[d:d + w])
    except EngineCannotRun as err:
        cell.verdict, cell.reason, cell.prompts_tested = Verdict.NOT_RUN, str(err), pi
        return
    diff = compare_arrays(mx.stack(chain.rows[d:d + w]), block, logits=True)
    cell.prompts_tested = pi + 1
    if not diff.equal:
        cell.verdict, cell.prompt_index, cell.first_row, cell.diff = Verdict.DIVERGENT, pi, diff.first_row, diff
        cell.absolute_position = base + d + (diff.first_row or 0)


def _rollback_cell(engine: Engine, chain: _Classic, w: int, d: int, k: int, pi: int, base: int,
                   wrong_id: int) -> RollbackCell:
    import mlx.core as mx

    sess = engine.session()
    sess.adopt(chain.decoders[d].cache)
    vocab = int(chain.rows[0].shape[-1])
    block = chain.tokens[d:d + k + 1] + [_wrong(chain.tokens[d + k + 1], wrong_id, vocab)] * (w - 1 - k)
    try:
        logits = sess.verify(block)
        sess.rollback(k)
    except EngineCannotRun as err:
        return RollbackCell(w, d, k, Verdict.NOT_RUN, pi, reason=str(err))
    rows_equal = compare_arrays(mx.stack(chain.rows[d:d + k + 1]), logits[:k + 1], logits=True).equal
    first, layers = first_state_difference(chain.states[d + k], sess.state(), ("classic", "engine"))
    verdict = Verdict.EQUAL if first is None else Verdict.DIVERGENT
    return RollbackCell(w, d, k, verdict, pi, base + d + k + 1, first, layers, rows_equal)
