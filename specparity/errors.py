"""Known errors and the exit codes they map to (DESIGN.md).

    SpecparityError              base; exit_code 2 unless a subclass says otherwise
    +-- UsageError               2  bad flag, value, path or input file
    |   +-- InputError           2  a bad input named in library terms (``rule``); the CLI
    |                               prints it as the command's flag (``--rule``)
    +-- Inconclusive             3  not run, not engaged, underpowered
    +-- InfrastructureError      4  a checkpoint would not load, a server would not start
        +-- CheckpointError      4  the checkpoint exists but mlx-lm cannot load it

The CLI prints ``Error: <message>`` on one line and exits with ``exit_code``;
anything else is a bug: one line, exit 70 (``EXIT_BUG``, sysexits' EX_SOFTWARE,
never a verdict's code), and its traceback behind ``--debug``.

    KeyboardInterrupt            130  Ctrl-C (SIGINT)
    +-- Terminated               143  SIGTERM, raised in the main thread as SIGINT raises
                                      KeyboardInterrupt (harness.lifecycle.catch_sigterm)
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_DIVERGENT = 1
EXIT_USAGE = 2
EXIT_INCONCLUSIVE = 3
EXIT_INFRA = 4
EXIT_BUG = 70
EXIT_INTERRUPTED = 130  # Ctrl-C: the shell's 128 + SIGINT
EXIT_TERMINATED = 143  # SIGTERM: the shell's 128 + SIGTERM


class SpecparityError(Exception):
    """A failure the user can act on; ``str(err)`` is the one-line message."""

    exit_code = EXIT_USAGE


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
        super().__init__(self._join(param))

    def _join(self, name: str) -> str:
        return f"{name}{'' if self.detail.startswith((':', ';', ',')) else ' '}{self.detail}"

    def as_flag(self) -> str:
        """The message with the input named as its command-line flag."""
        return self._join(f"--{self.param}")


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
    """SIGTERM stopped the run: handled as Ctrl-C is (records close as interrupted), exit 143."""
