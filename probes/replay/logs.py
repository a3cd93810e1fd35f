"""Where accept-length vectors come from: every log format, read here; the specparity
JSONL format also written here (:func:`write_requests`).

An accept vector lists, per verify round, how many draft proposals the target
accepted; a round that accepts ``a`` emits ``a + 1`` tokens (the accepted
proposals, then the target's own token). Sources:

- a plain list: ``2,2,3,1`` (:func:`parse_accept_list`);
- a log file read by a preset or a user regex (:func:`read_log`), formats:

  ``specparity``  the project's own JSONL, one JSON object per request::

      {"format": "specparity.accepts/1",      # required tag, this version
       "prompt_ids": [12, 7, 99],             # the prompt as token ids (optional)
       "width": 4,                            # verify rows per round (T = K + 1)
       "widths": [4, 4, 3],                   # optional: rows per round when they vary
       "accepts": [3, 1, 2],                  # accepted proposals per round
       "tokens": [5, 8, ...],                 # optional: the tokens the server emitted
       "prefill_emits": false,                # optional: true when the first token came
                                              # from the prefill, before round 0
       "max_tokens": 8, "num_draft_tokens": 3, "source": "...", "model": "..."}

    ``width`` or ``widths`` is required; every other key is optional and kept
    in ``AcceptLog.meta``. ``specparity replay --draft-model`` writes it, and a
    server can log it.
  ``specparity-serve``  ``specparity serve``'s per-request line (any prefix before it)::

      specparity-serve: SPEC request=cmpl-1 ... width=4 ... accepts=[3,1,2] widths=[4,4,3]
        prompt_ids=[12,7,99] tokens=[5,8,...]

    one request per line; ``width`` and ``accepts`` are required, ``widths``,
    ``prompt_ids`` and ``tokens`` optional; the other ``key=value`` fields go to ``meta``.
  ``mlxcel-accept-lens``  mlxcel's ``DFlash accept lengths accept_lens=[1, 1, 2, 0]``:
    one request per line; the width comes from ``--width``. DFlash emits its
    first token from the prefill (round 0's bonus), so these requests replay
    with ``prefill_emits``.
  ``mlxcel-transcript``  mlxcel's per-round ``DFlash round transcript round=0 bs=4
    bonus=285 draft_tokens=[...] target_tokens=[...] accepted=1 new_tokens=[...]``:
    ``round=0`` starts a new request (burst); ``bs`` is the width; the rounds keep
    their tokens for ``algebra.check_rounds``; the served tokens are round 0's
    bonus, then every round's ``new_tokens``.
  ``regex``  a user pattern: its group ``accepts`` (else group 1) captures either
    one integer (one round per matching line, an optional group ``round`` equal
    to 0 starting a new request) or a list ``[1, 2]`` / ``1,2`` (one request per line).

Lines a format does not recognise are ignored (server logs carry other lines);
a line that carries a format's marker but cannot be parsed is an error that
names the file and line number.

The round algebra over transcript rounds lives in ``algebra.py``.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specparity.errors import InputError, Name, UsageError

log = logging.getLogger(__name__)

# the user's accept-length pattern, as errors name it (the command line: --regex)
REGEX = Name("regex")

SPECPARITY_FORMAT = "specparity.accepts/1"
FORMATS = ("auto", "specparity", "specparity-serve", "mlxcel-accept-lens", "mlxcel-transcript",
           "regex")

ACCEPT_LENS_MARKER = "DFlash accept lengths"
SERVE_MARKER = "specparity-serve: SPEC "
TRANSCRIPT_MARKER = "DFlash round transcript"
_ACCEPT_LENS_RE = re.compile(r"DFlash accept lengths\b.*?\baccept_lens=\[(?P<body>[^\]\n]*)\]")
_FIELD_RE = re.compile(r"\b(?P<key>[a-z_]+)=(?P<value>\[[^\]\n]*\]|-?\d+)")
TRANSCRIPT_KEYS = ("round", "bs", "bonus", "draft_tokens", "target_tokens", "accepted",
                   "new_tokens")


@dataclass
class Round:
    """One verify round of a transcript.

    line: 1-based line number in the log. round: the round index the log gave.
    width: verify rows (mlxcel's ``bs``). bonus: the token the block started from.
    draft / target: the drafter's proposals and the target's argmax per row.
    accepted: the accept count the server logged. new_tokens: the tokens it emitted.
    """

    line: int
    round: int
    width: int
    bonus: int
    draft: list[int]
    target: list[int]
    accepted: int
    new_tokens: list[int]


@dataclass
class AcceptLog:
    """One request's accept vector and what came with it.

    accepts: accepted proposals per round.
    width: verify rows per round when constant (None: see ``widths`` or ``--width``).
    widths: rows per round when the log gives them (None otherwise).
    prompt_ids: the prompt as token ids, when logged.
    tokens: the tokens the server emitted, when logged.
    source: ``FILE:LINE`` (or ``list``) where the request starts.
    line: that line number (None for a plain list).
    rounds: the transcript rounds (mlxcel-transcript only).
    prefill_emits: the server emitted its first token from the prefill, before
      round 0 (mlxcel's DFlash: round 0's bonus); False: round 0's block starts
      with the last prompt token (mlx-lm).
    meta: any other keys of a specparity JSONL object.
    """

    accepts: list[int]
    width: int | None = None
    widths: list[int] | None = None
    prompt_ids: list[int] | None = None
    tokens: list[int] | None = None
    source: str = "list"
    line: int | None = None
    rounds: list[Round] | None = None
    prefill_emits: bool = False
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_int_items(text: str, what: str) -> list[int]:
    """``"[1, 2, 3]"`` or ``"1,2,3"`` -> [1, 2, 3]; ``"[]"`` -> []."""
    body = text.strip()
    if body.startswith("["):
        if not body.endswith("]"):
            raise ValueError(f"{what}: unterminated list {text!r}")
        body = body[1:-1]
    items = [s.strip() for s in body.split(",")]
    if items == [""]:
        return []
    out = []
    for s in items:
        try:
            out.append(int(s))
        except ValueError:
            raise ValueError(f"{what}: {s!r} is not an integer") from None
    return out


def parse_accept_list(value: str) -> list[int]:
    """``"2,2,3,1"`` -> [2, 2, 3, 1]; a bad or negative item is an InputError naming ``accepts``."""
    try:
        out = parse_int_items(value, "accept length")
    except ValueError as err:
        raise InputError("accepts", f"{value!r}: {err}") from None
    neg = [a for a in out if a < 0]
    if neg:
        raise InputError("accepts", f"{value!r}: accept length {neg[0]} is negative")
    return out


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as err:
        raise InputError("log", f"{path}: cannot read ({err.strerror})") from None


def detect_format(lines: list[str]) -> str:
    """The format of a log from its first recognisable line."""
    for text in lines:
        if TRANSCRIPT_MARKER in text:
            return "mlxcel-transcript"
        if ACCEPT_LENS_MARKER in text:
            return "mlxcel-accept-lens"
        if SERVE_MARKER in text:
            return "specparity-serve"
        if text.lstrip().startswith("{"):
            return "specparity"
    return "specparity"


def read_log(path: str | Path, fmt: str = "auto", regex: str | None = None) -> list[AcceptLog]:
    """Every request in the log ``path``, in order (an empty list if none).

    Raises UsageError naming ``FILE:LINE`` for a malformed or truncated line.
    """
    p = Path(path)
    if fmt not in FORMATS:
        raise InputError("format", f"{fmt!r}: choose from {', '.join(FORMATS)}")
    if fmt == "regex" and not regex:
        raise UsageError(Name("format"), " regex needs ", Name("regex"), " PATTERN")
    if regex and fmt in ("auto", "regex"):
        fmt = "regex"
    lines = _lines(p)
    if fmt == "auto":
        fmt = detect_format(lines)
        log.info("%s: read as %s", p, fmt)
    if fmt == "specparity":
        return _read_specparity(p, lines)
    if fmt == "specparity-serve":
        return _read_serve(p, lines)
    if fmt == "mlxcel-accept-lens":
        return _read_accept_lens(p, lines)
    if fmt == "mlxcel-transcript":
        return _read_transcript(p, lines)
    return _read_regex(p, lines, regex or "")


def _int_field(obj: dict, key: str, where: str, minimum: int) -> int:
    v = obj[key]
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        raise UsageError(f"{where}: {key!r} must be an integer >= {minimum}, got {v!r}")
    return v


def _int_list_field(obj: dict, key: str, where: str, minimum: int = 0) -> list[int]:
    v = obj[key]
    if not isinstance(v, list) or not all(
        isinstance(x, int) and not isinstance(x, bool) and x >= minimum for x in v
    ):
        raise UsageError(f"{where}: {key!r} must be a list of integers >= {minimum}")
    return list(v)


def _read_specparity(path: Path, lines: list[str]) -> list[AcceptLog]:
    out = []
    for n, text in enumerate(lines, 1):
        if not text.strip():
            continue
        where = f"{path}:{n}"
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as err:
            raise UsageError(f"{where}: not a JSON object (truncated?): {err.msg}") from None
        if not isinstance(obj, dict):
            raise UsageError(f"{where}: not a JSON object")
        tag = obj.get("format")
        if tag != SPECPARITY_FORMAT:
            raise UsageError(f"{where}: format {tag!r} is not {SPECPARITY_FORMAT!r}")
        if "accepts" not in obj:
            raise UsageError(f"{where}: no 'accepts' (the accept vector)")
        accepts = _int_list_field(obj, "accepts", where)
        width = _int_field(obj, "width", where, 1) if obj.get("width") is not None else None
        widths = _int_list_field(obj, "widths", where, 1) if obj.get("widths") is not None else None
        if width is None and widths is None:
            raise UsageError(f"{where}: needs 'width' or 'widths'")
        if widths is not None and len(widths) != len(accepts):
            raise UsageError(
                f"{where}: 'widths' has {len(widths)} entries, 'accepts' {len(accepts)}"
            )
        prompt = _int_list_field(obj, "prompt_ids", where) if obj.get("prompt_ids") else None
        prefill_emits = obj.get("prefill_emits", False)
        if not isinstance(prefill_emits, bool):
            raise UsageError(f"{where}: 'prefill_emits' must be true or false")
        tokens = _int_list_field(obj, "tokens", where) if obj.get("tokens") is not None else None
        meta = {k: v for k, v in obj.items() if k not in (
            "format", "accepts", "width", "widths", "prompt_ids", "tokens", "prefill_emits")}
        out.append(AcceptLog(accepts, width, widths, prompt, tokens, where, n,
                             prefill_emits=prefill_emits, meta=meta))
    return out


def _read_accept_lens(path: Path, lines: list[str]) -> list[AcceptLog]:
    out = []
    for n, text in enumerate(lines, 1):
        if ACCEPT_LENS_MARKER not in text:
            continue
        where = f"{path}:{n}"
        m = _ACCEPT_LENS_RE.search(text)
        if not m:
            raise UsageError(
                f"{where}: malformed {ACCEPT_LENS_MARKER!r} line (no complete accept_lens=[...];"
                " truncated?)"
            )
        try:
            accepts = parse_int_items(m.group("body"), "accept_lens")
        except ValueError as err:
            raise UsageError(f"{where}: malformed {ACCEPT_LENS_MARKER!r} line: {err}") from None
        if any(a < 0 for a in accepts):
            raise UsageError(f"{where}: accept_lens holds a negative length")
        out.append(AcceptLog(accepts, source=where, line=n, prefill_emits=True))
    return out


_SERVE_FIELD_RE = re.compile(r"\b(?P<key>[a-z_]+)=(?P<value>\[[^\]\n]*\]|[^\s\[]\S*)")
_SERVE_LISTS = ("accepts", "widths", "prompt_ids", "tokens")


def _read_serve(path: Path, lines: list[str]) -> list[AcceptLog]:
    """``specparity serve``'s SPEC lines, one request each."""
    out = []
    for n, text in enumerate(lines, 1):
        if SERVE_MARKER not in text:
            continue
        where = f"{path}:{n}"
        body = text[text.index(SERVE_MARKER) + len(SERVE_MARKER):]
        fields = {m.group("key"): m.group("value") for m in _SERVE_FIELD_RE.finditer(body)}
        if "accepts" not in fields or "width" not in fields:
            raise UsageError(f"{where}: malformed {SERVE_MARKER.strip()!r} line: no complete"
                             f" {'accepts' if 'accepts' not in fields else 'width'}=... (truncated?)")
        try:
            lists = {k: parse_int_items(fields[k], k) for k in _SERVE_LISTS if k in fields}
            width = int(fields["width"])
        except ValueError as err:
            raise UsageError(f"{where}: malformed {SERVE_MARKER.strip()!r} line: {err}") from None
        if width < 1 or any(v < 0 for v in lists["accepts"]):
            raise UsageError(f"{where}: width must be >= 1 and accepts non-negative")
        widths = lists.get("widths")
        if widths is not None and len(widths) != len(lists["accepts"]):
            raise UsageError(f"{where}: widths has {len(widths)} entries, accepts"
                             f" {len(lists['accepts'])}")
        meta = {k: v for k, v in fields.items() if k not in (*_SERVE_LISTS, "width")}
        out.append(AcceptLog(lists["accepts"], width, widths, lists.get("prompt_ids"),
                             lists.get("tokens"), where, n, meta=meta))
    return out


def parse_transcript_line(text: str, where: str, line: int) -> Round:
    """One ``DFlash round transcript ...`` line -> Round (UsageError naming ``where``)."""
    body = text[text.index(TRANSCRIPT_MARKER) + len(TRANSCRIPT_MARKER):]
    fields: dict[str, str] = {}
    for m in _FIELD_RE.finditer(body):
        fields.setdefault(m.group("key"), m.group("value"))
    missing = [k for k in TRANSCRIPT_KEYS if k not in fields]
    if missing:
        raise UsageError(
            f"{where}: malformed {TRANSCRIPT_MARKER!r} line: no complete {missing[0]}=..."
            " (truncated?)"
        )
    try:
        ints = {k: int(fields[k]) for k in ("round", "bs", "bonus", "accepted")}
        lists = {k: parse_int_items(fields[k], k)
                 for k in ("draft_tokens", "target_tokens", "new_tokens")}
    except ValueError as err:
        raise UsageError(f"{where}: malformed {TRANSCRIPT_MARKER!r} line: {err}") from None
    if ints["bs"] < 1 or ints["round"] < 0 or ints["accepted"] < 0:
        raise UsageError(f"{where}: round, bs and accepted must be non-negative (bs >= 1)")
    return Round(line, ints["round"], ints["bs"], ints["bonus"], lists["draft_tokens"],
                 lists["target_tokens"], ints["accepted"], lists["new_tokens"])


def _read_transcript(path: Path, lines: list[str]) -> list[AcceptLog]:
    bursts: list[list[Round]] = []
    for n, text in enumerate(lines, 1):
        if TRANSCRIPT_MARKER not in text:
            continue
        where = f"{path}:{n}"
        rnd = parse_transcript_line(text, where, n)
        if rnd.round == 0:
            bursts.append([rnd])
            continue
        if not bursts or bursts[-1][-1].round != rnd.round - 1:
            prev = bursts[-1][-1].round if bursts else None
            raise UsageError(
                f"{where}: round {rnd.round} follows "
                + (f"round {prev}" if prev is not None else "no round 0")
                + " (a missing or reordered line?)"
            )
        bursts[-1].append(rnd)
    out = []
    for rounds in bursts:
        widths = [r.width for r in rounds]
        same = len(set(widths)) == 1
        out.append(AcceptLog(
            accepts=[r.accepted for r in rounds],
            width=widths[0] if same else None,
            widths=None if same else widths,
            tokens=[rounds[0].bonus] + [t for r in rounds for t in r.new_tokens],
            source=f"{path}:{rounds[0].line}",
            line=rounds[0].line,
            rounds=rounds,
            prefill_emits=True,
        ))
    return out


def _read_regex(path: Path, lines: list[str], pattern: str) -> list[AcceptLog]:
    try:
        rx = re.compile(pattern)
    except re.error as err:
        raise InputError("regex", f"{pattern!r}: not a valid regular expression ({err})") from None
    if rx.groups == 0:
        raise InputError("regex", f"{pattern!r}: needs a capture group (named 'accepts' or group 1)")
    group: str | int = "accepts" if "accepts" in rx.groupindex else 1
    out: list[AcceptLog] = []
    current: AcceptLog | None = None
    for n, text in enumerate(lines, 1):
        m = rx.search(text)
        if not m:
            continue
        where = f"{path}:{n}"
        captured = m.group(group)
        if captured is None:
            raise UsageError(f"{where}: ", REGEX, " matched but its accept group captured nothing")
        try:
            values = parse_int_items(captured, "accepts")
        except ValueError as err:
            raise UsageError(f"{where}: ", REGEX, f" captured {captured!r}: {err}") from None
        if any(v < 0 for v in values):
            raise UsageError(f"{where}: ", REGEX, " captured a negative accept length")
        is_list = "," in captured or captured.strip().startswith("[")
        if is_list:
            out.append(AcceptLog(values, source=where, line=n))
            current = None
            continue
        if len(values) != 1:
            raise UsageError(f"{where}: ", REGEX, f" captured {captured!r}, not one integer")
        starts = "round" in rx.groupindex and m.group("round") is not None and int(
            m.group("round")) == 0
        if current is None or starts:
            current = AcceptLog([], source=where, line=n)
            out.append(current)
        current.accepts.append(values[0])
    return out


def request_object(req: AcceptLog, **extra: Any) -> dict[str, Any]:
    """One request as a specparity JSONL object."""
    obj: dict[str, Any] = {"format": SPECPARITY_FORMAT}
    if req.prompt_ids is not None:
        obj["prompt_ids"] = req.prompt_ids
    obj["width"] = req.width
    if req.widths is not None:
        obj["widths"] = req.widths
    obj["accepts"] = req.accepts
    if req.tokens is not None:
        obj["tokens"] = req.tokens
    if req.prefill_emits:
        obj["prefill_emits"] = True
    obj["source"] = req.source
    obj.update(req.meta)
    obj.update(extra)
    return obj


def write_requests(path: str | os.PathLike, requests: list[AcceptLog], overwrite: bool = False,
                   **extra: Any) -> Path:
    """Write ``requests`` as specparity JSONL (an existing file only with ``overwrite``)."""
    from specparity.store import write_new

    text = "".join(json.dumps(request_object(req, **extra)) + "\n" for req in requests)
    return write_new(path, text, force=overwrite, flag="--save-log")
