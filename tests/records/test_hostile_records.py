"""Damaged, odd and crafted records through `records html` and `records show` (issue 44, classes 4, 7, 8, 10).

The one reader (records.record.read_record, then records.served.check_served) types every field a
renderer reads: a field of the wrong type is one ``Error:`` line naming the file and the entry, exit 2,
never 70; a string the file holds is shown as it is (a lone surrogate escape as its escape, a control
character as a visible glyph, on the page and on the terminal alike). JSONL lines are split on newline
only. The page keeps long texts and the history across nights to stated bounds (docs/records.md).
"""

from __future__ import annotations

import json
import unicodedata
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli, main_in_process
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from specparity.records.record import read_record

J = dict[str, Any]
NAME = "served-host-2026-01-01"

# a served record as `served` writes it, with every field a renderer reads: two arms, a diverged
# request with its differences, tie, cause, cold answer, evidence and reproduction, a chat request
_DIFF: J = {"reference": "classic decode", "other": "w2", "token_index": 3, "char_offset": 9,
            "tokens_before": [5, 6, 7], "reference_tokens": [8, 9], "other_tokens": [10, 11],
            "reference_pieces": [" a", " b"], "other_pieces": [" c", " d"], "reference_token_count": 8,
            "other_token_count": 8, "text_before": "the same ", "reference_snippet": "a b",
            "other_snippet": "c d", "reference_chars": 20, "other_chars": 20, "logprobs_equal_before": True,
            "first_logprob_diff": None, "margin_reference": 0.25, "margin_other": 0.5, "detokenization": None,
            "written_as": None}
_REQ_DIVERGED: J = {
    "id": "p0", "kind": "fresh", "verdict": "diverged", "reason": "differs from classic decode",
    "request": {"endpoint": "completions", "body": {"prompt": "hello", "max_tokens": 8, "temperature": 0}},
    "sha256": "ab" * 32, "text": "the same c d and more",
    "completion": {"text": "the same c d and more", "sha256": "ab" * 32, "token_ids": [1, 5, 6, 7, 10, 11],
                   "logprobs": [-0.1] * 6, "top": [[[1, -0.1], [2, -1.0]]] * 6, "usage": {"completion_tokens": 6},
                   "finish_reason": "length", "seconds": 0.1, "status": 200, "error": None, "raw": None},
    "evidence": {"verify_calls": 2, "draft_calls": 2, "accepts": [1, 0], "widths": [2], "first_offset": 0,
                 "lines": ["witness: 2 rounds"], "declined": False, "sources": ["witness"], "cache": None,
                 "cached_tokens": None, "engaged": True, "acceptance": 0.5},
    "divergence": _DIFF, "replay": "specparity replay --sequence x.jsonl",
    "reference": {"cold": {"equals_classic": True, "source": "a fresh server"}},
    "classic": _DIFF, "baseline": {**_DIFF, "reference": "baseline-start"}, "cold": None,
    "tie": {"kind": "near tie", "margin_a": 0.01, "margin_b": 0.02, "threshold": 0.05, "dtype": "float32"},
    "cause": {"line": "a warm cache", "kind": "state"},
    "reproduction": {"command": "specparity replay --sequence x.jsonl", "reason": None}}
_REQ_CHAT: J = {"id": "c1", "kind": "chat", "verdict": "match", "reason": "",
                "request": {"endpoint": "chat", "body": {"messages": [{"role": "user", "content": "hi"}]}},
                "text": "hello", "completion": {"text": "hello", "sha256": "cd" * 32}, "divergence": None,
                "reproduction": {"command": None, "reason": "a chat request"}}
_REQ_BASE: J = {"id": "p0", "kind": "fresh", "verdict": "match", "reason": "", "text": "the same a b",
                "completion": {"text": "the same a b", "sha256": "ef" * 32}}
_ARM_BASE: J = {"pairing": "p", "name": "baseline-start", "kind": "baseline", "width": None, "setting": None,
                "verdict": "match", "reason": "", "requests": 1, "verdicts": {"p0": "match"}, "notes": [],
                "acceptance": None}
_ARM_W2: J = {"pairing": "p", "name": "w2", "kind": "width", "width": 2, "setting": 1, "setting_name": "n",
              "verdict": "diverged", "reason": "1 of 2 requests not match", "served_by": "process",
              "acceptance": 0.5, "requests": 2, "verdicts": {"p0": "diverged", "c1": "match"},
              "notes": ["a note"], "server": {"log": "w2.log"}}
_PAIRING: J = {"name": "p", "profile": "mlx-lm", "target": "/t", "draft": "/d", "verdict": "diverged",
               "reason": "", "width_mode": "process", "groups": [["baseline-start"], ["w2"]],
               "request_groups": {"p0": [["baseline-start"], ["w2"]]},
               "findings": ["request 1 p0 (fresh) differs from classic decode in w2"], "arms": [_ARM_BASE, _ARM_W2]}
_REPORT: J = {"kind": "served", "title": "served: p", "argv": ["specparity", "served"], "status": "complete",
              "verdict": "diverged", "exit_code": 1, "started": "2026-01-01T00:00:00",
              "finished": "2026-01-01T00:01:00",
              "timings": {"total": 60.0}, "arms": {"arms": 2, "p-baseline-start": 1, "p-w2": 2},
              "summary": {"verdict": "diverged", "exit_code": 1, "job": {"max_tokens": 8, "pairings": [
                  {"name": "p", "profile": "mlx-lm"}]}, "pairings": [_PAIRING]},
              "error": None, "schema": 1}
_IDENTITY: J = {"host": "h", "device": "cpu", "mlx": "0.1", "mlx_lm": "0.2", "specparity": "0.3",
                "env": {"MLX_X": "1"}, "job": {"pairings": [{"name": "p", "profile": "mlx-lm"}]},
                "models": {"p": {"target": "aa", "draft": "bb"}},
                "environments": {"p": {"name": "mlx-lm-0.32.2", "packages": {"mlx-lm": "0.32.2"}}}}
_LINES: dict[str, list[J]] = {"arms": [_ARM_BASE, _ARM_W2], "p-baseline-start": [_REQ_BASE],
                              "p-w2": [_REQ_DIVERGED, _REQ_CHAT]}


def write_record(root: Path, report: Any = _REPORT, identity: Any = _IDENTITY,
                 lines: dict[str, list[Any]] | None = None, ensure_ascii: bool = True, name: str = NAME) -> Path:
    """A served record on disk as `served` lays it out; JSON written as given (``ensure_ascii=False``: raw
    characters; a lone surrogate then is not UTF-8, as another writer may leave it)."""
    data = root / "data" / name
    data.mkdir(parents=True)

    def dump(value: Any) -> bytes:
        return json.dumps(value, ensure_ascii=ensure_ascii).encode("utf-8", "surrogatepass")

    (data / "report.json").write_bytes(dump(report))
    (data / "identity.json").write_bytes(dump(identity))
    for stem, rows in (_LINES if lines is None else lines).items():
        rows = rows if isinstance(rows, list) else [rows]  # a property's draw may be any value: one line
        (data / f"{stem}.jsonl").write_bytes(b"".join(dump(r) + b"\n" for r in rows))
    md = root / f"{name}.md"
    md.write_text("# served\n")
    return md


def _data(md: Path) -> Path:
    return md.parent / "data" / md.stem


def _one_error_line(err: str, starts: str) -> None:
    assert err.count("\n") == 1 and err.startswith(starts), err


class _Elements(HTMLParser):
    """Every element of a page: (tag, attributes), in order, and the text of each script."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, dict(attrs)))
        self._in_script = tag == "script"
        if self._in_script:
            self.scripts.append("")

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.scripts[-1] += data


# -- class 4: every field a renderer reads is typed by the one reader ------------------------------
def _with(report: J | None = None, identity: J | None = None, **lines: list[J]) -> dict[str, Any]:
    return {"report": report or _REPORT, "identity": identity or _IDENTITY,
            "lines": {**_LINES, **{k.replace("_", "-"): v for k, v in lines.items()}}}


def _summary(**job: Any) -> J:
    return {**_REPORT, "summary": {**_REPORT["summary"], "job": {**_REPORT["summary"]["job"], **job}}}


# a pairing summary without its profile: the page looks for the engine in the job
_NO_PROFILE = {**_REPORT, "summary": {**_REPORT["summary"], "job": None,
                                      "pairings": [{k: v for k, v in _PAIRING.items() if k != "profile"}]}}

# name, the record, the file the line names, what it says after the file (the page crashed with 70 on each)
TYPED = [
    ("identity-env-a-list", _with(identity={**_IDENTITY, "env": ["MLX_X=1"]}), "identity.json",
     ": env: expected a mapping"),
    ("identity-job-a-list", _with(report=_NO_PROFILE, identity={**_IDENTITY, "job": ["p"]}), "identity.json",
     ": job: expected a mapping"),
    ("identity-job-pairings-a-number", _with(report=_NO_PROFILE, identity={**_IDENTITY, "job": {"pairings": 5}}),
     "identity.json", ": job.pairings: expected a list"),
    ("max-tokens-a-string", _with(report=_summary(max_tokens="8")), "report.json",
     ": summary: job.max_tokens: expected an integer"),
    ("text-a-number", _with(p_w2=[{**_REQ_DIVERGED, "text": 5}, _REQ_CHAT]), "p-w2.jsonl",
     ", entry 1: text: expected a string"),
    ("classic-tokens-a-number", _with(p_w2=[{**_REQ_DIVERGED, "divergence": None,
                                             "classic": {**_DIFF, "reference_tokens": 5}}, _REQ_CHAT]),
     "p-w2.jsonl", ", entry 1: classic.reference_tokens: expected a list"),
    ("baseline-tokens-a-string", _with(p_w2=[{**_REQ_DIVERGED, "divergence": None, "classic": None,
                                              "baseline": {**_DIFF, "other_tokens": "10 11"}}, _REQ_CHAT]),
     "p-w2.jsonl", ", entry 1: baseline.other_tokens: expected a list"),
]


@pytest.mark.parametrize("name, record, file, said", TYPED, ids=[t[0] for t in TYPED])
def test_a_field_of_the_wrong_type_is_one_line_naming_the_file_and_entry(
        cli_bin: str, tmp_path: Path, name: str, record: dict[str, Any], file: str, said: str) -> None:
    """issue 44.4: `records html` exited 70 on each (an AttributeError or TypeError in the page)."""
    md = write_record(tmp_path / "rec", **record)
    out = tmp_path / "page.html"
    for args in (["html", str(md), "--out", str(out)], ["show", str(md)]):
        r = run_cli(cli_bin, "records", *args)
        assert r.returncode == 2, (args, r.returncode, r.stderr)
        _one_error_line(r.stderr, f"Error: {_data(md) / file}{said}")
    assert not out.exists()


def test_a_lone_surrogate_escape_is_shown_as_it_is(cli_bin: str, tmp_path: Path) -> None:
    """issue 44.4: a "\\ud800" escape in any string read as a lone surrogate, which no output can encode:
    `records show` and `records html` exited 70. It is shown as the file holds it, its escape."""
    md = write_record(tmp_path / "rec", report={**_REPORT, "title": "served: \ud800p"},
                      lines={**_LINES, "p-w2": [{**_REQ_DIVERGED, "reason": "cut at \udc80", "text": "x\ud83d"},
                                                _REQ_CHAT]})
    assert b'"served: \\ud800p"' in (_data(md) / "report.json").read_bytes()  # the file holds the escape
    r = run_cli(cli_bin, "records", "show", str(md))
    assert r.returncode == 0, r.stderr
    assert "served: \\ud800p" in r.stdout and "p0: diverged: cut at \\udc80" in r.stdout, r.stdout
    out = tmp_path / "page.html"
    r = run_cli(cli_bin, "records", "html", str(md), "--out", str(out))
    assert r.returncode == 0, r.stderr
    page = out.read_text(encoding="utf-8")
    assert "served: \\ud800p" in page and "cut at \\udc80" in page and "x\\ud83d" in page


# -- class 8: a JSONL line is split on newline only -------------------------------------------------
def test_a_line_holding_unicode_line_separators_is_read_whole(cli_bin: str, tmp_path: Path) -> None:
    """issue 44.8: U+2028, U+2029 and U+0085 (NEL) are valid unescaped in a JSON string; the reader split
    lines on them (str.splitlines) and refused the record as damaged."""
    reason = "a\u2028b\u0085c\u2029d"
    md = write_record(tmp_path / "rec", ensure_ascii=False,
                      lines={**_LINES, "arms": [_ARM_BASE, {**_ARM_W2, "reason": reason}],
                             "p-w2": [{**_REQ_DIVERGED, "reason": reason}, _REQ_CHAT]})
    assert "\u2028".encode() in (_data(md) / "p-w2.jsonl").read_bytes()
    _, _, rows = read_record(md)
    assert [r["reason"] for r in rows["p-w2"]] == [reason, ""] and rows["arms"][1]["reason"] == reason
    r = run_cli(cli_bin, "records", "show", str(md))
    assert r.returncode == 0, r.stderr
    assert "w2 p0: diverged: a\u00b7b\u00b7c\u00b7d" in r.stdout, r.stdout  # each separator one visible glyph
    out = tmp_path / "page.html"
    r = run_cli(cli_bin, "records", "html", str(md), "--out", str(out))
    assert r.returncode == 0, r.stderr


# -- class 10: control characters are shown, never sent to the terminal -----------------------------
def _controls(text: str) -> list[str]:
    """The characters of ``text`` a terminal acts on (control characters and line separators), but newline."""
    return [c for c in text if c != "\n" and unicodedata.category(c) in ("Cc", "Zl", "Zp")]


def test_show_makes_a_crafted_records_control_characters_visible(cli_bin: str, tmp_path: Path) -> None:
    """issue 44.10: `records show` printed a record's escape sequences raw: this one clears the screen and
    prints a fake verdict line."""
    fake = "\x1b[2J\x1b[H\rverdict: match\n"
    md = write_record(tmp_path / "rec", report={**_REPORT, "title": fake},
                      lines={**_LINES, "p-w2": [{**_REQ_DIVERGED, "reason": fake, "id": "p0\x9b2J"}, _REQ_CHAT]})
    for args in (["show", str(md)], ["list", str(md.parent)]):
        r = run_cli(cli_bin, "records", *args)
        assert r.returncode == 0, (args, r.stderr)
        assert _controls(r.stdout) == [], (args, r.stdout)
        assert not any(ln.startswith("verdict: match") for ln in r.stdout.splitlines()), (args, r.stdout)
        assert "\u00b7[2J\u00b7[H\u00b7verdict: match\u23ce" in r.stdout, (args, r.stdout)
    r = run_cli(cli_bin, "records", "show", str(md))
    assert "verdict: diverged (exit 1)" in r.stdout and "p0\u00b72J" in r.stdout, r.stdout


# -- class 7: bounded pages ---------------------------------------------------------------------------
def _page(tmp_path: Path, capsys: pytest.CaptureFixture[str], *paths: Path) -> str:
    out = tmp_path / "page.html"
    out.unlink(missing_ok=True)
    code, _, err = main_in_process(capsys, "records", "html", *map(str, paths), "--out", str(out))
    assert code == 0, err
    return out.read_text(encoding="utf-8")


def test_a_long_text_is_shown_cut_to_its_bound(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """issue 44.7: the page held every text whole (a 60 MB record took 927 MB to render); a text is shown
    up to TEXT_CHARS characters, around its first difference, saying how long it is."""
    from specparity.records.html import TEXT_CHARS

    text = "".join(f"{i:07d} " for i in range(125_000))  # 1,000,000 characters, each window different
    off = 600_000
    diff = {**_DIFF, "char_offset": off, "text_before": text[off - 9:off], "other_snippet": text[off:off + 24]}
    md = write_record(tmp_path / "rec", lines={**_LINES, "p-w2": [
        {**_REQ_DIVERGED, "text": text, "completion": {**_REQ_DIVERGED["completion"], "text": text},
         "divergence": diff, "classic": diff}, _REQ_CHAT]})
    page = _page(tmp_path, capsys, md)
    assert len(page) < 100_000, len(page)
    assert "1000000 characters" in page and f"{TEXT_CHARS} shown" in page
    assert text[off:off + 16] in page and text[:16] not in page  # the window holds the first difference


def _nights(root: Path, n: int, renamed: bool) -> list[Path]:
    """``n`` nightly served records of one arm and request, a pairing named anew each night if ``renamed``."""
    mds = []
    for i in range(n):
        p = f"p{i}" if renamed else "p"
        arm = {**_ARM_BASE, "pairing": p, "verdict": "match" if i % 3 else "diverged",
               "verdicts": {"p0": "match" if i % 3 else "diverged"}}
        report = {**_REPORT, "started": f"2026-01-01T{i // 60:02d}:{i % 60:02d}:00",
                  "arms": {"arms": 1, f"{p}-baseline-start": 1},
                  "summary": {**_REPORT["summary"], "pairings": [{**_PAIRING, "name": p, "arms": [arm]}]}}
        mds.append(write_record(root, report=report, name=f"served-host-2026-01-01-{i}",
                                lines={"arms": [arm], f"{p}-baseline-start": [{**_REQ_BASE,
                                                                              "verdict": arm["verdict"]}]}))
    return mds


def _history_table(page: str) -> tuple[int, int]:
    """(rows, record columns) of the page's Across nights table."""
    start = page.index('<table class="history">')
    parsed = _Elements()
    parsed.feed(page[start:page.index("</table>", start)])
    rows = sum(1 for tag, _ in parsed.elements if tag == "tr") - 1
    columns = sum(1 for tag, _ in parsed.elements if tag == "th") - 3  # pairing, arm, since
    return rows, columns


def test_the_history_keeps_the_newest_nights_and_the_rows_the_newest_has(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """issue 44.7: the history was every arm of every night by every night: 1,000 nights with a renamed
    pairing made a 151 MB page in 70 s. It keeps the newest HISTORY_NIGHTS records and the newest's rows."""
    from specparity.records.html import HISTORY_NIGHTS

    _nights(tmp_path / "nightly", HISTORY_NIGHTS + 12, renamed=True)
    page = _page(tmp_path, capsys, tmp_path / "nightly")
    assert _history_table(page) == (1, HISTORY_NIGHTS)
    assert f"the newest {HISTORY_NIGHTS} of {HISTORY_NIGHTS + 12} records" in page
    assert "served-host-2026-01-01-11<" not in page and "served-host-2026-01-01-12<" in page
    # the same pairing every night: its one row, its verdict each night, the night it last changed
    _nights(tmp_path / "same", 5, renamed=False)
    page = _page(tmp_path, capsys, tmp_path / "same")
    assert _history_table(page) == (1, 5) and page.count('class="v v-') == 5


@pytest.mark.slow
def test_a_thousand_renamed_nights_make_a_small_page_quickly(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """issue 44.7, at the issue's scale: 1,000 nights with a renamed pairing (151 MB, 70 s before)."""
    import time

    _nights(tmp_path / "nightly", 1000, renamed=True)
    t0 = time.perf_counter()
    page = _page(tmp_path, capsys, tmp_path / "nightly")
    seconds = time.perf_counter() - t0
    assert len(page) < 1_000_000 and seconds < 30, (len(page), seconds)


def big_record(root: Path, megabytes: float, text_chars: int = 100_000) -> Path:
    """A served record of about ``megabytes`` on disk as `served` writes one: requests with long texts
    (mostly ASCII, one astral character each, so Python holds them four bytes a character), their token
    ids, logprobs and top-2 logprobs."""
    import random

    rnd = random.Random(0)
    words = ["the", "cat", "s\u00e4t", "on", "a", "mat", "na\u00efve", "\u65e5\u672c", "\n"]
    lines: dict[str, list[Any]] = {"arms": [], "p-baseline-start": [], "p-w2": []}
    size = 0
    while size < megabytes * 2**20:
        for arm in ("baseline-start", "w2"):
            i = len(lines[f"p-{arm}"])
            text = ("\U0001f600" + "".join(rnd.choice(words) + " " for _ in range(text_chars // 4)))[:text_chars]
            ids = [rnd.randrange(32000) for _ in range(text_chars // 4)]
            req = {**_REQ_BASE, "id": f"r{i}", "text": text,
                   "completion": {"text": text, "sha256": "0" * 64, "token_ids": ids,
                                  "logprobs": [-rnd.random() for _ in ids],
                                  "top": [[[t, -rnd.random()], [t + 1, -1 - rnd.random()]] for t in ids]}}
            if arm == "w2":
                req.update(verdict="diverged", divergence={**_DIFF, "token_index": 7, "char_offset": 30})
            lines[f"p-{arm}"].append(req)
            size += len(json.dumps(req))
    arms = [{**_ARM_BASE, "requests": len(lines["p-baseline-start"]),
             "verdicts": {r["id"]: r["verdict"] for r in lines["p-baseline-start"]}},
            {**_ARM_W2, "requests": len(lines["p-w2"]), "verdicts": {r["id"]: r["verdict"] for r in lines["p-w2"]}}]
    lines["arms"] = arms
    report = {**_REPORT, "arms": {k: len(v) for k, v in lines.items()},
              "summary": {**_REPORT["summary"], "pairings": [{**_PAIRING, "arms": arms}]}}
    return write_record(root, report=report, lines=lines)


# what docs/records.md states: `records html` takes at most this many times the record's size (above what
# it takes for a small record)
STATED_MULTIPLE = 4
_PEAK = """
import resource, subprocess, sys
r = subprocess.run(sys.argv[1:], capture_output=True, text=True)
print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, repr(r.stderr[-300:]))
"""


def _peak_rss(*argv: str) -> int:
    """Peak resident memory of the command ``argv`` in bytes (its own child: nothing else counts)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _PEAK, *argv], capture_output=True, text=True, check=True).stdout
    code, peak, err = out.split(" ", 2)
    assert code == "0", err
    return int(peak)


@pytest.mark.slow
def test_a_large_records_page_takes_memory_within_its_stated_multiple(cli_bin: str, tmp_path: Path) -> None:
    """issue 44.7: a 60 MB record took 927 MB to render (about 15 times). docs/records.md states the
    bound: the page's memory is at most STATED_MULTIPLE times the record's size above a small record's."""
    small = write_record(tmp_path / "small")
    base = _peak_rss(cli_bin, "records", "html", str(small), "--out", str(tmp_path / "small.html"))
    md = big_record(tmp_path / "big", 24)
    size = sum(f.stat().st_size for f in _data(md).iterdir())
    peak = _peak_rss(cli_bin, "records", "html", str(md), "--out", str(tmp_path / "big.html"))
    assert peak - base <= STATED_MULTIPLE * size, (f"{(peak - base) / 2**20:.0f} MB above a small record's"
                                                   f" for {size / 2**20:.0f} MB of record")


# -- properties: any JSON value in any field, in process --------------------------------------------
# strings a crafted record carries: markup, terminal escapes, lone surrogates, line separators
HOSTILE = ["<script>alert(1)</script>", "</details></div><injected>", "\"'><img src=x onerror=alert(1)>",
           "\x1b[2J\x1b[Hverdict: match\n", "\ud800", "x\udfff", "a\u2028b\u0085c\u2029", "\x00", "", "-->",
           "<!--", "]]>", "\u202eevil", "match", "diverged", "baseline-start", "w2", "p", "p0", "&amp;", "\r\n"]
_leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.integers(-2, 10),
                  st.floats(allow_nan=True), st.text(max_size=8), st.sampled_from(HOSTILE))
def _nested(children: Any) -> Any:
    return st.one_of(st.lists(children, max_size=3), st.dictionaries(st.text(max_size=6), children, max_size=3))


_values = st.recursive(_leaf, _nested, max_leaves=8)


def _paths(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON value (keys and indices from the top), the value itself first."""
    inner = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    return [at, *(p for k, v in inner for p in _paths(v, (*at, k)))]


def _at(doc: Any, path: tuple[Any, ...]) -> Any:
    for k in path:
        doc = doc[k]
    return doc


_GONE = object()  # a key taken out


def _changed(base: Any, changes: list[tuple[tuple[Any, ...], Any]]) -> Any:
    """A copy of ``base`` with the value at each path replaced (or, for _GONE, its key removed)."""
    doc = json.loads(json.dumps(base))
    for path, value in changes:
        if not path:
            doc = value if value is not _GONE else None
            continue
        try:
            parent = _at(doc, path[:-1])
            if value is _GONE and isinstance(parent, dict):
                parent.pop(path[-1], None)
            elif value is not _GONE:
                parent[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue  # an earlier change replaced what held it
    return doc


def _hostile(base: Any) -> st.SearchStrategy[Any]:
    """``base`` with a few of its values (at any depth) replaced by any JSON value or taken out, a few of its
    strings by crafted ones, and a key added: a renderer meets each odd value beside otherwise good ones
    (an empty draw, where hypothesis shrinks to, is ``base`` itself)."""
    paths = [p for p in _paths(base) if len(p) > 1]  # the record's files are always there: their values change
    strings = [p for p in paths if isinstance(_at(base, p), str)]
    mappings = [p for p in paths if isinstance(_at(base, p), dict)]
    key = st.sampled_from([*HOSTILE, "text", "classic", "baseline", "env", "job", "top", "max_tokens"])
    return st.tuples(
        st.lists(st.tuples(st.sampled_from(paths), st.one_of(_values, st.just(_GONE))), max_size=2),
        st.lists(st.tuples(st.sampled_from(strings), st.sampled_from(HOSTILE)), max_size=4),
        st.lists(st.tuples(st.sampled_from(mappings), key, _values), max_size=1),
    ).map(lambda t: _changed(base, [*t[0], *t[1], *[((*p, k), v) for p, k, v in t[2]]]))


# the elements the page is made of (records.html and records.chart); any other was injected
ELEMENTS = {"html", "head", "meta", "title", "style", "body", "header", "h1", "h2", "h3", "div", "code", "main",
            "section", "p", "b", "small", "span", "i", "a", "br", "table", "tr", "th", "td", "details", "summary",
            "dl", "dt", "dd", "ul", "li", "figure", "figcaption", "button", "script", "svg", "text", "line",
            "rect", "circle"}
PROPERTY = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                                          HealthCheck.data_too_large])


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@PROPERTY
@given(record=_hostile({"report": _REPORT, "identity": _IDENTITY, "lines": _LINES}), ensure_ascii=st.booleans())
def test_any_value_in_any_field_is_read_or_named(capsys: pytest.CaptureFixture[str], record: dict[str, Any],
                                                  ensure_ascii: bool) -> None:
    """`records html` and `records show` of a record with any JSON value in any field they read: exit 0 or 2
    with one line on stderr, never 70; the page parses with no element the page does not make, one script
    (its own), no event handler; show prints no control character; nothing but --out is written."""
    import tempfile

    from specparity.records.html import SCRIPT

    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        md = write_record(root / "rec", **record, ensure_ascii=ensure_ascii)
        before = _files(root)
        out = root / "page.html"
        code, stdout, err = main_in_process(capsys, "records", "html", str(md), "--out", str(out))
        event(f"html exit {code}")  # about a third of the drawn records are read and rendered whole
        assert code in (0, 2), (code, err)
        if code == 2:
            _one_error_line(err, "Error: ")
            assert stdout == "" and not out.exists() and _controls(err) == [], err
        else:
            assert err == "", err
            parsed = _Elements()
            parsed.feed(out.read_text(encoding="utf-8"))
            parsed.close()
            tags = {tag for tag, _ in parsed.elements}
            assert tags <= ELEMENTS, tags - ELEMENTS
            assert parsed.scripts == [SCRIPT], parsed.scripts
            handlers = [(tag, a) for tag, attrs in parsed.elements for a in attrs if a.startswith("on")]
            assert handlers == [], handlers
        assert {k: v for k, v in _files(root).items() if k != "page.html"} == before
        code, stdout, err = main_in_process(capsys, "records", "show", str(md))
        assert code in (0, 2), (code, err)
        if code == 2:
            _one_error_line(err, "Error: ")
            assert _controls(err) == [], err
        else:
            assert err == "" and _controls(stdout) == [], (err, stdout)
        assert {k: v for k, v in _files(root).items() if k != "page.html"} == before
