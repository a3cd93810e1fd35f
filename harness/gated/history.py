"""Logits processors with classic decode's history, on every path the server runs.

Classic decode (mlx-lm's ``generate_step`` on the whole prompt, empty cache)
calls each processor with the full history: every prompt token, then every
token emitted so far. mlx-lm 0.32's server hands its processors less:

- speculative decoding (``speculative_generate_step``) starts the history at
  the last token it was given, so a penalty never sees the rest of the prompt;
- classic decode after a prompt-cache hit is given only the uncached suffix,
  so the history starts there.

Both paths then append exactly what classic decode appends, so the missing
part is a fixed prefix of the prompt: :func:`missing_prefix` says which, and
:func:`with_history` puts it back in front of whatever the path passes.
Nothing else changes: the same processors, the same rows, the same order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

Processor = Callable[[Any, Any], Any]


def missing_prefix(prompt: Sequence[int], fed: Sequence[int], speculative: bool) -> list[int]:
    """The prompt tokens a path leaves out of its processors' history.

    ``prompt``: the whole prompt. ``fed``: what the server passed to
    ``stream_generate`` (the prompt past its cached prefix). Speculative decoding
    keeps only the last token it was fed; classic decode keeps all of it.
    Raises ValueError when ``fed`` is not the end of ``prompt``.
    """
    n, k = len(prompt), len(fed)
    if k == 0 or k > n or list(prompt[n - k:]) != list(fed):
        raise ValueError(f"the {k} tokens fed are not the end of the {n}-token prompt")
    return list(prompt[: n - 1]) if speculative else list(prompt[: n - k])


def with_history(processors: list[Processor] | None, prefix: Sequence[int]) -> list[Processor] | None:
    """``processors``, each called with ``prefix`` in front of the history it is given."""
    if not processors or not prefix:
        return processors
    import mlx.core as mx

    head = mx.array(list(prefix), dtype=mx.uint32)

    def wrap(processor: Processor) -> Processor:
        def call(tokens: Any, logits: Any) -> Any:
            tokens = head if tokens is None else mx.concatenate([head, tokens.astype(mx.uint32)])
            return processor(tokens, logits)

        return call

    return [wrap(p) for p in processors]
