"""What docs/engines.md's two served yunshu jobs find, checked on the records those documented lines wrote.

``specparity served --profile yunshu ... --widths 4,8 --concurrency 0 --record-dir runs/yunshu`` (its DFlash lane)
and ``specparity served --profile yunshu-mtp ... --widths 4 --concurrency 0 --record-dir runs/yunshu-mtp`` (the
target's MTP head): the docs' test runs each as a reader types it and then calls :func:`check` on its record
(tests/docs/conftest.py's AFTER), so the suite starts those servers once. tests/engines/test_yunshu.py runs the
concurrent arm these lines leave out.

Every baseline (its lane off) equals classic decode, its chat content stripped of the whitespace around it (named,
never a divergence). Every drafted request equals it too; its ``x_yunshu.speculative`` block says the lane drafted
(mode dflash or mtp) and that nothing was accepted on these prompts: ``not_engaged``, and its reason says so. A
streamed request is answered (it names the model as every request does) and its chunks carry no ``x_yunshu``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def check(out: Path, stdout: str, stderr: str) -> None:
    """Assert what one served yunshu job (exit 3) wrote under ``out`` (its --record-dir) and printed."""
    from specparity.records.served import read_served

    (record,) = out.glob("served-*.md")
    rows = read_served(record).rows
    arms: dict[str, dict[str, dict[str, Any]]] = {
        a["name"]: {r["id"]: r for r in rows[f"{a['pairing']}-{a['name']}"]} for a in rows["arms"]}
    mode = "mtp" if out.name.endswith("mtp") else "dflash"  # the page keeps each lane's record in its own folder
    assert {"baseline-start", "w4", "baseline-end"} <= set(arms), list(arms)
    for name, requests in arms.items():
        chat = requests["chat-1"]
        # its chat content is classic decode's text stripped of the whitespace around it: named, never a divergence
        assert "stripped of the whitespace around it" in chat["reference"]["detokenized"], (name, chat["reference"])
        assert chat["reference"]["detokenized_with_drafter_only"] is False
        if name.startswith("baseline"):
            assert {r["verdict"] for r in requests.values()} == {"match"}, (name, requests)
            continue
        assert chat["verdict"] in ("match", "not_engaged"), (name, chat)
        lane = "mtp" if name == "self-draft" else mode  # the target as its own drafter: its MTP head drafts
        for rid in ("p0", "p0-again"):
            r = requests[rid]
            assert r["verdict"] == "not_engaged", (name, r)
            # the lane drafted and accepted nothing, and the reason says so (not "no evidence the drafter ran")
            assert f"mode {lane}, 0 of" in r["evidence"]["lines"][0], (name, r["evidence"])
            assert f"nothing shows a draft of it was accepted (x_yunshu: mode {lane}, 0 of" in r["reason"], r
        stream = requests["p1-stream"]
        assert stream["verdict"] == "not_engaged" and stream["reason"].startswith("equals classic decode"), stream
    assert "pairing verdict: not_engaged" in stdout, stdout[-2000:]
