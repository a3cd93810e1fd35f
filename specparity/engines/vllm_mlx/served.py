"""vllm-mlx's server (``vllm-mlx serve``, vllm-mlx 0.6.0): its own evidence, per request.

A request whose MTP head drafted carries ``generation_metadata`` (``mtp_drafts``: verify steps that drafted
for it, ``mtp_accepted``: drafts it emitted); one that did not carries none. ``GET /v1/status`` says whether
the MTP patch is installed at all (``mtp.enabled``) and counts ``attempted`` / ``accepted`` / ``rejected``
steps over the server's life, read before and after each request. A request is engaged when its own
``mtp_accepted`` (else the status's ``accepted``) rose. Where the patch is not installed, the server's log line
that says why is the request's evidence line: on mlx-lm 0.31.x, the only release vllm-mlx 0.6.0's pins allow,
``[MTP] disabled: mlx-lm BatchGenerator lacks the _step hook``. An engine-loop error the log shows after the
request started (``Engine loop error: ...``: the request then never completes) is the request's error.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specparity.harness.engines import EngineEvidence

log = logging.getLogger(__name__)

STATUS_TIMEOUT = 10.0
STATUS_MAX_BYTES = 1 << 20
# its batched engine drafts one token per verify step whatever --mtp-num-draft-tokens asks
VERIFY_ROWS = 2
# the lines in which vllm-mlx says its MTP is off (the scheduler's patch, the engine's validation, the model)
MTP_OFF = re.compile(r"\[MTP\] (disabled: .*|MTP validation failed.*|--enable-mtp is set but .*)")
# its engine loop's failure: logged, and the request it was serving never completes
LOOP_ERROR = re.compile(r"Engine loop error: (.*)")


@dataclass
class Mark:
    """Where a request starts: the status's MTP counters (None: no answer) and the log's size."""

    mtp: dict[str, Any] | None
    log_offset: int


def max_width(draft: str) -> int | None:
    """One draft per verify: 2 rows (a wider arm is not run, never clamped to 2 by the server's own warning)."""
    return VERIFY_ROWS


def read_status(url: str, timeout: float = STATUS_TIMEOUT) -> dict[str, Any] | None:
    """``GET /v1/status``'s ``mtp`` block (None: no answer, or not JSON)."""
    import httpx

    from specparity.harness.transport import BadResponse, Late, fetch, loopback_client, parse_json

    try:  # ``timeout`` in total
        with loopback_client() as client:
            status, body = fetch(client, "GET", url + "/v1/status", timeout, max_bytes=STATUS_MAX_BYTES)
        data = parse_json(body) if status == 200 else None
    except (httpx.HTTPError, Late, BadResponse) as err:
        log.debug("vllm-mlx /v1/status: %s", err)
        return None
    mtp = data.get("mtp") if isinstance(data, dict) else None
    return mtp if isinstance(mtp, dict) else None


def _size(path: Path | None) -> int:
    try:
        return path.stat().st_size if path is not None else 0
    except OSError:
        return 0


def mtp_off_reason(log_path: Path | None) -> str | None:
    """The server log's last line saying its MTP is off (None: none)."""
    try:
        text = Path(log_path).read_text(errors="replace") if log_path is not None else ""
    except OSError:
        return None
    found = [m.group(0) for m in MTP_OFF.finditer(text)]
    return found[-1][:300] if found else None


def engine_error(log_path: Path | None, offset: int) -> str | None:
    """The first engine-loop error the server logged after byte ``offset`` (None: none)."""
    try:
        with open(log_path, "rb") as f:  # type: ignore[arg-type]
            f.seek(offset)
            text = f.read().decode("utf-8", "replace")
    except (OSError, TypeError):
        return None
    found = LOOP_ERROR.search(text)
    return f"vllm-mlx engine loop error: {found.group(1).strip()[:300]}" if found else None


def mark(session: Any) -> Mark:
    return Mark(read_status(session.server.url), _size(session.server.log_path))


def _count(block: dict[str, Any] | None, key: str) -> int | None:
    v = (block or {}).get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def evidence(session: Any, completion: Any, before: Mark) -> EngineEvidence:
    """The response's ``generation_metadata`` and the status's MTP counters as the request's evidence."""
    raw = getattr(completion, "raw", None) or {}
    meta = raw.get("generation_metadata") if isinstance(raw, dict) else None
    drafts, accepted = _count(meta, "mtp_drafts"), _count(meta, "mtp_accepted")
    after = read_status(session.server.url)
    found = EngineEvidence(details={"generation_metadata": meta, "mtp_before": before.mtp, "mtp_after": after})
    found.error = engine_error(getattr(session.server, "log_path", None), before.log_offset)
    if found.error:
        found.lines.append(found.error)
    if after is not None and after.get("enabled") is False:
        why = mtp_off_reason(getattr(session.server, "log_path", None))
        found.engaged = False
        found.lines.append("vllm-mlx /v1/status: mtp.enabled false (its MTP patch is not installed)"
                           + (f": {why}" if why else ""))
        return found
    rose = {k: (_count(after, k) or 0) - (_count(before.mtp, k) or 0) for k in ("attempted", "accepted", "rejected")}
    if drafts is not None:
        found.engaged = bool(accepted)
        found.lines.append(f"generation_metadata: {drafts} MTP drafts, {accepted} accepted")
    elif after is not None and before.mtp is not None:
        # concurrent requests share the counters: a rise is this request's only where it ran alone
        found.engaged = rose["accepted"] > 0
    found.lines.append(f"vllm-mlx /v1/status mtp: +{rose['attempted']} attempted, +{rose['accepted']} accepted,"
                       f" +{rose['rejected']} rejected")
    return found
