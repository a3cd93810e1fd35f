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
bookkeeping). Best of ``--repeat`` runs each, after a warm-up, in wall time and
in this process's CPU time (every thread, MLX's included: steadier on a shared
machine). Goal: ratio <= 1.1.

Usage: .venv/bin/python -P scripts/bench_reference.py [--model DIR] [--max-tokens 96] [--repeat 3]
Prints one figure per line, ``name: value unit``.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

GOAL = 1.1
PROMPTS = (
    "Speculative decoding drafts several tokens with a small model and verifies them",
    "The cache holds keys and values for every position; a rewind trims the rejected rows.",
    "def add(a, b):\n    return a + b\nfor i in range(10):",
    "A recurrent state cannot be trimmed and must be snapshotted instead.",
)


def requests(max_tokens: int) -> list[tuple[str, dict[str, Any]]]:
    """The built-in job's kind of requests: plain, penalised, biased, stopped, chat."""
    return [
        ("completions", {"prompt": PROMPTS[0], "max_tokens": max_tokens}),
        ("completions", {"prompt": PROMPTS[1], "max_tokens": max_tokens, "repetition_penalty": 1.3}),
        ("completions", {"prompt": PROMPTS[2], "max_tokens": max_tokens, "presence_penalty": 0.5,
                         "logit_bias": {"5": 1.0}, "stop": ["\n\n\n"]}),
        ("chat", {"messages": [{"role": "user", "content": PROMPTS[3]}], "max_tokens": max_tokens}),
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
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="checkpoint (default: the embedded fixture)")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    from specparity.fixtures import default_pair
    from specparity.reference import ClassicReference, RequestParams

    model_dir = args.model or default_pair().target
    reqs = requests(args.max_tokens)
    ref = ClassicReference(model_dir)
    load = ref.cost().load_seconds
    for endpoint, body in reqs:  # warm-up: kernels, tokenizer, the server module
        ref.complete(endpoint, {**body, "max_tokens": 4})
    ref_times: list[list[tuple[float, float]]] = [[] for _ in reqs]
    bare_times: list[list[tuple[float, float]]] = [[] for _ in reqs]
    tokens = 0
    for _ in range(args.repeat):
        ref.forget()  # a new job: nothing cached
        tokens = 0
        for i, (endpoint, body) in enumerate(reqs):
            t0 = clocks()
            out = ref.complete(endpoint, body)
            ref_times[i].append(since(t0))
            tokens += len(out.token_ids)
            params = RequestParams.from_body(body)
            bare_times[i].append(bare(ref.model, out.prompt_ids, params, ref.tokenizer, len(out.token_ids)))
    r_wall, r_cpu = (sum(min(t[k] for t in times) for times in ref_times) for k in (0, 1))
    b_wall, b_cpu = (sum(min(t[k] for t in times) for times in bare_times) for k in (0, 1))
    print(f"reference_requests: {len(reqs)} requests")
    print(f"reference_tokens: {tokens} tokens")
    print(f"reference_model_load: {load:.3f} s (once per job)")
    print(f"reference_time: {r_wall:.4f} s wall, {r_cpu:.4f} s cpu")
    print(f"bare_generation_time: {b_wall:.4f} s wall, {b_cpu:.4f} s cpu")
    print(f"reference_over_generation: {r_wall / b_wall:.3f} ratio wall (goal <= {GOAL})")
    print(f"reference_over_generation_cpu: {r_cpu / b_cpu:.3f} ratio cpu (goal <= {GOAL})")
    r, b = r_cpu, b_cpu
    return 0 if r / b <= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
