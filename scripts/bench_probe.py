"""Probe overhead per forward, the reproducibility bracket's cost, gate-hit and --help latency.

One (W, D) cell on one prompt. Both sides' model calls are counted (the
model's ``__call__`` wrapped, in a run of its own so counting costs no timed
time) and printed with their row counts:

- probe: prefill, D + W chain steps, the bracket's W repeated chain steps
  (the probe always runs them: the reproducibility bracket), one W-row block;
- bare: the same forwards as plain mlx-lm calls without the bracket (prefill,
  D + W chain steps with classic decode's greedy sampler over logprobs, as
  mlx-lm's generate_step runs it, one W-row block), no copies, comparisons or
  bookkeeping.

The main figure is time per forward (probe) / time per forward (bare), goal
<= 1.05, as the median over ``--reps`` interleaved pairs (each probe run against
the bare run just before it, so both see the same machine) with its
interquartile range; the best of each side is printed beside it. The bracket's
cost is its own line: its W forwards, timed bare from a copy of the depth-D
state; probe / (bare + bracket) compares the same forwards. The spread line
gives best, median and worst of each side.

Usage: .venv/bin/python -P scripts/bench_probe.py [--width 8] [--depth 32] [--reps 25] [--model DIR]
       [--prompt-len 32]
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

GOAL = 1.05


@contextmanager
def counting_forwards(model: Any) -> Iterator[collections.Counter[int]]:
    """Count the model's calls by the rows each one feeds (rows -> calls) while inside."""
    cls = type(model)
    own = "__call__" in cls.__dict__
    original = cls.__call__
    rows: collections.Counter[int] = collections.Counter()

    def counted(self: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        rows[int(inputs.shape[-1])] += 1
        return original(self, inputs, *args, **kwargs)

    cls.__call__ = counted
    try:
        yield rows
    finally:
        if own:
            cls.__call__ = original
        else:
            del cls.__call__


def describe(rows: collections.Counter[int]) -> str:
    """``50 forwards (1 x 31 rows, 48 x 1 row, 1 x 8 rows)``."""
    parts = ", ".join(f"{n} x {r} row{'s' if r != 1 else ''}" for r, n in sorted(rows.items(), reverse=True))
    return f"{sum(rows.values())} forwards ({parts})"


def bare_forwards(model: Any, prompt: list[int], depth: int, width: int) -> None:
    """What the probe's cell needs without the bracket: prefill, D + W chain steps, one W-row block."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    model(mx.array(prompt[:-1])[None], cache=cache)
    mx.eval([c.state for c in cache])
    y = prompt[-1]
    toks = []
    for _ in range(depth + width):
        logits = model(mx.array([[y]]), cache=cache)[0, -1]
        # classic decode as mlx-lm runs it: the greedy sampler over logprobs (generate_step)
        y = int(mx.argmax(logits - mx.logsumexp(logits, keepdims=True)))
        toks.append(y)
    for c in cache:
        c.trim(width)
    out = model(mx.array(toks[-width:])[None], cache=cache)
    mx.eval(out)


def depth_state(model: Any, prompt: list[int], depth: int, width: int) -> tuple[list[Any], list[int]]:
    """The cache after prefill and D chain steps, and the W tokens the chain feeds next."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    model(mx.array(prompt[:-1])[None], cache=cache)
    y, toks, state = prompt[-1], [], None
    for step in range(depth + width):
        if step == depth:
            mx.eval([c.state for c in cache])
            state = _copy(cache)
        toks.append(y)
        logits = model(mx.array([[y]]), cache=cache)
        y = int(mx.argmax(logits[0, -1]).item())  # type: ignore[arg-type]
    assert state is not None
    return state, toks[depth:]


def _copy(cache: list[Any]) -> list[Any]:
    from specparity.decode import copy_cache

    return copy_cache(cache)


def bare_bracket(model: Any, state: list[Any], tokens: list[int]) -> None:
    """The bracket's forwards as plain calls: from a copy of the depth-D state, W single-token steps."""
    import mlx.core as mx

    cache = _copy(state)
    for t in tokens:
        logits = model(mx.array([[t]]), cache=cache)
        mx.eval(logits[0, -1], [c.state for c in cache])


def timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=8)
    ap.add_argument("--depth", type=int, default=32)
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--model", default=None, help="checkpoint (default: a llama fixture built here)")
    ap.add_argument("--prompt-len", type=int, default=32, help="prompt tokens (ids 20.. cycling below 400)")
    args = ap.parse_args()
    os.environ.setdefault("SPECPARITY_HOME", tempfile.mkdtemp(prefix="specparity-bench-"))
    from specparity.checkpoint import load_checkpoint
    from specparity.fixtures import build_pair
    from specparity.probes.forward.blockchain import probe_block_vs_chain
    from specparity.probes.gate import gate_check

    home = Path(os.environ["SPECPARITY_HOME"])
    target = args.model or build_pair(home / "bench-llama", arch="llama", with_draft=False).target
    model = load_checkpoint(target).model
    prompt = [20 + i % 380 for i in range(args.prompt_len)]
    W, D = args.width, args.depth

    def probe() -> None:
        report = probe_block_vs_chain(model, [W], [D], [prompt])
        assert report.bracket is not None and report.bracket.reproducible, report.bracket

    def bare() -> None:
        bare_forwards(model, prompt, D, W)

    state, tokens = depth_state(model, prompt, D, W)

    def bracket() -> None:
        bare_bracket(model, state, tokens)

    with counting_forwards(model) as probe_rows:
        probe()
    with counting_forwards(model) as bare_rows:
        bare()
    with counting_forwards(model) as bracket_rows:
        bracket()
    n_probe, n_bare, n_bracket = (sum(r.values()) for r in (probe_rows, bare_rows, bracket_rows))
    assert n_probe == n_bare + n_bracket, (probe_rows, bare_rows, bracket_rows)

    for fn in (bare, probe, bracket):  # warm up
        fn()
    probe_t, bare_t, bracket_t = [], [], []
    for _ in range(args.reps):
        bare_t.append(timed(bare))
        probe_t.append(timed(probe))
        bracket_t.append(timed(bracket))
    # best of the runs: a shared machine only ever adds time, so the minimum is the least disturbed
    p, b, k = (min(x) for x in (probe_t, bare_t, bracket_t))

    def span(ts: list[float]) -> str:
        return f"best {min(ts) * 1e3:.1f}, median {statistics.median(ts) * 1e3:.1f}, worst {max(ts) * 1e3:.1f} ms"

    model_name = args.model or "6-layer llama fixture"
    print(f"cell: W={W}, D={D}, one {len(prompt)}-token prompt, {model_name}; {args.reps} interleaved runs")
    print(f"probe: {describe(probe_rows)}: {p * 1e3:.1f} ms")
    print(f"bare (no bracket): {describe(bare_rows)}: {b * 1e3:.1f} ms")
    print(f"time per forward: probe {p / n_probe * 1e3:.3f} ms, bare {b / n_bare * 1e3:.3f} ms")
    print(f"probe/bare per forward, best of each side: {(p / n_probe) / (b / n_bare):.2f}")
    # each run's probe against the bare run just before it: the pairs share the machine's state
    paired = sorted((pt / n_probe) / (bt / n_bare) for pt, bt in zip(probe_t, bare_t, strict=True))
    q = statistics.quantiles(paired, n=4)
    print(f"probe/bare per forward, paired runs: median {statistics.median(paired):.3f}"
          f" (interquartile {q[0]:.3f}-{q[2]:.3f}, {len(paired)} pairs; goal <= {GOAL})")
    print(f"reproducibility bracket: {describe(bracket_rows)}: {k * 1e3:.1f} ms bare,"
          f" {k / p:.0%} of the probe's wall time")
    print(f"probe/(bare + bracket), the same {n_probe} forwards: {p / (b + k):.2f}")
    print(f"  (spread: probe {span(probe_t)}; bare {span(bare_t)}; bracket {span(bracket_t)})")

    gate_check(target, W, depths=(0,), walk=0)  # fill the store
    hits = []
    for _ in range(50):
        t = time.perf_counter()
        d = gate_check(target, W, depths=(0,), walk=0)
        hits.append(time.perf_counter() - t)
        assert d.hit
    print(f"gate hit wall time in process: {statistics.median(hits) * 1e3:.2f} ms median"
          f" (goal < 5 ms)")

    exe = str(Path(sys.executable).parent / "specparity")
    helps = []
    for _ in range(5):
        t = time.perf_counter()
        subprocess.run([exe, "--help"], capture_output=True, check=True)
        helps.append(time.perf_counter() - t)
    print(f"specparity --help wall time: {statistics.median(helps) * 1e3:.0f} ms median")


if __name__ == "__main__":
    main()
