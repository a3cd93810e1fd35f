"""A running server and what was exchanged with it: the runner's vocabulary for every kind of arm.

:mod:`specparity.harness.run` makes them (``PairingRun.new_session``, ``PairingRun.send``); the
arms it runs, its own and the distribution arms (:mod:`specparity.harness.distribution`), read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specparity.harness.client import Completion, Request
from specparity.harness.evidence import Evidence
from specparity.harness.lifecycle import Server
from specparity.harness.reproduce import ServerHistory


@dataclass
class Session:
    """A running server, shared by the arms with the same server key.

    server: its lifecycle. witness_file: where its wrapped checkpoints log their forwards.
    info: what the record keeps of it (argv, env, log, pid, start-up seconds, version).
    generation: seconds spent generating on it when requests go in batches.
    start_counted: its start-up time has been charged to an arm (a shared server's, once).
    server_dir: a folder the record keeps for this server (an engine's own diagnostics).
    history: every request the server received, in order (reproductions replay it).
    """

    server: Server
    witness_file: Path
    info: dict[str, Any]
    generation: float = 0.0
    start_counted: bool = False
    server_dir: Path = Path()
    history: ServerHistory = field(default_factory=lambda: ServerHistory([]))


@dataclass
class Exchange:
    """One request sent, what came back, and what showed the drafter ran."""

    request: Request
    completion: Completion
    evidence: Evidence = field(default_factory=Evidence)
    prompt_ids: list[int] | None = None  # the prompt tokens the server says it decoded from (engine hook)
