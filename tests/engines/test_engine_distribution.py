"""An outside engine published as its own distribution, installed into a pinned environment (issue 45).

The test makes a wheel of the toy engine (tests/toy_engine.py, whose rollback keeps one rejected row, and its
served profile) as an engine's author would publish it: a package whose ``ENGINE`` its metadata registers in
the ``specparity.engines`` entry-point group. No ``SPECPARITY_ENGINES``, no ``PYTHONPATH``: the wheel is
installed into a pinned environment (tests/toy_engine_env.yaml, built before the tests as every environment
is), and ``probe``, ``replay``, ``bisect``, ``e2e`` and ``served`` given ``--environment`` follow it there
and name its fault; the record says which distribution and version the engine came from.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from builds import REAL_CACHE, wheel
from conftest import run_cli

from specparity import environments as envs

pytestmark = [pytest.mark.slow, pytest.mark.build, pytest.mark.model]

TESTS = Path(__file__).resolve().parents[1]
ENV_FILE = TESTS / "toy_engine_env.yaml"
DIST, VERSION = "specparity-toy-engine", "0.1.0"

PACKAGE_INIT = '''"""The toy engine, published: tests/toy_engine.py's ENGINE, its profile in this package."""
import dataclasses

from toy_engine import ENGINE as _TOY

ENGINE = dataclasses.replace(_TOY, profiles=("toy",))
'''


def toy_wheel(out: Path) -> Path:
    """The toy engine as a wheel: its module, a package holding its spec and profile, and the entry point
    ``toy = specparity_toy:ENGINE``."""
    return wheel(out, DIST, VERSION, {"toy_engine.py": (TESTS / "toy_engine.py").read_text(),
                                      "specparity_toy/__init__.py": PACKAGE_INIT,
                                      "specparity_toy/toy.yaml": (TESTS / "toy_engine.yaml").read_text()},
                 entry_points="[specparity.engines]\ntoy = specparity_toy:ENGINE\n")


@pytest.fixture(scope="module")
def toy_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[envs.Environment]:
    """The pinned environment with the toy's wheel installed (pip, offline, no dependencies: the
    environment has them), uninstalled again after the module."""
    env = envs.find_environment(envs.load_spec(str(ENV_FILE)), root=REAL_CACHE)
    if env is None:
        message = f"environment {ENV_FILE.name} is not built: run scripts/build-env tests/{ENV_FILE.name}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    wheel = toy_wheel(tmp_path_factory.mktemp("wheel"))
    pip = [str(env.python), "-m", "pip", "--disable-pip-version-check", "-q"]
    quiet = {**os.environ, "PIP_NO_INDEX": "1", "PIP_CONFIG_FILE": os.devnull}
    subprocess.run([*pip, "install", "--no-deps", "--force-reinstall", str(wheel)], check=True, env=quiet,
                   timeout=300)
    try:
        yield env
    finally:
        subprocess.run([*pip, "uninstall", "-y", DIST], env=quiet, timeout=300)


def _run(cli_bin: str, *args: str, extra: dict[str, str] | None = None) -> Any:
    # nothing points at the toy here: no SPECPARITY_ENGINES, no PYTHONPATH to tests/
    assert "SPECPARITY_ENGINES" not in os.environ and "toy_engine" not in os.environ.get("PYTHONPATH", "")
    return run_cli(cli_bin, *args, env={envs.ENV_CACHE_VAR: str(REAL_CACHE), **(extra or {})})


def test_an_engine_installed_in_an_environment_only_is_reached_there_by_every_command(
        toy_env: envs.Environment, llama_pair: Any, cli_bin: str, tmp_path: Path) -> None:
    from importlib import metadata

    assert DIST not in {d.metadata["Name"] for d in metadata.distributions()}  # not installed here
    here = _run(cli_bin, "probe", "--engine", "toy")
    assert here.returncode == 2 and "'toy' is not one of 'mlx-lm'" in here.stderr, here.stderr
    where = ("--engine", "toy", "--environment", str(ENV_FILE), "--model", llama_pair.target)
    proc = _run(cli_bin, "probe", *where, "--widths", "4", "--depths", "0", "--json", "--record-dir",
                str(tmp_path / "rec"))
    assert proc.returncode == 1, proc.stderr
    assert "specparity: toy runs in environment" in proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["engine"]["name"] == "toy"
    assert sorted(r["accepted"] for r in rep["rollbacks"] if r["verdict"] == "divergent") == [0, 1, 2]
    (ident,) = (tmp_path / "rec").rglob("identity.json")
    assert json.loads(ident.read_text())["engines"]["toy"] == f"{DIST} {VERSION}"
    proc = _run(cli_bin, "replay", *where, "--accepts", "3,3,1,2", "--width", "4", "--json")
    assert proc.returncode == 1, proc.stderr
    state = json.loads(proc.stdout)["requests"][0]["state"]
    assert (state["round"], state["accepted"]) == (2, 1)
    proc = _run(cli_bin, "bisect", *where, "--width", "4", "--accepted", "1", "--json")
    assert proc.returncode == 1, proc.stderr
    assert json.loads(proc.stdout)["first_divergent"] == "0"
    proc = _run(cli_bin, "e2e", *where, "--max-tokens", "24", "--json")
    assert proc.returncode == 1, proc.stderr
    assert [e["verdict"] for e in json.loads(proc.stdout)["entries"]] == ["diverged"]


@pytest.mark.server
def test_its_served_profile_is_found_in_that_environment(toy_env: envs.Environment, llama_pair: Any,
                                                         cli_bin: str) -> None:
    proc = _run(cli_bin, "served", "--profile", "toy", "--environment", str(ENV_FILE), "--model", llama_pair.target,
                "--draft-model", llama_pair.draft, "--widths", "4", "--max-tokens", "32", "--json")
    assert proc.returncode == 1, proc.stderr
    rep = json.loads(proc.stdout)
    arms = {a["name"]: a["verdict"] for p in rep["pairings"] for a in p["arms"]}
    assert arms["baseline-start"] == "match" and arms["w4"] == "diverged", arms
