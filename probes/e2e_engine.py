"""Any engine's own loop against mlx-lm's classic arm (``specparity e2e --engine NAME``, entry ``generate``).

An engine whose adapter runs its own speculative loop (:meth:`Engine.generate`)
gets this e2e without code of its own: the loop's emitted tokens on the prompt
against ``mlx_lm.stream_generate`` without a drafter, each with its defaults,
compared token for token (first difference, context). Engagement: the
proposals its rounds accepted.
"""

from __future__ import annotations

import time
from typing import Any

from specparity.mlx_server import stream_text
from specparity.probes.e2e import OWN_LOOP, E2EOptions, E2ERun, EntryArm, compare_arms, run_api_arm
from specparity.progress import NULL, Observer

ENTRY = "generate"


def run_generate_e2e(engine: Any, loaded: Any, prompt: list[int], max_tokens: int,
                     entry_points: list[str] | None = None, observer: Observer = NULL) -> E2ERun:
    """The engine's own loop (entry ``generate``) against mlx-lm's classic stream_generate."""
    options = E2EOptions(max_tokens=max_tokens)
    info = engine.info
    run = E2ERun(header=(f"{info.name} {info.version} on {info.target}: its own loop; classic: mlx-lm's"
                         f" stream_generate without a drafter; max_tokens={max_tokens}"),
                 options=options.passed(True), model=loaded.fingerprint.to_dict(), prompt_tokens=len(prompt))
    with observer.part("entry points", total=1):
        with engine.classic():
            classic = run_api_arm("stream_generate", loaded, None, prompt, options)
        arm = EntryArm(ENTRY, True, passed={"max_tokens": max_tokens})
        arm.step, arm.received = f"{info.name} generate {OWN_LOOP}", dict(arm.passed)
        t0 = time.perf_counter()
        own = engine.generate(list(prompt), max_tokens, record_states=False)
        arm.seconds = time.perf_counter() - t0
        arm.tokens = list(own.tokens[:max_tokens])
        arm.drafted = sum(own.accepts)
        arm.proposed = sum(r.width - 1 for r in own.rounds)  # a round verifies its anchor and its drafts
        arm.error = own.error
        arm.text = stream_text(loaded.tokenizer, arm.tokens)  # its ids as classic decode writes ids
        # classic stops at its EOS; the engine's loop is compared over the same tokens
        res = compare_arms(ENTRY, classic, arm, options, loaded.tokenizer)
        run.entries.append(res)
        observer.result(ENTRY, res.to_dict())
        observer.item("entry points")
    return run
