"""Record an accept vector by running mlx-lm's speculative decoding in process.

:func:`record_speculative` runs ``mlx_lm.generate.speculative_generate_step``
greedily (its default sampler) and turns the per-token ``from_draft`` flags it
yields into per-round accept counts: a round yields its accepted proposals
(flag True), then the target's own token (flag False). A round cut by
``max_tokens`` yields no False token; it is kept as a full accept of what it
yielded. mlx-lm verifies ``min(num_draft_tokens, max_tokens - emitted) + 1``
rows per round, so the widths are recorded per round.

:func:`specparity.probes.replay.logs.write_requests` writes the result in the
specparity JSONL format, which :func:`specparity.probes.replay.logs.read_log`
reads back.
"""

from __future__ import annotations

import logging
from typing import Any

from specparity.decode import CacheOptions
from specparity.errors import InputError
from specparity.processors import ProcessorOptions
from specparity.probes.replay.logs import AcceptLog

log = logging.getLogger(__name__)


def accepts_from_flags(flags: list[bool], num_draft_tokens: int,
                       max_tokens: int) -> tuple[list[int], list[int]]:
    """(accepts, widths) per round from speculative_generate_step's from_draft flags."""
    accepts: list[int] = []
    widths: list[int] = []
    emitted = run = 0
    for flag in flags:
        if flag:
            run += 1
            continue
        widths.append(min(num_draft_tokens, max_tokens - emitted) + 1)
        accepts.append(run)
        emitted += run + 1
        run = 0
    if run:  # the budget ran out inside a fully accepted round
        widths.append(min(num_draft_tokens, max_tokens - emitted) + 1)
        accepts.append(run)
    return accepts, widths


def record_speculative(model: Any, draft_model: Any, prompt: list[int],
                       num_draft_tokens: int, max_tokens: int,
                       opts: CacheOptions | None = None,
                       processors: ProcessorOptions | None = None,
                       stop_sequences: Any = None) -> AcceptLog:
    """Run greedy speculative decoding in process; return its accept vector and tokens.

    ``processors``: logits-processor options handed to mlx-lm's speculative
    path as ``logits_processors`` (it applies them with its own history).
    ``stop_sequences``: mlx-lm's ``StopSequences`` (``make_stop_sequences``: EOS and
    stop words): the recording ends with the token that completes one, as
    mlx_lm.server ends a completion (None: it runs to ``max_tokens``).
    """
    import mlx.core as mx
    from mlx_lm.generate import speculative_generate_step
    from mlx_lm.models.cache import make_prompt_cache

    if num_draft_tokens < 1:
        raise InputError("num-draft-tokens", f"{num_draft_tokens}: must be at least 1")
    if max_tokens < 1:
        raise InputError("max-tokens", f"{max_tokens}: must be at least 1")
    opts = opts or CacheOptions()
    procs = processors or ProcessorOptions()
    prompt_cache = None
    if opts.max_kv_size is not None:
        prompt_cache = (make_prompt_cache(model, max_kv_size=opts.max_kv_size)
                        + make_prompt_cache(draft_model, max_kv_size=opts.max_kv_size))
    tokens: list[int] = []
    flags: list[bool] = []
    matcher = stop_sequences.matcher() if stop_sequences is not None else None
    try:
        for tok, _, from_draft in speculative_generate_step(
            mx.array(prompt, dtype=mx.uint32), model, draft_model,
            num_draft_tokens=num_draft_tokens, max_tokens=max_tokens,
            prompt_cache=prompt_cache, prefill_step_size=opts.prefill_step_size,
            kv_bits=opts.kv_bits, kv_group_size=opts.kv_group_size,
            quantized_kv_start=opts.quantized_kv_start,
            logits_processors=procs.make() or None,
        ):
            tokens.append(int(tok))
            flags.append(bool(from_draft))
            if matcher is not None and matcher.advance(int(tok)):
                break
    except ValueError as err:  # mlx-lm refuses a cache it cannot trim
        raise InputError("draft-model", f": mlx-lm speculative decoding refused: {err}") from None
    accepts, widths = accepts_from_flags(flags, num_draft_tokens, max_tokens)
    log.info("recorded %d rounds, %d tokens", len(accepts), len(tokens))
    return AcceptLog(
        accepts=accepts,
        width=num_draft_tokens + 1,
        widths=widths,
        prompt_ids=list(prompt),
        tokens=tokens,
        source="mlx_lm.generate.speculative_generate_step",
        meta={"num_draft_tokens": num_draft_tokens, "max_tokens": max_tokens,
              "cache": opts.to_dict(), "processors": procs.to_dict(),
              **({"stopped": len(tokens)} if matcher is not None else {})},
    )
