"""Served results survive their record: ``from_dict(json(to_dict()))`` gives back every field.

What a record holds is ``to_dict``; ``records merge``, ``show`` and ``compare`` rebuild results with
``from_dict``. Each sample sets every field to a value other than its default, so a field that
``to_dict`` leaves out or ``from_dict`` does not read back fails here.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from conftest import validate
from specparity.completions import CompletionDifference
from specparity.harness.client import Completion
from specparity.harness.evidence import Evidence
from specparity.harness.plan import ArmKind, WidthMode
from specparity.harness.profiles import Width
from specparity.harness.results import ArmResult, PairingResult, RequestResult, ServedReport, memory_lines
from specparity.verdicts import Verdict


def _json(d: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(d, default=str))  # as a record's files hold it


def _every_field_set(obj: object) -> None:
    """No field of ``obj`` (a dataclass) is left at its default: the round trip tests each one."""
    for f in dataclasses.fields(obj):  # type: ignore[arg-type]
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            continue
        assert getattr(obj, f.name) != default, f"{type(obj).__name__}.{f.name} is at its default"


def _difference(other: str) -> CompletionDifference:
    return CompletionDifference(
        "classic decode", other, token_index=3, tokens_before=[5, 6], reference_tokens=[7, 8], other_tokens=[9],
        reference_pieces=[" a", " b"], other_pieces=[" c"], reference_token_count=12, other_token_count=11,
        char_offset=17, text_before="the", reference_snippet=" a b", other_snippet=" c", reference_chars=40,
        other_chars=38, logprobs_equal_before=False, first_logprob_diff=2, margin_reference=0.5,
        margin_other=0.25, detokenization="both sides emitted these 12 token ids", written_as="tokenizer.decode")


def _request(rid: str) -> RequestResult:
    completion = Completion("text", "ab" * 32, [1, 2], [-0.5, -0.25], [[(1, -0.5), (3, -1.5)], [(2, -0.25), (4, -2.0)]],
                            {"prompt_tokens": 7}, "length", 0.125, 200, "an error", {"id": "cmpl-1"}, 120.0)
    evidence = Evidence(4, 3, [2, 1], [3, 3], 5, ["witness: 4 verify calls"], True, ["witness"], "warm", 5)
    r = RequestResult(rid, "repeat", Verdict.DIVERGED, "w4 leaves classic decode", completion,
                      {"id": rid, "body": {"prompt": "p"}}, evidence, _difference("w4"), "specparity replay ...",
                      {"sha256": "cd" * 32, "compared": True}, _difference("w4"), _difference("w4 vs base"),
                      _difference("w4 cold"), {"kind": "near_tie"}, {"command": "specparity replay ..."})
    for part in (r, completion, evidence, r.divergence):
        _every_field_set(part)
    return r


def _arm(name: str) -> ArmResult:
    arm = ArmResult(name, ArmKind.WIDTH, Width(4, 3, "num_draft_tokens"), Verdict.DIVERGED, "1 of 2 diverged",
                    WidthMode.REQUEST, [_request("p0"), _request("p0-again")],
                    {"argv": ["python", "-m", "mlx_lm.server"], "pid": 12}, 1.5, 0.75, 0.875, ["a note"],
                    {"temperature": 0.7})
    _every_field_set(arm)
    return arm


def _pairing() -> PairingResult:
    p = PairingResult("p", "mlx-lm", "/m/target", "/m/draft", Verdict.DIVERGED, "w4 diverged", [_arm("w4"), _arm("w8")],
                      ["finding: only with the drafter"], WidthMode.REQUEST, {"p0": "ef" * 32},
                      {"computed": 2, "tokens": 24, "seconds": 0.5},
                      [{"request": "p0", "kind": "repeat", "position": 1, "first_token": 3, "arms": ["w4"],
                        "whom": "only with the drafter", "state": "", "cause": "only with the drafter",
                        "finding": "request 1 p0 (repeat) differs from classic decode (first at token 3) in w4:"
                                   " only with the drafter", "cold": []}],
                      memory={"servers_peak_rss_bytes": {"w4": 2_000_000, "w8": 2_100_000},
                              "largest_server_bytes": 2_100_000, "reference_workers_peak_rss_bytes": [1_900_000],
                              "reference_beside": False, "peak_total_bytes": 2_200_000,
                              "peak_children_bytes": 2_150_000, "harness_peak_rss_bytes": 40_000,
                              "at_peak": {"12 specparity": 40_000, "13 python": 2_100_000},
                              "peak_total_over_largest_server": 1.048, "expected_bytes": 2_500_000,
                              "limit_bytes": 20_000_000_000},
                      request_limits={"source": "derived", "override_s": None, "margin": 4.0, "floor": 120.0,
                                      "unmeasured": 600.0, "per_token_s": 0.01,
                                      "measured": {"p0": {"seconds": 0.3, "tokens": 32, "source": "classic decode"}},
                                      "arms": {"w4": {"least_s": 120.0, "most_s": 130.0, "factor": 4}}},
                      time={"wall_s": 20.0, "server_start_s": 12.0, "generation_s": 6.0, "reference_load_s": 1.0,
                            "other_s": 1.0})
    _every_field_set(p)
    return p


def test_a_request_survives_its_record_line():
    r = _request("p0")
    assert RequestResult.from_dict(_json(r.to_dict())) == r


def test_an_arm_survives_its_line_and_its_request_lines():
    arm = _arm("w4")
    line = _json(arm.to_dict())  # arms.jsonl: the requests counted, their lines apart
    assert line["requests"] == 2 and line["width"] == 4 and line["setting"] == 3
    assert ArmResult.from_dict(line, [_json(r.to_dict()) for r in arm.requests]) == arm
    assert ArmResult.from_dict(_json(arm.to_dict(with_requests=True))) == arm
    assert ArmResult.from_dict(line, []).width == Width(4, 3, "num_draft_tokens")


def test_a_pairing_and_a_report_survive_the_summary_and_the_request_files():
    p = _pairing()
    assert PairingResult.from_dict(_json(p.to_dict(with_requests=True))) == p
    files = {(p.name, a.name): [_json(r.to_dict()) for r in a.requests] for a in p.arms}
    assert PairingResult.from_dict(_json(p.to_dict()), lambda arm: files[(p.name, arm)]) == p

    report = ServedReport([p], {"widths": [4, 8]}, 12.5, {"index": 1, "count": 2, "plan": {}, "arms": {}})
    _every_field_set(report)
    summary = _json(report.to_dict())
    assert summary["verdict"] == "diverged" and summary["exit_code"] == 1
    again = ServedReport.from_dict(summary, lambda pairing, arm: files[(pairing, arm)])
    assert again == report and again.verdict == report.verdict and again.lines() == report.lines()
    assert ServedReport.from_dict(_json(report.to_dict(with_requests=True))) == report


def test_every_field_set_follows_the_published_schemas():
    """A report with every field away from its default: its --json (served.schema.json, each request with
    the cause its pairing names, None where none is) and its record lines (record-served-arm /
    record-served-request.schema.json)."""
    from specparity.commands._common import result_json

    p = _pairing()
    report = ServedReport([p], {"widths": [4, 8]}, 12.5, {"index": 1, "count": 2, "plan": {}, "arms": {}})
    out = result_json(report, path=None)
    validate(out, "served")
    assert list(out)[:2] == ["verdict", "exit_code"]
    causes = {a["name"]: [r["cause"] for r in a["requests"]] for a in out["pairings"][0]["arms"]}
    assert causes == {"w4": ["only with the drafter", None], "w8": [None, None]}
    for a in p.arms:
        validate(_json({"pairing": p.name, **a.to_dict()}), "record-served-arm")
        for r in a.requests:
            validate(_json(r.to_dict()), "record-served-request")


def test_the_report_counts_the_reference_by_its_loads_not_its_workers():
    """``reference_workers_peak_rss_bytes`` holds one peak per load of the target: one worker that gave its
    weights back before a server and loaded again after it has two, and the report says two loads."""
    mem = {**(_pairing().memory or {}), "reference_workers_peak_rss_bytes": [1_900_000, 1_950_000]}
    line = next(x for x in memory_lines(mem) if "classic reference" in x)
    assert "loaded 2 time(s) while no server ran" in line and "worker" not in line, line
