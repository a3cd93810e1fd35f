"""scripts/benchstats.py: the benches' shared statistics and timers (units: no checkpoint, no process)."""

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


@pytest.mark.model
def test_distinct_timers_count_a_classic_history_once_per_check_and_the_bracket_always(stats: Any) -> None:
    """wrap_forwards(distinct=True): a classic forward whose token history the check already decoded is timed
    apart (a repeat); a fork carries its history; a decoder whose cache came from elsewhere is never a repeat;
    a new check decodes anew; an exempted call (the bracket) counts however it repeats."""
    from types import SimpleNamespace

    from mlx_lm.models import llama

    from specparity.decode import Decoder, copy_cache

    model = llama.Model(llama.ModelArgs(model_type="llama", hidden_size=32, num_hidden_layers=1,
                                        intermediate_size=64, num_attention_heads=2, rms_norm_eps=1e-5,
                                        vocab_size=64, num_key_value_heads=2))

    class Session:
        def prefill(self, prompt: list[int]) -> None: ...
        def verify(self, tokens: list[int]) -> None: ...
        def rollback(self, accepted: int) -> None: ...

    originals = (Decoder.forward, Decoder.step, Decoder.fork)
    t = stats.Timers()
    t.wrap_forwards(Session, distinct=True)
    try:
        t.new_check()
        a = Decoder(model)
        a.step(a.prefill([1, 2, 3]))  # histories (1, 2) and (1, 2, 3)
        kept = a.fork()
        a.step(5)  # (1, 2, 3, 5)
        assert (t.calls, t.repeats) == (3, 0)
        b = Decoder(model)
        b.prefill([1, 2, 3])
        b.forward([3])
        b.forward([5])
        assert (t.calls, t.repeats) == (3, 3) and t.repeated > 0
        kept.forward([6])  # the fork's history goes on from (1, 2, 3): new
        assert (t.calls, t.repeats) == (4, 3)
        elsewhere = Decoder(model)
        elsewhere.cache = copy_cache(a.cache)
        elsewhere.forward([7])
        assert (t.calls, t.repeats) == (5, 3)
        bracket = SimpleNamespace(run=lambda: Decoder(model).prefill([1, 2, 3]))
        t.exempt(bracket, "run")
        bracket.run()
        assert (t.calls, t.repeats) == (6, 3)
        t.new_check()
        Decoder(model).prefill([1, 2, 3])
        assert (t.calls, t.repeats) == (7, 3)
    finally:
        t.undo()
    assert (Decoder.forward, Decoder.step, Decoder.fork) == originals
