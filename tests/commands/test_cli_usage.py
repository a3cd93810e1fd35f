"""Click's own usage errors are one ``Error:`` line and exit 2, like ours.

Before, click printed four lines (Usage / Try / blank / Error) for a bad option
value or a missing argument; ``fixtures gguf`` exited 70 for an OUT under a file
and 4 for a source that is not a checkpoint.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli


def _one_error_line(r: subprocess.CompletedProcess, code: int = 2) -> str:
    assert r.returncode == code, (r.returncode, r.stderr)
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("Error: "), r.stderr
    assert "Traceback" not in r.stderr and "Usage:" not in r.stderr
    return r.stderr.strip()


@pytest.mark.parametrize("args, message", [
    (("served", "--config", "{dir}"), "'--config'"),
    (("served", "--record-dir", "{file}"), "'--record-dir'"),
    (("e2e", "--max-tokens", "-3"), "'--max-tokens': -3"),
    (("fixtures", "gguf", "{dir}", "{dir}/x.gguf", "--outtype", "q9"), "'--outtype': 'q9'"),
    (("records", "junit", "{dir}", "--out", "{dir}"), "'--out'"),
    (("records", "junit"), "Missing argument"),
    (("records", "html", "{dir}", "--out", "{dir}"), "'--out'"),
    (("probe", "--no-such-flag"), "No such option"),
    (("no-such-command",), "No such command"),
])
def test_click_usage_errors_are_one_line_exit_2(cli_bin: str, tmp_path: Path, args: tuple[str, ...],
                                                message: str) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    argv = [a.format(dir=tmp_path, file=f) for a in args]
    assert message in _one_error_line(run_cli(cli_bin, *argv))


def test_a_group_without_its_command_still_shows_its_help(cli_bin: str) -> None:
    r = run_cli(cli_bin, "records")
    assert r.returncode == 2 and "Usage: specparity records" in r.stderr and "compare" in r.stderr


@pytest.mark.model
def test_fixtures_gguf_bad_source_and_out_under_a_file_are_usage_errors(cli_bin: str, tmp_path: Path,
                                                                        llama_pair: Any) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    # a directory that is not a checkpoint: 2, as e2e / probe say for the same input (was 4)
    assert "not a checkpoint (no config.json)" in _one_error_line(
        run_cli(cli_bin, "fixtures", "gguf", str(empty), str(tmp_path / "o.gguf")))
    e2e = run_cli(cli_bin, "e2e", "--model", str(empty))
    assert e2e.returncode == 2 and "not a checkpoint" in e2e.stderr
    # OUT under a file: 2 before any work (was 70, a NotADirectoryError)
    f = tmp_path / "file"
    f.write_text("x")
    msg = _one_error_line(run_cli(cli_bin, "fixtures", "gguf", llama_pair.target, str(f / "o.gguf")))
    assert "OUT" in msg and "not a directory" in msg
    assert f.read_text() == "x"
