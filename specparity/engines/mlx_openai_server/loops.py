"""mlx-openai-server's own generation path in process, against classic decode (``e2e --engine mlx-openai-server``).

What its server runs for a chat request once a drafter is loaded (every request then takes its single-request
path, its continuous batcher off), with its own objects: the model wrapper its handler builds (``MLX_LM``: both
checkpoints through ``mlx_lm.load``, ``--num-draft-tokens`` at its default of 2), its prompt cache
(``LRUPromptCache``, its payloads pickled to disk), the handler's own ``_normalize_nonbatch_cache_hit`` and
``_stream_with_lock_and_cache_persist`` (which generates with mlx-lm's ``stream_generate`` and stores the cache
under the prompt and every emitted token). Greedy (``temperature`` 0), the prompt's ids, ``max_tokens``; everything
else its defaults.

- ``MLX_LM``: a first request, on a fresh cache;
- ``MLX_LM, the same request again``: the same prompt once more through its prompt cache, as a repeated request
  reaches it (the cache stored under prompt + emitted tokens, trimmed back to all but the prompt's last token).

Its acceptance record is mlx-lm's own: each response's ``from_draft`` (a token the drafter proposed and the
target accepted); a round ends at the target's own token. The repeated entry point's reason adds what its prompt
cache said it served and the offset the target's cache was actually at.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

from specparity.decode import cache_offset
from specparity.harness.lifecycle import scratch_dir
from specparity.probes.engine_e2e import Classic, Finding, failed, judge, load_once

ENGINE = "mlx-openai-server"
FRESH = "MLX_LM"
AGAIN = "MLX_LM, the same request again"
ENTRY_POINTS = (FRESH, AGAIN)
# its launch default (--num-draft-tokens)
NUM_DRAFT = 2


def _rounds(flags: list[bool], k: int) -> list[dict[str, Any]]:
    """mlx-lm's record read into rounds: drafted tokens it accepted, then the target's own token closes the round."""
    rounds: list[dict[str, Any]] = []
    accepted = 0
    for from_draft in flags:
        if from_draft:
            accepted += 1
            continue
        rounds.append({"drafted": k, "accepted": accepted, "committed": accepted + 1, "source": "draft model"})
        accepted = 0
    if accepted:  # max_tokens ended the stream inside a round
        rounds.append({"drafted": k, "accepted": accepted, "committed": accepted, "source": "draft model"})
    return rounds


def loops(target: str, draft: str | None, prompt: list[int], max_tokens: int, classic: Classic,
          entries: tuple[str, ...] = ()) -> list[Finding]:
    def load() -> Any:
        from app.handler.mlx_lm import MLXLMHandler
        from app.models.mlx_lm import MLX_LM
        from app.utils.prompt_cache import LRUPromptCache

        model = MLX_LM(str(target), draft_model_path=str(draft) if draft else None, num_draft_tokens=NUM_DRAFT)
        # its prompt cache pickles each entry there (megabytes a request): removed when the run ends
        cache = LRUPromptCache(cache_dir=str(scratch_dir("specparity-mlx-openai-server-")))
        # the handler's own methods on the parts they read (self.model, self.prompt_cache, self._generation_lock)
        handler = SimpleNamespace(model=model, prompt_cache=cache, _generation_lock=threading.RLock())
        return MLXLMHandler, handler

    loaded = load_once(load)
    out: list[Finding] = []
    for entry in ENTRY_POINTS:
        if entries and entry not in entries:
            continue
        f = Finding(ENGINE, entry)
        t0 = time.perf_counter()
        try:
            cls, handler = loaded()
            if entry == AGAIN and not any(x.entry == FRESH for x in out):
                _request(cls, handler, list(prompt), max_tokens)  # the request it repeats
            tokens, flags, note = _request(cls, handler, list(prompt), max_tokens)
            f.tokens, f.rounds = tokens, _rounds(flags, handler.model.num_draft_tokens)
            f.drafted = sum(r["drafted"] for r in f.rounds)
            f.accepted = sum(r["accepted"] for r in f.rounds)
            judge(f, classic.tokens(list(prompt)), classic.eos, 0)
            if entry == AGAIN:
                f.reason += f"; {note}"
        except Exception as err:  # noqa: BLE001  (the engine's own error is its finding)
            failed(f, err)
        f.seconds = time.perf_counter() - t0
        out.append(f)
    return out


def _request(cls: Any, handler: Any, ids: list[int], max_tokens: int) -> tuple[list[int], list[bool], str]:
    """One request down its single-request path (``_build_inference_context``'s cache steps, then the worker's
    ``_stream_with_lock_and_cache_persist``): the tokens, mlx-lm's ``from_draft`` per token, and what its cache
    reused against the offset the target's cache was at."""
    model = handler.model
    cache, rest = handler.prompt_cache.fetch_nearest_cache(ids, allowed_sources={"nonbatch"})
    cache, rest = cls._normalize_nonbatch_cache_hit(handler, ids, cache, rest)
    if cache is None:
        cache = model.create_prompt_cache()
    # the target's first layer that keeps an offset (a hybrid's layer 0 is a linear-attention cache: none)
    offset = next((o for o in map(cache_offset, cache) if o is not None), None)
    reused = len(ids) - len(rest)
    tokens, flags = [], []
    for chunk in cls._stream_with_lock_and_cache_persist(handler, list(ids), cache, input_ids=rest, prompt_cache=cache,
                                                         stream=True, max_tokens=max_tokens, temperature=0.0):
        tokens.append(int(chunk.token))
        flags.append(bool(chunk.from_draft))
    note = (f"its prompt cache served {reused} of {len(ids)} prompt tokens; the target's cache it decoded from was at"
            f" offset {offset}")
    return tokens, flags, note
