#!/usr/bin/env python3
"""Classic reference cost: its own time / the generation it needs, timed bare in the same run.

The reference (``ClassicReference.complete``) answers a set of served requests
(completions and chat, with and without logits processors and stop words),
each computed fresh (a new reference per repeat, so no cache hit). The bare arm
is the generation those answers need and nothing else: mlx-lm's own
``generate_step`` over the same prompt ids with the same sampler and processors,
for as many tokens as the reference emitted, each token read back as the
server reads it. The ratio is what the reference adds on top (the server's
tokenize step, the stop matcher, the text machine, the top-2 margins, the
bookkeeping).

The two arms are interleaved: ``--repeat`` paired runs after a warm-up, each
running every request through both arms, the order of the arms alternating from
one run to the next, so drift and a neighbour's load hit both alike. Per paired
run, the ratio of the arms' summed times, in wall time and in this process's CPU
time (every thread, MLX's included: steadier on a shared machine); the figure is
the median ratio with its distribution-free 95% confidence interval
(scripts/benchstats.py). Goal: ratio <= 1.1, met when the interval's upper end
is within it, missed when its lower end is over it, otherwise not resolved.

Usage: .venv/bin/python -P scripts/bench_reference.py [--model DIR] [--max-tokens 96] [--repeat 25]
       [--prompt-scale 1] [--profile FILE]
Prints one figure per line, ``name: value unit``; exits 1 when the CPU ratio's interval is not within the goal.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run with -P: the shared statistics beside it
from benchstats import interleaved, met, ratio_line  # noqa: E402

GOAL = 1.1
PROMPTS = (
    "Speculative decoding drafts several tokens with a small model and verifies them",
    "The cache holds keys and values for every position; a rewind trims the rejected rows.",
    "def add(a, b):\n    return a + b\nfor i in range(10):",
    "A recurrent state cannot be trimmed and must be snapshotted instead.",
)


def requests(max_tokens: int, scale: int = 1) -> list[tuple[str, dict[str, Any]]]:
    """The built-in job's kind of requests: plain, penalised, biased, stopped, chat (each prompt ``scale`` times)."""
    p = [" ".join([t] * scale) for t in PROMPTS]
    return [
        ("completions", {"prompt": p[0], "max_tokens": max_tokens}),
        ("completions", {"prompt": p[1], "max_tokens": max_tokens, "repetition_penalty": 1.3}),
        ("completions", {"prompt": p[2], "max_tokens": max_tokens, "presence_penalty": 0.5,
                         "logit_bias": {"5": 1.0}, "stop": ["\n\n\n"]}),
        ("chat", {"messages": [{"role": "user", "content": p[3]}], "max_tokens": max_tokens}),
    ]


def clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def since(t: tuple[float, float]) -> tuple[float, float]:
    now = clocks()
    return now[0] - t[0], now[1] - t[1]


def bare(model: Any, prompt: list[int], params: Any, tokenizer: Any, n: int) -> tuple[float, float]:
    """mlx-lm's generate_step for ``n`` tokens with the request's sampler and processors; (wall, cpu) s."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    t0 = clocks()
    steps = generate_step(mx.array(prompt), model, max_tokens=n, sampler=params.make_sampler(tokenizer),
                          logits_processors=params.make_processors() or None)
    for _ in steps:
        pass
    return since(t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--model", default=None, help="checkpoint (default: the embedded fixture)")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--repeat", type=int, default=25, help="paired runs (at least 6 for an interval)")
    ap.add_argument("--prompt-scale", type=int, default=1, help="each prompt's text this many times (longer prompts)")
    ap.add_argument("--profile", default=None, help="write cProfile stats of the reference arm here")
    args = ap.parse_args()
    if args.repeat < 6:
        ap.error("--repeat: at least 6 (a confidence interval of a median needs them)")

    from specparity.fixtures import default_pair
    from specparity.reference import ClassicReference, RequestParams

    model_dir = args.model or default_pair().target
    reqs = requests(args.max_tokens, args.prompt_scale)
    ref = ClassicReference(model_dir)
    load = ref.cost().load_seconds
    for endpoint, body in reqs:  # warm-up: kernels, tokenizer, the server module
        ref.complete(endpoint, {**body, "max_tokens": 4})
    # what the bare arm needs of each request: its prompt ids and token count (greedy: the same every run)
    shapes = []
    for endpoint, body in reqs:
        out = ref.complete(endpoint, body)
        shapes.append((out.prompt_ids, RequestParams.from_body(body), len(out.token_ids)))
    ref.forget()
    tokens = sum(n for _, _, n in shapes)
    prof = None
    if args.profile:
        import cProfile

        prof = cProfile.Profile()

    def reference_arm() -> tuple[float, float]:
        ref.forget()  # a new job: nothing cached
        t0 = clocks()
        if prof is not None:
            prof.enable()
        for endpoint, body in reqs:
            ref.complete(endpoint, body)
        if prof is not None:
            prof.disable()
        return since(t0)

    def bare_arm() -> tuple[float, float]:
        t0 = clocks()
        for prompt, params, n in shapes:
            bare(ref.model, prompt, params, ref.tokenizer, n)
        return since(t0)

    runs = interleaved([reference_arm, bare_arm], args.repeat)
    wall = [r[0][0] / r[1][0] for r in runs]
    cpu = [r[0][1] / r[1][1] for r in runs]
    med = sorted(runs, key=lambda r: r[0][1] / r[1][1])[len(runs) // 2]
    print(f"reference_requests: {len(reqs)} requests, {sum(len(p) for p, _, _ in shapes)} prompt tokens,"
          f" {tokens} tokens per run, {args.repeat} paired runs")
    print(f"reference_model_load: {load:.3f} s (once per job)")
    print(f"reference_time: {med[0][0]:.4f} s wall, {med[0][1]:.4f} s cpu (the median run)")
    print(f"bare_generation_time: {med[1][0]:.4f} s wall, {med[1][1]:.4f} s cpu (the same run)")
    print(ratio_line("reference_over_generation", wall, GOAL, "wall"))
    print(ratio_line("reference_over_generation_cpu", cpu, GOAL, "cpu"))
    if prof is not None:
        prof.dump_stats(args.profile)
        print(f"reference_profile: {args.profile} (python -m pstats {args.profile})")
    return 0 if met(cpu, GOAL) else 1


if __name__ == "__main__":
    sys.exit(main())
