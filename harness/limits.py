"""Request time limits: what one served request may take, derived from what the job measured.

A fixed limit cannot fit every model and machine (a 0.5B float32 model on two CPU cores takes
about 35 s a request; three of them batched take over 120 s). So a request's limit follows from
the job's own measurements, unless the user sets one (``--request-timeout``, the job key
``request_timeout``), which then holds for every request:

    expected  the same request's time on a drafter-less server sent one at a time (the baselines),
              else classic decode's time for it in process (decoded once the first server is gone),
              else the slowest measured seconds per emitted token times the request's max_tokens
    factor    the arm's concurrency (a batch of N shares the machine) times its verify rows where it
              drafts (at worst a round verifies W rows and drafts W - 1 tokens for each one kept)
    limit     max(floor, margin x factor x expected); ``unmeasured`` before anything is measured

    limits = RequestLimits(LimitRule(), override=None)
    limits.observe("p0", seconds=1.2, tokens=32, source="baseline-start")
    limits.limit(plan, request)        # seconds
    limits.to_dict()                   # what the record states
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specparity.harness.client import Request
    from specparity.harness.plan import ArmPlan

# the classic reference's own answers, decoded in process once the first server is gone
CLASSIC = "classic decode"


@dataclass(frozen=True)
class LimitRule:
    """How a derived limit is made from a measurement.

    margin: the multiple of the expected time a request may take. floor: the least limit (the fixed
    limit the harness had before limits were derived: a derived limit never ends a request sooner).
    unmeasured: the limit of a request sent before anything was measured.
    """

    margin: float = 4.0
    floor: float = 120.0
    unmeasured: float = 600.0


@dataclass
class Seen:
    """One request's measured time: the slowest seen, in seconds, and the tokens it emitted."""

    seconds: float
    tokens: int
    source: str


@dataclass
class RequestLimits:
    """The limits of one pairing's requests (see the module docstring).

    override: the user's limit in seconds (every request), None: derived.
    by_request: request id -> its slowest measured time. arms: arm name -> the least and the most
    limit its requests were sent under, and the factor applied.
    """

    rule: LimitRule = field(default_factory=LimitRule)
    override: float | None = None
    by_request: dict[str, Seen] = field(default_factory=dict)
    arms: dict[str, dict[str, Any]] = field(default_factory=dict)

    def observe(self, request_id: str, seconds: float, tokens: int | None, source: str) -> None:
        """A request answered in ``seconds`` (``tokens`` emitted) by ``source``: a drafter-less server
        sending one request at a time, or classic decode in process (:data:`CLASSIC`)."""
        seen = self.by_request.get(request_id)
        if seen is None or seconds > seen.seconds:
            self.by_request[request_id] = Seen(seconds, max(int(tokens or 0), 1), source)

    @property
    def per_token(self) -> float | None:
        """The slowest measured seconds per emitted token (None: nothing measured)."""
        return max((s.seconds / s.tokens for s in self.by_request.values()), default=None)

    def expected(self, request: Request) -> float | None:
        """The seconds ``request`` is expected to take alone on a drafter-less server (None: unknown)."""
        seen = self.by_request.get(request.id)
        if seen is not None:
            return seen.seconds
        rate = self.per_token
        if rate is None:
            return None
        return rate * max(int(request.body.get("max_tokens") or 1), 1)

    @staticmethod
    def factor(plan: ArmPlan | None) -> int:
        """The arm's concurrency times its verify rows where it drafts (1 for a sequential baseline)."""
        if plan is None:
            return 1
        rows = plan.width.rows if plan.drafts and plan.width is not None else 1
        return max(1, plan.concurrency) * rows

    def limit(self, plan: ArmPlan | None, request: Request) -> float:
        """The seconds ``request`` may take in ``plan``'s arm (noted in :attr:`arms`)."""
        factor = self.factor(plan)
        if self.override is not None:
            out = self.override
        else:
            expected = self.expected(request)
            out = (self.rule.unmeasured if expected is None
                   else max(self.rule.floor, math.ceil(self.rule.margin * factor * expected)))
        if plan is not None:
            arm = self.arms.setdefault(plan.name, {"least_s": out, "most_s": out, "factor": factor})
            arm["least_s"], arm["most_s"] = min(arm["least_s"], out), max(arm["most_s"], out)
        return out

    def answer_limit(self) -> float:
        """The seconds the classic reference may take for one answer: as long as the slowest request may
        take alone, and never under ``unmeasured`` (its first answer includes its warm-up)."""
        if self.override is not None:
            return max(self.override, 60.0)
        slowest = max((s.seconds for s in self.by_request.values()), default=0.0)
        return max(self.rule.unmeasured, math.ceil(self.rule.margin * slowest))

    def to_dict(self) -> dict[str, Any]:
        """What the record states: how limits were set, from what, and each arm's."""
        rate = self.per_token
        return {"source": "override" if self.override is not None else "derived", "override_s": self.override,
                **asdict(self.rule),
                "measured": {k: {"seconds": round(v.seconds, 3), "tokens": v.tokens, "source": v.source}
                             for k, v in self.by_request.items()},
                "per_token_s": round(rate, 4) if rate is not None else None,
                "arms": self.arms}


def limits_line(d: dict[str, Any] | None) -> str | None:
    """A pairing's request limits as the report states them (``RequestLimits.to_dict``)."""
    if not d:
        return None
    arms = d.get("arms") or {}

    def span(a: dict[str, Any]) -> str:
        lo, hi = a.get("least_s"), a.get("most_s")
        return f"{lo:g} s" if lo == hi else f"{lo:g}-{hi:g} s"

    each = ", ".join(f"{name} {span(a)}" for name, a in arms.items())
    if d.get("source") == "override":
        return f"  request time limit: {d.get('override_s'):g} s, set by the user (--request-timeout or the" \
               f" job's request_timeout){f': {each}' if each else ''}"
    measured = d.get("measured") or {}
    slowest = max((m.get("seconds") or 0.0 for m in measured.values()), default=None)
    basis = (f"the slowest of {len(measured)} measured requests {slowest:.2f} s, {d.get('per_token_s')} s per token"
             if slowest is not None else "nothing measured")
    return (f"  request time limits: derived ({d.get('margin'):g}x the same request's measured time x the arm's"
            f" concurrency x its verify rows where it drafts, at least {d.get('floor'):g} s;"
            f" {d.get('unmeasured'):g} s before anything is measured; {basis})"
            + (f": {each}" if each else ""))


def plan_line(override: float | None, rule: LimitRule = LimitRule()) -> str:
    """How this job's request limits will be set, stated before it starts."""
    if override is not None:
        return f"request time limit: {override:g} s for every request (set by the user)"
    return (f"request time limits: derived from what the job measures ({rule.margin:g}x a request's measured time"
            f" x the arm's concurrency x its verify rows where it drafts, at least {rule.floor:g} s;"
            f" {rule.unmeasured:g} s before anything is measured); --request-timeout sets one for every request")
