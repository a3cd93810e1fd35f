"""What engines' served hooks share: the evidence type they return and the own-loop reproduction.

Which module serves which engine is declared in the engine registry
(:mod:`specparity.engines`: an engine's ``hooks``, its package's ``served.py``), which also
documents every hook (:class:`specparity.engines.ServedHooks`); a profile names its engine
(``engine: llama_cpp`` or ``engine: llama.cpp``) and gets its hooks from
:func:`specparity.engines.served_hooks`.

Add a server: write one profile YAML (``harness/profiles/*.yaml`` documents
every key; a user's file is passed by path). Add an engine: one package under
``specparity/engines/`` or a distribution of its own (docs/engines.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class EngineEvidence:
    """What an engine's own evidence reader found over one request (engines' ``evidence`` hook).

    engaged: the drafter ran (None: cannot tell). declined: the engine fell back to its classic
    path for this request. accepts / widths: accepted drafts and verify rows per round.
    lines: evidence lines for the report. cache: prompt-cache state (``cold`` / ``warm``, None:
    unknown). cached_tokens: prompt tokens served from the cache. error: the engine failed this request
    (its own message, e.g. from its log): the request is an error, even where a response came.
    details: anything else to keep.
    """

    engaged: bool | None = None
    declined: bool = False
    accepts: list[int] = field(default_factory=list)
    widths: list[int] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    cache: str | None = None
    cached_tokens: int | None = None
    error: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


def own_loop_replay(engine: str, verify_mode: str, *, model: str, draft: str, body: dict[str, Any],
                    prompt_ids: list[int] | None) -> dict[str, Any]:
    """The reproduction of a served request by ``replay --engine ENGINE --verify-mode MODE``: the engine's
    own loop in process, greedy and without logits processors, on the prompt ids the server decoded;
    or why none reproduces (no ids, a sampled request, logits processors, a body it cannot read)."""
    from specparity.errors import UsageError
    from specparity.mlx_server import RequestParams
    from specparity.probes.replay.sequence import Reproduction, replay_command

    def why(reason: str) -> dict[str, Any]:
        return Reproduction(reason=reason).to_dict()

    if prompt_ids is None:
        return why("no prompt token ids for this request (no classic reference ran)")
    try:
        params = RequestParams.from_body(body)
    except UsageError as err:
        return why(str(err))
    if params.temperature != 0:
        return why(f"sampled at temperature {params.temperature:g}: the replay decodes greedily")
    if params.repetition_penalty or params.presence_penalty or params.frequency_penalty or params.logit_bias:
        return why(f"the request's logits processors: {engine}'s loop in process runs without them")
    return Reproduction(command=replay_command(
        ("--engine", engine), ("--model", model), ("--draft-model", draft), ("--prompt-ids", prompt_ids),
        ("--verify-mode", verify_mode), ("--max-tokens", params.max_tokens))).to_dict()
