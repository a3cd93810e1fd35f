"""Text and markdown renderings of probe, walk and prefill results."""

from __future__ import annotations

from typing import Any

from specparity.verdicts import Verdict


def cell_detail(c: Any) -> str:
    if c.verdict == Verdict.EQUAL:
        return f"{c.prompts_tested} prompt(s), all logit bytes equal"
    if c.verdict == Verdict.NOT_RUN:
        return c.reason or ""
    return (f"prompt {c.prompt_index}, first at row {c.first_row} (position {c.absolute_position}):"
            f" {c.diff.summary('logit bytes')}")


def cell_line(c: Any) -> str:
    """One row of the (width, depth) table."""
    return f"{c.width:>5} {c.depth:>5}  {c.verdict:<9} {cell_detail(c)}"


def walk_line(w: Any) -> str:
    if w.verdict == Verdict.EQUAL:
        return (f"long walk width {w.width}: equal over {w.positions} positions"
                f" ({w.blocks} consecutive blocks)")
    if w.verdict == Verdict.NOT_RUN:
        return f"long walk width {w.width}: not_run ({w.reason})"
    return (f"long walk width {w.width}: divergent at step {w.first_step} past the prompt"
            f" (position {w.first_position}, block {w.block_index} row {w.row}):"
            f" {w.diff.summary('logit bytes')}")


def prefill_line(r: Any) -> str:
    parts = []
    for a in r.arms:
        if a.verdict == Verdict.EQUAL:
            parts.append(f"{a.name}({a.chunk}) equal")
        elif a.verdict == Verdict.NOT_RUN:
            parts.append(f"{a.name}({a.chunk}) not_run: {a.reason}")
        else:
            what = a.logits.summary("last-row logit bytes") if a.logits and not a.logits.equal \
                else "last-row logits equal"
            first = a.states[0] if a.states else None
            state = (f"; cache differs in layers {a.layers_differing}"
                     f" (first: layer {first.layer} {first.kind} {first.name}"
                     f"{': ' + first.diff.summary() if first and first.diff else ' ' + first.note if first else ''})"
                     if first else "")
            parts.append(f"{a.name}({a.chunk}) divergent: {what}{state}")
    return f"prefill parity, prompt {r.prompt_index} ({r.prompt_len} tokens): " + "; ".join(parts)


def aimed_line(a: Any) -> str:
    b = a.boundary
    head = (f"aimed at {b['kind']} {b['position']} ({b['source']}): width {a.width}, prompt {a.prompt_len}"
            f" tokens, depth {a.depth}, block at positions {a.start}-{a.start + a.width - 1}: ")
    if a.verdict == Verdict.NOT_RUN:
        body = f"{a.verdict} ({a.reason})"
    elif a.verdict == Verdict.EQUAL:
        body = str(a.verdict)
    else:
        body = (f"{a.verdict} at row {a.first_row} (position {a.absolute_position}):"
                f" {a.diff.summary('logit bytes')}")
    if a.walk is not None:
        w = a.walk
        body += (f"; walk of {w.blocks} blocks {w.verdict}" if w.verdict == Verdict.EQUAL
                 else f"; walk {w.verdict} at position {w.first_position}" if w.verdict == Verdict.DIVERGENT
                 else f"; walk {w.verdict} ({w.reason})")
    return head + body


def reach_lines(report: Any) -> list[str]:
    """The bracket, the boundaries aimed at and the options this architecture ignores."""
    out = []
    if report.bracket is not None:
        out.append(report.bracket.line())
    out += [f"note: {n}" for n in report.notes]
    out += [aimed_line(a) for a in report.aimed]
    return out


def probe_text(report: Any, header: str, prefill: list | None = None) -> str:
    lines = [header, *report.lines()]
    for r in prefill or []:
        lines += r.lines()
    return "\n".join(lines)


def probe_markdown(report: Any, title: str, meta: dict[str, Any], prefill: list | None = None) -> str:
    out = [f"# {title}", ""]
    out += [f"- **{k}**: {v}" for k, v in meta.items()]
    out += ["", "## Block vs chain", "", "| width | depth | verdict | detail |", "|---|---|---|---|"]
    for c in report.cells:
        out.append(f"| {c.width} | {c.depth} | {c.verdict} | {cell_detail(c)} |")
    if report.walks:
        out += ["", "## Long walk", ""] + [f"- {walk_line(w)}" for w in report.walks]
    reach = reach_lines(report)
    if reach:
        out += ["", "## Reproducibility and cache boundaries", ""] + [f"- {x}" for x in reach]
    if prefill:
        out += ["", "## Prefill parity", ""] + [f"- {prefill_line(r)}" for r in prefill]
    engine = [p.line() for p in getattr(report, "prefill", [])] + list(getattr(report, "rollback_lines", list)())
    if engine:
        out += ["", "## The engine's own prefill and rollbacks", ""] + [f"- {x}" for x in engine]
    out += ["", f"Overall verdict: **{report.verdict}**", ""]
    return "\n".join(out)
