"""The served job as data: its pairings, widths, prompts, params, sequence, controls and distribution spec.

Reading one from a file or the command line, checked, is :mod:`specparity.harness.config`'s
(the keys are documented there); planning its arms is :mod:`specparity.harness.plan`'s.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

DEFAULT_SEQUENCE = ("fresh", "repeat", "shared-prefix", "stream", "multi-turn")

DEFAULT_PROMPTS = [
    "Speculative decoding drafts several tokens with a small model and verifies them",
    "The cache holds keys and values for every position; a rewind trims the rejected rows.",
    "def add(a, b):\n    return a + b\nfor i in range(10):\n",
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.",
]


@dataclass
class Pairing:
    """One target and drafter on one server profile.

    environment: the pinned environment its servers run in (specparity.environments), over the
    profile's own (None: the profile's).
    """

    name: str
    target: str
    draft: str | None
    profile: str = "mlx-lm"
    trust_remote_code: bool = False
    environment: str | None = None


@dataclass
class Control:
    """An env control arm: a separate drafter server at ``width`` with ``env`` set."""

    name: str
    env: dict[str, str]
    width: int


DEFAULT_DIST_REQUESTS = 600
DEFAULT_ALPHA = 1e-3


@dataclass
class DistSpec:
    """The job's ``distribution`` key: temperature > 0 arms (harness.distribution).

    temperature: the sampling temperature (> 0). requests: N per arm (the baseline, the
      drafted arm, and the wrong-temperature control each get N).
    prefix: tokens per request; the histogram is over the emitted k-prefix.
    alpha: each test's false-rejection probability. seed: the first request seed.
    width: verify rows of the drafted server (None: the job's widest).
    """

    temperature: float = 0.7
    requests: int = DEFAULT_DIST_REQUESTS
    prefix: int = 1
    alpha: float = DEFAULT_ALPHA
    seed: int = 0
    width: int | None = None


@dataclass
class Job:
    """A whole served job (see the module docstring for each key)."""

    pairings: list[Pairing]
    widths: list[int] = field(default_factory=lambda: [2, 3, 4])
    width_mode: str = "process"
    max_tokens: int = 48
    prompts: list[str] = field(default_factory=lambda: list(DEFAULT_PROMPTS))
    params: dict[str, Any] = field(default_factory=dict)
    endpoint: str | None = None
    sequence: list[str] = field(default_factory=lambda: list(DEFAULT_SEQUENCE))
    concurrency: int = 0
    self_draft: bool = False
    repeats: int = 0
    extra_args: dict[str, list[str]] = field(default_factory=dict)
    controls: list[Control] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    start_timeout: float = 120.0
    request_timeout: float | None = None  # None: derived from what the job measures (harness.limits)
    source: str = "built-in"
    distribution: DistSpec | None = None
    reference: bool = True
    reference_beside: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
