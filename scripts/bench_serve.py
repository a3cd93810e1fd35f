#!/usr/bin/env python3
"""specparity serve overhead against plain mlx_lm.server: resolved to 1%, or said not to be.

Both servers get the same flags (the embedded pair, ``--draft-model``,
``--num-draft-tokens``) and the same greedy requests. The run is many short
passes; in each pass every server gets ``--requests`` fresh prompts back to
back (no prompt-cache hit), then the same prompts again (warm: each a
prompt-cache hit, what specparity serve's exact cache and policy add work to),
the servers' order rotating from pass to pass, so drift and a neighbour's load
hit all of them alike. Per pass, server and kind (fresh, warm): tokens/s
(completion tokens over wall seconds) and the server's CPU seconds per token
(user + system, /proc, every thread).

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

The goal is an overhead <= 1%, *resolved*: a run resolves 1% only when its
interval's half-width is <= 1 point (an interval 4.8 points wide resolves
nothing, whatever its point estimate), and then shows the overhead <= 1% when
the upper end is <= 1%. The last lines say which, per kind, for tokens/s and
for CPU per token.

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

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run with -P: the shared statistics beside it
from benchstats import median_ci, overhead_verdict, pooled_ci  # noqa: E402

GOAL = 0.01
KINDS = ("fresh", "warm")  # fresh prompts, then the same prompts again (prompt-cache hits)
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


Row = dict[str, tuple[int, float, float]]  # one pass of one kind: server -> (tokens, wall s, CPU s)


def tps(r: tuple[int, float, float]) -> float:
    return r[0] / r[1]


def cpt(r: tuple[int, float, float]) -> float:
    return r[2] / r[0]


def overheads(passes: list[Row], a: str, b: str) -> tuple[tuple[float, float, float],
                                                          tuple[float, float, float]]:
    """(tokens/s overhead, low, high), (CPU per token overhead, low, high) of ``a`` over ``b``."""
    t = median_ci([tps(r[a]) / tps(r[b]) for r in passes])
    # CPU seconds per token: (CPU s, tokens) of a over those of b, summed over the passes
    c = pooled_ci(passes, lambda r: (r[a][2], r[a][0]), lambda r: (r[b][2], r[b][0]))
    # tokens/s overhead = 1 - ratio (its interval flips ends); CPU overhead = ratio - 1
    return (1 - t[0], 1 - t[2], 1 - t[1]), (c[0] - 1, c[1] - 1, c[2] - 1)


def verdict(name: str, lo: float, hi: float) -> str:
    """Whether the interval [lo, hi] resolves the goal (half-width <= GOAL), and what it shows."""
    return overhead_verdict(name, lo, hi, GOAL)


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
    rows: dict[str, list[Row]] = {k: [] for k in KINDS}  # per kind, one Row per pass
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
                row: dict[str, Row] = {k: {} for k in KINDS}
                k = (round_ + i) % len(names)
                # the same prompts for every server: fresh ones (each cache misses them alike),
                # then the same again (each a hit)
                prompts = [f"{WORDS[(i * args.requests + j) % len(WORDS)]} {round_}.{i}.{j}:"
                           " the story" for j in range(args.requests)]
                for name in names[k:] + names[:k]:
                    srv = servers[name]
                    for kind in KINDS:
                        cpu0, t0, tokens = cpu_seconds(srv.pid or 0), time.perf_counter(), 0
                        for prompt in prompts:
                            tokens += request(client, srv.url, prompt, args.max_tokens)
                        row[kind][name] = (tokens, time.perf_counter() - t0,
                                           cpu_seconds(srv.pid or 0) - cpu0)
                for kind in KINDS:
                    rows[kind].append(row[kind])
    load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")

    scope = (f"{args.rounds} rounds x {args.passes} passes x {args.requests} requests x"
             f" {args.max_tokens} tokens per server and kind; load average {load0:.2f} ->"
             f" {load1:.2f} on {os.cpu_count()} CPUs")
    verdicts = []
    for kind in KINDS:
        passes = rows[kind]
        for name in names:
            label = f"serve_bench_{kind}_{name.replace('-', '_')}"
            print(f"{label}_tokens_per_s: {statistics.median(tps(r[name]) for r in passes):.1f}"
                  " tokens/s (median pass)")
            print(f"{label}_cpu_per_token: {statistics.median(cpt(r[name]) for r in passes) * 1000:.3f}"
                  " ms CPU/token (median pass)")

        (t, t_lo, t_hi), (c, c_lo, c_hi) = overheads(passes, "serve", "plain")
        print(f"serve_overhead_{kind}_tokens_per_s: {t:+.2%} (95% CI [{t_lo:+.2%}, {t_hi:+.2%}];"
              f" {scope})")
        print(f"serve_overhead_{kind}_cpu_per_token: {c:+.2%} (95% CI [{c_lo:+.2%}, {c_hi:+.2%}];"
              " summed over the passes, bootstrap)")
        if args.noise_floor:
            (f, f_lo, f_hi), (g, g_lo, g_hi) = overheads(passes, "plain-again", "plain")
            print(f"serve_noise_floor_{kind}_tokens_per_s: {f:+.2%} (95% CI [{f_lo:+.2%},"
                  f" {f_hi:+.2%}]; plain mlx_lm.server against itself, same passes)")
            print(f"serve_noise_floor_{kind}_cpu_per_token: {g:+.2%} (95% CI [{g_lo:+.2%},"
                  f" {g_hi:+.2%}])")
        verdicts += [verdict(f"serve_overhead_resolved_{kind}_tokens_per_s", t_lo, t_hi),
                     verdict(f"serve_overhead_resolved_{kind}_cpu_per_token", c_lo, c_hi)]
    for line in verdicts:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
