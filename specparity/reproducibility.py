"""The reproducibility bracket: the chain arm twice, from identical states, before any blame.

A checkpoint whose forward is not reproducible (the same input gives other
bytes from call to call) makes every block-vs-chain comparison differ, and a
tool that compares without checking would blame the verify block for noise.
So probe, walk, bisect and replay first repeat the chain arm once from an
exact copy of the state it started from, feeding the same tokens, and compare
the two runs' logits byte for byte. A repeat that differs makes the run
``inconclusive: not reproducible`` (exit 3), with where it differed; no
divergence verdict is given on such a checkpoint.

The bracket is cheap: W single steps at the first cell.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specparity.compare import Diff, compare_arrays


@dataclass
class Bracket:
    """The chain arm run twice from identical states.

    reproducible: every logit byte of the repeat equals the first run.
    where: the coordinates of the repeated arm (e.g. ``width 4, depth 0, prompt 0``).
    rows: single steps repeated. start_position: cache position of the first row.
    first_row / position: the first row whose logits differ, and its absolute position.
    diff: first run vs repeat over all rows (None when reproducible).
    """

    reproducible: bool
    where: str
    rows: int
    start_position: int
    first_row: int | None = None
    position: int | None = None
    diff: Diff | None = None

    def line(self) -> str:
        if self.reproducible:
            return (f"reproducibility bracket: the chain arm repeated from the same state ({self.where},"
                    f" {self.rows} steps from position {self.start_position}) is byte-identical")
        assert self.diff is not None
        return (f"not reproducible: the chain arm repeated from the same state ({self.where}) differs"
                f" from its first run at row {self.first_row} (position {self.position}):"
                f" {self.diff.summary('logit bytes')}; no divergence is blamed on this checkpoint")

    def to_dict(self) -> dict[str, Any]:
        return {"reproducible": self.reproducible, "where": self.where, "rows": self.rows,
                "start_position": self.start_position, "first_row": self.first_row,
                "position": self.position, "diff": self.diff.to_dict() if self.diff else None,
                "line": self.line()}


def repeat_chain(start: Any, tokens: list[int], first_rows: Any, start_position: int,
                 where: str) -> Bracket:
    """Feed ``tokens`` one at a time from a copy of ``start`` (a Decoder); compare with ``first_rows``.

    ``first_rows`` (rows, vocab) are the logits the first run computed from the
    same state with the same tokens. ``start`` itself is not changed.
    """
    import mlx.core as mx

    dec = start.fork()
    rows = mx.stack([dec.forward([t])[-1] for t in tokens])
    diff = compare_arrays(first_rows, rows, logits=True)
    if diff.equal:
        return Bracket(True, where, len(tokens), start_position)
    row = diff.first_row or 0
    return Bracket(False, where, len(tokens), start_position, row, start_position + row, diff)
