"""A served record, or a series of nightly ones, as one self-contained HTML page.

The page needs nothing but itself: CSS, SVG charts and a few lines of script are inline, and a
Content-Security-Policy meta tag forbids every network load and every script but the page's own
(by hash), so it opens from a CI artifact on a laptop offline and a record's text cannot run code.

What it shows, for the newest record of the series:
  - the grid: one row per pairing (its engine, environment, target and drafter), one column per arm
    (baselines and widths), each cell coloured by the arm's verdict;
  - charts: acceptance by arm, the top-2 margins at each diverged request's first difference, and
    the first-divergence chart ``served`` draws (records.chart);
  - per arm, its requests; per request a drill-down: the two texts aligned at the first difference,
    the tokens and margins around it, the tie label and the cause where named, the evidence that the
    drafter ran, and the command that reproduces it (with a copy button) or why there is none; where
    the record holds the finding's diagnosis (``served --diagnose``), its phase, location and summary,
    each step's status, verdict, evidence and the command that repeats it, and what it leaves open.
Across the series (several nights): per arm, its verdict each night, and the night each cell changed.

Everything taken from a record goes through :func:`esc` (text, ids, names, commands): completion
text is user data. Only the record files' stable fields are read, and every optional one may be
missing (older records, or fields a later ``served`` adds): the page shows what is there.
Nothing here imports the harness runner or mlx.

Bounded (docs/records.md): of the records named, the newest HISTORY_NIGHTS are read, the older of
them only as far as the history needs; of the newest, each request line is held without what the page
never shows (token ids, logprobs, top-k logprobs away from the first difference; of a diagnosis, its
steps' data), each diagnosis's text cut at TEXT_CHARS characters and DIAGNOSIS_ITEMS lines; a text is
shown up to TEXT_CHARS characters; the page is written as it is made, never held whole.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import html
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specparity.errors import UsageError
from specparity.records.record import Record, list_records, read_record, read_report
from specparity.records.served import ARMS, DIAGNOSES, KIND, ServedRecord, check_line, location_text
from specparity.records.text import printable
from specparity.verdicts import Verdict

# the verdict words a cell may carry, in the order the legend lists them
VERDICTS = tuple(str(v) for v in (Verdict.MATCH, Verdict.DIVERGED, Verdict.ERROR, Verdict.DECLINED, Verdict.NOT_ENGAGED,
                                   Verdict.LOSSY, Verdict.INCONCLUSIVE, Verdict.NOT_RUN, Verdict.PASS))
# tokens shown on each side of the first difference in the drill-down's token table
CONTEXT_TOKENS = 4
# characters of shared text shown before the first difference in the aligned texts
CONTEXT_CHARS = 60
# the most characters of one text the page shows (a served text around its first difference, a snippet):
# a record's texts can be megabytes each, and a page holding them whole took 15 times the record's size
TEXT_CHARS = 2000
# the records the history across nights shows (the newest; a month of nightly runs): rows x nights grew
# without bound (1,000 nights with a pairing renamed each night made a 151 MB page)
HISTORY_NIGHTS = 30
# the most steps, evidence lines and open items of one diagnosis the page holds (the tree has eight steps
# of a few lines each: a record written otherwise is cut, never held whole)
DIAGNOSIS_ITEMS = 40


def esc(value: Any) -> str:
    """Any value as HTML text (quotes too: the same function serves attributes)."""
    return html.escape("" if value is None else str(value), quote=True)


def visible(s: str) -> str:
    """``s`` with newlines, tabs and other control characters made visible (one glyph each,
    records.text.printable, as ``records show`` prints them), escaped, so that two texts set one above
    the other stay aligned character for character."""
    return esc(printable(s))


def _num(x: Any, fmt: str = ".4g") -> str:
    return format(x, fmt) if isinstance(x, (int, float)) and not isinstance(x, bool) else "-"


# -- reading ---------------------------------------------------------------------------------------
@dataclass
class Series:
    """The served records a page shows, oldest first: the newest HISTORY_NIGHTS of the ``named`` ones."""

    records: list[ServedRecord]
    named: int


def load_series(paths: Iterable[str | os.PathLike[str]]) -> Series:
    """The served records named by ``paths``, oldest first.

    Each path is a record (its .md, data directory or report.json) or a records directory, which
    contributes every served record in it (other kinds are skipped there; named alone, refused).
    Incomplete records are kept: the page marks them and claims no verdict for them. Each record's
    report.json is read to order them; the newest HISTORY_NIGHTS are then read whole (each line
    checked), holding of the older ones what the history shows and of the newest what the page shows.
    """
    found: dict[str, Record] = {}
    for path in paths:
        p = Path(os.path.expanduser(str(path)))
        if not p.exists():
            raise UsageError(f"{path}: no such file or directory")
        single = not p.is_dir() or (p / "report.json").exists()
        mds = [p] if single else list_records(p)
        if not single and not mds:
            raise UsageError(f"{path}: not a record (no data/<name>/report.json) and holds none")
        for md in mds:
            try:
                rec = read_report(md)
            except FileNotFoundError:
                if single:
                    raise UsageError(f"{path}: not a record (no report.json)") from None
                continue
            if rec.kind != KIND:
                if single:
                    raise UsageError(f"{path}: a {printable(rec.kind)} record: the HTML report reads served"
                                     " records (specparity served --record-dir)")
                continue
            found[str(Path(rec.path).resolve())] = rec
    if not found:
        raise UsageError("no served record in " + ", ".join(str(p) for p in paths))
    chosen = sorted(found.values(), key=lambda r: (r.started or "", r.name))[-HISTORY_NIGHTS:]
    series = []
    for n, head in enumerate(chosen, 1):
        keep = _shown if n == len(chosen) else _history_only
        rec, ident, rows = read_record(head.path, keep=functools.partial(keep, head.data_dir))
        series.append(ServedRecord.of(rec.path, rec, ident, rows))
    return Series(series, len(found))


# what of a completion the page shows: its text (where the line has no text of its own) and top-k logprobs
_COMPLETION_SHOWN = ("text", "top")


def _shown(data: Path, stem: str, entry: int, line: dict[str, Any]) -> dict[str, Any]:
    """What the page holds of the newest record's line (read_record's ``keep``): the line, checked whole
    first, less the completion's token ids and logprobs, its text where the line has its own, and its
    top-k logprobs away from the tokens the drill-down shows."""
    check_line(data, stem, entry, line)
    if stem == DIAGNOSES:
        return _diagnosis_shown(line)
    comp = line.get("completion")
    if stem == ARMS or not isinstance(comp, dict):
        return line
    kept = {k: v for k, v in comp.items() if k in _COMPLETION_SHOWN}
    if isinstance(line.get("text"), str):
        kept.pop("text", None)
    d = _first_diff(line)
    k, top = d.get("token_index"), kept.get("top")
    if isinstance(top, list):
        if isinstance(k, int):
            start = max(0, k - CONTEXT_TOKENS)
            end = k + max(*map(len, _after(d)), 1)
            kept["top"] = [_NO_TOP] * min(start, len(top)) + top[start:end]  # the same list, shared: a pointer each
        else:
            del kept["top"]
    return {**line, "completion": kept}


_NO_TOP: list[Any] = []


def _cut(value: Any) -> str:
    text = str(value)
    return text if len(text) <= TEXT_CHARS else text[:TEXT_CHARS] + "\u2026"


def _diagnosis_shown(line: dict[str, Any]) -> dict[str, Any]:
    """What the page holds of a diagnoses.jsonl line: the finding's id, where it was diagnosed, and of the
    diagnosis its phase, location, summary, open items and steps without their data, every text cut."""
    d = line["diagnosis"]
    n = DIAGNOSIS_ITEMS
    steps = [{"number": s.get("number"), "name": _cut(s.get("name") or ""), "status": _cut(s.get("status")),
              "verdict": s.get("verdict"), "evidence": [_cut(e) for e in (s.get("evidence") or [])[:n]],
              "command": _cut(s["command"]) if s.get("command") else None} for s in (d.get("steps") or [])[:n]]
    loc = d.get("location") or {}
    return {"finding": line["finding"], "diagnosed_in": line.get("diagnosed_in"),
            "diagnosis": {"phase": _cut(d.get("phase")), "summary": _cut(d.get("summary") or ""),
                          "location": {k: v for k, v in list(loc.items())[:n] if isinstance(v, (int, float, str))
                                       and len(str(v)) <= TEXT_CHARS},
                          "open": [_cut(o) for o in (d.get("open") or [])[:n]], "steps": steps}}


def _history_only(data: Path, stem: str, entry: int, line: dict[str, Any]) -> dict[str, Any]:
    """What the page holds of an older record's line: an arm's line, a request's id, kind and verdict, a
    diagnosis's finding and phase (the history shows verdicts, not diagnoses; a line is checked whole again)."""
    check_line(data, stem, entry, line)
    if stem == DIAGNOSES:
        return {"finding": line["finding"], "diagnosis": {"phase": line["diagnosis"]["phase"]}}
    return line if stem == ARMS else {k: line[k] for k in ("id", "kind", "verdict")}


# -- the page --------------------------------------------------------------------------------------
CSS = """
:root { --match:#2e9e5b; --diverged:#d0392b; --error:#8e1b10; --declined:#7d5ba6; --not_engaged:#e1a325;
  --lossy_by_design:#8a6d3b; --inconclusive:#d4b62c; --not_run:#9aa0a6; --pass:#2e9e5b; --ink:#1d2327;
  --muted:#5f6b73; --line:#dde3e8; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--ink);
  background: #f5f7f9; }
header { background: #1d2327; color: #fff; padding: 18px 28px; }
header h1 { margin: 0 0 4px; font-size: 20px; }
header .meta { color: #b9c3ca; font-size: 12.5px; }
header .meta code { color: #e4e9ed; }
main { padding: 8px 28px 40px; max-width: 1280px; }
section { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 14px 18px; margin: 16px 0; }
h2 { font-size: 16px; margin: 0 0 10px; }
h3 { font-size: 14px; margin: 14px 0 6px; }
table { border-collapse: collapse; }
th, td { padding: 5px 9px; border: 1px solid var(--line); text-align: left; vertical-align: top; }
th { background: #f0f3f5; font-weight: 600; }
code, pre, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12.5px; }
.badge { display: inline-block; padding: 1px 9px; border-radius: 10px; color: #fff; font-weight: 600;
  font-size: 12px; background: var(--not_run); }
.v-match { background: var(--match); } .v-pass { background: var(--pass); } .v-diverged { background: var(--diverged); }
.v-error { background: var(--error); } .v-declined { background: var(--declined); }
.v-not_engaged { background: var(--not_engaged); } .v-inconclusive { background: var(--inconclusive); }
.v-lossy_by_design { background: var(--lossy_by_design); }
.v-not_run, .v-none { background: var(--not_run); }
table.grid td.cellwrap { padding: 3px; }
a.cell { display: block; min-width: 118px; padding: 7px 9px; border-radius: 6px; color: #fff;
  text-decoration: none; }
a.cell b { display: block; font-size: 13.5px; } a.cell small { opacity: .92; }
a.cell:hover, a.cell:focus { outline: 3px solid #1d2327; }
.legend span { margin-right: 10px; font-size: 12px; }
.legend i { display: inline-block; width: 11px; height: 11px; border-radius: 3px; vertical-align: -1px;
  margin-right: 4px; }
.muted { color: var(--muted); }
.warn { background: #fff4d6; border: 1px solid #e9c46a; padding: 8px 12px; border-radius: 6px; }
details.arm { border: 1px solid var(--line); border-radius: 6px; margin: 8px 0; }
details.arm > summary { padding: 8px 12px; cursor: pointer; background: #f8fafb; border-radius: 6px; }
details.arm[open] > summary { border-bottom: 1px solid var(--line); border-radius: 6px 6px 0 0; }
details.arm > .body { padding: 8px 12px; }
details.req { border-left: 4px solid var(--line); margin: 6px 0; padding-left: 10px; }
details.req.v-diverged-b { border-left-color: var(--diverged); }
details.req.v-match-b { border-left-color: var(--match); }
details.req > summary { cursor: pointer; padding: 4px 0; }
details.findings > summary { cursor: pointer; margin: 6px 0; }
.drill { padding: 6px 0 10px; }
.align { background: #1d2327; color: #e4e9ed; border-radius: 6px; padding: 10px 12px; overflow-x: auto;
  white-space: pre; font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 13px; }
.align .lab { display: inline-block; width: 16ch; color: #9fb0bc; }
.align .same { color: #c9d3da; }
.align .ref { background: #1f6f43; color: #fff; }
.align .oth { background: #9c2b20; color: #fff; }
.align .caret { color: #f4d35e; }
table.tokens td.first { background: #fde2df; font-weight: 600; }
table.tokens td.shared { color: var(--muted); }
.repro { position: relative; background: #f0f3f5; border-radius: 6px; padding: 8px 90px 8px 10px;
  white-space: pre-wrap; word-break: break-all; }
button.copy { position: absolute; top: 6px; right: 6px; border: 1px solid #9fb0bc; background: #fff;
  border-radius: 5px; padding: 3px 9px; cursor: pointer; font-size: 12px; }
.diag { border: 1px solid var(--line); border-radius: 6px; padding: 6px 10px; margin: 8px 0; background: #fbfcfd; }
table.steps td { font-size: 12.5px; } table.steps .repro { margin-top: 4px; }
.kv { display: grid; grid-template-columns: max-content 1fr; gap: 3px 14px; margin: 6px 0; }
.kv dt { color: var(--muted); } .kv dd { margin: 0; }
.charts { display: flex; flex-wrap: wrap; gap: 18px; align-items: flex-start; }
.charts figure { margin: 0; } .charts figcaption { font-size: 12px; color: var(--muted); }
td.changed { outline: 3px solid #1d2327; outline-offset: -3px; }
table.history td.v { color: #fff; text-align: center; font-weight: 600; font-size: 12px; }
"""

SCRIPT = """
(function () {
  function openTo(id) {
    var el = document.getElementById(id);
    if (!el) { return; }
    for (var p = el; p; p = p.parentElement) { if (p.tagName === 'DETAILS') { p.open = true; } }
    el.scrollIntoView({block: 'start'});
  }
  document.querySelectorAll('a[data-open]').forEach(function (a) {
    a.addEventListener('click', function (e) { e.preventDefault(); openTo(a.getAttribute('data-open'));
      history.replaceState(null, '', '#' + a.getAttribute('data-open')); });
  });
  document.querySelectorAll('button.copy').forEach(function (b) {
    b.addEventListener('click', function () {
      var text = document.getElementById(b.getAttribute('data-for')).textContent;
      function done() { b.textContent = 'copied'; setTimeout(function () { b.textContent = 'copy'; }, 1500); }
      function fallback() {
        var t = document.createElement('textarea'); t.value = text; document.body.appendChild(t); t.select();
        try { document.execCommand('copy'); done(); } catch (err) { b.textContent = 'select it'; }
        document.body.removeChild(t);
      }
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(text).then(done, fallback);
      } else { fallback(); }
    });
  });
  function fromHash() { if (location.hash.length > 1) { openTo(decodeURIComponent(location.hash.slice(1))); } }
  window.addEventListener('hashchange', fromHash);
  fromHash();
})();
"""


def _csp() -> str:
    digest = base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()
    return (f"default-src 'none'; script-src 'sha256-{digest}'; style-src 'unsafe-inline';"
            " img-src data:; base-uri 'none'; form-action 'none'")


def badge(verdict: Any) -> str:
    v = str(verdict) if verdict else "none"
    return f'<span class="badge {_vclass(v)}">{esc(v)}</span>'


def _vclass(verdict: Any) -> str:
    v = str(verdict) if verdict else "none"
    return f"v-{v}" if v in VERDICTS else "v-none"


@dataclass
class HtmlSummary:
    """What :func:`write_html` wrote: path, records in the series (oldest first: the newest HISTORY_NIGHTS
    of the ``named``), pairings and arms of the newest, and its verdict (None when incomplete)."""

    path: Path
    records: list[str]
    pairings: int
    arms: int
    verdict: str | None
    named: int = 0

    def line(self) -> str:
        of = f" (the newest of {self.named} named)" if self.named > len(self.records) else ""
        return (f"wrote {self.path}: {len(self.records)} record{'s' if len(self.records) != 1 else ''}{of}"
                f" (newest {self.records[-1]}), {self.pairings} pairing{'s' if self.pairings != 1 else ''},"
                f" {self.arms} arms, newest verdict {self.verdict or 'none (incomplete)'}")

    def to_dict(self) -> dict[str, Any]:
        # the newest record's verdict under its own key: --json's top "verdict" is the process's
        return {"html": str(self.path), "records": self.records, "pairings": self.pairings, "arms": self.arms,
                "newest_verdict": self.verdict}


class _Ids:
    """Element ids from counters, never from record text (an id must not carry user data)."""

    def __init__(self) -> None:
        self.arms: dict[tuple[str, str], str] = {}

    def arm(self, pairing: str, arm: str) -> str:
        return self.arms.setdefault((pairing, arm), f"arm-{len(self.arms) + 1}")


def render(series: Series) -> str:
    """The page for ``series`` as one string (:func:`write_html` writes its parts as they are made)."""
    return "".join(page(series))


def page(series: Series) -> Iterator[str]:
    """The page for ``series`` in parts (the newest record gets the grid and drill-downs; one part per
    request, so no part is large)."""
    latest = series.records[-1]
    ids = _Ids()
    rec = latest.record
    title = f"specparity: {rec.title}"
    yield ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
           f'<meta http-equiv="Content-Security-Policy" content="{_csp()}">\n'
           '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
           f"<title>{esc(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n")
    yield _header(latest, series.named) + "\n<main>\n"
    if not rec.is_complete:
        yield (f'<p class="warn">This record is <b>INCOMPLETE ({esc(rec.status)})</b>'
               + (f", stopped by {esc(rec.error)}" if rec.error else "")
               + ": only the arms below finished; no verdict is claimed.</p>\n")
    yield _grid(latest, ids) + "\n"
    yield _charts(latest) + "\n"
    if len(series.records) > 1:
        yield _history(series, ids) + "\n"
    yield from _arms(latest, ids)
    yield _identity(latest) + "\n"
    yield f"</main>\n<script>{SCRIPT}</script>\n</body>\n</html>\n"


def _header(sr: ServedRecord, nights: int) -> str:
    rec, ident = sr.record, sr.identity
    verdict = badge(rec.verdict if rec.is_complete else None)
    status = "" if rec.is_complete else f" <span class=\"badge v-none\">{esc(rec.status)}</span>"
    series = f", newest of {nights} records" if nights > 1 else ""
    return (f'<header><h1>{esc(rec.title)} {verdict}{status}</h1>'
            f'<div class="meta">record <code>{esc(rec.name)}</code>{esc(series)}; started {esc(rec.started or "-")},'
            f' finished {esc(rec.finished or "-")}; host {esc(ident.get("host"))}, device {esc(ident.get("device"))},'
            f' mlx {esc(ident.get("mlx"))}, mlx-lm {esc(ident.get("mlx_lm"))},'
            f' specparity {esc(ident.get("specparity"))}</div>'
            f'<div class="meta">command: <code>{esc(" ".join(str(a) for a in rec.argv))}</code></div></header>')


def _engine(sr: ServedRecord, pairing: str) -> tuple[str, str]:
    """(engine, environment) of a pairing: its server profile, and the pinned environment it ran in."""
    p = sr.pairing_summary(pairing) or {}
    engine = str(p.get("profile") or "")
    if not engine:
        job = (sr.summary.get("job") or sr.identity.get("job") or {})
        engine = next((str(q.get("profile")) for q in job.get("pairings") or []
                       if isinstance(q, dict) and q.get("name") == pairing and q.get("profile")), "-")
    env = (sr.identity.get("environments") or {}).get(pairing) or {}
    return engine, str(env.get("name") or "") if isinstance(env, dict) else ""


def _columns(sr: ServedRecord) -> list[str]:
    cols: list[str] = []
    for pname in sr.pairing_names():
        for a in sr.final_arms(pname) or sr.arm_lines(pname):
            if str(a.get("name")) not in cols:
                cols.append(str(a.get("name")))
    # the end baseline last, whatever order the pairings finished in
    return sorted(cols, key=lambda c: (c == "baseline-end", cols.index(c)))


def _arm_counts(sr: ServedRecord, pname: str, arm: dict[str, Any]) -> str:
    verdicts = list((arm.get("verdicts") or {}).values())
    if not verdicts:
        verdicts = [r.get("verdict") for r in sr.requests(pname, str(arm.get("name")))]
    bad = sum(1 for v in verdicts if v != Verdict.MATCH)
    return f"{len(verdicts) - bad}/{len(verdicts)} match" if verdicts else "no requests"


def _grid(sr: ServedRecord, ids: _Ids) -> str:
    cols = _columns(sr)
    out = ['<section id="grid"><h2>Engine &times; pairing &times; width</h2>',
           '<p class="muted">Each cell is one arm (a server, with or without the drafter), coloured by its verdict;'
           " click it for its requests.</p>", '<table class="grid"><tr><th>engine</th><th>pairing</th>']
    out += [f"<th>{esc(c)}</th>" for c in cols]
    out.append("<th>pairing verdict</th></tr>")
    for pname in sr.pairing_names():
        engine, env = _engine(sr, pname)
        p = sr.pairing_summary(pname) or {}
        arms = {str(a.get("name")): a for a in sr.final_arms(pname) or sr.arm_lines(pname)}
        who = f'target {p.get("target") or "-"}\ndrafter {p.get("draft") or "-"}'
        out.append(f"<tr><td>{esc(engine)}" + (f'<br><small class="muted">{esc(env)}</small>' if env else "")
                   + f'</td><td title="{esc(who)}"><b>{esc(pname)}</b></td>')
        for c in cols:
            a = arms.get(c)
            if a is None:
                out.append('<td class="muted">-</td>')
                continue
            v = a.get("verdict")
            detail = [f"width {a['width']}" if a.get("width") is not None else "no drafter"]
            if isinstance(a.get("acceptance"), (int, float)):
                detail.append(f"acceptance {a['acceptance']:.3f}")
            detail.append(_arm_counts(sr, pname, a))
            aid = ids.arm(pname, c)
            out.append(f'<td class="cellwrap"><a class="cell {_vclass(v)}" href="#{aid}" data-open="{aid}"'
                       f' data-verdict="{esc(v)}" data-arm="{esc(c)}" data-pairing="{esc(pname)}"'
                       f' title="{esc(a.get("reason") or v)}"><b>{esc(v)}</b><small>{esc(" · ".join(detail))}'
                       "</small></a></td>")
        out.append(f"<td>{badge(p.get('verdict')) if p else badge(None)}"
                   + (f'<br><small>{esc(p.get("reason"))}</small>' if p.get("reason") else "") + "</td></tr>")
    out.append("</table>")
    out.append('<p class="legend">' + "".join(f'<span><i class="{_vclass(v)}"></i>{esc(v)}</span>'
                                             for v in VERDICTS) + "</p>")
    for pname in sr.pairing_names():
        findings = (sr.pairing_summary(pname) or {}).get("findings") or []
        if findings:
            # a few are read at once; many would push the charts off the first screen
            out.append(f'<details class="findings"{" open" if len(findings) <= 3 else ""}><summary>'
                       f"<b>{esc(pname)}</b>: {len(findings)} finding{'s' if len(findings) != 1 else ''}</summary>"
                       + "".join(f'<p class="mono">{esc(f)}</p>' for f in findings) + "</details>")
    out.append("</section>")
    return "\n".join(out)


# -- charts (hand-written SVG, like records.chart) -------------------------------------------------
def _bar_chart(title: str, labels: list[str], series: list[tuple[str, str, list[float | None]]],
               unit: str, lo: float | None = None) -> str:
    """Grouped vertical bars: one group per label, one bar per series (name, colour, values)."""
    vals = [v for _, _, vs in series for v in vs if v is not None]
    top = max([*vals, 1e-9]) if lo is None else max([*vals, lo])
    # a label is one or two lines (arm, then request id), each as wide as a group may be
    longest = max([len(part) for label in labels for part in label.split("\n")] or [0])
    left, plot_h, group_w, bar_w = 52, 150, max(28 * len(series) + 22, 70, int(6.5 * longest) + 12), 24
    legend_w = sum(14 + 7 * len(name) + 16 for name, _, _ in series) + 8 * len(unit)
    # wide enough for the title and the legend, at about 7 px a character
    width = max(left + group_w * max(len(labels), 1) + 20, 7 * len(title) + 16, left + legend_w)
    height = 30 + plot_h + 72
    y0 = 30 + plot_h
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img"'
           f' font-family="system-ui, sans-serif" font-size="11"><title>{esc(title)}</title>',
           f'<text x="4" y="16" font-size="12" font-weight="600">{esc(title)}</text>',
           f'<line x1="{left}" y1="30" x2="{left}" y2="{y0}" stroke="#888"/>',
           f'<line x1="{left}" y1="{y0}" x2="{width - 10}" y2="{y0}" stroke="#888"/>']
    for t in (0.0, top / 2, top):
        yy = y0 - plot_h * t / top
        out.append(f'<text x="{left - 5}" y="{yy + 4:.1f}" text-anchor="end" fill="#555">{t:.3g}</text>')
        out.append(f'<line x1="{left}" y1="{yy:.1f}" x2="{width - 10}" y2="{yy:.1f}" stroke="#eee"/>')
    if not labels:
        out.append(f'<text x="{left + 10}" y="{y0 - plot_h / 2}" fill="#555">nothing to chart</text>')
    for i, label in enumerate(labels):
        gx = left + group_w * i + 11
        for j, (name, colour, vs) in enumerate(series):
            v = vs[i]
            x = gx + j * (bar_w + 4)
            if v is None:
                out.append(f'<text x="{x + bar_w / 2}" y="{y0 - 4}" text-anchor="middle" fill="#999">-</text>')
                continue
            h = plot_h * v / top
            out.append(f'<rect x="{x}" y="{y0 - h:.1f}" width="{bar_w}" height="{h:.1f}" fill="{colour}">'
                       f"<title>{esc(label.replace(chr(10), ' '))} {esc(name)}: {v:.4g} {esc(unit)}</title></rect>")
        cx = gx + (len(series) * (bar_w + 4)) / 2 - 2
        for n, part in enumerate(label.split("\n")):
            out.append(f'<text x="{cx}" y="{y0 + 14 + 13 * n}" text-anchor="middle">{esc(part)}</text>')
    lx = left
    for name, colour, _ in series:
        out.append(f'<rect x="{lx}" y="{height - 22}" width="10" height="10" fill="{colour}"/>'
                   f'<text x="{lx + 14}" y="{height - 13}">{esc(name)}</text>')
        lx += 14 + 7 * len(name) + 16
    out.append(f'<text x="{width - 10}" y="{height - 13}" text-anchor="end" fill="#555">{esc(unit)}</text></svg>')
    return "\n".join(out)


def _first_diff(r: dict[str, Any]) -> dict[str, Any]:
    """The difference a request's verdict rests on (classic decode's where computed), or {}."""
    for key in ("divergence", "classic", "baseline"):
        d = r.get(key)
        if isinstance(d, dict):
            return d
    return {}


def _charts(sr: ServedRecord) -> str:
    from specparity.records.chart import divergence_svg

    out = ['<section id="charts"><h2>Acceptance and margins</h2>']
    for pname in sr.pairing_names():
        arms = [a for a in sr.final_arms(pname) or sr.arm_lines(pname) if a.get("width") is not None]
        acc = _bar_chart(f"{pname}: acceptance by arm", [str(a.get("name")) for a in arms],
                         [("accepted / proposed", "#3b7dd8",
                           [a.get("acceptance") if isinstance(a.get("acceptance"), (int, float)) else None
                            for a in arms])], "fraction", lo=1.0)
        labels, ref, oth = [], [], []
        for a in arms:
            for r in sr.requests(pname, str(a.get("name"))):
                d = _first_diff(r)
                if r.get("verdict") == Verdict.DIVERGED and d:
                    labels.append(f"{a.get('name')}\n{r.get('id')}")
                    ref.append(d.get("margin_reference") if isinstance(d.get("margin_reference"), (int, float))
                               else None)
                    oth.append(d.get("margin_other") if isinstance(d.get("margin_other"), (int, float)) else None)
        margins = _bar_chart(f"{pname}: top-2 margin at the first difference", labels,
                             [("reference (classic decode)", "#2e9e5b", ref), ("served", "#d0392b", oth)], "nats")
        with_rows = [{**a, "requests": sr.requests(pname, str(a.get("name")))} for a in arms]
        first = divergence_svg(pname, with_rows, (sr.summary.get("job") or {}).get("max_tokens"))
        out.append('<div class="charts">'
                   f"<figure>{acc}<figcaption>accepted drafted tokens over proposed ones, every witnessed round"
                   "</figcaption></figure>"
                   f"<figure>{margins}<figcaption>top-1 minus top-2 logprob where each diverged request first"
                   " differs: a small margin is a near tie</figcaption></figure>"
                   f"<figure>{first}</figure></div>")
    out.append("</section>")
    return "\n".join(out)


# -- across nights ---------------------------------------------------------------------------------
def _cells(sr: ServedRecord) -> list[tuple[str, str]]:
    """(pairing, arm) of every arm of a record, in run order."""
    return [(pname, str(a.get("name"))) for pname in sr.pairing_names()
            for a in sr.final_arms(pname) or sr.arm_lines(pname)]


def _history(series: Series, ids: _Ids) -> str:
    """Per arm of the newest record, its verdict in each record of the series (the newest HISTORY_NIGHTS of
    those named): rows x nights stays within the newest's arms x HISTORY_NIGHTS."""
    nights = series.records
    cells = list(dict.fromkeys(_cells(nights[-1])))
    gone = {c for sr in nights[:-1] for c in _cells(sr)} - set(cells)
    shown = (f"the newest {len(nights)} of {series.named} records" if series.named > len(nights)
             else f"{len(nights)} records")
    out = ['<section id="history"><h2>Across nights</h2>',
           f'<p class="muted">Each arm&#39;s verdict (and acceptance) per record, {shown}, oldest first; an'
           " outlined cell changed from the record before it. The rows are the newest record&#39;s arms"
           + (f"; {len(gone)} arm{'s' if len(gone) != 1 else ''} only older records have"
              f" {'are' if len(gone) != 1 else 'is'} not shown" if gone else "") + ".</p>",
           '<table class="history"><tr><th>pairing</th><th>arm</th>']
    out += [f'<th title="{esc(sr.record.path)}">{esc(sr.record.name)}<br><small class="muted">'
            f"{esc((sr.record.started or '')[:16])}</small></th>" for sr in nights]
    out.append("<th>since</th></tr>")
    changes: list[str] = []
    for pname, arm in cells:
        out.append(f"<tr><td>{esc(pname)}</td><td>{esc(arm)}</td>")
        prev: str | None = None
        prev_reqs: dict[str, str] = {}
        since = nights[0].record.name
        for sr in nights:
            line = next((a for a in sr.final_arms(pname) or sr.arm_lines(pname) if a.get("name") == arm), None)
            if line is None:
                out.append('<td class="muted">-</td>')
                continue
            v = str(line.get("verdict"))
            changed = prev is not None and v != prev
            if changed:
                since = sr.record.name
            acc = line.get("acceptance")
            acc_text = f'<br><small>acceptance {acc:.3f}</small>' if isinstance(acc, (int, float)) else ""
            out.append(f'<td class="v {_vclass(v)}{" changed" if changed else ""}" data-verdict="{esc(v)}">'
                       f"{esc(v)}{acc_text}</td>")
            reqs = {str(k): str(x) for k, x in (line.get("verdicts") or {}).items()}
            for rid, rv in reqs.items():
                if rid in prev_reqs and prev_reqs[rid] != rv:
                    changes.append(f"{esc(sr.record.name)}: {esc(pname)} / {esc(arm)} request <b>{esc(rid)}</b>:"
                                   f" {badge(prev_reqs[rid])} &rarr; {badge(rv)}")
            prev, prev_reqs = v, reqs
        out.append(f"<td>{esc(since)}</td></tr>")
    out.append("</table>")
    if changes:
        out.append("<h3>Requests that changed</h3><ul>" + "".join(f"<li>{c}</li>" for c in changes) + "</ul>")
    out.append("</section>")
    return "\n".join(out)


# -- arms and requests -----------------------------------------------------------------------------
def _arms(sr: ServedRecord, ids: _Ids) -> Iterator[str]:
    """The arms and their requests, a part per request."""
    out = ['<section id="requests"><h2>Arms and requests</h2>']
    for pname in sr.pairing_names():
        p = sr.pairing_summary(pname) or {}
        out.append(f"<h3>pairing {esc(pname)} {badge(p.get('verdict')) if p else ''}</h3>")
        out.append(f'<p class="mono muted">target {esc(p.get("target") or "-")}<br>drafter'
                   f' {esc(p.get("draft") or "-")}</p>')
        for a in sr.final_arms(pname) or sr.arm_lines(pname):
            name = str(a.get("name"))
            aid = ids.arm(pname, name)
            reqs = sr.requests(pname, name)
            opened = " open" if a.get("verdict") not in (Verdict.MATCH, Verdict.PASS) else ""
            width = f", width {a['width']}" if a.get("width") is not None else ""
            out.append(f'<details class="arm" id="{aid}"{opened}><summary><b>{esc(name)}</b> {badge(a.get("verdict"))}'
                       f' <span class="muted">{esc(a.get("kind"))}{esc(width)}, {len(reqs)} requests'
                       + (f", acceptance {_num(a.get('acceptance'), '.3f')}" if a.get("acceptance") is not None
                          else "") + "</span>"
                       + (f" <small>{esc(a.get('reason'))}</small>" if a.get("reason") else "") + "</summary>"
                       '<div class="body">')
            out += [f'<p class="mono">{esc(n)}</p>' for n in a.get("notes") or []]
            yield "\n".join(out) + "\n"
            out = []
            for j, r in enumerate(reqs):
                yield _request(sr, pname, a, r, f"{aid}-r{j + 1}") + "\n"
            if not reqs:
                out.append('<p class="muted">no request lines in this record</p>')
            out.append("</div></details>")
    out.append("</section>")
    yield "\n".join(out) + "\n"


def _request(sr: ServedRecord, pname: str, arm: dict[str, Any], r: dict[str, Any], rid: str) -> str:
    v = str(r.get("verdict"))
    d = _first_diff(r)
    where = []
    if d.get("token_index") is not None:
        where.append(f"token {d['token_index']}")
    if d.get("char_offset") is not None:
        where.append(f"char {d['char_offset']}")
    head = (f'<summary><b class="mono">{esc(r.get("id"))}</b> <span class="muted">({esc(r.get("kind"))})</span>'
            f" {badge(v)}" + (f" first difference at {esc(', '.join(where))}" if d and where else "") + "</summary>")
    parts = [f'<details class="req {_vclass(v)}-b" id="{rid}" data-request="{esc(r.get("id"))}">', head,
             '<div class="drill">']
    if r.get("reason"):
        parts.append(f"<p>{esc(r.get('reason'))}</p>")
    parts.append(_prompt(r))
    if d:
        parts.append(_aligned(d, r))
        parts.append(_tokens(d, r))
    parts.append(_facts(sr, pname, r, d))
    parts.append(_reproduction(r, rid))
    parts.append(_diagnosis(sr, pname, str(arm.get("name")), r, rid))
    text = r.get("text") if r.get("text") is not None else (r.get("completion") or {}).get("text")
    if text is not None:
        off = min(max(d["char_offset"], 0), len(text)) if isinstance(d.get("char_offset"), int) else None
        start, end = _window(len(text), off)
        at = off if off is not None and start <= off <= end else end
        shown = (("\u2026" if start else "") + visible(text[start:at])
                 + (f'<span class="oth">{visible(text[at:end])}</span>' if at < end else "")
                 + ("\u2026" if end < len(text) else ""))
        whole = end - start == len(text)
        parts.append(f'<details><summary class="muted">the {"whole " if whole else ""}served text ({len(text)}'
                     " characters" + ("" if whole else f", {end - start} shown from character {start}")
                     + (", from the first difference highlighted" if off is not None else "") + ")</summary>"
                     f'<div class="align">{shown}</div></details>')
    parts.append("</div></details>")
    return "\n".join(parts)


def _window(n: int, at: int | None) -> tuple[int, int]:
    """(start, end) of the at most TEXT_CHARS characters the page shows of a text of ``n``: from its start,
    or from a little before ``at`` (its first difference) where that lies further in."""
    if n <= TEXT_CHARS:
        return 0, n
    start = 0 if at is None else min(max(0, at - TEXT_CHARS // 4), n - TEXT_CHARS)
    return start, start + TEXT_CHARS


def _prompt(r: dict[str, Any]) -> str:
    body = (r.get("request") or {}).get("body") or {}
    if not isinstance(body, dict):
        return ""
    if body.get("prompt") is not None:
        prompt = str(body["prompt"])
    elif isinstance(body.get("messages"), list):
        prompt = " | ".join(f"{m.get('role')}: {m.get('content')}" for m in body["messages"] if isinstance(m, dict))
    else:
        return ""
    params = ", ".join(f"{k}={body[k]}" for k in sorted(body) if k not in ("prompt", "messages"))
    cut = "…" if len(params) > 400 else ""  # the parameters as the prompt: a logit_bias map can be long
    return (f'<p class="muted">prompt: <span class="mono">{visible(prompt[:400])}'
            + ("…" if len(prompt) > 400 else "") + "</span>" + (f" ({esc(params[:400])}{cut})" if params else "")
            + "</p>")


def _aligned(d: dict[str, Any], r: dict[str, Any]) -> str:
    """The two texts one above the other, aligned at the first differing character."""
    before = str(d.get("text_before") or "")
    shown = before[-CONTEXT_CHARS:]
    cut = "…" if len(before) > len(shown) else ""
    ref_name, oth_name = str(d.get("reference") or "reference"), str(d.get("other") or "served")
    lab = max(len(ref_name), len(oth_name)) + 2

    def row(name: str, snippet: str, cls: str) -> str:
        return (f'<span class="lab" style="width:{lab}ch">{esc(name)}</span><span class="same">{esc(cut)}'
                f'{visible(shown)}</span><span class="{cls}">{visible(snippet)}</span>')

    caret = " " * (lab + len(cut) + len(shown))
    off = d.get("char_offset")
    at = f"char {off}" if off is not None else "no character differs (the token ids do)"
    return ('<div class="align">' + row(ref_name, str(d.get("reference_snippet") or "")[:TEXT_CHARS], "ref") + "\n"
            + row(oth_name, str(d.get("other_snippet") or "")[:TEXT_CHARS], "oth") + "\n"
            + f'<span class="caret">{caret}^ first difference, {esc(at)}</span></div>')


def _after(d: dict[str, Any]) -> tuple[list[int], list[int]]:
    """Each side's tokens from the first difference that the drill-down shows (``served`` writes a few)."""
    n = 2 * CONTEXT_TOKENS
    return list(d.get("reference_tokens") or [])[:n], list(d.get("other_tokens") or [])[:n]


def _top2(top: Any, i: int) -> float | None:
    try:
        a, b = top[i][0][1], top[i][1][1]
        return float(a) - float(b)
    except (IndexError, TypeError, ValueError, KeyError):
        return None


def _tokens(d: dict[str, Any], r: dict[str, Any]) -> str:
    """The tokens around the first difference on both sides, with the served side's top-2 margins."""
    k = d.get("token_index")
    if not isinstance(k, int):
        return ""
    before = [int(t) for t in (d.get("tokens_before") or []) if isinstance(t, int)][-CONTEXT_TOKENS:]
    ref_t, oth_t = _after(d)
    ref_p, oth_p = d.get("reference_pieces") or [], d.get("other_pieces") or []
    comp = r.get("completion") or {}
    top = comp.get("top")
    served_is_other = str(d.get("other")) not in ("classic decode", "baseline-start")
    rows = ['<table class="tokens mono"><tr><th>token</th><th>' + esc(d.get("reference") or "reference")
            + "</th><th>" + esc(d.get("other") or "served") + "</th><th>served top-2 margin (nats)</th></tr>"]

    def piece(pieces: Any, i: int) -> str:
        return f" {visible(repr(pieces[i]))}" if isinstance(pieces, list) and i < len(pieces) else ""

    for n, t in enumerate(before):
        pos = k - len(before) + n
        m = _top2(top, pos) if served_is_other else None
        rows.append(f'<tr><td class="shared">{pos}</td><td class="shared" colspan="2">{t} (shared)</td>'
                    f'<td class="shared">{_num(m)}</td></tr>')
    for n in range(max(len(ref_t), len(oth_t))):
        pos = k + n
        first = ' class="first"' if n == 0 else ""
        rt = f"{esc(ref_t[n])}{piece(ref_p, n)}" if n < len(ref_t) else "-"
        ot = f"{esc(oth_t[n])}{piece(oth_p, n)}" if n < len(oth_t) else "-"
        m = _top2(top, pos) if served_is_other else None
        if n == 0:
            m = d.get("margin_other") if isinstance(d.get("margin_other"), (int, float)) else m
        rows.append(f"<tr><td{first}>{pos}{' first difference' if n == 0 else ''}</td><td{first}>{rt}</td>"
                    f"<td{first}>{ot}</td><td{first}>{_num(m)}</td></tr>")
    rows.append("</table>")
    return "\n".join(rows)


def _facts(sr: ServedRecord, pname: str, r: dict[str, Any], d: dict[str, Any]) -> str:
    facts: list[tuple[str, str]] = []
    if d:
        facts.append(("top-2 margin at the difference",
                      f"{_num(d.get('margin_reference'))} nats ({esc(d.get('reference'))}) / "
                      f"{_num(d.get('margin_other'))} nats ({esc(d.get('other'))})"))
        if d.get("logprobs_equal_before") is not None:
            facts.append(("logprobs before it", "bitwise equal" if d.get("logprobs_equal_before")
                          else f"differ first at token {esc(d.get('first_logprob_diff'))}"))
        facts.append(("tokens / characters", f"{esc(d.get('reference_token_count'))} / {esc(d.get('reference_chars'))}"
                      f" ({esc(d.get('reference'))}), {esc(d.get('other_token_count'))} /"
                      f" {esc(d.get('other_chars'))} ({esc(d.get('other'))})"))
    tie = r.get("tie")
    if isinstance(tie, dict) and tie.get("kind"):
        facts.append(("tie", f"<b>{esc(tie.get('kind'))}</b> (margins {_num(tie.get('margin_a'))} /"
                      f" {_num(tie.get('margin_b'))} nats, near-tie band {_num(tie.get('threshold'), '.3g')}"
                      f" nats for {esc(tie.get('dtype'))})"))
    cause = r.get("cause")
    if isinstance(cause, dict):
        cause = cause.get("line") or cause.get("summary") or cause.get("kind")
    if cause:
        facts.append(("cause", esc(cause)))
    cold = (r.get("reference") or {}).get("cold") if isinstance(r.get("reference"), dict) else None
    if isinstance(cold, dict) and cold.get("equals_classic") is not None:
        cold_answer = "its cold answer" + (f" ({esc(cold.get('source'))})" if cold.get("source") else "")
        facts.append(("state", f"state-dependent: {cold_answer} equals classic decode" if cold.get("equals_classic")
                      else f"not state-dependent: {cold_answer} differs from classic decode too"))
    p = sr.pairing_summary(pname) or {}
    rid = str(r.get("id"))
    for f in p.get("findings") or []:
        if f" {rid} (" in str(f):
            facts.append(("finding", esc(f)))
    ev = r.get("evidence") or {}
    if isinstance(ev, dict) and ev:
        lines = "; ".join(str(x) for x in ev.get("lines") or [])
        acc = ev.get("acceptance")
        facts.append(("drafter evidence", ("engaged" if ev.get("engaged") else "not engaged")
                      + (f", acceptance {_num(acc, '.3f')}" if isinstance(acc, (int, float)) else "")
                      + (f": {esc(lines)}" if lines else "")))
    if not facts:
        return ""
    return '<dl class="kv">' + "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in facts) + "</dl>"


def _reproduction(r: dict[str, Any], rid: str) -> str:
    rep = r.get("reproduction") if isinstance(r.get("reproduction"), dict) else None
    command = (rep or {}).get("command") or r.get("replay")
    if command:
        return (f'<p class="muted">reproduce in process:</p><div class="repro mono"><span id="{rid}-cmd">'
                f'{esc(command)}</span><button class="copy" type="button" data-for="{rid}-cmd">copy</button></div>')
    if rep and rep.get("reason"):
        return f'<p class="muted">not reproducible in process: {esc(rep["reason"])}</p>'
    return ""


def _diagnosis(sr: ServedRecord, pname: str, arm: str, r: dict[str, Any], rid: str) -> str:
    """The finding's diagnosis where the record holds one: its phase, location and summary, each step (status,
    verdict, evidence, the command that repeats it, with a copy button) and what it leaves open."""
    line = sr.diagnosis(pname, arm, str(r.get("id")))
    if line is None:
        return ""
    d = line.get("diagnosis") or {}
    where = line.get("diagnosed_in")
    earlier = (f' <span class="muted">(diagnosed in {esc(where)}, another record of the same finding: not'
               " re-run)</span>" if where and where != sr.record.name else "")
    at = location_text(d.get("location"))
    out = [f'<div class="diag" id="{rid}-diag"><p><b>diagnosis</b>: phase <b>{esc(d.get("phase"))}</b>'
           + ("" if at == "-" else f" at {esc(at)}") + f"{earlier}</p>",
           f"<p>{esc(d.get('summary'))}</p>",
           '<table class="steps"><tr><th>step</th><th>status</th><th>verdict</th><th>evidence</th></tr>']
    for n, s in enumerate(d.get("steps") or []):
        ran = s.get("status") == "ran"
        ev = "".join(f"<div>{esc(e)}</div>" for e in s.get("evidence") or [])
        if s.get("command"):
            cid = f"{rid}-s{n + 1}"
            ev += (f'<div class="repro mono"><span id="{cid}-cmd">{esc(s["command"])}</span>'
                   f'<button class="copy" type="button" data-for="{cid}-cmd">copy</button></div>')
        out.append(f"<tr><td>{esc(s.get('number'))} {esc(s.get('name'))}</td><td>{esc(s.get('status'))}</td>"
                   f"<td>{badge(s.get('verdict')) if ran else ''}</td><td>{ev}</td></tr>")
    out.append("</table>")
    if d.get("open"):
        out.append('<p class="muted">left open:</p><ul>' + "".join(f"<li>{esc(o)}</li>" for o in d["open"])
                   + "</ul>")
    out.append("</div>")
    return "\n".join(out)


def _identity(sr: ServedRecord) -> str:
    ident = sr.identity
    keys = ("host", "os", "cpu", "cpu_count", "device", "python", "mlx", "mlx_lm", "specparity", "git_commit")
    rows = "".join(f"<dt>{esc(k)}</dt><dd class=\"mono\">{esc(ident.get(k))}</dd>" for k in keys if k in ident)
    for pname, m in (ident.get("models") or {}).items():
        if isinstance(m, dict):
            rows += (f"<dt>{esc(pname)} fingerprints</dt><dd class=\"mono\">target {esc(m.get('target'))}<br>"
                     f"drafter {esc(m.get('draft'))}</dd>")
    for k, v in (ident.get("env") or {}).items():
        rows += f"<dt>env {esc(k)}</dt><dd class=\"mono\">{esc(v)}</dd>"
    return f'<section id="identity"><h2>Identity</h2><dl class="kv">{rows}</dl></section>'


def write_html(paths: Iterable[str | os.PathLike[str]], out: str | os.PathLike[str],
               force: bool = False) -> HtmlSummary:
    """Write the page for the records ``paths`` name (see :func:`load_series`) to ``out`` as a new file
    (:func:`specparity.store.new_files`: an existing ``out`` only with ``force``), part by part as it is made."""
    from specparity.store import new_files

    series = load_series(list(paths))
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    with new_files([target], force=force, flag="--out") as (tmp,):
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(page(series))
            f.flush()
            os.fsync(f.fileno())
    latest = series.records[-1]
    names = latest.pairing_names()
    return HtmlSummary(target, [sr.record.name for sr in series.records], len(names),
                       sum(len(latest.final_arms(p) or latest.arm_lines(p)) for p in names),
                       latest.record.verdict if latest.record.is_complete else None, series.named)
