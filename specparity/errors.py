"""Known errors and the exit codes they map to (DESIGN.md).

    SpecparityError              base; exit_code 2 unless a subclass says otherwise
    +-- UsageError               2  bad flag, value, path or input file
    |   +-- InputError           2  a bad input named in library terms (``rule``); the CLI
    |                               prints it as the command's flag (``--rule``)
    +-- Inconclusive             3  not run, not engaged, underpowered
    +-- InfrastructureError      4  a checkpoint would not load, a server would not start
        +-- CheckpointError      4  the checkpoint exists but mlx-lm cannot load it

A message may name the inputs it is about in library terms (:class:`Name`: ``width``,
``checkpoint``); ``str(err)`` says those words, and the CLI prints each as the command's flag
(``--width``, or the flag a command maps it to with :meth:`SpecparityError.flagged`).

The CLI prints ``Error: <message>`` on one line and exits with ``exit_code``;
anything else is a bug: one line, exit 70 (``EXIT_BUG``, sysexits' EX_SOFTWARE,
never a verdict's code), and its traceback behind ``--debug``.

    KeyboardInterrupt            130  Ctrl-C (SIGINT)
    +-- Terminated               143  SIGTERM, 129 SIGHUP (a closed terminal): raised in the main
                                      thread as SIGINT raises KeyboardInterrupt
                                      (harness.lifecycle.catch_sigterm)
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TypeVar

EXIT_OK = 0
EXIT_DIVERGENT = 1
EXIT_USAGE = 2
EXIT_INCONCLUSIVE = 3
EXIT_INFRA = 4
EXIT_BUG = 70
EXIT_INTERRUPTED = 130  # Ctrl-C: the shell's 128 + SIGINT
EXIT_TERMINATED = 143  # SIGTERM: the shell's 128 + SIGTERM
EXIT_HUNG_UP = 129  # SIGHUP (the terminal closed): the shell's 128 + SIGHUP


@dataclass(frozen=True)
class Name:
    """An input a message names: ``param`` in library terms; on the command line ``flag`` (None: ``--<param>``)."""

    param: str
    flag: str | None = None

    def render(self, as_flag: bool) -> str:
        return (self.flag or f"--{self.param}") if as_flag else self.param


E = TypeVar("E", bound="SpecparityError")


def _render(parts: tuple[str | Name, ...], as_flag: bool) -> str:
    return "".join(p.render(as_flag) if isinstance(p, Name) else str(p) for p in parts)


class SpecparityError(Exception):
    """A failure the user can act on; ``str(err)`` is the one-line message.

    parts: the message as strings and :class:`Name` s, the inputs it names (one string, as most are).
    """

    exit_code = EXIT_USAGE

    def __init__(self, *parts: str | Name):
        self.parts = parts
        super().__init__(_render(parts, False))

    def as_flag(self) -> str:
        """The message with each input it names shown as its command-line flag."""
        return _render(self.parts, True)

    def names(self) -> list[str]:
        """The inputs the message names, in library terms."""
        return [p.param for p in self.parts if isinstance(p, Name)]

    def renamed(self: E, params: Mapping[str, str]) -> E:
        """This error with the inputs it names called otherwise (``params``: old -> new library name),
        e.g. a resolver's ``checkpoint`` as the caller's ``draft_model``."""
        return self._with(tuple(replace(p, param=params[p.param]) if isinstance(p, Name) and p.param in params
                                else p for p in self.parts))

    def flagged(self: E, flags: Mapping[str, str]) -> E:
        """This error with the inputs it names shown as ``flags`` (library name -> flag) on the command line."""
        return self._with(tuple(replace(p, flag=flags[p.param]) if isinstance(p, Name) and p.param in flags
                                else p for p in self.parts))

    def _with(self: E, parts: tuple[str | Name, ...]) -> E:
        # the same class and attributes, other parts (subclasses take other constructor arguments)
        new = type(self).__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.parts = parts
        new.args = (_render(parts, False),)
        return new


class UsageError(SpecparityError):
    exit_code = EXIT_USAGE


class InputError(UsageError):
    """A bad input value, named as the library names it.

    param: the input's name (``rule``, ``prompt-ids``, ``width``); a command exposes it as the
    flag ``--<param>``, and the CLI prints the message that way (:meth:`as_flag`). An in-process
    caller reads the library's word. detail: what is wrong with it.
    """

    def __init__(self, param: str, detail: str):
        self.param = param
        self.detail = detail
        super().__init__(Name(param), "" if detail.startswith((":", ";", ",")) else " ", detail)


class Inconclusive(SpecparityError):
    exit_code = EXIT_INCONCLUSIVE


class InfrastructureError(SpecparityError):
    exit_code = EXIT_INFRA


class CheckpointError(InfrastructureError):
    exit_code = EXIT_INFRA


def first_line(text: str) -> str:
    """The first line of a message; the rest (a loader's list, a stack of causes) is behind --debug."""
    lines = [ln for ln in str(text).strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    if len(lines) == 1:
        return lines[0]
    return f"{lines[0].rstrip()} ... ({len(lines) - 1} more lines with --debug)"


class Terminated(KeyboardInterrupt):
    """SIGTERM (exit 143) or SIGHUP (a closed terminal, exit 129) stopped the run: handled as Ctrl-C is
    (records close as interrupted, every server stops).

    signum: the signal. signal_name: ``SIGTERM`` / ``SIGHUP`` (a record's ``error``). exit_code: the shell's
    128 + the signal's number. line: what the CLI prints for it.
    """

    def __init__(self, signum: int = signal.SIGTERM):
        self.signum = int(signum)
        super().__init__(f"terminated by {self.signal_name}")

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return EXIT_HUNG_UP if self.signum == signal.SIGHUP else EXIT_TERMINATED

    @property
    def line(self) -> str:
        return "Hung up (SIGHUP)." if self.signum == signal.SIGHUP else "Terminated."
