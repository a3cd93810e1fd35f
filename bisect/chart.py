"""Per-layer chart of differing bytes: compact bars for the terminal, SVG for records.

Bar length is the fraction of the row's output bytes that differ (0 to 1);
a row whose cache alone differs gets a marker, so no divergence is drawn as
nothing. The SVG is written by hand (no plotting dependency).
"""

from __future__ import annotations

from xml.sax.saxutils import escape

from specparity.bisect.report import BisectReport, LayerReport

_EIGHTHS = " ▏▎▍▌▋▊▉█"


def fraction(row: LayerReport) -> float:
    """Differing / total bytes of the row's output (0.0 when equal or not captured)."""
    if row.output is None or row.output.diff is None:
        return 1.0 if row.output is not None else 0.0
    d = row.output.diff
    return d.differing_bytes / d.total_bytes if d.total_bytes else 0.0


def bar(frac: float, width: int = 20) -> str:
    """``frac`` of ``width`` cells, in eighths; any nonzero fraction shows at least ``▏``."""
    if frac <= 0:
        return ""
    eighths = max(1, round(frac * width * 8))
    full, rest = divmod(min(eighths, width * 8), 8)
    return "█" * full + (_EIGHTHS[rest] if rest else "")


def terminal_bars(report: BisectReport, width: int = 20) -> list[str]:
    """One line per row: label, bar, percentage; cache-only divergence marked ``(cache)``."""
    label_w = max(len(r.label) for r in report.rows) if report.rows else 5
    lines = []
    for r in report.rows:
        f = fraction(r)
        tail = f"{100 * f:5.1f}%"
        if r.cache_differs:
            tail += " (cache)"
        lines.append(f"{r.label:>{label_w}} |{bar(f, width):<{width}}| {tail}")
    return lines


def svg(report: BisectReport) -> str:
    """A horizontal bar chart of differing output bytes per row, as an SVG document."""
    rows = report.rows
    bar_w, row_h, left, top = 360, 18, 170, 40
    height = top + row_h * len(rows) + 30
    width = left + bar_w + 90
    title = (f"differing output bytes per layer: {report.a} vs {report.b},"
             f" width {report.width}, depth {report.depth}")
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}"'
        f' viewBox="0 0 {width} {height}" font-family="monospace" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="8" y="18" font-size="12">{escape(title)}</text>',
        f'<line x1="{left}" y1="{top - 6}" x2="{left}" y2="{top + row_h * len(rows)}"'
        ' stroke="#444"/>',
    ]
    for i, r in enumerate(rows):
        y = top + i * row_h
        f = fraction(r)
        first = r.label == report.first_divergent
        color = "#c0392b" if first else ("#e67e22" if r.divergent else "#2e86c1")
        label = r.label if r.index is None else f"layer {r.label}"
        out.append(f'<text x="{left - 6}" y="{y + 12}" text-anchor="end">{escape(label)}</text>')
        w = max(2.0, f * bar_w) if r.divergent else 0.0
        if w:
            out.append(f'<rect x="{left}" y="{y + 3}" width="{w:.1f}" height="{row_h - 6}"'
                       f' fill="{color}"><title>{escape(r.kind)}</title></rect>')
        note = f"{100 * f:.1f}%" + (" cache" if r.cache_differs else "")
        out.append(f'<text x="{left + bar_w + 6}" y="{y + 12}">{escape(note)}</text>')
    legend_y = top + row_h * len(rows) + 20
    out.append(f'<text x="8" y="{legend_y}">red: first divergent row; orange: later'
               ' divergent rows; bar = fraction of output bytes that differ</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
