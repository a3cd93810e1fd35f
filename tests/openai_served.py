"""What docs/engines.md's served mlx-openai-server job finds, checked on the record that documented line wrote.

``specparity served --profile mlx-openai-server --model ./fx/llama/target --draft-model ./fx/llama/draft --widths
2,4 --max-tokens 16 --concurrency 0 --record-dir runs`` starts five of its servers (a minute or two on 2 cores). The
docs' test runs it as a reader types it and then calls :func:`check` on its record and output (tests/docs/conftest.py's
AFTER), so the suite runs that job once, not once per test.

Its chat prompt is mlx_lm.server's (the profile's template file): every completion's prompt token count equals
classic decode's. The baselines (its batcher) match everywhere; width 4 matches on every request, each reusing the
cache at the offset it reports; the target drafting for itself (width 4, every draft accepted: each stream ends on
a round's own token) matches on its first request and leaves classic decode on every later one, the witness's first
forward one token before the cache's reported reuse: diverged, exit 1, "only on a warm cache".
"""

from __future__ import annotations

import json
from pathlib import Path


def check(out: Path, stdout: str, stderr: str) -> None:
    """Assert what the served job (exit 1) wrote under ``out`` (its --record-dir) and printed."""
    from specparity.records.served import read_served

    (record,) = out.glob("served-*.md")
    rows = read_served(record).rows
    report = json.loads((out / "data" / record.stem / "report.json").read_text())
    pairing = report["summary"]["pairings"][0]
    arms = {a: {r["id"]: r for r in rows[f"{pairing['name']}-{a}"]} for a in
            ("baseline-start", "w2", "w4", "self-draft", "baseline-end")}
    assert {a["name"] for a in pairing["arms"]} == set(arms), pairing["arms"]
    for name, requests in arms.items():
        for r in requests.values():
            assert r["reference"]["compared"] and r["reference"]["prompt_equal"], (name, r["id"], r["reference"])
    for base in ("baseline-start", "baseline-end"):
        assert {r["verdict"] for r in arms[base].values()} == {"match"}
    for name in ("w2", "w4", "self-draft"):
        p0 = arms[name]["p0"]
        assert p0["verdict"] == "match" and p0["evidence"]["verify_calls"] > 0, (name, p0)
        assert p0["evidence"]["cache"] == "cold"
    for r in arms["w4"].values():
        assert r["verdict"] == "match" and r["evidence"]["draft_calls"] > 0, r
        assert r["evidence"]["first_offset"] == r["evidence"]["cached_tokens"], r["evidence"]
    drafted_self = arms["self-draft"]
    assert [r["verdict"] for r in drafted_self.values()] == ["match"] + ["diverged"] * 5
    again = drafted_self["p0-again"]
    assert "first difference at token 0" in again["reason"]
    assert (again["evidence"]["cached_tokens"], again["evidence"]["first_offset"]) == (33, 32)
    for r in list(drafted_self.values())[1:]:
        assert r["evidence"]["first_offset"] == r["evidence"]["cached_tokens"] - 1, r["evidence"]
    assert any("p0-again" in f and "only on a warm cache" in f for f in pairing["findings"])
    assert "pairing verdict: diverged" in stdout, stdout[-2000:]
