"""Where a served job's time goes: wall seconds by phase, each phase's own time (nested phases apart).

    clock = Clock()
    with clock.phase("server_start"):
        ...
    clock.to_dict()   # {"wall_s": ..., "server_start_s": ..., ..., "other_s": what no phase held}

A phase entered inside another counts only its own time; the outer one keeps the rest (a request's
evidence reads apart from its generation, the reference's decoding apart from the judging around it).
The runner is one thread where it times phases (a concurrent batch is one phase), so one stack serves.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

# the phases, in the order a report lists them (what each holds: PHASES[name])
PHASES = {
    "prepare": "the checkpoints as servers load them (witness wrappers, exports), the environment",
    "version_line": "each profile's version line, read once (its interpreter started)",
    "server_start": "servers from spawn until ready (loading the target and drafter)",
    "generation": "requests from send to the last byte of their answers",
    "evidence": "reading each request's evidence (metrics, witness, log) around it",
    "server_stop": "servers from the stop signal until their process group is gone",
    "reference_load": "the classic reference's worker until loaded (its imports where not overlapped)",
    "reference_decode": "classic decode of each distinct request in process",
    "reference_cold": "cold answers in process (only requests that left classic decode)",
    "reference_stop": "the reference's worker ending (its memory back before a server loads)",
    "judge": "judging answers against classic decode, the baseline and cold answers; reproductions",
}


class Clock:
    """Wall seconds by phase (see the module docstring)."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.spent: dict[str, float] = {}
        self._stack: list[list[float]] = []  # per open phase: [its start, its children's time]

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        frame = [time.perf_counter(), 0.0]
        self._stack.append(frame)
        try:
            yield
        finally:
            self._stack.pop()
            elapsed = time.perf_counter() - frame[0]
            self.spent[name] = self.spent.get(name, 0.0) + elapsed - frame[1]
            if self._stack:
                self._stack[-1][1] += elapsed

    def to_dict(self) -> dict[str, float]:
        """``wall_s``, each phase's ``<name>_s`` (the listed ones first), and ``other_s``: the rest."""
        wall = time.perf_counter() - self.t0
        names = [n for n in PHASES if n in self.spent] + [n for n in self.spent if n not in PHASES]
        out = {"wall_s": round(wall, 3)}
        out.update({f"{n}_s": round(self.spent[n], 3) for n in names})
        out["other_s"] = round(wall - sum(self.spent.values()), 3)
        return out
