"""The one verdict contract (DESIGN.md): vocabulary, exit codes, combining, reports.

Every report type, record and command takes its verdict words and exit codes
from here; nothing else spells a verdict or maps one to an exit code.

Vocabularies:
    probe (forward-pass checks, replay, bisect): equal, divergent, not_run, inconclusive
    served arms: match, diverged, declined, not_engaged, error (a pairing whose
        two baselines disagree is inconclusive)
    statistical (dist, accept): pass, divergent, inconclusive
    an engine's own entry points (its loops, ``e2e --engine``, the findings table): match,
        diverged, not_engaged, error, cannot_run (it does not run on this machine: a library
        of another platform, a Python version; its own cause, never a pass), lossy_by_design (a
        mode its authors document as lossy, run and reported with what it changed: never a pass,
        never a defect)
    gate decisions: ALLOW, DECLINE, FORFEIT
    prompt-cache policies (the gate's prefill-parity decision): reuse, re-prefill

Exit codes (errors.EXIT_*): 0 all pass, 1 a divergence was found, 2 usage,
3 inconclusive (not run, not engaged, declined, underpowered), 4 infrastructure,
70 an unexpected error (a bug in specparity or in code it ran: never a verdict).

A process's verdict (the top of every ``--json``) is its report's word; where no report
says one (a listing, a file written, an error), the word of its exit code (:func:`of_exit`).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Protocol, runtime_checkable
from collections.abc import Iterable

from specparity.errors import (
    EXIT_DIVERGENT, EXIT_INCONCLUSIVE, EXIT_INFRA, EXIT_OK,
)


class Verdict(StrEnum):
    """Every verdict word a report, record or test may use (a ``str``: JSON writes the word)."""

    # probe vocabulary
    EQUAL = "equal"
    DIVERGENT = "divergent"
    NOT_RUN = "not_run"
    INCONCLUSIVE = "inconclusive"
    # served-arm vocabulary
    MATCH = "match"
    DIVERGED = "diverged"
    DECLINED = "declined"
    NOT_ENGAGED = "not_engaged"
    ERROR = "error"
    # statistical vocabulary
    PASS = "pass"
    # an engine's entry point that cannot run on this machine (exit 3, as not_run)
    CANNOT_RUN = "cannot_run"
    # a mode its authors document as lossy (exit 3: it proves nothing about lossless decoding, and its
    # difference is no defect)
    LOSSY = "lossy_by_design"


class Decision(StrEnum):
    """The gate's decision words, as its log line spells them."""

    ALLOW = "ALLOW"
    DECLINE = "DECLINE"
    FORFEIT = "FORFEIT"


class CachePolicy(StrEnum):
    """What a server may do with a cached prompt prefix, as the policy line spells it.

    reuse: one-shot and chunked prefill agree, so a warm request (which prefills
    only its uncached suffix) computes what a fresh one does.
    re-prefill: they differ, so a cached prefix is reused only where it was computed
    by the very calls a fresh prefill makes; otherwise the prompt is prefilled again.
    """

    REUSE = "reuse"
    REPREFILL = "re-prefill"


PROBE_VERDICTS = (Verdict.EQUAL, Verdict.DIVERGENT, Verdict.NOT_RUN, Verdict.INCONCLUSIVE)
SERVED_VERDICTS = (Verdict.MATCH, Verdict.DIVERGED, Verdict.DECLINED, Verdict.NOT_ENGAGED,
                   Verdict.ERROR, Verdict.INCONCLUSIVE, Verdict.LOSSY)
STAT_VERDICTS = (Verdict.PASS, Verdict.DIVERGENT, Verdict.INCONCLUSIVE)

_EXIT: dict[Verdict, int] = {
    Verdict.EQUAL: EXIT_OK,
    Verdict.MATCH: EXIT_OK,
    Verdict.PASS: EXIT_OK,
    Verdict.DIVERGENT: EXIT_DIVERGENT,
    Verdict.DIVERGED: EXIT_DIVERGENT,
    Verdict.NOT_RUN: EXIT_INCONCLUSIVE,
    Verdict.CANNOT_RUN: EXIT_INCONCLUSIVE,
    Verdict.LOSSY: EXIT_INCONCLUSIVE,
    Verdict.INCONCLUSIVE: EXIT_INCONCLUSIVE,
    Verdict.NOT_ENGAGED: EXIT_INCONCLUSIVE,
    # a declined arm never ran the speculative path: it proves nothing about it
    Verdict.DECLINED: EXIT_INCONCLUSIVE,
    Verdict.ERROR: EXIT_INFRA,
}

_DECISION_EXIT: dict[Decision, int] = {
    Decision.ALLOW: EXIT_OK,
    Decision.FORFEIT: EXIT_OK,
    Decision.DECLINE: EXIT_DIVERGENT,
}

# combine(): the most serious verdict wins. A divergence is the finding a run
# exists to make, so it outranks an infrastructure error elsewhere in the run.
_SEVERITY: dict[Verdict, int] = {
    Verdict.EQUAL: 0, Verdict.MATCH: 0, Verdict.PASS: 0,
    Verdict.DECLINED: 1, Verdict.LOSSY: 1, Verdict.NOT_ENGAGED: 2, Verdict.NOT_RUN: 3, Verdict.CANNOT_RUN: 3,
    Verdict.INCONCLUSIVE: 4,
    Verdict.ERROR: 5,
    Verdict.DIVERGED: 6, Verdict.DIVERGENT: 6,
}


def verdict(value: str | Verdict) -> Verdict:
    """A verdict word read from JSON or a record; an unknown word is a ValueError naming it."""
    try:
        return Verdict(value)
    except ValueError:
        raise ValueError(f"unknown verdict {value!r} (known: {', '.join(v.value for v in Verdict)})") from None


def exit_code(v: str | Verdict) -> int:
    """The exit code DESIGN.md gives a verdict."""
    return _EXIT[verdict(v)]


def of_exit(code: int) -> Verdict:
    """The verdict of a process that ended with ``code`` where no report says one: ``pass`` (0: a command
    that judges nothing did what it was asked), ``divergent`` (1), ``inconclusive`` (3), and ``error`` for
    every code that is not a verdict's (2 usage, 4 infrastructure, 70 a bug, 129/130/143 a signal)."""
    return {EXIT_OK: Verdict.PASS, EXIT_DIVERGENT: Verdict.DIVERGENT,
            EXIT_INCONCLUSIVE: Verdict.INCONCLUSIVE}.get(code, Verdict.ERROR)


def decision_exit_code(d: str | Decision) -> int:
    """``gate check``: 0 allow (or forfeit), 1 decline."""
    return _DECISION_EXIT[Decision(d)]


def is_pass(v: str | Verdict) -> bool:
    return exit_code(v) == EXIT_OK


def combine(verdicts: Iterable[str | Verdict], empty: Verdict = Verdict.NOT_RUN) -> Verdict:
    """A run's verdict from its parts: the most serious part wins; nothing run is ``empty``.

    Mixed vocabularies keep the word of the part that won (a probe's divergent
    cell beside its equal prefill is ``divergent``; a served job with a match
    and a declined arm is ``declined``).
    """
    parts = [verdict(v) for v in verdicts]
    if not parts:
        return empty
    return max(parts, key=lambda v: _SEVERITY[v])


def passing(kind_verdicts: tuple[Verdict, ...]) -> Verdict:
    """The passing word of a vocabulary (equal, match or pass)."""
    return next(v for v in kind_verdicts if is_pass(v))


@runtime_checkable
class Report(Protocol):
    """What every report type implements, so commands and records treat them alike.

    verdict: the report's verdict word. exit_code: ``exit_code(verdict)``
    unless the report knows better (it never returns a code that is not in
    DESIGN.md's table). to_dict(): JSON-ready, carrying ``verdict`` and
    ``exit_code``. lines(): the human text, one finding per line.
    """

    @property
    def verdict(self) -> Verdict: ...

    @property
    def exit_code(self) -> int: ...

    def to_dict(self) -> dict[str, Any]: ...

    def lines(self) -> list[str]: ...


class ReportMixin:
    """``exit_code`` derived from ``verdict``; subclasses provide verdict, to_dict and lines."""

    verdict: Any

    @property
    def exit_code(self) -> int:
        return exit_code(self.verdict)
