"""The version-matrix night: scripts/nightly-parity --matrix runs one job per pinned environment and
compares the records (examples/nightly-matrix.yaml), on real mlx-lm servers of two versions; and every
example job under examples/ loads as the served job reads it."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from specparity.environments import ENV_CACHE_VAR

from builds import REAL_CACHE, built

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "nightly-parity"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ENVS = ("mlx-lm-0.31.3", "mlx-lm-0.32.2")


def nightly(cli_bin: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SPECPARITY": cli_bin, ENV_CACHE_VAR: str(REAL_CACHE)}
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=900)


def _rows(record: Path, arm: str) -> dict[str, dict[str, Any]]:
    """One arm's request lines of a served record, by request id."""
    from specparity.records.served import read_served

    return {r["id"]: r for r in read_served(record).rows[f"embedded-llama-{arm}"]}


# what the example's night finds on the embedded pair, on both versions: a drafted arm's warm-cache
# requests (a repeat, a shared prefix, a second chat turn) leave classic decode at every width
WARM = ("p0-again", "p0-prefix", "chat-2")


@pytest.mark.slow
@pytest.mark.build
@pytest.mark.server
@pytest.mark.model
def test_the_example_matrix_night_fixes_one_request_with_the_version_and_regresses_none(
        cli_bin: str, llama_pair: Any, isolated_home: Path, tmp_path: Path) -> None:
    """examples/nightly-matrix.yaml as README runs it. mlx-lm 0.32.2 fixed one request and regressed none:
    w4 / chat-2, whose 32 token ids are the same in every arm on both versions. mlx-lm 0.31.3's server without
    a drafter (the baseline) drops the last, partial UTF-8 byte of that answer (a U+FFFD its drafter arm and
    0.32.2, with or without a drafter, keep), so its drafted arm differs from its baseline by that character:
    served parity compares text, so 0.31.3's w4 / chat-2 is a divergence, and 0.32.2's a match. Every other
    warm-cache request (a repeat, a shared prefix, a second chat turn) of a drafted arm diverges on both."""
    for name in ENVS:
        built(name)
    # the example runs on the embedded default pair: the session's (the same build), not built again
    (isolated_home / "fixtures").mkdir(parents=True)
    (isolated_home / "fixtures" / "default-llama-float32").symlink_to(Path(llama_pair.target).parent)
    out = tmp_path / "records"
    run = nightly(cli_bin, str(EXAMPLES / "nightly-matrix.yaml"), "--matrix", ",".join(ENVS), "--out", str(out),
                  "--junit", str(tmp_path / "parity.xml"), "--quiet")
    assert run.returncode == 1, run.stderr  # both nights diverge (the warm-cache requests)
    old, new = (next((out / e).glob("*.md")) for e in ENVS)
    assert f"records compare {old} {new} ({ENVS[0]} -> {ENVS[1]})" in run.stderr
    # what records compare lists: nothing regressed, one request fixed, nothing else changed
    assert "compare served records: " in run.stdout and "coverage: 0" in run.stdout
    assert "regressed: 0" in run.stdout and "changed: 0" in run.stdout
    fixed = run.stdout.split("fixed (1):\n", 1)[1].splitlines()[0].strip()
    assert fixed == "embedded-llama / w4 / chat-2: diverged -> match (width 4, first divergence at token 32, char 50)"
    assert "embedded-llama environment mlx-lm: 0.31.3 -> 0.32.2" in run.stdout
    assert "environment mlx:" not in run.stdout and "environment transformers:" not in run.stdout
    assert f"nightly-parity: matrix {' '.join(ENVS)}: records " in run.stderr
    # each night: the warm-cache requests of every drafted arm diverge, w4 / chat-2 only on 0.31.3
    for record, spared in ((old, set()), (new, {("w4", "chat-2")})):
        for arm in ("w2", "w3", "w4"):
            rows = _rows(record, arm)
            diverged = {rid for rid, r in rows.items() if r["verdict"] == "diverged"}
            assert diverged == {rid for rid in WARM if (arm, rid) not in spared}, (record, arm)
            assert all(r["verdict"] == "match" for rid, r in rows.items() if rid not in diverged)
    # the same token ids, other text: 0.31.3's baseline dropped the last partial byte, its w4 kept it
    base, w4 = _rows(old, "baseline-start")["chat-2"], _rows(old, "w4")["chat-2"]
    base_new, w4_new = _rows(new, "baseline-start")["chat-2"], _rows(new, "w4")["chat-2"]
    ids = w4["completion"]["token_ids"]
    assert len(ids) == 32 and all(r["completion"]["token_ids"] == ids for r in (base, base_new, w4_new))
    assert w4["text"] == base["text"] + "\ufffd" == w4_new["text"] == base_new["text"]
    d = w4["divergence"]
    assert (d["token_index"], d["reference_token_count"], d["other_token_count"], d["char_offset"]) == (32, 32, 32, 50)
    # told apart from a token divergence (issue 46): text only, with the drafter (its baseline writes classic
    # decode's text), so still a finding of the served text
    assert d["detokenization"] and w4["reason"].startswith("text only, with the drafter: "), w4["reason"]
    # each server's version command (30 s; it timed out once on a machine at load 9.5 on 2 cores)
    assert "mlx-lm server version: mlx-lm 0.31.3 -> mlx-lm 0.32.2" in run.stdout


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
