"""The benches' shared statistics: medians with distribution-free intervals, and whether a run resolves its goal.

Imported by ``scripts/bench_*.py`` (run as ``python -P scripts/bench_x.py``, so each
puts this folder on ``sys.path`` first). Every interval is a 95% one unless said.

- :func:`median_ci`: the median of paired ratios and its distribution-free
  confidence interval (binomial order statistics: no assumption on the noise's shape).
- :func:`overhead_verdict`: an overhead goal (``<= 1%``) resolved only when the
  interval's half-width is within the goal.
- :func:`ratio_verdict`: a ratio goal (``<= 1.1``) met when the whole interval is
  at or under it, missed when the whole interval is over it, otherwise not resolved.
- :class:`Timers`: seconds spent inside wrapped methods (the forwards a check needs),
  counted where they happen in the check's own run.
- :func:`interleaved`: run two or more arms in rotating order, ``repeats`` times, so
  drift and a neighbour's load hit every arm alike.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
LEVEL = 0.95


def median_ci(values: Sequence[float], level: float = LEVEL) -> tuple[float, float, float]:
    """(median, low, high): the median and its distribution-free confidence interval.

    Order statistics j and n - j + 1 (1-based), j the ``(1 - level) / 2`` quantile of
    Binomial(n, 1/2): with fewer than 6 values the interval is the whole range."""
    from scipy.stats import binom

    x = sorted(values)
    n = len(x)
    j = max(int(binom.ppf((1 - level) / 2, n, 0.5)), 1)
    return statistics.median(x), x[j - 1], x[n - j]


def overhead_verdict(name: str, lo: float, hi: float, goal: float) -> str:
    """Whether the overhead interval [lo, hi] resolves ``goal`` (half-width <= goal), and what it shows."""
    half = (hi - lo) / 2
    ci = f"95% CI [{lo:+.2%}, {hi:+.2%}], half-width {half * 100:.2f} points"
    if half > goal:
        return f"{name}: not resolved ({ci} > {goal * 100:.0f}: more passes or a quieter machine)"
    if hi <= goal:
        return f"{name}: resolved, <= {goal:.0%} ({ci})"
    if lo > goal:
        return f"{name}: resolved, > {goal:.0%} ({ci})"
    return f"{name}: resolved to {half * 100:.2f} points, but the interval spans {goal:.0%} ({ci})"


def ratio_verdict(lo: float, hi: float, goal: float) -> str:
    """``met``, ``missed`` or ``not resolved`` for a ratio whose goal is ``<= goal``, from its interval."""
    if hi <= goal:
        return f"met (95% CI within <= {goal})"
    if lo > goal:
        return f"missed (95% CI entirely above {goal})"
    return f"not resolved (95% CI spans {goal}: more repeats or a quieter machine)"


def ratio_line(name: str, values: Sequence[float], goal: float | None, what: str = "") -> str:
    """``name: median x (95% CI [lo, hi], n paired runs; what) goal <= G: verdict``, one line."""
    med, lo, hi = median_ci(values)
    tail = f"; {what}" if what else ""
    line = f"{name}: {med:.3f} x (95% CI [{lo:.3f}, {hi:.3f}], median of {len(values)} paired runs{tail})"
    if goal is not None:
        line += f"; goal <= {goal}: {ratio_verdict(lo, hi, goal)}"
    return line


def met(values: Sequence[float], goal: float) -> bool:
    """The interval's upper end is within ``goal`` (what a bench's exit code says)."""
    return median_ci(values)[2] <= goal


def interleaved(arms: Sequence[Callable[[], T]], repeats: int) -> list[list[T]]:
    """``repeats`` rounds of every arm, the order rotating by one each round; per round, each arm's result
    in the arms' own order."""
    out: list[list[T]] = []
    k = len(arms)
    for r in range(repeats):
        got: dict[int, T] = {}
        for i in list(range(k))[r % k:] + list(range(k))[:r % k]:
            got[i] = arms[i]()
        out.append([got[i] for i in range(k)])
    return out


class Timers:
    """Seconds spent inside the wrapped methods, summed (a generator's time is counted per item it yields)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        self.repeated = 0.0  # wrap_forwards(distinct=True): classic forwards the check had already run
        self.repeats = 0
        self._seen: set[tuple[int, Any]] = set()
        self._exempt = 0
        self._undo: list[tuple[Any, str, Any]] = []

    def wrap(self, owner: Any, name: str) -> None:
        """Time ``owner.name`` (a class's method or a module's function) until :meth:`undo`."""
        import inspect

        orig = getattr(owner, name)
        timers = self

        def timed_gen(gen: Any) -> Any:
            while True:
                t0 = time.perf_counter()
                try:
                    item = next(gen)
                except StopIteration as stop:
                    timers.seconds += time.perf_counter() - t0
                    return stop.value
                timers.seconds += time.perf_counter() - t0
                yield item

        @functools.wraps(orig)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                out = orig(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0
                self.calls += 1
            return timed_gen(out) if inspect.isgenerator(out) else out

        setattr(owner, name, timed)
        self._undo.append((owner, name, orig))

    def wrap_forwards(self, session_cls: type, distinct: bool = False) -> None:
        """Time an in-process engine check's forwards: its session's prefill, verify and rollback, and
        every classic decode forward and step (:class:`specparity.decode.Decoder`).

        ``distinct``: a classic forward counts once per check (:meth:`new_check`): one whose decoder's
        token history (prompt and every token fed since, on the same model) the check already decoded is
        a repeat, timed apart (``repeated`` seconds, ``repeats`` calls), not a forward it needs. The
        reproducibility bracket's deliberate repeat (:func:`exempt`) counts as needed.
        """
        from specparity.decode import Decoder

        for name in ("prefill", "verify", "rollback"):
            self.wrap(session_cls, name)
        if not distinct:
            self.wrap(Decoder, "forward")
            self.wrap(Decoder, "step")
            return
        self._wrap_distinct(Decoder)

    def new_check(self) -> None:
        """A new check (command) starts: the classic decode it runs is needed again."""
        self._seen.clear()

    def exempt(self, owner: Any, name: str) -> None:
        """Classic forwards inside ``owner.name`` count as needed even where they repeat (the bracket)."""
        orig = getattr(owner, name)

        @functools.wraps(orig)
        def exempted(*args: Any, **kwargs: Any) -> Any:
            self._exempt += 1
            try:
                return orig(*args, **kwargs)
            finally:
                self._exempt -= 1

        setattr(owner, name, exempted)
        self._undo.append((owner, name, orig))

    def _wrap_distinct(self, decoder: Any) -> None:
        timers = self
        key = "_bench_history"

        def history(dec: Any) -> tuple[int, ...] | None:
            """The tokens fed into ``dec``'s cache since it was empty (None: its cache came from elsewhere)."""
            if key not in dec.__dict__:  # a decoder as constructed: empty, unless its cache was replaced
                return None if any(getattr(c, "offset", 0) for c in dec.cache) else ()
            cache, fed = dec.__dict__[key]
            return fed if cache is dec.cache else None

        def tracked(orig: Any, single: bool) -> Any:
            @functools.wraps(orig)
            def timed(dec: Any, arg: Any, **kwargs: Any) -> Any:
                before = history(dec)
                after = None if before is None else before + ((int(arg),) if single else tuple(arg))
                t0 = time.perf_counter()
                try:
                    return orig(dec, arg, **kwargs)
                finally:
                    dt = time.perf_counter() - t0
                    seen = (id(dec.model), after)
                    if after is not None and seen in timers._seen and not timers._exempt:
                        timers.repeated += dt
                        timers.repeats += 1
                    else:
                        timers._seen.add(seen)
                        timers.seconds += dt
                        timers.calls += 1
                    dec.__dict__[key] = (dec.cache, after)
            return timed

        orig_fork = decoder.fork

        @functools.wraps(orig_fork)
        def fork(dec: Any) -> Any:
            other = orig_fork(dec)
            other.__dict__[key] = (other.cache, history(dec))
            return other

        for name, fn in (("forward", tracked(decoder.forward, False)), ("step", tracked(decoder.step, True)),
                         ("fork", fork)):
            self._undo.append((decoder, name, getattr(decoder, name)))
            setattr(decoder, name, fn)

    def undo(self) -> None:
        for owner, name, orig in reversed(self._undo):
            setattr(owner, name, orig)
        self._undo.clear()


def served_runs(job: Any, runs: int, work: Any, label: str) -> tuple[list[float], list[float], list[float], Any]:
    """Run the served ``job`` ``runs`` times under ``work``: (walls, the servers' own seconds, the classic
    reference's seconds (its loads and decoding), the last run's arms); an arm not ``match`` is said, timed anyway."""
    from pathlib import Path

    from specparity.harness.run import ServedRun

    walls, servers, refs = [], [], []
    arms: Any = []
    for i in range(runs):
        t0 = time.perf_counter()
        report = ServedRun(job, workdir=Path(work) / f"run{i}").run()
        walls.append(time.perf_counter() - t0)
        servers.append(report.server_seconds())
        cost = report.pairings[0].reference_cost or {}
        refs.append(float(cost.get("seconds") or 0.0) + float(cost.get("load_seconds") or 0.0))
        arms = report.pairings[0].arms
        bad = [f"{a.name} {a.verdict}" for a in arms if a.verdict != "match"]
        if bad:
            print(f"{label}: run {i + 1} arms not match: {bad} (timed anyway)", flush=True)
    return walls, servers, refs, arms
