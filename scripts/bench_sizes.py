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
- served_overhead_ratio: the served job's wall time / its servers' own time (start-up + generation).
  Goal <= 1.2 (issue 49). ``--job small`` (default): three servers (baseline, width 2, baseline) answering
  one prompt fresh and again, 4 tokens: the classic reference's one load and one decode weigh most here.
  ``--job default``: the job ``served --model T --draft-model D --widths 2,4`` runs (its six arms and its
  request sequence, multi-turn and concurrent included) with 4 tokens instead of 32 (about 10 minutes a
  run at llama-0.5b on two CPU cores).
- served_time[phase]: where the served job's wall time went (the record's ``time``, harness.timing),
  seconds per phase, median of the runs with its spread: servers' start-up, generation, evidence reads,
  servers' stops, the classic reference's load, decode and cold answers, judging, and the rest.
- probe_over_bare: bench_probe.py's paired time per forward, probe / bare.
- reference_over_generation: bench_reference.py's ratio, reference / bare
  generate_step (CPU time), the median of ``--reference-repeat`` interleaved
  paired runs with its 95% CI, at every size.

Each memory and served figure is the median of ``--runs`` runs with its spread
(min-max). The default sizes are the embedded pair and a 0.5B-class llama;
``--sizes tiny,llama-0.5b,llama-1.5b`` (or ``qwen3-1.7b``) adds a 1.5B-class one
(``specparity fixtures make --size``; minutes each to build and run on a CPU).

How time grows with prompt length, max_tokens and width (``--grid``): from a base
cell (the prompt once, 4 tokens, width 2; for the probe a 32-token prompt, depth
8), one axis changed at a time, one line per cell: the served job's wall, its
servers' own time and their ratio; the reference / generate_step ratio (prompt
and max_tokens: it has no width); the probe / bare time per forward (prompt
tokens, depth, width). ``--grid small`` (the default) changes each axis once
(prompt x8, 32 tokens, width 4; probe: 256-token prompt, depth 32, width 4) on
the first size only; ``--grid large`` adds prompt x32, 128 tokens and width 8;
``--grid-sizes all`` runs the grid at every size; ``--grid none`` skips it.
Checkpoints are 4-bit (group size 64, as ``mlx_lm.convert -q``) where mlx runs
on a GPU; on a CPU (no Metal: mlx's quantized matmul there is slow) they are
float32 unless ``--bits 4`` is given.

Usage: .venv/bin/python -P scripts/bench_sizes.py [--sizes tiny,llama-0.5b] [--runs 2] [--bits 4|none]
       [--no-time] [--reference-repeat 6] [--grid none|small|large] [--grid-sizes first|all] [--job small|default]
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

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run with -P: the shared statistics beside it
from benchstats import ratio_verdict  # noqa: E402

GOAL = 1.1
TIME_GOAL = 1.2
JOB = {"widths": [2], "max_tokens": 4, "sequence": ["fresh", "repeat"], "concurrency": 0, "self_draft": False,
       "prompts": ["The quick brown fox jumps over the lazy dog."]}
DEFAULT_JOB_TOKENS = 4  # --job default: the default job's arms and requests, 4 tokens where it has 32
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
    m = figures(script, args, pattern)
    return float(m[0]) if m else None


def figures(script: str, args: list[str], pattern: str) -> tuple[str, ...] | None:
    """The groups of ``pattern`` in the output of ``script ARGS`` (None: no match, the bench failed)."""
    out = subprocess.run([PY, "-P", str(HERE / script), *args], capture_output=True, text=True, check=False,
                         cwd=tempfile.gettempdir()).stdout
    m = re.search(pattern, out)
    return m.groups() if m else None


REF_CPU = r"reference_over_generation_cpu: ([0-9.]+) x \(95% CI \[([0-9.]+), ([0-9.]+)\]"
PROBE = r"paired runs: median ([0-9.]+)"
BASE_PROMPT = "The quick brown fox jumps over the lazy dog."  # JOB's one prompt
# axis: (the base value, the small grid's value, the large grid's further value)
GRID = {"prompt": (1, 8, 32), "max_tokens": (4, 32, 128), "width": (2, 4, 8)}
PROBE_GRID = {"prompt-len": (32, 256, 1024), "depth": (8, 32, 128), "width": (2, 4, 8)}


def cells(grid: dict[str, tuple[int, int, int]], large: bool) -> list[dict[str, int]]:
    """The base cell, then each axis changed alone (to the small value, and the large one with ``large``)."""
    base = {k: v[0] for k, v in grid.items()}
    out = [base]
    for k, v in grid.items():
        for x in v[1:3] if large else v[1:2]:
            out.append({**base, k: x})
    return out


def served_cell(work: Path, target: str, draft: str | None, cell: dict[str, int]) -> str:
    job = {**JOB, "prompts": [" ".join([BASE_PROMPT] * cell["prompt"])], "max_tokens": cell["max_tokens"],
           "widths": [cell["width"]]}
    path = work / "grid-job.yaml"
    path.write_text(json.dumps(job))
    code, _, _, text = child_peak([CLI, "served", "--config", str(path), "--model", target, "--draft-model",
                                   str(draft), "--json", "-q"])
    try:
        report = json.loads(text)
    except ValueError:
        return f"no report (exit {code})"
    wall, own = report["wall_seconds"], report["server_seconds"]
    return f"{wall / own:.3f} x (wall {wall:.1f} s / servers {own:.1f} s)"


def grid(work: Path, size: str, target: str, draft: str | None, large: bool) -> None:
    """One line per cell: how each command's time grows along each axis (see the module docstring)."""
    def name(cell: dict[str, int]) -> str:
        return ",".join(f"{k}={v}" for k, v in cell.items())

    for cell in cells(GRID, large):
        print(f"grid_served[{size};{name(cell)}]: {served_cell(work, target, draft, cell)}", flush=True)
    for cell in cells({k: GRID[k] for k in ("prompt", "max_tokens")}, large):
        got = figures("bench_reference.py", ["--model", target, "--repeat", "6", "--max-tokens",
                                             str(cell["max_tokens"]), "--prompt-scale", str(cell["prompt"])],
                      REF_CPU)
        print(f"grid_reference[{size};{name(cell)}]: "
              + (f"{got[0]} x cpu (95% CI [{got[1]}, {got[2]}], 6 paired runs)" if got else "the bench failed"),
              flush=True)
    for cell in cells(PROBE_GRID, large):
        ratio = figure("bench_probe.py", ["--model", target, "--reps", "5", "--prompt-len", str(cell["prompt-len"]),
                                          "--depth", str(cell["depth"]), "--width", str(cell["width"])], PROBE)
        print(f"grid_probe[{size};{name(cell)}]: "
              + (f"{ratio:.3f} x per forward (median of 5 paired runs)" if ratio is not None else "the bench failed"),
              flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="tiny,llama-0.5b")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--bits", default=None, help="4, 8 or none (default: 4 on a GPU, none on a CPU)")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on a GPU, float32 on a CPU")
    ap.add_argument("--no-time", dest="time", action="store_false", help="memory figures only")
    ap.add_argument("--reference-repeat", type=int, default=6, help="bench_reference's paired runs per size")
    ap.add_argument("--grid", choices=("none", "small", "large"), default="small")
    ap.add_argument("--grid-sizes", choices=("first", "all"), default="first")
    ap.add_argument("--job", choices=("small", "default"), default="small",
                    help="the served job measured (see the module docstring)")
    args = ap.parse_args()
    from specparity.harness.memory import checkpoint_bytes, fmt
    from specparity.identity import device

    gpu = device() == "gpu"
    bits = (4 if gpu else None) if args.bits is None else (None if args.bits == "none" else int(args.bits))
    dtype = args.dtype or ("bfloat16" if gpu else "float32")
    print(f"device: {device()}; sized checkpoints {dtype}, {f'{bits}-bit' if bits else 'not quantized'}")
    work = Path(tempfile.mkdtemp(prefix="specparity-bench-sizes-"))
    (work / "job.yaml").write_text(json.dumps(JOB))
    job_args = (["--config", str(work / "job.yaml")] if args.job == "small"
                else ["--widths", "2,4", "--max-tokens", str(DEFAULT_JOB_TOKENS)])
    print(f"served job: {args.job} ({' '.join(job_args) if args.job == 'default' else json.dumps(JOB)})")
    for size in args.sizes.split(","):
        target, draft = checkpoint(size, dtype, bits)
        print(f"== {size}: {fmt(checkpoint_bytes(target))} target weights, {fmt(checkpoint_bytes(draft))} drafter")
        served_ratio, overhead, probe_ratio, extra, peaks = [], [], [], [], []
        phases: dict[str, list[float]] = {}
        worst: dict = {}
        for i in range(args.runs):
            code, _, wall, text = child_peak([CLI, "served", *job_args, "--model", target, "--draft-model", str(draft),
                                              "--json", "-q"], None)
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
            for k, v in (report["pairings"][0].get("time") or {}).items():
                phases.setdefault(k.removesuffix("_s"), []).append(v)
            probe = [CLI, "probe", "--model", target, "--widths", "2", "--depths", "0", "--walk", "0", "--no-aim",
                     "--no-prefill", "--json", "-q"]
            _, p_peak, _, _ = child_peak(probe, None)
            _, b_peak, _, _ = child_peak([PY, "-P", "-c", f"import mlx_lm; mlx_lm.load({target!r})"])
            probe_ratio.append(p_peak / b_peak)
            peaks.append(f"{p_peak / 2**20:.0f}/{b_peak / 2**20:.0f} MB")
        if served_ratio:
            print(f"served_memory_ratio: {spread(served_ratio)} (goal <= {GOAL}); above the largest server:"
                  f" {spread(extra, ' MB')}")
            print(f"served_overhead_ratio: {spread(overhead)} (wall / servers' own time; goal <= {TIME_GOAL})")
            for k, v in phases.items():
                print(f"served_time[{size};{k}]: {spread(v, ' s')}")
            print("served_at_peak (the worst run): " + ", ".join(f"{k} {v / 2**20:.0f} MB" for k, v in worst.items()))
        if probe_ratio:
            print(f"probe_memory_ratio: {spread(probe_ratio)} (goal <= {GOAL}; probe/bare peak RSS {', '.join(peaks)})")
        if args.time:
            reps = [figure("bench_probe.py", ["--model", target, "--reps", "5", "--depth", "8", "--width", "4"],
                           r"paired runs: median ([0-9.]+)") for _ in range(args.runs)]
            got = [r for r in reps if r is not None]
            if got:
                print(f"probe_over_bare: {spread(got)} (time per forward)")
            got_ref = figures("bench_reference.py", ["--model", target, "--repeat", str(args.reference_repeat),
                                                     "--max-tokens", "16"], REF_CPU)
            if got_ref:
                verdict = ratio_verdict(float(got_ref[1]), float(got_ref[2]), GOAL)
                print(f"reference_over_generation: {got_ref[0]} x cpu (95% CI [{got_ref[1]}, {got_ref[2]}],"
                      f" median of {args.reference_repeat} interleaved paired runs); goal <= {GOAL}: {verdict}")
            else:
                print("reference_over_generation: the bench failed (run scripts/bench_reference.py --model"
                      f" {target} to see why)")
        if args.grid != "none" and (args.grid_sizes == "all" or size == args.sizes.split(",")[0]):
            grid(work, size, target, draft, args.grid == "large")

if __name__ == "__main__":
    main()
