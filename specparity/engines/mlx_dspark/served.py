"""mlx-dspark's server (``mlx-dspark serve``, mlx-dspark 0.20.3): its own evidence, per request.

Every response carries a non-standard ``x_mlx_dspark`` block (its ``spec_info``):
``mode`` (``dspark``, ``baseline``...), ``accept_len`` (tokens committed per
target forward), ``target_forwards``, ``cap``, ``lookup_rounds`` (rounds whose
draft came from its n-gram lookup, not the drafter; the profile turns lookup
off for drafted arms) and its prefix cache (``cached_tokens``, ``cold``). A
request is engaged when it ran in ``dspark`` mode and committed more than one
token per target forward in some round (``accept_len`` > 1: drafts accepted);
the widest width is the drafter's ``block_size`` + 1 (:func:`max_width`). A served divergence
prints its reproduction in process (:func:`reproduction`), or why none.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specparity.harness.engines import EngineEvidence


def max_width(draft: str) -> int | None:
    """The drafter's block proposes ``block_size`` tokens: block_size + 1 verify rows at most (0: a
    checkpoint without a ``block_size``, such as the target itself, is not a DSpark drafter: the server
    aborts on it; None: its config cannot be read)."""
    try:
        cfg = json.loads((Path(draft) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    block = cfg.get("block_size") if isinstance(cfg, dict) else None
    return int(block) + 1 if isinstance(block, int) and not isinstance(block, bool) else 0


def evidence(session: Any, completion: Any, before: Any) -> EngineEvidence | None:
    """The response's ``x_mlx_dspark`` block as the request's evidence."""
    raw = getattr(completion, "raw", None) or {}
    info = raw.get("x_mlx_dspark")
    if not isinstance(info, dict):
        return EngineEvidence(engaged=None, lines=["no x_mlx_dspark block in the response"])
    mode = info.get("mode")
    accept = float(info.get("accept_len") or 0.0)
    lookup = int(info.get("lookup_rounds") or 0)
    cached = info.get("cached_tokens")
    ev = EngineEvidence(engaged=(mode == "dspark" and accept > 1.0) if mode == "dspark" else False,
                        cache=("warm" if cached else "cold") if isinstance(cached, int) else None,
                        cached_tokens=cached if isinstance(cached, int) else None, details=dict(info))
    ev.lines.append(f"x_mlx_dspark: mode {mode}, {accept:g} tokens per target forward over"
                    f" {info.get('target_forwards')} forwards, cap {info.get('cap')}, {lookup} lookup rounds")
    return ev


def reproduction(*, model: str, draft: str | None, body: dict[str, Any], prompt_ids: list[int] | None,
                 width: int | None, first: bool) -> dict[str, Any]:
    """``specparity replay --engine mlx-dspark --verify-mode max-draft-N`` of one served request, or why none
    reproduces it.

    The replay runs mlx-dspark's own ``speculative_generate`` in process as the profile's drafted arm
    runs it in the server (``--max-draft N --no-lookup-drafts``: N = the arm's width - 1, every draft the
    drafter's), on the prompt ids the server decoded, for ``max_tokens``, greedy, on a fresh cache, and
    places the first differing token, logits row and state to its round.
    """
    from specparity.engines.mlx_dspark.adapter import SERVED_MAX_CAP
    from specparity.harness.engines import own_loop_replay
    from specparity.probes.replay.sequence import Reproduction

    def why(reason: str) -> dict[str, Any]:
        return Reproduction(reason=reason).to_dict()

    if not first:
        return why("mlx-dspark's prefix cache: this request was not the first its server received, and no replay"
                   " rebuilds the cache it may have reused (it lives in its server only)")
    if draft is None:
        return why("an arm of mlx-dspark serve without the drafter (its baseline mode, greedy_generate): the"
                   " in-process replay runs its speculative loop, which needs the drafter")
    if width is None:
        return why("the arm's width is not known: the replay pins the cap the server was given (--max-draft)")
    block = max_width(draft)
    if width - 1 > SERVED_MAX_CAP or (block is not None and width > block):
        return why(f"this arm verified {width} rows (--max-draft {width - 1}): replay --engine mlx-dspark takes"
                   f" --verify-mode max-draft-1..{min(SERVED_MAX_CAP, (block or SERVED_MAX_CAP + 1) - 1)}")
    return own_loop_replay("mlx-dspark", f"max-draft-{width - 1}", model=model, draft=draft, body=body,
                           prompt_ids=prompt_ids)
