"""A served record on disk, as `specparity served` lays it out, for the tests that read or guard one."""

from __future__ import annotations

from pathlib import Path
from typing import Any


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


def served_record_of(root: Path, requests: list[dict[str, Any]], verdict: str = "match",
                     name: str = "served-host-2026-01-02", started: str = "") -> Path:
    """A complete served record as `served` lays it out: one pairing p, one drafting arm w2 of these requests."""
    import json

    data = root / "data" / name
    data.mkdir(parents=True)
    arm = {"pairing": "p", "name": "w2", "kind": "width", "width": 2, "setting": 1, "verdict": verdict,
           "requests": len(requests)}
    summary = {"verdict": verdict, "exit_code": 1 if verdict == "diverged" else 0,
               "pairings": [{"name": "p", "verdict": verdict, "profile": "mlx-lm", "target": "t", "draft": "d",
                             "reason": "", "arms": [arm]}]}
    (data / "report.json").write_text(json.dumps({
        "kind": "served", "title": "served: p", "argv": [], "status": "complete", "verdict": verdict,
        "exit_code": summary["exit_code"], "summary": summary, "started": started}))
    (data / "arms.jsonl").write_text(json.dumps(arm) + "\n")
    (data / "p-w2.jsonl").write_text("".join(json.dumps(r) + "\n" for r in requests))
    md = root / f"{name}.md"
    md.write_text("# served\n")
    return md
