"""The suite's CLI runs (tests/forkcli.py): a run forked from the zygote is the run an exec'd
process makes (exit code, stdout, stderr, working directory, environment), and a run whose outcome
a forked start could change is exec'd."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import forkcli
import pytest

TESTS = Path(__file__).resolve().parents[1]


def untimed(obj: Any) -> Any:
    """``obj`` without its clock readings (``seconds``, ``draws_per_second``)."""
    if isinstance(obj, dict):
        return {k: untimed(v) for k, v in obj.items() if k not in ("seconds", "draws_per_second")}
    if isinstance(obj, list):
        return [untimed(v) for v in obj]
    return obj


pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="CLI runs are forked on Linux only")


@pytest.fixture(scope="module")
def zygote():
    z = forkcli.Zygote()
    yield z
    z.close()


def both(zygote: forkcli.Zygote, cli_bin: str, *args: str, env: dict | None = None,
         cwd: str | None = None) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    full = {**os.environ, **(env or {})}
    forked = zygote.run([cli_bin, *args], full, cwd or os.getcwd(), 120)
    execd = subprocess.run([cli_bin, *args], capture_output=True, text=True, env=full, cwd=cwd, timeout=120)
    return forked, execd


@pytest.mark.parametrize("args", [
    ("probe", "--widths", "0"),  # a flag's error: one line, exit 2
    ("probe", "--model", "/nonexistent/model"),  # a bad path: one line, exit 2
    ("--debug", "probe", "--model", "/nonexistent/model"),  # the same with its traceback
    ("gate", "--help"),  # a page of text on stdout, exit 0
    ("dist", "--rule", "tests/sample_rules.py:mrs", "--samples", "2000", "--json"),  # a run's JSON
])
def test_a_forked_run_is_the_exec_d_run(zygote: forkcli.Zygote, cli_bin: str, args: tuple[str, ...]) -> None:
    forked, execd = both(zygote, cli_bin, *args, cwd=str(TESTS.parent))
    assert forked.returncode == execd.returncode, (forked.stderr, execd.stderr)
    assert forked.stderr == execd.stderr
    if "--json" in args:  # the same verdicts and figures (a seeded run) but for its timings
        assert untimed(json.loads(forked.stdout)) == untimed(json.loads(execd.stdout))
    else:
        assert forked.stdout == execd.stdout
    assert execd.returncode in (0, 2) and (execd.stdout or execd.stderr)


def test_a_forked_run_takes_its_working_directory_and_environment(zygote: forkcli.Zygote, cli_bin: str,
                                                                  tmp_path: Path) -> None:
    # a rule file named relative to the working directory: found from the repository root only
    rule = ("dist", "--rule", "tests/sample_rules.py:mrs", "--samples", "2000")
    assert zygote.run([cli_bin, *rule], dict(os.environ), str(TESTS.parent), 120).returncode == 0
    elsewhere = zygote.run([cli_bin, *rule], dict(os.environ), str(tmp_path), 120)
    assert elsewhere.returncode == 2 and "tests/sample_rules.py" in elsewhere.stderr
    # SPECPARITY_MAX_WIDTH, read when the widths are checked
    capped = zygote.run([cli_bin, "probe", "--widths", "3"], {**os.environ, "SPECPARITY_MAX_WIDTH": "2"},
                        str(tmp_path), 120)
    assert capped.returncode == 2 and "SPECPARITY_MAX_WIDTH" in capped.stderr, capped.stderr


def test_the_suites_runs_of_those_commands_are_forked(cli_bin: str, isolated_home: Path) -> None:
    """run_cli, inside a test (pytest sets PYTEST_CURRENT_TEST anew for each phase, conftest a home of
    the test's own), forks a probe run and execs a records run."""
    from conftest import run_cli

    before = dict(forkcli.ways)
    assert run_cli(cli_bin, "probe", "--widths", "0").returncode == 2
    assert run_cli(cli_bin, "records", "list").returncode in (0, 2)
    assert forkcli.ways["forked"] == before["forked"] + 1
    assert forkcli.ways["exec'd"] == before["exec'd"] + 1


def test_a_run_a_forked_start_could_change_is_exec_d(monkeypatch: pytest.MonkeyPatch) -> None:
    base = {"PATH": "/bin", "SPECPARITY_HOME": "/a", "PYTEST_CURRENT_TEST": "t.py::a (setup)"}
    assert forkcli.forkable(["probe"], {**base, "PYTEST_CURRENT_TEST": "t.py::b (call)"}, base)
    assert forkcli.forkable(["probe"], {**base, "SPECPARITY_HOME": "/b"}, base)  # specparity's own: read late
    assert not forkcli.forkable(["probe"], {**base, "HF_HUB_OFFLINE": "1"}, base)  # read at import
    assert not forkcli.forkable(["probe"], {**base, "PYTHONPATH": "/x"}, base)  # read at start-up
    assert not forkcli.forkable(["probe"], {k: v for k, v in base.items() if k != "PATH"}, base)
    assert not forkcli.forkable(["probe"], {**base, "SPECPARITY_TEST_IMPORT_TABLES": ""}, base)
    for command in ("records", "served", "serve", "env", "--version"):  # no mlx there, or their own start
        assert not forkcli.forkable([command], base, base), command
    monkeypatch.setenv("SPECPARITY_TEST_EXEC", "1")
    assert not forkcli.forkable(["probe"], base, base)

