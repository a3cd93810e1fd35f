"""What the version-matrix night of docs/nightly.md finds, checked on what that documented line itself wrote.

``scripts/nightly-parity examples/nightly-matrix.yaml --matrix mlx-lm-0.31.3,mlx-lm-0.32.2 --out matrix`` runs
two nights of real mlx-lm servers (2 minutes on 2 cores). The docs' test runs it as a reader types it and then
calls :func:`check` on its folder and output, so the suite runs that night once, not once per test.

mlx-lm 0.32.2 fixed one request and regressed none: w4 / chat-2, whose 32 token ids are the same in every arm on
both versions. mlx-lm 0.31.3's server without a drafter (the baseline) drops the last, partial UTF-8 byte of that
answer (a U+FFFD its drafter arm and 0.32.2, with or without a drafter, keep), so its drafted arm differs from its
baseline by that character: served parity compares text, so 0.31.3's w4 / chat-2 is a divergence (told apart as
text only), and 0.32.2's a match. Every other warm-cache request (a repeat, a shared prefix, a second chat turn)
of a drafted arm diverges on both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

ENVS = ("mlx-lm-0.31.3", "mlx-lm-0.32.2")
# a drafted arm's warm-cache requests (a repeat, a shared prefix, a second chat turn) leave classic decode at
# every width, on both versions
WARM = ("p0-again", "p0-prefix", "chat-2")


def _rows(record: Path, arm: str) -> dict[str, dict[str, Any]]:
    """One arm's request lines of a served record, by request id."""
    from specparity.records.served import read_served

    return {r["id"]: r for r in read_served(record).rows[f"embedded-llama-{arm}"]}


def check(out: Path, stdout: str, stderr: str) -> None:
    """Assert what the matrix night (exit 1: both nights diverge) wrote under ``out`` and printed."""
    old, new = (next((out / e).glob("*.md")) for e in ENVS)
    # the script names the records as the reader's --out did (relative to where it ran)
    named = f"records compare {old.relative_to(out.parent)} {new.relative_to(out.parent)} ({ENVS[0]} -> {ENVS[1]})"
    assert named in stderr, stderr
    # what records compare lists: nothing regressed, one request fixed, nothing else changed
    assert "compare served records: " in stdout and "coverage: 0" in stdout, stdout
    assert "regressed: 0" in stdout and "changed: 0" in stdout, stdout
    fixed = stdout.split("fixed (1):\n", 1)[1].splitlines()[0].strip()
    assert fixed == "embedded-llama / w4 / chat-2: diverged -> match (width 4, first divergence at token 32, char 50)"
    assert "embedded-llama environment mlx-lm: 0.31.3 -> 0.32.2" in stdout
    assert "environment mlx:" not in stdout and "environment transformers:" not in stdout
    assert f"nightly-parity: matrix {' '.join(ENVS)}: records " in stderr
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
    # each server's version command
    assert "mlx-lm server version: mlx-lm 0.31.3 -> mlx-lm 0.32.2" in stdout
    environments(old, new)


def environments(old: Path, new: Path) -> None:
    """Each night's findings are reproduced and diagnosed on the mlx-lm its servers ran: 0.31.3's in its pinned
    environment (its replays name it; this interpreter runs 0.32.2), 0.32.2's here; the printed replay of one
    reproduces it as served (exit 1)."""
    import json
    import shlex
    import subprocess
    import sys

    from specparity.records.served import read_diagnoses

    for record, env in ((old, "mlx-lm-0.31.3"), (new, None)):
        _, lines = read_diagnoses(record)
        got = {line["finding"]: line["diagnosis"] for line in lines}
        drafted = {f"embedded-llama/{arm}/{rid}" for arm in ("w2", "w3", "w4") for rid in WARM}
        assert drafted - {"embedded-llama/w4/chat-2"} <= set(got), (record, sorted(got))
        for fid, d in got.items():
            step1 = d["steps"][0]
            command = step1["command"]
            assert command.startswith("specparity replay --sequence "), (fid, command)
            assert (shlex.split(command)[-2:] == ["--environment", env]) if env else "--environment" not in command
            if fid.endswith(("/p0-again", "/p0-prefix")):  # a warm prompt cache one position short, both versions
                assert d["phase"] == "server cache" and step1["verdict"] == "divergent", (fid, d["summary"])
            if env:
                assert step1["evidence"][0] == f"run in environment {env}, on the mlx-lm its servers ran", step1
    repro = _rows(old, "w2")["p0-again"]["reproduction"]["command"]
    words = shlex.split(repro)
    assert words[0] == "specparity"  # run as printed, by this checkout's entry point
    cli = str(Path(sys.executable).parent / "specparity")
    proc = subprocess.run([cli, *words[1:]], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1 and "verdict: divergent" in proc.stdout, (repro, proc.stdout[-2000:], proc.stderr)
    # `diagnose` as a user types it on the older night's record: the same finding, diagnosed in its environment
    proc = subprocess.run([cli, "diagnose", str(old), "--finding", "w2/p0-again", "--json"], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 1, proc.stderr[-2000:]
    (d,) = json.loads(proc.stdout)["diagnoses"]
    assert d["phase"] == "server cache" and d["steps"][0]["command"] == repro, d["summary"]
    assert d["steps"][0]["evidence"][0] == "run in environment mlx-lm-0.31.3, on the mlx-lm its servers ran"
    releases = d["steps"][7]["data"]["releases"]
    assert [(r["environment"], r["verdict"]) for r in releases] == [
        ("mlx-lm-0.31.3", "divergent"), ("mlx-lm-0.32.2", "divergent")], releases
