"""How long library runs report their parts: progress on a terminal, results into the record.

A library function that takes time accepts an ``observer`` and reports each
part (cells, walk blocks, rounds, arms) as it goes::

    with observer.part("cells", total=len(grid)):
        for cell in grid:
            ...
            observer.item("cells")                     # one more done of total
            observer.result("cells", cell.to_dict())   # finished: record it now

The default :data:`NULL` observer does nothing, so library callers need not
care. The CLI's :class:`CliObserver` draws a tqdm bar on stderr (only on a
terminal, never with ``--quiet`` or ``--json``) with done/total, elapsed and
an estimate, appends each finished result to the record sink the moment it
finishes, and records how long each part took.
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar
from collections.abc import Iterable, Iterator

T = TypeVar("T")


class Sink(Protocol):
    """Where finished results and part timings go (specparity.records.record.RecordSink is one)."""

    def append(self, arm: str, obj: dict[str, Any]) -> None: ...

    def timing(self, part: str, seconds: float) -> None: ...


class Observer:
    """Receives a run's parts; the base class ignores everything."""

    def begin(self, part: str, total: int | None = None) -> None:
        """``part`` starts, with ``total`` items where known."""

    def item(self, part: str, n: int = 1) -> None:
        """``n`` more items of ``part`` are done (progress only)."""

    def result(self, arm: str, obj: dict[str, Any]) -> None:
        """A finished result, kept in the record's ``<arm>.jsonl`` at once."""

    def end(self, part: str) -> None:
        """``part`` is done (also called when it stopped early)."""

    def note(self, message: str) -> None:
        """A one-line progress message (stderr on a terminal)."""

    @contextmanager
    def part(self, part: str, total: int | None = None) -> Iterator[None]:
        self.begin(part, total)
        try:
            yield
        finally:
            self.end(part)

    def iterate(self, part: str, items: Iterable[T], total: int | None = None) -> Iterator[T]:
        """Yield ``items``, counting each one done when the loop comes back for the next."""
        with self.part(part, total):
            for x in items:
                yield x
                self.item(part)


NULL = Observer()


class CliObserver(Observer):
    """tqdm bars on stderr when ``show``; results and timings into ``sink``."""

    def __init__(self, sink: Sink | None = None, show: bool | None = None):
        self.sink = sink
        self.show = sys.stderr.isatty() if show is None else show
        self._bars: dict[str, Any] = {}
        self._t0: dict[str, float] = {}

    def begin(self, part: str, total: int | None = None) -> None:
        self._t0[part] = time.perf_counter()
        if self.show:
            from tqdm import tqdm

            self._bars[part] = tqdm(total=total, desc=part, unit=" " + part.rstrip("s"),
                                    file=sys.stderr, leave=False, dynamic_ncols=True)

    def item(self, part: str, n: int = 1) -> None:
        bar = self._bars.get(part)
        if bar is not None:
            bar.update(n)

    def result(self, arm: str, obj: dict[str, Any]) -> None:
        if self.sink is not None:
            self.sink.append(arm, obj)

    def end(self, part: str) -> None:
        bar = self._bars.pop(part, None)
        if bar is not None:
            bar.close()
        t0 = self._t0.pop(part, None)
        if t0 is not None and self.sink is not None:
            self.sink.timing(part, time.perf_counter() - t0)

    def note(self, message: str) -> None:
        if self.show:
            from tqdm import tqdm

            tqdm.write(message, file=sys.stderr)
