"""The version-matrix night: scripts/nightly-parity --matrix runs one job per pinned environment and
compares the records (examples/nightly-matrix.yaml), on real mlx-lm servers of two versions."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from specparity.environments import ENV_CACHE_VAR

from test_environments import REAL_CACHE, built

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "nightly-parity"
ENVS = ("mlx-lm-0.31.3", "mlx-lm-0.32.2")


def nightly(cli_bin: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SPECPARITY": cli_bin, ENV_CACHE_VAR: str(REAL_CACHE)}
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=900)


def _config(tmp_path: Path, pair: Any) -> Path:
    cfg = tmp_path / "matrix.yaml"
    cfg.write_text(yaml.safe_dump({
        "pairings": [{"name": "p", "target": pair.target, "draft": pair.draft}], "profile": "mlx-lm",
        "widths": [3], "max_tokens": 16, "sequence": ["fresh", "multi-turn"]}))
    return cfg


@pytest.mark.slow
@pytest.mark.build
@pytest.mark.server
@pytest.mark.model
def test_a_matrix_night_writes_a_record_per_environment_and_compares_them(cli_bin: str, llama_pair: Any,
                                                                          tmp_path: Path) -> None:
    for name in ENVS:
        built(name)
    out = tmp_path / "records"
    run = nightly(cli_bin, str(_config(tmp_path, llama_pair)), "--matrix", ",".join(ENVS), "--out", str(out),
                  "--junit", str(tmp_path / "parity.xml"), "--quiet")
    assert run.returncode in (0, 1), run.stderr  # 1 only for a divergence or a request the version regressed
    records = [next((out / e).glob("*.md")) for e in ENVS]
    assert all((tmp_path / f"parity-{e}.xml").is_file() for e in ENVS)
    assert f"records compare {records[0]} {records[1]} ({ENVS[0]} -> {ENVS[1]})" in run.stderr
    # the same parts on both sides (pairing, arms, requests), and the one package that differs
    assert "compare served records: " in run.stdout and "coverage: 0" in run.stdout
    assert "p environment mlx-lm: 0.31.3 -> 0.32.2" in run.stdout
    assert "mlx-lm server version: mlx-lm 0.31.3 -> mlx-lm 0.32.2" in run.stdout
    assert "environment mlx:" not in run.stdout and "environment transformers:" not in run.stdout
    assert f"nightly-parity: matrix {' '.join(ENVS)}: records " in run.stderr


def test_matrix_bad_input_is_one_line_and_exit_2(cli_bin: str, tmp_path: Path) -> None:
    cfg = tmp_path / "job.yaml"
    cfg.write_text("widths: [2]\n")
    for args, message in ((["--matrix", "mlx-lm-0.31.3"], "give two environments or more"),
                          (["--matrix", "a,b", "--environment", "a"], "give one"),
                          (["--matrix", "a,b", "--previous", str(cfg)], "compares its own environments"),
                          (["--matrix", "a,../b"], "is not an environment name")):
        run = nightly(cli_bin, str(cfg), *args)
        assert run.returncode == 2 and run.stderr.startswith("Error: ") and message in run.stderr, run.stderr


def test_matrix_refuses_an_existing_junit_file_of_any_environment(cli_bin: str, tmp_path: Path) -> None:
    """--junit parity.xml writes parity-ENV.xml per environment: each is checked before any job runs."""
    cfg = tmp_path / "job.yaml"
    cfg.write_text("widths: [2]\n")
    (tmp_path / "parity-b.xml").write_text("last night's")
    out = tmp_path / "records"
    run = nightly(cli_bin, str(cfg), "--matrix", "a,b", "--junit", str(tmp_path / "parity.xml"), "--out", str(out))
    assert run.returncode == 2, run.stderr
    assert run.stderr.strip() == f"Error: --junit {tmp_path / 'parity-b.xml'}: exists (pass --force to overwrite it)"
    assert not out.exists() and not (tmp_path / "parity-a.xml").exists()
    assert (tmp_path / "parity-b.xml").read_text() == "last night's"
