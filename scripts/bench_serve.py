#!/usr/bin/env python3
"""specparity serve overhead against plain mlx_lm.server: resolved to 1%, or said not to be.

Both servers get the same flags (the embedded pair, ``--draft-model``,
``--num-draft-tokens``) and the same greedy requests. A pass sends
``--requests`` fresh prompts (no prompt-cache hit), then the same prompts again
(warm: each a prompt-cache hit, what specparity serve's exact cache and policy
add work to). Within a pass the servers take turns *request by request*, the
order rotating from pass to pass, so drift and a neighbour's load within a
pass hit every server alike. Per request, server and kind (fresh, warm):
completion tokens, wall seconds, and the server's CPU time (user + system,
every thread, ended ones included: ``/proc/PID/stat``; a request's own, so the
servers' idle time between turns does not count).

A server process can run a few percent faster or slower than another of the
same binary for as long as it lives (where its threads land, its memory
layout), so the unit of the statistics is a *round*: every server started
fresh (in rotating order), a warm-up request, ``--passes`` passes. Per round
and kind: CPU seconds per token of serve over plain (summed over the round's
passes) and tokens/s of serve over plain; the overhead is the median over the
rounds, with a distribution-free 95% confidence interval of the median
(binomial order statistics: no assumption on the noise's shape; with fewer than
6 rounds the interval is the whole range). A second plain server, measured the
same way (plain against itself), shows what the run resolves.

Each round ends with ``--fixed-requests`` one-token requests per server (fresh prompts, the
servers taking turns): what a request costs a server apart from its tokens (the HTTP exchange, the
handler, prefill and one step; specparity serve's checks, its client watch, its statistics and
metrics). serve's CPU per such request minus plain's, the median over rounds with its interval,
and that difference as a share of plain's CPU for a ``--max-tokens`` request: the part of the
overhead that is specparity serve's own per-request work, measured to a fraction of a millisecond
where the whole overhead's interval is a few points wide. (Sums of many requests: /proc's CPU
clock ticks every 10 ms.)

Per kind, the requests whose text differs from plain's are counted: on warm requests plain
mlx_lm.server 0.32's drafter server meets its own prompt-cache fault (an entry filed one position
short of its key) and answers otherwise than classic decode, which specparity serve returns. The
two then generate other tokens with other acceptance, and that kind's ratio is the cost of the right
answer, not overhead on the same work: its verdict says so.

The goal is an overhead <= 1%, *resolved*: a run resolves 1% only when its
interval's half-width is <= 1 point (an interval 4.8 points wide resolves
nothing, whatever its point estimate), and then shows the overhead <= 1% when
the upper end is <= 1%. The last lines say which, per kind, for CPU per token
(the quieter figure: a neighbour's load does not count in it) and tokens/s.

Usage: .venv/bin/python -P scripts/bench_serve.py [--rounds 12] [--passes 4] [--requests 3]
       [--max-tokens 64] [--fixed-requests 40] [--no-noise-floor]
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
from benchstats import median_ci, overhead_verdict  # noqa: E402

GOAL = 0.01
KINDS = ("fresh", "warm")  # fresh prompts, then the same prompts again (prompt-cache hits)
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
         "juliet", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo"]


def request(client: Any, url: str, prompt: str, max_tokens: int) -> tuple[int, str]:
    """(completion tokens, text) of one greedy request."""
    r = client.post(url + "/v1/completions",
                    json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                          "logit_bias": {"0": -100.0}})  # no early end-of-text: equal lengths
    r.raise_for_status()
    body = r.json()
    return int(body["usage"]["completion_tokens"]), str(body["choices"][0]["text"])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far, its ended threads included (Linux /proc;
    0 elsewhere). Clock ticks (10 ms), but a tick's rounding is as likely up as down: summed
    over a round's requests, the error is a few ticks in seconds of CPU."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


Sums = tuple[int, float, float]  # completion tokens, wall s, CPU s
Row = dict[str, Sums]  # one round of one kind: server -> its sums over the round's passes


def tps(r: Sums) -> float:
    return r[0] / r[1]


def cpt(r: Sums) -> float:
    return r[2] / r[0]


def overheads(rounds: list[Row], a: str, b: str) -> tuple[tuple[float, float, float],
                                                          tuple[float, float, float]]:
    """(tokens/s overhead, low, high), (CPU per token overhead, low, high) of ``a`` over ``b``:
    the median over rounds of each round's ratio, with its distribution-free interval."""
    t = median_ci([tps(r[a]) / tps(r[b]) for r in rounds])
    c = median_ci([cpt(r[a]) / cpt(r[b]) for r in rounds])
    # tokens/s overhead = 1 - ratio (its interval flips ends); CPU overhead = ratio - 1
    return (1 - t[0], 1 - t[2], 1 - t[1]), (c[0] - 1, c[1] - 1, c[2] - 1)


MIN_ROUNDS = 6  # the fewest values whose median has a 95% distribution-free interval (n = 6: 96.9%)


def verdict(name: str, lo: float, hi: float, rounds: int = MIN_ROUNDS) -> str:
    """Whether the interval [lo, hi] resolves the goal (half-width <= GOAL), and what it shows; with fewer
    than MIN_ROUNDS rounds the range of the rounds is no 95% interval, and nothing is resolved."""
    if rounds < MIN_ROUNDS:
        return (f"{name}: not resolved ({rounds} rounds: a 95% interval of a median needs {MIN_ROUNDS};"
                f" range [{lo:+.2%}, {hi:+.2%}])")
    return overhead_verdict(name, lo, hi, GOAL)


def timed(client: Any, srv: Any, prompt: str, max_tokens: int) -> tuple[Sums, str]:
    """((tokens, wall s, the server's CPU s), text) of one request."""
    cpu0, t0 = cpu_seconds(srv.pid or 0), time.perf_counter()
    tokens, text = request(client, srv.url, prompt, max_tokens)
    return (tokens, time.perf_counter() - t0, cpu_seconds(srv.pid or 0) - cpu0), text


def added(a: Sums, b: Sums) -> Sums:
    return a[0] + b[0], a[1] + b[1], a[2] + b[2]


def server_argvs(num_draft_tokens: int) -> tuple[Any, dict[str, list[str]]]:
    """(the embedded default pair, {"plain": mlx_lm.server's argv, "serve": specparity serve's}): the
    same flags for both, the port filled in at start."""
    from specparity.fixtures import default_pair
    from specparity.harness.lifecycle import PORT_ARG

    pair = default_pair()
    assert pair.draft is not None
    bin_dir = Path(sys.executable).parent
    common = ["--model", pair.target, "--draft-model", pair.draft, "--num-draft-tokens",
              str(num_draft_tokens), "--port", PORT_ARG, "--log-level", "WARNING"]
    return pair, {"plain": [str(bin_dir / "mlx_lm.server"), *common],
                  "serve": [str(bin_dir / "specparity"), "serve", *common]}


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--rounds", type=int, default=12,
                    help="fresh server processes, this many times (the statistics' unit)")
    ap.add_argument("--passes", type=int, default=4, help="passes per round")
    ap.add_argument("--requests", type=int, default=3, help="requests per server per pass")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--num-draft-tokens", type=int, default=3)
    ap.add_argument("--fixed-requests", type=int, default=40,
                    help="one-token requests per server per round: the per-request cost (0: none)")
    ap.add_argument("--no-noise-floor", dest="noise_floor", action="store_false",
                    help="skip the second plain server (plain against itself)")
    args = ap.parse_args()
    if args.rounds < 1 or args.passes < 1 or args.requests < 1 or args.fixed_requests < 0:
        ap.error("--rounds, --passes and --requests: at least 1 each (6 rounds or more for an"
                 " interval narrower than the whole range)")

    import httpx

    from specparity.harness.lifecycle import Server

    pair, argvs = server_argvs(args.num_draft_tokens)
    home = tempfile.mkdtemp(prefix="bench-serve-")
    if args.noise_floor:
        argvs["plain-again"] = argvs["plain"]
    names = list(argvs)
    rows: dict[str, list[Row]] = {k: [] for k in KINDS}  # per kind, one Row per round
    fixed_rows: list[dict[str, float]] = []  # per round: server -> CPU s per one-token request
    # per kind: server -> requests whose text is not plain's (then the two did not do the same work)
    differ: dict[str, dict[str, int]] = {k: {n: 0 for n in names} for k in KINDS}
    fixed_prompts = distinct_starts(pair.target, args.fixed_requests) if args.fixed_requests else []
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
            sums: dict[str, Row] = {k: {n: (0, 0.0, 0.0) for n in names} for k in KINDS}
            for i in range(args.passes):
                k = (round_ + i) % len(names)
                order = names[k:] + names[:k]
                # the same prompts for every server: fresh ones (each cache misses them alike),
                # then the same again (each a hit); the servers take turns request by request
                prompts = [f"{WORDS[(i * args.requests + j) % len(WORDS)]} {round_}.{i}.{j}:"
                           " the story" for j in range(args.requests)]
                for kind in KINDS:
                    for prompt in prompts:
                        texts = {}
                        for name in order:
                            got, texts[name] = timed(client, servers[name], prompt, args.max_tokens)
                            sums[kind][name] = added(sums[kind][name], got)
                        for name in names[1:]:
                            differ[kind][name] += texts[name] != texts["plain"]
            for kind in KINDS:
                rows[kind].append(sums[kind])
            if args.fixed_requests:
                fixed_rows.append(per_request_cpu(client, servers, names, round_, fixed_prompts))
    load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")

    scope = (f"{args.rounds} rounds x {args.passes} passes x {args.requests} requests x"
             f" {args.max_tokens} tokens per server and kind; load average {load0:.2f} ->"
             f" {load1:.2f} on {os.cpu_count()} CPUs")
    verdicts = []
    asked = args.rounds * args.passes * args.requests  # requests per server and kind
    for kind in KINDS:
        per_round = rows[kind]
        for name in names:
            label = f"serve_bench_{kind}_{name.replace('-', '_')}"
            print(f"{label}_tokens_per_s: {statistics.median(tps(r[name]) for r in per_round):.1f}"
                  " tokens/s (median round)")
            print(f"{label}_cpu_per_token: {statistics.median(cpt(r[name]) for r in per_round) * 1000:.3f}"
                  " ms CPU/token (median round)")

        for name in names[1:]:
            print(f"serve_differs_{kind}_{name.replace('-', '_')}: {differ[kind][name]} of"
                  f" {asked} requests (text not plain's: not the same"
                  " work; plain mlx_lm.server's known faults change some answers it serves from its prompt cache)")
        print(f"serve_rounds_{kind}_cpu_per_token: " + " ".join(
            f"{cpt(r['serve']) / cpt(r['plain']) - 1:+.2%}" for r in per_round) + " (serve over plain, each round)")
        (t, t_lo, t_hi), (c, c_lo, c_hi) = overheads(per_round, "serve", "plain")
        print(f"serve_overhead_{kind}_tokens_per_s: {t:+.2%} (95% CI [{t_lo:+.2%}, {t_hi:+.2%}];"
              f" {scope})")
        print(f"serve_overhead_{kind}_cpu_per_token: {c:+.2%} (95% CI [{c_lo:+.2%}, {c_hi:+.2%}];"
              " per round, summed over its passes)")
        if args.noise_floor:
            (f, f_lo, f_hi), (g, g_lo, g_hi) = overheads(per_round, "plain-again", "plain")
            print(f"serve_noise_floor_{kind}_tokens_per_s: {f:+.2%} (95% CI [{f_lo:+.2%},"
                  f" {f_hi:+.2%}]; plain mlx_lm.server against itself, same rounds)")
            print(f"serve_noise_floor_{kind}_cpu_per_token: {g:+.2%} (95% CI [{g_lo:+.2%},"
                  f" {g_hi:+.2%}])")
        # where serve answered otherwise than plain (classic decode's text where plain's prompt cache
        # changed its answer), the two generated other tokens with other acceptance: the ratio is
        # then the cost of the right answer, not specparity serve's overhead on the same work
        unlike = (f"; not the same work: serve's text differs from plain's on {differ[kind]['serve']} of"
                  f" {asked} requests") if differ[kind]["serve"] else ""
        verdicts += [verdict(f"serve_overhead_resolved_{kind}_cpu_per_token", c_lo, c_hi, args.rounds) + unlike,
                     verdict(f"serve_overhead_resolved_{kind}_tokens_per_s", t_lo, t_hi, args.rounds) + unlike]
    if fixed_rows:
        plain_request = statistics.median(cpt(r["plain"]) for r in rows["fresh"]) * args.max_tokens
        print_fixed(fixed_rows, names, plain_request, args)
    for line in verdicts:
        print(line)
    return 0


def distinct_starts(target: str, n: int) -> list[str]:
    """``n`` prompts whose first tokens differ from each other's and from every pass prompt's: no
    prompt-cache entry shares a prefix with them, so each server prefills each one whole (a shared
    first token reused by one server's cache and not the other's would be a difference of prefill,
    not of overhead)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target)

    def first(text: str) -> int:
        ids = tok.encode(text)
        return ids[1] if tok.bos_token_id is not None and ids and ids[0] == tok.bos_token_id else ids[0]

    used = {first(f"{w} 0.0.0: the story") for w in WORDS} | {first("warm up")}
    out: list[str] = []
    for i in range(len(tok)):
        word = str(tok.decode([i])).strip()
        if len(word) < 3 or not word.isalpha() or not word.isascii():
            continue
        prompt = f"{word} one more:"
        t = first(prompt)
        if t not in used:
            used.add(t)
            out.append(prompt)
            if len(out) == n:
                return out
    raise SystemExit(f"--fixed-requests {n}: the tokenizer has only {len(out)} distinct word tokens")


def per_request_cpu(client: Any, servers: dict[str, Any], names: list[str], round_: int,
                    prompts: list[str]) -> dict[str, float]:
    """CPU seconds per one-token request of each server, over ``prompts`` (fresh), the servers
    taking turns (the order rotating). A server is idle between its turns, so the sum over its
    requests is one difference of its clock: a tick or two of error in the whole."""
    total = {name: 0.0 for name in names}
    for j, prompt in enumerate(prompts):
        k = (round_ + j) % len(names)
        for name in names[k:] + names[:k]:
            total[name] += timed(client, servers[name], prompt, 1)[0][2]
    return {name: t / len(prompts) for name, t in total.items()}


def print_fixed(fixed_rows: list[dict[str, float]], names: list[str], plain_request: float,
                args: Any) -> None:
    """serve's (and plain-again's) CPU per one-token request over plain's, and as a share of a request."""
    plain = statistics.median(r["plain"] for r in fixed_rows)
    print(f"serve_fixed_plain_cpu_per_request: {plain * 1000:.2f} ms CPU (median round; one-token"
          f" requests, {args.fixed_requests} per server per round; a {args.max_tokens}-token request:"
          f" {plain_request * 1000:.0f} ms)")
    others = [("serve", "serve_fixed_overhead")]
    if "plain-again" in names:
        others.append(("plain-again", "serve_fixed_noise_floor"))
    for name, label in others:
        d, lo, hi = median_ci([r[name] - r["plain"] for r in fixed_rows])
        print(f"{label}_cpu_per_request: {d * 1000:+.2f} ms (95% CI [{lo * 1000:+.2f}, {hi * 1000:+.2f}];"
              f" {name} minus plain, {len(fixed_rows)} rounds)")
        print(f"{label}_share_of_a_request: {d / plain_request:+.2%} (95% CI [{lo / plain_request:+.2%},"
              f" {hi / plain_request:+.2%}]; of plain's CPU for a {args.max_tokens}-token request)")


if __name__ == "__main__":
    sys.exit(main())
