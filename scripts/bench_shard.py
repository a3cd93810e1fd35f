#!/usr/bin/env python3
"""Sharding's wall time: ``served --shard 1/2`` and ``2/2`` run side by side vs the same job unsharded.

Runs one small served job on the embedded pair (real mlx_lm.server
processes) through the CLI, once unsharded, then as its two shards started
together, then merges the shards and checks the merge has the unsharded
verdict. Each shard also runs the baselines its arms need, so two shards do
more work in all than one run: the ratio says what that buys on this
machine's cores (on 2 cores the servers of both shards share them).
One run of each, no repeats.

Usage: .venv/bin/python -P scripts/bench_shard.py [--widths 2,3,4,5] [--max-tokens 32]
Prints one figure per line, ``name: value unit``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--widths", default="2,3,4,5")
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()

    from specparity.fixtures import default_pair
    from specparity.tied import run_tied_captured

    pair = default_pair()
    cli = str(Path(sys.executable).parent / "specparity")
    with tempfile.TemporaryDirectory() as work:
        cfg = Path(work) / "job.json"
        cfg.write_text(json.dumps({"widths": [int(w) for w in args.widths.split(",")],
                                   "max_tokens": args.max_tokens, "sequence": ["fresh", "multi-turn"],
                                   "concurrency": 0, "self_draft": False}))
        base = [cli, "served", "--config", str(cfg), "--model", str(pair.target), "--draft-model", str(pair.draft),
                "-q", "--json"]

        def run(out: str, *extra: str) -> str:
            # tied: a served run (its servers and workers) ends with this bench, however it ends
            return run_tied_captured([*base, "--record-dir", str(Path(work) / out), *extra], f"served {out}",
                                     env=os.environ).stdout

        t0 = time.perf_counter()
        full_out = run("full")
        unsharded = time.perf_counter() - t0
        t0 = time.perf_counter()
        with ThreadPoolExecutor(2) as pool:  # the two shards at once
            list(pool.map(lambda i: run(f"s{i}", "--shard", f"{i}/2"), (1, 2)))
        sharded = time.perf_counter() - t0
        merged = run_tied_captured([cli, "records", "merge", str(Path(work) / "s1"), str(Path(work) / "s2"),
                                    "--out", str(Path(work) / "merged"), "--json"], "records merge")
        same = json.loads(merged.stdout)["verdict"] == json.loads(full_out)["verdict"]
    print(f"cores: {os.cpu_count()} count")
    print(f"unsharded_wall: {unsharded:.2f} s")
    print(f"two_shards_in_parallel_wall: {sharded:.2f} s")
    print(f"parallel_shards_over_unsharded: {sharded / unsharded:.3f} ratio")
    print(f"merged_verdict_equals_unsharded: {same}")


if __name__ == "__main__":
    main()
