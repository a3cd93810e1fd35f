"""mlx-vlm's server (``python -m mlx_vlm.server``, mlx-vlm 0.7.10): its own evidence, per request.

Every non-streamed chat response carries ``timings`` (llama.cpp's field names): with a drafter, ``draft_kind``,
``draft_rounds`` (verify rounds), ``draft_n`` (drafts proposed) and ``draft_n_accepted`` (drafts accepted) over the
request, from the drafter's own counters (``speculative_stats_since``: exact for one request at a time). A request
is engaged when it drafted and some draft was accepted; drafts all rejected are ``not_engaged`` (nothing accepted
reached the answer), never a pass. Its prompt cache: ``usage.prompt_tokens_details.cached_tokens``.
"""

from __future__ import annotations

from typing import Any

from specparity.harness.engines import EngineEvidence


def evidence(session: Any, completion: Any, before: Any) -> EngineEvidence | None:
    """The response's ``timings`` as the request's evidence (its cached prompt tokens as its cache state)."""
    raw = getattr(completion, "raw", None) or {}
    timings = raw.get("timings") if isinstance(raw, dict) else None
    usage = raw.get("usage") if isinstance(raw, dict) else None
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    cached = cached if isinstance(cached, int) and not isinstance(cached, bool) else None
    ev = EngineEvidence(cache=None if cached is None else ("warm" if cached else "cold"), cached_tokens=cached,
                        details={"timings": timings})
    if not isinstance(timings, dict):
        ev.engaged = None
        ev.lines.append("no timings object in the response")
        return ev
    drafted, accepted = timings.get("draft_n"), timings.get("draft_n_accepted")
    if not isinstance(drafted, int) or not isinstance(accepted, int):
        ev.engaged = False
        ev.lines.append(f"timings: no draft counts (draft_kind {timings.get('draft_kind')}): it did not draft")
        return ev
    ev.engaged = drafted > 0 and accepted > 0
    ev.lines.append(f"timings: draft_kind {timings.get('draft_kind')}, {accepted} of {drafted} drafts accepted over"
                    f" {timings.get('draft_rounds')} rounds")
    return ev


def reproduction(*, model: str, draft: str | None, body: dict[str, Any], prompt_ids: list[int] | None,
                 width: int | None, first: bool) -> dict[str, Any]:
    """None reproduces a served mlx-vlm request in process: its server decodes in its continuous batcher
    (``ResponseGenerator``), whose rounds no command drives; ``e2e --engine mlx-vlm`` runs its ``generate_step``
    loops on the same pair."""
    from specparity.probes.replay.sequence import Reproduction

    return Reproduction(reason="mlx-vlm's server decodes in its continuous batcher (ResponseGenerator): no library"
                               " loop a command drives rebuilds it; e2e --engine mlx-vlm runs its generate_step loops"
                               " on the same pair").to_dict()
