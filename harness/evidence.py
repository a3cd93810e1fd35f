"""Evidence: what shows that a request ran the speculative path (or was declined), whatever the engine.

A request is ``match`` only with evidence the drafter ran; without any it is
``not_engaged``, never a pass. Sources, each read over the slice of the
server's output that one request produced:

- the witness (harness.witness): the wrapped checkpoints append
  ``<pid> <role> <rows> <cache offset>`` per forward. Target side, a call of
  >= 2 rows at a cache offset at or past the prompt's last token is a verify
  block (classic decode feeds one row at a time there); consecutive verify
  offsets give the accept vector (accepted = next offset - this offset - 1).
  Draft side: any drafter forward at all. Every target forward's offset is
  also kept (``offsets``): where a request's first forward starts says how
  much of a cached prompt the server reused;
- the server log: the profile's ``log_engaged`` / ``log_declined`` regexes;
- the response: the profile's ``response_field`` / ``usage_field``;
- a Prometheus counter (``metrics_counter``) that rises across the request.

Take :func:`mark` before a request and :func:`collect` after it.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specparity.harness.profiles import dig

if TYPE_CHECKING:
    from specparity.harness.client import Completion
    from specparity.harness.engines import EngineEvidence
    from specparity.harness.profiles import Profile

log = logging.getLogger(__name__)


@dataclass
class WitnessCall:
    """One forward the witness saw: which model, how many rows, at which cache offset."""

    role: str
    rows: int
    offset: int


@dataclass
class Evidence:
    """What one request (or one batch of requests) showed.

    verify_calls: target forwards of >= 2 rows in the decode phase.
    draft_calls: drafter forwards.
    accepts: accepted proposals per verify round (the last round's from the token count).
    widths: rows per verify round.
    first_offset: the cache offset of the request's first target forward (the prompt tokens the
      server reused from its prompt cache; None without a witness).
    lines: the log lines / fields that are evidence (engaged or declined).
    declined: a decline line was seen.
    sources: witness, log, response, metrics, engine (what gave the evidence).
    cache: the prompt cache's state for this request as the engine reported it (cold / warm;
      None: not reported). cached_tokens: prompt tokens it served from the cache.
    """

    verify_calls: int = 0
    draft_calls: int = 0
    accepts: list[int] = field(default_factory=list)
    widths: list[int] = field(default_factory=list)
    first_offset: int | None = None
    lines: list[str] = field(default_factory=list)
    declined: bool = False
    sources: list[str] = field(default_factory=list)
    cache: str | None = None
    cached_tokens: int | None = None

    @property
    def engaged(self) -> bool:
        return bool(self.verify_calls or self.draft_calls
                    or {"log", "response", "metrics", "engine"} & set(self.sources))

    @property
    def acceptance(self) -> float | None:
        """Accepted / proposed over the rounds (None without rounds)."""
        proposed = sum(w - 1 for w in self.widths)
        return sum(self.accepts) / proposed if proposed else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "engaged": self.engaged, "acceptance": self.acceptance}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Evidence:
        """Read back what :meth:`to_dict` wrote (derived keys dropped)."""
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in names})


def read_calls(path: str | os.PathLike[str], start: int = 0, end: int | None = None) -> list[WitnessCall]:
    """The witness lines between byte offsets ``start`` and ``end``."""
    p = Path(path)
    if not p.exists():
        return []
    with open(p, "rb") as f:
        f.seek(start)
        data = f.read() if end is None else f.read(max(end - start, 0))
    calls = []
    for line in data.decode("utf-8", "replace").splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2].isdigit() and parts[3].isdigit():
            calls.append(WitnessCall(parts[1], int(parts[2]), int(parts[3])))
    return calls


def file_size(path: str | os.PathLike[str] | None) -> int:
    if path is None:
        return 0
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def evidence_from_calls(calls: list[WitnessCall], prompt_tokens: int | None,
                        completion_tokens: int | None) -> Evidence:
    """Verify rounds and drafter calls of one request's witness slice."""
    ev = Evidence()
    ev.draft_calls = sum(1 for c in calls if c.role == "draft")
    target = [c for c in calls if c.role == "target"]
    if target:
        ev.first_offset = target[0].offset
    decode_from = (prompt_tokens - 1) if prompt_tokens else None
    verify = [c for c in target if c.rows >= 2 and (decode_from is None or c.offset >= decode_from)]
    ev.verify_calls = len(verify)
    for i, c in enumerate(verify):
        if i + 1 < len(verify):
            ev.accepts.append(max(verify[i + 1].offset - c.offset - 1, 0))
        elif completion_tokens is not None:
            emitted = completion_tokens - sum(a + 1 for a in ev.accepts)
            ev.accepts.append(min(max(emitted - 1, 0), c.rows - 1))
        ev.widths.append(c.rows)
    if len(ev.accepts) < len(ev.widths):
        ev.widths = ev.widths[:len(ev.accepts)]
    if ev.verify_calls or ev.draft_calls:
        ev.sources.append("witness")
        ev.lines.append(f"witness: {ev.verify_calls} verify blocks of {sorted({c.rows for c in verify})} rows,"
                        f" {ev.draft_calls} drafter forwards")
    return ev


@dataclass
class Marks:
    """Where one request's slice of each source starts (taken by :func:`mark` before it is sent)."""

    witness: int = 0
    log: int = 0
    counter: float | None = None


METRICS_MAX_BYTES = 8 << 20


def read_counter(client: Any, url: str, profile: Profile, timeout: float) -> float | None:
    """The profile's Prometheus counter summed over its labels (None: no counter, or unreadable)."""
    if not profile.metrics_counter:
        return None
    from specparity.harness.transport import fetch

    try:  # within the request timeout in total: a /metrics that never ends is no reading
        status, body = fetch(client, "GET", url + profile.metrics_path, timeout, max_bytes=METRICS_MAX_BYTES)
    except Exception as err:  # any transport failure: no reading, so no evidence either way
        log.debug("metrics %s: %s", profile.metrics_path, err)
        return None
    if status != 200:
        return None
    names = (profile.metrics_counter, profile.metrics_counter + "_total")
    total = None
    for line in body.decode("utf-8", "replace").splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            try:
                total = (total or 0.0) + float(line.rsplit(" ", 1)[1])
            except ValueError:
                continue
    return total


def mark(client: Any, url: str, witness_file: str | os.PathLike[str], log_path: str | os.PathLike[str] | None,
         profile: Profile, timeout: float) -> Marks:
    """The sources' positions before a request."""
    return Marks(file_size(witness_file), file_size(log_path), read_counter(client, url, profile, timeout))


def _read_slice(path: str | os.PathLike[str] | None, start: int) -> str:
    if path is None or not Path(path).exists():
        return ""
    with open(path, "rb") as f:
        f.seek(start)
        return f.read().decode("utf-8", "replace")


_EXC_LINE = re.compile(r"^[A-Za-z_][\w.]*(?::\s.*)?$")


def logged_error(log_path: str | os.PathLike[str] | None, start: int) -> str | None:
    """The exception line of the last Python traceback the server logged after byte ``start`` (``NAME: message``,
    at most 300 characters; None: none): what a request that failed without an answer leaves in its log."""
    found: str | None = None
    inside = False
    for line in _read_slice(log_path, start).splitlines():
        if line.startswith("Traceback (most recent call last)"):
            inside = True
        elif inside and line and not line[0].isspace():
            if _EXC_LINE.match(line.strip()):
                found = line.strip()[:300]
            inside = False
    return found


def collect(profile: Profile, witness_file: str | os.PathLike[str], log_path: str | os.PathLike[str] | None,
            completion: Completion, before: Marks, counter_after: float | None) -> Evidence:
    """Every source's evidence over the slices that started at ``before``."""
    calls = read_calls(witness_file, before.witness, file_size(witness_file))
    usage = completion.usage or {}
    ev = evidence_from_calls(calls, _int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens")))
    if profile.log_engaged or profile.log_declined:
        for line in _read_slice(log_path, before.log).splitlines():
            if profile.log_declined and re.search(profile.log_declined, line):
                ev.declined = True
                ev.lines.append(line.strip())
            elif profile.log_engaged and re.search(profile.log_engaged, line):
                ev.sources.append("log")
                ev.lines.append(line.strip()[:300])
    for fld in (profile.response_field, profile.usage_field):
        val = dig(completion.raw, fld) if fld else None
        if isinstance(val, dict) and val.get("accepts") is not None:
            ev.sources.append("response")
            ev.lines.append(f"{fld}: accepts={val.get('accepts')}")
            accepts = val.get("accepts")
            widths = val.get("widths") or ([val.get("width")] * len(accepts) if isinstance(accepts, list) else None)
            # rounds only from integers, one width per round: a response is data, never trusted to be well formed
            if not ev.accepts and isinstance(accepts, list) and isinstance(widths, list) \
                    and len(widths) == len(accepts) and _int_list(accepts) and _int_list(widths):
                ev.accepts, ev.widths = list(accepts), list(widths)
        elif val:  # an empty list, dict, 0 or False is no evidence the drafter ran
            ev.sources.append("response")
            ev.lines.append(f"{fld}: {str(val)[:200]}")
    if before.counter is not None and counter_after is not None and counter_after > before.counter:
        ev.sources.append("metrics")
        ev.lines.append(f"{profile.metrics_counter}: +{counter_after - before.counter:g}")
    return ev


def add_engine(ev: Evidence, found: EngineEvidence | None) -> None:
    """An engine's own evidence (its ``evidence`` hook) into the request's."""
    if found is None:
        return
    if found.engaged:
        ev.sources.append("engine")
    ev.declined = ev.declined or found.declined
    if found.accepts and not ev.accepts:
        ev.accepts, ev.widths = list(found.accepts), list(found.widths)
    ev.lines += found.lines
    ev.cache = found.cache if found.cache is not None else ev.cache
    ev.cached_tokens = found.cached_tokens if found.cached_tokens is not None else ev.cached_tokens


def _int_list(v: Any) -> bool:
    return isinstance(v, list) and all(_int(x) is not None for x in v)


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None
