"""What every diagnosis is made of: its steps, its phases, and the steps both trees share.

:mod:`specparity.diagnose.tree` (mlx-lm's path, rerun in process) and :mod:`specparity.diagnose.own_loop` (another
engine's loop, through its commands) build the same :class:`Diagnosis` of eight steps (:class:`Step`); step 7 (the first
difference, from classic decode's pick there) and step 8 (step 1's command in each pinned release) are the same in
both.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specparity.diagnose.findings import Finding
from specparity.verdicts import Verdict

# what each step's status says: it ran, an earlier step settled it, this version does not do it, it could not run
# (a step that could not run says so in the verdict vocabulary's own word)
RAN, SKIPPED, NOT_RUN = "ran", "skipped", Verdict.NOT_RUN.value
# the phases a diagnosis names
PREFILL, VERIFY, ROLLBACK, PROCESSORS, SERVER, SERVER_CACHE, LENGTH, TIE, UNREPRODUCIBLE, UNDETERMINED = (
    "prefill", "verify", "rollback", "processors", "server", "server cache", "length", "tie", "not reproducible",
    "undetermined")
STEP_NAMES = {1: "reproduce", 2: "prefill", 3: "verify block", 4: "rollbacks", 5: "bisect", 6: "control arms",
              7: "first difference", 8: "across releases"}
NOT_IN_THIS_VERSION = "not done in this version"


@dataclass
class Step:
    """One step of the tree for one finding.

    number / name: its place in the tree. status: ran | skipped | not_run (``not_done``, a step an
    earlier version did not do, is read in older records only).
    verdict: what it found, in the probes' words (equal, divergent, not_run, inconclusive).
    evidence: what it saw, one line each. command: the line that repeats it (None: nothing ran).
    data: the numbers the evidence quotes.
    """

    number: int
    status: str
    verdict: Verdict = Verdict.NOT_RUN
    evidence: list[str] = field(default_factory=list)
    command: str | None = None
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return STEP_NAMES[self.number]

    def to_dict(self) -> dict[str, Any]:
        return {"number": self.number, "name": self.name, "status": self.status, "verdict": self.verdict,
                "evidence": self.evidence, "command": self.command, "data": self.data}

    def lines(self) -> list[str]:
        head = f"  step {self.number} {self.name}: {self.status}"
        if self.status == RAN:
            head += f", {self.verdict}"
        out = [head] + [f"    {e}" for e in self.evidence]
        if self.command:
            out.append(f"    repeat: {self.command}")
        return out


@dataclass
class Diagnosis:
    """One finding's diagnosis.

    finding: what the record says of it (findings.Finding). phase: where the tree puts it (prefill,
    verify, rollback, processors, server, length, tie, undetermined). location: width, depth, cache
    position, round, row, layer, sub-op where known. summary: the diagnosis in one line. steps: all
    eight, in order. open: what the tree left open (steps not done, what would settle it).
    seconds: the diagnosis's wall time.
    """

    finding: Finding
    phase: str = UNDETERMINED
    location: dict[str, Any] = field(default_factory=dict)
    summary: str = ""
    steps: list[Step] = field(default_factory=list)
    open: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def step(self, number: int) -> Step:
        return next(s for s in self.steps if s.number == number)

    def to_dict(self) -> dict[str, Any]:
        return {"finding": self.finding.to_dict(), "phase": self.phase, "location": self.location,
                "summary": self.summary, "steps": [s.to_dict() for s in self.steps], "open": self.open,
                "seconds": round(self.seconds, 3)}

    def lines(self) -> list[str]:
        f = self.finding
        where = f" at token {f.token_index}" if f.token_index is not None else ""
        out = [f"finding {f.id} (width {f.width}){where}: phase {self.phase}: {self.summary}"]
        for s in self.steps:
            out += s.lines()
        out += [f"  open: {o}" for o in self.open]
        return out


def _release(env: Any) -> tuple[int, ...]:
    """An environment's mlx-lm release as numbers (its ``mlx-lm==X`` pin; () where it pins none)."""
    import re

    for req in env.packages:
        m = re.fullmatch(r"mlx-lm==([0-9.]+)", req.replace(" ", ""))
        if m:
            return tuple(int(x) for x in m.group(1).split(".") if x)
    return ()


def specparity_exe() -> str:
    """This installation's own ``specparity`` command (beside its interpreter), else the PATH's."""
    import shutil
    import sys

    beside = Path(sys.executable).with_name("specparity")
    return str(beside) if beside.is_file() else shutil.which("specparity") or "specparity"


def run_command(words: list[str], name: str, env: dict[str, str] | None = None, timeout: float = 600.0,
                as_json: bool = True) -> tuple[int | None, dict[str, Any], str]:
    """A printed ``specparity ...`` command run as this installation's own command, ``--quiet`` (and ``--json``),
    tied to this process: its exit code (None: no answer within ``timeout``), its JSON object ({} without one)
    and the last line it said on stderr."""
    import json
    import os
    import subprocess

    from specparity.tied import run_tied_captured

    extra = ["--json", "--quiet"] if as_json else ["--quiet"]
    try:
        proc = run_tied_captured([specparity_exe(), *words[1:], *extra], name, timeout=timeout,
                                 env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        return None, {}, ""
    said = next((x.strip() for x in reversed(proc.stderr.splitlines()) if x.strip()), "")
    try:
        out = json.loads(proc.stdout) if as_json and proc.stdout.strip() else {}
    except ValueError:
        out = {}
    return proc.returncode, out if isinstance(out, dict) else {}, said


def verdict_of(code: int | None, out: dict[str, Any]) -> Verdict:
    """A command's verdict: its JSON's, else its exit code's (1 divergent, 0 equal, anything else inconclusive)."""
    try:
        return Verdict(str(out.get("verdict")))
    except ValueError:
        return {1: Verdict.DIVERGENT, 0: Verdict.EQUAL}.get(code if code is not None else -1, Verdict.INCONCLUSIVE)


def _release_label(env: Any, engine: str) -> str:
    """How step 8 names an environment's release: mlx-lm's version for mlx-lm, else the engine's pins."""
    if engine == "mlx-lm":
        return "mlx-lm " + ".".join(map(str, _release(env)))
    return " on ".join(p.replace("==", " ") for p in env.packages)


def releases(command: str | None, engine: str = "mlx-lm", timeout: float = 600.0) -> Step:
    """Step 8: step 1's own command rerun in each built pinned environment of ``engine`` (mlx-lm for the path
    the tree reruns in process; an engine's own for its loop), oldest mlx-lm release first: the releases where
    it reproduces (exit 1) and where it does not, and the first that fails. An environment not built here is
    named with its build command, never built here."""
    from specparity.diagnose.command_worker import run_in_worker
    from specparity.engines import get
    from specparity.environments import find_environment

    if not command:
        return Step(8, SKIPPED, evidence=["no command to rerun (step 1 had none)"])
    envs = sorted(get(engine).environments, key=_release)
    ev: list[str] = []
    rows: list[dict[str, Any]] = []
    unbuilt: list[str] = []
    for env in envs:
        if find_environment(env.name) is None:
            unbuilt.append(env.name)
            continue
        words = shlex.split(command)
        if "--environment" in words[:-1]:  # a reproduction that runs in the server's environment: in this one
            at = words.index("--environment")
            del words[at:at + 2]
        words += ["--environment", env.name]
        cmd = shlex.join(words)
        answered = run_in_worker(env.name, engine, [*words[1:], "--quiet"], timeout)
        code: int | None
        if answered is not None:
            code, said = answered
        else:
            code, _, said = run_command(words, f"step 8 in {env.name}", timeout=timeout, as_json=False)
        verdict = verdict_of(code, {})
        rows.append({"environment": env.name, "release": ".".join(map(str, _release(env))), "exit_code": code,
                     "verdict": verdict.value, "command": cmd, "label": _release_label(env, engine)})
        late = f"no answer within {timeout:g} s"
        what = {Verdict.DIVERGENT: "reproduces", Verdict.EQUAL: "does not reproduce (classic decode)"}.get(
            verdict, f"no verdict (exit {code}: {said[:200]})" if code is not None else late)
        ev.append(f"{rows[-1]['label']} ({env.name}): {what}")
    if unbuilt:
        ev.append("not built here, so not checked: " + ", ".join(f"{n} (scripts/build-env {n})" for n in unbuilt))
    if not rows:
        return Step(8, NOT_RUN, evidence=ev or [f"{engine} has no pinned environment"], data={"releases": rows})
    failing = [r for r in rows if r["verdict"] == Verdict.DIVERGENT.value]
    if failing and len(failing) == len(rows):
        ev.insert(0, f"it holds on every pinned release checked (from {rows[0]['label']})")
    elif failing:
        ev.insert(0, f"first fails on {failing[0]['label']} of the releases checked")
    verdict = Verdict.DIVERGENT if failing else Verdict.EQUAL if all(
        r["verdict"] == Verdict.EQUAL.value for r in rows) else Verdict.INCONCLUSIVE
    shown = str((failing[-1] if failing else rows[-1])["command"])
    return Step(8, RAN, verdict, ev, shown, {"releases": rows, "first_failing": failing[0]["release"] if failing
                                             else None})


def first_difference(d: Diagnosis, f: Finding, replay: dict[str, Any]) -> str:
    """Step 7: classic decode's pick where the answers part: an exact tie, a near tie, or neither."""
    from specparity.reference import NEAR_TIE, near_tie, ulp

    pick = replay.get("served_pick") or {}
    dtype = str(replay.get("dtype") or "float32")
    margin = pick.get("margin")
    served = replay.get("served_token")
    call = "neither"
    ev: list[str] = []
    if f.tie is not None or margin == 0.0:
        call = "exact_tie"
        ev.append(f"an exact tie in {dtype}: classic decode kept token {pick.get('token')} (the lower id), the server"
                  f" took {served}")
    elif margin is not None:
        tc = near_tie(margin, None, dtype=dtype, logprob=pick.get("logprob"))
        ulps = abs(margin) / ulp(dtype, pick.get("logprob") or 1.0)
        runner = pick.get("runner_up") == served
        if tc.kind == NEAR_TIE:
            call = "near_tie"
        ev.append(f"classic token {pick.get('token')}, the server's {served}"
                  f" ({'classic decode runner-up' if runner else 'not classic decode runner-up'}); top-2 margin"
                  f" {margin:.4g} nats = {ulps:.3g} ULPs of {dtype} at the logprob; near-tie band {tc.threshold:.3g}:"
                  f" {'a near tie' if call == 'near_tie' else 'a confident token, neither an exact nor a near tie'}")
        d.location["margin"] = margin
        d.location["margin_ulps"] = ulps
    else:
        ev.append("classic decode's pick at the difference is not known")
        call = "unknown"
    step = d.step(1)
    d.steps.append(Step(7, RAN, step.verdict, ev, step.command, {"call": call, "pick": pick, "served_token": served}))
    return call
