"""A served record on disk, as `specparity served` lays it out, for the tests that read or guard one."""

from __future__ import annotations

from pathlib import Path


def served_record(root: Path) -> Path:
    """A complete served record on disk, as `specparity served` lays it out (one arm, one request)."""
    import json

    name = "served-host-2026-01-01"
    data = root / "data" / name
    data.mkdir(parents=True)
    arm = {"pairing": "p", "name": "baseline-start", "kind": "baseline", "width": None, "setting": None,
           "verdict": "match"}
    summary = {"verdict": "match", "exit_code": 0,
               "pairings": [{"name": "p", "verdict": "match", "profile": "mlx-lm", "reason": "",
                             "arms": [arm]}]}
    (data / "report.json").write_text(json.dumps({
        "kind": "served", "title": "served: p", "argv": [], "status": "complete", "verdict": "match",
        "exit_code": 0, "summary": summary}))
    (data / "arms.jsonl").write_text(json.dumps(arm) + "\n")
    (data / "p-baseline-start.jsonl").write_text(json.dumps(
        {"id": "p0", "kind": "fresh", "verdict": "match", "completion": {"seconds": 0.1}}) + "\n")
    md = root / f"{name}.md"
    md.write_text("# served\n")
    return md
