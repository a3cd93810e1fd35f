"""A served pairing's first-divergence index by width, as a hand-written SVG.

One column per arm that drafts (widths, self-draft, controls), ordered by
width; one mark per request: a red dot at the first differing token (a hollow
one at the first differing character where the server returned no token ids),
a green bar at the top when the request matched the baseline up to
``max_tokens``, a grey cross on the bottom line for anything else (declined,
not engaged, error, inconclusive). Reads plain dicts (an arm's
``to_dict(with_requests=True)``, or a record's JSONL lines), so ``records``
commands draw it without importing the harness or mlx.
"""

from __future__ import annotations

from html import escape
from typing import Any

from specparity.harness.plan import DRAFTING_KINDS
from specparity.verdicts import Verdict


def first_index(request: dict[str, Any]) -> tuple[int | None, bool]:
    """(first differing token index, or char offset when token ids are missing; whether it is a token)."""
    d = request.get("divergence") or {}
    if d.get("token_index") is not None:
        return int(d["token_index"]), True
    if d.get("char_offset") is not None:
        return int(d["char_offset"]), False
    return None, False


def divergence_svg(pairing: str, arms: list[dict[str, Any]], max_tokens: int | None) -> str:
    """The SVG document for one pairing; ``arms``: dicts with name, kind, width and ``requests`` (dicts)."""
    cols = sorted((a for a in arms if a.get("kind") in DRAFTING_KINDS and a.get("width") is not None),
                  key=lambda a: (a["width"], a["name"]))
    indices = [first_index(r)[0] for a in cols for r in a.get("requests") or []]
    top_value = max([max_tokens or 0, *[i for i in indices if i is not None], 1])
    left, top, plot_h, col_w = 60, 44, 220, 70
    title = f"pairing {pairing}: first divergence (token index) by width, max_tokens {max_tokens}"
    # wide enough for the title and the legend lines below (about 7 px a monospace character)
    width = max(left + col_w * max(len(cols), 1) + 30, 7 * len(title) + 16, 7 * 106)
    height = top + plot_h + 80

    def y(v: float) -> float:
        return top + plot_h * (v / top_value)  # token 0 at the top: earlier divergences read higher

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}"'
        f' viewBox="0 0 {width} {height}" font-family="monospace" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="8" y="18" font-size="12">{escape(title)}</text>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="#444"/>',
    ]
    for tick in sorted({0, top_value // 2, top_value}):
        out.append(f'<text x="{left - 6}" y="{y(tick) + 4:.1f}" text-anchor="end">{tick}</text>')
        out.append(f'<line x1="{left}" y1="{y(tick):.1f}" x2="{width - 20}" y2="{y(tick):.1f}"'
                   ' stroke="#ddd"/>')
    if not cols:
        out.append(f'<text x="{left + 10}" y="{top + plot_h / 2}">no drafting arm in this record</text>')
    for i, a in enumerate(cols):
        cx = left + col_w * i + col_w / 2
        out.append(f'<text x="{cx}" y="{top + plot_h + 18}" text-anchor="middle">'
                   f'{escape(str(a["name"]))}</text>')
        out.append(f'<text x="{cx}" y="{top + plot_h + 32}" text-anchor="middle">width {a["width"]}</text>')
        reqs = a.get("requests") or []
        for j, r in enumerate(reqs):
            dx = (j - (len(reqs) - 1) / 2) * 6
            label = escape(f"{a['name']} {r.get('id')}: {r.get('verdict')}")
            idx, is_token = first_index(r)
            if r.get("verdict") == Verdict.DIVERGED and idx is not None:
                fill = "#c0392b" if is_token else "none"
                out.append(f'<circle cx="{cx + dx:.1f}" cy="{y(idx):.1f}" r="4" fill="{fill}" stroke="#c0392b">'
                           f'<title>{label} at {"token" if is_token else "char"} {idx}</title></circle>')
            elif r.get("verdict") == Verdict.MATCH:
                out.append(f'<rect x="{cx + dx - 2:.1f}" y="{top - 8}" width="4" height="6" fill="#27ae60">'
                           f'<title>{label}</title></rect>')
            else:
                out.append(f'<text x="{cx + dx:.1f}" y="{top + plot_h + 4}" text-anchor="middle"'
                           f' fill="#777">x<title>{label}</title></text>')
    out.append(f'<text x="8" y="{height - 22}">red dot: first differing token (hollow: char offset,'
               ' no token ids); green bar: matched up to max_tokens;</text>')
    out.append(f'<text x="8" y="{height - 8}">grey x: declined, not engaged, error or inconclusive'
               ' (no index)</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
