#!/usr/bin/env python3
"""How each command's time and memory grow with model size (issue 29).

For each size (the embedded fixture pair, and random-weight checkpoints in the
dimensions of real small models built by ``specparity.fixtures.build_sized``,
once, into the fixtures home):

- served_memory_ratio: a served job's peak memory over all its processes (the
  harness included, sampled from /proc or ps) / its largest server's peak RSS.
  Goal <= 1.1 (the classic reference never beside a server's copy).
- probe_memory_ratio: ``specparity probe``'s peak RSS / a bare
  ``mlx_lm.load`` of the same checkpoint (both ru_maxrss of a child). Goal <= 1.1.
- served_overhead_ratio: the served job's wall time / its servers' own time.
- probe_over_bare: bench_probe.py's paired time per forward, probe / bare.
- reference_over_generation: bench_reference.py's CPU ratio, reference / bare generate_step.

Each figure is the median of ``--runs`` runs with its spread (min-max). The
default sizes are the embedded pair and a 0.5B-class llama; ``--sizes
llama-1.5b,qwen3-1.7b`` adds the larger ones (minutes each to build and run).
Checkpoints are 4-bit (group size 64, as ``mlx_lm.convert -q``) where mlx runs
on a GPU; on a CPU (no Metal: mlx's quantized matmul there is slow) they are
float32 unless ``--bits 4`` is given.

Usage: .venv/bin/python -P scripts/bench_sizes.py [--sizes tiny,llama-0.5b] [--runs 2] [--bits 4|none]
       [--no-time]
Prints one figure per line, ``name: value unit``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL = 1.1
JOB = {"widths": [2], "max_tokens": 4, "sequence": ["fresh", "repeat"], "concurrency": 0, "self_draft": False,
       "prompts": ["The quick brown fox jumps over the lazy dog."]}
HERE = Path(__file__).resolve().parent
PY = sys.executable
CLI = str(Path(sys.executable).parent / "specparity")


def child_peak(argv: list[str], env: dict[str, str] | None = None) -> tuple[int, int, float, str]:
    """Run ``argv``; (exit code, its peak RSS in bytes, wall seconds, stdout)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.DEVNULL, env={**os.environ, **(env or {})},
                                cwd=tempfile.gettempdir())
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read().decode(errors="replace")
    peak = usage.ru_maxrss if sys.platform == "darwin" else usage.ru_maxrss * 1024
    return proc.returncode, peak, time.perf_counter() - t0, text


def spread(xs: list[float], unit: str = "") -> str:
    return f"{statistics.median(xs):.3f}{unit} (spread {min(xs):.3f}-{max(xs):.3f}, {len(xs)} runs)"


def checkpoint(size: str, dtype: str, bits: int | None) -> tuple[str, str | None]:
    from specparity.fixtures import build_sized, default_pair, fixtures_home

    if size == "tiny":
        pair = default_pair()
        return pair.target, pair.draft
    info = build_sized(fixtures_home() / "sized" / f"{size}-{dtype}-{bits or 'full'}", size, dtype=dtype, bits=bits)
    return info.target, info.draft


def figure(script: str, args: list[str], pattern: str) -> float | None:
    out = subprocess.run([PY, "-P", str(HERE / script), *args], capture_output=True, text=True, check=False,
                         cwd=tempfile.gettempdir()).stdout
    m = re.search(pattern, out)
    return float(m.group(1)) if m else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="tiny,llama-0.5b")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--bits", default=None, help="4, 8 or none (default: 4 on a GPU, none on a CPU)")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on a GPU, float32 on a CPU")
    ap.add_argument("--no-time", dest="time", action="store_false", help="memory figures only")
    args = ap.parse_args()
    from specparity.harness.memory import checkpoint_bytes, fmt
    from specparity.identity import device

    gpu = device() == "gpu"
    bits = (4 if gpu else None) if args.bits is None else (None if args.bits == "none" else int(args.bits))
    dtype = args.dtype or ("bfloat16" if gpu else "float32")
    print(f"device: {device()}; sized checkpoints {dtype}, {f'{bits}-bit' if bits else 'not quantized'}")
    work = Path(tempfile.mkdtemp(prefix="specparity-bench-sizes-"))
    (work / "job.yaml").write_text(json.dumps(JOB))
    for size in args.sizes.split(","):
        target, draft = checkpoint(size, dtype, bits)
        print(f"== {size}: {fmt(checkpoint_bytes(target))} target weights, {fmt(checkpoint_bytes(draft))} drafter")
        served_ratio, overhead, probe_ratio, extra, peaks = [], [], [], [], []
        worst: dict = {}
        for i in range(args.runs):
            code, _, wall, text = child_peak([CLI, "served", "--config", str(work / "job.yaml"), "--model", target,
                                              "--draft-model", str(draft), "--json", "-q"],
                                             None)
            try:
                report = json.loads(text)
            except ValueError:
                print(f"served run {i}: no report (exit {code})")
                continue
            mem = report["pairings"][0]["memory"]
            served_ratio.append(mem["peak_total_bytes"] / mem["largest_server_bytes"])
            if served_ratio[-1] == max(served_ratio):
                worst = mem.get("at_peak") or {}
            extra.append((mem["peak_total_bytes"] - mem["largest_server_bytes"]) / 2**20)
            overhead.append(report["wall_seconds"] / report["server_seconds"])
            probe = [CLI, "probe", "--model", target, "--widths", "2", "--depths", "0", "--walk", "0", "--no-aim",
                     "--no-prefill", "--json", "-q"]
            _, p_peak, _, _ = child_peak(probe, None)
            _, b_peak, _, _ = child_peak([PY, "-P", "-c", f"import mlx_lm; mlx_lm.load({target!r})"])
            probe_ratio.append(p_peak / b_peak)
            peaks.append(f"{p_peak / 2**20:.0f}/{b_peak / 2**20:.0f} MB")
        if served_ratio:
            print(f"served_memory_ratio: {spread(served_ratio)} (goal <= {GOAL}); above the largest server:"
                  f" {spread(extra, ' MB')}")
            print(f"served_overhead_ratio: {spread(overhead)} (wall / servers' own time)")
            print("served_at_peak (the worst run): " + ", ".join(f"{k} {v / 2**20:.0f} MB" for k, v in worst.items()))
        if probe_ratio:
            print(f"probe_memory_ratio: {spread(probe_ratio)} (goal <= {GOAL}; probe/bare peak RSS {', '.join(peaks)})")
        if args.time:
            reps = [figure("bench_probe.py", ["--model", target, "--reps", "5", "--depth", "8", "--width", "4"],
                           r"paired runs: median ([0-9.]+)") for _ in range(args.runs)]
            got = [r for r in reps if r is not None]
            if got:
                print(f"probe_over_bare: {spread(got)} (time per forward)")
            refs = [figure("bench_reference.py", ["--model", target, "--repeat", "2", "--max-tokens", "16"],
                           r"reference_over_generation_cpu: ([0-9.]+)") for _ in range(args.runs)]
            got = [r for r in refs if r is not None]
            if got:
                print(f"reference_over_generation: {spread(got)} (cpu time)")


if __name__ == "__main__":
    main()
