"""Plan: the arms a served job runs for one pairing, in run order, and the requests each arm sends.

Arms (their kinds are :class:`ArmKind`):

    baseline-start   no drafter: the server's own reference completions
    w<T>             the drafter at T verify rows (a :class:`Width`: rows and the server's setting)
    self-draft       the target as its own drafter, at the widest width
    concurrent       the sequence sent N requests at once, no drafter
    <control>        env control arms: a drafter server with env set
    baseline-end     no drafter again: the noise floor
    repeat<i>        optional extra baseline processes
    dist-baseline    temperature > 0: seeded draws without a drafter (harness.distribution)
    dist-w<T>        temperature > 0: seeded draws with the drafter at T verify rows

Each built-in name is a constant here (BUILTIN_ARM_NAMES, BUILTIN_ARM_PATTERN): code and job
validation import them rather than spell them.

A :class:`~specparity.harness.profiles.Width` is made once, by the profile (:meth:`Profile.width`), and
carried whole from here to the server's argv, the request field, the evidence
and the printed reproduction: nothing converts rows to a setting again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specparity.harness.client import Request
from specparity.harness.job import Job
from specparity.harness.profiles import Width
from specparity.paths import slugify

if TYPE_CHECKING:
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

# The built-in arms' names (each is also its server key). A job's own arms (controls) must not take
# one: a control named like a built-in arm would share its server and its records.
BASELINE_START = "baseline-start"
BASELINE_END = "baseline-end"
SELF_DRAFT = "self-draft"
CONCURRENT = "concurrent"
DIST_BASELINE = "dist-baseline"
# the server key of the one drafter server that serves every width per request
SHARED_DRAFTER = "drafter"
# the request ids of dist-baseline's wrong-temperature control draws (harness.distribution)
DIST_WRONG_T = "dist-wrong-t"
BUILTIN_ARM_NAMES = (BASELINE_START, BASELINE_END, SELF_DRAFT, CONCURRENT, DIST_BASELINE, SHARED_DRAFTER)
# the names built-in arms take by number: w<T>, repeat<i>, dist-w<T>
BUILTIN_ARM_PATTERN = re.compile(r"(dist-)?w\d+|repeat\d+")


def request_stem(pairing: str, arm: str) -> str:
    """The stem of the record file (JSONL) holding one arm's requests: no two arms of a job may share one."""
    return slugify(f"{pairing}-{arm}")


def is_builtin_arm_name(name: str) -> bool:
    """A name a built-in arm (or server) may take: no job's own arm can have it."""
    return name in BUILTIN_ARM_NAMES or BUILTIN_ARM_PATTERN.fullmatch(name) is not None


class WidthMode(StrEnum):
    """How widths reach servers: a server per width, or one drafter server with the width per request."""

    PROCESS = "process"
    REQUEST = "request"


class Drafter(StrEnum):
    """Which of the pairing's checkpoints an arm's server loads as its drafter.

    The plan names the role, not a path: the runner prepares the checkpoints (witness wrappers,
    engine exports) after planning, and maps the role to what it prepared.
    """

    DRAFT = "draft"  # the pairing's drafter
    TARGET = "target"  # the target drafting for itself (self-draft)


@dataclass
class ArmPlan:
    """One arm before it runs.

    name: as records show it. kind: what it is for. width: verify width (None: no drafter).
    draft: which checkpoint the server loads as its drafter (None: none). env: extra server env.
    concurrency: requests sent at once (0: one at a time). server_key: arms with the same key
    share one server process. server_width: the width the server process is started with
    (the widest, for a server that takes the width per request).
    """

    name: str
    kind: ArmKind
    width: Width | None = None
    draft: Drafter | None = None
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


def repeat_arm_name(i: int) -> str:
    """The i-th extra baseline process (from 1)."""
    return f"repeat{i}"


def dist_arm_name(rows: int) -> str:
    """The drafted distribution arm at ``rows`` verify rows."""
    return f"dist-{width_arm_name(rows)}"


def self_draft_refusal(profile: Profile, target: str, own_code: bool | None = None) -> str | None:
    """Why the target cannot be its own drafter on ``profile`` ("" where the profile drafts with nothing), or None
    where it can (:func:`plan_arms` plans the self-draft arm, and its server holds the target twice: harness.memory)."""
    if not profile.draft_argv:
        return ""
    if own_code is None:
        try:
            config = json.loads((Path(target) / "config.json").read_text())
        except (OSError, ValueError):
            config = {}
        own_code = isinstance(config, dict) and "model_file" in config
    if own_code and "draft" not in profile.witness:
        # the target as its own drafter is loaded unwrapped, and servers load drafters without trust_remote_code
        return (f"no self-draft arm: {profile.name}'s server loads a drafter without trust_remote_code, and this"
                " target ships its own model_file")
    limit = profile.engine_hooks().max_width(target)
    if limit is not None and limit < 2:
        # an engine whose drafters are of their own format cannot take the target as one: the default arm is
        # left out with the reason, never run to be not_run (which would make every such job not_run)
        return (f"no self-draft arm: {profile.name} cannot draft with the target itself (its engine takes drafters"
                " of its own format)")
    return None


def plan_arms(job: Job, profile: Profile, drafts: bool, self_drafts: bool) -> tuple[list[ArmPlan], WidthMode]:
    """Every arm of one pairing in the order they run (the distribution arms last), and whether
    widths share a server (request) or not (process).

    drafts: the pairing has a drafter. self_drafts: the target can be its own drafter here (the
    profile loads drafters, and the target's code allows it: PairingRun decides).
    """
    mode = WidthMode(job.width_mode)
    if mode == WidthMode.REQUEST and not profile.per_request:
        mode = WidthMode.PROCESS
    widest = profile.width(max(job.widths)) if job.widths else None
    draft = Drafter.DRAFT if drafts else None
    arms = [ArmPlan(BASELINE_START, ArmKind.BASELINE, server_key=BASELINE_START)]
    if draft is not None:
        for rows in job.widths:
            w = profile.width(rows)
            name = width_arm_name(rows)
            if mode == WidthMode.REQUEST:
                arms.append(ArmPlan(name, ArmKind.WIDTH, w, draft, server_key=SHARED_DRAFTER, server_width=widest))
            else:
                arms.append(ArmPlan(name, ArmKind.WIDTH, w, draft, server_key=name, server_width=w))
    if job.self_draft and self_drafts and widest is not None:
        arms.append(ArmPlan(SELF_DRAFT, ArmKind.SELF_DRAFT, widest, Drafter.TARGET, server_key=SELF_DRAFT,
                            server_width=widest))
    if job.concurrency:
        arms.append(ArmPlan(CONCURRENT, ArmKind.CONCURRENT, concurrency=job.concurrency, server_key=CONCURRENT))
    if draft is not None:
        for c in job.controls:
            w = profile.width(c.width)
            arms.append(ArmPlan(c.name, ArmKind.CONTROL, w, draft, dict(c.env), server_key=c.name, server_width=w))
    arms.append(ArmPlan(BASELINE_END, ArmKind.BASELINE, server_key=BASELINE_END))
    for i in range(1, job.repeats + 1):
        arms.append(ArmPlan(repeat_arm_name(i), ArmKind.REPEAT, server_key=repeat_arm_name(i)))
    if job.distribution is not None and draft is not None:
        spec = job.distribution
        w = profile.width(spec.width or max(job.widths or [2]))
        arms += [ArmPlan(DIST_BASELINE, ArmKind.DISTRIBUTION, server_key=DIST_BASELINE),
                 ArmPlan(dist_arm_name(w.rows), ArmKind.DISTRIBUTION, w, draft, server_key=dist_arm_name(w.rows),
                         server_width=w)]
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
