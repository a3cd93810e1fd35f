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
