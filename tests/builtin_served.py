"""What README's built-in served job finds, checked on the record that documented line wrote.

``specparity served --record-dir results`` (no --config: the embedded pair on mlx_lm.server, request sequences
included) starts six servers. The docs' test runs it as a reader types it and then calls :func:`check` on its
record (tests/docs/conftest.py's AFTER), so the suite runs that job once, not once more for a test of its own.

What it finds with mlx-lm 0.32.2 (pinned here so a change is noticed): fresh, streamed and first-turn requests
equal classic decode at every width; on a drafter server the repeat, the shared prefix and (at width 2 and
self-draft) the second chat turn leave classic decode, only with the drafter and only on a warm cache (its prompt
cache files an entry one position short of its key). Every printed reproduction, run, exits 1 at the served token.
"""

from __future__ import annotations

import json
from pathlib import Path


def check(out: Path, stdout: str, stderr: str) -> None:
    """Assert what the built-in job (exit 1) wrote under ``out`` (its --record-dir) and printed."""
    import sys

    from reproductions import check_reproductions

    from specparity.records.served import read_served

    (record,) = out.glob("served-*.md")
    data = out / "data" / record.stem
    summary = json.loads((data / "report.json").read_text())["summary"]
    assert summary["verdict"] == "diverged" and summary["exit_code"] == 1, summary["verdict"]
    (p,) = summary["pairings"]
    arms = {a["name"]: a for a in p["arms"]}
    assert set(arms) == {"baseline-start", "w2", "w4", "self-draft", "concurrent", "baseline-end"}
    kinds = {"p0", "p0-again", "p0-prefix", "p1-stream", "chat-1", "chat-2"}
    assert set(arms["w2"]["verdicts"]) == kinds
    off = {name: {rid for rid, v in a["verdicts"].items() if v != "match"} for name, a in arms.items()}
    assert off == {"baseline-start": set(), "concurrent": set(), "baseline-end": set(),
                   "w2": {"p0-again", "p0-prefix", "chat-2"}, "w4": {"p0-again", "p0-prefix"},
                   "self-draft": {"p0-again", "p0-prefix", "chat-2"}}, off
    for rid in ("p0-again", "p0-prefix", "chat-2"):
        scope = next(f for f in p["findings"] if f" {rid} (" in f and "differs from classic decode" in f)
        assert "only with the drafter; only on a warm cache in " in scope, scope
        assert (f"reproduce in process: specparity replay --sequence {out.resolve()}/data/{record.stem}/servers/"
                f"embedded-llama/sequences/sequence-w2-{rid}.jsonl") in stdout, rid  # every w2 finding's, as printed
    rows = [json.loads(line) for line in (data / "embedded-llama-w2.jsonl").open()]
    d = next(x for x in rows if x["id"] == "p0-prefix")["divergence"]
    assert d["char_offset"] >= 0 and (d["reference_snippet"] or d["other_snippet"])
    assert any(x["evidence"]["engaged"] for x in rows)
    assert (data / "servers" / "embedded-llama" / "server-w2.log").exists()
    cli_bin = str(Path(sys.executable).parent / "specparity")
    ran = check_reproductions(read_served(record).report(), cli_bin)
    assert len(ran) == 8 and all(x.command and "--sequence" in x.command for x in ran)
