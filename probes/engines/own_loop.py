"""The in-process face of an engine checked through its own generate loops (issue 27's engines).

mtplx exposes its loops, not a verify block and a rollback a probe could drive from
outside (and on Linux its generation does not import); mlx-dspark's ``Target``,
dspark-mlx's host adapter and dfly-mlx's dflash-mlx ops are driven in process by
:mod:`specparity.engines.mlx_dspark.adapter`, :mod:`~specparity.engines.dspark_mlx.adapter`
and :mod:`~specparity.engines.dfly_mlx.adapter` (their e2e still runs here):
``specparity e2e --engine NAME`` runs each loop against classic decode
(:mod:`specparity.probes.engine_e2e`) and locates a difference to the
round and the row of that round's verify block from the engine's own record.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from specparity.mlx_server import stream_text
from specparity.probes.e2e import OWN_LOOP, E2EOptions, E2ERun, EntryArm, compare_arms
from specparity.probes.engines.base import EngineInfo
from specparity.progress import NULL, Observer
from specparity.verdicts import Verdict

NOTE = "checked through its own generate loops, each loading the pair with the engine's own loaders"


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


class OwnLoopEngine:
    """An engine's name and checkpoints, and the context its classic arm runs in: what e2e reports of an engine
    it checks through its own loops (each loop loads the pair with the engine's own loaders)."""

    def __init__(self, name: str, target: Path, draft: Path | None):
        self.info = EngineInfo(name=name, version=_version(name), target=str(target),
                               draft=str(draft) if draft else None, block_size=None, widths=[], notes=[NOTE],
                               packages={p: _version(p) for p in (name, "mlx", "mlx-lm")})

    @contextlib.contextmanager
    def classic(self) -> Iterator[None]:
        yield


def run_own_loops_e2e(engine: OwnLoopEngine, loaded: Any, prompt: list[int], max_tokens: int,
                      entry_points: list[str] | None = None, observer: Observer = NULL) -> E2ERun:
    """Each of the engine's own loops against mlx-lm's classic ``stream_generate`` on the ids it consumed.

    Classic decode runs once per distinct prompt (:class:`~specparity.probes.engine_e2e.Classic`): the same
    arm judges each loop round by round and is this command's classic arm.
    """
    from specparity.probes.engine_e2e import Classic
    from specparity.probes.engine_e2e import run as run_entries

    info = engine.info
    options = E2EOptions(max_tokens=max_tokens)
    drafter = f"drafter {info.draft}" if info.draft else "its draft heads inside the target"
    run = E2ERun(header=(f"{info.name} {info.version} on {info.target} with {drafter}: its own loops;"
                         f" classic: mlx-lm's stream_generate without a drafter; max_tokens={max_tokens}"),
                 options=options.passed(True), model=loaded.fingerprint.to_dict(), prompt_tokens=len(prompt))
    classic = Classic(info.target, max_tokens, loaded=loaded, context=engine.classic)
    findings = run_entries(info.name, info.target, info.draft, list(prompt), max_tokens,
                           tuple(entry_points or ()), classic=classic)
    with observer.part("entry points", total=len(findings)):
        for f in findings:
            ref = classic.arm(list(f.prompt if f.prompt is not None else prompt))
            arm = EntryArm(f.entry, True, passed={"max_tokens": max_tokens})
            arm.step, arm.received = f"{info.name} {f.entry} {OWN_LOOP}", dict(arm.passed)
            arm.tokens, arm.drafted, arm.seconds = list(f.tokens), int(f.accepted or 0), f.seconds
            arm.proposed = f.drafted
            arm.text = stream_text(loaded.tokenizer, arm.tokens)  # its ids as classic decode writes ids
            if f.verdict in (Verdict.ERROR, Verdict.CANNOT_RUN):
                arm.error = f"{f.verdict.replace('_', ' ')}: {f.failure or f.reason}"
            res = compare_arms(f.entry, ref, arm, options, loaded.tokenizer)
            if f.verdict == Verdict.DIVERGED:
                res.reason = f"{res.reason}; {f.reason}" if res.reason else f.reason
            run.entries.append(res)
            observer.result(f.entry, res.to_dict())
            observer.item("entry points")
    return run
