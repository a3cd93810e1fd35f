"""Every output location is checked before any work starts.

Nothing that exists is overwritten without --force; a record directory that
cannot be created fails the run before the model is loaded.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli
from served_records import served_record as _served_record

from specparity.errors import UsageError
from specparity.outputs import check_new_file, check_record_dir

FAST = ("--widths", "2", "--depths", "0", "--walk", "0", "--no-prefill")


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_check_record_dir_both_ways(tmp_path):
    assert check_record_dir(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert not (tmp_path / "a").exists()  # checked, not created
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(UsageError, match="exists and is not a directory"):
        check_record_dir(f)
    with pytest.raises(UsageError, match="cannot be created"):
        check_record_dir(f / "sub")
    with pytest.raises(UsageError, match="cannot be created"):
        check_record_dir("/proc/specparity-no-such-dir")


def test_check_new_file_both_ways(tmp_path):
    out = tmp_path / "x.jsonl"
    assert check_new_file(out, "--save-log") == out
    out.write_text("keep")
    with pytest.raises(UsageError, match=r"--save-log .*x.jsonl: exists \(pass --force"):
        check_new_file(out, "--save-log")
    assert check_new_file(out, "--save-log", force=True) == out
    with pytest.raises(UsageError, match="is a directory"):
        check_new_file(tmp_path, "--out", force=True)
    with pytest.raises(UsageError, match="does not exist"):
        check_new_file(tmp_path / "no" / "x", "--out")
    man = tmp_path / "d.json"
    man.write_text("{}")
    with pytest.raises(UsageError, match="d.json: exists"):
        check_new_file(tmp_path / "d.safetensors", "--out", also=(man,))


@pytest.mark.model
@pytest.mark.parametrize("record_dir", ["/etc/passwd/x", "/proc/specparity-records"])
def test_record_dir_fails_before_the_run(cli_bin, llama_pair, record_dir):
    r = run_cli(cli_bin, "probe", "--model", llama_pair.target, *FAST, "--record-dir", record_dir)
    assert r.returncode == 2 and r.stderr.startswith("Error: --record-dir"), r.stderr
    assert r.stdout == "" and r.stderr.count("\n") == 1  # no probe ran


@pytest.mark.model
def test_record_dir_that_can_be_created_is_used(cli_bin, llama_pair, tmp_path):
    rec = tmp_path / "a" / "b"
    r = run_cli(cli_bin, "probe", "--model", llama_pair.target, *FAST, "--record-dir", str(rec))
    assert r.returncode == 0, r.stderr
    assert list(rec.glob("probe-*.md"))


@pytest.mark.model
def test_save_log_exists_fails_before_recording_and_force_overwrites(cli_bin, llama_pair,
                                                                       tmp_path):
    log = tmp_path / "run.jsonl"
    log.write_text("keep me\n")
    args = ("replay", "--model", llama_pair.target, "--draft-model", llama_pair.draft,
            "--max-tokens", "8", "--save-log", str(log))
    r = run_cli(cli_bin, *args)
    assert r.returncode == 2 and "exists (pass --force" in r.stderr
    assert "recording" not in r.stderr and log.read_text() == "keep me\n"
    r = run_cli(cli_bin, *args, "--force")
    assert r.returncode == 0, r.stderr
    assert '"specparity.accepts/1"' in log.read_text()


@pytest.mark.model
def test_dump_never_overwrites_a_checkpoint_file(cli_bin, llama_pair, tmp_path):
    import shutil

    victim = tmp_path / "ckpt"
    shutil.copytree(llama_pair.target, victim)
    weights = victim / "model.safetensors"
    before = _sha(weights)
    args = ("bisect", "dump", "--model", llama_pair.target, "--width", "2", "--out", str(weights))
    r = run_cli(cli_bin, *args)
    assert r.returncode == 2 and "model.safetensors: exists (pass --force" in r.stderr
    assert _sha(weights) == before
    # the manifest (FILE.json) is checked too
    out = tmp_path / "a.safetensors"
    (tmp_path / "a.json").write_text("{}")
    r = run_cli(cli_bin, "bisect", "dump", "--model", llama_pair.target, "--width", "2", "--out",
                str(out))
    assert r.returncode == 2 and "a.json: exists" in r.stderr and not out.exists()
    r = run_cli(cli_bin, "bisect", "dump", "--model", llama_pair.target, "--width", "2", "--out",
                str(out), "--force")
    assert r.returncode == 0, r.stderr
    assert out.exists()


def test_fixtures_make_checks_its_out_dir_first(cli_bin, tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    r = run_cli(cli_bin, "fixtures", "make", str(f / "fx"))
    assert r.returncode == 2 and "is not a directory" in r.stderr and r.stderr.count("\n") == 1
    r = run_cli(cli_bin, "fixtures", "make", "/proc/specparity-fx")
    assert r.returncode == 2 and r.stderr.startswith("Error: OUT_DIR's parent /proc: cannot write")


# -- issue 20, class 7: no output is overwritten silently, nor a link's target written through ----


@pytest.mark.model
@pytest.mark.parametrize("command", ["junit", "html", "gguf"])
def test_existing_output_and_a_link_are_refused_and_force_replaces_the_name(cli_bin: str, llama_pair: Any,
                                                                             tmp_path: Path, command: str) -> None:
    record = _served_record(tmp_path / "rec")

    def run(out: Path, *extra: str) -> subprocess.CompletedProcess:
        if command in ("junit", "html"):
            return run_cli(cli_bin, "records", command, str(record), "--out", str(out), *extra)
        return run_cli(cli_bin, "fixtures", "gguf", llama_pair.target, str(out), *extra)

    flag = "--out" if command in ("junit", "html") else "OUT"
    existing = tmp_path / "existing.out"
    existing.write_text("keep me")
    r = run(existing)
    assert r.returncode == 2 and r.stderr.startswith(f"Error: {flag} ") and "exists (pass --force" in r.stderr
    assert r.stderr.count("\n") == 1 and existing.read_text() == "keep me"
    # a link to a file elsewhere: refused, and --force replaces the link, never its target
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    link = tmp_path / "link.out"
    link.symlink_to(victim)
    r = run(link)
    assert r.returncode == 2 and "exists as a link (pass --force" in r.stderr and victim.read_text() == "precious"
    r = run(link, "--force")
    assert r.returncode == 0, r.stderr
    assert victim.read_text() == "precious" and not link.is_symlink() and link.stat().st_size > 100
    r = run(existing, "--force")
    assert r.returncode == 0, r.stderr
    assert existing.read_bytes() != b"keep me"
    # under a file: one line, exit 2, before anything is read or written
    r = run(existing / "sub" / "x.out")
    assert r.returncode == 2 and "is not a directory" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    # a missing folder is created, as the help says
    r = run(tmp_path / "new" / "dir" / "x.out")
    assert r.returncode == 0 and (tmp_path / "new" / "dir" / "x.out").exists(), r.stderr


# -- issue 44, class 1: nothing written through or replaced; one writer claims a name ----------------


def _beside(folder: Path) -> dict[str, bytes]:
    """Every file in ``folder`` (links followed), by name: what a run must leave as it was."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_a_page_never_writes_through_what_sits_beside_its_output(cli_bin: str, tmp_path: Path) -> None:
    """A symbolic link, a hard link and a folder at the names a writer might pick for its temporary file
    (the old fixed ``.NAME.tmp`` among them): the page is written, each of them and the files they reach
    are left byte for byte, and no temporary file is left behind."""
    record = _served_record(tmp_path / "rec")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (out_dir / ".page.html.tmp").symlink_to(victim)
    os.link(victim, out_dir / ".page.html.tmp.html")
    (out_dir / ".page.html.part").mkdir()
    before = _beside(out_dir)
    r = run_cli(cli_bin, "records", "html", str(record), "--out", str(out_dir / "page.html"))
    assert r.returncode == 0, r.stderr
    assert victim.read_text() == "precious" and _beside(out_dir) == {**before, "page.html": ANY_BYTES}
    assert (out_dir / "page.html").read_bytes().startswith(b"<!DOCTYPE html>")
    assert sorted(p.name for p in out_dir.iterdir()) == sorted([*before, ".page.html.part", "page.html"])
    # --force replaces the page itself: the links beside it still reach what they reached
    r = run_cli(cli_bin, "records", "html", str(record), "--out", str(out_dir / "page.html"), "--force")
    assert r.returncode == 0 and victim.read_text() == "precious", r.stderr


class _Any:
    def __eq__(self, other: object) -> bool:
        return isinstance(other, bytes) and len(other) > 0


ANY_BYTES: Any = _Any()


@pytest.mark.parametrize("command", ["html", "junit"])
def test_two_writers_of_one_output_never_both_succeed(cli_bin: str, tmp_path: Path, command: str) -> None:
    """Real concurrent runs aimed at one --out without --force: exactly one writes the file (exit 0), every
    other says it exists (exit 2, one line), and no temporary file is left; repeated to reach the race."""
    record = _served_record(tmp_path / "rec")
    for attempt in range(4):
        out = tmp_path / f"race-{attempt}" / "page.out"
        procs = [subprocess.Popen([cli_bin, "records", command, str(record), "--out", str(out)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
        results = [(p.wait(timeout=120), p.stderr.read() if p.stderr else "") for p in procs]
        for p in procs:
            for stream in (p.stdout, p.stderr):
                if stream:
                    stream.close()
        codes = sorted(code for code, _ in results)
        assert codes == [0, 2, 2], results
        for code, err in results:
            if code == 2:
                assert err.count("\n") == 1 and "exists" in err and "--force" in err, err
        assert [p.name for p in out.parent.iterdir()] == ["page.out"]


def test_an_output_name_past_the_file_name_limit_is_refused_at_the_check(cli_bin: str, tmp_path: Path) -> None:
    """A name the file system takes (255 bytes) is written; one byte more is refused before anything is read,
    exit 2 naming --out, and nothing (not even an empty temporary file) is left in the folder."""
    record = _served_record(tmp_path / "rec")
    folder = tmp_path / "names"
    folder.mkdir()
    longest = folder / ("p" * 250 + ".html")
    r = run_cli(cli_bin, "records", "html", str(record), "--out", str(longest))
    assert r.returncode == 0 and longest.stat().st_size > 0, r.stderr
    too_long = folder / ("q" * 251 + ".html")
    r = run_cli(cli_bin, "records", "html", str(record), "--out", str(too_long))
    assert r.returncode == 2 and r.stderr.startswith("Error: --out ") and "256 bytes" in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1
    assert [p.name for p in folder.iterdir()] == [longest.name]


def test_new_files_claims_a_name_once_and_leaves_nothing_on_failure(tmp_path: Path) -> None:
    """The one writer (specparity.store.new_files): without force a name is claimed by a hard link (an
    existing name, a dangling link included, is refused and kept); a writer that raises leaves no file; a
    later claim that fails removes the earlier target it created."""
    from specparity.store import new_files, write_new

    target = tmp_path / "a.txt"
    write_new(target, "one")
    with pytest.raises(UsageError, match="exists"):
        write_new(target, "two")
    assert target.read_text() == "one"
    dangling = tmp_path / "dangling.txt"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(UsageError, match="exists"):
        write_new(dangling, "x")
    assert not (tmp_path / "nowhere").exists() and dangling.is_symlink()
    write_new(dangling, "replaced", force=True)
    assert not dangling.is_symlink() and dangling.read_text() == "replaced"
    with pytest.raises(RuntimeError):
        with new_files([tmp_path / "b.txt"]) as (tmp,):
            tmp.write_text("half")
            raise RuntimeError("the writer failed")
    (tmp_path / "c.json").write_text("kept")
    with pytest.raises(UsageError, match="c.json: exists"):
        with new_files([tmp_path / "c.bin", tmp_path / "c.json"]) as (a, b):
            a.write_text("data")
            b.write_text("manifest")
    assert (tmp_path / "c.json").read_text() == "kept" and not (tmp_path / "c.bin").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "c.json", "dangling.txt"]


def test_a_records_placeholder_is_replaced_without_writing_through_a_link_beside_it(tmp_path: Path) -> None:
    """A record's markdown and report.json are replaced by rename: a link at the old fixed temporary names
    (``NAME.md.tmp`` in the user's folder, ``report.json.tmp`` in the record's) reaches a file left as it was."""
    from dataclasses import dataclass

    from specparity.records.record import RecordSink
    from specparity.verdicts import ReportMixin, Verdict

    @dataclass
    class Done(ReportMixin):
        verdict: Verdict = Verdict.EQUAL

        def to_dict(self) -> dict[str, Any]:
            return {"verdict": str(self.verdict), "exit_code": self.exit_code}

        def lines(self) -> list[str]:
            return []

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    sink = RecordSink(tmp_path / "records", "probe", "probe: test", {"host": "h"}, argv=["specparity", "probe"])
    assert sink.writer is not None
    md = sink.writer.md_path
    md.with_suffix(".md.tmp").symlink_to(victim)
    (sink.writer.data_dir / "report.json.tmp").symlink_to(victim)
    sink.append("cells", {"width": 2})
    sink.finish(Done(), ["all equal"])
    assert victim.read_text() == "precious"
    assert "all equal" in md.read_text() and not md.is_symlink()
    assert '"status": "complete"' in (sink.writer.data_dir / "report.json").read_text()


@pytest.mark.parametrize("args", [("--help",), ("fixtures", "formats"), ("fixtures", "formats", "--json"),
                                  ("env", "list")])
def test_a_stdout_its_reader_closed_is_one_line_and_exit_4_never_a_bug(cli_bin: str, args: tuple[str, ...]) -> None:
    """`specparity ... | head`: the reader ends before the output is written. Click turns the EPIPE into
    SystemExit(1), which read as a bug (exit 70, "unexpected SystemExit(1) raised by code specparity ran")."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first byte: the first write fails, every time
    try:
        proc = subprocess.run([cli_bin, *args], stdout=write, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert proc.returncode == 4, proc.stderr
    assert proc.stderr == ("Error: stdout was closed before the output was all written (its reader ended: `| head`?);"
                           " the output is cut short\n")
    # the same command with a reader: its output, exit 0
    whole = subprocess.run([cli_bin, *args], capture_output=True, text=True, timeout=120)
    assert whole.returncode == 0 and whole.stdout and not whole.stderr, whole.stderr
