#!/usr/bin/env python3
"""In-process dflash-mlx checks: their wall time / the engine and classic forwards they need.

The checks are what ``probe --engine dflash-mlx`` and ``replay --engine
dflash-mlx`` run: block vs chain and every rollback per width (from copies of
classic decode's state), the engine's prefill, the engine's own loop on each
prompt recorded round by round (state after every rollback), walked against
classic decode, and its accept vector replayed through the engine. The
forwards they need are timed where they happen: every classic decode step, every engine
prefill, verify block and rollback the checks call, plus the engine's own loop
run bare (``stream_dflash_generate``, nothing recorded) on the same prompts.
Everything else (copies, snapshots, byte comparisons, bookkeeping) is the
checks' overhead. Best of ``--repeat`` runs after a warm-up. Goal: ratio <= 1.2.

Runs where dflash-mlx imports; otherwise in its environment (specparity.engine_env),
or says it was skipped.

Usage: .venv/bin/python -P scripts/bench_dflash.py [--max-tokens 64] [--prompts 3] [--repeat 3]
Prints one figure per line, ``name: value unit``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run with -P: the shared helpers beside it
from benchstats import Timers  # noqa: E402

GOAL = 1.2


def bare_loop(engine: Any, prompts: list[list[int]], max_tokens: int) -> float:
    """The engine's own loop on each prompt, nothing recorded; seconds."""
    from dflash_mlx.runtime import stream_dflash_generate

    b = engine.bundle
    t0 = time.perf_counter()
    for p in prompts:
        for _ in stream_dflash_generate(
                target_model=b.target_model, target_ops=engine.target_ops, tokenizer=b.tokenizer,
                draft_model=b.draft_model, draft_backend=b.draft_backend, prompt="", prompt_tokens_override=p,
                max_new_tokens=max_tokens, stop_token_ids=[], runtime_context=engine.runtime_context):
            pass
    return time.perf_counter() - t0


def checks(engine: Any, prompts: list[list[int]], max_tokens: int) -> Callable[[], Any]:
    from specparity.probes.forward.engine import probe_engine
    from specparity.probes.replay.engine import check_engine_run

    def run() -> Any:
        out: list[Any] = [probe_engine(engine, engine.info.widths, [0, 8], prompts)]
        for p in prompts:
            out.append(check_engine_run(engine, engine.generate(p, max_tokens)))
        return out

    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    from specparity.probes.engines.dflash_mlx import available

    if not available():
        import os

        from specparity.engine_env import RERUN_MARK, engine_environment
        from specparity.errors import SpecparityError

        if os.environ.get(RERUN_MARK):
            print("dflash_checks: skipped (dflash-mlx does not import in its environment)")
            return 0
        try:
            python, environ = engine_environment("dflash-mlx")
        except SpecparityError as err:
            print(f"dflash_checks: skipped ({err})")
            return 0
        from specparity.tied import run_tied

        # tied: the re-run in dflash-mlx's environment ends with this bench, however it ends
        return run_tied([python, "-P", __file__, *sys.argv[1:]], "bench_dflash in dflash-mlx's environment",
                        env={**environ, RERUN_MARK: "dflash-mlx"})

    from specparity.dflash_fixtures import dflash_pair
    from specparity.probes.engines.dflash_mlx import DflashEngine, DflashSession

    info = dflash_pair("qwen3_5-equal-heads", 8, "float32", tied=True)
    engine = DflashEngine(info.target, info.draft, verify_mode="dflash")
    prompts = info.fit_prompts[: args.prompts]
    run = checks(engine, prompts, args.max_tokens)
    run()  # warm-up
    best: tuple[float, float, float, int] | None = None
    for _ in range(args.repeat):
        timers = Timers()
        timers.wrap_forwards(DflashSession)
        t0 = time.perf_counter()
        try:
            run()
        finally:
            timers.undo()
        wall = time.perf_counter() - t0
        loop = bare_loop(engine, prompts, args.max_tokens)
        ratio = wall / (timers.seconds + loop)
        if best is None or ratio < best[0]:
            best = (ratio, wall, timers.seconds + loop, timers.calls)
    assert best is not None
    ratio, wall, needed, calls = best
    print(f"dflash_checks_wall: {wall:.2f} s ({len(prompts)} prompts, {args.max_tokens} tokens each,"
          f" probe widths {engine.info.widths} depths 0,8 with every rollback)")
    print(f"dflash_checks_forwards: {needed:.2f} s ({calls} engine and classic forwards timed in the run,"
          " plus the engine's own loop bare)")
    print(f"dflash_checks_ratio: {ratio:.3f} x (goal <= {GOAL})")
    return 0 if ratio <= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
