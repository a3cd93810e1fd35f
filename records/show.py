"""Reading records for a reader: a path to its record (a directory's newest), the lines ``records show``
prints and the rows ``records list`` prints. No mlx import: the ``records`` commands start instantly."""

from __future__ import annotations

from typing import Any

from specparity.errors import UsageError
from specparity.inputs import expand_user
from specparity.records.compare import ID_KEYS as _ID_KEYS
from specparity.records.text import printable

_DETAIL_KEYS = ("reason", "summary", "message", "detail")


def open_record(path: str) -> tuple[Any, dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """The record at ``path`` (its .md, data directory or report.json), or a records directory's newest:
    (the record, its identity, its finished parts by arm)."""
    from specparity.records.record import list_records, read_record

    p = expand_user(path)
    if not p.exists():
        raise UsageError(f"{path}: no such file or directory")
    try:
        return read_record(p)  # a malformed file is a UsageError naming it
    except FileNotFoundError:
        pass
    except OSError as err:
        raise UsageError(f"{path}: not a readable record ({err.strerror or err})") from None
    found = list_records(p) if p.is_dir() else []
    if not found:
        raise UsageError(f"{path}: not a record (no data/<name>/report.json) and holds none")
    newest = max(found, key=lambda md: (md.stat().st_mtime, md.name))
    return open_record(str(newest))


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (dict, list)):
        return f"({len(v)} items)"
    return str(v)


def arm_table(rows: list[dict[str, Any]]) -> list[str]:
    """One line per finished part: its identifying keys, its verdict, its detail."""
    if not rows:
        return ["  (none finished)"]
    keys = [k for k in _ID_KEYS if any(k in r for r in rows)]
    has_verdict = any("verdict" in r for r in rows)
    head = keys + (["verdict"] if has_verdict else [])
    table = [[_cell(r.get(k)) for k in head] + [next((str(r[d]) for d in _DETAIL_KEYS if r.get(d)), "")]
             for r in rows]
    widths = [max(len(h), *(len(t[i]) for t in table)) for i, h in enumerate(head)]
    out = ["  " + "  ".join(h.ljust(w) for h, w in zip(head, widths))]
    for t in table:
        out.append("  " + "  ".join(c.ljust(w) for c, w in zip(t, widths)) + ("  " + t[-1] if t[-1] else ""))
    return out


def show_lines(rec: Any, identity: dict[str, Any], arms: dict[str, list[dict[str, Any]]]) -> list[str]:
    """What ``records show`` prints for a record: its verdict, reach, identity and per-part tables, each
    line :func:`printable` (a record is data, never terminal control)."""
    return [printable(line) for line in _show_lines(rec, identity, arms)]


def _show_lines(rec: Any, identity: dict[str, Any], arms: dict[str, list[dict[str, Any]]]) -> list[str]:
    lines = [f"{rec.title}  [{rec.kind}]  {rec.path}"]
    if rec.status == "complete":
        lines.append(f"verdict: {rec.verdict} (exit {rec.exit_code})")
    else:
        lines.append(f"verdict: none: INCOMPLETE record ({rec.status})"
                     + (f", stopped by {rec.error}" if rec.error else "")
                     + "; the parts below finished, nothing else is claimed")
    if rec.argv:
        lines.append("command: " + " ".join(rec.argv))
    lines.append(f"started {rec.started or '-'}, finished {rec.finished or '-'}"
                 + (", seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in rec.timings.items())
                    if rec.timings else ""))
    lines.append(f"host {identity.get('host')}, device {identity.get('device')}, mlx {identity.get('mlx')},"
                 f" mlx-lm {identity.get('mlx_lm')}, specparity {identity.get('specparity')}")
    from specparity.records.served import ARMS, KIND, ServedRecord

    if rec.kind == KIND and arms.get(ARMS):
        return lines + ServedRecord.of(rec.path, rec, identity, arms).table_lines()
    for name, rows in arms.items():
        counts: dict[str, int] = {}
        for r in rows:
            if "verdict" in r:
                counts[str(r["verdict"])] = counts.get(str(r["verdict"]), 0) + 1
        tally = ", ".join(f"{n} {v}" for v, n in counts.items())
        lines.append("")
        lines.append(f"{name}: {len(rows)} finished" + (f" ({tally})" if tally else ""))
        lines.extend(arm_table(rows))
    return lines


def list_rows(directory: str) -> list[dict[str, Any]]:
    """One row per record in ``directory`` (``records list``): name, kind, status, verdict, exit code, started,
    title; a record that cannot be read is a row saying so."""
    from specparity.records.record import list_records, read_record

    d = expand_user(directory)
    if not d.is_dir():
        raise UsageError(f"{directory}: not a directory")
    rows: list[dict[str, Any]] = []
    for md in list_records(d):
        try:
            rec, _, _ = read_record(md)
        except FileNotFoundError:
            continue  # its data directory holds neither report.json nor identity.json: no record
        except (OSError, UsageError) as err:
            rows.append({"name": md.stem, "status": f"unreadable ({err})"})
            continue
        rows.append({"name": rec.name, "kind": rec.kind, "status": rec.status, "verdict": rec.verdict,
                     "exit_code": rec.exit_code, "started": rec.started, "title": rec.title})
    return rows


def data_dir(path: str) -> str:
    """The data directory of the record at ``path`` (a directory's newest record)."""
    rec, _, _ = open_record(path)
    return str(rec.data_dir)
