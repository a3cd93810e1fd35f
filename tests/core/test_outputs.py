"""Every output location is checked before any work starts.

Nothing that exists is overwritten without --force; a record directory that
cannot be created fails the run before the model is loaded.
"""

from __future__ import annotations

import hashlib
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
