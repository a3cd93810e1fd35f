#!/usr/bin/env python3
"""Served job overhead, and what the classic reference adds to it.

Runs a small sequential served job on the embedded pair (baseline x2 and two
widths on real mlx_lm.server processes), with and without the classic
reference (every completion also judged against classic decode computed in
process), alternating the two so machine load falls on both alike:

- served_overhead_ratio: the job's wall time (without the reference) / what
  its servers themselves took: start-up (spawn to the first 200 on /health)
  plus the wall time of every request. Whatever else the harness does (witness
  wrapping, evidence, comparison, stopping servers) is the overhead. Goal <= 1.15.
- reference_job_ratio: the job's wall time with the reference / without it
  (median of the runs). Goal <= 1.2.
- the reference's own cost: its decode seconds / the tokens it generated, and
  its model load, as the record reports them (scripts/bench_reference.py has
  the reference's time over the bare generate_step it needs).

Usage: .venv/bin/python -P scripts/bench_served.py [--widths 2,4] [--max-tokens 32] [--runs 3]
Prints one figure per line, ``name: value unit``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

GOAL = 1.15
REFERENCE_GOAL = 1.2


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--widths", default="2,4")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()

    from specparity.fixtures import default_pair
    from specparity.harness.config import Job, Pairing
    from specparity.harness.run import ServedRun

    pair = default_pair()
    walls: dict[bool, list[float]] = {False: [], True: []}
    overheads: list[float] = []
    costs = []
    for _ in range(args.runs):
        for reference in (False, True):
            job = Job(pairings=[Pairing("bench", pair.target, pair.draft)], reference=reference,
                      widths=[int(w) for w in args.widths.split(",")], max_tokens=args.max_tokens)
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
              f" {c['seconds']:.2f} s, model load {c['load_seconds']:.2f} s, {c['hits']} answers from its cache")


if __name__ == "__main__":
    main()
