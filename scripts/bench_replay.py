#!/usr/bin/env python3
"""Replay overhead: replay wall time / the forwards it replays, timed bare in the same run.

The replay runs with a trace of every forward and rewind it makes (both
prefills, the classic chain's single steps, the verify blocks, the trims);
the bare arm runs exactly those model calls and trims as plain mlx-lm calls on
fresh caches (the chain's argmax included, as classic decode needs it), without
the replay's comparisons, bookkeeping or offset checks. Best of ``--repeat`` runs each, after a
warm-up. Goal: ratio <= 1.3.

Usage: .venv/bin/python -P scripts/bench_replay.py [--model DIR] [--rounds 140] [--width 4]
Prints one figure per line, ``name: value unit``.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from typing import Any

GOAL = 1.3


def bare(model: Any, prompt: list[int], trace: list, opts: Any) -> float:
    """Run the traced forwards and rewinds as plain mlx-lm calls; returns seconds."""
    import copy

    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

    from specparity.decode import greedy_token

    def fwd(cache: list, tokens: list[int]) -> Any:
        logits = model(mx.array(tokens, dtype=mx.uint32)[None], cache=cache)[0]
        mx.eval(logits, [c.state for c in cache])
        return logits

    t0 = time.perf_counter()
    chain, target = make_prompt_cache(model), make_prompt_cache(model)
    step = opts.prefill_step_size
    for cache in (chain, target):
        rest = prompt
        while len(rest) > 1:
            n = min(step, len(rest) - 1)
            fwd(cache, rest[:n])
            rest = rest[n:]
    saved = None
    for op in trace:
        kind = op[0]
        if kind == "chain":
            y = op[1]
            for _ in range(op[2]):
                y = greedy_token(fwd(chain, [y])[-1])
        elif kind == "block":
            fwd(target, op[1])
        elif kind == "trim":
            trim_prompt_cache(target, op[1])
        elif kind == "fork":
            saved = copy.deepcopy(target)
        elif kind == "restore":
            assert saved is not None
            target = saved
            fwd(target, op[1])
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="checkpoint (default: the embedded fixture)")
    ap.add_argument("--rounds", type=int, default=140)
    ap.add_argument("--width", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from specparity.checkpoint import load_checkpoint
    from specparity.decode import CacheOptions
    from specparity.fixtures import default_pair
    from specparity.probes.replay.core import replay

    model = load_checkpoint(args.model or default_pair().target).model
    rng = random.Random(args.seed)
    accepts = [rng.randrange(args.width) for _ in range(args.rounds)]
    prompt = list(range(20, 36))
    opts = CacheOptions()

    replay(model, prompt, accepts[:8], width=args.width)  # warm-up
    replay_times, bare_times = [], []
    report = None
    for _ in range(args.repeat):
        trace: list = []
        t0 = time.perf_counter()
        report = replay(model, prompt, accepts, width=args.width, trace=trace)
        replay_times.append(time.perf_counter() - t0)
        bare_times.append(bare(model, prompt, trace, opts))
    assert report is not None
    chain_steps = sum(op[2] for op in trace if op[0] == "chain")
    blocks = sum(1 for op in trace if op[0] in ("block", "restore"))
    r, b = min(replay_times), min(bare_times)
    print(f"replay_rounds: {report.rounds} rounds")
    print(f"replay_rewinds: {report.rewinds} rewinds")
    print(f"replay_positions: {report.positions} positions")
    print(f"replay_forwards: {chain_steps + blocks + 2} forwards")
    print(f"replay_wall_time: {r:.4f} s")
    print(f"bare_forwards_time: {b:.4f} s")
    print(f"replay_over_bare: {r / b:.3f} ratio (goal <= {GOAL})")
    print(f"replay_disagreements: {report.disagreements} positions")
    return 0 if r / b <= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
