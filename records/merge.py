"""``records merge``: join the records of ``specparity served --shard i/n`` into one record.

Each shard ran every n-th non-baseline arm plus the baselines its pairings
need (``specparity.harness.shard``). The merge takes every arm from the shard
that ran it, each pairing's baselines from the lowest-numbered shard that ran
the pairing, puts arms back in the unsharded job's run order, and judges each
pairing again with the harness's own judge, so verdicts, sha256 groups and
texts are the ones the unsharded run gives; only timings differ (the merged
``wall_seconds`` is the slowest shard's: shards run side by side).

Refused (a UsageError naming the file): a record that is not a complete
served shard, shards of different job configs, of different identities
(specparity, mlx, mlx-lm, Python, device, platform, git commit, kernel env,
server versions; the host may differ, a CI matrix spans runners), a shard
given twice, and a missing shard. Shards whose baselines disagree merge into
an ``inconclusive`` pairing: their references are not the same bytes.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from specparity.errors import UsageError
from specparity.records.record import Record, RecordSink, read_complete
from specparity.records.writer import _slugify
from specparity.verdicts import Verdict

IDENTITY_KEYS = ("specparity", "git_commit", "mlx", "mlx_lm", "python", "device", "platform", "env", "job")


@dataclass
class ShardRecord:
    """One shard's record as read back: where it is, what it holds."""

    path: str
    record: Record
    identity: dict[str, Any]
    rows: dict[str, list[dict[str, Any]]]

    @property
    def shard(self) -> dict[str, Any]:
        return (self.record.summary or {}).get("shard") or {}

    @property
    def index(self) -> int:
        return int(self.shard["index"])

    def arm_lines(self, pairing: str) -> list[dict[str, Any]]:
        return [a for a in self.rows.get("arms", []) if a.get("pairing") == pairing]

    def requests(self, pairing: str, arm: str) -> list[dict[str, Any]]:
        return self.rows.get(_slugify(f"{pairing}-{arm}"), [])


def read_shard(path: str | os.PathLike) -> ShardRecord:
    """A complete ``served --shard`` record, or a UsageError naming ``path``."""
    rec, ident, rows = read_complete(path)
    if rec.kind != "served":
        raise UsageError(f"{path}: a {rec.kind} record; merge joins served records")
    if not (rec.summary or {}).get("shard"):
        raise UsageError(f"{path}: not a shard (recorded without --shard)")
    return ShardRecord(str(path), rec, ident, rows)


def _server_versions(s: ShardRecord) -> dict[str, str]:
    out: dict[str, str] = {}
    for a in s.rows.get("arms", []):
        srv = a.get("server") or {}
        if srv.get("profile") and srv.get("version") is not None:
            out.setdefault(str(srv["profile"]), str(srv["version"]))
    return out


def check_shards(shards: list[ShardRecord]) -> None:
    """Same config, same identity, each shard once, none missing; else a UsageError naming the file."""
    if not shards:
        raise UsageError("records merge: give the shard records to merge")
    first = shards[0]
    count = int(first.shard["count"])
    seen: dict[int, str] = {}
    versions = _server_versions(first)
    for s in shards:
        if int(s.shard["count"]) != count:
            raise UsageError(f"{s.path}: shard {s.index}/{s.shard['count']}, but {first.path} is one of {count}")
        if s.index in seen:
            raise UsageError(f"{s.path}: shard {s.index}/{count} given twice (also {seen[s.index]})")
        seen[s.index] = s.path
        if s.record.summary["job"] != first.record.summary["job"] or s.shard["plan"] != first.shard["plan"]:  # type: ignore[index]
            raise UsageError(f"{s.path}: a different job config from {first.path}: shards of one job only")
        for key in IDENTITY_KEYS:
            if s.identity.get(key) != first.identity.get(key):
                raise UsageError(f"{s.path}: a different identity from {first.path} ({key}:"
                                 f" {s.identity.get(key)!r} vs {first.identity.get(key)!r})")
        for prof, v in _server_versions(s).items():
            if versions.setdefault(prof, v) != v:
                raise UsageError(f"{s.path}: {prof} server version {v!r} differs from {versions[prof]!r}")
    missing = sorted(set(range(1, count + 1)) - set(seen))
    if missing:
        raise UsageError(f"records merge: shard {missing[0]}/{count} missing"
                         f" (have {', '.join(f'{i}/{count}' for i in sorted(seen))})")


def pick(cls: type, d: dict[str, Any]) -> Any:
    """A dataclass from a dict its ``to_dict`` wrote (keys that are not fields, such as properties, dropped)."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names})


def _arm(line: dict[str, Any], requests: list[dict[str, Any]]) -> Any:
    """An ArmResult as the harness built it when the arm finished (before the pairing was judged)."""
    from specparity.harness.client import Completion
    from specparity.harness.served import ArmResult, Divergence, RequestResult
    from specparity.harness.witness import Evidence

    reqs = [RequestResult(r["id"], r["kind"], Verdict(r["verdict"]), r["reason"], pick(Completion, r["completion"]),
                          r["request"], pick(Evidence, r.get("evidence") or {}),
                          pick(Divergence, r["divergence"]) if r.get("divergence") else None, r.get("replay"))
            for r in requests]
    return ArmResult(line["name"], line["kind"], line["width"], line["setting"], Verdict(line["verdict"]),
                     line["reason"], line["served_by"], reqs, line["server"], line["seconds"],
                     line["generation_seconds"], line["acceptance"])


def merge_shards(shards: list[ShardRecord]) -> tuple[Any, list[tuple[str, dict[str, Any], list[dict[str, Any]]]]]:
    """The merged ServedReport, and the JSONL lines in the unsharded run's order: (pairing, arm line, requests)."""
    from specparity.harness.served import PairingResult, ServedReport, _judge_pairing

    check_shards(shards)
    shards = sorted(shards, key=lambda s: s.index)
    plan: dict[str, list[str]] = shards[0].shard["plan"]
    first = shards[0].record.summary
    report = ServedReport([], first["job"], wall_seconds=max(s.record.summary["wall_seconds"] for s in shards))  # type: ignore[index]
    lines: list[tuple[str, dict[str, Any], list[dict[str, Any]]]] = []
    for pname, order in plan.items():
        runners = [s for s in shards if pname in s.shard["arms"]]
        if not runners:
            continue
        meta = next(p for p in runners[0].record.summary["pairings"] if p["name"] == pname)  # type: ignore[index]
        res = PairingResult(pname, meta["profile"], meta["target"], meta["draft"], width_mode=meta["width_mode"])
        base_digests: dict[str, dict[str, int]] = {}
        for arm_name in order:
            owners = [s for s in runners if arm_name in s.shard["arms"][pname]]
            found = [(s, a) for s in owners for a in s.arm_lines(pname) if a["name"] == arm_name]
            if not found:
                continue
            for s, a in found:
                base_digests.setdefault(arm_name, {}).setdefault(a["digest"], s.index)
            s, line = found[0]
            reqs = s.requests(pname, arm_name)
            res.arms.append(_arm(line, reqs))
            lines.append((pname, line, reqs))
        _judge_pairing(res)
        split = {arm: d for arm, d in base_digests.items() if len(d) > 1}
        if split:
            res.verdict = Verdict.INCONCLUSIVE
            res.reason = ("the shards' baselines are not the same bytes ("
                          + "; ".join(f"{arm}: {len(d)} outputs across shards {', '.join(map(str, d.values()))}"
                                      for arm, d in split.items())
                          + "): classic decode is not reproducible across processes")
        report.pairings.append(res)
    return report, lines


def merge_records(paths: list[str], out_dir: str | os.PathLike, argv: list[str] | None = None) -> tuple[Any, Path]:
    """Read, check and merge shard records; write one served record into ``out_dir``.

    Returns (the merged ServedReport, the record's markdown path).
    """
    from specparity.records.chart import served_markdown

    shards = [read_shard(p) for p in paths]
    report, lines = merge_shards(shards)
    shards.sort(key=lambda s: s.index)
    ident = {**shards[0].identity,
             "shards": [{"index": s.index, "count": s.shard["count"], "record": s.path,
                         "host": s.identity.get("host")} for s in shards]}
    with RecordSink(out_dir, "served", shards[0].record.title, ident, argv=argv, slug="served") as sink:
        for pname, arm, reqs in lines:
            sink.append("arms", arm)
            for r in reqs:
                sink.append(f"{pname}-{arm['name']}", r)
            sink.timing(f"{pname}/{arm['name']}", float(arm.get("seconds") or 0.0))
        assert sink.writer is not None
        for s in shards:
            src = Path(s.record.path).parent / "data" / s.record.name / "servers"
            if src.is_dir():
                shutil.copytree(src, sink.writer.data_dir / "servers" / f"shard{s.index}")
        path = sink.finish(report, served_markdown(report, sink))
    assert path is not None
    return report, path
