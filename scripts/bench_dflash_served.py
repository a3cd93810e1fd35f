#!/usr/bin/env python3
"""Served dflash-mlx job overhead: job wall time / its servers' own start-up and generation time.

Runs a small served job on a DFlash pair (qwen3 target, block-8 DFlash drafter)
with the dflash-mlx profile: dflash serve from its pinned environment, the
target-only baseline twice and two pinned widths, the default request sequence.
The servers' own time is start-up (spawn to the first 200 on /health) plus the
wall time of every request; everything else (the engine's /metrics and
per-round evidence reads, comparison, stopping servers) is the overhead.
Goal: ratio <= 1.15. Several runs: the median and the spread.

Usage: .venv/bin/python -P scripts/bench_dflash_served.py [--runs 3] [--widths 2,8] [--max-tokens 32]
Prints one figure per line, ``name: value unit``; without the dflash-mlx environment, one
``skipped`` line (scripts/build-env dflash-mlx builds it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run with -P: the shared helpers beside it
from benchstats import served_runs  # noqa: E402

GOAL = 1.15


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--widths", default="2,8")
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()

    from specparity.environments import find_environment
    from specparity.harness.config import Job, Pairing

    env = find_environment("dflash-mlx")
    if env is None:
        print("dflash_served: skipped (environment dflash-mlx is not built: scripts/build-env dflash-mlx)")
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from dflash_pairs import dflash_fixture  # the one place the DFlash pair comes from

    with tempfile.TemporaryDirectory() as work:
        pair = dflash_fixture(env, "qwen3", 8, work=Path(work))
        job = Job(pairings=[Pairing("bench", pair["target"], pair["draft"], "dflash-mlx")],
                  widths=[int(w) for w in args.widths.split(",")], max_tokens=args.max_tokens)
        walls, servers, _, arms = served_runs(job, args.runs, work, "dflash_served")
    ratios = [w / o for w, o in zip(walls, servers, strict=True)]
    print(f"dflash_served_pair: {pair['target']} (fitted drafter: {pair.get('fitted')})")
    print(f"dflash_served_arms: {len(arms)} servers, {sum(len(a.requests) for a in arms)} requests per run,"
          f" {args.runs} runs")
    print(f"dflash_served_job_wall: {statistics.median(walls):.2f} s median ({min(walls):.2f}-{max(walls):.2f})")
    print(f"dflash_served_server_time: {statistics.median(servers):.2f} s median (start-up + generation)")
    print(f"dflash_served_overhead_ratio: {statistics.median(ratios):.3f} median, {min(ratios):.3f}-"
          f"{max(ratios):.3f} over {args.runs} runs (goal <= {GOAL})")


if __name__ == "__main__":
    main()
