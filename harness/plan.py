"""Plan: the arms a served job runs for one pairing, in run order, and the requests each arm sends.

Arms (their kinds are :class:`ArmKind`):

    baseline-start   no drafter: the server's own reference completions
    w<T>             the drafter at T verify rows (a :class:`Width`: rows and the server's setting)
    self-draft       the target as its own drafter, at the widest width
    concurrent       the sequence sent N requests at once, no drafter
    <control>        env control arms: a drafter server with env set
    baseline-end     no drafter again: the noise floor
    repeat<i>        optional extra baseline processes
    dist-*           the temperature > 0 distribution arms (harness.distribution)

A :class:`~specparity.harness.profiles.Width` is made once, by the profile (:meth:`Profile.width`), and
carried whole from here to the server's argv, the request field, the evidence
and the printed reproduction: nothing converts rows to a setting again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from specparity.harness.client import Request
from specparity.harness.profiles import Width

if TYPE_CHECKING:
    from specparity.harness.config import Job
    from specparity.harness.profiles import Profile


class ArmKind(StrEnum):
    """What an arm is for (its records' ``kind``)."""

    BASELINE = "baseline"
    WIDTH = "width"
    SELF_DRAFT = "self-draft"
    CONCURRENT = "concurrent"
    CONTROL = "control"
    REPEAT = "repeat"
    DISTRIBUTION = "distribution"


# arms that run the drafter (and so are judged on it); the others are baselines of a kind
DRAFTING_KINDS = (ArmKind.WIDTH, ArmKind.SELF_DRAFT, ArmKind.CONTROL)
BASELINE_START = "baseline-start"
BASELINE_END = "baseline-end"
# the server key of the one drafter server that serves every width per request
SHARED_DRAFTER = "drafter"


class WidthMode(StrEnum):
    """How widths reach servers: a server per width, or one drafter server with the width per request."""

    PROCESS = "process"
    REQUEST = "request"


@dataclass
class ArmPlan:
    """One arm before it runs.

    name: as records show it. kind: what it is for. width: verify width (None: no drafter).
    draft: the drafter checkpoint the server loads (None: none). env: extra server env.
    concurrency: requests sent at once (0: one at a time). server_key: arms with the same key
    share one server process. server_width: the width the server process is started with
    (the widest, for a server that takes the width per request).
    """

    name: str
    kind: ArmKind
    width: Width | None = None
    draft: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    concurrency: int = 0
    server_key: str = ""
    server_width: Width | None = None

    @property
    def drafts(self) -> bool:
        return self.draft is not None

    @property
    def per_request(self) -> bool:
        """Served by a shared server that takes the width per request."""
        return self.server_key == SHARED_DRAFTER


def width_arm_name(rows: int) -> str:
    return f"w{rows}"


def plan_arms(job: Job, profile: Profile, draft: str | None, self_draft: str | None) -> tuple[list[ArmPlan], WidthMode]:
    """The arms in the order they run, and whether widths share a server (request) or not (process)."""
    mode = WidthMode(job.width_mode)
    if mode == WidthMode.REQUEST and not profile.per_request:
        mode = WidthMode.PROCESS
    widest = profile.width(max(job.widths)) if job.widths else None
    arms = [ArmPlan(BASELINE_START, ArmKind.BASELINE, server_key=BASELINE_START)]
    if draft is not None:
        for rows in job.widths:
            w = profile.width(rows)
            name = width_arm_name(rows)
            if mode == WidthMode.REQUEST:
                arms.append(ArmPlan(name, ArmKind.WIDTH, w, draft, server_key=SHARED_DRAFTER, server_width=widest))
            else:
                arms.append(ArmPlan(name, ArmKind.WIDTH, w, draft, server_key=name, server_width=w))
    if job.self_draft and self_draft is not None and widest is not None:
        arms.append(ArmPlan("self-draft", ArmKind.SELF_DRAFT, widest, self_draft, server_key="self-draft",
                            server_width=widest))
    if job.concurrency:
        arms.append(ArmPlan("concurrent", ArmKind.CONCURRENT, concurrency=job.concurrency, server_key="concurrent"))
    if draft is not None:
        for c in job.controls:
            w = profile.width(c.width)
            arms.append(ArmPlan(c.name, ArmKind.CONTROL, w, draft, dict(c.env), server_key=c.name, server_width=w))
    arms.append(ArmPlan(BASELINE_END, ArmKind.BASELINE, server_key=BASELINE_END))
    for i in range(job.repeats):
        arms.append(ArmPlan(f"repeat{i + 1}", ArmKind.REPEAT, server_key=f"repeat{i + 1}"))
    return arms, mode


def build_sequence(job: Job, endpoint: str, history: Mapping[str, str]) -> list[Request]:
    """An arm's requests, in the order a client sends them.

    ``history``: the first baseline's answers by request id; the second turn of a
    multi-turn chat appends the first turn's baseline answer, so every arm sends the
    same bytes and its completion is comparable with every other arm's. A kind that
    appears twice gets a distinct id (``p0-again``, ``p0-again-2``). A request whose
    body an earlier request already sent names it in ``repeats`` (its own cold answer).
    """
    prompts = job.prompts
    common = {"max_tokens": job.max_tokens, "temperature": 0,
              **{k: v for k, v in job.params.items() if k != "stream"}}

    def body(prompt: str, stream: bool = False) -> dict[str, Any]:
        b: dict[str, Any] = dict(common)
        if endpoint == "chat":
            b["messages"] = [{"role": "user", "content": prompt}]
        else:
            b["prompt"] = prompt
        if stream:
            b["stream"] = True
        return b

    def p(i: int) -> str:
        return prompts[i % len(prompts)]

    out: list[Request] = []

    def add(req: Request) -> str:
        taken = {r.id for r in out}
        if req.id in taken:
            n = 2
            while f"{req.id}-{n}" in taken:
                n += 1
            req.id = f"{req.id}-{n}"
        out.append(req)
        return req.id

    for kind in job.sequence:
        if kind == "fresh":
            add(Request("p0", kind, endpoint, body(p(0))))
        elif kind == "repeat":
            add(Request("p0-again", kind, endpoint, body(p(0))))
        elif kind == "shared-prefix":
            add(Request("p0-prefix", kind, endpoint, body(p(0) + " " + p(1))))
        elif kind == "stream":
            add(Request("p1-stream", kind, endpoint, body(p(1), stream=True)))
        elif kind == "long":
            add(Request("long", kind, endpoint, body(" ".join(prompts) * 2)))
        elif kind == "multi-turn":
            first = {**common, "messages": [{"role": "user", "content": p(2)}]}
            first_id = add(Request("chat-1", kind, "chat", first, turn=1))
            answer = history.get(first_id)
            if answer is not None:
                msgs = [*first["messages"], {"role": "assistant", "content": answer},
                        {"role": "user", "content": p(3)}]
                add(Request("chat-2", kind, "chat", {**common, "messages": msgs}, turn=2))
    seen: dict[str, str] = {}
    for r in out:
        key = r.fingerprint()
        if key in seen:
            r.repeats = seen[key]
        else:
            seen[key] = r.id
    return out
