#!/usr/bin/env python3
"""specparity serve overhead: its tokens/s against plain mlx_lm.server, same run.

Both servers get the same flags (the embedded pair, ``--draft-model``,
``--num-draft-tokens``), the same requests (distinct prompts, greedy, a fixed
``max_tokens``), one after the other in alternating passes so drift hits both.
The gate is warm (specparity serve asks it at start-up; a warm-up request runs
first). Each request goes to both servers back to back, in alternating order,
``--passes`` times; each request's fastest time is kept (a shared machine only
ever slows a request down), and tokens/s is completion tokens over the sum of
those times. The servers' CPU seconds are reported beside it, and a second plain
server measured the same way gives the noise floor (what two identical servers
differ by on this machine, this run). Goal: overhead (1 - serve / plain) <= 3%.

Usage: .venv/bin/python -P scripts/bench_serve.py [--requests 12] [--max-tokens 64] [--passes 5]
Prints one figure per line, ``name: value unit``.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from pathlib import Path

GOAL = 0.03
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
         "juliet", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo"]


def request(client, url: str, prompt: str, max_tokens: int) -> tuple[int, float]:
    """(completion tokens, wall seconds) of one greedy request."""
    t0 = time.perf_counter()
    r = client.post(url + "/v1/completions",
                    json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
    secs = time.perf_counter() - t0
    r.raise_for_status()
    return r.json()["usage"]["completion_tokens"], secs


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its threads so far (Linux /proc; 0 elsewhere)."""
    import os

    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--num-draft-tokens", type=int, default=3)
    ap.add_argument("--no-noise-floor", dest="noise_floor", action="store_false",
                    help="skip the second plain server (plain against itself)")
    args = ap.parse_args()

    from specparity.harness.lifecycle import PORT_ARG, Server

    from specparity.fixtures import default_pair

    pair = default_pair()
    assert pair.draft is not None
    bin_dir = Path(sys.executable).parent
    common = ["--model", pair.target, "--draft-model", pair.draft, "--num-draft-tokens",
              str(args.num_draft_tokens), "--port", PORT_ARG, "--log-level", "WARNING"]
    home = tempfile.mkdtemp(prefix="bench-serve-")
    prompts = [f"{WORDS[i % len(WORDS)]} {i}: the story of {WORDS[(i * 7) % len(WORDS)]}"
               for i in range(args.requests)]
    import httpx

    argvs = {"plain": [str(bin_dir / "mlx_lm.server"), *common],
             "serve": [str(bin_dir / "specparity"), "serve", *common]}
    if args.noise_floor:  # a second plain server: what two identical servers differ by here
        argvs["plain-again"] = argvs["plain"]
    names = list(argvs)
    best: dict[str, dict[int, float]] = {n: {} for n in names}
    count: dict[int, int] = {}
    with contextlib.ExitStack() as stack:
        servers = {n: stack.enter_context(Server(a, name=n, env={"SPECPARITY_HOME": home},
                                                 start_timeout=300)) for n, a in argvs.items()}
        client = stack.enter_context(httpx.Client(timeout=300))
        for srv in servers.values():  # warm-up (the gate is already warm in specparity serve)
            request(client, srv.url, "warm up", args.max_tokens)
        cpu0 = {n: cpu_seconds(s.pid or 0) for n, s in servers.items()}
        for i in range(args.passes):
            for j, p in enumerate(prompts):
                # the same request to every server, back to back, in rotating order; a fresh
                # suffix per pass so no server hits its prompt cache
                k = (i + j) % len(names)
                for name in names[k:] + names[:k]:
                    n, secs = request(client, servers[name].url, f"{p} #{i}", args.max_tokens)
                    best[name][j] = min(best[name].get(j, secs), secs)
                    count[j] = n
        cpu = {n: cpu_seconds(s.pid or 0) - cpu0[n] for n, s in servers.items()}
    tokens = sum(count.values())
    tps = {n: tokens / sum(b.values()) for n, b in best.items()}
    print(f"serve_plain_mlx_lm_server: {tps['plain']:.1f} tokens/s")
    print(f"serve_specparity_serve: {tps['serve']:.1f} tokens/s")
    print(f"serve_overhead: {(1.0 - tps['serve'] / tps['plain']) * 100:.1f} % (goal <="
          f" {GOAL * 100:.0f} %; {args.requests} requests x {args.max_tokens} tokens, each"
          f" request's best of {args.passes})")
    if cpu["plain"] > 0:
        print(f"serve_cpu_overhead: {(cpu['serve'] / cpu['plain'] - 1) * 100:.1f} %"
              f" (server CPU seconds: {cpu['serve']:.1f} vs {cpu['plain']:.1f})")
    if args.noise_floor:
        print(f"serve_noise_floor: {(1.0 - tps['plain-again'] / tps['plain']) * 100:.1f} % tokens/s,"
              f" {(cpu['plain-again'] / max(cpu['plain'], 1e-9) - 1) * 100:.1f} % CPU"
              " (plain mlx_lm.server against itself, same run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
