"""Built-in probe prompts and turning user prompts into token ids."""

from __future__ import annotations

from typing import Any

from specparity.errors import InputError, UsageError

DEFAULT_PROMPTS = (
    "The quick brown fox jumps over the lazy dog, and then",
    "def add(a, b):\n    return a + b\n\nfor i in range(10):",
    "Speculative decoding drafts several tokens with a small model and",
)


def encode_prompt(tokenizer: Any, prompt: str | list[int], chat_template: bool = False) -> list[int]:
    """One prompt's token ids: every in-process command's prompt is tokenized here.

    Ids are taken as they are. Text is encoded as mlx-lm's generate (and its ``mlx_lm.generate``
    CLI) encodes it: with ``chat_template``, as the user's message through the tokenizer's chat
    template (with the generation prompt), encoded without special tokens; else the raw text with
    the tokenizer's special tokens. A served request's prompt is the server's own tokenize step's
    (:func:`specparity.reference.server_prompt`), not this.
    """
    if not isinstance(prompt, str):
        if chat_template:
            raise InputError("chat-template", "applies to a prompt text, not to prompt ids")
        return [int(t) for t in prompt]
    if chat_template:
        if not getattr(tokenizer, "has_chat_template", False):
            raise InputError("chat-template", ": this tokenizer has no chat template")
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
        return list(tokenizer.encode(text, add_special_tokens=False))
    return list(tokenizer.encode(prompt))


def encode_prompts(tokenizer: Any, texts: list[str] | tuple[str, ...] | None = None,
                   ids: list[list[int]] | None = None) -> list[list[int]]:
    """Token-id prompts: explicit ``ids`` win, else ``texts`` (default: DEFAULT_PROMPTS) by :func:`encode_prompt`."""
    if ids:
        out = [list(p) for p in ids]
    else:
        out = [encode_prompt(tokenizer, t) for t in (texts or DEFAULT_PROMPTS)]
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
