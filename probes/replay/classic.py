"""Classic decode's side of every replay: one greedy chain, stepped by classic decode, rows and picks kept.

:class:`ClassicChain` is the reference both the replay of an accept vector
(:func:`specparity.probes.replay.core.replay_accepts`) and the walk of an engine's own run
(:func:`specparity.probes.replay.engine.check_engine_run`) compare with: mlx-lm's classic decode on
the engine's classic model (:meth:`Engine.classic_model`, in :meth:`Engine.classic`, with
:meth:`Engine.cache_options`), one single-token forward per position. It either extends itself with
its own greedy picks (:meth:`ClassicChain.ensure`: the replay feeds the engine the chain's own tokens,
so every position is compared on classic's history and a flip does not cascade), or feeds the tokens
it is given (:meth:`ClassicChain.feed`: an engine's committed tokens). It keeps each row's raw logits
(what a verify row must reproduce byte for byte), classic's pick there (logits processors applied as
``generate_step`` applies them), the exact logprob ties the dtype made, and, at the positions it is
told (``marks``), a snapshot of its cache, so a walk that runs ahead (for the right tokens of rejected
rows, or the reproducibility bracket) still has classic decode's state where a round ended, without a
forward more.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

from specparity.decode import (
    CacheOptions, Decoder, GreedyPick, greedy_chain, greedy_pick, greedy_pick_parts, greedy_token, greedy_tokens,
    snapshot,
)
from specparity.processors import process_row
from specparity.reproducibility import Bracket, repeat_chain


class ClassicChain:
    """The classic greedy chain after ``prompt``, extended on demand, old rows dropped.

    tokens[j]: the token fed at step j (tokens[0] the last prompt token; the last entry is the next
    input, classic's pick after the last row). rows[j] / picks[j]: the logits after feeding tokens[j]
    and classic's choice there (a row's absolute position is ``len(prompt) - 1 + j``).
    ``context``: what classic decode runs in (the engine's :meth:`Engine.classic`; None: nothing).
    ``trace``: receives ``("chain", first, n)`` for every run of ``n`` single steps. ``marks``: the
    step counts at which to keep a snapshot of the cache (:meth:`state_at`). tie_breaks (first 20) /
    tie_breaks_total / tie_indices: the rows where classic's logprob argmax broke an exact tie.
    """

    def __init__(self, model: Any, prompt: list[int], opts: CacheOptions | None = None,
                 trace: list | None = None, processors: list[Any] | None = None,
                 context: Any = None, marks: set[int] | None = None):
        self.context = context or nullcontext
        self.prompt = list(prompt)
        with self.context():
            self.dec = Decoder(model, opts)
            self.tokens = [self.dec.prefill(prompt)]
        self.rows: dict[int, Any] = {}
        self.picks: dict[int, GreedyPick] = {}
        self.tie_breaks: list[dict[str, Any]] = []
        self.tie_breaks_total = 0
        self.tie_indices: list[int] = []
        self.trace = trace
        self.processors = processors or []
        self._marks = sorted(marks or ())
        self._states: dict[int, list[Any]] = {}
        # every token fed so far was classic's own pick: the chain is the greedy chain, a replay may go on with it
        self.own = True

    @property
    def steps(self) -> int:
        """Rows computed so far (the cache holds ``len(prompt) - 1 + steps`` positions)."""
        return len(self.tokens) - 1

    def history(self, j: int) -> list[int]:
        """What classic decode's processors see at the row after feeding tokens[j]."""
        return self.prompt + self.tokens[1: j + 1]

    def pick(self, j: int, row: Any) -> int:
        """The token classic decode emits from ``row`` at step ``j`` (processors, then the greedy pick):
        what a target row's logits pick there."""
        return greedy_token(process_row(self.processors, self.history(j), row))

    def picks_from(self, j: int, rows: Any) -> list[Any]:
        """:meth:`pick` of each row, the first at step ``j`` (a verify block's kept rows), unevaluated
        (:func:`specparity.decode.greedy_tokens`)."""
        return greedy_tokens([self._processed(j + k, rows[k]) for k in range(int(rows.shape[0]))])

    def _processed(self, j: int, row: Any) -> Any:
        """``row`` after classic decode's processors at step ``j`` (unevaluated)."""
        return process_row(self.processors, self.history(j), row)

    def _pick(self, j: int, row: Any, parts: list[Any] | None = None) -> GreedyPick:
        """Classic's own pick at row ``j``, kept with its tie information (``parts``: its
        :func:`greedy_pick_parts`, built and evaluated with the forward)."""
        pick = self.picks[j] = greedy_pick(row if parts is not None else self._processed(j, row), parts)
        if pick.tie_flip:
            self.tie_breaks_total += 1
            self.tie_indices.append(j)
            if len(self.tie_breaks) < 20:
                self.tie_breaks.append({"emitted_index": j, "pick": pick.to_dict(), "words": pick.describe()})
        return pick

    def _keep_mark(self) -> None:
        """Before stepping past a marked step count, keep the cache's snapshot there."""
        have = self.steps
        while self._marks and self._marks[0] < have:
            self._marks.pop(0)
        if self._marks and self._marks[0] == have:
            self._states[have] = snapshot(self.dec.cache)
            self._marks.pop(0)

    def ensure(self, n: int) -> None:
        """Extend with classic's own picks until rows 0..n-1 (and tokens up to n) exist."""
        while self.steps < n:
            self._keep_mark()
            have = self.steps
            stop = min([m for m in self._marks[:1] if m < n] + [n])
            self._run(have, stop)

    def _run(self, have: int, n: int) -> None:
        if self.trace is not None:
            self.trace.append(("chain", self.tokens[have], n - have))
        with self.context():
            if self.processors:
                for j in range(have, n):
                    row = self.dec.forward([self.tokens[j]])[-1]
                    self.rows[j] = row
                    self.tokens.append(self._pick(j, row).token)
                return
            fed, logits = greedy_chain(self.dec, self.tokens[have], n - have)
        import mlx.core as mx

        rows = [logits[i] for i in range(n - have)]
        parts = [greedy_pick_parts(row) for row in rows]
        mx.eval(rows, parts)  # every row's pick evidence in one evaluation
        for i, row in enumerate(rows):
            self.rows[have + i] = row
            last = self._pick(have + i, row, parts[i])
        self.tokens.extend(fed[1:])
        self.tokens.append(last.token)  # the last row's pick: greedy_token's own computation

    def feed(self, token: int) -> tuple[Any, GreedyPick, int]:
        """Feed ``token`` as the next input (in place of classic's own pick): the row after it, classic's
        pick there and the row's absolute position."""
        self._keep_mark()
        j = self.steps
        if token != self.tokens[j]:
            self.own = False
        self.tokens[j] = token
        made: list[Any] = []

        def row_and_pick(logits: Any) -> list[Any]:  # evaluated with the forward: one synchronisation
            made.append(logits[-1])
            made.extend(greedy_pick_parts(self._processed(j, made[0])))
            return made

        with self.context():
            self.dec.forward([token], then=row_and_pick)
        row = made[0]
        self.rows[j] = row
        pick = self._pick(j, row, made[1:])
        self.tokens.append(pick.token)
        return row, pick, len(self.prompt) - 1 + j

    def state_at(self, steps: int, keep: bool = False) -> list[Any]:
        """Classic decode's cache snapshot after ``steps`` rows (now, or kept at a mark it ran past);
        ``keep``: a later caller asks for it again (a replay going on with this chain)."""
        if self.steps == steps:
            while self._marks and self._marks[0] <= steps:
                self._marks.pop(0)
            state = self._states.pop(steps, None) or snapshot(self.dec.cache)
        else:
            state = self._states.pop(steps)
        if keep:
            self._states[steps] = state
        return state

    def drop_before(self, j: int) -> None:
        for k in [k for k in self.rows if k < j]:
            del self.rows[k]

    def bracket(self, n: int) -> Bracket:
        """Repeat the chain's first ``n`` steps from a copy of its post-prefill state (before any step)."""
        import mlx.core as mx

        start = self.dec.fork()
        self.ensure(n)
        with self.context():
            return repeat_chain(start, self.tokens[:n], mx.stack([self.rows[j] for j in range(n)]),
                                len(self.prompt) - 1, f"the first {n} classic steps after prefill")
