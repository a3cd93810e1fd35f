"""Diagnoses written into the served record they diagnose: what ``served --diagnose`` and the nightly job run.

After a job, once its servers are gone, each finding of the record it wrote is taken through the tree
(specparity.diagnose.tree) and its diagnosis appended beside it (records.served.append_diagnoses: a
line of diagnoses.jsonl and a "Diagnoses" section of the markdown), one line the moment it is made.

A finding is not diagnosed twice: one this record already holds is left as it is, and one an earlier
record in the same records directory diagnosed (the same ``key``: findings.finding_key, the same
request answered the same way by the same engine on the same weights) has that diagnosis copied, its
``diagnosed_in`` naming the record whose run made it. Only the rest are run, grouped by target: one
target's checkpoints are loaded at a time and let go before the next's.
"""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specparity.diagnose.findings import Finding, read_findings

if TYPE_CHECKING:
    from specparity.diagnose.tree import ReplayRequest

log = logging.getLogger(__name__)


@dataclass
class RecordDiagnoses:
    """What one pass over a served record did.

    record: the record diagnosed. ran: the diagnoses.jsonl lines this pass made by running the tree.
    reused: the lines copied from an earlier record (the same finding: its ``diagnosed_in`` names which).
    held: the findings the record already held a diagnosis of (left as they were). failed: finding id ->
    why its tree stopped (a checkpoint that would not load): no line is written for it, a later pass
    runs it again.
    """

    record: str
    ran: list[dict[str, Any]] = field(default_factory=list)
    reused: list[dict[str, Any]] = field(default_factory=list)
    held: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)

    def lines(self) -> list[str]:
        from specparity.records.served import diagnosis_lines

        name = Path(self.record).stem
        total = len(self.ran) + len(self.reused) + len(self.held) + len(self.failed)
        if not total:
            return [f"diagnose: {name}: no finding to diagnose"]
        out = [f"diagnose: {name}: {len(self.ran)} diagnosed, {len(self.reused)} taken from an earlier night,"
               f" {len(self.held)} already in the record" + (f", {len(self.failed)} failed" if self.failed else "")]
        for line in self.ran + self.reused:
            out.append(f"  {line['finding']}:")
            out += ["    " + x for x in diagnosis_lines(line, name)]
        out += [f"  {fid}: not diagnosed: {why}" for fid, why in self.failed.items()]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"record": self.record, "ran": self.ran, "reused": self.reused, "held": self.held,
                "failed": self.failed}


def diagnosis_line(f: Finding, diagnosis: dict[str, Any], diagnosed_in: str) -> dict[str, Any]:
    """One line of diagnoses.jsonl (records.served's layout)."""
    return {"finding": f.id, "key": f.key, "diagnosed_in": diagnosed_in, "diagnosis": diagnosis}


def earlier_diagnoses(directory: Path, but: str) -> dict[str, dict[str, Any]]:
    """key -> the first diagnoses.jsonl line holding it, over the served records in ``directory`` other than
    the one named ``but``, oldest first. A record that cannot be read is passed over (it holds nothing to
    reuse), never an error: tonight's diagnosis does not depend on last month's files."""
    from specparity.errors import UsageError
    from specparity.records.record import list_records, read_report
    from specparity.records.served import KIND

    found: dict[str, dict[str, Any]] = {}
    records = []
    for md in list_records(directory):
        if md.stem == but or not (directory / "data" / md.stem / "diagnoses.jsonl").is_file():
            continue
        try:
            rec = read_report(md)
        except (FileNotFoundError, UsageError):
            continue
        if rec.kind == KIND:
            records.append((rec.started or "", md.name, md))
    for _, _, md in sorted(records):
        _add_diagnoses(found, md)
    return found


def _add_diagnoses(found: dict[str, dict[str, Any]], md: Path) -> None:
    """key -> diagnoses.jsonl line of the served record ``md``, added to ``found`` where the key is new. A record
    that cannot be read adds nothing (logged)."""
    from specparity.errors import UsageError
    from specparity.records.served import read_diagnoses

    try:
        _, lines = read_diagnoses(md)
    except (FileNotFoundError, OSError, UsageError) as err:
        log.info("diagnoses of %s not read: %s", md, err)
        return
    for line in lines:
        if line.get("key"):
            found.setdefault(str(line["key"]), line)


def diagnose_record(path: str | os.PathLike[str], reproduction: Callable[[Finding], ReplayRequest | None],
                    note: Callable[[str], None] | None = None,
                    read: Callable[[str], ReplayRequest | None] | None = None,
                    also: tuple[str | os.PathLike[str], ...] = ()) -> RecordDiagnoses:
    """Diagnose the served record at ``path`` into itself (the module's docstring). reproduction: a finding's
    record command read as the request it reruns (specparity.commands.diagnose.read_reproduction: the
    command's own reading); note: progress lines; also: served records elsewhere (last night's, given by the
    nightly job's ``--previous``) whose diagnoses are copied as an earlier record's in the same directory are."""
    from specparity.diagnose.command_worker import command_workers
    from specparity.diagnose.elsewhere import diagnose_elsewhere, environment_of
    from specparity.diagnose.tree import Models, diagnose_finding
    from specparity.errors import SpecparityError
    from specparity.records.served import append_diagnoses, read_served

    where, found = read_findings(path)
    sr = read_served(where)
    rec = sr.record
    out = RecordDiagnoses(str(where))
    earlier = earlier_diagnoses(Path(rec.path).parent, rec.name)
    for other in also:  # the directory's own come first: the oldest diagnosis of a key is the one kept
        if Path(other).resolve() != Path(rec.path).resolve():
            _add_diagnoses(earlier, Path(other))
    todo: dict[tuple[str, bool], list[tuple[Finding, Any]]] = {}
    elsewhere: list[Finding] = []
    for f in found:
        if sr.diagnosis(f.pairing, f.arm, f.request) is not None:
            out.held.append(f.id)
            continue
        prev = earlier.get(f.key) if f.key else None
        if prev is not None:
            line = diagnosis_line(f, prev["diagnosis"], str(prev.get("diagnosed_in") or ""))
            append_diagnoses(rec, [line])
            out.reused.append(line)
            continue
        if environment_of(f) is not None:  # its servers ran another mlx-lm: diagnosed in their environment
            elsewhere.append(f)
            continue
        r = reproduction(f)
        todo.setdefault((r.model, r.trust_remote_code) if r is not None else ("", False), []).append((f, r))
    for fid, made in diagnose_elsewhere(str(where), elsewhere).items():
        if isinstance(made, str):
            out.failed[fid] = made
            continue
        f = next(x for x in elsewhere if x.id == fid)
        line = diagnosis_line(f, made, rec.name)
        append_diagnoses(rec, [line])
        out.ran.append(line)
    with command_workers():  # step 8's reruns: one interpreter per environment for all the findings
        for (target, _), group in todo.items():
            models = Models()  # this target's (and its drafters') checkpoints only: let go before the next's
            for f, r in group:
                if note is not None:
                    note(f"diagnosing {f.id}")
                try:
                    d = diagnose_finding(f, r, models, read)
                except SpecparityError as err:
                    out.failed[f.id] = str(err)
                    continue
                line = diagnosis_line(f, d.to_dict(), rec.name)
                append_diagnoses(rec, [line])
                out.ran.append(line)
            del models
            _release()
    new = out.ran + out.reused
    if new:
        from specparity.records.served import diagnosis_lines

        md = ["## Diagnoses", "", "```"]
        for line in new:
            md += [f"{line['finding']}:"] + ["  " + x for x in diagnosis_lines(line, rec.name)]
        append_diagnoses(rec, [], md + ["```"])
    return out


def _release() -> None:
    """Let a target's arrays go before the next target loads (mlx keeps freed buffers in its cache)."""
    gc.collect()
    try:
        import mlx.core as mx

        mx.clear_cache()
    except (ImportError, AttributeError):
        pass
