"""`specparity served` against the fault-injection server.

Each pairing runs tests/fakeserver.py answering one malformed way (or stalling, or
streaming keep-alives forever): every request of it is ``error`` with what was
wrong, the job goes on to the next arm and pairing, exits 4, and leaves nothing
running (every process the run started carries a mark; /proc is scanned for it).
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml
from fakeserver import MARK_ENV, marked, wait_gone

from specparity.records.served import read_served

pytestmark = [pytest.mark.server,
              pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds processes through /proc")]
FAKE = str(Path(__file__).resolve().parents[1] / "fakeserver.py")


def _profile(tmp_path: Path, mode: str, draft_mode: str | None = None) -> str:
    prof = tmp_path / f"fake-{mode}-{draft_mode}.yaml"
    prof.write_text(yaml.safe_dump({
        "name": "fake", "argv": ["{python}", "-I", FAKE, "--model", "{model}", "--host", "{host}", "--port", "{port}",
                                 "--mode", mode],
        "draft_argv": ["--draft-model", "{draft_model}", "--num-draft-tokens", "{num_draft}",
                       *(["--draft-mode", draft_mode] if draft_mode else [])]}))
    return str(prof)


def _run(cli_bin: str, tmp_path: Path, pairings: list[dict[str, str]], *flags: str) -> tuple[int, str, Path, str]:
    """served on a job of ``pairings`` into a record; (exit code, stderr, record, mark)."""
    ck = tmp_path / "ck"
    ck.mkdir(exist_ok=True)
    (ck / "config.json").write_text("{}")  # the fake loads nothing: a folder the harness accepts
    cfg = tmp_path / "job.yaml"
    cfg.write_text(yaml.safe_dump({"pairings": [{"target": str(ck), "draft": str(ck), **p} for p in pairings],
                                   "widths": [2], "sequence": ["fresh", "stream"], "max_tokens": 4,
                                   "self_draft": False, "concurrency": 0}))
    rec = tmp_path / "rec"
    mark = uuid.uuid4().hex
    proc = subprocess.run([cli_bin, "served", "--config", str(cfg), "--record-dir", str(rec), "--quiet", *flags],
                          capture_output=True, text=True, timeout=600, env={**os.environ, MARK_ENV: mark})
    return proc.returncode, proc.stderr, next(rec.glob("*.md")), mark


def _errors(record: Path, pairing: str, only: str | None = None) -> dict[str, list[str]]:
    """arm -> the reason of each of its requests (``only``: that request id); asserts every one is an error."""
    sr = read_served(record)
    out: dict[str, list[str]] = {}
    for arm in sr.arm_lines(pairing):
        reqs = [r for r in sr.requests(pairing, arm["name"]) if only is None or r["id"] == only]
        assert reqs and all(r["verdict"] == "error" for r in reqs), (pairing, arm["name"], reqs)
        out[arm["name"]] = [str(r["reason"]) for r in reqs]
    return out


@pytest.mark.slow
def test_served_on_malformed_answers_errors_each_request_and_exits_4(cli_bin: str, tmp_path: Path) -> None:
    modes = {"empty-choices": "choices is empty", "choice-string": "choices[0] is a string, not an object",
             "text-int": "choices[0].text is an integer, not a string",
             "logprobs-not-objects": "choices.0.logprobs.content[0] is a number, not an object",
             "chunk-list": "is a list, not an object", "not-json": "not JSON", "http-500": "HTTP 500"}
    pairings = [{"name": m, "profile": _profile(tmp_path, m)} for m in (*modes, "die")]
    pairings.append({"name": "drafted-text-int", "profile": _profile(tmp_path, "ok", "text-int")})
    code, err, record, mark = _run(cli_bin, tmp_path, pairings)
    try:
        assert code == 4, err
        assert "Traceback" not in err and "unexpected" not in err
        report = json.loads((record.parent / "data" / record.stem / "report.json").read_text())
        assert report["status"] == "complete" and report["verdict"] == "error"
        for m, message in modes.items():
            # the fake streams no logprobs: that mode is malformed in the plain answer only
            arms = _errors(record, m, "p0" if m == "logprobs-not-objects" else None)
            assert set(arms) == {"baseline-start", "w2", "baseline-end"}, arms
            fresh = [reasons[0] for reasons in arms.values()]
            assert all(message in r for r in fresh), (m, fresh)
        # half an answer, then the server process exits: that request is cut short, the next finds no server
        died = _errors(record, "die")
        assert set(died) == {"baseline-start", "w2", "baseline-end"}, died
        for arm, reasons in died.items():
            assert reasons[0].startswith(("unreadable response: not JSON (Unterminated string",
                                          "connection failed: ")), (arm, reasons)
            assert all(r.startswith("connection failed: ") for r in reasons[1:]), (arm, reasons)
        # a malformed answer from the drafted server only: the baselines match, the drafted arm errs
        sr = read_served(record)
        verdicts = {a["name"]: a["verdict"] for a in sr.final_arms("drafted-text-int")}
        assert verdicts == {"baseline-start": "match", "w2": "error", "baseline-end": "match"}, verdicts
        reasons = [str(r["reason"]) for r in sr.requests("drafted-text-int", "w2")]
        assert reasons == ["unreadable response: choices[0].text is an integer, not a string",
                           "unreadable response: stream chunk 1 choices[0].text is an integer, not a string"], reasons
    finally:
        left = wait_gone(mark)
        for pid in left:
            os.kill(pid, 9)
    assert not left, f"still running: {left}"


@pytest.mark.slow
def test_served_on_stalled_and_keepalive_servers_times_each_request_out(cli_bin: str, tmp_path: Path) -> None:
    pairings = [{"name": m, "profile": _profile(tmp_path, m)} for m in ("stall", "keepalive")]
    code, err, record, mark = _run(cli_bin, tmp_path, pairings, "--request-timeout", "1")
    try:
        assert code == 4, err
        for m in ("stall", "keepalive"):
            for arm, reasons in _errors(record, m).items():
                assert all(r.startswith("no complete answer within the request timeout of 1 s") for r in reasons), \
                    (m, arm, reasons)
    finally:
        left = wait_gone(mark)
        for pid in left:
            os.kill(pid, 9)
    assert not left and not marked(mark), f"still running: {left}"


# -- class 6: nothing that passes proves nothing -----------------------------------------------------
def test_a_pairing_where_no_arm_drafts_is_not_run() -> None:
    from specparity.harness.judge import NOTHING_SPECULATIVE, judge_pairing
    from specparity.harness.plan import ArmKind
    from specparity.harness.results import ArmResult, PairingResult
    from specparity.verdicts import Verdict

    res = PairingResult("p", "fake", "t", None)
    res.arms = [ArmResult(name, ArmKind.BASELINE, None, Verdict.MATCH) for name in ("baseline-start", "baseline-end")]
    res.arms.append(ArmResult("concurrent", ArmKind.CONCURRENT, None, Verdict.MATCH))
    from specparity.harness.client import Completion
    from specparity.harness.results import RequestResult

    for a in res.arms:
        a.requests = [RequestResult("p0", "fresh", Verdict.MATCH, "", Completion(text="x", sha256="s"), {})]
    judge_pairing(res)
    assert (res.verdict, res.reason) == (Verdict.NOT_RUN, NOTHING_SPECULATIVE)


@pytest.mark.slow
def test_served_with_no_drafter_and_no_self_draft_is_not_run_exit_3(cli_bin: str, tmp_path: Path) -> None:
    """Two baselines that agree said match, exit 0."""
    code, err, record, mark = _run(cli_bin, tmp_path, [{"name": "plain", "profile": _profile(tmp_path, "ok"),
                                                        "draft": None}])  # type: ignore[dict-item]
    try:
        assert code == 3, err
        sr = read_served(record)
        assert sr.record.verdict == "not_run"
        assert "nothing speculative was tested" in str((sr.pairing_summary("plain") or {}).get("reason"))
    finally:
        assert not wait_gone(mark)
