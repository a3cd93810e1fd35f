"""A bisect report as a terminal table and as record markdown."""

from __future__ import annotations

from specparity.bisect.report import BisectReport, LayerReport


def _bytes(row: LayerReport) -> str:
    if row.output is None:
        return "-"
    if row.output.diff is None:
        return "shape differs"
    d = row.output.diff
    return f"{d.differing_bytes}/{d.total_bytes}"


def _cache_bytes(row: LayerReport) -> str:
    if not row.cache:
        return "-"
    diffs = [c.diff for c in row.cache if c.diff is not None]
    n = sum(d.differing_bytes for d in diffs)
    t = sum(d.total_bytes for d in diffs)
    s = f"{n}/{t}"
    if row.offsets[0] != row.offsets[1]:
        s += f" offsets {row.offsets[0]}!={row.offsets[1]}"
    if any(c.diff is None for c in row.cache):
        s += " (shape differs)"
    return s


def _max_abs(row: LayerReport) -> str:
    if row.output is None or row.output.diff is None or row.output.diff.equal:
        return "0" if row.output is not None and row.output.diff is not None else "-"
    return f"{row.output.diff.max_abs_diff:.3g}"


def _first_row(row: LayerReport) -> str:
    if row.output is None or row.output.diff is None or row.output.diff.first_row is None:
        return "-"
    return str(row.output.diff.first_row)


def table_rows(report: BisectReport) -> list[list[str]]:
    header = ["layer", "type", "output bytes differing/total", "max abs diff",
              "first row", "cache bytes differing/total", ""]
    out = [header]
    for r in report.rows:
        mark = " <- first" if r.label == report.first_divergent else ""
        out.append([r.label, r.kind, _bytes(r), _max_abs(r), _first_row(r), _cache_bytes(r),
                    mark.strip()])
    return out


def _format(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def render_text(report: BisectReport) -> str:
    meta = report.meta
    head = (f"bisect {report.a} vs {report.b}: model {meta.get('model_type', '?')}"
            f" ({meta.get('fingerprint', '')[:12]}), {meta.get('dtype', '?')},"
            f" width {report.width}, depth {report.depth}")
    lines = [head, ""] + _format(table_rows(report)) + [""] + report.lines()
    return "\n".join(lines) + "\n"


def render_markdown(report: BisectReport, chart_path: str | None,
                    extra: list[str] | None = None) -> str:
    meta = report.meta
    rows = table_rows(report)
    md = [f"# bisect: {report.verdict}", ""]
    md += [f"- {k}: `{v}`" for k, v in meta.items() if not isinstance(v, (dict, list))]
    md += [f"- width: {report.width} rows", f"- depth: {report.depth} tokens",
           f"- arms: {report.a} vs {report.b}", ""]
    md += [f"**{s}**" if i == 0 else s for i, s in enumerate(report.lines())]
    md.append("")
    if chart_path:
        md += [f"![differing output bytes per layer]({chart_path})", ""]
    md.append("| " + " | ".join(rows[0][:-1]) + " |")
    md.append("|" + "---|" * (len(rows[0]) - 1))
    for r in rows[1:]:
        md.append("| " + " | ".join(c.replace("|", "/") for c in r[:-1]) + " |")
    md.append("")
    for line in extra or []:
        md.append(line)
    return "\n".join(md) + "\n"
