"""scripts/benchstats.py: the benches' shared statistics and timers (units: no model, no process)."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="module")
def stats(repo_root: Path) -> Any:
    spec = importlib.util.spec_from_file_location("benchstats", repo_root / "scripts" / "benchstats.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_median_ci_is_the_binomial_order_statistics(stats: Any) -> None:
    # n = 25: the 95% interval of the median is the 8th and 18th values (1-based), whatever the values' shape
    xs = [float(i) for i in range(1, 26)]
    assert stats.median_ci(xs) == (13.0, 8.0, 18.0)
    # fewer than 6 values: the whole range
    assert stats.median_ci([3.0, 1.0, 2.0]) == (2.0, 1.0, 3.0)


def test_ratio_verdict_met_missed_or_not_resolved(stats: Any) -> None:
    assert stats.ratio_verdict(0.98, 1.08, 1.1).startswith("met")
    assert stats.ratio_verdict(1.12, 1.3, 1.1).startswith("missed")
    assert stats.ratio_verdict(1.0, 1.2, 1.1).startswith("not resolved")
    line = stats.ratio_line("x_ratio", [1.0] * 10 + [1.05] * 10, 1.1, "cpu")
    assert line.startswith("x_ratio: 1.025 x (95% CI [1.000, 1.050], median of 20 paired runs; cpu)")
    assert line.endswith("met (95% CI within <= 1.1)")
    assert stats.met([1.0] * 10, 1.1) and not stats.met([1.2] * 10, 1.1)


def test_overhead_verdict_resolves_only_within_the_goal(stats: Any) -> None:
    assert "not resolved" in stats.overhead_verdict("x", -0.0325, 0.0155, 0.01)
    assert "resolved, <= 1%" in stats.overhead_verdict("x", -0.0065, 0.0082, 0.01)


def test_pooled_ci_is_the_ratio_of_sums(stats: Any) -> None:
    rows = [(2.0, 1.0), (4.0, 2.0), (6.0, 3.0)]  # a's CPU per token twice b's in every row
    r, lo, hi = stats.pooled_ci(rows, lambda x: (x[0], 1.0), lambda x: (x[1], 1.0))
    assert r == pytest.approx(2.0) and lo == pytest.approx(2.0) and hi == pytest.approx(2.0)


def test_interleaved_rotates_the_order_and_keeps_each_arms_place(stats: Any) -> None:
    calls: list[str] = []

    def arm(name: str) -> Any:
        def run() -> str:
            calls.append(name)
            return name
        return run

    out = stats.interleaved([arm("a"), arm("b")], 4)
    assert out == [["a", "b"]] * 4
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a"]


def test_timers_count_calls_and_a_generators_items_then_undo(stats: Any) -> None:
    class Model:
        def forward(self) -> int:
            time.sleep(0.01)
            return 1

        def stream(self) -> Any:
            for i in range(3):
                time.sleep(0.01)
                yield i

    timers = stats.Timers()
    timers.wrap(Model, "forward")
    timers.wrap(Model, "stream")
    m = Model()
    assert m.forward() == 1
    assert list(m.stream()) == [0, 1, 2]
    assert timers.calls == 2 and timers.seconds >= 0.035  # the generator's time counted per item
    timers.undo()
    before = timers.seconds
    m.forward()
    assert timers.seconds == before and Model.forward.__name__ == "forward"
