#!/usr/bin/env python3
"""specparity serve overhead against plain mlx_lm.server: resolved to 1%, or said not to be.

Both servers get the same flags (the embedded pair, ``--draft-model``,
``--num-draft-tokens``) and the same greedy requests, each prompt fresh (no
prompt-cache hit). The run is many short passes; in each pass every server
gets ``--requests`` requests back to back, the servers' order rotating from
pass to pass, so drift and a neighbour's load hit all of them alike. Per pass
and server: tokens/s (completion tokens over wall seconds) and the server's
CPU seconds per token (user + system, /proc, every thread).

A server process can run a few percent faster or slower than another of the
same binary for as long as it lives (where its threads land, its memory
layout): ``--rounds`` starts fresh processes of every server that many times,
so that too is noise the passes average over, not a bias.

Tokens/s: per pass the ratio serve / plain; the overhead is one minus the
median ratio, with a distribution-free 95% confidence interval of the median
(binomial order statistics: no assumption on the noise's shape). CPU: /proc
counts clock ticks (10 ms), too coarse for a per-pass ratio, so the overhead
is the ratio of CPU seconds per token summed over all passes, minus one, with
a 95% bootstrap interval (passes resampled). A second plain server, measured
the same way (plain against itself), shows what the run resolves.

The goal is an overhead <= 1% *resolved*: the interval's upper end <= 1%. The
last lines say whether it was, for tokens/s and for CPU per token.

Usage: .venv/bin/python -P scripts/bench_serve.py [--rounds 3] [--passes 20] [--requests 3]
       [--max-tokens 64]
Prints one figure per line, ``name: value unit``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

GOAL = 0.01
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
         "juliet", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo"]


def request(client: Any, url: str, prompt: str, max_tokens: int) -> int:
    """Completion tokens of one greedy request."""
    r = client.post(url + "/v1/completions",
                    json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                          "logit_bias": {"0": -100.0}})  # no early end-of-text: equal lengths
    r.raise_for_status()
    return int(r.json()["usage"]["completion_tokens"])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and all its threads so far (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def median_ci(values: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """(median, low, high): the median and its distribution-free confidence interval."""
    from scipy.stats import binom

    x = sorted(values)
    n = len(x)
    j = int(binom.ppf((1 - level) / 2, n, 0.5))  # order statistics j and n - j + 1 (1-based)
    j = max(j, 1)
    return statistics.median(x), x[j - 1], x[n - j]


def pooled_ci(rows: list[dict[str, tuple[int, float, float]]], a: str, b: str,
              resamples: int = 2000, level: float = 0.95) -> tuple[float, float, float]:
    """(ratio, low, high): CPU seconds per token of ``a`` over ``b``, summed over all passes,
    with a percentile bootstrap interval over passes (fixed seed: the same rows, the same line)."""
    import numpy as np

    data = np.array([[r[a][2], r[a][0], r[b][2], r[b][0]] for r in rows], dtype=float)

    def ratio(d: Any) -> Any:
        return (d[..., 0].sum(-1) / d[..., 1].sum(-1)) / (d[..., 2].sum(-1) / d[..., 3].sum(-1))

    rng = np.random.default_rng(0)
    boot = ratio(data[rng.integers(0, len(data), size=(resamples, len(data)))])
    lo, hi = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
    return float(ratio(data)), float(lo), float(hi)


def verdict(name: str, lo: float, hi: float) -> str:
    if hi <= GOAL:
        return f"{name}: resolved, <= {GOAL:.0%} (95% CI upper end {hi:+.2%})"
    if lo > GOAL:
        return f"{name}: resolved, > {GOAL:.0%} (95% CI lower end {lo:+.2%})"
    return (f"{name}: not resolved (95% CI [{lo:+.2%}, {hi:+.2%}] spans {GOAL:.0%}; more passes"
            " or a quieter machine)")


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="fresh server processes, this many times")
    ap.add_argument("--passes", type=int, default=20, help="passes per round")
    ap.add_argument("--requests", type=int, default=3, help="requests per server per pass")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--num-draft-tokens", type=int, default=3)
    ap.add_argument("--no-noise-floor", dest="noise_floor", action="store_false",
                    help="skip the second plain server (plain against itself)")
    args = ap.parse_args()
    if args.rounds < 1 or args.passes * args.rounds < 6:
        ap.error("--rounds x --passes: at least 6 (a confidence interval of a median needs them)")

    import httpx

    from specparity.fixtures import default_pair
    from specparity.harness.lifecycle import PORT_ARG, Server

    pair = default_pair()
    assert pair.draft is not None
    bin_dir = Path(sys.executable).parent
    common = ["--model", pair.target, "--draft-model", pair.draft, "--num-draft-tokens",
              str(args.num_draft_tokens), "--port", PORT_ARG, "--log-level", "WARNING"]
    home = tempfile.mkdtemp(prefix="bench-serve-")
    argvs = {"plain": [str(bin_dir / "mlx_lm.server"), *common],
             "serve": [str(bin_dir / "specparity"), "serve", *common]}
    if args.noise_floor:
        argvs["plain-again"] = argvs["plain"]
    names = list(argvs)
    rows: list[dict[str, tuple[int, float, float]]] = []  # per pass: name -> (tokens, wall, cpu)
    load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    for round_ in range(args.rounds):
        with contextlib.ExitStack() as stack:
            # started in rotating order too: a process started first is not always the same one
            start = names[round_ % len(names):] + names[:round_ % len(names)]
            servers = {n: stack.enter_context(Server(argvs[n], name=n,
                                                     env={"SPECPARITY_HOME": home},
                                                     start_timeout=300))
                       for n in start}
            client = stack.enter_context(httpx.Client(timeout=300))
            for srv in servers.values():  # warm-up (specparity serve's gate decided at start-up)
                request(client, srv.url, "warm up", args.max_tokens)
            for i in range(args.passes):
                row = {}
                k = (round_ + i) % len(names)
                for name in names[k:] + names[:k]:
                    srv = servers[name]
                    cpu0, t0, tokens = cpu_seconds(srv.pid or 0), time.perf_counter(), 0
                    for j in range(args.requests):
                        w = WORDS[(i * args.requests + j) % len(WORDS)]
                        # the same prompt for every server (each cache misses it alike)
                        tokens += request(client, srv.url, f"{w} {round_}.{i}.{j}: the story",
                                          args.max_tokens)
                    row[name] = (tokens, time.perf_counter() - t0,
                                 cpu_seconds(srv.pid or 0) - cpu0)
                rows.append(row)
    load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")

    def tps(r: tuple[int, float, float]) -> float:
        return r[0] / r[1]

    def cpt(r: tuple[int, float, float]) -> float:
        return r[2] / r[0]

    for name in names:
        print(f"serve_bench_{name.replace('-', '_')}_tokens_per_s:"
              f" {statistics.median(tps(r[name]) for r in rows):.1f} tokens/s (median pass)")
        print(f"serve_bench_{name.replace('-', '_')}_cpu_per_token:"
              f" {statistics.median(cpt(r[name]) for r in rows) * 1000:.3f} ms CPU/token (median pass)")

    def overheads(a: str, b: str) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
        t = median_ci([tps(r[a]) / tps(r[b]) for r in rows])
        c = pooled_ci(rows, a, b)
        # tokens/s overhead = 1 - ratio (its interval flips ends); CPU overhead = ratio - 1
        return (1 - t[0], 1 - t[2], 1 - t[1]), (c[0] - 1, c[1] - 1, c[2] - 1)

    (t, t_lo, t_hi), (c, c_lo, c_hi) = overheads("serve", "plain")
    scope = (f"{args.rounds} rounds x {args.passes} passes x {args.requests} requests x"
             f" {args.max_tokens} tokens per server; load average {load0:.2f} -> {load1:.2f}"
             f" on {os.cpu_count()} CPUs")
    print(f"serve_overhead_tokens_per_s: {t:+.2%} (95% CI [{t_lo:+.2%}, {t_hi:+.2%}]; {scope})")
    print(f"serve_overhead_cpu_per_token: {c:+.2%} (95% CI [{c_lo:+.2%}, {c_hi:+.2%}]; summed"
          " over the passes, bootstrap)")
    if args.noise_floor:
        (f, f_lo, f_hi), (g, g_lo, g_hi) = overheads("plain-again", "plain")
        print(f"serve_noise_floor_tokens_per_s: {f:+.2%} (95% CI [{f_lo:+.2%}, {f_hi:+.2%}];"
              " plain mlx_lm.server against itself, same passes)")
        print(f"serve_noise_floor_cpu_per_token: {g:+.2%} (95% CI [{g_lo:+.2%}, {g_hi:+.2%}])")
    print(verdict("serve_overhead_resolved_tokens_per_s", t_lo, t_hi))
    print(verdict("serve_overhead_resolved_cpu_per_token", c_lo, c_hi))
    return 0


if __name__ == "__main__":
    sys.exit(main())
