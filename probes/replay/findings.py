"""What a replay finds, round by round, against classic decode: one set of findings for every walk.

The replay loop (:func:`specparity.probes.replay.core.replay_accepts`) and the walk of an engine's
own run (:func:`specparity.probes.replay.engine.check_engine_run`) both report with these:

- :class:`Disagreement`: the first kept row whose logits or token left the classic chain (with a count);
- :class:`RewindFinding`: a rewind that left a layer's cache offset wrong (the replay stops there);
- :class:`TokenFinding` / :class:`RowFinding` / :class:`StateFinding`: the first emitted token, the first
  kept row's logits and the first state after a rollback that differ from classic decode's, collected
  as they come by :class:`Findings`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from specparity.compare import Diff, StateDiff, first_state_difference, index_ranges
from specparity.decode import GreedyPick
from specparity.probes.forward.blockchain import state_words


@dataclass
class Disagreement:
    """The first position where the target's verify row left the classic chain.

    round / row: the verify round (0-based) and the row inside its block; round -1
      is the prefill's single step (when the server emits its first token there).
    emitted_index: index of the token that row emits, over the whole output.
    position: the absolute cache position of the row that emitted it
      (prompt length - 1 + emitted_index, as the block-vs-chain probe counts).
    token_classic / token_target: the chain's token and the verify row's greedy token.
    diff: the row's logits, chain vs verify (bytes, max abs diff, ulp, margins).
    pick: classic's greedy choice at that row (top-2 logprob margin: a flip at a
      near tie reads differently from a flip at a confident token).
    """

    round: int
    row: int
    emitted_index: int
    position: int
    token_classic: int
    token_target: int
    diff: Diff
    pick: GreedyPick | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["diff"] = self.diff.to_dict()
        d["pick"] = self.pick.to_dict() if self.pick else None
        return d


@dataclass
class RewindFinding:
    """A rewind that did not take effect.

    round: the round whose rewind failed. rows: rejected rows it had to drop.
    trimmed: what ``trim_prompt_cache`` reported it dropped.
    expected_offset: the length every layer should hold after it.
    offsets: each layer's offset after it (None: a layer without one).
    layers: the layers whose offset is wrong.
    """

    round: int
    rows: int
    trimmed: int
    expected_offset: int
    offsets: list[int | None]
    layers: list[int]

    def describe(self) -> str:
        wrong = sorted({self.offsets[i] for i in self.layers}, key=lambda o: o or 0)
        stale = ", ".join(
            f"{o} ({'+' if (o or 0) > self.expected_offset else ''}"
            f"{(o or 0) - self.expected_offset} rows)" for o in wrong
        )
        return (
            f"rewind failed at round {self.round}: trimming {self.rows} rejected rows"
            f" (trim reported {self.trimmed}) left {len(self.layers)} of {len(self.offsets)}"
            f" layers at offset {stale} where {self.expected_offset} was expected"
            f" (layers {index_ranges(self.layers)}); replay stopped"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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


class Findings:
    """The first token, row and state findings of one walk, collected as they come."""

    def __init__(self) -> None:
        self.token: TokenFinding | None = None
        self.row: RowFinding | None = None
        self.state: StateFinding | None = None

    def token_at(self, index: int, rnd: int, row: int, engine_token: int, pick: GreedyPick,
                 logits: Diff | None = None, past_max_tokens: int | None = None) -> None:
        """An emitted token that differs from classic's pick (kept when it is the first)."""
        if self.token is None:
            self.token = TokenFinding(index, rnd, row, engine_token, pick.token, pick, logits, past_max_tokens)

    def row_at(self, rnd: int, row: int, position: int, diff: Diff) -> None:
        """A kept row whose logits differ (kept when it is the first)."""
        if self.row is None and not diff.equal:
            self.row = RowFinding(rnd, row, position, diff)

    def state_after(self, rnd: int, accepted: int, width: int, position: int, classic: list[Any],
                    engine: list[Any]) -> bool:
        """The engine's state after a round vs classic decode's at the same position; True when it differs."""
        first, layers = first_state_difference(classic, engine, ("classic", "engine"))
        if first is None:
            return False
        if self.state is None:
            self.state = StateFinding(rnd, accepted, width, position, first, layers)
        else:
            self.state.rounds_differing += 1
        return True
