"""The version-matrix night's bad input, and every example job under examples/ loads as the served job reads it.
The night itself (scripts/nightly-parity --matrix: one job per pinned environment, records compared, on real
mlx-lm servers of two versions) runs once, as docs/nightly.md types it: tests/matrix_night.py checks what it
wrote (tests/docs/conftest.py AFTER)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from specparity.environments import ENV_CACHE_VAR

from builds import REAL_CACHE

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "nightly-parity"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def nightly(cli_bin: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SPECPARITY": cli_bin, ENV_CACHE_VAR: str(REAL_CACHE)}
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=900)


def test_matrix_bad_input_is_one_line_and_exit_2(cli_bin: str, tmp_path: Path) -> None:
    cfg = tmp_path / "job.yaml"
    cfg.write_text("widths: [2]\n")
    for args, message in ((["--matrix", "mlx-lm-0.31.3"], "give two environments or more"),
                          (["--matrix", "a,b", "--environment", "a"], "give one"),
                          (["--matrix", "a,b", "--previous", str(cfg)], "compares its own environments"),
                          (["--matrix", "a,../b"], "is not an environment name")):
        run = nightly(cli_bin, str(cfg), *args)
        assert run.returncode == 2 and run.stderr.startswith("Error: ") and message in run.stderr, run.stderr


@pytest.mark.model
def test_every_example_job_loads_as_served_reads_it(llama_pair: Any, isolated_home: Path) -> None:
    """Each examples/*.yaml through the job loader and its profiles; the DFlash example's pairings are the
    folders its header's `fixtures make --dflash` lines build, each pair in the shape its name says."""
    from specparity.harness.config import load_job
    from specparity.harness.profiles import load_profile

    # the examples without pairings run on the embedded default pair: the session's, not built again
    (isolated_home / "fixtures").mkdir(parents=True)
    (isolated_home / "fixtures" / "default-llama-float32").symlink_to(Path(llama_pair.target).parent)
    jobs = {f.name: load_job(f) for f in sorted(EXAMPLES.glob("*.yaml"))}
    assert {"nightly.yaml", "nightly-llama.yaml", "nightly-dflash.yaml", "nightly-matrix.yaml"} <= set(jobs)
    for name, job in jobs.items():
        for pairing in job.pairings:
            assert load_profile(pairing.profile).name == pairing.profile, name
    matrix = jobs["nightly-matrix.yaml"]
    assert [(p.name, p.profile, p.environment) for p in matrix.pairings] == [("embedded-llama", "mlx-lm", None)]
    assert matrix.widths == [2, 3, 4] and matrix.max_tokens == 32
    assert matrix.sequence == ["fresh", "repeat", "shared-prefix", "stream", "multi-turn"]
    assert [p.profile for p in jobs["nightly-llama.yaml"].pairings] == ["llama.cpp"]
    dflash = jobs["nightly-dflash.yaml"]
    assert {p.profile for p in dflash.pairings} == {"dflash-mlx"} and dflash.widths == [2, 4, 8]
    # the header's commands, continuation lines joined
    header = " ".join(ln.lstrip("#").strip() for ln in (EXAMPLES / "nightly-dflash.yaml").read_text().splitlines()
                      if ln.startswith("#")).replace("\\ ", "")
    made = {}
    for cmd in re.findall(r"specparity fixtures make (.+?)(?= scripts/| specparity |$)", header):
        argv = shlex.split(cmd)
        made[str((EXAMPLES.parent / argv[0]).resolve())] = argv[1:]
    assert len(made) == 2, made
    for p in dflash.pairings:
        folder = str(Path(p.target).parent)
        assert p.target == folder + "/target" and p.draft == folder + "/draft", p
        assert folder in made, f"{p.name}: no `fixtures make` line in the header builds {folder}"
        args, block = made[folder], re.search(r"-b(\d+)", p.name)
        assert args[0] == "--dflash" and block and args[args.index("--block-size") + 1] == block.group(1), args


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
