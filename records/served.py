"""The served record: the one module that knows its layout, for writing and for reading.

A served record is a record (records.record) whose data directory holds:

    report.json                 the Record; its summary is ServedReport.to_dict() once complete
    identity.json               host, versions, model fingerprints (and shards, when merged)
    arms.jsonl                  one line per finished arm: {"pairing": name, **ArmResult.to_dict()}
    <pairing>-<arm>.jsonl       one line per request of that arm: RequestResult.to_dict()
    diagnoses.jsonl             one line per finding diagnosed after the job (``served --diagnose``,
                                specparity.diagnose.record): {"finding": PAIRING/ARM/REQUEST, "key": the
                                finding's identity across nights, "diagnosed_in": the record whose run
                                diagnosed it, "diagnosis": Diagnosis.to_dict()}; appended to a complete
                                record (report.json does not count its lines), its markdown given a
                                "Diagnoses" section the same way
    chart-<pairing>.svg         first divergence by width (records.chart)
    servers/<pairing>/...       the servers' logs and witness files

``specparity served`` and ``records merge`` write it through :func:`served_identity`,
:func:`write_arm` and :func:`served_markdown`; ``records show / compare / merge / junit`` read it
through :func:`read_served`; diagnoses are appended by :func:`append_diagnoses` and read beside
their requests (:meth:`ServedRecord.diagnosis`). Nothing here imports the runner or mlx.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specparity.errors import SpecparityError, UsageError
from specparity.records.record import REPORT_FILE, Record, read_complete, read_record
from specparity.records.text import printable
from specparity.harness.plan import request_stem
from specparity.paths import slugify
from specparity.schema import (
    AnyOf,
    Anything,
    Bool,
    Check,
    Enum,
    Fields,
    Int,
    ListOf,
    MapOf,
    Nullable,
    Number,
    Str,
    check,
)

if TYPE_CHECKING:
    from specparity.harness.job import Job
    from specparity.harness.results import ArmResult, ServedReport
    from specparity.records.record import RecordSink

KIND = "served"
ARMS = "arms"
SERVERS_DIR = "servers"
# the stem of the diagnoses' file: no request's stem (always "<pairing>-<arm>") can be it
DIAGNOSES = "diagnoses"


def chart_name(pairing: str) -> str:
    return f"chart-{slugify(pairing)}.svg"


def write_arm(append: Callable[[str, dict[str, Any]], None], pairing: str, arm: ArmResult) -> None:
    """One finished arm of ``pairing`` into the record: its line in arms.jsonl, then its requests' lines.

    append: (JSONL stem, line) -> None, e.g. an observer's ``result`` or a sink's ``append``.
    """
    append(ARMS, {"pairing": pairing, **arm.to_dict()})
    for r in arm.requests:
        append(request_stem(pairing, arm.name), r.to_dict())


def served_identity(job: Job) -> dict[str, Any]:
    """What a served record's identity.json adds to the host's: the job as run, each pairing's
    target and drafter fingerprint digests (what ``records compare`` sets side by side), and the
    pinned environment each pairing's servers run in (its pins and installed packages)."""
    from specparity.checkpoint import fingerprint
    from specparity.environments import find_environment
    from specparity.harness.profiles import load_profile

    def digest(path: str | None) -> str | None:
        if path is None:
            return None
        try:
            return fingerprint(path).digest
        except (SpecparityError, OSError):
            return None  # the run itself names a missing or broken checkpoint

    environments: dict[str, Any] = {}
    for p in job.pairings:
        ref = p.environment or load_profile(p.profile).environment
        env = find_environment(ref) if ref is not None else None
        if env is not None:
            environments[p.name] = env.identity()
    return {"job": job.to_dict(),
            "models": {p.name: {"target": digest(p.target), "draft": digest(p.draft)} for p in job.pairings},
            "environments": environments}


def served_markdown(report: ServedReport, sink: RecordSink) -> list[str]:
    """The record's body: the report text, then each pairing's chart (an SVG in data/, linked)."""
    from specparity.records.chart import divergence_svg

    body = ["```", *report.lines(), f"verdict: {report.verdict}", "```"]
    for p in report.pairings:
        name = chart_name(p.name)
        svg = divergence_svg(p.name, [a.to_dict(with_requests=True) for a in p.arms], report.job.get("max_tokens"))
        if sink.write_bytes(name, svg.encode()) is not None:
            body += ["", f"![first divergence by width, pairing {p.name}](data/{sink.record.name}/{name})"]
    return body


@dataclass
class ServedRecord:
    """A served record as read back.

    path: what the user named. record, identity, rows: as records.record.read_record returns them.
    """

    path: str
    record: Record
    identity: dict[str, Any]
    rows: dict[str, list[dict[str, Any]]]

    @classmethod
    def of(cls, path: str | os.PathLike[str], record: Record, identity: dict[str, Any],
           rows: dict[str, list[dict[str, Any]]]) -> ServedRecord:
        """A record already read (records.record.read_record), refused unless it is a served one
        whose summary and lines are what ``served`` writes (:func:`check_served`)."""
        if record.kind != KIND:
            raise UsageError(f"{path}: a {printable(record.kind)} record: these tools read served records"
                             " (specparity served --record-dir)")
        check_served(record, rows)
        return cls(str(path), record, identity, rows)

    @property
    def summary(self) -> dict[str, Any]:
        return self.record.summary or {}

    @property
    def shard(self) -> dict[str, Any]:
        return self.summary.get("shard") or {}

    def pairing_names(self) -> list[str]:
        """Pairings in run order: the summary's when complete, else as their arms finished."""
        names = [str(p.get("name")) for p in self.summary.get("pairings") or []]
        for a in self.rows.get(ARMS, []):
            if str(a.get("pairing")) not in names:
                names.append(str(a.get("pairing")))
        return names

    def pairing_summary(self, pairing: str) -> dict[str, Any] | None:
        return next((p for p in self.summary.get("pairings") or [] if p.get("name") == pairing), None)

    def arm_lines(self, pairing: str) -> list[dict[str, Any]]:
        """The arms of ``pairing`` that finished, as their lines were written."""
        return [a for a in self.rows.get(ARMS, []) if a.get("pairing") == pairing]

    def final_arms(self, pairing: str) -> list[dict[str, Any]]:
        """The arms as judged with the pairing (the summary's) when complete, else as they finished."""
        p = self.pairing_summary(pairing)
        return list(p.get("arms") or []) if p is not None else self.arm_lines(pairing)

    def requests(self, pairing: str, arm: str) -> list[dict[str, Any]]:
        return self.rows.get(request_stem(pairing, arm), [])

    def diagnosis(self, pairing: str, arm: str, request: str) -> dict[str, Any] | None:
        """The diagnoses.jsonl line of that request's finding (None: not diagnosed in this record)."""
        return self._diagnoses.get(finding_id(pairing, arm, request))

    @functools.cached_property
    def _diagnoses(self) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        for line in self.rows.get(DIAGNOSES, []):
            found.setdefault(str(line.get("finding")), line)  # the first one written: diagnose never writes two
        return found

    def arm_result(self, pairing: str, line: dict[str, Any]) -> ArmResult:
        """An ArmResult as the harness built it when the arm finished (before the pairing was judged)."""
        from specparity.harness.results import ArmResult

        return ArmResult.from_dict(line, self.requests(pairing, str(line["name"])))

    def table_lines(self) -> list[str]:
        """Per pairing: arms x requests with the verdict in each cell, the sha256 groups, what did not match."""
        from specparity.harness.plan import ArmKind
        from specparity.harness.results import groups_lines
        from specparity.verdicts import Verdict

        out: list[str] = []
        for pname in self.pairing_names():
            lines = self.arm_lines(pname)
            final = {a["name"]: a for a in self.final_arms(pname)}
            rids: list[str] = []  # in the order the arms sent them (the JSONL keeps it, the verdicts map is sorted)
            for a in lines:
                sent = [str(r.get("id")) for r in self.requests(pname, a["name"])]
                for r in [*sent, *(a.get("verdicts") or {})]:
                    if r not in rids:
                        rids.append(r)
            p = self.pairing_summary(pname)
            head = "incomplete (no pairing verdict)"
            if p:
                head = (f"{p.get('profile')} server, widths per {p.get('width_mode')}, verdict {p['verdict']}"
                        + (f" ({p['reason']})" if p.get("reason") else ""))
            out += ["", f"pairing {pname}: {head}"]
            table = []
            for a in lines:
                v = (final.get(a["name"]) or a)["verdict"]
                table.append([a["name"], _cell(a.get("width")),
                              *[_cell((a.get("verdicts") or {}).get(r)) for r in rids], str(v)])
            out += _grid(["arm", "width", *rids, "arm verdict"], table)
            if p:
                out += groups_lines(p.get("groups") or [], p.get("request_groups") or {}, "sha256 ")
                out += [f"  finding: {f}" for f in p.get("findings") or []]
            for a in lines:
                for r in self.requests(pname, a["name"]):
                    if r.get("verdict") in (Verdict.DIVERGED, Verdict.ERROR, Verdict.DECLINED, Verdict.LOSSY) or (
                            r.get("verdict") == Verdict.NOT_ENGAGED and a.get("kind") != ArmKind.BASELINE):
                        out.append(f"  {a['name']} {r.get('id')}: {r.get('verdict')}: {r.get('reason')}")
                        diag = self.diagnosis(pname, str(a["name"]), str(r.get("id")))
                        if diag is not None:
                            out += ["    " + line for line in diagnosis_lines(diag, self.record.name)]
        return out

    def report(self) -> ServedReport:
        """The complete record's ServedReport, rebuilt from its summary and request lines."""
        from specparity.harness.results import ServedReport

        return ServedReport.from_dict(self.summary, self.requests)


def finding_id(pairing: str, arm: str, request: str) -> str:
    """How a record names a finding (a diverged request): ``PAIRING/ARM/REQUEST``."""
    return f"{pairing}/{arm}/{request}"


# the location's keys in the order a reader reads them, and the words each is said with
_LOCATION_WORDS = (("width", "width"), ("depth", "depth"), ("position", "cache position"), ("round", "round"),
                   ("row", "row"), ("token_index", "token"), ("layer", "layer"), ("subop", "sub-op"),
                   ("child", "child"), ("rollback_round", "rollback after round"), ("accepted", "accepted"),
                   ("tensor", "tensor"),
                   ("stale_rows", "stale rows"), ("row_position", "at position"),
                   ("capture", "first differing capture"),
                   ("max_tokens", "max_tokens"), ("completion_tokens", "tokens emitted"))


def location_text(location: Any) -> str:
    """A diagnosis's location in words ("width 4, depth 0, cache position 12, layer 2, sub-op mlp"), its
    keys in reading order, the margin last; "-" when it names nothing."""
    if not isinstance(location, dict):
        return "-"
    bits = [f"{word} {location[k]}" for k, word in _LOCATION_WORDS if location.get(k) is not None]
    margin = location.get("margin")
    if isinstance(margin, (int, float)) and not isinstance(margin, bool):
        ulps = location.get("margin_ulps")
        bits.append(f"top-2 margin {margin:.4g} nats"
                    + (f" ({ulps:.3g} ULPs)" if isinstance(ulps, (int, float)) and not isinstance(ulps, bool)
                       else ""))
    return ", ".join(bits) or "-"


def diagnosis_lines(line: dict[str, Any], record_name: str | None = None) -> list[str]:
    """What ``records show`` prints of a diagnoses.jsonl line: its phase, location and summary, the steps'
    verdicts in one line, and where it was diagnosed when that is another record (an earlier night's)."""
    d = line.get("diagnosis") or {}
    where = location_text(d.get("location"))
    out = [f"diagnosis: phase {d.get('phase')}{'' if where == '-' else f' at {where}'}: {d.get('summary')}"]
    steps = [s for s in d.get("steps") or [] if isinstance(s, dict)]
    if steps:
        out.append("  steps: " + "; ".join(
            f"{s.get('number')} {s.get('name')} {s.get('verdict') if s.get('status') == 'ran' else s.get('status')}"
            for s in steps))
    made_in = line.get("diagnosed_in")
    if made_in and made_in != record_name:
        out.append(f"  diagnosed in {made_in} (another record of the same finding: an earlier night, or a shard;"
                   " not re-run)")
    out += [f"  open: {o}" for o in d.get("open") or []]
    return out


def append_diagnoses(record: Record, lines: list[dict[str, Any]], markdown: list[str] | None = None) -> Path:
    """Diagnoses into the complete served ``record``: their lines appended to its diagnoses.jsonl (flushed
    as written) and ``markdown`` appended to its .md. Appended only: nothing the job wrote is replaced,
    and a link in the record's place is refused (the readers refuse it too). Returns the diagnoses file."""
    import json

    f = record.data_dir / f"{DIAGNOSES}.jsonl"
    for target, text in ((f, "".join(json.dumps(x, sort_keys=True, default=str) + "\n" for x in lines)),
                         (Path(record.path), "\n".join(["", *markdown]) + "\n" if markdown else "")):
        if not text:
            continue
        fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        with os.fdopen(fd, "a") as fh:
            fh.write(text)
            fh.flush()
    return f


def read_diagnoses(path: str | os.PathLike[str]) -> tuple[Record, list[dict[str, Any]]]:
    """A served record's report and its diagnoses.jsonl lines alone (each checked), without reading its
    requests: what a later night reads of the earlier ones. FileNotFoundError: not a record."""
    rec, _, rows = read_record(path, only=(DIAGNOSES,))
    for i, line in enumerate(rows.get(DIAGNOSES, [])):
        check_line(rec.data_dir, DIAGNOSES, i + 1, line)
    return rec, rows.get(DIAGNOSES, [])


@functools.cache
def _schemas() -> tuple[Check, Check, Check]:
    """(summary, arm line, request line): what served writes, by type. Readers rely on the
    required keys; other keys are typed where a reader uses them, and any further key is kept."""
    from specparity.harness.plan import ArmKind, WidthMode
    from specparity.verdicts import Verdict

    verdict = Enum(v.value for v in Verdict)
    names = MapOf(Anything(), key=Str())
    evidence = Fields({"verify_calls": Int(0), "draft_calls": Int(0), "accepts": ListOf(Int()),
                       "widths": ListOf(Int()), "first_offset": Nullable(Int()), "lines": ListOf(Str()),
                       "declined": Bool(), "sources": ListOf(Str()), "cache": Nullable(Str()),
                       "cached_tokens": Nullable(Int())}, open=True)
    completion = Fields({"text": Str(), "sha256": Str(), "token_ids": Nullable(ListOf(Int())),
                         "logprobs": Nullable(ListOf(Number())),
                         "top": Nullable(ListOf(ListOf(ListOf(Number(), min_len=2, max_len=2)))),
                         "usage": Nullable(names), "finish_reason": Nullable(Str()), "seconds": Nullable(Number()),
                         "status": Nullable(Int()), "error": Nullable(Str()), "raw": Nullable(names)}, open=True)
    tokens = ListOf(Int())
    divergence = Fields({"token_index": Nullable(Int()), "char_offset": Nullable(Int()), "reference": Str(),
                         "other": Str(), "margin_reference": Nullable(Number()), "margin_other": Nullable(Number()),
                         "first_logprob_diff": Nullable(Int()), "tokens_before": tokens, "reference_tokens": tokens,
                         "other_tokens": tokens, "reference_pieces": Nullable(ListOf(Str())),
                         "other_pieces": Nullable(ListOf(Str())), "reference_token_count": Nullable(Int()),
                         "other_token_count": Nullable(Int()), "text_before": Str(), "reference_snippet": Str(),
                         "other_snippet": Str(), "logprobs_equal_before": Nullable(Bool()),
                         "detokenization": Nullable(Str()), "written_as": Nullable(Str())}, open=True)
    request = Fields({"id": Str(nonempty=True), "kind": Str(), "verdict": verdict, "reason": Nullable(Str()),
                      "completion": Nullable(completion), "evidence": Nullable(evidence),
                      "divergence": Nullable(divergence), "classic": Nullable(divergence),
                      "baseline": Nullable(divergence), "cold": Nullable(divergence), "text": Nullable(Str()),
                      "request": Nullable(names), "replay": Nullable(Str())},
                     required=("id", "kind", "verdict"), open=True)
    arm = Fields({"pairing": Str(), "name": Str(nonempty=True), "kind": Enum(k.value for k in ArmKind),
                  "verdict": verdict, "width": Nullable(Int()), "setting": Nullable(Int()),
                  "setting_name": Nullable(Str()), "reason": Nullable(Str()),
                  "served_by": Nullable(Enum(m.value for m in WidthMode)), "server": Nullable(names),
                  "seconds": Nullable(Number()), "generation_seconds": Nullable(Number()),
                  "acceptance": Nullable(Number()), "digest": Nullable(Str()),
                  "verdicts": Nullable(MapOf(verdict, key=Str())), "notes": Nullable(ListOf(Str())),
                  "requests": AnyOf(Int(0), ListOf(request))}, required=("name", "kind", "verdict"), open=True)
    groups = ListOf(ListOf(Str()))
    pairing = Fields({"name": Str(nonempty=True), "profile": Str(), "target": Str(), "draft": Nullable(Str()),
                      "verdict": verdict, "reason": Nullable(Str()),
                      "width_mode": Nullable(Enum(m.value for m in WidthMode)), "groups": Nullable(groups),
                      "request_groups": Nullable(MapOf(groups, key=Str())), "findings": Nullable(ListOf(Str())),
                      "arms": ListOf(arm)}, required=("name", "verdict"), open=True)
    arm_names = MapOf(ListOf(Str()), key=Str())
    job = Fields({"max_tokens": Nullable(Int(0)), "pairings": Nullable(ListOf(Anything()))}, open=True)
    summary = Fields({"pairings": ListOf(pairing), "job": Nullable(job), "wall_seconds": Nullable(Number()),
                      "shard": Nullable(Fields({"index": Int(1), "count": Int(1), "plan": arm_names, "arms": arm_names},
                                               required=("index", "count", "plan", "arms"), open=True))},
                     open=True)
    return summary, arm, request


def check_served(record: Record, rows: dict[str, list[dict[str, Any]]]) -> None:
    """The summary and every line as ``served`` writes them; a UsageError names the file and entry
    (a report.json of the wrong shape, an arm line without ``verdict``, ...)."""
    data = record.data_dir
    if record.summary is not None:
        check(record.summary, _schemas()[0], f"{data / REPORT_FILE}: summary")
    for stem, lines in rows.items():
        for i, line in enumerate(lines):
            check_line(data, stem, i + 1, line)
    if record.summary is not None:
        _check_lines_of_summary(record.summary, rows, data)


def check_line(data: Path, stem: str, entry: int, line: dict[str, Any]) -> None:
    """One JSONL line of a served record's data directory ``data`` as ``served`` writes it: an arm's
    (``arms.jsonl``), a diagnosis's (``diagnoses.jsonl``) or a request's; a UsageError names the file and
    the entry (numbered from 1)."""
    _, arm, request = _schemas()
    schema = arm if stem == ARMS else _diagnosis_schema() if stem == DIAGNOSES else request
    check(line, schema, f"{data / stem}.jsonl, entry {entry}")


@functools.cache
def _diagnosis_schema() -> Check:
    """A diagnoses.jsonl line, typed where ``records show`` and the page read it."""
    from specparity.verdicts import Verdict

    step = Fields({"number": Int(1), "name": Str(), "status": Str(), "verdict": Enum(v.value for v in Verdict),
                   "evidence": ListOf(Str()), "command": Nullable(Str())},
                  required=("number", "status"), open=True)
    diagnosis = Fields({"phase": Str(), "location": MapOf(Anything(), key=Str()), "summary": Str(),
                        "steps": ListOf(step), "open": ListOf(Str()), "seconds": Nullable(Number())},
                       required=("phase",), open=True)
    return Fields({"finding": Str(nonempty=True), "key": Nullable(Str()), "diagnosed_in": Nullable(Str()),
                   "diagnosis": diagnosis}, required=("finding", "diagnosis"), open=True)


def _check_lines_of_summary(summary: dict[str, Any], rows: dict[str, list[dict[str, Any]]], data: Any) -> None:
    """Every arm the summary judged has its line, and as many request lines as it counted: a record without
    them would read as fewer finished arms (show) or as parts only one side has (compare), never an error."""
    lines = {(a.get("pairing"), a.get("name")) for a in rows.get(ARMS, [])}
    for p in summary.get("pairings") or []:
        for a in p.get("arms") or []:
            if (p["name"], a["name"]) not in lines and (None, a["name"]) not in lines:
                raise UsageError(f"{data / ARMS}.jsonl: no line for arm {printable(a['name'])} of pairing"
                                 f" {printable(p['name'])}, which"
                                 f" {REPORT_FILE}'s summary judged: the record is damaged (a file or lines lost)")
            counted = a.get("requests")
            stem = request_stem(p["name"], a["name"])
            have = len(rows.get(stem, []))
            if isinstance(counted, int) and not isinstance(counted, bool) and have < counted:
                raise UsageError(f"{data / stem}.jsonl: {'missing' if stem not in rows else f'holds {have} requests'},"
                                 f" where {REPORT_FILE}'s summary counts {counted} for arm {printable(a['name'])} of"
                                 f" pairing {printable(p['name'])}: the record is damaged (a file or lines lost)")


def read_served(path: str | os.PathLike[str], complete: bool = True) -> ServedRecord:
    """A served record (a UsageError names a path that is not one, or, with ``complete``, not finished)."""
    if complete:
        rec, ident, rows = read_complete(path)
    else:
        try:
            rec, ident, rows = read_record(path)
        except FileNotFoundError:
            raise UsageError(f"{path}: not a record (no report.json)") from None
    return ServedRecord.of(path, rec, ident, rows)


def _cell(v: Any) -> str:
    return "-" if v is None else str(v)


def _grid(head: list[str], table: list[list[str]]) -> list[str]:
    widths = [max([len(h), *(len(t[i]) for t in table)]) for i, h in enumerate(head)]  # no arm finished: heads
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [head, *table]]
