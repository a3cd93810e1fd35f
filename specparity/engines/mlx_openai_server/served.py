"""mlx-openai-server's server (``mlx-openai-server launch --model-type lm``, 1.8.1): its served hooks.

It reports nothing of its drafts (no field, counter or log line): the witness wrappers of both checkpoints are the
evidence a request drafted (the profile's ``witness: [target, draft]``). What it does report, each response's
``usage.prompt_tokens_details.cached_tokens`` (prompt tokens its prompt cache served), is read here as the request's
cold or warm cache. Its chat prompts are rendered from :data:`CHAT_TEMPLATE` (mlx_lm.server's prompt for a tokenizer
without a template), its prompt cache's disk payloads kept in the server's own folder, and a
first drafted request's finding reproduced by mlx-lm's speculative path in process (its loop is
``mlx_lm.stream_generate`` with the drafter on a fresh cache).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specparity.harness.engines import EngineEvidence

# mlx_lm.server's convert_chat (mlx-lm 0.31.3) as a chat template: the prompt it builds for a tokenizer without one
# (each message as its role's prefix, its content and a newline, then "ASSISTANT: " stripped at the right)
CHAT_TEMPLATE = (
    "{%- set prefix = {'system': \"ASSISTANT's RULE: \", 'user': 'USER: ', 'assistant': 'ASSISTANT: '} -%}"
    "{%- for message in messages -%}"
    "{{- prefix.get(message['role'], '') ~ message['content'] ~ '\\n' -}}"
    "{%- endfor -%}"
    "ASSISTANT:"
)
TEMPLATE_FILE = "convert_chat.jinja"


def extra_argv(drafts: bool, server_dir: Path) -> list[str]:
    """Its chat template (:data:`CHAT_TEMPLATE`, written into the server's folder: the record keeps what it read) and
    its prompt cache's disk payloads there too (its default is a temporary directory it removes only on a clean exit,
    so a stopped server would leave one behind)."""
    folder = Path(server_dir)
    folder.mkdir(parents=True, exist_ok=True)
    template = folder / TEMPLATE_FILE
    template.write_text(CHAT_TEMPLATE)
    return ["--chat-template-file", str(template), "--prompt-cache-dir", str(folder / "prompt-cache")]


def evidence(session: Any, completion: Any, before: Any) -> EngineEvidence | None:
    """The response's cached prompt tokens as the request's cache state (whether it drafted: the witness)."""
    usage = getattr(completion, "usage", None) or {}
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if not isinstance(cached, int) or isinstance(cached, bool):
        return None
    ev = EngineEvidence(engaged=None, cache="warm" if cached else "cold", cached_tokens=cached)
    ev.lines.append(f"usage.prompt_tokens_details.cached_tokens: {cached}")
    return ev


def reproduction(*, model: str, draft: str | None, body: dict[str, Any], prompt_ids: list[int] | None,
                 width: int | None, first: bool) -> dict[str, Any]:
    """``specparity replay --draft-model`` of a first drafted request (mlx-lm's speculative path with K = width - 1
    drafts on a fresh cache, the request's processors and stop words, on the prompt ids classic decode used), or
    why none reproduces it."""
    from specparity.mlx_server import ServerSettings
    from specparity.probes.replay.sequence import Reproduction, request_command

    def why(reason: str) -> dict[str, Any]:
        return Reproduction(reason=reason).to_dict()

    if not first:
        return why("mlx-openai-server's prompt cache (target and drafter caches, pickled to disk and trimmed to a"
                   " common prefix): this request was not its server's first, and no replay rebuilds that cache")
    if draft is None:
        return why("a request mlx-openai-server served without a drafter (its continuous batcher): there is no"
                   " drafter path to rerun")
    if width is None:
        return why("the arm's width is not known: the replay needs the --num-draft-tokens the server was given")
    if prompt_ids is None:
        return why("no prompt token ids for this request (no classic reference ran)")
    return request_command(model, body, prompt_ids, draft_model=draft,
                           settings=ServerSettings(num_draft_tokens=width - 1)).to_dict()
