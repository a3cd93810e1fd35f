"""Findings whose servers ran in a pinned environment on another mlx-lm: diagnosed in that environment.

A served pairing in a pinned environment (``served --environment E``, a pairing's ``environment``) whose mlx-lm
is not the one of the interpreter that judged it gets reproductions that end in ``--environment E``: the replay
rebuilds the server's own loop with E's mlx-lm. The tree runs mlx-lm's code in process (the replay, prefill,
verify blocks, rollbacks, bisect), so it must run there too: ``diagnose`` (and ``served --diagnose``, the nightly
job) hands those findings to ``specparity diagnose RECORD --json --only ID ...`` run in E (one process per
environment, tied to this one, marked as a re-run there so it diagnoses everything it is given in process) and
takes its diagnoses as its own. Each printed command of theirs gets ``--environment E`` where it has none, so it
repeats its step's verdict from any interpreter, as the reproduction does.
"""

from __future__ import annotations

import json
import os
from typing import Any

from specparity.diagnose.findings import Finding
from specparity.diagnose.steps import NOT_RUN, Diagnosis, Step
from specparity.verdicts import Verdict


def named_environment(f: Finding) -> str | None:
    """The pinned environment ``f``'s reproduction runs in (its ``--environment``; None: this interpreter's)."""
    argv = f.replay_argv() or []
    return argv[argv.index("--environment") + 1] if "--environment" in argv[:-1] else None


def environment_of(f: Finding) -> str | None:
    """:func:`named_environment`, where this process is not already the diagnosis handed to it there; None:
    diagnosed here."""
    from specparity.engine_env import RERUN_MARK

    return None if os.environ.get(RERUN_MARK) else named_environment(f)


def in_environment_of(f: Finding, command: str | None) -> str | None:
    """A ``specparity`` command the tree prints for ``f``, run where ``f``'s reproduction runs."""
    from specparity.engine_env import with_environment

    env = named_environment(f)
    return command if command is None or env is None else with_environment(command, env)


def diagnose_elsewhere(record: str, findings: list[Finding]) -> dict[str, dict[str, Any] | str]:
    """Finding id -> its diagnosis (``Diagnosis.to_dict()``) made in its environment, or why there is none (one
    line), for each of ``findings`` that :func:`environment_of` sends elsewhere."""
    from specparity.engine_env import RERUN_MARK, engine_environment, rerun_argv
    from specparity.errors import SpecparityError
    from specparity.tied import run_tied_captured

    groups: dict[str, list[Finding]] = {}
    for f in findings:
        env = environment_of(f)
        if env is not None:
            groups.setdefault(env, []).append(f)
    out: dict[str, dict[str, Any] | str] = {}
    for env, group in groups.items():
        argv = ["diagnose", record, "--json", "--quiet"]
        for f in group:
            argv += ["--only", f.id]
        try:
            python, environ = engine_environment("mlx-lm", env)
            proc = run_tied_captured(rerun_argv(python, argv), f"specparity diagnose in environment {env}",
                                     env={**environ, RERUN_MARK: "mlx-lm"})
        except (SpecparityError, OSError) as err:
            for f in group:
                out[f.id] = f"environment {env} could not run it ({err})"
            continue
        try:
            made = {d["finding"]["id"]: d for d in json.loads(proc.stdout)["diagnoses"]}
        except (ValueError, KeyError, TypeError):
            made = {}
        said = (proc.stderr.strip().splitlines() or [""])[-1]
        for f in group:
            d = made.get(f.id)
            out[f.id] = (_commands_in(d, env) if d is not None else
                         f"its diagnosis in environment {env} exited {proc.returncode} without it" +
                         (f": {said}" if said else ""))
    return out


def _commands_in(d: dict[str, Any], env: str) -> dict[str, Any]:
    """``d`` with ``--environment env`` added to each step's ``specparity`` command that names none, and step 1
    saying where it ran."""
    from specparity.engine_env import with_environment

    steps = d.get("steps") or []
    for step in steps:
        command = step.get("command")
        if command and command.startswith("specparity "):
            step["command"] = with_environment(command, env)
    if steps and isinstance(steps[0].get("evidence"), list):
        steps[0]["evidence"].insert(0, f"run in environment {env}, on the mlx-lm its servers ran")
    return d


def as_diagnosis(f: Finding, made: dict[str, Any] | str) -> Diagnosis:
    """What :func:`diagnose_elsewhere` gave for ``f`` as a Diagnosis of this process (a failure: every step not
    run, with its cause)."""
    if isinstance(made, str):
        d = Diagnosis(f, summary=f"not diagnosed: {made}", open=[made])
        d.steps = [Step(n, NOT_RUN, evidence=[made]) for n in range(1, 9)]
        return d
    steps = [Step(int(s["number"]), str(s["status"]), Verdict(s["verdict"]), list(s.get("evidence") or []),
                  s.get("command"), dict(s.get("data") or {})) for s in made.get("steps") or []]
    return Diagnosis(f, phase=str(made.get("phase")), location=dict(made.get("location") or {}),
                     summary=str(made.get("summary") or ""), steps=steps, open=list(made.get("open") or []),
                     seconds=float(made.get("seconds") or 0.0))
