"""yunshu's server (``yunshu serve``, yunshu 0.1.5): its own evidence, per request.

Every non-streamed response carries a top-level ``x_yunshu`` object; its ``speculative`` block (present where
the request ran in the speculative lane) says ``mode`` (``dflash`` or ``mtp``), ``drafted`` and ``accepted``
(draft tokens over the request), ``rounds`` (verify forwards), ``per_depth`` (drafted / accepted at each draft
position) and ``copy`` (rounds a prompt-copy draft proposed: the profiles turn those off, so every draft is the
drafter's or the head's), and ``reasons.spec`` why the lane ran or not. A request is engaged when its lane
drafted and some draft was accepted; drafts all rejected are ``not_engaged`` (nothing accepted ever reached the
answer), never a pass. Its prompt cache: ``x_yunshu.cached_tokens`` (the profiles keep it in RAM only:
``YUNSHU_VLM_APC_DISK=0``, so nothing of an earlier run is reloaded from ``~/.yunshu/cache/apc``).

Where its state lives: every setting is given on the command line (``--set``) over an empty ``--config`` file
in the server's record folder, so no ``~/.yunshu/config.toml`` reaches it; a drafter-less arm sets
``YUNSHU_VLM_DRAFT=off`` (else it would look for a DFlash drafter in ``~/.yunshu/models`` and the Hugging Face
cache and draft with it, or with the checkpoint's MTP head).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specparity.harness.engines import EngineEvidence


def extra_argv(drafts: bool, server_dir: Path) -> list[str]:
    """An empty config file of its own, and the lane off on a drafter-less arm."""
    server_dir.mkdir(parents=True, exist_ok=True)
    config = server_dir / "yunshu.toml"
    config.write_text("# specparity: every setting is on the command line\n")
    return ["--config", str(config), *([] if drafts else ["--set", "YUNSHU_VLM_DRAFT=off"])]


def max_width(draft: str) -> int | None:
    """A DFlash drafter proposes its trained ``block_size`` rows at most (yunshu's ceiling is that block); the
    target itself (the MTP profile's drafter) takes any width (None); 0: a directory that is neither."""
    try:
        cfg = json.loads((Path(draft) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(cfg, dict):
        return 0
    if "dflash_config" in cfg:
        block = cfg.get("block_size")
        return int(block) if isinstance(block, int) and not isinstance(block, bool) else 0
    text = cfg.get("text_config") or cfg
    return None if isinstance(text, dict) and int(text.get("mtp_num_hidden_layers") or 0) > 0 else 0


def evidence(session: Any, completion: Any, before: Any) -> EngineEvidence | None:
    """The response's ``x_yunshu`` object as the request's evidence."""
    raw = getattr(completion, "raw", None) or {}
    info = raw.get("x_yunshu") if isinstance(raw, dict) else None
    if not isinstance(info, dict):
        return EngineEvidence(engaged=None, lines=["no x_yunshu object in the response"])
    spec = info.get("speculative")
    reason = (info.get("reasons") or {}).get("spec")
    cached = info.get("cached_tokens")
    ev = EngineEvidence(cache=("warm" if cached else "cold") if isinstance(cached, int) else None,
                        cached_tokens=cached if isinstance(cached, int) else None,
                        details={"speculative": spec, "reason": reason})
    if not isinstance(spec, dict):
        ev.engaged = False
        ev.lines.append(f"x_yunshu: no speculative block (spec: {reason})")
        return ev
    drafted, accepted = int(spec.get("drafted") or 0), int(spec.get("accepted") or 0)
    ev.engaged = drafted > 0 and accepted > 0
    copy = spec.get("copy") or {}
    ev.lines.append(f"x_yunshu: mode {spec.get('mode')}, {accepted} of {drafted} drafts accepted over"
                    f" {spec.get('rounds')} rounds, {copy.get('rounds', 0)} prompt-copy rounds (spec: {reason})")
    return ev


def reproduction(*, model: str, draft: str | None, body: dict[str, Any], prompt_ids: list[int] | None,
                 width: int | None, first: bool) -> dict[str, Any]:
    """None reproduces a served yunshu request in process: its speculative lane lives inside its server's batch
    runner (``VLMBatchRunner``), not a loop a command can drive."""
    from specparity.probes.replay.sequence import Reproduction

    return Reproduction(reason="yunshu's speculative lane runs inside its server's batch runner (VLMBatchRunner,"
                               " on the engine's one MLX thread): no library loop reproduces it in process").to_dict()
