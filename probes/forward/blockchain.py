"""Block-vs-chain probe and the long walk.

For each depth D and width W: from the state classic decode reaches after the
prompt and D greedy tokens, compare W single-token forwards (the chain) with
one W-row forward of the same tokens (the block, a full-accept verify). Logits
are compared as raw bytes in the model's dtype (specparity.compare).

Work is shared, never changed: one greedy chain per prompt serves every depth
and width (the chain from depth D is the continuation of classic decode), and
the block for (W, D) starts from an exact copy of the cache at depth D.

The long walk feeds consecutive full-accept blocks from the post-prefill
state, so the block arm's cache is written only by blocks, and compares every
row with the chain: it finds divergences that start dozens of tokens in.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from specparity.compare import Diff, compare_arrays
from specparity.decode import CacheOptions, Decoder
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
                       + [a.walk.verdict for a in self.aimed if a.walk is not None])

    def lines(self) -> list[str]:
        """The (width, depth) table, one line per long walk, then the bracket and the aimed blocks."""
        from specparity.probes.forward.render import reach_lines

        return ([f"{'width':>5} {'depth':>5}  {'verdict':<9} detail"]
                + [cell_line(c) for c in self.cells] + [walk_line(w) for w in self.walks]
                + reach_lines(self))

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
        }


def _chain_with_states(model: Any, prompt: list[int], n_steps: int, keep: set[int],
                       opts: CacheOptions) -> tuple[list[int], list[Any], dict[int, Decoder]]:
    """Classic greedy decode for ``n_steps`` steps, forking the cache before each step in keep."""
    dec = Decoder(model, opts)
    y = dec.prefill(prompt)
    tokens, rows, states = [], [], {}
    for s in range(n_steps):
        if s in keep:
            states[s] = dec.fork()
        tokens.append(y)
        row, y = dec.step(y)
        rows.append(row)
    return tokens, rows, states


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
) -> ProbeReport:
    """Run the probe for every (width, depth) over ``prompts``; optionally the long walk.

    A cell stops at its first divergent prompt. Width < 2 is ``not_run`` (no
    block to compare). A cache that cannot be copied or a forward that raises
    makes the affected cells ``not_run`` with the reason. ``observer`` gets
    progress (parts ``cells`` and ``walk``), every comparison as it finishes
    (arm ``comparisons``: one line per cell and prompt), every cell once its
    verdict is final (arm ``cells``) and every walk (arm ``walks``).

    Before any comparison counts, the reproducibility bracket repeats the
    chain arm at the first cell from the same state: if the repeat differs
    the report is inconclusive and nothing else runs. ``aim`` adds blocks and
    walks placed to straddle every cache boundary up to ``aim_limit``
    positions (arm ``aimed``); a boundary past it is named in the notes.
    """
    import mlx.core as mx

    opts = opts or CacheOptions()
    t0 = time.perf_counter()
    cells = {(w, d): Cell(w, d, Verdict.EQUAL) for d in depths for w in widths}
    for w in widths:
        if w < 2:
            for d in depths:
                cells[(w, d)] = Cell(w, d, Verdict.NOT_RUN, reason=f"width {w} has no block to compare (W < 2)")
    live_widths = [w for w in widths if w >= 2]
    walk_widths = [w for w in (walk_widths if walk_widths is not None else live_widths) if w >= 2]
    walks: list[WalkResult] = []
    dtype = ""
    bracket: Bracket | None = None
    observer.begin("cells", total=len(live_widths) * len(depths) * len(prompts))
    for pi, prompt in enumerate(prompts):
        pending = [(w, d) for (w, d), c in cells.items() if c.verdict == Verdict.EQUAL and w >= 2]
        do_walk = walk_positions > 0 and pi == 0 and walk_widths
        if not pending and not do_walk:
            break
        need = max([d + w for w, d in pending] + ([walk_positions] if do_walk else []))
        keep = {d for _, d in pending} | ({0} if do_walk else set())
        try:
            tokens, rows, states = _chain_with_states(model, prompt, need, keep, opts)
        except Exception as err:  # unsupported cache or model: not run, with the reason
            reason = f"chain failed: {type(err).__name__}: {err}"
            log.warning("%s", reason)
            for key in pending:
                cells[key] = Cell(key[0], key[1], Verdict.NOT_RUN, prompts_tested=pi, reason=reason)
                observer.result("cells", cells[key].to_dict())
            break
        base = len(prompt) - 1
        if pi == 0:
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
                                       dtype=_dtype(rows[0]), seconds=time.perf_counter() - t0,
                                       bracket=bracket)
        for w, d in sorted(pending, key=lambda k: (k[1], k[0])):
            cell = cells[(w, d)]
            try:
                block = states[d].fork().forward(tokens[d : d + w])
            except Exception as err:
                cells[(w, d)] = Cell(w, d, Verdict.NOT_RUN, prompts_tested=pi,
                                     reason=f"block failed: {type(err).__name__}: {err}")
                _finished(observer, cells[(w, d)], pi, final=True)
                continue
            chain = mx.stack(rows[d : d + w])
            dtype = str(block.dtype).replace("mlx.core.", "")
            diff = compare_arrays(chain, block, logits=True)
            cell.prompts_tested = pi + 1
            if not diff.equal:
                cell.verdict = Verdict.DIVERGENT
                cell.prompt_index = pi
                cell.first_row = diff.first_row
                cell.absolute_position = base + d + (diff.first_row or 0)
                cell.diff = diff
            _finished(observer, cell, pi, final=cell.verdict != Verdict.EQUAL or pi == len(prompts) - 1)
        if do_walk:
            observer.end("cells")
            with observer.part("walk", total=sum(walk_positions // w for w in walk_widths)):
                for w in walk_widths:
                    walks.append(_walk(states[0], tokens, rows, w, walk_positions, base, pi, observer))
                    observer.result("walks", walks[-1].to_dict())
            observer.begin("cells", total=len(live_widths) * len(depths) * (len(prompts) - pi - 1))
        del states
    observer.end("cells")
    ordered = [cells[(w, d)] for d in depths for w in widths]
    report = ProbeReport(
        cells=ordered,
        walks=walks,
        prompts=[len(p) for p in prompts],
        opts=opts.to_dict(),
        dtype=dtype,
        bracket=bracket if prompts else None,
    )
    if aim and prompts:
        from specparity.probes.forward.boundaries import find_boundaries

        found, report.notes = find_boundaries(model, opts)
        report.boundaries = [b.to_dict() for b in found]
        far = [b for b in found if b.position > aim_limit]
        found = [b for b in found if b.position <= aim_limit]
        report.notes += [f"not aimed: {b.label} ({b.source}) is past the aim limit of {aim_limit}"
                         f" positions (--aim-limit)" for b in far]
        report.aimed = probe_boundaries(model, live_widths, walk_widths, prompts[0], opts, found,
                                        observer)
    report.seconds = time.perf_counter() - t0
    return report


def _dtype(row: Any) -> str:
    return str(row.dtype).replace("mlx.core.", "")


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


def probe_boundaries(model: Any, widths: list[int], walk_widths: list[int], prompt: list[int],
                     opts: CacheOptions, found: list[Any], observer: Observer = NULL) -> list[AimedCell]:
    """For each boundary and width: a block straddling it, and an aimed walk across it.

    The aimed prompt is ``prompt`` cut or repeated (boundaries.aim); one classic
    chain per aimed prompt length serves every width aimed there.
    """
    import mlx.core as mx

    from specparity.probes.forward.boundaries import aim, aimed_prompt

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
                tokens, rows, states = _chain_with_states(model, p, need, keep, opts)
            except Exception as err:
                reason = f"chain failed: {type(err).__name__}: {err}"
                for a in group:
                    out.append(AimedCell(a.boundary.to_dict(), a.width, n, a.depth, a.start, Verdict.NOT_RUN,
                                         reason=reason))
                continue
            for a in group:
                cell = AimedCell(a.boundary.to_dict(), a.width, n, a.depth, a.start, Verdict.EQUAL)
                try:
                    block = states[a.depth].fork().forward(tokens[a.depth : a.depth + a.width])
                except Exception as err:
                    cell.verdict, cell.reason = Verdict.NOT_RUN, f"block failed: {type(err).__name__}: {err}"
                else:
                    diff = compare_arrays(mx.stack(rows[a.depth : a.depth + a.width]), block, logits=True)
                    if not diff.equal:
                        cell.verdict, cell.first_row, cell.diff = Verdict.DIVERGENT, diff.first_row, diff
                        cell.absolute_position = a.start + (diff.first_row or 0)
                if a.width in walk_widths:
                    cell.walk = _walk(states[0], tokens, rows, a.width, a.walk_blocks * a.width, n - 1, 0)
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


def _walk(start: Decoder, tokens: list[int], rows: list[Any], width: int, positions: int,
          base: int, prompt_index: int, observer: Observer = NULL) -> WalkResult:
    import mlx.core as mx

    dec = start.fork()
    n_blocks = positions // width
    result = WalkResult(width, n_blocks * width, n_blocks, Verdict.EQUAL, prompt_index=prompt_index)
    if n_blocks == 0:
        result.verdict, result.reason = Verdict.NOT_RUN, f"walk of {positions} positions holds no block of {width}"
        return result
    for b in range(n_blocks):
        lo = b * width
        try:
            block = dec.forward(tokens[lo : lo + width])
        except Exception as err:
            result.verdict, result.reason = Verdict.NOT_RUN, f"block failed: {type(err).__name__}: {err}"
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
