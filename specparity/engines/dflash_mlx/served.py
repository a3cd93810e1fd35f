"""dflash-mlx's server (``dflash serve``, dflash-mlx 0.1.8): its arms and its own evidence.

Read from its source and run live (/work/team/dflash-serve-notes.md has the
details). What the hooks do:

- An arm without a drafter is still ``dflash serve`` with the drafter (it
  always loads one), started with ``--fastpath-max-tokens`` above any
  request's ``max_tokens``: every request then goes through mlx-lm's own server
  loop with the drafter set aside (``/metrics``: ``mode_used ar_fastpath``),
  classic decode in the same process, environment and weights.
- A drafted arm pins its width in the profile's ``draft_argv`` (``--verify-mode
  dflash --verify-len-cap W``: W rows per verify forward, the adaptive
  controller off) and runs with ``--diagnostics full``: every verify round is a
  line of ``<server_dir>/dflash-diagnostics/cycle_events.jsonl`` (rows, drafts
  accepted, and what proposed the block: ``dflash``, the DFlash drafter;
  ``copyspec``, a copy of an earlier stretch of the prompt and output;
  ``none``, the last token alone). Every arm writes one line per request to
  ``post_events.jsonl`` there (``--diagnostics basic`` without a drafter: no
  effect on what it computes), the fields ``/metrics`` shows as
  ``last_request``; read from the file, a request's evidence costs no request.
- The widest width is the drafter's ``block_size`` (:func:`max_width`): the
  server would clamp a larger cap silently, so a wider arm is not run.
- Per request (:func:`mark` before, :func:`evidence` after): its post event
  (or, with no diagnostics folder, ``/metrics`` JSON ``last_request``), whose
  ``mode_used`` is ``dflash`` (the drafter's path), ``dflash_fallback`` (fell
  back to target-only decoding: a decline) or ``ar_fastpath`` (target only),
  and the request's verify rounds. A request is
  engaged only when at least one round's block came from the DFlash drafter: a
  request whose only speculation was copied from its history says nothing of
  the drafter. The prompt cache's state comes from the response
  (``usage.prompt_tokens_details.cached_tokens``: 0 cold, > 0 warm).
- A request the engine fails (it closes the connection without a response, or
  ends a stream without a finish, and keeps serving) is an error with the
  engine's own message from its log, never a completion to compare.
- A drafted arm's finding on the first request its server received (a fresh
  prefix cache) reproduces through the engine in process (:func:`reproduction`:
  ``specparity replay --engine dflash-mlx`` runs dflash-mlx's own loop at the
  drafter's block size and walks it against classic decode); a later request
  met the server's prefix cache, which no replay rebuilds.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specparity.harness.engines import EngineEvidence

log = logging.getLogger(__name__)

DIAGNOSTICS_DIR = "dflash-diagnostics"
CYCLE_EVENTS = "cycle_events.jsonl"
POST_EVENTS = "post_events.jsonl"
# every request's max_tokens is below this: the no-drafter arms serve every request target-only
FASTPATH_ALL = 1_000_000_000
ENGAGED_MODES = ("dflash",)
DECLINED_MODES = ("dflash_fallback",)
BASELINE_MODES = ("ar_fastpath",)
DFLASH_SOURCE = "dflash"
COPY_SOURCE = "copyspec"
# the server records a request after its last token is sent: how long to wait for it
METRICS_WAIT = 10.0
METRICS_WAIT_FAILED = 2.0  # a request the engine failed (no response, or a stream with no finish)
METRICS_TIMEOUT = 30.0
METRICS_MAX_BYTES = 8 << 20  # a /metrics answer far larger than any dflash-mlx sends is no reading
# the last exception line of a Python traceback in the server log
_ERROR_LINE = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception)\b.*)$")


def extra_argv(drafts: bool, server_dir: Path) -> list[str]:
    """A drafted arm writes its requests and verify rounds under ``server_dir``; an arm without one serves
    target only and writes its requests there."""
    where = ["--diagnostics-dir", str(Path(server_dir) / DIAGNOSTICS_DIR)]
    if not drafts:
        return ["--fastpath-max-tokens", str(FASTPATH_ALL), "--diagnostics", "basic", *where]
    return ["--diagnostics", "full", *where]


def max_width(draft: str) -> int | None:
    """The drafter's ``block_size`` (0: not a DFlash drafter; None: its config cannot be read)."""
    try:
        config = json.loads((Path(draft) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    size = config.get("block_size") if isinstance(config, dict) else None
    return size if isinstance(size, int) and not isinstance(size, bool) else 0


@dataclass
class Mark:
    """Where one request's evidence starts: the rounds file's and the requests file's sizes (None: no
    requests file, so /metrics), the last request /metrics had done (only then), the server log's size."""

    cycle_offset: int
    post_offset: int | None
    request_id: int | None
    log_offset: int


def cycle_file(server_dir: Path) -> Path:
    return Path(server_dir) / DIAGNOSTICS_DIR / CYCLE_EVENTS


def post_file(server_dir: Path) -> Path:
    return Path(server_dir) / DIAGNOSTICS_DIR / POST_EVENTS


def _size(path: Path | None) -> int:
    try:
        return path.stat().st_size if path is not None else 0
    except OSError:
        return 0


def read_metrics(url: str, timeout: float = METRICS_TIMEOUT) -> dict[str, Any] | None:
    """``GET /metrics`` as JSON (None: no answer, or not JSON)."""
    import httpx

    from specparity.harness.transport import BadResponse, Late, fetch, loopback_client, parse_json

    try:  # ``timeout`` in total: a /metrics that trickles bytes is no reading
        with loopback_client() as client:
            status, body = fetch(client, "GET", url + "/metrics", timeout, max_bytes=METRICS_MAX_BYTES)
        data = parse_json(body) if status == 200 else None
    except (httpx.HTTPError, Late, BadResponse) as err:
        log.debug("dflash /metrics: %s", err)
        return None
    return data if isinstance(data, dict) else None


def _last_id(metrics: dict[str, Any] | None) -> int | None:
    last = (metrics or {}).get("last_request") or {}
    rid = last.get("request_id") if isinstance(last, dict) else None
    return rid if isinstance(rid, int) else None


def mark(session: Any) -> Mark:
    post = post_file(session.server_dir)
    cycles, log_offset = _size(cycle_file(session.server_dir)), _size(session.server.log_path)
    if post.is_file():
        return Mark(cycles, _size(post), None, log_offset)
    return Mark(cycles, None, _last_id(read_metrics(session.server.url)), log_offset)


def wait_for_post(path: Path, offset: int, deadline: float) -> dict[str, Any] | None:
    """The first request line written to ``post_events.jsonl`` after byte ``offset`` (None: none by the
    deadline)."""
    while True:
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read().decode("utf-8", "replace")
        except OSError:
            data = ""
        for line in data.splitlines(keepends=True):
            if not line.endswith("\n"):
                break  # still being written
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and isinstance(row.get("request_id"), int):
                return row
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.01)


def request_record(session: Any, before: Mark, wait: float) -> dict[str, Any] | None:
    """What the server recorded of the request sent after ``before``: its post event, or /metrics's
    ``last_request`` where it writes none (the same fields; rounds are ``cycles_completed`` there,
    ``cycles`` here)."""
    deadline = time.monotonic() + wait
    if before.post_offset is not None:
        return wait_for_post(post_file(session.server_dir), before.post_offset, deadline)
    return wait_for_request(session.server.url, before.request_id, deadline)


def wait_for_request(url: str, after: int | None, deadline: float) -> dict[str, Any] | None:
    """``last_request`` of the first request done after request ``after`` (None: none by the deadline)."""
    while True:
        metrics = read_metrics(url)
        rid = _last_id(metrics)
        if metrics is not None and rid is not None and (after is None or rid > after) \
                and not metrics.get("current_request"):
            return dict(metrics["last_request"])
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)


def read_rounds(path: Path, offset: int, request_id: int) -> list[dict[str, Any]]:
    """One request's verify rounds from ``cycle_events.jsonl`` (lines after byte ``offset``), in order."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    rounds = []
    for line in data.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and row.get("request_id") == request_id and "cycle" in row \
                and "memory_phase" not in row:
            rounds.append(row)
    return sorted(rounds, key=lambda r: r["cycle"])


def engine_error(log_path: Path | None, offset: int) -> str | None:
    """The last exception line the server logged after byte ``offset`` (its traceback's message)."""
    if log_path is None:
        return None
    try:
        with open(log_path, "rb") as f:
            f.seek(offset)
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    found = [m.group(1).strip() for line in text.splitlines() if (m := _ERROR_LINE.match(line.strip()))]
    return found[-1][:400] if found else None


def cache_state(usage: dict[str, Any]) -> tuple[str | None, int | None]:
    """(cold / warm, cached prompt tokens) from a response's usage (None: not reported)."""
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if not isinstance(cached, int) or isinstance(cached, bool):
        return None, None
    return ("warm" if cached > 0 else "cold"), cached


def summarize_rounds(rounds: list[dict[str, Any]]) -> tuple[bool, str]:
    """(a DFlash-drafted round ran, one line: rounds and accepts per source, widths)."""
    parts = []
    engaged = False
    for source in (DFLASH_SOURCE, COPY_SOURCE):
        mine = [r for r in rounds if r.get("draft_source") == source]
        if not mine:
            continue
        accepted = sum(int(r.get("acceptance_len") or 0) for r in mine)
        proposed = sum(max(int(r.get("verify_token_count") or 0) - 1, 0) for r in mine)
        by = "the DFlash drafter" if source == DFLASH_SOURCE else "copying from the history (copyspec)"
        parts.append(f"{len(mine)} drafted by {by} (accepted {accepted} of {proposed})")
        engaged = engaged or (source == DFLASH_SOURCE and proposed > 0)
    rest = len(rounds) - sum(r.get("draft_source") in (DFLASH_SOURCE, COPY_SOURCE) for r in rounds)
    if rest:
        parts.append(f"{rest} without a draft")
    widths = sorted({int(r.get("verify_token_count") or 0) for r in rounds})
    return engaged, f"{len(rounds)} verify rounds: {', '.join(parts) or 'none'}; rows per round {widths}"


def evidence(session: Any, completion: Any, before: Mark) -> EngineEvidence:
    """What dflash-mlx reported over one request: its mode, its rounds, its cache state, its error."""
    found = EngineEvidence()
    found.cache, found.cached_tokens = cache_state(completion.usage or {})
    if found.cache is not None:
        found.lines.append(f"dflash-mlx prompt cache: {found.cache} ({found.cached_tokens} cached prompt tokens)")
    failed = not completion.ok or completion.finish_reason is None
    if failed:
        # no response, or a stream that ended without a finish: the engine failed it (and logged why)
        found.error = engine_error(session.server.log_path, before.log_offset)
    last = request_record(session, before, METRICS_WAIT_FAILED if failed else METRICS_WAIT)
    if last is None:
        found.lines.append("dflash-mlx: the server recorded no such request")
        return found
    mode = str(last.get("mode_used"))
    cycles = last.get("cycles_completed", last.get("cycles"))
    found.details = {"request_id": last.get("request_id"), "mode_used": mode, "cycles": cycles,
                     "copyspec_hits": last.get("copyspec_hits"), "cache_status": last.get("cache_status"),
                     "cache_hit_tokens": last.get("cache_hit_tokens")}
    if mode in BASELINE_MODES:
        found.engaged = False
        found.lines.insert(0, f"dflash-mlx: mode_used {mode} (target only, the drafter set aside)")
        return found
    if mode in DECLINED_MODES:
        found.engaged, found.declined = False, True
        found.lines.insert(0, f"dflash-mlx: mode_used {mode} (fell back to target-only decoding)")
        return found
    if mode not in ENGAGED_MODES:
        found.lines.insert(0, f"dflash-mlx: mode_used {mode} (unknown)")
        return found
    rounds = read_rounds(cycle_file(session.server_dir), before.cycle_offset, int(last["request_id"]))
    if rounds:
        found.engaged, line = summarize_rounds(rounds)
        found.accepts = [int(r.get("acceptance_len") or 0) for r in rounds]
        found.widths = [int(r.get("verify_token_count") or 0) for r in rounds]
        found.details["draft_sources"] = [r.get("draft_source") for r in rounds]
        found.details["prefix_lens"] = [r.get("prefix_len") for r in rounds]
        if not found.engaged:
            line += ": no round's block came from the DFlash drafter"
        found.lines.insert(0, f"dflash-mlx: mode_used dflash, {line}")
        return found
    # no per-round file (diagnostics off): the request's record counts rounds and copied rounds only
    copied = last.get("copyspec_hits")
    if isinstance(cycles, int) and isinstance(copied, int):
        found.engaged, why = counted_engagement(cycles, copied, verify_cap(getattr(session.server, "argv", [])))
        found.lines.insert(0, f"dflash-mlx: mode_used dflash, {cycles} verify rounds, {copied} copied from"
                              f" the history (copyspec){'' if found.engaged else ': ' + why}")
    return found


def verify_cap(argv: list[Any]) -> int | None:
    """The server's ``--verify-len-cap`` (rows per verify forward; None: not given, the drafter's block)."""
    args = [str(a) for a in argv]
    for i, a in enumerate(args):
        value = args[i + 1] if a == "--verify-len-cap" and i + 1 < len(args) else \
            a.split("=", 1)[1] if a.startswith("--verify-len-cap=") else None
        if value is not None:
            try:
                return int(value)
            except ValueError:
                return None
    return None


def counted_engagement(cycles: int, copied: int, cap: int | None) -> tuple[bool, str]:
    """Whether a request's round counts alone prove a DFlash-drafted round that proposed tokens, and if
    not, why. dflash-mlx drafts a block of ``min(block, tokens left)`` rows each round; only a block of one
    row (one token left: at most once, the last round) goes without a draft, so two rounds more than the
    copied ones include a DFlash-drafted one. It proposed tokens only if the verify cap keeps 2+ rows."""
    if cap is not None and cap < 2:
        return False, f"--verify-len-cap {cap}: no round verifies a proposed token"
    if cycles - copied >= 2:
        return True, ""
    return False, "no round proven DFlash-drafted (the one not copied may be the last, one-token round)"


def reproduction(*, model: str, draft: str | None, body: dict[str, Any], prompt_ids: list[int] | None,
                 width: int | None, first: bool) -> dict[str, Any]:
    """``specparity replay --engine dflash-mlx`` of one served request, or why none reproduces it.

    The replay runs dflash-mlx's own loop (``--verify-mode dflash``: the drafter's block every
    round) on the prompt ids the server decoded, for ``max_tokens``: the served arm's path where
    its width is that block, on a fresh prefix cache, greedy, without logits processors (the
    in-process loop takes none).
    """
    from specparity.harness.engines import own_loop_replay
    from specparity.probes.replay.sequence import Reproduction

    def why(reason: str) -> dict[str, Any]:
        return Reproduction(reason=reason).to_dict()

    if not first:
        return why("dflash-mlx's prefix cache: this request was not the first its server received, and no"
                   " replay rebuilds dflash-mlx's prefix cache (it lives in its server only)")
    if draft is None:
        return why("an arm of dflash serve without the drafter (mlx-lm's loop inside the server): no DFlash"
                   " rounds to replay")
    block = max_width(draft)
    if block and width is not None and width != block:
        return why(f"replay --engine dflash-mlx runs the engine's loop at the drafter's block of {block} rows;"
                   f" this arm capped its blocks at {width} (--verify-len-cap), which the in-process loop"
                   " does not take")
    return own_loop_replay("dflash-mlx", "dflash", model=model, draft=draft, body=body,
                           prompt_ids=prompt_ids)
