"""Built-in probe prompts and turning user prompts into token ids."""

from __future__ import annotations

from typing import Any

from specparity.errors import InputError, UsageError

DEFAULT_PROMPTS = (
    "The quick brown fox jumps over the lazy dog, and then",
    "def add(a, b):\n    return a + b\n\nfor i in range(10):",
    "Speculative decoding drafts several tokens with a small model and",
)


def encode_prompts(tokenizer: Any, texts: list[str] | tuple[str, ...] | None = None,
                   ids: list[list[int]] | None = None) -> list[list[int]]:
    """Token-id prompts: explicit ``ids`` win, else ``texts`` (default: DEFAULT_PROMPTS)."""
    if ids:
        out = [list(p) for p in ids]
    else:
        out = [list(tokenizer.encode(t)) for t in (texts or DEFAULT_PROMPTS)]
    for i, p in enumerate(out):
        if not p:
            raise UsageError(f"prompt {i} encodes to no tokens")
    return out


def parse_prompt_ids(values: tuple[str, ...] | list[str]) -> list[list[int]]:
    """``--prompt-ids 1,2,3`` (repeatable) -> [[1, 2, 3], ...]."""
    out = []
    for v in values:
        try:
            ids = [int(x) for x in v.replace(" ", "").split(",") if x]
        except ValueError:
            raise InputError("prompt-ids", f"{v!r}: not a comma-separated list of integers") from None
        if not ids:
            raise InputError("prompt-ids", f"{v!r}: empty")
        out.append(ids)
    return out
