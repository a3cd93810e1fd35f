"""Results of a served job: request, arm, pairing and job, each with ``to_dict`` and ``from_dict``.

What a record holds is exactly ``to_dict``; ``from_dict`` reads it back
(``records merge`` rebuilds a job's results from its shards' records this way).
Nothing here imports mlx, numpy or the runner: ``records`` commands read these.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from specparity.completions import CompletionDifference
from specparity.harness.client import Completion
from specparity.harness.evidence import Evidence
from specparity.harness.limits import limits_line
from specparity.harness.plan import BASELINE_END, BASELINE_START, DRAFTING_KINDS, ArmKind, WidthMode
from specparity.harness.profiles import Width
from specparity.verdicts import ReportMixin, Verdict, combine


# how groups and findings name classic decode computed in process (harness.oracle)
CLASSIC = "classic decode"
# an arm's name -> its request lines (RequestResult.to_dict each), where a record keeps them apart
ArmRequests = Callable[[str], list[dict[str, Any]]]
# the two baselines a group counts as one ("baseline x2"); any other arm is named
BASELINES = (BASELINE_START, BASELINE_END)


def _completion_from_dict(d: dict[str, Any]) -> Completion:
    names = Completion.__dataclass_fields__
    c = Completion(**{k: v for k, v in d.items() if k in names})
    if c.top is not None:
        c.top = [[(int(i), float(lp)) for i, lp in tok] for tok in c.top]
    return c


@dataclass
class RequestResult:
    """One request of one arm: what was sent, what came back, what it proves.

    id, kind: the request's (client.Request). verdict, reason: the judge's.
    completion: what the server returned. request: the request as sent (``Request.to_dict``).
    evidence: what showed the drafter ran (or was declined).
    divergence: where the completion first differs from what its verdict rests on (classic decode
      where the reference decides, else baseline-start's answer).
    replay: a command that reproduces the divergence in process (None: none printed; see reproduction).
    reference: classic decode's answer in short (sha256, tokens, finish_reason, path, prompt_check)
      or why there is none (error); None when no reference was asked for.
    classic: where the completion first differs from classic decode (None: equal, or no reference).
    baseline: where it first differs from baseline-start's answer to the same request (None: equal).
    cold: where it first differs from its own first answer (an earlier request of the same arm with
      the same body: request.repeats), None: equal or no such request.
    tie: for an engine whose arithmetic is not MLX's, how confident the difference from classic decode
      is (specparity.reference.TieCall as a dict: near_tie / confident / unknown, both margins).
    reproduction: the command that reproduces the finding in process, or the reason there is none.
    """

    id: str
    kind: str
    verdict: Verdict
    reason: str
    completion: Completion
    request: dict[str, Any]
    evidence: Evidence = field(default_factory=Evidence)
    divergence: CompletionDifference | None = None
    replay: str | None = None
    reference: dict[str, Any] | None = None
    classic: CompletionDifference | None = None
    baseline: CompletionDifference | None = None
    cold: CompletionDifference | None = None
    tie: dict[str, Any] | None = None
    reproduction: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        def diff(d: CompletionDifference | None) -> dict[str, Any] | None:
            return d.to_dict() if d is not None else None

        return {"id": self.id, "kind": self.kind, "verdict": self.verdict, "reason": self.reason,
                "request": self.request, "sha256": self.completion.sha256, "text": self.completion.text,
                "completion": self.completion.to_dict(), "evidence": self.evidence.to_dict(),
                "divergence": diff(self.divergence), "replay": self.replay, "reference": self.reference,
                "classic": diff(self.classic), "baseline": diff(self.baseline), "cold": diff(self.cold),
                "tie": self.tie, "reproduction": self.reproduction}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RequestResult:
        def diff(key: str) -> CompletionDifference | None:
            v = d.get(key)
            return CompletionDifference.from_dict(v) if isinstance(v, dict) else None

        return cls(str(d["id"]), str(d["kind"]), Verdict(d["verdict"]), str(d.get("reason") or ""),
                   _completion_from_dict(d.get("completion") or {}), dict(d.get("request") or {}),
                   Evidence.from_dict(d.get("evidence") or {}), diff("divergence"), d.get("replay"),
                   d.get("reference"), diff("classic"), diff("baseline"), diff("cold"), d.get("tie"),
                   d.get("reproduction"))


@dataclass
class ArmResult:
    """One arm: its server, its requests and its verdict.

    name, kind: as planned (plan.ArmPlan). width: verify width and the server's setting
    (None without a drafter). served_by: process (its own server) or request (a shared
    server, the width per request). server: argv, env, log, pid, exit code, start-up seconds.
    seconds: the arm's wall time; generation_seconds: its requests' own time.
    acceptance: accepted / proposed over every witnessed round (None: no rounds).
    notes: more report lines (the distribution arms' tests and controls).
    dist: the distribution arms' tests (harness.distribution.DistResult as a dict; None for other arms).
    digest: sha256 over the arm's (request id, completion sha256) pairs.
    """

    name: str
    kind: ArmKind
    width: Width | None
    verdict: Verdict = Verdict.ERROR
    reason: str = ""
    served_by: WidthMode = WidthMode.PROCESS
    requests: list[RequestResult] = field(default_factory=list)
    server: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    generation_seconds: float = 0.0
    acceptance: float | None = None
    notes: list[str] = field(default_factory=list)
    dist: dict[str, Any] | None = None

    @property
    def digest(self) -> str:
        h = hashlib.sha256()
        for r in self.requests:
            h.update(f"{r.id}={r.completion.sha256};".encode())
        return h.hexdigest()

    @property
    def drafts(self) -> bool:
        return self.kind in DRAFTING_KINDS

    def to_dict(self, with_requests: bool = False) -> dict[str, Any]:
        w = self.width
        d: dict[str, Any] = {
            "name": self.name, "kind": self.kind, "width": w.rows if w else None,
            "setting": w.setting if w else None, "setting_name": w.setting_name if w else None,
            "verdict": self.verdict, "reason": self.reason, "served_by": self.served_by,
            "server": self.server, "seconds": round(self.seconds, 3),
            "generation_seconds": round(self.generation_seconds, 3), "acceptance": self.acceptance,
            "digest": self.digest, "requests": len(self.requests),
            "verdicts": {r.id: r.verdict for r in self.requests}, "notes": self.notes}
        if self.dist is not None:
            d["dist"] = self.dist
        if with_requests:
            d["requests"] = [r.to_dict() for r in self.requests]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], requests: list[dict[str, Any]] | None = None) -> ArmResult:
        """An arm from its record line; ``requests``: its request lines (else those inside ``d``)."""
        rows = requests if requests is not None else (d["requests"] if isinstance(d.get("requests"), list) else [])
        width = (Width(int(d["width"]), int(d["setting"]), str(d.get("setting_name") or "setting"))
                 if d.get("width") is not None and d.get("setting") is not None else None)
        return cls(str(d["name"]), ArmKind(d["kind"]), width, Verdict(d["verdict"]), str(d.get("reason") or ""),
                   WidthMode(d.get("served_by") or WidthMode.PROCESS), [RequestResult.from_dict(r) for r in rows],
                   dict(d.get("server") or {}), float(d.get("seconds") or 0.0),
                   float(d.get("generation_seconds") or 0.0), d.get("acceptance"), list(d.get("notes") or []),
                   d.get("dist"))


@dataclass
class PairingResult:
    """One pairing (target, drafter, profile): its arms, findings and verdict.

    causes: per request that left classic decode, the cause its finding names, as fields
    (harness.judge.request_causes: request, arms, whom, state, cause, finding, ...).
    request_limits: how its requests' time limits were set and each arm's (harness.limits.RequestLimits).
    time: where its wall time went, in seconds by phase (harness.run.Clock.to_dict).
    """

    name: str
    profile: str
    target: str
    draft: str | None
    verdict: Verdict = Verdict.NOT_RUN
    reason: str = ""
    arms: list[ArmResult] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    width_mode: WidthMode = WidthMode.PROCESS
    reference: dict[str, str] = field(default_factory=dict)
    reference_cost: dict[str, Any] | None = None
    causes: list[dict[str, Any]] = field(default_factory=list)
    memory: dict[str, Any] | None = None
    request_limits: dict[str, Any] | None = None
    time: dict[str, Any] | None = None

    def _reference_digest(self, request_ids: list[str]) -> str | None:
        if not request_ids or any(rid not in self.reference for rid in request_ids):
            return None
        h = hashlib.sha256()
        for rid in request_ids:
            h.update(f"{rid}={self.reference[rid]};".encode())
        return h.hexdigest()

    def groups(self) -> list[list[str]]:
        """Arms grouped by digest (order of first appearance); classic decode is a member of its own."""
        by: dict[str, list[str]] = {}
        ref: str | None = None
        for a in self.arms:
            if a.requests and a.verdict != Verdict.ERROR and a.kind != ArmKind.DISTRIBUTION:
                if ref is None:
                    ref = self._reference_digest([r.id for r in a.requests])
                    if ref is not None:
                        by.setdefault(ref, []).append(CLASSIC)
                by.setdefault(a.digest, []).append(a.name)
        return list(by.values())

    def request_groups(self) -> dict[str, list[list[str]]]:
        """Per request id, the arms grouped by that request's completion sha256 (classic decode too)."""
        out: dict[str, dict[str, list[str]]] = {}
        for a in self.arms:
            if a.kind == ArmKind.DISTRIBUTION:
                continue
            for r in a.requests:
                if r.completion.ok:
                    if r.id not in out and r.id in self.reference:
                        out[r.id] = {self.reference[r.id]: [CLASSIC]}
                    out.setdefault(r.id, {}).setdefault(r.completion.sha256, []).append(a.name)
        return {k: list(v.values()) for k, v in out.items()}

    def arm(self, name: str) -> ArmResult | None:
        return next((a for a in self.arms if a.name == name), None)

    def to_dict(self, with_requests: bool = False) -> dict[str, Any]:
        return {"name": self.name, "profile": self.profile, "target": self.target, "draft": self.draft,
                "verdict": self.verdict, "reason": self.reason, "width_mode": self.width_mode,
                "groups": self.groups(), "request_groups": self.request_groups(),
                "findings": self.findings, "causes": self.causes, "reference": self.reference,
"reference_cost": self.reference_cost, "memory": self.memory,
                "request_limits": self.request_limits, "time": self.time,
                "arms": [a.to_dict(with_requests) for a in self.arms]}

    def cause(self, arm: str, request: str) -> dict[str, Any] | None:
        """The cause named for ``request`` where ``arm`` is among the arms that left classic decode."""
        return next((c for c in self.causes if c.get("request") == request and arm in (c.get("arms") or [])), None)

    @classmethod
    def from_dict(cls, d: dict[str, Any], requests: ArmRequests | None = None) -> PairingResult:
        """A pairing from its ``to_dict``; ``requests``: arm name -> that arm's request lines (a record
        keeps them in their own files), else each arm's own list (``to_dict(with_requests=True)``)."""
        return cls(str(d["name"]), str(d.get("profile")), str(d.get("target")), d.get("draft"), Verdict(d["verdict"]),
                   str(d.get("reason") or ""),
                   [ArmResult.from_dict(a, requests(str(a["name"])) if requests is not None else None)
                    for a in d.get("arms") or []],
                   list(d.get("findings") or []), WidthMode(d.get("width_mode") or WidthMode.PROCESS),
                   dict(d.get("reference") or {}), d.get("reference_cost"), list(d.get("causes") or []),
                   d.get("memory"), d.get("request_limits"), d.get("time"))


def _mb(n: Any) -> str:
    return f"{n / 2**20:.0f} MB" if isinstance(n, (int, float)) else "unknown"


def memory_lines(mem: dict[str, Any] | None) -> list[str]:
    """A pairing's measured memory, as the report states it (``PairingResult.memory``)."""
    if not mem:
        return []
    servers = mem.get("servers_peak_rss_bytes") or {}
    out = [f"  memory: largest server {_mb(mem.get('largest_server_bytes'))} peak RSS"
           + (f" ({', '.join(f'{k} {_mb(v)}' for k, v in servers.items())})" if servers else "")]
    workers = mem.get("reference_workers_peak_rss_bytes") or []
    if workers:
        where = "beside the servers (opted in)" if mem.get("reference_beside") else "while no server ran"
        # one peak per load of the target (a worker that gave its weights back and loaded again has two)
        out.append(f"  memory: classic reference loaded {len(workers)} time(s) {where}, peak RSS"
                   f" {', '.join(_mb(w) for w in workers)}")
    if mem.get("peak_total_bytes"):
        ratio = mem.get("peak_total_over_largest_server")
        every = mem.get("peak_sampled_every_s")
        out.append(f"  memory: every process together at most {_mb(mem['peak_total_bytes'])} (sampled"
                   + (f" at least every {every:.2g} s" if isinstance(every, (int, float)) else "")
                   + f", the harness's own {_mb(mem.get('harness_peak_rss_bytes'))} included)"
                   + (f", {ratio:.2f}x the largest server" if isinstance(ratio, (int, float)) else "")
                   + (f"; expected {_mb(mem.get('expected_bytes'))} before it started" if mem.get("expected_bytes")
                      else ""))
    return out


def time_lines(spent: dict[str, Any] | None) -> list[str]:
    """Where a pairing's wall time went (``PairingResult.time``), as the report states it."""
    if not spent or not spent.get("wall_s"):
        return []
    wall = spent["wall_s"]
    parts = ", ".join(f"{k.removesuffix('_s').replace('_', ' ')} {v:.1f} s" for k, v in spent.items()
                      if k != "wall_s" and isinstance(v, (int, float)) and v >= 0.05)
    return [f"  time: {wall:.1f} s wall: {parts}"]


def format_groups(groups: list[list[str]]) -> str:
    """``2 groups: {classic decode, baseline x2, w2, w3} {w4, w8}``."""
    def one(g: list[str]) -> str:
        names = [n for n in g if n == CLASSIC]
        base = [n for n in g if n in BASELINES]
        if len(base) > 1:
            names.append(f"baseline x{len(base)}")
        else:
            names += base
        names += [n for n in g if n not in BASELINES and n != CLASSIC]
        return "{" + ", ".join(names) + "}"
    return f"{len(groups)} group{'s' if len(groups) != 1 else ''}: " + " ".join(one(g) for g in groups)


def groups_lines(groups: list[list[str]], request_groups: Mapping[str, list[list[str]]],
                 label: str = "") -> list[str]:
    """A pairing's groups line (``label`` before it) and a line per request its arms split; no groups line
    where no arm answered (a profile that cannot run here)."""
    out = [f"  {label}{format_groups(groups)}"] if groups else []
    return out + [f"    request {rid}: {format_groups(gs)}" for rid, gs in request_groups.items() if len(gs) > 1]


# request verdicts a report lists one by one (a baseline's not_engaged is what a baseline is)
_LISTED = (Verdict.DIVERGED, Verdict.ERROR, Verdict.DECLINED, Verdict.LOSSY)


@dataclass
class ServedReport(ReportMixin):
    """The whole job: one result per pairing; the verdict is their combination.

    job: the job as run (config.Job.to_dict). wall_seconds: the run's wall time.
    shard: for ``--shard i/n``, {index, count, plan, arms}; None unsharded or merged.
    """

    pairings: list[PairingResult]
    job: dict[str, Any]
    wall_seconds: float = 0.0
    shard: dict[str, Any] | None = None

    @property
    def verdict(self) -> Verdict:
        return combine([p.verdict for p in self.pairings])

    def server_seconds(self) -> float:
        """The servers' own start-up plus generation time (the bench's denominator)."""
        return sum((a.server.get("start_seconds") or 0.0) + a.generation_seconds
                   for p in self.pairings for a in p.arms)

    def to_dict(self, with_requests: bool = False) -> dict[str, Any]:
        d = {"verdict": self.verdict, "exit_code": self.exit_code, "wall_seconds": round(self.wall_seconds, 3),
             "server_seconds": round(self.server_seconds(), 3),
             "pairings": [p.to_dict(with_requests) for p in self.pairings], "job": self.job}
        if self.shard is not None:
            d["shard"] = self.shard
        return d

    def result_dict(self) -> dict[str, Any]:
        """The whole result, as ``--json`` prints it: :meth:`to_dict` with every arm's requests in full
        (first difference, margins, tie, evidence, reproduction), each with ``cause``: what its pairing's
        finding says of it (whom it concerns, whether it needs a warm cache), None where none is named."""
        d = self.to_dict(with_requests=True)
        for p, pd in zip(self.pairings, d["pairings"]):
            for a, ad in zip(p.arms, pd["arms"]):
                for r, rd in zip(a.requests, ad["requests"]):
                    c = p.cause(a.name, r.id)
                    rd["cause"] = c["cause"] if c is not None else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any],
                  requests: Callable[[str, str], list[dict[str, Any]]] | None = None) -> ServedReport:
        """The job's results from its ``to_dict`` (a record's summary); ``requests``: (pairing, arm) ->
        that arm's request lines, else each arm's own list (``to_dict(with_requests=True)``)."""
        def of(pairing: str) -> ArmRequests | None:
            return (lambda arm: requests(pairing, arm)) if requests is not None else None

        return cls([PairingResult.from_dict(p, of(str(p["name"]))) for p in d.get("pairings") or []],
                   dict(d.get("job") or {}), float(d.get("wall_seconds") or 0.0), d.get("shard"))

    def lines(self) -> list[str]:
        out: list[str] = []
        if self.shard is not None:
            runs = "; ".join(f"{p}: {', '.join(a)}" for p, a in self.shard["arms"].items()) or "no arms"
            out.append(f"shard {self.shard['index']}/{self.shard['count']}: {runs}"
                       " (join the shards with specparity records merge)")
        for p in self.pairings:
            out.append(f"pairing {p.name}: {p.profile} server, target {p.target}, drafter {p.draft}"
                       f" (widths served per {p.width_mode})")
            for a in p.arms:
                w = f" {a.width.describe()}" if a.width is not None else ""
                acc = f", acceptance {a.acceptance:.3f}" if a.acceptance is not None else ""
                out.append(f"  {a.name:<16} {a.verdict:<12}{w} {len(a.requests)} requests{acc}"
                           + (f": {a.reason}" if a.reason else ""))
                out += [f"    {n}" for n in a.notes]
                if a.kind == ArmKind.DISTRIBUTION:
                    continue
                for r in a.requests:
                    if r.verdict in _LISTED or (r.verdict == Verdict.NOT_ENGAGED and a.kind != ArmKind.BASELINE):
                        out.append(f"    {r.id} ({r.kind}): {r.verdict}: {r.reason}")
                        rep = r.reproduction or ({"command": r.replay} if r.replay else None)
                        if rep and rep.get("command"):
                            out.append(f"      reproduce in process: {rep['command']}")
                        elif rep and rep.get("reason"):
                            out.append(f"      not reproducible in process: {rep['reason']}")
            out += groups_lines(p.groups(), p.request_groups())
            out += [f"  finding: {f}" for f in p.findings]
            if p.reference_cost:
                c = p.reference_cost
                out.append(f"  classic reference: {c.get('computed')} distinct requests decoded in process"
                           f" ({c.get('tokens')} tokens, {c.get('seconds', 0.0):.2f} s, model load"
                           f" {c.get('load_seconds', 0.0):.2f} s), {c.get('hits')} answered from its cache")
            out += memory_lines(p.memory)
            limits = limits_line(p.request_limits)
            if limits:
                out.append(limits)
            out += time_lines(p.time)
            out.append(f"  pairing verdict: {p.verdict}" + (f" ({p.reason})" if p.reason else ""))
        return out

