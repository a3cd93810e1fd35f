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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specparity.errors import Name, UsageError
from specparity.records.record import RecordSink
from specparity.records.served import (
    ARMS,
    DIAGNOSES,
    SERVERS_DIR,
    ServedRecord,
    read_served,
    served_markdown,
    write_arm,
)
from specparity.verdicts import Verdict

if TYPE_CHECKING:
    from specparity.harness.results import ArmResult, ServedReport

IDENTITY_KEYS = ("specparity", "git_commit", "mlx", "mlx_lm", "python", "device", "platform", "env", "job")


def _index(s: ServedRecord) -> int:
    return int(s.shard["index"])


def read_shard(path: str | os.PathLike[str]) -> ServedRecord:
    """A complete ``served --shard`` record, or a UsageError naming ``path``."""
    s = read_served(path)
    if not s.shard:
        raise UsageError(f"{path}: not a shard (recorded without ", Name("shard"), ")")
    return s


def _server_versions(s: ServedRecord) -> dict[str, str]:
    out: dict[str, str] = {}
    for a in s.rows.get(ARMS, []):
        srv = a.get("server") or {}
        if srv.get("profile") and srv.get("version") is not None:
            out.setdefault(str(srv["profile"]), str(srv["version"]))
    return out


def check_shards(shards: list[ServedRecord]) -> None:
    """Same config, same identity, each shard once, none missing; else a UsageError naming the file."""
    if not shards:
        raise UsageError("records merge: give the shard records to merge")
    first = shards[0]
    count = int(first.shard["count"])
    seen: dict[int, str] = {}
    versions = _server_versions(first)
    for s in shards:
        if int(s.shard["count"]) != count:
            raise UsageError(f"{s.path}: shard {_index(s)}/{s.shard['count']}, but {first.path} is one of {count}")
        if _index(s) in seen:
            raise UsageError(f"{s.path}: shard {_index(s)}/{count} given twice (also {seen[_index(s)]})")
        seen[_index(s)] = s.path
        if s.summary.get("job") != first.summary.get("job") or s.shard["plan"] != first.shard["plan"]:
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


def merge_shards(shards: list[ServedRecord]) -> tuple[ServedReport, list[tuple[str, ArmResult]]]:
    """The merged ServedReport, and each arm as its shard wrote it (before the pairing was judged
    again), in the unsharded run's order: (pairing, arm)."""
    from specparity.harness.judge import judge_pairing
    from specparity.harness.results import PairingResult, ServedReport

    check_shards(shards)
    shards = sorted(shards, key=_index)
    plan: dict[str, list[str]] = shards[0].shard["plan"]
    report = ServedReport([], shards[0].summary["job"],
                          wall_seconds=max(float(s.summary.get("wall_seconds") or 0.0) for s in shards))
    written: list[tuple[str, ArmResult]] = []
    for pname, order in plan.items():
        runners = [s for s in shards if pname in s.shard["arms"]]
        if not runners:
            continue
        meta = runners[0].pairing_summary(pname) or {}
        # the pairing as the first shard recorded it, less what the merge judges again from every shard's arms
        res = PairingResult.from_dict({**meta, "name": pname, "verdict": Verdict.NOT_RUN, "reason": "",
                                       "findings": [], "causes": [], "arms": [], "reference_cost": None})
        res.reference = {k: v for s in runners for k, v in ((s.pairing_summary(pname) or {})
                                                            .get("reference") or {}).items()}
        base_digests: dict[str, dict[str, int]] = {}
        for arm_name in order:
            owners = [s for s in runners if arm_name in s.shard["arms"][pname]]
            found = [(s, a) for s in owners for a in s.arm_lines(pname) if a["name"] == arm_name]
            if not found:
                continue
            for s, a in found:
                base_digests.setdefault(arm_name, {}).setdefault(a["digest"], _index(s))
            s, line = found[0]
            res.arms.append(s.arm_result(pname, line))
            written.append((pname, s.arm_result(pname, line)))  # its own copy: judging the pairing changes res's
        costs = [c for c in ((s.pairing_summary(pname) or {}).get("reference_cost") for s in runners) if c]
        if costs:  # every shard ran its own classic reference: the merged record says what all of them cost
            res.reference_cost = {k: _joined(k, [c.get(k) for c in costs]) for k in costs[0]}
        judge_pairing(res)
        split = {arm: d for arm, d in base_digests.items() if len(d) > 1}
        if split:
            res.verdict = Verdict.INCONCLUSIVE
            res.reason = ("the shards' baselines are not the same bytes ("
                          + "; ".join(f"{arm}: {len(d)} outputs across shards {', '.join(map(str, d.values()))}"
                                      for arm, d in split.items())
                          + "): classic decode is not reproducible across processes")
        report.pairings.append(res)
    return report, written


def merge_records(paths: list[str], out_dir: str | os.PathLike[str],
                  argv: list[str] | None = None) -> tuple[ServedReport, Path]:
    """Read, check and merge shard records; write one served record into ``out_dir``.

    Returns (the merged ServedReport, the record's markdown path).
    """
    shards = [read_shard(p) for p in paths]
    report, written = merge_shards(shards)
    shards.sort(key=_index)
    ident = {**shards[0].identity,
             "shards": [{"index": _index(s), "count": s.shard["count"], "record": s.path,
                         "host": s.identity.get("host")} for s in shards]}
    with RecordSink(out_dir, "served", shards[0].record.title, ident, argv=argv, slug="served") as sink:
        for pname, arm in written:
            write_arm(sink.append, pname, arm)
            sink.timing(f"{pname}/{arm.name}", arm.seconds)
        assert sink.writer is not None
        for s in shards:
            src = s.record.data_dir / SERVERS_DIR
            if src.is_dir():
                shutil.copytree(src, sink.writer.data_dir / SERVERS_DIR / f"shard{_index(s)}")
            for line in s.rows.get(DIAGNOSES, []):  # a shard's diagnoses (served --diagnose): beside the same request
                sink.append(DIAGNOSES, line)
        path = sink.finish(report, served_markdown(report, sink))
    assert path is not None
    return report, path


def _joined(key: str, values: list[Any]) -> Any:
    """One reference-cost field over every shard's: counts and seconds add up, each worker's peak memory is
    listed, the largest peak is the largest."""
    if key.startswith("peak"):
        known = [v for v in values if isinstance(v, (int, float))]
        return max(known) if known else None
    if any(isinstance(v, list) for v in values):
        return [x for v in values for x in (v or [])]
    return sum(v or 0 for v in values)
