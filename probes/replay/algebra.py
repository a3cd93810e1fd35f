"""Round algebra: what a served run's logged rounds must satisfy, checked without a model.

A round that accepts ``a`` proposals emits ``a + 1`` tokens (:func:`emitted_counts`);
:func:`locate` maps an emitted index back to its round and row.

:func:`check_rounds` (mlxcel transcripts): each bonus equals the previous
round's last emitted token; ``accepted`` equals the longest common prefix of
draft and target tokens; ``new_tokens == draft[:a] + [target[a]]``, shorter
only on a burst's last round (budget truncation).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from specparity.errors import UsageError
from specparity.probes.replay.logs import Round


@dataclass
class AlgebraFinding:
    """A round whose logged tokens break the round algebra.

    check: ``bonus_chain`` | ``accepted_lcp`` | ``new_tokens`` | ``truncation``.
    request / round: where (0-based request, the round index the log gave).
    line: the log line. message: what was expected and what was logged.
    """

    check: str
    request: int
    round: int
    line: int
    message: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def emitted_counts(accepts: list[int]) -> list[int]:
    """Tokens each round emits: ``a + 1``."""
    return [a + 1 for a in accepts]


def locate(emitted_per_round: list[int], index: int) -> tuple[int, int]:
    """The (round, row) that emitted token ``index`` (0-based over the whole output).

    Row k of a round's verify block emits that round's k-th token.
    """
    if index < 0:
        raise UsageError(f"emitted index {index} is negative")
    start = 0
    for r, n in enumerate(emitted_per_round):
        if index < start + n:
            return r, index - start
        start += n
    raise UsageError(
        f"emitted index {index} is past the end: the rounds emit {start} tokens (0..{start - 1})"
    )


def _lcp(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def check_rounds(rounds: list[Round], request: int = 0) -> list[AlgebraFinding]:
    """The round algebra of one burst; an empty list when every round holds."""
    found: list[AlgebraFinding] = []

    def add(check: str, rnd: Round, msg: str) -> None:
        found.append(AlgebraFinding(check, request, rnd.round, rnd.line, msg))

    for i, rnd in enumerate(rounds):
        last = i == len(rounds) - 1
        if i > 0:
            prev = rounds[i - 1].new_tokens
            if not prev:
                add("bonus_chain", rnd, "the previous round emitted no token to start from")
            elif rnd.bonus != prev[-1]:
                add("bonus_chain", rnd,
                    f"bonus {rnd.bonus} is not the previous round's last emitted token {prev[-1]}")
        lcp = _lcp(rnd.draft, rnd.target)
        if rnd.accepted != lcp:
            add("accepted_lcp", rnd,
                f"accepted={rnd.accepted} but draft and target tokens share a prefix of {lcp}")
        a = rnd.accepted
        if a >= len(rnd.target) or a > len(rnd.draft):
            add("new_tokens", rnd,
                f"accepted={a} leaves no target token to emit (draft {len(rnd.draft)},"
                f" target {len(rnd.target)} tokens)")
            continue
        expected = rnd.draft[:a] + [rnd.target[a]]
        got = rnd.new_tokens
        if got == expected:
            continue
        if last and 0 < len(got) < len(expected) and got == expected[: len(got)]:
            continue  # the budget ran out inside the burst's last round
        if not last and 0 < len(got) < len(expected) and got == expected[: len(got)]:
            add("truncation", rnd,
                f"new_tokens truncated to {len(got)} of {len(expected)} on a round that is not"
                " the burst's last")
            continue
        add("new_tokens", rnd, f"new_tokens {got} != draft[:{a}] + [target[{a}]] = {expected}")
    return found
