"""A served record as JUnit XML, for the CI systems that already read it.

One test suite per pairing; one test case per arm and request of the
sequence (classname ``<pairing>.<arm>``, name ``<request id> (<kind>)``):

    match                      passed
    diverged                   failure: the width and the first divergence (token, char, snippets)
    declined / not_engaged     skipped, with the reason
    inconclusive               skipped: the pairing's baselines disagree, nothing was judged
    error                      error: the server or request that failed

An arm with no requests (its server never started) is one case named
``server``; an arm whose own verdict is worse than every request's (the
self-draft acceptance check) adds a case named ``arm``. The XML is written
with junitparser, never by hand. A record that did not complete is refused
(``records junit`` exits 2): its finished parts alone would read as a green
suite.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specparity.errors import InputError
from specparity.harness.plan import BASELINE_START
from specparity.records.served import ServedRecord
from specparity.verdicts import Verdict, combine

# XML 1.0 forbids these code points even escaped: a completion may carry them
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")
_SKIPPED = (Verdict.DECLINED, Verdict.NOT_ENGAGED, Verdict.LOSSY, Verdict.INCONCLUSIVE, Verdict.NOT_RUN)


def _clean(s: Any) -> str:
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", str(s))


@dataclass
class JunitSummary:
    """What a JUnit file holds: path, and test cases by outcome."""

    path: Path
    tests: int
    failures: int
    errors: int
    skipped: int

    def line(self) -> str:
        return (f"JUnit written: {self.path}: {self.tests} test cases, {self.failures} failures,"
                f" {self.errors} errors, {self.skipped} skipped")


def _arms(sr: ServedRecord) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """(pairing, its arms) in run order: the final summary when complete, else the arms that finished."""
    out = []
    for name in sr.pairing_names():
        arms = sr.final_arms(name)
        p = sr.pairing_summary(name) or {"name": name, "verdict": None, "reason": "",
                                         "profile": (arms[0].get("server") or {}).get("profile") if arms else None}
        out.append((p, arms))
    return out


def _width(arm: dict[str, Any]) -> str:
    if arm.get("width") is None:
        return "no drafter"
    return f"width {arm['width']} (server setting {arm.get('setting')})"


def _case(classname: str, name: str, verdict: Verdict, message: str, detail: str, seconds: float | None) -> Any:
    from junitparser import Error, Failure, Skipped, TestCase

    case = TestCase(_clean(name), _clean(classname), round(float(seconds or 0.0), 3))
    if verdict == Verdict.DIVERGED:
        result: Any = Failure(_clean(message), str(Verdict.DIVERGED))
    elif verdict == Verdict.ERROR:
        result = Error(_clean(message), str(Verdict.ERROR))
    elif verdict in _SKIPPED:
        result = Skipped(_clean(message))
    else:
        result = None
    if result is not None:
        result.text = _clean(detail) if detail else None
        case.result = [result]
    if detail:
        case.system_out = _clean(detail)
    return case


def _request_detail(arm: dict[str, Any], req: dict[str, Any]) -> str:
    lines = [f"arm {arm.get('name')}: {_width(arm)}, verdict {req.get('verdict')}", f"reason: {req.get('reason')}"]
    d = req.get("divergence")
    if d:
        lines.append(f"first differing token {d.get('token_index')}, character {d.get('char_offset')}")
        lines.append(f"{d.get('reference', 'baseline')}: {d.get('reference_snippet', d.get('baseline_snippet'))!r}")
        lines.append(f"{d.get('other', 'arm')}: {d.get('other_snippet', d.get('arm_snippet'))!r}")
    if req.get("replay"):
        lines.append(f"reproduce in process: {req['replay']}")
    log = (arm.get("server") or {}).get("log")
    if log:
        lines.append(f"server log: {log}")
    return "\n".join(lines)


def junit_xml(sr: ServedRecord) -> Any:
    """The JUnitXml of a served record."""
    from junitparser import JUnitXml, TestSuite

    rec = sr.record
    xml = JUnitXml("specparity served")
    for pairing, arms in _arms(sr):
        pname = str(pairing.get("name"))
        suite = TestSuite(_clean(f"served {pname}"))
        suite.add_property("record", _clean(rec.path))
        suite.add_property("status", rec.status)
        suite.add_property("profile", _clean(pairing.get("profile")))
        if pairing.get("verdict"):
            suite.add_property("verdict", str(pairing["verdict"]))
        inconclusive = pairing.get("verdict") == Verdict.INCONCLUSIVE
        for arm in arms:
            aname = str(arm.get("name"))
            classname = f"{pname}.{aname}"
            requests = sr.requests(pname, aname)
            arm_verdict = Verdict(arm.get("verdict") or Verdict.ERROR)
            for req in requests:
                verdict = Verdict(req.get("verdict") or Verdict.ERROR)
                message = str(req.get("reason") or "")
                if inconclusive and aname != BASELINE_START and verdict != Verdict.ERROR:
                    verdict = Verdict.INCONCLUSIVE
                    message = f"not judged: {pairing.get('reason')}"
                elif verdict == Verdict.DIVERGED:
                    message = f"{aname} ({_width(arm)}) diverged on {req.get('id')}: {message}"
                elif verdict != Verdict.MATCH:
                    message = f"{aname} ({_width(arm)}) {verdict}: {message}"
                seconds = (req.get("completion") or {}).get("seconds")
                suite.add_testcase(_case(classname, f"{req.get('id')} ({req.get('kind')})", verdict, message,
                                         _request_detail(arm, req) if verdict != Verdict.MATCH else "", seconds))
            worst = combine([Verdict(r.get("verdict") or Verdict.ERROR) for r in requests], empty=Verdict.NOT_RUN)
            if not requests:
                suite.add_testcase(_case(classname, "server", Verdict.ERROR,
                                         f"{aname} ({_width(arm)}): {arm.get('reason') or 'no requests were sent'}",
                                         str((arm.get("server") or {}).get("log_tail") or ""), arm.get("seconds")))
            elif not inconclusive and combine([worst, arm_verdict]) != worst:
                suite.add_testcase(_case(classname, "arm", arm_verdict, f"{aname} ({_width(arm)}): {arm.get('reason')}",
                                         "", arm.get("seconds")))
        suite.update_statistics()
        xml.add_testsuite(suite)
    xml.update_statistics()
    return xml


def write_junit(sr: ServedRecord, out: str | Path, force: bool = False) -> JunitSummary:
    """Write the JUnit XML of a served record to ``out`` as a new file (parents created; an existing
    ``out`` only with ``force``: :func:`specparity.store.new_files`); returns its counts."""
    from specparity.store import new_files

    xml = junit_xml(sr)
    path = Path(out)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with new_files([path], force=force, flag="--out") as (tmp,):
            xml.write(str(tmp), pretty=True)
    except OSError as err:
        raise InputError("out", f"{out}: {err.strerror or err}") from None
    return JunitSummary(path, int(xml.tests), int(xml.failures), int(xml.errors), int(xml.skipped))

