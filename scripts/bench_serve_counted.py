#!/usr/bin/env python3
"""specparity serve against plain mlx_lm.server, counted: instructions per request under callgrind.

bench_serve.py times the two servers; on a shared 2-core machine a round's CPU per token moves by
+-10% and more, and its interval cannot resolve a fraction of a percent. This bench counts instead:
both servers run under valgrind's callgrind (instrumentation switched on after start-up and a
warm-up request), and for each request the instructions every thread of the server executed
(callgrind's ``Ir``: user space, Python, MLX and libc alike; not the kernel, not waiting) are read
between a zero and a dump of the counters. The same requests go to both servers in the same order
(fresh greedy prompts, ``--max-tokens`` each, no early end), so each request is a pair: serve's count
over plain's. The overhead is the median of those ratios with its distribution-free 95% interval
(benchstats), resolved against 1% as bench_serve resolves time. Where serve's text differs from
plain's the two did other work and the pair is left out (counted and said).

A count is not a time: an instruction of the interpreter's is cheaper than a cache-missing load of a
kernel's, so this bounds serve's own work, not the seconds a given machine spends on it. Nothing
else differs: the same binaries, flags, model, prompts and process layout; the one shim both
servers get (valgrind lets no process move its file-descriptor hard limit, which mlx_lm sets at
import) keeps that limit where valgrind put it.

Needs valgrind (``callgrind_control``); ~2 minutes per request pair on 2 cores (the servers run side
by side, ~50x slower than natively).

Usage: .venv/bin/python -P scripts/bench_serve_counted.py [--rounds 3] [--requests 3] [--max-tokens 64]
Prints one figure per line, ``name: value unit``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import glob
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run with -P: the shared statistics beside it
from bench_serve import MIN_ROUNDS, WORDS, request, server_argvs  # noqa: E402
from benchstats import median_ci, overhead_verdict  # noqa: E402

GOAL = 0.01
SHIM = '''"""Under valgrind no process may change its NOFILE hard limit: keep it where valgrind put it."""
import resource
_set = resource.setrlimit
def setrlimit(which, limits):
    if which == resource.RLIMIT_NOFILE:
        hard = resource.getrlimit(which)[1]
        limits = (min(limits[0], hard), hard)
    return _set(which, limits)
resource.setrlimit = setrlimit
'''


def control(pid: int, *flags: str) -> None:
    subprocess.run(["callgrind_control", *flags, str(pid)], check=True, capture_output=True, timeout=600)


def counted(client: Any, srv: Any, out: str, prompt: str, max_tokens: int) -> tuple[int, int, str]:
    """(instructions, completion tokens, text) of one request: counters zeroed, the request, a dump."""
    pid = srv.pid or 0
    before = set(glob.glob(out + ".*"))
    control(pid, "-z")
    tokens, text = request(client, srv.url, prompt, max_tokens)
    control(pid, "-d")
    (dump,) = set(glob.glob(out + ".*")) - before
    totals = [line for line in Path(dump).read_text().splitlines() if line.startswith("totals:")]
    return int(totals[0].split()[1]), tokens, text


def overhead_lines(ratios: list[float], rounds: int) -> list[str]:
    """The overhead's median over the request pairs (serve's count / plain's) with its 95% interval, and
    whether it resolves 1%: never with fewer pairs than such an interval needs."""
    med, lo, hi = median_ci(ratios)
    lines = [f"serve_counted_overhead: {med - 1:+.3%} (95% CI [{lo - 1:+.3%}, {hi - 1:+.3%}]; {len(ratios)}"
             f" request pairs in {rounds} rounds; instructions, not seconds)"]
    if len(ratios) < MIN_ROUNDS:
        lines.append(f"serve_counted_overhead_resolved: not resolved ({len(ratios)} pairs: a 95% interval of a"
                     f" median needs {MIN_ROUNDS}; range [{lo - 1:+.2%}, {hi - 1:+.2%}])")
    else:
        lines.append(overhead_verdict("serve_counted_overhead_resolved", lo - 1, hi - 1, GOAL))
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="fresh server pairs, this many times")
    ap.add_argument("--requests", type=int, default=3, help="requests per round (each one pair)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--num-draft-tokens", type=int, default=3)
    args = ap.parse_args()
    if args.rounds < 1 or args.requests < 1:
        ap.error("--rounds and --requests: at least 1 each")
    if not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        print("serve_counted: skipped (valgrind's callgrind_control not found: Linux, `apt install valgrind`)")
        return 0

    import httpx

    from specparity.harness.lifecycle import Server

    _, argvs = server_argvs(args.num_draft_tokens)
    work = tempfile.mkdtemp(prefix="bench-serve-counted-")
    (Path(work) / "shim").mkdir()
    (Path(work) / "shim" / "sitecustomize.py").write_text(SHIM)
    counts: dict[str, list[int]] = {"plain": [], "serve": []}
    tokens: dict[str, list[int]] = {"plain": [], "serve": []}
    ratios: list[float] = []
    unlike = 0
    for round_ in range(args.rounds):
        outs = {name: f"{work}/{name}-{round_}.cg" for name in argvs}
        with contextlib.ExitStack() as stack:
            servers = {name: stack.enter_context(Server(
                ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={outs[name]}",
                 *argvs[name]], name=name, start_timeout=3600, stop_timeout=600,
                env={"SPECPARITY_HOME": f"{work}/home", "PYTHONPATH": f"{work}/shim"}))
                for name in argvs}
            client = stack.enter_context(httpx.Client(timeout=3600))
            pool = stack.enter_context(concurrent.futures.ThreadPoolExecutor(len(servers)))
            for name, srv in servers.items():  # warm-up, uncounted; then the counters on
                request(client, srv.url, "warm up", args.max_tokens)
                control(srv.pid or 0, "-i", "on")
            for j in range(args.requests):
                prompt = f"{WORDS[(round_ * args.requests + j) % len(WORDS)]} {round_}.{j}: the story"
                got = {name: pool.submit(counted, client, srv, outs[name], prompt, args.max_tokens)
                       for name, srv in servers.items()}
                res = {name: f.result() for name, f in got.items()}
                for name, (ir, n, _) in res.items():
                    counts[name].append(ir)
                    tokens[name].append(n)
                if res["serve"][2] != res["plain"][2]:
                    unlike += 1
                    continue
                ratios.append(res["serve"][0] / res["plain"][0])
                print(f"serve_counted_pair_{round_}_{j}: {ratios[-1] - 1:+.3%} ({res['plain'][0]:,} -> "
                      f"{res['serve'][0]:,} instructions, {res['plain'][1]} tokens)", flush=True)
    shutil.rmtree(work, ignore_errors=True)

    pairs = args.rounds * args.requests
    for name in argvs:
        per_token = sum(counts[name]) / max(1, sum(tokens[name]))
        print(f"serve_counted_{name}_instructions_per_token: {per_token / 1e6:.2f} M instructions/token"
              f" (every thread, {pairs} requests x {args.max_tokens} tokens)")
    print(f"serve_counted_unlike: {unlike} of {pairs} pairs (serve's text not plain's: left out)")
    if not ratios:
        print("serve_counted_overhead: no pair did the same work")
        return 1
    for line in overhead_lines(ratios, args.rounds):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
