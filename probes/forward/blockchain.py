"""Block vs chain, the long walk and the rollback check, through any engine's adapter.

For each depth D and width W: from the state classic decode reaches after the
prompt and D greedy tokens, compare W single-token forwards (the chain) with
one W-row verify block of the same tokens through the engine's adapter (the
block, a full-accept verify: :meth:`TargetSession.verify` from an exact copy of
classic decode's cache, :meth:`TargetSession.adopt`). Logits are compared as
raw bytes in the model's dtype (specparity.compare). mlx-lm's own adapter
(:class:`specparity.probes.engines.mlx_lm.MlxLmEngine`) is the default: a bare
model is probed through it.

Work is shared, never changed: one greedy chain per prompt serves every depth
and width (the chain from depth D is the continuation of classic decode), and
the block for (W, D) starts from an exact copy of the cache at depth D.

What an adapter supports beyond that (:data:`specparity.probes.engines.base.FEATURES`):

- the long walk (``walk``) feeds consecutive full-accept blocks from the
  post-prefill state, so the block arm's cache is written only by blocks, and
  compares every row with the chain: it finds divergences that start dozens of
  tokens in;
- aimed blocks (``aim``): blocks and walks placed to straddle every cache boundary.

And for every adapter, when asked:

- **rollback** at each width W and each accept k (0..W-1): the engine verifies
  [the chain's next k+1 tokens, W-1-k wrong ids], rolls back to k accepted its
  own way, and its state (every layer, every array) is compared with classic
  decode's state after those k+1 tokens;
- **the engine's own prefill**: its last row's logits and its state against
  classic decode's after the same prompt.

A shape the engine cannot run is ``not_run`` with the engine's own error,
never a pass. The reproducibility bracket repeats classic decode's chain at
the first cell before anything counts.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from specparity.compare import Diff, StateDiff, compare_arrays, first_state_difference
from specparity.decode import CacheOptions, Decoder, LayerState, snapshot, state_arrays
from specparity.errors import UsageError
from specparity.probes.engines.base import Engine, EngineCannotRun
from specparity.progress import NULL, Observer
from specparity.probes.forward.render import cell_line, walk_line
from specparity.reproducibility import Bracket, repeat_chain
from specparity.verdicts import ReportMixin, Verdict, combine

log = logging.getLogger(__name__)

# boundaries further than this many positions are named, not probed: a CPU prefill of
# 2048 tokens takes tens of seconds on a small model
DEFAULT_AIM_LIMIT = 1024

def _with_diff(result: Any) -> dict[str, Any]:
    d = asdict(result)
    d["diff"] = result.diff.to_dict() if result.diff else None
    if isinstance(result, ReportMixin):
        d["exit_code"] = result.exit_code
    return d


@dataclass
class Cell:
    """The verdict for one (width, depth).

    width: verify rows W. depth: tokens decoded past the prompt before the block.
    verdict: equal | divergent | not_run.
    prompts_tested: prompts compared (stops at the first divergence).
    prompt_index: the prompt that diverged (None unless divergent).
    first_row: first differing row inside the block (0-based).
    absolute_position: cache position of that row (prompt length - 1 + depth + row).
    diff: the logits comparison at the diverging prompt (None unless divergent).
    reason: why a cell did not run.
    """

    width: int
    depth: int
    verdict: Verdict
    prompts_tested: int = 0
    prompt_index: int | None = None
    first_row: int | None = None
    absolute_position: int | None = None
    diff: Diff | None = None
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return _with_diff(self)

    def line(self) -> str:
        return cell_line(self)


@dataclass
class WalkResult(ReportMixin):
    """Consecutive full-accept blocks vs the chain over ``positions`` positions.

    width: rows per block. positions: rows compared. blocks: blocks run.
    verdict: equal | divergent | not_run.
    first_step: index past the prompt of the first differing row (None if equal).
    first_position: its absolute cache position. block_index / row: where in the walk.
    diff: comparison of the block holding it with the chain rows.
    """

    width: int
    positions: int
    blocks: int
    verdict: Verdict
    prompt_index: int = 0
    first_step: int | None = None
    first_position: int | None = None
    block_index: int | None = None
    row: int | None = None
    diff: Diff | None = None
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return _with_diff(self)

    def lines(self) -> list[str]:
        return [walk_line(self)]


@dataclass
class AimedCell:
    """A block placed to straddle one cache boundary (probes.forward.boundaries).

    boundary: the boundary (kind, position, source). width: rows.
    prompt_len / depth: the aimed prompt's length and the tokens decoded before the block.
    start: cache position of the block's first row.
    verdict: equal | divergent | not_run (the block vs the chain from the same state).
    first_row / absolute_position / diff: where the block first differs (None if equal).
    walk: the aimed walk (a block before, the straddling block, one after), None when not walked.
    reason: why it did not run.
    """

    boundary: dict[str, Any]
    width: int
    prompt_len: int
    depth: int
    start: int
    verdict: Verdict
    first_row: int | None = None
    absolute_position: int | None = None
    diff: Diff | None = None
    walk: WalkResult | None = None
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = _with_diff(self)
        d["walk"] = self.walk.to_dict() if self.walk else None
        return d


# what an ArraysCache entry of a gated-delta layer holds (mlx-lm qwen3_5 / qwen3_next)
STATE_NAMES = {"state.0": "conv state", "state.1": "recurrent state"}


def state_words(d: StateDiff) -> str:
    """``layer 0 (ArraysCache) state.1 (recurrent state): 3014 of 16384 bytes differ (...)``."""
    what = d.diff.summary() if d.diff is not None else d.note
    label = f" ({STATE_NAMES[d.name]})" if d.name in STATE_NAMES and "Cache" in d.kind \
        and "KV" not in d.kind else ""
    return f"layer {d.layer} ({d.kind}) {d.name}{label}: {what}"


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
class ProbeReport(ReportMixin):
    """Everything one probe run found.

    cells: one per (width, depth), widths ascending within each depth.
    walks: one long walk per walked width.
    prompts: the prompt lengths (tokens). opts: the cache configuration used.
    dtype: the dtype logits were compared in. seconds: wall time of the probe.
    bracket: the reproducibility bracket (the chain arm repeated at the first cell);
      a bracket that differs makes the report inconclusive, whatever the cells say.
    aimed: blocks placed to straddle each cache boundary. boundaries: those boundaries.
    notes: options this architecture ignores (e.g. --max-kv-size with its own make_cache).
    rollbacks: per (width, depth, accepted), when asked. prefill: the engine's own prefill per prompt,
      when asked. engine: the engine probed (EngineInfo.to_dict()), None for a bare model.
    forwards: the engine's verify forwards run (blocks, walks' blocks, rollbacks, prefills).
    """

    cells: list[Cell]
    walks: list[WalkResult] = field(default_factory=list)
    prompts: list[int] = field(default_factory=list)
    opts: dict[str, Any] = field(default_factory=dict)
    dtype: str = ""
    seconds: float = 0.0
    bracket: Bracket | None = None
    aimed: list[AimedCell] = field(default_factory=list)
    boundaries: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    rollbacks: list[RollbackCell] = field(default_factory=list)
    prefill: list[PrefillCheck] = field(default_factory=list)
    engine: dict[str, Any] | None = None
    forwards: int = 0

    @property
    def reproducible(self) -> bool:
        return self.bracket is None or self.bracket.reproducible

    @property
    def verdict(self) -> Verdict:
        """Inconclusive if the bracket's repeat differed; else divergent if any cell, walk or
        aimed block is, else not_run if any did not run (or none ran), else equal."""
        if not self.reproducible:
            return Verdict.INCONCLUSIVE
        return combine([c.verdict for c in self.cells] + [w.verdict for w in self.walks]
                       + [a.verdict for a in self.aimed]
                       + [a.walk.verdict for a in self.aimed if a.walk is not None]
                       + [r.verdict for r in self.rollbacks] + [p.verdict for p in self.prefill])

    def lines(self) -> list[str]:
        """The (width, depth) table, one line per long walk, the bracket and the aimed blocks, then the
        engine's own prefill and its rollbacks."""
        from specparity.probes.forward.render import reach_lines

        return ([f"{'width':>5} {'depth':>5}  {'verdict':<9} detail"]
                + [cell_line(c) for c in self.cells] + [walk_line(w) for w in self.walks]
                + reach_lines(self) + [p.line() for p in self.prefill] + self.rollback_lines())

    def rollback_lines(self) -> list[str]:
        """One line per (width, depth): which accepts leave the engine's state equal."""
        from specparity.compare import index_ranges

        out = []
        for w, d in sorted({(r.width, r.depth) for r in self.rollbacks}):
            group = [r for r in self.rollbacks if (r.width, r.depth) == (w, d)]
            bad = [r for r in group if r.verdict != Verdict.EQUAL]
            head = f"rollback width {w} depth {d}:"
            if not bad:
                out.append(f"{head} state equal after every accept 0-{w - 1}")
                continue
            equal = [r.accepted for r in group if r.verdict == Verdict.EQUAL]
            by_verdict: dict[str, list[int]] = {}
            for r in bad:
                by_verdict.setdefault(str(r.verdict), []).append(r.accepted)
            parts = [f"{v} at accepted {index_ranges(ks)}" for v, ks in by_verdict.items()]
            if equal:
                parts.append(f"equal at accepted {index_ranges(equal)}")
            out.append(f"{head} {'; '.join(parts)}; first: accepted {bad[0].accepted}, {bad[0].words()}")
        return out

    def cell(self, width: int, depth: int) -> Cell:
        for c in self.cells:
            if c.width == width and c.depth == depth:
                return c
        raise KeyError((width, depth))

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "cells": [c.to_dict() for c in self.cells],
            "walks": [w.to_dict() for w in self.walks],
            "prompts": self.prompts,
            "opts": self.opts,
            "dtype": self.dtype,
            "seconds": self.seconds,
            "bracket": self.bracket.to_dict() if self.bracket else None,
            "aimed": [a.to_dict() for a in self.aimed],
            "boundaries": self.boundaries,
            "notes": self.notes,
            "rollbacks": [r.to_dict() for r in self.rollbacks],
            "prefill": [p.to_dict() for p in self.prefill],
            "forwards": self.forwards,
            **({"engine": self.engine} if self.engine is not None else {}),
        }


class _Chain:
    """Classic decode's greedy chain for one prompt: the tokens fed (one more than the steps: the next
    token too), each step's logits row, the decoder before each step in ``keep`` and the state after
    each step in ``snap``."""

    def __init__(self, model: Any, prompt: list[int], n_steps: int, keep: set[int], opts: CacheOptions,
                 snap: set[int] = frozenset()):  # type: ignore[assignment]
        dec = Decoder(model, opts)
        y = dec.prefill(prompt)
        self.tokens: list[int] = []
        self.rows: list[Any] = []
        self.decoders: dict[int, Decoder] = {}
        self.states: dict[int, list[LayerState]] = {}  # state after step i
        for s in range(n_steps):
            if s in keep:
                self.decoders[s] = dec.fork()
            self.tokens.append(y)
            row, y = dec.step(y)
            self.rows.append(row)
            if s in snap:
                self.states[s] = snapshot(dec.cache)
        self.tokens.append(y)


def as_engine(model: Any, opts: CacheOptions | None = None) -> Engine:
    """``model`` as an engine: an adapter is itself; a bare mlx-lm model goes through mlx-lm's own adapter."""
    if isinstance(model, Engine):
        return model
    from specparity.probes.engines.mlx_lm import MlxLmEngine

    return MlxLmEngine.of_model(model, opts)


def _failed(err: Exception, what: str) -> str:
    """The reason a shape did not run: the engine's own words, else what raised."""
    return str(err) if isinstance(err, EngineCannotRun) else f"{what} failed: {type(err).__name__}: {err}"


def probe_block_vs_chain(
    model: Any,
    widths: list[int],
    depths: list[int],
    prompts: list[list[int]],
    opts: CacheOptions | None = None,
    walk_positions: int = 0,
    walk_widths: list[int] | None = None,
    observer: Observer = NULL,
    aim: bool = False,
    aim_limit: int = DEFAULT_AIM_LIMIT,
    rollback: bool = False,
    engine_prefill: bool = False,
    wrong_id: int = 0,
) -> ProbeReport:
    """Run the probe for every (width, depth) over ``prompts`` through ``model``'s engine; optionally the
    long walk, the aimed blocks, every rollback and the engine's own prefill.

    model: an engine adapter (:class:`Engine`), or a bare mlx-lm model (probed through mlx-lm's adapter
    with ``opts``; an adapter brings its own cache options). A cell stops at its first divergent prompt.
    Width < 2 is ``not_run`` (no block to compare). A cache that cannot be copied or a forward that
    raises makes the affected cells ``not_run`` with the reason. ``observer`` gets progress (parts
    ``cells``, ``walk`` and ``rollbacks``), every comparison as it finishes (arm ``comparisons``: one
    line per cell and prompt), every cell once its verdict is final (arm ``cells``), every walk (arm
    ``walks``), rollback (arm ``rollbacks``) and prefill check (arm ``engine-prefill``).

    Before any comparison counts, the reproducibility bracket repeats the
    chain arm at the first cell from the same state: if the repeat differs
    the report is inconclusive and nothing else runs. ``aim`` adds blocks and
    walks placed to straddle every cache boundary up to ``aim_limit``
    positions (arm ``aimed``); a boundary past it is named in the notes.
    ``rollback``: at each width W and accept k < W, the engine's state after its rollback against
    classic decode's (``wrong_id`` fills the rejected rows). ``engine_prefill``: the engine's own
    prefill of each prompt against classic decode's.
    """
    import mlx.core as mx

    engine = as_engine(model, opts)
    opts = engine.cache_options()
    cmodel = engine.classic_model()
    t0 = time.perf_counter()
    cells = {(w, d): Cell(w, d, Verdict.EQUAL) for d in depths for w in widths}
    for w in widths:
        if w < 2:
            for d in depths:
                cells[(w, d)] = Cell(w, d, Verdict.NOT_RUN, reason=f"width {w} has no block to compare (W < 2)")
    live_widths = [w for w in widths if w >= 2]
    walk_widths = [w for w in (walk_widths if walk_widths is not None else live_widths) if w >= 2]
    walks: list[WalkResult] = []
    rollbacks: dict[tuple[int, int, int], RollbackCell] = {}
    prefills: list[PrefillCheck] = []
    forwards = 0
    dtype = chain_dtype = ""
    bracket: Bracket | None = None
    observer.begin("cells", total=len(live_widths) * len(depths) * len(prompts))
    for pi, prompt in enumerate(prompts):
        pending = [(w, d) for (w, d), c in cells.items() if c.verdict == Verdict.EQUAL and w >= 2]
        rb = [(w, d, k) for d in depths for w in sorted(set(live_widths)) for k in range(w)
              if rollback and (rollbacks.get((w, d, k)) is None or rollbacks[(w, d, k)].verdict == Verdict.EQUAL)]
        do_walk = walk_positions > 0 and pi == 0 and walk_widths
        if not pending and not do_walk and not rb and not engine_prefill:
            break
        need = max([d + w for w, d in pending] + [d + w for w, d, _ in rb] + ([walk_positions] if do_walk else [])
                   + [1])
        keep = {d for _, d in pending} | {d for _, d, _ in rb} | ({0} if do_walk else set())
        snap = {d + k for _, d, k in rb} | ({0} if engine_prefill else set())
        try:
            with engine.classic():
                chain = _Chain(cmodel, prompt, need, keep, opts, snap)
        except UsageError:  # the user's options (a KV group size the head does not take): one line, exit 2
            raise
        except Exception as err:  # unsupported cache or model: not run, with the reason
            reason = f"chain failed: {type(err).__name__}: {err}"
            log.warning("%s", reason)
            for key in pending:
                cells[key] = Cell(key[0], key[1], Verdict.NOT_RUN, prompts_tested=pi, reason=reason)
                observer.result("cells", cells[key].to_dict())
            break
        tokens, rows, states = chain.tokens, chain.rows, chain.decoders
        chain_dtype = _dtype(rows[0])
        base = len(prompt) - 1
        if pi == 0:
            with engine.classic():
                bracket = _bracket(states, tokens, rows, pending, walk_widths if do_walk else [], base)
            if bracket is not None:
                observer.result("bracket", bracket.to_dict())
                if not bracket.reproducible:
                    log.warning("%s", bracket.line())
                    observer.end("cells")
                    for key in pending:
                        cells[key] = Cell(key[0], key[1], Verdict.NOT_RUN,
                                          reason="not reproducible (see the bracket)")
                    return ProbeReport(cells=[cells[(w, d)] for d in depths for w in widths],
                                       prompts=[len(p) for p in prompts], opts=opts.to_dict(),
                                       dtype=chain_dtype, seconds=time.perf_counter() - t0,
                                       bracket=bracket, engine=_info(engine, model))
        if engine_prefill:
            forwards += 1
            prefills.append(_prefill_check(engine, pi, prompt, chain))
            observer.result("engine-prefill", prefills[-1].to_dict())
        todo = sorted({(w, d) for w, d in pending} | {(w, d) for w, d, _ in rb}, key=lambda k: (k[1], k[0]))
        for w, d in todo:
            if (w, d) in pending:
                cell = cells[(w, d)]
                forwards += 1
                try:
                    block = _verify(engine, states[d], tokens[d : d + w])
                except Exception as err:
                    cells[(w, d)] = Cell(w, d, Verdict.NOT_RUN, prompts_tested=pi, reason=_failed(err, "block"))
                    _finished(observer, cells[(w, d)], pi, final=True)
                else:
                    chain_rows = mx.stack(rows[d : d + w])
                    dtype = _dtype(block)
                    diff = compare_arrays(chain_rows, block, logits=True)
                    cell.prompts_tested = pi + 1
                    if not diff.equal:
                        cell.verdict = Verdict.DIVERGENT
                        cell.prompt_index = pi
                        cell.first_row = diff.first_row
                        cell.absolute_position = base + d + (diff.first_row or 0)
                        cell.diff = diff
                    _finished(observer, cell, pi, final=cell.verdict != Verdict.EQUAL or pi == len(prompts) - 1)
            for k in [k for ww, dd, k in rb if (ww, dd) == (w, d)]:
                forwards += 1
                rollbacks[(w, d, k)] = _rollback_cell(engine, chain, w, d, k, pi, base, wrong_id)
                observer.result("rollbacks", rollbacks[(w, d, k)].to_dict())
        if do_walk:
            observer.end("cells")
            with observer.part("walk", total=sum(walk_positions // w for w in walk_widths)):
                for w in walk_widths:
                    walks.append(_walk(engine, states[0], tokens, rows, w, walk_positions, base, pi, observer))
                    forwards += walks[-1].blocks
                    observer.result("walks", walks[-1].to_dict())
            observer.begin("cells", total=len(live_widths) * len(depths) * (len(prompts) - pi - 1))
        del states, chain
    observer.end("cells")
    ordered = [cells[(w, d)] for d in depths for w in widths]
    report = ProbeReport(
        cells=ordered,
        walks=walks,
        prompts=[len(p) for p in prompts],
        opts=opts.to_dict(),
        dtype=dtype or (chain_dtype if rollback or engine_prefill else ""),
        bracket=bracket if prompts else None,
        rollbacks=[rollbacks[k] for k in sorted(rollbacks, key=lambda k: (k[1], k[0], k[2]))],
        prefill=prefills,
        engine=_info(engine, model),
        forwards=forwards,
    )
    if aim and prompts:
        from specparity.probes.forward.boundaries import find_boundaries

        found, report.notes = find_boundaries(cmodel, opts)
        report.boundaries = [b.to_dict() for b in found]
        far = [b for b in found if b.position > aim_limit]
        found = [b for b in found if b.position <= aim_limit]
        report.notes += [f"not aimed: {b.label} ({b.source}) is past the aim limit of {aim_limit}"
                         f" positions (--aim-limit)" for b in far]
        report.aimed = probe_boundaries(engine, live_widths, walk_widths, prompts[0], opts, found,
                                        observer)
    report.seconds = time.perf_counter() - t0
    return report


def _info(engine: Engine, model: Any) -> dict[str, Any] | None:
    """The engine probed, for the report (None: a bare model, probed through mlx-lm's adapter)."""
    return engine.info.to_dict() if engine is model else None


def _dtype(row: Any) -> str:
    return str(row.dtype).replace("mlx.core.", "")


def _verify(engine: Engine, start: Decoder, tokens: list[int]) -> Any:
    """The engine's verify block over ``tokens`` from an exact copy of classic decode's state ``start``."""
    sess = engine.session()
    sess.adopt(start.cache)
    return sess.verify(tokens)


def _bracket(states: dict[int, Decoder], tokens: list[int], rows: list[Any],
             pending: list[tuple[int, int]], walk_widths: list[int], base: int) -> Bracket | None:
    """Repeat the chain arm at the first cell (shallowest depth, widest width) from its saved state."""
    import mlx.core as mx

    if pending:
        d = min(dd for _, dd in pending)
        w = max(ww for ww, dd in pending if dd == d)
    elif walk_widths:
        d, w = 0, max(walk_widths)
    else:
        return None
    if d not in states:
        return None
    return repeat_chain(states[d], tokens[d : d + w], mx.stack(rows[d : d + w]), base + d,
                        f"width {w}, depth {d}, prompt 0")


def _wrong(right: int, wrong_id: int, vocab: int) -> int:
    return wrong_id if wrong_id != right else (wrong_id + 1) % vocab


def _prefill_check(engine: Engine, pi: int, prompt: list[int], chain: _Chain) -> PrefillCheck:
    sess = engine.session()
    try:
        logits = sess.prefill(prompt)
    except Exception as err:
        return PrefillCheck(pi, len(prompt), Verdict.NOT_RUN, reason=_failed(err, "prefill"))
    diff = compare_arrays(chain.rows[0][None], logits, logits=True)
    first, layers = first_state_difference(chain.states[0], sess.state(), ("classic", "engine"))
    ok = diff.equal and first is None
    return PrefillCheck(pi, len(prompt), Verdict.EQUAL if ok else Verdict.DIVERGENT, diff, first, layers)


def _rollback_cell(engine: Engine, chain: _Chain, w: int, d: int, k: int, pi: int, base: int,
                   wrong_id: int) -> RollbackCell:
    import mlx.core as mx

    sess = engine.session()
    sess.adopt(chain.decoders[d].cache)
    vocab = int(chain.rows[0].shape[-1])
    block = chain.tokens[d:d + k + 1] + [_wrong(chain.tokens[d + k + 1], wrong_id, vocab)] * (w - 1 - k)
    try:
        logits = sess.verify(block)
        sess.rollback(k)
    except Exception as err:
        return RollbackCell(w, d, k, Verdict.NOT_RUN, pi, reason=_failed(err, "rollback"))
    ref, kept = mx.stack(chain.rows[d:d + k + 1]), logits[:k + 1]
    state = sess.state_unevaluated()
    mx.eval(ref, kept, state_arrays(state))  # the rows and the state compared, in one evaluation
    rows_equal = compare_arrays(ref, kept, logits=True).equal
    first, layers = first_state_difference(chain.states[d + k], state, ("classic", "engine"))
    verdict = Verdict.EQUAL if first is None else Verdict.DIVERGENT
    return RollbackCell(w, d, k, verdict, pi, base + d + k + 1, first, layers, rows_equal)


def probe_boundaries(model: Any, widths: list[int], walk_widths: list[int], prompt: list[int],
                     opts: CacheOptions, found: list[Any], observer: Observer = NULL) -> list[AimedCell]:
    """For each boundary and width: a block straddling it, and an aimed walk across it.

    model: the engine (or a bare model, through mlx-lm's adapter with ``opts``). The aimed prompt is
    ``prompt`` cut or repeated (boundaries.aim); one classic chain per aimed prompt length serves every
    width aimed there.
    """
    import mlx.core as mx

    from specparity.probes.forward.boundaries import aim, aimed_prompt

    engine = as_engine(model, opts)
    opts = engine.cache_options()
    aims = [aim(b, w) for b in found for w in widths if w >= 2]
    out: list[AimedCell] = []
    by_len: dict[int, list[Any]] = {}
    for a in aims:
        by_len.setdefault(a.prompt_len, []).append(a)
    with observer.part("aimed", total=len(aims)):
        for n, group in sorted(by_len.items()):
            p = aimed_prompt(prompt, n)
            need = max(max(a.depth + a.width, a.walk_blocks * a.width) for a in group)
            keep = {a.depth for a in group} | {0}
            try:
                with engine.classic():
                    chain = _Chain(engine.classic_model(), p, need, keep, opts)
            except UsageError:
                raise
            except Exception as err:
                reason = f"chain failed: {type(err).__name__}: {err}"
                for a in group:
                    out.append(AimedCell(a.boundary.to_dict(), a.width, n, a.depth, a.start, Verdict.NOT_RUN,
                                         reason=reason))
                continue
            tokens, rows, states = chain.tokens, chain.rows, chain.decoders
            for a in group:
                cell = AimedCell(a.boundary.to_dict(), a.width, n, a.depth, a.start, Verdict.EQUAL)
                try:
                    block = _verify(engine, states[a.depth], tokens[a.depth : a.depth + a.width])
                except Exception as err:
                    cell.verdict, cell.reason = Verdict.NOT_RUN, _failed(err, "block")
                else:
                    diff = compare_arrays(mx.stack(rows[a.depth : a.depth + a.width]), block, logits=True)
                    if not diff.equal:
                        cell.verdict, cell.first_row, cell.diff = Verdict.DIVERGENT, diff.first_row, diff
                        cell.absolute_position = a.start + (diff.first_row or 0)
                if a.width in walk_widths:
                    cell.walk = _walk(engine, states[0], tokens, rows, a.width, a.walk_blocks * a.width, n - 1, 0)
                out.append(cell)
                observer.item("aimed")
                observer.result("aimed", cell.to_dict())
    return out


def _finished(observer: Observer, cell: Cell, prompt_index: int, final: bool) -> None:
    """One (cell, prompt) comparison is done: progress, its line, and the cell once final."""
    observer.item("cells")
    observer.result("comparisons", {"width": cell.width, "depth": cell.depth, "prompt": prompt_index,
                                    "verdict": cell.verdict, "first_row": cell.first_row})
    if final:
        observer.result("cells", cell.to_dict())


def _walk(engine: Engine, start: Decoder, tokens: list[int], rows: list[Any], width: int, positions: int,
          base: int, prompt_index: int, observer: Observer = NULL) -> WalkResult:
    """Consecutive full-accept rounds of ``width`` rows through the engine (:meth:`TargetSession.extend`)
    from a copy of classic decode's state ``start``, every row against the chain."""
    import mlx.core as mx

    n_blocks = positions // width
    result = WalkResult(width, n_blocks * width, n_blocks, Verdict.EQUAL, prompt_index=prompt_index)
    if n_blocks == 0:
        result.verdict, result.reason = Verdict.NOT_RUN, f"walk of {positions} positions holds no block of {width}"
        return result
    sess = engine.session()
    sess.adopt(start.cache)
    for b in range(n_blocks):
        lo = b * width
        try:
            block = sess.extend(tokens[lo : lo + width])
        except Exception as err:
            result.verdict, result.reason = Verdict.NOT_RUN, _failed(err, "block")
            return result
        diff = compare_arrays(mx.stack(rows[lo : lo + width]), block, logits=True)
        observer.item("walk")
        if not diff.equal:
            row = diff.first_row or 0
            result.verdict = Verdict.DIVERGENT
            result.first_step = lo + row
            result.first_position = base + lo + row
            result.block_index, result.row, result.diff = b, row, diff
            return result
    return result
