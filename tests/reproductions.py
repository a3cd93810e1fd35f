"""Every printed reproduction of a served report, run: the one check the served tests share.

A diverged request carries either a command (``specparity replay ...``) or the
reason none exists. :func:`check_reproductions` walks every arm and every
diverged request of a report: a command is run as a real subprocess and must
exit 1 with its first differing token at the finding's own token index; a
request without one must say why, in a non-empty line.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any

from conftest import run_cli

from specparity.harness.results import RequestResult, ServedReport
from specparity.verdicts import Verdict


@dataclass
class Ran:
    """One diverged request and what its reproduction did: its command's exit code and index, or its reason."""

    pairing: str
    arm: str
    request: str
    command: str | None
    reason: str | None
    code: int | None = None
    index: int | None = None


def replay_index(out: dict[str, Any]) -> int | None:
    """Where a replay's JSON says the replayed answer first leaves classic decode.

    A sequence replay: the header's finding request (``finding``: id, index); ``--draft-model``:
    the recorded speculative tokens' first mismatch; ``--engine``: the engine run's first token
    finding (None: the replay found no differing token).
    """
    if out.get("finding") is not None:
        return out["finding"][1]
    reqs = out.get("requests") or []
    first = reqs[0] if reqs else {}
    if "token" in first:
        return first["token"]["emitted_index"] if first["token"] else None
    return first.get("served_first_mismatch")


def run_command(cli_bin: str, command: str) -> tuple[int, int | None, str]:
    """Run a printed ``specparity replay ...`` command with ``--json``: (exit code, first index, output)."""
    argv = shlex.split(command)
    assert argv[:2] == ["specparity", "replay"], command
    r = run_cli(cli_bin, *argv[1:], "--json")
    try:
        out = json.loads(r.stdout)
    except ValueError:
        return r.returncode, None, r.stdout + r.stderr
    return r.returncode, replay_index(out), r.stdout[-3000:] + r.stderr[-2000:]


def finding_index(r: RequestResult) -> int | None:
    """The token where the served answer left what its verdict rests on (classic decode, else the baseline)."""
    d = r.classic if r.classic is not None else r.divergence
    return d.token_index if d is not None else None


def check_reproductions(report: ServedReport, cli_bin: str, at_once: int = 2) -> list[Ran]:
    """Run every diverged request's printed command (exit 1 at the same first index) or read its reason
    (non-empty); every diverged request of every arm, in report order. ``at_once``: commands run side
    by side (each is its own process that loads the model: two keep both cores of a test machine busy)."""
    from concurrent.futures import ThreadPoolExecutor

    todo: list[tuple[Ran, RequestResult]] = []
    for p in report.pairings:
        for a in p.arms:
            for r in a.requests:
                if r.verdict != Verdict.DIVERGED:
                    continue
                rep = r.reproduction or {}
                ran = Ran(p.name, a.name, r.id, rep.get("command"), rep.get("reason"))
                if ran.command:
                    assert r.replay == ran.command, (a.name, r.id)
                else:
                    assert ran.reason and ran.reason.strip(), (a.name, r.id, rep)
                todo.append((ran, r))
    with ThreadPoolExecutor(max_workers=at_once) as pool:
        runs = {id(ran): pool.submit(run_command, cli_bin, ran.command) for ran, _ in todo if ran.command}
        for ran, r in todo:
            if ran.command:
                ran.code, ran.index, out = runs[id(ran)].result()
                assert (ran.code, ran.index) == (1, finding_index(r)), (ran.arm, r.id, ran.command, out)
    return [ran for ran, _ in todo]
