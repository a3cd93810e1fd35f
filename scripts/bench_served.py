#!/usr/bin/env python3
"""Served job overhead: job wall time / the sum of its servers' own start-up and generation time.

Runs a small sequential served job on the embedded pair (baseline x2 and two
widths on real mlx_lm.server processes) and divides the job's wall time by
what the servers themselves took: start-up (spawn to the first 200 on
/health) plus the wall time of every request. Whatever else the harness
does (witness wrapping, evidence, comparison, stopping servers, records)
is the overhead. Goal: ratio <= 1.15.

Usage: .venv/bin/python -P scripts/bench_served.py [--widths 2,4] [--max-tokens 32]
Prints one figure per line, ``name: value unit``.
"""

from __future__ import annotations

import argparse
import tempfile
import time

GOAL = 1.15


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--widths", default="2,4")
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()

    from specparity.harness.config import Job, Pairing
    from specparity.harness.run import ServedRun

    from specparity.fixtures import default_pair

    pair = default_pair()
    job = Job(pairings=[Pairing("bench", pair.target, pair.draft)],
              widths=[int(w) for w in args.widths.split(",")], max_tokens=args.max_tokens)
    with tempfile.TemporaryDirectory() as work:
        t0 = time.perf_counter()
        report = ServedRun(job, workdir=work).run()
        wall = time.perf_counter() - t0
    servers = report.server_seconds()
    arms = report.pairings[0].arms
    print(f"served_arms: {len(arms)} servers, {sum(len(a.requests) for a in arms)} requests")
    print(f"served_job_wall: {wall:.2f} s")
    print(f"served_server_time: {servers:.2f} s (start-up "
          f"{sum(a.server.get('start_seconds') or 0 for a in arms):.2f} + generation "
          f"{sum(a.generation_seconds for a in arms):.2f})")
    print(f"served_overhead_ratio: {wall / servers:.3f} (goal <= {GOAL})")


if __name__ == "__main__":
    main()
