"""Upper bounds on inputs that cost time or memory, and how a user raises each.

Below :mod:`specparity.inputs` and :mod:`specparity.schema`, which both check values against them
(a bound here, imported by both, keeps the two from importing each other).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from specparity.errors import UsageError

# Defaults: far above any real verify block or probe, far below what exhausts a machine.
DEFAULT_MAX_WIDTH = 1024
DEFAULT_MAX_POSITIONS = 16384
DEFAULT_MAX_SAMPLES = 100_000_000
DEFAULT_MAX_ITEMS = 1024

ENV = {
    "max_width": "SPECPARITY_MAX_WIDTH",
    "max_positions": "SPECPARITY_MAX_POSITIONS",
    "max_samples": "SPECPARITY_MAX_SAMPLES",
    "max_items": "SPECPARITY_MAX_ITEMS",
}
OPTION = {
    "max_width": "--max-width",
    "max_positions": "--max-positions",
    "max_samples": "--max-samples",
    "max_items": "--max-items",
}


@dataclass(frozen=True)
class Limits:
    """Upper bounds on inputs that cost time or memory.

    max_width: verify rows W of one block (probe widths, bisect/replay/gate width,
      a width inside a log, mlx-lm's num_draft_tokens + 1).
    max_positions: tokens decoded past the prompt (depths, the long walk, replayed
      emitted tokens, generated tokens, tested positions).
    max_samples: Monte-Carlo draws (dist --samples, accept --draws, sweep draws).
    max_items: entries of one list in a served job file (pairings, controls, prompts or the lines
      of a prompts_file, sequence, a request parameter's list such as params.stop): each becomes
      servers, requests or bytes of every request body.
    """

    max_width: int = DEFAULT_MAX_WIDTH
    max_positions: int = DEFAULT_MAX_POSITIONS
    max_samples: int = DEFAULT_MAX_SAMPLES
    max_items: int = DEFAULT_MAX_ITEMS

    @classmethod
    def from_env(cls) -> Limits:
        values: dict[str, int] = {}
        for name, var in ENV.items():
            raw = os.environ.get(var)
            if raw is None or raw.strip() == "":
                continue
            try:
                values[name] = int(raw)
            except ValueError:
                raise UsageError(f"{var}={raw!r}: not an integer") from None
            if values[name] < 1:
                raise UsageError(f"{var}={raw!r}: must be >= 1")
        return cls(**values)


_current: Limits | None = None


def limits() -> Limits:
    """The limits in force: those the CLI set, else the environment's, else the defaults."""
    return _current if _current is not None else Limits.from_env()


def set_limits(new: Limits | None) -> None:
    """Set the limits for this process (the CLI's root options); None restores the default."""
    global _current
    _current = new


def raise_it(limit: str) -> str:
    """How a user raises ``limit``: ``(raise it: specparity --max-width N ..., or SPECPARITY_MAX_WIDTH=N)``."""
    return f"(raise it: specparity {OPTION[limit]} N ..., or {ENV[limit]}=N)"
