"""mlx-dspark's server (``mlx-dspark serve``, mlx-dspark 0.20.3): its own evidence, per request.

Every response carries a non-standard ``x_mlx_dspark`` block (its ``spec_info``):
``mode`` (``dspark``, ``baseline``...), ``accept_len`` (tokens committed per
target forward), ``target_forwards``, ``cap``, ``lookup_rounds`` (rounds whose
draft came from its n-gram lookup, not the drafter; the profile turns lookup
off for drafted arms) and its prefix cache (``cached_tokens``, ``cold``). A
request is engaged when it ran in ``dspark`` mode and committed more than one
token per target forward in some round (``accept_len`` > 1: drafts accepted);
the widest width is the drafter's ``block_size`` + 1 (:func:`max_width`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specparity.harness.engines import EngineEvidence


def max_width(draft: str) -> int | None:
    """The drafter's block proposes ``block_size`` tokens: block_size + 1 verify rows at most."""
    try:
        cfg = json.loads((Path(draft) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    block = cfg.get("block_size")
    return int(block) + 1 if isinstance(block, int) else None


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
