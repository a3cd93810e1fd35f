"""Control arms: rerun the probe and the capture in a fresh process per environment.

Each ``--control NAME=VALUE`` runs ``specparity bisect dump --arm both`` in a
new process with that variable set; one more process runs without any of
them (the baseline). The arms' logits are grouped by sha256 (``classic`` =
the chain, ``width W`` = the block), and each control is judged against the
baseline: a control that changed no logits byte is ``void``, which is not a
negative result (it may simply not reach this model or backend).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specparity.bisect.dump import read_dump
from specparity.bisect.report import BisectReport, compare_arms
from specparity.errors import InfrastructureError, InputError
from specparity.tied import run_tied_captured
from specparity.verdicts import Verdict

log = logging.getLogger(__name__)

BASELINE = "baseline"


def parse_control(value: str) -> tuple[str, str]:
    """``NAME=VALUE`` -> (NAME, VALUE); a bad item names the flag."""
    name, sep, val = value.partition("=")
    if not sep or not name or not name.replace("_", "").isalnum() or name[0].isdigit():
        raise InputError("control", f"{value!r}: expected NAME=VALUE with an environment"
                         " variable name")
    return name, val


def cli_command() -> list[str]:
    """The console script next to this interpreter, else ``python -P -m specparity.cli``."""
    exe = Path(sys.executable).parent / "specparity"
    if exe.exists():
        return [str(exe)]
    return [sys.executable, "-P", "-m", "specparity.cli"]


@dataclass
class ControlArm:
    """One process of the control run.

    name: ``baseline`` or ``NAME=VALUE``.
    env: the variables set for it (the baseline unsets every control variable).
    sha256: ``classic`` (chain) and ``width W`` (block) -> logits sha256.
    verdict / first_divergent: the per-layer bisect inside that process.
    effect: for controls, ``void`` (no logits byte changed: void, not negative),
      ``removes the divergence``, ``introduces a divergence`` or ``changes logits``.
    first_changed: the first row where this arm's block differs from the baseline's.
    sentence: the finding in words.
    """

    name: str
    env: dict[str, str | None]
    sha256: dict[str, str]
    verdict: str
    first_divergent: str | None
    effect: str = ""
    first_changed: str | None = None
    sentence: str = ""


@dataclass
class ControlsReport:
    """Every control arm, and the arms grouped by logits sha256.

    arms: baseline first, then each control.
    groups: sha256 -> ["baseline: classic", "MLX_X=1: width 4", ...].
    """

    arms: list[ControlArm]
    groups: dict[str, list[str]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"arms": [a.__dict__ for a in self.arms], "groups": self.groups}

    def lines(self) -> list[str]:
        out = [f"controls: {len(self.arms)} processes, {len(self.groups)} logits group(s)"]
        for i, (sha, members) in enumerate(self.groups.items()):
            out.append(f"  group {i + 1} ({sha[:12]}): {', '.join(members)}")
        out += [f"  {a.name}: {a.sentence}" for a in self.arms]
        return out


def _run_arm(name: str, env_changes: dict[str, str | None], args: list[str],
             out: Path) -> None:
    env = dict(os.environ)
    for k, v in env_changes.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    argv = cli_command() + ["bisect", "dump", *args, "--arm", "both", "--out", str(out)]
    log.info("control arm %s: %s", name, " ".join(argv))
    try:
        # tied: stopping the bisect (Ctrl-C, SIGTERM, SIGKILL) stops its control arm too
        proc = run_tied_captured(argv, f"control arm {name}", timeout=3600, env=env)
    except (OSError, subprocess.SubprocessError) as err:
        raise InfrastructureError(f"control arm {name}: could not run ({err})") from err
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise InfrastructureError(f"control arm {name} exited {proc.returncode}: {tail}")


def run_controls(controls: list[tuple[str, str]], dump_args: list[str], workdir: Path,
                 width: int) -> ControlsReport:
    """Run the baseline and one process per control; judge each control against the baseline."""
    names = sorted({n for n, _ in controls})
    plan: list[tuple[str, dict[str, str | None]]] = [(BASELINE, {n: None for n in names})]
    for n, v in controls:
        plan.append((f"{n}={v}", {**{m: None for m in names}, n: v}))
    entries = []
    for i, (name, env) in enumerate(plan):
        out = workdir / f"control-{i}.safetensors"
        _run_arm(name, env, dump_args, out)
        entries.append((name, env, read_dump(out)))
    return summarize_controls(entries, width)


def summarize_controls(entries: list[tuple[str, dict[str, str | None], Any]],
                       width: int) -> ControlsReport:
    """Group (name, env, both-arm dump) entries by logits sha256; the first is the baseline."""
    reports = []
    for name, env, dump in entries:
        rep = compare_arms(dump.arms["chain"], dump.arms["block"], dump.width, dump.depth,
                           dump.layer_kinds)
        reports.append((name, env, rep, dump))
    base_name, _, base_rep, base_dump = reports[0]
    arms: list[ControlArm] = []
    groups: dict[str, list[str]] = {}
    labels = {"chain": "classic", "block": f"width {width}"}
    for name, env, rep, dump in reports:
        sha = {labels["chain"]: rep.logits_sha256[0], labels["block"]: rep.logits_sha256[1]}
        for label, h in sha.items():
            groups.setdefault(h, []).append(f"{name}: {label}")
        arm = ControlArm(name, env, sha, rep.verdict, rep.first_divergent)
        if name == base_name:
            arm.sentence = (f"{rep.verdict}" + (f", first divergent layer {rep.first_divergent}"
                                                 if rep.first_divergent else ""))
        else:
            _judge(arm, rep, base_rep, dump, base_dump)
        arms.append(arm)
    return ControlsReport(arms, groups)


def _judge(arm: ControlArm, rep: BisectReport, base: BisectReport, dump: Any,
           base_dump: Any) -> None:
    if rep.logits_sha256 == base.logits_sha256:
        arm.effect = "void"
        arm.sentence = ("void, not negative: it changed no logits byte of either arm (the"
                        " variable does not reach this model or backend)")
        return
    changed = compare_arms(base_dump.arms["block"], dump.arms["block"], dump.width, dump.depth,
                           dump.layer_kinds)
    if changed.first_divergent is None:
        changed = compare_arms(base_dump.arms["chain"], dump.arms["chain"], dump.width,
                               dump.depth, dump.layer_kinds)
    arm.first_changed = changed.first_divergent
    if base.verdict == Verdict.DIVERGENT and rep.verdict == Verdict.EQUAL:
        arm.effect = "removes the divergence"
    elif base.verdict == Verdict.EQUAL and rep.verdict == Verdict.DIVERGENT:
        arm.effect = "introduces a divergence"
    else:
        arm.effect = "changes logits"
    arm.sentence = (f"{arm.effect} (bisect {rep.verdict}"
                    + (f", first divergent layer {rep.first_divergent}" if rep.first_divergent
                       else "")
                    + f"; first row it changes against the baseline: {arm.first_changed})")
