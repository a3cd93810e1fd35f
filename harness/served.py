"""Served greedy parity: servers with and without a drafter, compared by completion sha256.

For each pairing (target, drafter, profile) the job runs, each arm in its own
server process unless the profile serves all widths per request and the job
asks for that (``width_mode: request``; the report says which):

    baseline-start   no drafter: the reference completions
    w<T>             the drafter at T verify rows (mlx-lm: num_draft_tokens T - 1)
    self-draft       the target as its own drafter, at the widest width
    concurrent       the sequence sent N requests at once, no drafter
    <control>        env control arms: a drafter server with env set
    baseline-end     no drafter again: the noise floor
    repeat<i>        optional extra baseline processes

Every arm sends the same request sequence; each completion is compared with
baseline-start's completion of the same request. If the two baselines
disagree, the pairing is ``inconclusive`` and no speculative arm is judged.
A request is ``match`` only with evidence the drafter ran (witness, log line,
response field), ``not_engaged`` without, ``declined`` with a decline line.
"""

from __future__ import annotations

import os

import hashlib
import logging
import shlex
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specparity.harness.client import Completion, Request, send
from specparity.harness.config import Job, Pairing, build_sequence
from specparity.harness.lifecycle import HOST, Server, ServerStartError, scratch_dir
from specparity.harness.profiles import NOT_EXERCISED, Profile, dig, load_profile
from specparity.harness.shard import Shard, split
from specparity.harness.witness import (
    WITNESS_ENV,
    Evidence,
    evidence_from_calls,
    file_size,
    read_calls,
    wrap_checkpoint,
)

from specparity.errors import UsageError
from specparity.verdicts import SERVED_VERDICTS, ReportMixin, Verdict, combine

log = logging.getLogger(__name__)

SELF_DRAFT_MIN_ACCEPTANCE = 0.9
DIST_KIND = "distribution"  # served_dist's temperature > 0 arms: draws, not sha256-compared requests
SNIPPET = 24


# -- results -----------------------------------------------------------------------------------
@dataclass
class Divergence:
    """Where a completion first differs from the baseline's.

    token_index: first differing emitted token (None when token ids are missing).
    char_offset: first differing character of the text.
    baseline_snippet / arm_snippet: the text around it on both sides.
    logprobs_equal_before: emitted-token logprobs bitwise equal on every token before
      token_index (None without logprobs on both sides).
    first_logprob_diff: first token whose logprob differs bitwise (may precede the flip).
    margin_baseline / margin_arm: top-1 minus top-2 logprob at token_index on each side
      (a near-tie flip reads differently from a confident one).
    """

    token_index: int | None
    char_offset: int
    baseline_snippet: str
    arm_snippet: str
    logprobs_equal_before: bool | None = None
    first_logprob_diff: int | None = None
    margin_baseline: float | None = None
    margin_arm: float | None = None

    def line(self) -> str:
        where = (f"token {self.token_index}, " if self.token_index is not None else "") + f"char {self.char_offset}"
        s = f"first difference at {where}: baseline {self.baseline_snippet!r} vs arm {self.arm_snippet!r}"
        if self.logprobs_equal_before is not None:
            s += ("; logprobs bitwise equal before it" if self.logprobs_equal_before
                  else f"; logprobs first differ at token {self.first_logprob_diff}")
        if self.margin_baseline is not None and self.margin_arm is not None:
            s += f"; top-2 margin there {self.margin_baseline:.4g} (baseline) / {self.margin_arm:.4g} (arm) nats"
        return s


@dataclass
class RequestResult:
    """One request of one arm: what was sent, what came back, what it proves."""

    id: str
    kind: str
    verdict: Verdict
    reason: str
    completion: Completion
    request: dict[str, Any]
    evidence: Evidence = field(default_factory=Evidence)
    divergence: Divergence | None = None
    replay: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "verdict": self.verdict, "reason": self.reason,
                "request": self.request, "sha256": self.completion.sha256, "text": self.completion.text,
                "completion": self.completion.to_dict(), "evidence": self.evidence.to_dict(),
                "divergence": asdict(self.divergence) if self.divergence else None, "replay": self.replay}


@dataclass
class ArmResult:
    """One arm: its server, its requests and its verdict.

    kind: baseline, width, self-draft, concurrent, control, repeat.
    width: verify rows (None without a drafter); setting: the server's draft setting.
    served_by: "process" (its own server) or "request" (a shared server, width per request).
    server: argv, env, log, pid, exit code, start-up seconds.
    digest: sha256 over the arm's (request id, completion sha256) pairs.
    """

    name: str
    kind: str
    width: int | None
    setting: int | None
    verdict: Verdict = Verdict.ERROR
    reason: str = ""
    served_by: str = "process"
    requests: list[RequestResult] = field(default_factory=list)
    server: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    generation_seconds: float = 0.0
    acceptance: float | None = None

    @property
    def digest(self) -> str:
        h = hashlib.sha256()
        for r in self.requests:
            h.update(f"{r.id}={r.completion.sha256};".encode())
        return h.hexdigest()

    def to_dict(self, with_requests: bool = False) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "kind": self.kind, "width": self.width, "setting": self.setting,
             "verdict": self.verdict, "reason": self.reason, "served_by": self.served_by,
             "server": self.server, "seconds": round(self.seconds, 3),
             "generation_seconds": round(self.generation_seconds, 3), "acceptance": self.acceptance,
             "digest": self.digest, "requests": len(self.requests),
             "verdicts": {r.id: r.verdict for r in self.requests}}
        if with_requests:
            d["requests"] = [r.to_dict() for r in self.requests]
        return d


@dataclass
class PairingResult:
    name: str
    profile: str
    target: str
    draft: str | None
    verdict: Verdict = Verdict.NOT_RUN
    reason: str = ""
    arms: list[ArmResult] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    width_mode: str = "process"

    def groups(self) -> list[list[str]]:
        """Arms grouped by digest (order of first appearance)."""
        by: dict[str, list[str]] = {}
        for a in self.arms:
            if a.requests and a.verdict != Verdict.ERROR and a.kind != DIST_KIND:
                by.setdefault(a.digest, []).append(a.name)
        return list(by.values())

    def request_groups(self) -> dict[str, list[list[str]]]:
        out: dict[str, list[list[str]]] = {}
        for a in self.arms:
            for r in a.requests if a.kind != DIST_KIND else []:
                if r.completion.ok:
                    out.setdefault(r.id, {}).setdefault(r.completion.sha256, []).append(a.name)  # type: ignore
        return {k: list(v.values()) for k, v in out.items()}  # type: ignore[attr-defined]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "profile": self.profile, "target": self.target, "draft": self.draft,
                "verdict": self.verdict, "reason": self.reason, "width_mode": self.width_mode,
                "groups": self.groups(), "request_groups": self.request_groups(),
                "findings": self.findings, "arms": [a.to_dict() for a in self.arms]}


def format_groups(groups: list[list[str]]) -> str:
    def one(g: list[str]) -> str:
        names = []
        base = [n for n in g if n.startswith("baseline")]
        if len(base) > 1:
            names.append(f"baseline x{len(base)}")
        else:
            names += base
        names += [n for n in g if not n.startswith("baseline")]
        return "{" + ", ".join(names) + "}"
    return f"{len(groups)} group{'s' if len(groups) != 1 else ''}: " + " ".join(one(g) for g in groups)


@dataclass
class ServedReport(ReportMixin):
    """The whole job: one result per pairing; the verdict is their combination."""

    pairings: list[PairingResult]
    job: dict[str, Any]
    wall_seconds: float = 0.0
    shard: dict[str, Any] | None = None  # --shard i/n: {index, count, plan, arms}; None unsharded or merged

    @property
    def verdict(self) -> Verdict:
        return combine([p.verdict for p in self.pairings])

    def server_seconds(self) -> float:
        """The servers' own start-up plus generation time (the bench's denominator)."""
        return sum((a.server.get("start_seconds") or 0.0) + a.generation_seconds
                   for p in self.pairings for a in p.arms)

    def to_dict(self) -> dict[str, Any]:
        d = {"verdict": self.verdict, "exit_code": self.exit_code, "wall_seconds": round(self.wall_seconds, 3),
             "server_seconds": round(self.server_seconds(), 3),
             "pairings": [p.to_dict() for p in self.pairings], "job": self.job}
        if self.shard is not None:
            d["shard"] = self.shard
        return d

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
                w = (f" width {a.width} ({a.setting and 'num_draft_tokens'}={a.setting})"
                     if a.width is not None else "")
                acc = f", acceptance {a.acceptance:.3f}" if a.acceptance is not None else ""
                out.append(f"  {a.name:<16} {a.verdict:<12}{w} {len(a.requests)} requests{acc}"
                           + (f": {a.reason}" if a.reason else ""))
                if a.kind == DIST_KIND:
                    from specparity.harness.served_dist import lines as dist_lines

                    out += dist_lines(a)  # type: ignore[arg-type]  # a DistArm
                    continue
                for r in a.requests:
                    if r.verdict in (Verdict.DIVERGED, Verdict.ERROR, Verdict.DECLINED) \
                            or (r.verdict == Verdict.NOT_ENGAGED and a.kind != "baseline"):
                        out.append(f"    {r.id} ({r.kind}): {r.verdict}: {r.reason}")
                        if r.replay:
                            out.append(f"      reproduce in process: {r.replay}")
            out.append(f"  {format_groups(p.groups())}")
            for rid, gs in p.request_groups().items():
                if len(gs) > 1:
                    out.append(f"    request {rid}: {format_groups(gs)}")
            out += [f"  finding: {f}" for f in p.findings]
            out.append(f"  pairing verdict: {p.verdict}" + (f" ({p.reason})" if p.reason else ""))
        return out


# -- comparison --------------------------------------------------------------------------------
def _first_diff(a: str, b: str) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _margin(top: list[list[tuple[int, float]]] | None, i: int | None) -> float | None:
    if top is None or i is None or i >= len(top) or len(top[i]) < 2:
        return None
    return top[i][0][1] - top[i][1][1]


def compare(base: Completion, arm: Completion) -> Divergence | None:
    """None when the texts are byte-identical, else where and how they first differ."""
    if base.sha256 == arm.sha256:
        return None
    off = _first_diff(base.text, arm.text)
    lo = max(off - SNIPPET, 0)
    d = Divergence(None, off, base.text[lo:off + SNIPPET], arm.text[lo:off + SNIPPET])
    if base.token_ids is not None and arm.token_ids is not None:
        ti = next((i for i, (x, y) in enumerate(zip(base.token_ids, arm.token_ids)) if x != y),
                  min(len(base.token_ids), len(arm.token_ids)))
        d.token_index = ti
        if base.logprobs is not None and arm.logprobs is not None:
            diffs = [i for i, (x, y) in enumerate(zip(base.logprobs, arm.logprobs)) if x != y]
            d.first_logprob_diff = diffs[0] if diffs else None
            d.logprobs_equal_before = not diffs or diffs[0] >= ti
        d.margin_baseline, d.margin_arm = _margin(base.top, ti), _margin(arm.top, ti)
    return d


# -- arms --------------------------------------------------------------------------------------
@dataclass
class ArmPlan:
    name: str
    kind: str
    width: int | None = None
    draft: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    concurrency: int = 0
    server_key: str = ""


def plan_arms(job: Job, pairing: Pairing, profile: Profile, draft_path: str | None,
              self_draft_path: str | None) -> tuple[list[ArmPlan], str]:
    """The arms in the order they run, and whether widths share a server ("request") or not."""
    mode = job.width_mode
    if mode == "request" and not profile.per_request:
        mode = "process"
    arms = [ArmPlan("baseline-start", "baseline", server_key="baseline-start")]
    if draft_path is not None:
        for w in job.widths:
            arms.append(ArmPlan(f"w{w}", "width", w, draft_path,
                                server_key="drafter" if mode == "request" else f"w{w}"))
    if job.self_draft and self_draft_path is not None and job.widths:
        arms.append(ArmPlan("self-draft", "self-draft", max(job.widths), self_draft_path, server_key="self-draft"))
    if job.concurrency:
        arms.append(ArmPlan("concurrent", "concurrent", concurrency=job.concurrency, server_key="concurrent"))
    for c in job.controls:
        if draft_path is not None:
            arms.append(ArmPlan(c.name, "control", c.width, draft_path, dict(c.env), server_key=c.name))
    arms.append(ArmPlan("baseline-end", "baseline", server_key="baseline-end"))
    for i in range(job.repeats):
        arms.append(ArmPlan(f"repeat{i + 1}", "repeat", server_key=f"repeat{i + 1}"))
    return arms, mode


class _Session:
    """A running server shared by the arms with the same server key."""

    def __init__(self, server: Server, witness_file: Path, info: dict[str, Any]):
        self.server = server
        self.witness_file = witness_file
        self.info = info
        self.generation = 0.0
        self.start_counted = False


class ServedRun:
    """Runs a job; ``on_arm(pairing, arm)`` is called as each arm finishes (the record's hook)."""

    def __init__(self, job: Job, workdir: str | Path | None = None,
                 on_arm: Callable[[PairingResult, ArmResult], None] | None = None,
                 progress: Callable[[str], None] | None = None,
                 start_timeout: float | None = None, request_timeout: float | None = None,
                 shard: Shard | None = None):
        self.job = job
        self.shard = shard
        self._keep: dict[str, list[str]] | None = None
        # absolute: servers run with cwd=workdir, so a relative --record-dir would name nothing there
        self.workdir = Path(workdir).resolve() if workdir else scratch_dir("specparity-served-")
        self.on_arm = on_arm or (lambda p, a: None)
        self.progress = progress or (lambda s: None)
        self.start_timeout = start_timeout or job.start_timeout
        self.request_timeout = request_timeout or job.request_timeout
        self.arm_count = 0
        self._replay_model: tuple[str, bool] = ("", False)
        self._versions: dict[str, Any] = {}
        self._pool = ThreadPoolExecutor(max_workers=1)
        self.arm_total = 0

    def run(self) -> ServedReport:
        t0 = time.perf_counter()
        plans = []
        for p in self.job.pairings:
            profile = load_profile(p.profile)
            plans.append((p, profile))
        full = [(p.name, [(a.name, a.kind) for a in
                          plan_arms(self.job, p, prof, p.draft, p.target if prof.draft_argv else None)[0]])
                for p, prof in plans]
        self.arm_total = sum(len(arms) for _, arms in full)
        if self.job.distribution is not None:
            if self.shard is not None:
                raise UsageError("--shard: the distribution arms (temperature > 0) run unsharded only")
            self.arm_total += 2 * sum(p.draft is not None for p in self.job.pairings)
        report = ServedReport([], self.job.to_dict())
        if self.shard is not None:
            self._keep = split(full, self.shard)
            self.arm_total = sum(len(a) for a in self._keep.values())
            report.shard = {"index": self.shard.index, "count": self.shard.count,
                            "plan": {name: [a for a, _ in arms] for name, arms in full}, "arms": self._keep}
        for p, prof in plans:
            if self._keep is not None and p.name not in self._keep:
                continue
            report.pairings.append(self.run_pairing(p, prof))
        report.wall_seconds = time.perf_counter() - t0
        return report

    # -- one pairing ----------------------------------------------------------------------------
    def run_pairing(self, pairing: Pairing, profile: Profile) -> PairingResult:
        res = PairingResult(pairing.name, profile.name, pairing.target, pairing.draft)
        why = profile.available()
        if why:
            res.verdict, res.reason = Verdict.ERROR, f"profile {profile.name} cannot run here: {why}"
            return res
        if not profile.exercised:
            res.findings.append(f"profile {profile.name} {NOT_EXERCISED}")
            self.progress(f"profile {profile.name} {NOT_EXERCISED}")
        work = self.workdir / pairing.name
        work.mkdir(parents=True, exist_ok=True)
        target, draft, trust = pairing.target, pairing.draft, pairing.trust_remote_code
        for path, what in ((target, "target"), (draft, "draft")):
            if path is not None and not (Path(path) / "config.json").is_file():
                raise UsageError(f"pairing {pairing.name}: {what} {path} is not an mlx-lm checkpoint"
                                 " (no config.json)")
        if "target" in profile.witness:
            target = str(wrap_checkpoint(target, work / "witness-target", "target"))
            trust = True
        if draft is not None and "draft" in profile.witness:
            draft = str(wrap_checkpoint(draft, work / "witness-draft", "draft"))
            trust = True
        self_draft = pairing.target if profile.draft_argv else None
        if profile.model_format == "gguf":
            from specparity.gguf_export import cached_gguf

            target = cached_gguf(target)
            draft = cached_gguf(draft) if draft is not None else None
            self_draft = target if self_draft is not None else None
        arms, res.width_mode = plan_arms(self.job, pairing, profile, draft, self_draft)
        if self._keep is not None:
            arms = [a for a in arms if a.name in self._keep.get(pairing.name, [])]
        endpoint = self.job.endpoint or profile.endpoint
        history: dict[str, str] = {}
        needs_code = "model_file" in (Path(pairing.target) / "config.json").read_text()
        self._replay_model = (pairing.target, pairing.trust_remote_code or needs_code)
        sessions: dict[str, _Session] = {}
        baseline: dict[str, Completion] = {}
        try:
            for i, plan in enumerate(arms):
                self.arm_count += 1
                self.progress(f"arm {self.arm_count} of {self.arm_total}: {pairing.name} {plan.name}")
                arm = self._run_arm(plan, profile, target, trust, endpoint, history, sessions, work, baseline,
                                    keep=any(a.server_key == plan.server_key for a in arms[i + 1:]))
                if plan.name == "baseline-start":
                    baseline = {r.id: r.completion for r in arm.requests}
                res.arms.append(arm)
                self.on_arm(res, arm)
            if self.job.distribution is not None and draft is not None:
                from specparity.harness.served_dist import run_distribution

                for arm in run_distribution(self, pairing, profile, target, draft, trust, endpoint, work):
                    self.arm_count += 1
                    res.arms.append(arm)
                    self.on_arm(res, arm)
        finally:
            for s in sessions.values():
                s.server.stop()
        _judge_pairing(res)
        return res

    def _version(self, profile: Profile, target: str) -> str | None:
        """The profile's version line, run once per profile beside the first server's start-up."""
        if profile.name not in self._versions:
            self._versions[profile.name] = self._pool.submit(_version, profile, target)
        return self._versions[profile.name].result()

    def _start(self, plan: ArmPlan, profile: Profile, target: str, trust: bool, work: Path,
               setting: int | None) -> _Session:
        argv = profile.render(profile.argv, model=target, host=HOST, port="{port}")
        if plan.draft is not None:
            rows = setting + profile.rows_offset if setting is not None else None
            argv += profile.render(profile.draft_argv, draft_model=plan.draft, num_draft=setting, width=rows)
        if trust:
            argv += profile.trust_remote_code_argv
        argv += self.job.extra_args.get("*", []) + self.job.extra_args.get(plan.name, [])
        witness = work / f"witness-{plan.server_key}.log"
        witness.unlink(missing_ok=True)
        env: dict[str, str | None] = {**self.job.env, **plan.env, WITNESS_ENV: str(witness)}
        srv = Server(argv, log_path=work / f"server-{plan.server_key}.log", cwd=work, env=env,
                     ready_path=profile.ready_path, fail_regex=profile.fail_regex,
                     start_timeout=self.start_timeout, name=f"{plan.server_key} server")
        info = {"argv": argv, "env": {k: v for k, v in env.items() if k != WITNESS_ENV},
                "log": str(srv.log_path), "witness": str(witness), "profile": profile.name}
        return _Session(srv, witness, info)

    def _run_arm(self, plan: ArmPlan, profile: Profile, target: str, trust: bool, endpoint: str,
                 history: dict[str, str], sessions: dict[str, _Session], work: Path,
                 baseline: dict[str, Completion], keep: bool) -> ArmResult:
        import httpx

        setting = profile.setting_for(plan.width) if plan.width is not None else None
        arm = ArmResult(plan.name, plan.kind, plan.width, setting)
        t0 = time.perf_counter()
        shared = plan.server_key == "drafter"
        arm.served_by = "request" if shared else "process"
        session = sessions.get(plan.server_key)
        if session is None:
            proc_setting = setting
            if shared:
                proc_setting = profile.setting_for(max(self.job.widths))
            session = self._start(plan, profile, target, trust, work, proc_setting)
            sessions[plan.server_key] = session
            self.progress(f"  starting {session.server.name}")
            if profile.name not in self._versions:
                self._versions[profile.name] = self._pool.submit(_version, profile, target)
            try:
                session.server.start()
                session.info["start_seconds"] = session.server.times.start
                session.info["pid"] = session.server.pid
            except ServerStartError as err:
                arm.verdict, arm.reason = Verdict.ERROR, str(err)
                session.info["log_tail"] = err.log_tail
                session.info["returncode"] = err.returncode
                arm.server = dict(session.info)
                arm.seconds = time.perf_counter() - t0
                sessions.pop(plan.server_key, None)
                return arm
            session.info["version"] = self._version(profile, target)
        arm.server = dict(session.info)
        # a shared server's start-up is counted once, by the first arm on it
        arm.server["start_seconds"] = 0.0 if session.start_counted else session.info.get("start_seconds")
        session.start_counted = True
        extra: dict[str, Any] = {}
        if profile.per_request and setting is not None:
            extra[profile.per_request] = setting
        owner = plan.name == "baseline-start"
        requests = build_sequence(self.job, endpoint, history)
        srv = session.server
        with httpx.Client() as client:
            if plan.concurrency:
                results = self._send_concurrent(requests, client, srv, session, profile, extra, plan.concurrency)
            else:
                results = []
                i = 0
                while i < len(requests):
                    req = requests[i]
                    self.progress(f"  request {req.id}")
                    results.append(self._send_one(client, srv, session, profile, req, extra))
                    if owner and req.id == "chat-1" and results[-1][1].ok:
                        history["chat-1"] = results[-1][1].text
                        requests = build_sequence(self.job, endpoint, history)
                    i += 1
        for req, comp, ev in results:
            arm.requests.append(_judge_request(plan, req, comp, ev, baseline.get(req.id), *self._replay_model))
        arm.generation_seconds = sum(c.seconds for _, c, _ in results) if not plan.concurrency else \
            session.generation
        evs = [r.evidence for r in arm.requests]
        proposed = sum(w - 1 for e in evs for w in e.widths)
        if proposed:
            arm.acceptance = sum(a for e in evs for a in e.accepts) / proposed
        arm.verdict = combine([r.verdict for r in arm.requests], empty=Verdict.ERROR)
        bad = [r for r in arm.requests if r.verdict != Verdict.MATCH]
        if not arm.requests:
            arm.reason = "no requests were sent"
        elif bad:
            arm.reason = f"{len(bad)} of {len(arm.requests)} requests not match"
        if plan.kind == "self-draft" and arm.acceptance is not None and arm.acceptance < SELF_DRAFT_MIN_ACCEPTANCE:
            arm.verdict = combine([arm.verdict, Verdict.DIVERGED])
            arm.reason = (f"serving-loop defect: the target drafting for itself had {arm.acceptance:.1%} of its"
                          f" proposals accepted at temperature 0 (expected >= {SELF_DRAFT_MIN_ACCEPTANCE:.0%})")
        arm.seconds = time.perf_counter() - t0
        if not keep:
            session.server.stop()
            sessions.pop(plan.server_key, None)
        arm.server["returncode"] = session.server.proc.returncode if session.server.proc else None
        return arm

    def _send_one(self, client: Any, srv: Server, session: _Session, profile: Profile, req: Request,
                  extra: dict[str, Any]) -> tuple[Request, Completion, Evidence]:
        w0, l0 = file_size(session.witness_file), file_size(srv.log_path)
        m0 = _counter(client, srv.url, profile, self.request_timeout)
        comp = send(client, srv.url, req, profile, extra, timeout=self.request_timeout)
        if not comp.ok and not srv.alive():
            code = srv.proc.returncode if srv.proc else None
            comp.error = (comp.error or "") + f" (the server exited with code {code}; log tail: {srv.tail(5)!r})"
        ev = self._evidence(session, srv, profile, comp, w0, l0)
        _counter_evidence(ev, profile, m0, _counter(client, srv.url, profile, self.request_timeout))
        return req, comp, ev

    def _send_concurrent(self, requests: list[Request], client: Any, srv: Server, session: _Session,
                         profile: Profile, extra: dict[str, Any], n: int) -> list[tuple[Request, Completion, Evidence]]:
        out: list[tuple[Request, Completion, Evidence]] = []
        with ThreadPoolExecutor(max_workers=n) as pool:
            for k in range(0, len(requests), n):
                batch = requests[k:k + n]
                self.progress(f"  requests {', '.join(r.id for r in batch)} at once")
                w0, l0 = file_size(session.witness_file), file_size(srv.log_path)
                m0 = _counter(client, srv.url, profile, self.request_timeout)
                t0 = time.perf_counter()
                comps = list(pool.map(lambda r: send(client, srv.url, r, profile, extra,
                                                     timeout=self.request_timeout), batch))
                session.generation += time.perf_counter() - t0
                m1 = _counter(client, srv.url, profile, self.request_timeout)
                for r, c in zip(batch, comps):
                    # a batch shares its witness, log slice and counters: evidence is per batch
                    ev = self._evidence(session, srv, profile, c, w0, l0)
                    _counter_evidence(ev, profile, m0, m1)
                    out.append((r, c, ev))
        return out

    def _evidence(self, session: _Session, srv: Server, profile: Profile, comp: Completion,
                  w0: int, l0: int) -> Evidence:
        import re

        calls = read_calls(session.witness_file, w0, file_size(session.witness_file))
        usage = comp.usage or {}
        ev = evidence_from_calls(calls, usage.get("prompt_tokens"), usage.get("completion_tokens"))
        if profile.log_engaged or profile.log_declined:
            text = _read_slice(srv.log_path, l0)
            for line in text.splitlines():
                if profile.log_declined and re.search(profile.log_declined, line):
                    ev.declined = True
                    ev.lines.append(line.strip())
                elif profile.log_engaged and re.search(profile.log_engaged, line):
                    ev.sources.append("log")
                    ev.lines.append(line.strip()[:300])
        for fld in (profile.response_field, profile.usage_field):
            val = dig(comp.raw, fld) if fld else None
            if isinstance(val, dict) and val.get("accepts") is not None:
                ev.sources.append("response")
                ev.lines.append(f"{fld}: accepts={val.get('accepts')}")
                if not ev.accepts:
                    ev.accepts = list(val.get("accepts") or [])
                    ev.widths = list(val.get("widths") or [val.get("width")] * len(ev.accepts))
            elif val:  # an empty list, dict, 0 or False is no evidence the drafter ran
                ev.sources.append("response")
                ev.lines.append(f"{fld}: {str(val)[:200]}")
        return ev


def _counter(client: Any, url: str, profile: Profile, timeout: float) -> float | None:
    """The profile's Prometheus counter summed over its labels (None: no counter, or unreadable)."""
    if not profile.metrics_counter:
        return None
    try:
        resp = client.get(url + profile.metrics_path, timeout=timeout)
    except Exception as err:  # any transport failure: no reading, so no evidence either way
        log.debug("metrics %s: %s", profile.metrics_path, err)
        return None
    if resp.status_code != 200:
        return None
    names = (profile.metrics_counter, profile.metrics_counter + "_total")
    total = None
    for line in resp.text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            try:
                total = (total or 0.0) + float(line.rsplit(" ", 1)[1])
            except ValueError:
                continue
    return total


def _counter_evidence(ev: Evidence, profile: Profile, before: float | None, after: float | None) -> None:
    if before is not None and after is not None and after > before:
        ev.sources.append("metrics")
        ev.lines.append(f"{profile.metrics_counter}: +{after - before:g}")


def _read_slice(path: str | os.PathLike[str] | None, start: int) -> str:
    if path is None or not Path(path).exists():
        return ""
    with open(path, "rb") as f:
        f.seek(start)
        return f.read().decode("utf-8", "replace")


def _version(profile: Profile, target: str) -> str | None:
    if not profile.version_command:
        return None
    try:
        out = subprocess.run(profile.render(profile.version_command, model=target, host=HOST, port=0),
                             check=False, capture_output=True, text=True, timeout=30,
                             cwd=tempfile.gettempdir())
    except (OSError, subprocess.SubprocessError) as err:
        return f"unknown ({err})"
    return (out.stdout.strip() or out.stderr.strip())[:200]


def _judge_request(plan: ArmPlan, req: Request, comp: Completion, ev: Evidence, base: Completion | None,
                   target: str, trust: bool) -> RequestResult:
    res = RequestResult(req.id, req.kind, Verdict.ERROR, "", comp, req.to_dict(), ev)
    if not comp.ok:
        res.reason = comp.error or "no completion"
        return res
    if plan.name == "baseline-start":
        res.verdict, res.reason = Verdict.MATCH, "the reference"
        return res
    if base is None or not base.ok:
        res.verdict, res.reason = Verdict.INCONCLUSIVE, "baseline-start has no completion of this request"
        return res
    if ev.declined:
        res.verdict = Verdict.DECLINED
        res.reason = "declined: " + "; ".join(ev.lines[:2])
        return res
    d = compare(base, comp)
    if d is not None:
        res.verdict, res.divergence = Verdict.DIVERGED, d
        res.reason = d.line()
        if ev.accepts and req.prompt_text() is not None and plan.width:
            argv = ["specparity", "replay", "--model", target, "--prompt", req.prompt_text() or "",
                    "--accepts", ",".join(map(str, ev.accepts)), "--width", str(plan.width),
                    "--max-tokens", str(req.body.get("max_tokens", 0))]
            if trust:
                argv.append("--trust-remote-code")
            res.replay = shlex.join(argv)
        return res
    if plan.draft is not None and not ev.engaged:
        res.verdict = Verdict.NOT_ENGAGED
        res.reason = "same text as the baseline, but no evidence the drafter ran (no witness, log or response field)"
        return res
    res.verdict = Verdict.MATCH
    res.reason = "; ".join(ev.lines[:1]) if plan.draft is not None else ""
    return res


def _judge_pairing(res: PairingResult) -> None:
    arms = {a.name: a for a in res.arms}
    start, end = arms.get("baseline-start"), arms.get("baseline-end")
    if start is None or start.verdict == Verdict.ERROR or not start.requests:
        res.verdict = Verdict.ERROR
        res.reason = "baseline-start did not run: nothing can be compared"
        return
    if end is not None and end.verdict not in (Verdict.MATCH, Verdict.ERROR):
        bad = [r for r in end.requests if r.verdict != Verdict.MATCH]
        res.verdict = Verdict.INCONCLUSIVE
        res.reason = (f"the two baselines disagree on {len(bad)} of {len(end.requests)} requests"
                      f" ({', '.join(r.id for r in bad)}): classic decode is not reproducible across processes,"
                      " so no speculative arm is judged")
        res.findings += [f"baseline-end {r.id}: {r.reason}" for r in bad]
        for a in res.arms:
            if a.kind != "baseline" and a.verdict != Verdict.ERROR:
                a.reason = f"not judged ({a.verdict} against baseline-start); " + a.reason
                a.verdict = Verdict.INCONCLUSIVE
        return
    if end is None or end.verdict == Verdict.ERROR:
        res.findings.append("baseline-end did not run: the noise floor is unknown")
    reps = [a for a in res.arms if a.kind == "repeat"]
    if reps:
        uniq = {a.digest for a in [start, *reps]}
        res.findings.append(f"{len(reps) + 1} baseline trials: {len(uniq)} unique output"
                            f"{'s' if len(uniq) != 1 else ''}")
    for a in res.arms:
        if a.kind == "self-draft" and a.acceptance is not None and a.acceptance < SELF_DRAFT_MIN_ACCEPTANCE:
            res.findings.append(a.reason)
    judged = [a.verdict for a in res.arms if a.kind != "baseline" or a.name == "baseline-end"]
    res.verdict = combine(judged or [Verdict.MATCH])
    assert res.verdict in (*SERVED_VERDICTS, Verdict.NOT_RUN)
