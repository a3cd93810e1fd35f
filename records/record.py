"""One record type every command writes the same way, and the sink long runs append to.

A record on disk (DESIGN.md, "Records"):

    <dir>/<name>.md                      the markdown (shared frame + the command's body)
    <dir>/data/<name>/report.json        the Record below: always present
    <dir>/data/<name>/identity.json      host, versions, fingerprints
    <dir>/data/<name>/<arm>.jsonl        one line per finished cell / arm / request

``report.json`` is written when the run starts (status ``running``) and
replaced when it ends (``complete``, ``interrupted`` or ``failed``); every
finished part is appended to its JSONL the moment it finishes. A run killed
outright leaves ``running``: readers present that as incomplete, never as a
verdict.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import stat
import sys
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from specparity.errors import UsageError
from specparity.records.writer import RecordWriter
from specparity.store import write_new
from specparity.schema import (
    Anything,
    Enum,
    Fields,
    Int,
    ListOf,
    MapOf,
    Nullable,
    Number,
    Str,
    check,
    describe,
    kind,
    read_text,
)
from specparity.verdicts import Report, Verdict

REPORT_FILE = "report.json"
IDENTITY_FILE = "identity.json"

RUNNING, COMPLETE, INTERRUPTED, FAILED = "running", "complete", "interrupted", "failed"
STATUSES = (RUNNING, COMPLETE, INTERRUPTED, FAILED)
SCHEMA = 1


@dataclass
class Record:
    """What ``report.json`` holds.

    schema: format version of this file.
    kind: the command that wrote it (probe, bisect, replay, dist, accept, served, ...).
    title: one line naming what was measured.
    argv: the command line, as typed.
    status: running | complete | interrupted | failed (only ``complete`` carries a final verdict).
    verdict: the run's verdict word (verdicts.Verdict), None while running.
    exit_code: the exit code the run returned, None while running.
    started, finished: ISO-8601 local times (finished None while running).
    timings: seconds per part of the run (e.g. {"cells": 3.2, "walk": 1.1, "total": 4.5}).
    arms: JSONL file stem -> lines written so far (each line a finished part).
    summary: the report's ``to_dict()`` (None unless complete).
    error: what stopped an interrupted or failed run.
    name, path: where the record lives (filled when read).
    """

    kind: str
    title: str
    argv: list[str]
    status: str = RUNNING
    verdict: str | None = None
    exit_code: int | None = None
    started: str = ""
    finished: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    arms: dict[str, int] = field(default_factory=dict)
    summary: dict[str, Any] | None = None
    error: str | None = None
    schema: int = SCHEMA
    name: str = ""
    path: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def is_complete(self) -> bool:
        return self.status == COMPLETE

    @property
    def data_dir(self) -> Path:
        """The record's data directory (``<dir>/data/<name>/``), from where it lives."""
        return Path(self.path).parent / "data" / self.name


def _now() -> str:
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


def frame_markdown(record: Record, identity: dict[str, Any], body: list[str]) -> str:
    """The markdown every record shares: title, verdict, status, command, identity, then the body."""
    status = ("" if record.is_complete
              else f"\n**INCOMPLETE ({record.status})**: only the parts listed below finished."
              + (f" Stopped by: {record.error}." if record.error else "") + "\n")
    model = identity.get("model") or {}
    lines = [
        f"# {record.title}",
        "",
        f"verdict: **{record.verdict or 'none'}** (exit {record.exit_code})" if record.is_complete
        else f"verdict: none (run {record.status})",
        status,
        f"- command: `{' '.join(record.argv)}`",
        f"- started {record.started}, finished {record.finished or '-'}",
        f"- host {identity.get('host')}, {identity.get('os')}, device {identity.get('device')},"
        f" mlx {identity.get('mlx')}, mlx-lm {identity.get('mlx_lm')},"
        f" specparity {identity.get('specparity')} ({identity.get('git_commit') or 'no git'})",
    ]
    if isinstance(model, dict) and model:
        lines.append(f"- model {model.get('path')} ({model.get('model_type')},"
                     f" fingerprint {model.get('short') or str(model.get('digest', ''))[:12]})")
    if record.timings:
        lines.append("- seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in record.timings.items()))
    lines += ["", *body, ""]
    return "\n".join(lines)


class RecordSink:
    """Owns one record from the start of a run to its end.

    Use as a context manager around the run::

        with RecordSink(dir, "probe", "probe: llama float32", identity) as sink:
            for cell in run(on_cell=lambda c: sink.append("cells", c.to_dict())):
                ...
            sink.finish(report, body_lines)

    Leaving the block without ``finish`` (an exception, Ctrl-C) writes the
    record as ``interrupted`` / ``failed`` with every part appended so far,
    and re-raises. ``record_dir=None`` gives a sink that writes nothing, so
    commands do not branch on whether a record was asked for.
    """

    def __init__(self, record_dir: str | os.PathLike | None, kind: str, title: str,
                 identity: dict[str, Any], argv: list[str] | None = None, slug: str | None = None):
        self.identity = identity
        # the command as a user types it: "specparity" for the console script, wherever it is installed (a
        # record, its page and its reproductions are read on other machines)
        self.record = Record(kind=kind, title=title,
                             argv=list(argv if argv is not None else ["specparity", *sys.argv[1:]]),
                             started=_now())
        self._t0 = time.perf_counter()
        self._parts: dict[str, float] = {}
        self.writer: RecordWriter | None = None
        if record_dir is not None:
            self.writer = RecordWriter(record_dir, slug or kind, identity)
            self.record.name = self.writer.name
            self.record.path = str(self.writer.md_path)
            self._write_report()

    # -- writing -----------------------------------------------------------------------------
    def append(self, arm: str, obj: dict[str, Any]) -> None:
        """One finished part: a JSONL line now, then its count in report.json (counted only once its line
        is written: a Ctrl-C between the two leaves a line uncounted, never a count without its line)."""
        if self.writer is not None:
            self.writer.append(arm, obj)
        self.record.arms[arm] = self.record.arms.get(arm, 0) + 1
        if self.writer is not None:
            self._write_report()

    def timing(self, part: str, seconds: float) -> None:
        self._parts[part] = self._parts.get(part, 0.0) + seconds

    def write_bytes(self, filename: str, data: bytes) -> Path | None:
        return self.writer.write_bytes(filename, data) if self.writer is not None else None

    def finish(self, report: Report, body: list[str]) -> Path | None:
        """The run ended with ``report``: final verdict, summary and markdown."""
        self.record.verdict = str(report.verdict)
        self.record.exit_code = report.exit_code
        self.record.summary = report.to_dict()
        return self._close(COMPLETE, body)

    def _close(self, status: str, body: list[str], error: str | None = None) -> Path | None:
        self.record.status = status
        self.record.error = error
        self.record.finished = _now()
        self.record.timings = {**{k: round(v, 4) for k, v in self._parts.items()},
                               "total": round(time.perf_counter() - self._t0, 4)}
        if self.writer is None:
            return None
        self._write_report()
        return self.writer.finish(frame_markdown(self.record, self.identity, body))

    def _write_report(self) -> None:
        assert self.writer is not None
        path = self.writer.data_dir / REPORT_FILE
        # our own file, replaced by rename: readers never see half of it
        write_new(path, json.dumps(self.record.to_dict(), indent=2, default=str), force=True, flag="--record-dir")

    # -- context manager ---------------------------------------------------------------------
    def __enter__(self) -> RecordSink:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        if et is None or self.record.status != RUNNING:
            return
        from specparity.errors import Terminated

        interrupted = issubclass(et, KeyboardInterrupt)  # Ctrl-C, and SIGTERM / SIGHUP (Terminated)
        what = (ev.signal_name if isinstance(ev, Terminated) else "Ctrl-C (SIGINT)") if interrupted \
            else f"{et.__name__}: {ev}"
        done = ", ".join(f"{n} {k}" for k, n in self.record.arms.items()) or "nothing"
        self._close(INTERRUPTED if interrupted else FAILED,
                    [f"Finished before it stopped: {done}. Per-part results are in data/{self.record.name}/."],
                    error=what)


def _record_schema() -> Fields:
    """What report.json holds (Record's fields by type); keys a newer version adds are kept out."""
    return Fields({
        "kind": Str(nonempty=True), "title": Str(), "argv": ListOf(Str()), "status": Enum(STATUSES),
        "verdict": Nullable(Enum(v.value for v in Verdict)), "exit_code": Nullable(Int()),
        "started": Str(), "finished": Nullable(Str()), "timings": MapOf(Number(), key=Str()),
        "arms": MapOf(Int(0), key=Str()), "summary": Nullable(MapOf(Anything(), key=Str())),
        "error": Nullable(Str()), "schema": Int(1), "name": Str(), "path": Str(),
    }, required=("kind", "title", "argv", "status"), open=True)


# what readers take from identity.json (records compare, merge, show, html); other keys are any JSON
IDENTITY_SCHEMA = Fields({
    "model": Nullable(MapOf(Anything(), key=Str())),
    "models": Nullable(MapOf(Nullable(MapOf(Nullable(Str()), key=Str())), key=Str())),
    "environments": Nullable(MapOf(Nullable(Fields({"packages": Nullable(MapOf(Anything(), key=Str()))}, open=True)),
                                   key=Str())),
    "shards": Nullable(ListOf(MapOf(Anything(), key=Str()))),
    "env": Nullable(MapOf(Anything(), key=Str())),
    "job": Nullable(Fields({"pairings": Nullable(ListOf(Anything()))}, open=True)),
}, open=True)

# the most one record file may hold (its JSONL read a line at a time, its JSON whole): far above any
# record, far below what stalls a reader
RECORD_FILE_MAX_BYTES = 1 << 30

# what a reader keeps of each JSONL line: (file stem, entry number from 1, the line) -> what to hold
Keep = Callable[[str, int, dict[str, Any]], dict[str, Any]]


def read_record(path: str | os.PathLike, keep: Keep | None = None, only: Collection[str] | None = None
                ) -> tuple[Record, dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """Read a record: a ``.md`` path, its ``data/<name>`` directory, or its report.json.

    Returns (record, identity, arms: stem -> parsed JSONL lines). The one reader every
    ``records`` command uses, so every command gives one answer about one file:

    - not a record (no data directory with report.json, or identity.json for a record from
      before report.json, which reads as status ``unknown``): FileNotFoundError;
    - a file that is not what its writer writes (report.json not an object, a field of the
      wrong type, a line whose ``verdict`` is not a word, a file that is a symlink out
      of the record, text that is not UTF-8): a UsageError naming the file; a data
      directory that is itself a symlink: a UsageError naming it.

    A JSONL line cut short by a crash (not JSON, or not an object) is skipped: it never finished.
    Lines end at a newline only: U+2028, U+0085 and the other Unicode line breaks are valid
    unescaped inside a JSON string. A lone surrogate escape (``"\\ud800"``, which ``json.dumps``
    writes for a server's malformed text) reads as that escape's six characters: no output
    could encode the surrogate itself. ``keep``: what to hold of each line once the reader has
    checked it (``records html`` keeps what its page shows), so a large record is never held whole.
    ``only``: the JSONL stems to read (None: all); the others are neither read nor counted.
    """
    data = _data_dir(Path(path))
    rec = read_report(data)
    root = data.resolve()
    ident_path = data / IDENTITY_FILE
    identity: dict[str, Any] = {}
    if ident_path.exists() or ident_path.is_symlink():
        raw_ident = _json_file(ident_path, root)
        if not isinstance(raw_ident, dict):
            raise UsageError(f"{ident_path}: not a record's identity (expected an object, got {kind(raw_ident)})")
        check(raw_ident, IDENTITY_SCHEMA, str(ident_path))
        identity = raw_ident
    arms: dict[str, list[dict[str, Any]]] = {}
    for f in sorted(data.glob("*.jsonl")):
        if only is not None and f.stem not in only:
            continue
        rows: list[dict[str, Any]] = []
        cut: int | None = None  # a line that is not JSON: only the last one may be (a crash cut it short)
        for n, line in _lines(f, root):
            if not line.strip():
                continue
            if cut is not None:
                raise UsageError(f"{f}: line {cut}: not JSON, and not the last line (a crash cuts only the last"
                                 " one short): the file is damaged")
            try:
                obj = _json(line)
            except RecursionError:
                raise UsageError(f"{f}: line {n}: not JSON (nested too deeply)") from None
            except ValueError:
                cut = n
                continue
            del line  # parsed: its text goes before the line is checked and kept
            if not isinstance(obj, dict):  # a whole line is always an object: this one was written otherwise
                raise UsageError(f"{f}: line {n}: expected an object (one finished part), got {describe(obj)}")
            if "verdict" in obj and not isinstance(obj["verdict"], str):  # a part's word: a verdict, or its own
                raise UsageError(f"{f}: line {n}: verdict: expected a word (a string), got {describe(obj['verdict'])}")
            rows.append(keep(f.stem, len(rows) + 1, obj) if keep is not None else obj)
            del obj  # let go before the next line is read: one line's objects at a time
        arms[f.stem] = rows
    # report.json counts a part after its line is written: fewer lines than counted is a lost file or lines
    for stem, counted in rec.arms.items():
        if only is not None and stem not in only:
            continue
        f = data / f"{stem}.jsonl"
        if stem not in arms:
            raise UsageError(f"{f}: missing, where {REPORT_FILE} counts {counted} finished parts in it: the record"
                             " is damaged")
        if len(arms[stem]) < counted:
            raise UsageError(f"{f}: holds {len(arms[stem])} finished parts, where {REPORT_FILE} counts {counted}:"
                             " the record is damaged")
    return rec, identity, arms


def read_report(path: str | os.PathLike) -> Record:
    """The record's report.json alone (its kind, status, start and verdict), checked as :func:`read_record`
    checks it: what a reader needs to choose which records to read whole. FileNotFoundError: not a record."""
    data = _data_dir(Path(path))
    if data.is_symlink():  # the record's own folder, elsewhere: nothing in it is the record's
        raise UsageError(f"{data}: a link out of the record (to {data.resolve()}): not read")
    report = data / REPORT_FILE
    if report.exists() or report.is_symlink():
        raw = _json_file(report, data.resolve())
        if not isinstance(raw, dict):
            raise UsageError(f"{report}: not a record's report (expected an object, got {kind(raw)})")
        check(raw, _record_schema(), str(report))
        rec = Record(**{k: v for k, v in raw.items() if k in Record.__dataclass_fields__})
    else:
        rec = Record(kind="unknown", title=data.name, argv=[], status="unknown")
    rec.name = data.name
    rec.path = str(data.parent.parent / f"{data.name}.md")
    return rec


def _outside(f: Path, root: Path) -> None:
    """A UsageError naming ``f`` when it leads out of the record."""
    try:
        target = f.resolve()
    except (OSError, RuntimeError) as err:
        raise UsageError(f"{f}: {err}") from None
    if not target.is_relative_to(root):
        raise UsageError(f"{f}: a link out of the record (to {target}): not read")


def _lines(f: Path, root: Path) -> Iterator[tuple[int, str]]:
    """A JSONL file's lines, numbered from 1, read one at a time (a record is never held twice as text):
    split at newlines only, each UTF-8, the file regular, inside the record and at most
    RECORD_FILE_MAX_BYTES; else a UsageError naming it."""
    _outside(f, root)
    offset = 0
    try:
        if not stat.S_ISREG(f.stat().st_mode):  # before opening it: a FIFO's open waits for a writer
            raise UsageError(f"{f}: not a regular file")
        with open(f, "rb") as fh:
            for n, raw in enumerate(fh, 1):  # a binary file's lines end at b"\n" only
                size = len(raw)
                if offset + size > RECORD_FILE_MAX_BYTES:
                    raise UsageError(f"{f}: more than the {RECORD_FILE_MAX_BYTES} bytes a file may hold here")
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise UsageError(f"{f}: not UTF-8 text (byte 0x{raw[err.start]:02x} at offset"
                                     f" {offset + err.start})") from None
                del raw  # the line is held once, as text, while it is parsed
                yield n, text
                del text
                offset += size
    except OSError as err:
        raise UsageError(f"{f}: {err.strerror or err}") from None


def _json_file(f: Path, root: Path) -> Any:
    _outside(f, root)
    try:
        return _json(read_text(f, str(f), RECORD_FILE_MAX_BYTES))
    except RecursionError:
        raise UsageError(f"{f}: not JSON (nested too deeply)") from None
    except ValueError as err:
        raise UsageError(f"{f}: not JSON ({err})") from None


# a \uD800-\uDBFF escape not followed by a \uDC00-\uDFFF one, or the second alone: how a lone surrogate
# reaches a string read from UTF-8 JSON (a pair is one character); \u first, the search skips ahead to it
_LONE_SURROGATE_ESCAPE = re.compile(r"\\u[dD](?:[89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
                                    r"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD])[c-fC-F][0-9a-fA-F]{2})")


def _json(text: str) -> Any:
    """``json.loads``, with each lone surrogate in a string or key turned back into its escape's text."""
    value = json.loads(text)
    if _LONE_SURROGATE_ESCAPE.search(text) is None:
        return value
    if isinstance(value, str):
        return _escaped(value)
    stack = [value]  # walked without recursion: the value may nest as deep as json.loads allows
    while stack:
        node = stack.pop()
        items = list(node.items()) if isinstance(node, dict) else list(enumerate(node))
        if isinstance(node, dict):
            node.clear()  # refilled in order, each key escaped too
        for k, v in items:
            if isinstance(v, str):
                v = _escaped(v)
            elif isinstance(v, (dict, list)):
                stack.append(v)
            node[_escaped(k) if isinstance(k, str) else k] = v
    return value


def _escaped(s: str) -> str:
    """``s`` with each lone surrogate written as its escape (``\\ud800``): the only characters a
    str may hold that UTF-8 cannot."""
    return s.encode("utf-8", "backslashreplace").decode("utf-8")


def read_complete(path: str | os.PathLike) -> tuple[Record, dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """``read_record`` for tools that need a finished run: a UsageError names a path that is
    not a record, not readable, or not complete."""
    try:
        rec, ident, rows = read_record(path)
    except FileNotFoundError:
        raise UsageError(f"{path}: not a record (no data/<name>/report.json)") from None
    except OSError as err:
        raise UsageError(f"{path}: not a readable record ({err.strerror or err})") from None
    if not rec.is_complete or rec.summary is None:
        raise UsageError(f"{path}: record is {rec.status}, not complete")
    return rec, ident, rows


def _data_dir(p: Path) -> Path:
    """The record's data directory; FileNotFoundError when ``p`` names none (a ``.md`` whose
    ``data/<name>/`` is missing is no record, whatever it says)."""
    if p.name == REPORT_FILE:
        data = p.parent
    elif p.suffix == ".md":
        data = p.parent / "data" / p.stem
    else:
        data = p
    if data.is_dir() and ((data / REPORT_FILE).exists() or (data / IDENTITY_FILE).exists()
                          or (data / REPORT_FILE).is_symlink()):
        return data
    raise FileNotFoundError(p)


def list_records(root: str | os.PathLike) -> list[Path]:
    """Every record's markdown path under ``root`` (a records directory), oldest name first."""
    r = Path(root)
    return sorted(md for md in r.glob("*.md") if (r / "data" / md.stem).is_dir())
