"""mlx-omni-server's chat generation in process, against classic decode (``e2e --engine mlx-omni-server``).

What its server runs for a chat request that names a ``draft_model``, with its own objects: the ``ChatGenerator``
its wrapper cache hands out for the (model, drafter) pair (``ChatGenerator.get_or_create``: both checkpoints
through ``mlx_lm.load``), its ``generate_stream`` with the arguments its OpenAI adapter passes for a greedy request
(``temp`` 0, ``top_p`` 1, ``top_k`` 0, its prompt cache on), which renders the chat, tokenizes it, takes a cache
from its prompt cache pool and generates with mlx-lm's ``stream_generate(draft_model=...)`` at mlx-lm's default of
2 drafts per round.

- ``ChatGenerator.generate_stream``: a first request, its prompt cache empty;
- ``ChatGenerator.generate_stream, the same request again``: the same chat once more through its prompt cache.

The chat is one user message holding the prompt's text; the project's fixture tokenizers have no chat template, so
its tokenizer is given mlx_lm.server's prompt for one (:data:`specparity.engines.mlx_omni_server.served.CHAT_TEMPLATE`,
as a checkpoint with that template would carry it): the ids it consumed are the finding's ``prompt``, classic
decode's prompt. Its record is mlx-lm's ``from_draft`` per token; a round ends at the target's own token.
"""

from __future__ import annotations

import time
from typing import Any

from specparity.probes.engine_e2e import Classic, Finding, failed, judge, load_once

ENGINE = "mlx-omni-server"
FRESH = "ChatGenerator.generate_stream"
AGAIN = "ChatGenerator.generate_stream, the same request again"
ENTRY_POINTS = (FRESH, AGAIN)
# mlx-lm's stream_generate default: mlx-omni-server passes no num_draft_tokens
NUM_DRAFT = 2
# what its OpenAI adapter passes for a request with temperature 0 and no top_p / extra_body
GREEDY = {"temp": 0.0, "top_p": 1.0, "top_k": 0}


def _rounds(flags: list[bool]) -> list[dict[str, Any]]:
    rounds: list[dict[str, Any]] = []
    accepted = 0
    for from_draft in flags:
        if from_draft:
            accepted += 1
            continue
        rounds.append({"drafted": NUM_DRAFT, "accepted": accepted, "committed": accepted + 1, "source": "draft model"})
        accepted = 0
    if accepted:
        rounds.append({"drafted": NUM_DRAFT, "accepted": accepted, "committed": accepted, "source": "draft model"})
    return rounds


def loops(target: str, draft: str | None, prompt: list[int], max_tokens: int, classic: Classic,
          entries: tuple[str, ...] = ()) -> list[Finding]:
    def load() -> Any:
        from mlx_omni_server.chat.mlx.chat_generator import ChatGenerator

        from specparity.engines.mlx_omni_server.served import CHAT_TEMPLATE

        generator = ChatGenerator.get_or_create(model_id=str(target), draft_model_id=str(draft) if draft else None)
        if not getattr(generator.tokenizer, "chat_template", None):
            generator.tokenizer.chat_template = CHAT_TEMPLATE
        return generator

    loaded = load_once(load)
    text = classic.loaded.tokenizer.decode(list(prompt))
    messages = [{"role": "user", "content": text}]
    out: list[Finding] = []
    for entry in ENTRY_POINTS:
        if entries and entry not in entries:
            continue
        f = Finding(ENGINE, entry)
        t0 = time.perf_counter()
        try:
            generator = loaded()
            if generator.model.draft_model is None:
                raise RuntimeError(f"its ChatGenerator loaded no drafter from {draft!r} (it logs why and goes on)")
            if entry == AGAIN and not any(x.entry == FRESH for x in out):
                _request(generator, messages, max_tokens)  # the request it repeats
            ids, tokens, flags, cached = _request(generator, messages, max_tokens)
            f.prompt, f.tokens, f.rounds = ids, tokens, _rounds(flags)
            f.drafted = sum(r["drafted"] for r in f.rounds)
            f.accepted = sum(r["accepted"] for r in f.rounds)
            reference = classic.tokens(ids)
            judge(f, reference, classic.eos, 0)
            if len(tokens) == len(reference) - 1 and not f.index:
                f.reason += ("; its generate_stream stops at mlx-lm's last response, the one that carries the"
                             " finish reason and the last token, and drops it")
            if entry == AGAIN:
                f.reason += f"; its prompt cache said {cached} of {len(ids)} prompt tokens were cached"
        except Exception as err:  # noqa: BLE001  (the engine's own error is its finding)
            failed(f, err)
        f.seconds = time.perf_counter() - t0
        out.append(f)
    return out


def _request(generator: Any, messages: list[dict[str, Any]], max_tokens: int) -> tuple[list[int], list[int],
                                                                                     list[bool], int]:
    """One greedy chat request through its ``generate_stream``: the prompt ids it consumed, its tokens, mlx-lm's
    ``from_draft`` per token and the cached prompt tokens it reported."""
    ids = list(generator.tokenizer.encode(generator._prepare_prompt(list(messages), None, {}, None)))
    tokens, flags, cached = [], [], 0
    for result in generator.generate_stream(list(messages), None, max_tokens, dict(GREEDY), None, {}, True,
                                            repetition_penalty=None, json_schema=None):
        tokens.append(int(result.content.token))
        flags.append(bool(result.from_draft))
        cached = int(result.stats.cache_hit_tokens)
    return ids, tokens, flags, cached
