"""Rounds through an engine adapter, against classic decode: an accept vector, or the engine's own run.

Two checks, each against classic decode (mlx-lm's own path on the same weights,
one token at a time, :meth:`Engine.classic`), each round by round:

:func:`replay_engine` rebuilds a run from its accept vector alone: the engine
prefills its own way, then per round verifies [last emitted token, the chain's
next ``a`` tokens, ``W - 1 - a`` wrong ids] through its verify forward and rolls
back to ``a`` its own way. Every kept row's logits and the engine's whole state
after the rollback are compared with classic decode's after the same tokens.
The target side alone, with none of the engine's drafting.

:func:`check_engine_run` takes the engine's own run (:meth:`Engine.generate`,
its drafter, its copy-from-history speculation, its adaptive block) and walks
classic decode along the tokens the engine committed: at each round, the rows
the engine kept against classic decode's rows on the same history, the token
the engine emitted against the one classic decode picks there (the first that
differs is the user's symptom), and the engine's state after its rollback
against classic decode's. Then the same accept vector is replayed
(:func:`replay_engine`), so a divergence is placed on the target side (it
reproduces from the accept vector) or on the drafting side (it does not).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from specparity.compare import Diff, StateDiff, compare_arrays, first_state_difference
from specparity.decode import Decoder, GreedyPick, greedy_pick, snapshot
from specparity.probes.engines.base import Engine, EngineCannotRun, EngineRun
from specparity.probes.forward.blockchain import state_words
from specparity.progress import NULL, Observer
from specparity.verdicts import ReportMixin, Verdict, combine

log = logging.getLogger(__name__)


@dataclass
class TokenFinding:
    """The first emitted token where the engine and classic decode part.

    emitted_index: over the whole output. round / row: the verify round and row that
    emitted it (round -1: the prefill). engine_token / classic_token: the two picks.
    pick: classic decode's choice there (margin, and whether raw argmax and the
    logprob argmax disagree: a tie the dtype made). logits: the row's logits, engine
    vs classic (None when the engine's row was not recorded).
    """

    emitted_index: int
    round: int
    row: int
    engine_token: int
    classic_token: int
    pick: GreedyPick
    logits: Diff | None = None
    # the engine's run was asked for this many tokens and emitted more (classic decode stops there)
    past_max_tokens: int | None = None

    def words(self) -> str:
        where = f"round {self.round}, row {self.row}" if self.round >= 0 else "the prefill"
        if self.past_max_tokens is not None:
            return (f"first differing token at emitted index {self.emitted_index} ({where}): engine"
                    f" {self.engine_token} past max_tokens={self.past_max_tokens}, where classic decode stops")
        s = (f"first differing token at emitted index {self.emitted_index} ({where}): engine {self.engine_token},"
             f" classic {self.classic_token}; {self.pick.describe()}")
        if self.logits is not None:
            s += f"; that row's {self.logits.summary('logit bytes')}"
        return s

    def to_dict(self) -> dict[str, Any]:
        return {"emitted_index": self.emitted_index, "round": self.round, "row": self.row,
                "engine_token": self.engine_token, "classic_token": self.classic_token,
                "pick": self.pick.to_dict(), "logits": self.logits.to_dict() if self.logits else None,
                "past_max_tokens": self.past_max_tokens, "words": self.words()}


@dataclass
class RowFinding:
    """The first kept row whose logits differ from classic decode's on the same history."""

    round: int
    row: int
    position: int
    diff: Diff

    def words(self) -> str:
        where = f"round {self.round}, row {self.row}" if self.round >= 0 else "the prefill's last row"
        return f"first differing logits at {where} (position {self.position}): {self.diff.summary('logit bytes')}"

    def to_dict(self) -> dict[str, Any]:
        return {"round": self.round, "row": self.row, "position": self.position, "diff": self.diff.to_dict(),
                "words": self.words()}


@dataclass
class StateFinding:
    """The first round after which the engine's state differs from classic decode's.

    round: -1 = after the prefill. accepted / width: that round's. position: positions held.
    first: the first differing array. layers: every differing layer. rounds_differing:
    rounds whose state differed (all of them, not just the first).
    """

    round: int
    accepted: int
    width: int
    position: int
    first: StateDiff
    layers: list[int]
    rounds_differing: int = 1

    def words(self) -> str:
        where = (f"round {self.round} (rollback to {self.accepted} of {self.width - 1} proposals)"
                 if self.round >= 0 else "the prefill")
        return (f"state first differs after {where}, position {self.position}: {len(self.layers)} layer(s),"
                f" first {state_words(self.first)}; {self.rounds_differing} round(s) in all end in another state")

    def to_dict(self) -> dict[str, Any]:
        return {"round": self.round, "accepted": self.accepted, "width": self.width, "position": self.position,
                "first": self.first.to_dict(), "layers": self.layers, "rounds_differing": self.rounds_differing,
                "words": self.words()}


@dataclass
class EngineReplayReport(ReportMixin):
    """One request through an engine, round by round, against classic decode.

    kind: ``accept-vector`` (:func:`replay_engine`) or ``engine-run`` (:func:`check_engine_run`).
    engine: EngineInfo.to_dict(). prompt_len. rounds: rounds checked (of rounds_total).
    accepts / widths / sources: per round. positions: emitted tokens compared.
    token / row / state: the first token, logits row and state findings (None: none).
    tie_breaks: emitted indices where classic decode broke an exact logprob tie the
      dtype made toward the lower id (the engine's raw-logit argmax picks the other).
    error: the engine's own error, when it could not run (then the verdict is not_run
      unless a finding came first).
    replay: for an engine run, its accept vector replayed (another EngineReplayReport).
    tokens / classic_tokens: the engine's emitted tokens and classic decode's picks on them.
    seconds: wall time; engine_seconds: the engine's own loop.
    """

    kind: str
    engine: dict[str, Any]
    prompt_len: int
    rounds: int
    rounds_total: int
    accepts: list[int]
    widths: list[int]
    positions: int
    sources: list[str] = field(default_factory=list)
    token: TokenFinding | None = None
    row: RowFinding | None = None
    state: StateFinding | None = None
    tie_breaks: list[int] = field(default_factory=list)
    error: str | None = None
    replay: EngineReplayReport | None = None
    tokens: list[int] = field(default_factory=list)
    classic_tokens: list[int] = field(default_factory=list)
    seconds: float = 0.0
    engine_seconds: float = 0.0

    @property
    def own_verdict(self) -> Verdict:
        if self.token is not None or self.row is not None or self.state is not None:
            return Verdict.DIVERGENT
        if self.error is not None or self.positions == 0:
            return Verdict.NOT_RUN
        return Verdict.EQUAL

    @property
    def verdict(self) -> Verdict:
        parts = [self.own_verdict]
        if self.replay is not None:
            parts.append(self.replay.verdict)
        return combine(parts)

    def mix(self) -> str:
        """Full, partial and zero-accept rounds (single-row rounds, which propose nothing, apart)."""
        from collections import Counter

        drafted = [(a, w) for a, w in zip(self.accepts, self.widths) if w > 1]
        full = sum(1 for a, w in drafted if a == w - 1)
        zero = sum(1 for a, _ in drafted if a == 0)
        s = f"{full} full, {len(drafted) - full - zero} partial, {zero} zero-accept rounds"
        if len(drafted) < len(self.accepts):
            s += f", {len(self.accepts) - len(drafted)} single-row"
        src = Counter(self.sources)
        if src:
            s += " (" + ", ".join(f"{n} {k}" for k, n in sorted(src.items())) + ")"
        return s

    def lines(self) -> list[str]:
        head = "engine's own run" if self.kind == "engine-run" else "accept vector replayed through the engine"
        out = [f"{head}: {self.rounds} of {self.rounds_total} rounds, {self.positions} positions, widths"
               f" {'/'.join(map(str, sorted(set(self.widths)))) or '-'}; {self.mix()}: {self.own_verdict}"]
        for f in (self.token, self.row, self.state):
            if f is not None:
                out.append("  " + f.words())
        if self.tie_breaks:
            out.append(f"  classic decode broke {len(self.tie_breaks)} exact logprob tie(s) toward the lower id"
                       f" (first at emitted index {self.tie_breaks[0]})")
        if self.error is not None:
            out.append(f"  not run past round {self.rounds}: {self.error}")
        if self.replay is not None:
            out += self.replay.lines()
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "exit_code": self.exit_code, "kind": self.kind,
                "own_verdict": self.own_verdict, "engine": self.engine,
                "prompt_len": self.prompt_len, "rounds": self.rounds, "rounds_total": self.rounds_total,
                "accepts": self.accepts, "widths": self.widths, "sources": self.sources, "mix": self.mix(),
                "positions": self.positions,
                "token": self.token.to_dict() if self.token else None,
                "row": self.row.to_dict() if self.row else None,
                "state": self.state.to_dict() if self.state else None,
                "tie_breaks": self.tie_breaks, "error": self.error,
                "replay": self.replay.to_dict() if self.replay else None,
                "tokens": self.tokens, "classic_tokens": self.classic_tokens,
                "seconds": self.seconds, "engine_seconds": self.engine_seconds}


class _Walk:
    """Classic decode stepped one token at a time, with the findings collected as they come."""

    def __init__(self, engine: Engine, prompt: list[int]):
        self.engine = engine
        self.prompt = prompt
        with engine.classic():
            self.dec = Decoder(engine.classic_model())
            self.next = self.dec.prefill(prompt)
        self.fed = len(prompt) - 1  # positions classic decode holds
        self.emitted = 0
        self.token: TokenFinding | None = None
        self.row: RowFinding | None = None
        self.state: StateFinding | None = None
        self.tie_breaks: list[int] = []
        self.classic_tokens: list[int] = []
        self.max_tokens: int | None = None  # the run's max_tokens: a token past it is a finding

    def step(self, token: int) -> tuple[Any, GreedyPick, int]:
        """Feed ``token``; classic decode's row and pick after it, and the row's position."""
        with self.engine.classic():
            row = self.dec.forward([token])[-1]
        self.fed += 1
        return row, greedy_pick(row), self.fed - 1

    def emit(self, pick: GreedyPick, engine_token: int, rnd: int, row: int, engine_row: Any | None,
             classic_row: Any) -> None:
        """One emitted token: classic's pick vs the engine's."""
        self.classic_tokens.append(pick.token)
        if pick.tie_flip:
            self.tie_breaks.append(self.emitted)
        if self.token is None and self.max_tokens is not None and self.emitted >= self.max_tokens:
            self.token = TokenFinding(self.emitted, rnd, row, engine_token, pick.token, pick,
                                      past_max_tokens=self.max_tokens)
        elif self.token is None and pick.token != engine_token:
            diff = (compare_arrays(classic_row[None], engine_row[None], logits=True)
                    if engine_row is not None else None)
            self.token = TokenFinding(self.emitted, rnd, row, engine_token, pick.token, pick, diff)
        self.emitted += 1

    def compare_row(self, rnd: int, row: int, position: int, classic_row: Any, engine_row: Any) -> None:
        if self.row is not None:
            return
        diff = compare_arrays(classic_row[None], engine_row[None], logits=True)
        if not diff.equal:
            self.row = RowFinding(rnd, row, position, diff)

    def compare_state(self, rnd: int, accepted: int, width: int, engine_state: list[Any]) -> None:
        first, layers = first_state_difference(snapshot(self.dec.cache), engine_state, ("classic", "engine"))
        if first is None:
            return
        if self.state is None:
            self.state = StateFinding(rnd, accepted, width, self.fed, first, layers)
        else:
            self.state.rounds_differing += 1


def replay_engine(engine: Engine, prompt: list[int], accepts: list[int], widths: list[int],
                  wrong_id: int = 0, observer: Observer = NULL) -> EngineReplayReport:
    """Replay ``accepts`` (with ``widths``) through the engine's verify and rollback; compare with classic."""
    t0 = time.perf_counter()
    walk = _Walk(engine, prompt)
    sess = engine.session()
    report = EngineReplayReport("accept-vector", engine.info.to_dict(), len(prompt), 0, len(accepts),
                                list(accepts), list(widths), 0)
    try:
        first = sess.prefill(prompt)
    except EngineCannotRun as err:
        report.error = str(err)
        return report
    row, pick, pos = walk.step(walk.next)
    walk.compare_row(-1, 0, pos, row, first[0])
    walk.emit(pick, greedy_pick(first[0]).token, -1, 0, first[0], row)
    walk.compare_state(-1, 0, 1, sess.state())
    y = pick.token
    vocab = int(row.shape[-1])
    for r, (a, w) in enumerate(observer.iterate("rounds", zip(accepts, widths), len(accepts))):
        # the classic rows of the kept tokens, stepping as the block's inputs become known
        rows, picks, positions, block = [], [], [], [y]
        for k in range(a + 1):
            row, pick, pos = walk.step(block[k])
            rows.append(row)
            picks.append(pick)
            positions.append(pos)
            if k < a:
                block.append(pick.token)
        block += [walk_wrong(picks[a].token, wrong_id, vocab)] * (w - 1 - a)
        try:
            logits = sess.verify(block)
            sess.rollback(a)
        except EngineCannotRun as err:
            report.error = str(err)
            break
        for k in range(a + 1):
            walk.compare_row(r, k, positions[k], rows[k], logits[k])
            walk.emit(picks[k], greedy_pick(logits[k]).token, r, k, logits[k], rows[k])
        walk.compare_state(r, a, w, sess.state())
        y = picks[a].token
        report.rounds = r + 1
    return _finish(report, walk, t0)


def walk_wrong(right: int, wrong_id: int, vocab: int) -> int:
    """A rejected proposal's id: ``wrong_id``, or the next id where that is the right token."""
    return wrong_id if wrong_id != right else (wrong_id + 1) % vocab


def _finish(report: EngineReplayReport, walk: _Walk, t0: float) -> EngineReplayReport:
    report.positions = walk.emitted
    report.token, report.row, report.state = walk.token, walk.row, walk.state
    report.tie_breaks = walk.tie_breaks
    report.classic_tokens = walk.classic_tokens
    report.seconds = time.perf_counter() - t0
    return report


def check_engine_run(engine: Engine, run: EngineRun, replay: bool = True, wrong_id: int = 0,
                     observer: Observer = NULL) -> EngineReplayReport:
    """The engine's own run walked against classic decode, then its accept vector replayed."""
    t0 = time.perf_counter()
    walk = _Walk(engine, run.prompt)
    walk.max_tokens = run.max_tokens
    report = EngineReplayReport("engine-run", engine.info.to_dict(), len(run.prompt), 0, len(run.rounds),
                                run.accepts, run.widths, 0, [r.source for r in run.rounds], tokens=list(run.tokens),
                                error=run.error, engine_seconds=run.seconds)
    if not run.tokens:
        return _finish(report, walk, t0)
    # the first token: from the prefill's last row (dflash-mlx), or round 0's first row (mlx-lm)
    if run.first_from_prefill:
        row, pick, _ = walk.step(walk.next)
        walk.emit(pick, run.tokens[0], -1, 0, None, row)
    for rnd in observer.iterate("rounds", run.rounds, len(run.rounds)):
        a, block = rnd.accepted, rnd.tokens
        kept = run.logits[rnd.index] if rnd.index < len(run.logits) else None
        for k in range(a + 1):
            row, pick, pos = walk.step(block[k])
            erow = kept[k] if kept is not None else None
            if erow is not None:
                walk.compare_row(rnd.index, k, pos, row, erow)
            # the engine emits row k's pick as its next token: block[k + 1], or the next round's first (after
            # the last round: its last token, when it emitted one there)
            nxt = block[k + 1] if k < a else _next_first(run, rnd.index)
            if nxt is None and walk.emitted < len(run.tokens):
                nxt = run.tokens[walk.emitted]
            if nxt is not None and walk.emitted < len(run.tokens):
                walk.emit(pick, nxt, rnd.index, k, erow, row)
        if rnd.index < len(run.states):
            walk.compare_state(rnd.index, a, rnd.width, run.states[rnd.index])
        report.rounds = rnd.index + 1
    _finish(report, walk, t0)
    if replay and run.rounds:
        report.replay = replay_engine(engine, run.prompt, run.accepts, run.widths, wrong_id, observer)
    report.seconds = time.perf_counter() - t0
    return report


def _next_first(run: EngineRun, index: int) -> int | None:
    if index + 1 < len(run.rounds):
        return run.rounds[index + 1].tokens[0]
    return None


@dataclass
class EngineReplayRun(ReportMixin):
    """Every request of one ``replay --engine`` run.

    engine: EngineInfo.to_dict(). requests: one report per request (prompt order).
    """

    engine: dict[str, Any]
    requests: list[EngineReplayReport]

    @property
    def verdict(self) -> Verdict:
        return combine([r.verdict for r in self.requests])

    def lines(self) -> list[str]:
        e = self.engine
        out = [f"engine {e['name']} {e['version']} ({e['family']}); " + "; ".join(e.get("notes", []))]
        for i, r in enumerate(self.requests):
            out.append(f"request {i} ({r.prompt_len} prompt tokens):")
            out += ["  " + line for line in r.lines()]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "exit_code": self.exit_code, "engine": self.engine,
                "requests": [r.to_dict() for r in self.requests]}
