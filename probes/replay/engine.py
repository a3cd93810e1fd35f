"""Rounds through an engine adapter, against classic decode: an accept vector, or the engine's own run.

Two checks, each against classic decode (mlx-lm's own path on the same weights,
one token at a time, :meth:`Engine.classic`: the one classic chain,
:class:`specparity.probes.replay.classic.ClassicChain`), each round by round,
each with the same findings (:mod:`specparity.probes.replay.findings`):

:func:`replay_engine` rebuilds a run from its accept vector alone: the replay
core's one loop (:func:`specparity.probes.replay.core.replay_accepts`) with
:meth:`RoundOptions.whole_state`: the engine prefills its own way, then per round
verifies [last emitted token, the chain's next ``a`` tokens, ``W - 1 - a``
copies of one wrong id] through its verify forward and rolls back to ``a`` its
own way. Every kept row's logits and the engine's whole state after the rollback
are compared with classic decode's after the same tokens. The target side alone,
with none of the engine's drafting.

:func:`check_engine_run` takes the engine's own run (:meth:`Engine.generate`,
its drafter, its copy-from-history speculation, its adaptive block) and walks
classic decode along the tokens the engine committed (:meth:`ClassicChain.feed`):
at each round, the rows the engine kept against classic decode's rows on the
same history, the token the engine emitted against the one classic decode picks
there (the first that differs is the user's symptom), and the engine's state
after its rollback against classic decode's. Then the same accept vector is
replayed (:func:`replay_engine`), so a divergence is placed on the target side
(it reproduces from the accept vector) or on the drafting side (it does not).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from specparity.compare import compare_arrays
from specparity.probes.engines.base import Engine, EngineRun
from specparity.probes.replay.classic import ClassicChain
from specparity.probes.replay.core import RoundOptions, RoundsResult, replay_accepts
from specparity.probes.replay.findings import Findings, RowFinding, StateFinding, TokenFinding
from specparity.progress import NULL, Observer
from specparity.verdicts import ReportMixin, Verdict, combine

__all__ = ["EngineReplayReport", "EngineReplayRun", "RowFinding", "StateFinding", "TokenFinding",
           "check_engine_run", "replay_engine"]


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

    @classmethod
    def of(cls, res: RoundsResult, engine: dict[str, Any], accepts: list[int]) -> EngineReplayReport:
        """The report of an accept vector replayed through the engine (kind ``accept-vector``)."""
        return cls("accept-vector", engine, res.prompt_len, res.rounds, res.rounds_total, list(accepts),
                   list(res.widths), res.positions, token=res.findings.token, row=res.findings.row,
                   state=res.findings.state, tie_breaks=[i for i in res.tie_indices if i < res.positions],
                   error=str(res.error) if res.error is not None else None,
                   classic_tokens=res.classic_tokens, seconds=res.seconds)

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


def replay_engine(engine: Engine, prompt: list[int], accepts: list[int], widths: list[int],
                  wrong_id: int = 0, observer: Observer = NULL, chain: ClassicChain | None = None
                  ) -> EngineReplayReport:
    """Replay ``accepts`` (with ``widths``) through the engine's verify and rollback; compare with classic:
    :func:`replay_accepts` with :meth:`RoundOptions.whole_state` (the engine's own prefill, whose last row
    emits the first token; one wrong id, ``wrong_id`` or the next id where that is the bonus token, for
    every rejected row; the engine's whole state compared after the prefill and after every rollback). An
    engine that cannot run a call is reported with its error, the rounds before it checked. ``chain``:
    classic decode already stepped along its own picks on this prompt (:func:`check_engine_run`), gone on
    with rather than decoded again."""
    res = replay_accepts(engine, prompt, accepts, widths, RoundOptions.whole_state(), wrong_id=wrong_id,
                         observer=observer, chain=chain)
    return EngineReplayReport.of(res, engine.info.to_dict(), accepts)


def check_engine_run(engine: Engine, run: EngineRun, replay: bool = True, wrong_id: int = 0,
                     observer: Observer = NULL, max_tokens: int | None = None) -> EngineReplayReport:
    """The engine's own run walked against classic decode, then its accept vector replayed.

    ``max_tokens``: what the run was asked for, where its adapter did not say (``run.max_tokens``):
    classic decode stops there, so a token past it is a finding, whichever engine emitted it."""
    t0 = time.perf_counter()
    limit = run.max_tokens if run.max_tokens is not None else max_tokens
    # the replay of the run's accept vector goes on with this walk's classic decode where the engine's tokens
    # are classic's own (ClassicChain.own): its rows are kept, and its states where the replay compares
    reuse = bool(replay and run.tokens and run.rounds)
    marks = RoundOptions.whole_state().marks(run.accepts) if reuse else None
    chain = ClassicChain(engine.classic_model(), run.prompt, engine.cache_options(), context=engine.classic,
                         marks=marks)
    found = Findings()
    report = EngineReplayReport("engine-run", engine.info.to_dict(), len(run.prompt), 0, len(run.rounds),
                                run.accepts, run.widths, 0, [r.source for r in run.rounds], tokens=list(run.tokens),
                                error=run.error, engine_seconds=run.seconds)
    emitted = 0

    def emit(pick: Any, engine_token: int, rnd: int, row: int, engine_row: Any | None, classic_row: Any) -> None:
        """One emitted token: classic's pick vs the engine's (a token past the run's max_tokens is a finding)."""
        nonlocal emitted
        if limit is not None and emitted >= limit:
            found.token_at(emitted, rnd, row, engine_token, pick, past_max_tokens=limit)
        elif pick.token != engine_token:
            diff = (compare_arrays(classic_row[None], engine_row[None], logits=True)
                    if engine_row is not None else None)
            found.token_at(emitted, rnd, row, engine_token, pick, diff)
        emitted += 1

    if run.tokens:
        # the first token: from the prefill's last row (dflash-mlx), or round 0's first row (mlx-lm)
        if run.first_from_prefill:
            row, pick, _ = chain.feed(chain.tokens[0])
            emit(pick, run.tokens[0], -1, 0, None, row)
        for rnd in observer.iterate("rounds", run.rounds, len(run.rounds)):
            a, block = rnd.accepted, rnd.tokens
            kept = run.logits[rnd.index] if rnd.index < len(run.logits) else None
            classic_rows: list[tuple[Any, int]] = []  # (row, position) per kept row of this round
            for k in range(a + 1):
                row, pick, pos = chain.feed(block[k])
                classic_rows.append((row, pos))
                erow = kept[k] if kept is not None else None
                # the engine emits row k's pick as its next token: block[k + 1], or the next round's first
                # (after the last round: its last token, when it emitted one there)
                nxt = block[k + 1] if k < a else _next_first(run, rnd.index)
                if nxt is None and emitted < len(run.tokens):
                    nxt = run.tokens[emitted]
                if nxt is not None and emitted < len(run.tokens):
                    emit(pick, nxt, rnd.index, k, erow, row)
            if kept is not None and found.row is None:
                _rows_against(found, rnd.index, classic_rows, kept)
            if not reuse:
                chain.drop_before(chain.steps)
            if rnd.index < len(run.states):
                found.state_after(rnd.index, a, rnd.width, len(run.prompt) - 1 + chain.steps,
                                  chain.state_at(chain.steps, keep=reuse), run.states[rnd.index])
            report.rounds = rnd.index + 1
    report.positions = emitted
    report.token, report.row, report.state = found.token, found.row, found.state
    report.tie_breaks = [j for j in chain.tie_indices if j < emitted]
    report.classic_tokens = [chain.picks[j].token for j in range(emitted)]
    if replay and run.tokens and run.rounds:
        report.replay = replay_engine(engine, run.prompt, run.accepts, run.widths, wrong_id, observer,
                                      chain if chain.own else None)
    report.seconds = time.perf_counter() - t0
    return report


def _rows_against(found: Findings, rnd: int, classic_rows: list[tuple[Any, int]], kept: Any) -> None:
    """The round's kept rows against classic decode's on the same history, in one comparison; the first
    that differs is compared again alone (the finding's diff is that row's)."""
    import mlx.core as mx

    n = min(len(classic_rows), int(kept.shape[0]))
    if n == 0:
        return
    whole = compare_arrays(mx.stack([r for r, _ in classic_rows[:n]]), kept[:n], logits=True)
    if whole.equal:
        return
    k = whole.first_row or 0
    row, pos = classic_rows[k]
    found.row_at(rnd, k, pos, compare_arrays(row[None], kept[k][None], logits=True))


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
