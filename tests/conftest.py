"""Shared test fixtures: an isolated user dir, and the embedded checkpoints built once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def isolated_home(tmp_path, monkeypatch):
    """Every test gets its own SPECPARITY_HOME (gate store, digests), never the user's."""
    home = tmp_path / "specparity-home"
    monkeypatch.setenv("SPECPARITY_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def fixture_root(tmp_path_factory) -> Path:
    """One directory per test session holding every built fixture."""
    return tmp_path_factory.mktemp("fixtures")


_BUILT: dict[tuple, object] = {}


def build(root: Path, name: str, **kwargs):
    """Build (once per session) the fixture pair ``name`` under ``root``."""
    from specparity.fixtures import build_pair

    key = (str(root), name)
    if key not in _BUILT:
        _BUILT[key] = build_pair(root / name, **kwargs)
    return _BUILT[key]


@pytest.fixture(scope="session")
def llama_pair(fixture_root):
    return build(fixture_root, "llama-float32", arch="llama")


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def cli_bin() -> str:
    """The installed console script next to this interpreter."""
    import sys

    exe = Path(sys.executable).parent / "specparity"
    assert exe.exists(), f"{exe} missing: install the package (README)"
    return str(exe)


def run_cli(cli_bin: str, *args: str, env: dict | None = None, cwd: str | None = None):
    """Run the real CLI in a subprocess; returns CompletedProcess (text)."""
    import subprocess

    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    return subprocess.run([cli_bin, *args], capture_output=True, text=True, env=full_env,
                          cwd=cwd, timeout=600)


def assert_report(rep) -> dict:
    """``rep`` follows the verdict contract: Report protocol, to_dict carrying verdict and exit_code."""
    import json

    from specparity.verdicts import Report, Verdict, exit_code

    assert isinstance(rep, Report), type(rep)
    assert isinstance(rep.verdict, Verdict)
    d = rep.to_dict()
    assert d["verdict"] == rep.verdict and d["exit_code"] == rep.exit_code == exit_code(rep.verdict)
    assert json.loads(json.dumps(d, default=str))["verdict"] == rep.verdict.value
    lines = rep.lines()
    assert lines and all(isinstance(s, str) and "\n" not in s for s in lines)
    return d


def run_reproduction(cli_bin: str, command: str, cwd: str | None = None) -> tuple[int, int | None, str]:
    """Run a printed ``specparity replay ...`` reproduction; (exit code, first differing token index, output).

    The index is where the replay's answer first leaves classic decode: a sequence replay's
    ``first`` request's token, a single request's first mismatch.
    """
    import json
    import shlex

    argv = shlex.split(command)
    assert argv[:2] == ["specparity", "replay"], command
    r = run_cli(cli_bin, *argv[1:], "--json", cwd=cwd)
    try:
        out = json.loads(r.stdout)
    except ValueError:
        return r.returncode, None, r.stdout + r.stderr
    if out.get("first") is not None:
        return r.returncode, int(out["first"][1]), r.stdout
    reqs = out.get("requests") or []
    index = reqs[0].get("served_first_mismatch") if reqs else None
    return r.returncode, index, r.stdout
