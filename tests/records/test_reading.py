"""Records read defensively, one reader, one answer.

A record's files are read by records.record.read_record (and a served record's lines by
records.served.check_served): a file that is not what its writer writes is one
``Error:`` line naming the file, exit 2, for ``records show``, ``list``, ``compare``
and ``junit`` alike (each exited 70, or disagreed, before). ``records junit`` of a
record that did not complete writes nothing (it wrote an empty, green suite).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import run_cli, main_in_process
from served_records import served_record as _served_record

from specparity.errors import UsageError
from specparity.records.record import read_record


def _data(md: Path) -> Path:
    return md.parent / "data" / md.stem


def _edit(md: Path, name: str, change: Callable[[dict], object]) -> None:
    f = _data(md) / name
    lines = [json.loads(ln) for ln in f.read_text().splitlines()] if name.endswith(".jsonl") else None
    if lines is None:
        f.write_text(json.dumps(change(json.loads(f.read_text()))))
    else:
        f.write_text("".join(json.dumps(change(obj)) + "\n" for obj in lines))


def _drop(key: str) -> Callable[[dict], dict]:
    return lambda obj: {k: v for k, v in obj.items() if k != key}


# name, file, change, what the one line says (after the file's path)
CASES = [
    ("report-list", "report.json", lambda r: [r],
     "report.json: not a record's report (expected an object, got a list)"),
    ("report-not-json", "report.json", None, "report.json: not JSON ("),
    ("timings-list", "report.json", lambda r: {**r, "timings": [1]}, "report.json: timings: expected a mapping"),
    ("argv-string", "report.json", lambda r: {**r, "argv": "specparity served"},
     "report.json: argv: expected a list, each item a string"),
    ("status-int", "report.json", lambda r: {**r, "status": 5}, "report.json: status: expected one of running,"),
    ("summary-pairings", "report.json", lambda r: {**r, "summary": {**r["summary"], "pairings": {"p": 1}}},
     "report.json: summary: pairings: expected a list"),
    ("identity-list", "identity.json", lambda r: [1], "identity.json: not a record's identity"),
    ("arm-no-verdict", "arms.jsonl", _drop("verdict"), "arms.jsonl, entry 1: verdict: missing"),
    ("request-no-verdict", "p-baseline-start.jsonl", _drop("verdict"),
     "p-baseline-start.jsonl, entry 1: verdict: missing"),
    ("request-verdict-int", "p-baseline-start.jsonl", lambda r: {**r, "verdict": 3},
     "p-baseline-start.jsonl: line 1: verdict: expected a word (a string), got 3 (an integer)"),
    ("request-bad-word", "p-baseline-start.jsonl", lambda r: {**r, "verdict": "fine"},
     "p-baseline-start.jsonl, entry 1: verdict: expected one of "),
    ("evidence-widths", "p-baseline-start.jsonl", lambda r: {**r, "evidence": {"widths": "2,3"}},
     "p-baseline-start.jsonl, entry 1: evidence.widths: expected a list"),
]


@pytest.fixture
def record(tmp_path: Path) -> Path:
    md = _served_record(tmp_path / "rec")
    (_data(md) / "identity.json").write_text(json.dumps({"host": "h"}))
    return md


# the fast tier reads one malformation per file (each case is five CLI runs); the whole suite every one
FAST_CASES = {"report-not-json", "identity-list", "arm-no-verdict", "request-verdict-int"}


@pytest.mark.parametrize("name, file, change, message",
                         [c if c[0] in FAST_CASES else pytest.param(*c, marks=pytest.mark.slow) for c in CASES],
                         ids=[c[0] for c in CASES])
def test_a_malformed_record_file_is_named_by_every_command(cli_bin: str, record: Path, tmp_path: Path, name: str,
                                                           file: str, change: Callable[[dict], object] | None,
                                                           message: str) -> None:
    if change is None:
        (_data(record) / file).write_text("{not json")
    else:
        _edit(record, file, change)
    good = _served_record(tmp_path / "good")
    for args in (["show", str(record)], ["compare", str(good), str(record)],
                 ["junit", str(record), "--out", str(tmp_path / "j.xml")],
                 ["html", str(record), "--out", str(tmp_path / "j.html")]):
        r = run_cli(cli_bin, "records", *args)
        assert r.returncode == 2, (args, r.returncode, r.stderr)
        line = r.stderr.strip()
        assert line.startswith(f"Error: {_data(record) / file}") and message in line and "\n" not in line, (args, line)
    assert not (tmp_path / "j.xml").exists() and not (tmp_path / "j.html").exists()
    r = run_cli(cli_bin, "records", "list", str(record.parent))
    assert r.returncode == 0 and "unexpected" not in r.stderr and "Traceback" not in r.stderr, (r.stdout, r.stderr)
    try:  # list says what the one reader says: unreadable, naming the file, or the record as it reads
        read_record(record)
        assert f"{record.stem}  served  complete  match" in r.stdout, (r.stdout, r.stderr)
    except UsageError as err:
        assert f"{record.stem}  -  unreadable ({err})" in r.stdout, (r.stdout, r.stderr)
        assert str(_data(record) / file) in str(err)


def test_a_md_without_its_data_is_not_a_record_for_show_and_compare_alike(cli_bin: str, tmp_path: Path) -> None:
    """show said 'INCOMPLETE (unknown)' where compare said 'not a record'."""
    md = tmp_path / "served-host-2026-01-01.md"
    md.write_text("# served\n")
    with pytest.raises(FileNotFoundError):
        read_record(md)
    for args in (["show", str(md)], ["compare", str(md), str(md)], ["junit", str(md), "--out", str(tmp_path / "x")],
                 ["html", str(md), "--out", str(tmp_path / "x.html")]):
        r = run_cli(cli_bin, "records", *args)
        assert r.returncode == 2 and r.stderr.startswith(f"Error: {md}: not a record"), (args, r.stderr)
        assert r.stderr.strip().count("\n") == 0, (args, r.stderr)


@pytest.mark.parametrize("file", ["report.json", "identity.json", "arms.jsonl"])
def test_a_data_file_linked_out_of_the_record_is_not_followed(record: Path, tmp_path: Path, file: str) -> None:
    f = _data(record) / file
    outside = tmp_path / f"outside-{file}"
    outside.write_text(f.read_text())
    f.unlink()
    f.symlink_to(outside)
    with pytest.raises(UsageError, match=f"{file}: a link out of the record \\(to {outside}\\): not read"):
        read_record(record)


@pytest.mark.parametrize("file", ["report.json", "data-dir"])
def test_a_link_out_of_the_record_is_one_line_from_every_command(cli_bin: str, record: Path, tmp_path: Path,
                                                                 file: str) -> None:
    """report.json linked out, and the record's data/<name> folder itself a link to elsewhere (it was
    followed: every file in it then counted as inside)."""
    data = _data(record)
    if file == "data-dir":
        outside = tmp_path / "elsewhere"
        data.rename(outside)
        data.symlink_to(outside)
        named = data
    else:
        outside = tmp_path / "outside-report.json"
        outside.write_text((data / file).read_text())
        (data / file).unlink()
        (data / file).symlink_to(outside)
        named = data / file
    good = _served_record(tmp_path / "good")
    for args in (["show", str(record)], ["compare", str(good), str(record)]):
        r = run_cli(cli_bin, "records", *args)
        assert r.returncode == 2, (args, r.returncode, r.stderr)
        want = f"Error: {named}: a link out of the record (to {outside}): not read"
        assert r.stderr.strip() == want, (args, r.stderr)


def test_a_link_inside_the_record_is_read(record: Path) -> None:
    data = _data(record)
    (data / "copy.json").write_text((data / "report.json").read_text())
    (data / "report.json").unlink()
    (data / "report.json").symlink_to("copy.json")
    assert read_record(record)[0].status == "complete"


def test_junit_of_an_interrupted_record_writes_nothing_and_exits_2(cli_bin: str, record: Path, tmp_path: Path) -> None:
    """It wrote an empty, green JUnit file; compare already refused."""
    _edit(record, "report.json", lambda r: {**r, "status": "interrupted", "verdict": None, "exit_code": None,
                                           "summary": None, "error": "Ctrl-C (SIGINT)"})
    out = tmp_path / "j.xml"
    r = run_cli(cli_bin, "records", "junit", str(record), "--out", str(out))
    assert r.returncode == 2 and not out.exists(), r.stderr
    assert r.stderr.strip() == (f"Error: {record}: record is interrupted, not complete: no JUnit for a run that did"
                                " not finish (its finished parts: specparity records show)")
    assert run_cli(cli_bin, "records", "show", str(record)).returncode == 0  # show still reads what finished


def test_show_of_a_pairing_that_ran_no_arm(cli_bin: str, record: Path) -> None:
    """A pairing whose profile could not run here has no arm lines: show printed its table with max() of
    nothing (70). Found by the records property (tests/core/test_input_properties.py)."""
    _edit(record, "report.json", lambda r: {**r, "summary": {**r["summary"], "pairings": [
        *r["summary"]["pairings"], {"name": "q", "verdict": "error", "profile": "vllm", "arms": [],
                                    "reason": "profile vllm cannot run here"}]}})
    r = run_cli(cli_bin, "records", "show", str(record))
    assert r.returncode == 0 and "pairing q: vllm server" in r.stdout, r.stderr
    assert "0 groups" not in r.stdout, r.stdout  # no arm answered: no empty groups line


def test_compare_reads_a_parts_own_words_as_a_change(tmp_path: Path) -> None:
    """dist's control lines say rejected / accepted: compare raised ValueError (70) when one changed."""
    from specparity.records.compare import compare_records

    def dist_record(root: Path, word: str) -> Path:
        data = root / "data" / "dist-h-2026-01-01"
        data.mkdir(parents=True)
        (data / "report.json").write_text(json.dumps({"kind": "dist", "title": "t", "argv": [], "status": "complete",
                                                      "verdict": "pass", "exit_code": 0, "summary": {}}))
        (data / "control.jsonl").write_text(json.dumps({"rule": "wrong", "verdict": word}) + "\n")
        return root / "dist-h-2026-01-01.md"

    rep = compare_records(dist_record(tmp_path / "a", "rejected"), dist_record(tmp_path / "b", "accepted"))
    assert [(c.category, c.old, c.new) for c in rep.changes] == [("changed", "rejected", "accepted")]
    assert rep.exit_code == 0


def _counted(md: Path) -> None:
    """report.json counting its lines, as a record's sink writes it (one arm line, one request line)."""
    _edit(md, "report.json", lambda r: {**r, "arms": {"arms": 1, "p-baseline-start": 1},
                                        "summary": {**r["summary"], "pairings": [
                                            {**r["summary"]["pairings"][0],
                                             "arms": [{**r["summary"]["pairings"][0]["arms"][0], "requests": 1}]}]}})


# name, what is done to the record's data directory, the file the one line names, what it says after it
LOST = [
    ("arm-line-a-list", lambda d: (d / "arms.jsonl").write_text("[1, 2]\n"), "arms.jsonl",
     ": line 1: expected an object (one finished part), got [1, 2] (a list)"),
    ("request-line-a-number", lambda d: (d / "p-baseline-start.jsonl").write_text("5\n"), "p-baseline-start.jsonl",
     ": line 1: expected an object (one finished part), got 5 (an integer)"),
    ("a-damaged-middle-line", lambda d: (d / "arms.jsonl").write_text("{cut\n" + (d / "arms.jsonl").read_text()),
     "arms.jsonl", ": line 1: not JSON, and not the last line"),
    ("arms-file-missing", lambda d: (d / "arms.jsonl").unlink(), "arms.jsonl",
     ": missing, where report.json counts 1 finished parts in it"),
    ("requests-file-empty", lambda d: (d / "p-baseline-start.jsonl").write_text(""), "p-baseline-start.jsonl",
     ": holds 0 finished parts, where report.json counts 1"),
]


def test_a_record_that_lost_lines_or_holds_lines_of_another_type_is_named_not_read_as_fewer_parts(
        record: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], cli_bin: str) -> None:
    """issue 30.11: lines of the wrong type were skipped (show: 'arms: 0 finished' beside 'verdict: diverged'),
    and compare of a record missing its arms.jsonl said 'no regression'. Each is one line naming the file,
    exit 2, from show, compare and junit alike; a last line cut short by a crash is still skipped."""
    import shutil

    _counted(record)
    good = _served_record(tmp_path / "good")
    _counted(good)
    _edit(record, "report.json", lambda r: {**r, "verdict": "diverged", "exit_code": 1})
    pristine = tmp_path / "pristine"
    shutil.copytree(record.parent, pristine)
    for name, damage, file, said in LOST:
        shutil.rmtree(record.parent)
        shutil.copytree(pristine, record.parent)
        damage(_data(record))
        for args in (("show", str(record)), ("compare", str(good), str(record)),
                     ("junit", str(record), "--out", str(tmp_path / "j.xml"))):
            code, out, err = main_in_process(capsys, "records", *args)
            assert code == 2 and out == "", (name, args, code, out, err)
            assert err.strip() == err.strip().splitlines()[0], (name, args, err)
            assert err.startswith(f"Error: {_data(record) / file}{said}"), (name, args, err)
        assert not (tmp_path / "j.xml").exists()
    # without report.json's counts (a record of an older version), the summary's arms need their lines too
    shutil.rmtree(record.parent)
    shutil.copytree(pristine, record.parent)
    _edit(record, "report.json", lambda r: {**r, "arms": {}})
    (_data(record) / "arms.jsonl").unlink()
    r = run_cli(cli_bin, "records", "compare", str(good), str(record))
    assert r.returncode == 2 and r.stderr.strip() == (
        f"Error: {_data(record) / 'arms.jsonl'}: no line for arm baseline-start of pairing p, which report.json's"
        " summary judged: the record is damaged (a file or lines lost)"), r.stderr
    # the detector stays silent on a whole record, and on the last line a crash cut short
    shutil.rmtree(record.parent)
    shutil.copytree(pristine, record.parent)
    with open(_data(record) / "p-baseline-start.jsonl", "a") as f:
        f.write('{"id": "p1", "kind": "fre')
    code, out, err = main_in_process(capsys, "records", "show", str(record))
    assert code == 0 and "verdict: diverged" in out and "baseline-start" in out, err


def test_a_ctrl_c_while_a_line_is_written_leaves_a_readable_record(tmp_path, monkeypatch):
    """Ctrl-C arriving while a part's line is being appended (before it is in the file): the record that
    the interrupted run closes counts only the lines its files hold, and reads back as interrupted."""
    from specparity.records.record import RecordSink
    from specparity.records.writer import RecordWriter

    real_append = RecordWriter.append
    calls = {"n": 0}

    def append(self: RecordWriter, arm: str, obj: dict) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt  # the signal, before the third line reached the file
        real_append(self, arm, obj)

    monkeypatch.setattr(RecordWriter, "append", append)
    with pytest.raises(KeyboardInterrupt):
        with RecordSink(tmp_path / "rec", "probe", "a probe", {"model": None}) as sink:
            for i in range(5):
                sink.append("comparisons", {"width": i, "verdict": "equal"})
    (md,) = (tmp_path / "rec").glob("probe-*.md")
    record, _, arms = read_record(md)
    assert record.status == "interrupted"
    assert record.arms == {"comparisons": 2} and len(arms["comparisons"]) == 2


def test_a_record_names_its_command_as_a_user_types_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The command a record (its markdown, its page, README's screenshot) shows is `specparity ...`, never the
    path of the console script on the machine that wrote it (issue 46 item 8)."""
    from specparity.records.record import RecordSink

    monkeypatch.setattr("sys.argv", ["/home/someone/checkout/.venv/bin/specparity", "served", "--record-dir", "r"])
    sink = RecordSink(tmp_path, "served", "served: x", {"host": "h"})
    assert sink.record.argv == ["specparity", "served", "--record-dir", "r"]
