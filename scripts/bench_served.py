#!/usr/bin/env python3
"""Served job overhead, and what the classic reference adds to it.

Runs the built-in job (what ``specparity served`` runs without --config: the
embedded pair on real mlx_lm.server processes, two baselines, widths 2 and 4,
self-draft, the sequence sent 3 at once, every request kind) with and without
the classic reference (every completion also judged against classic decode
computed in process, cold answers and reproductions included), alternating the
two so machine load falls on both alike:

- served_overhead_ratio: the job's wall time (without the reference) / what
  its servers themselves took: start-up (spawn to the first 200 on /health)
  plus the wall time of every request. Whatever else the harness does (witness
  wrapping, evidence, comparison, stopping servers) is the overhead. Goal <= 1.15.
- reference_job_ratio: the job's wall time with the reference / without it
  (median of the runs). Goal <= 1.2.
- the reference's own cost: its decode seconds / the tokens it generated, and
  its model load, as the record reports them (scripts/bench_reference.py has
  the reference's time over the bare generate_step it needs).

Usage: .venv/bin/python -P scripts/bench_served.py [--runs 3]
Prints one figure per line, ``name: value unit``.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time

GOAL = 1.15
REFERENCE_GOAL = 1.2


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()

    from specparity.harness.config import builtin_job
    from specparity.harness.run import ServedRun

    walls: dict[bool, list[float]] = {False: [], True: []}
    overheads: list[float] = []
    costs = []
    for _ in range(args.runs):
        for reference in (False, True):
            job = dataclasses.replace(builtin_job(), reference=reference)
            with tempfile.TemporaryDirectory() as work:
                t0 = time.perf_counter()
                report = ServedRun(job, workdir=work).run()
                wall = time.perf_counter() - t0
            walls[reference].append(wall)
            if not reference:
                overheads.append(wall / report.server_seconds())
            elif report.pairings[0].reference_cost:
                costs.append(report.pairings[0].reference_cost)
    arms = report.pairings[0].arms
    print(f"served_arms: {len(arms)} servers, {sum(len(a.requests) for a in arms)} requests, {args.runs} runs each way")
    print(f"served_job_wall: {statistics.median(walls[False]):.2f} s without the reference,"
          f" {statistics.median(walls[True]):.2f} s with it (medians; runs {[round(w, 1) for w in walls[False]]}"
          f" / {[round(w, 1) for w in walls[True]]})")
    print(f"served_overhead_ratio: {statistics.median(overheads):.3f} (goal <= {GOAL};"
          f" spread {min(overheads):.3f}-{max(overheads):.3f})")
    ratios = [w / wo for w, wo in zip(walls[True], walls[False])]
    print(f"reference_job_ratio: {statistics.median(ratios):.3f} (goal <= {REFERENCE_GOAL};"
          f" spread {min(ratios):.3f}-{max(ratios):.3f})")
    if costs:
        c = costs[-1]
        print(f"reference_cost: {c['computed']} distinct requests decoded ({c['tokens']} tokens) in"
              f" {c['seconds']:.2f} s, model load {c['load_seconds']:.2f} s, {c['hits']} answers from its cache;"
              f" {c.get('cold', 0)} cold answers ({c.get('cold_tokens', 0)} tokens) in"
              f" {c.get('cold_seconds', 0.0):.2f} s")


if __name__ == "__main__":
    main()
