"""Run: servers started per the plan, each arm's request sequence sent, every answer judged.

The public runner API, used by the greedy arms here, by the distribution arms
(harness.distribution) and by any new engine's arms:

    run = ServedRun(job, workdir, on_arm=..., observer=...)
    report = run.run()                                   # every pairing (or one shard's)

    pr = PairingRun(run, pairing, profile)               # one pairing's checkpoints and workdir
    session = pr.new_session(plan)                       # argv, env, log and witness files
    pr.start(session)                                    # raises ServerStartError
    exchange = pr.send(client, session, request, pr.request_fields(plan))
    pr.stop_session(session)

Each exchange carries the request, the completion and the evidence read over
that request's slice of the witness, the server log, the response and the
metrics counter.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specparity.errors import SpecparityError, UsageError
from specparity.harness import evidence as evidence_mod
from specparity.harness import memory
from specparity.harness.client import Completion, Request, send
from specparity.harness.config import Job, Pairing
from specparity.harness.judge import ClassicAnswer, Cold, classic_answer, judge_arm, judge_pairing, judge_request
from specparity.harness.lifecycle import HOST, Server, ServerStartError, scratch_dir
from specparity.harness.limits import LimitRule, RequestLimits
from specparity.harness.timing import Clock
from specparity.harness.oracle import NeedsWorker, Oracle
from specparity.harness.plan import (
    BASELINE_START,
    ArmKind,
    ArmPlan,
    Drafter,
    WidthMode,
    build_sequence,
    plan_arms,
    self_draft_refusal,
)
from specparity.harness.profiles import NOT_EXERCISED, Profile, load_profile
from specparity.harness.reproduce import Finding, Sent, ServerHistory, reproduce
from specparity.harness.results import ArmResult, PairingResult, RequestResult, ServedReport
from specparity.harness.session import Exchange, Session
from specparity.harness.shard import Shard, split
from specparity.harness.witness import WITNESS_ENV, wrap_checkpoint
from specparity.progress import NULL, Observer
from specparity.verdicts import Verdict

log = logging.getLogger(__name__)

ARMS_PART = "arms"


@dataclass
class Served:
    """An arm whose sequence was sent and not yet judged (its server may have stopped since).

    session / exchanges / first: its server, what came back, where its requests start in the
    server's history (None / [] where it never ran: too wide, or its server would not start).
    seconds: what serving it took.
    """

    plan: ArmPlan
    arm: ArmResult
    session: Session | None = None
    exchanges: list[Exchange] = field(default_factory=list)
    first: int = 0
    seconds: float = 0.0


def _emitted(comp: Completion) -> int | None:
    """The tokens a completion emitted, as its usage or its token ids say (None: neither says)."""
    n = (comp.usage or {}).get("completion_tokens")
    if isinstance(n, int) and not isinstance(n, bool):
        return n
    return len(comp.token_ids) if comp.token_ids else None


def _config(checkpoint: str) -> dict[str, Any]:
    """A checkpoint's config.json ({} where it cannot be read: preparing the pairing names that)."""
    import json

    try:
        cfg = json.loads((Path(checkpoint) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return cfg if isinstance(cfg, dict) else {}


def _dtype(cfg: dict[str, Any]) -> str:
    """The dtype a checkpoint computes in, as its config says (float32 when it does not)."""
    if cfg.get("quantization"):
        return "quantized"
    return str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32")


def _version(profile: Profile, target: str, python: str, env: dict[str, str] | None) -> str | None:
    if not profile.version_command:
        return None
    try:
        out = subprocess.run(profile.render(profile.version_command, model=target, host=HOST, port=0, python=python),
                             check=False, capture_output=True, text=True, timeout=30,
                             cwd=tempfile.gettempdir(), env=env)
    except (OSError, subprocess.SubprocessError) as err:
        return f"unknown ({err})"
    return (out.stdout.strip() or out.stderr.strip())[:200]


class ServedRun:
    """Runs a job; ``on_arm(pairing, arm)`` is called as each arm finishes (the record's hook).

    observer: progress (notes and the arms part) as every command reports it.
    start_timeout / request_timeout: override the job's (no request_timeout anywhere: each request's limit
    is derived from what the job measured, harness.limits, by ``limit_rule``). shard: run only that shard's arms.
    memory_limit: the memory the job may use (``--memory-limit``, e.g. ``16GB``; default
    $SPECPARITY_MEMORY_LIMIT, else what the machine has): a job expected to need more is refused
    before any server starts (harness.memory).
    """

    def __init__(self, job: Job, workdir: str | Path | None = None,
                 on_arm: Callable[[PairingResult, ArmResult], None] | None = None,
                 observer: Observer = NULL, start_timeout: float | None = None,
                 request_timeout: float | None = None, shard: Shard | None = None,
                 memory_limit: str | None = None, limit_rule: LimitRule | None = None):
        self.job = job
        self.shard = shard
        # absolute: servers run with cwd=workdir, so a relative --record-dir would name nothing there
        # without a record, a scratch folder removed at exit (Ctrl-C and SIGTERM included)
        self.keeps_files = workdir is not None
        self.workdir = Path(workdir).resolve() if workdir else scratch_dir("specparity-served-")
        self.on_arm = on_arm or (lambda p, a: None)
        self.observer = observer
        self.start_timeout = start_timeout or job.start_timeout
        self.request_timeout = request_timeout or job.request_timeout  # None: derived per request
        self.limit_rule = limit_rule or LimitRule()
        self.arm_count = 0
        self.arm_total = 0
        self._versions: dict[tuple[str, str], Future[str | None]] = {}
        self._pool = ThreadPoolExecutor(max_workers=1)
        self.sampler: memory.Sampler | None = None
        self.budget: memory.Budget | None = None
        self.memory_limit = memory_limit

    def note(self, message: str) -> None:
        self.observer.note(message)

    def start_version(self, profile: Profile, target: str, python: str, env: dict[str, str] | None) -> None:
        """Start reading the profile's version line (once per profile and interpreter) beside a server's start-up."""
        if (profile.name, python) not in self._versions:
            self._versions[(profile.name, python)] = self._pool.submit(_version, profile, target, python, env)

    def version(self, profile: Profile, target: str, python: str, env: dict[str, str] | None) -> str | None:
        """The profile's version line, run once per profile and interpreter."""
        self.start_version(profile, target, python, env)
        return self._versions[(profile.name, python)].result()

    def run(self) -> ServedReport:
        t0 = time.perf_counter()
        if self.job.distribution is not None and self.shard is not None:
            raise UsageError("shards: the distribution arms (temperature > 0) run unsharded only")
        self.budget = memory.served_budget(self.job, self.memory_limit)
        self.note(self.budget.line())
        self.budget.check()  # before any server starts
        self.sampler = memory.Sampler().start()
        try:
            return self._run(t0)
        finally:
            self.sampler.stop()

    def _run(self, t0: float) -> ServedReport:
        # planned once: the count, the shard plan and the arms each pairing runs are the same arms
        pairings = [PairingRun(self, p, load_profile(p.profile)) for p in self.job.pairings]
        full = [(pr.pairing.name, [(a.name, a.kind) for a in pr.arms]) for pr in pairings]
        self.arm_total = sum(len(pr.arms) for pr in pairings)
        report = ServedReport([], self.job.to_dict())
        keep: dict[str, list[str]] | None = None
        if self.shard is not None:
            keep = split(full, self.shard)
            self.arm_total = sum(len(a) for a in keep.values())
            report.shard = {"index": self.shard.index, "count": self.shard.count,
                            "plan": {name: [a for a, _ in arms] for name, arms in full}, "arms": keep}
        with self.observer.part(ARMS_PART, total=self.arm_total):
            for pr in pairings:
                if keep is not None and pr.pairing.name not in keep:
                    continue
                report.pairings.append(pr.run(None if keep is None else keep[pr.pairing.name]))
        report.wall_seconds = time.perf_counter() - t0
        return report

    def arm_started(self, pairing: str, arm: str) -> None:
        self.arm_count += 1
        self.note(f"arm {self.arm_count} of {self.arm_total}: {pairing} {arm}")

    def arm_finished(self, pairing: PairingResult, arm: ArmResult) -> None:
        self.observer.item(ARMS_PART)
        self.note(f"  {arm.name}: {arm.verdict}" + (f" ({arm.reason})" if arm.reason else ""))
        self.on_arm(pairing, arm)


class PairingRun:
    """One pairing's run: its checkpoints as the servers load them, its workdir, its sessions."""

    def __init__(self, run: ServedRun, pairing: Pairing, profile: Profile):
        self.run_ = run
        self.job = run.job
        self.pairing = pairing
        self.profile = profile
        self.work = run.workdir / pairing.name
        self.target = pairing.target
        self.draft = pairing.draft
        self.trust = pairing.trust_remote_code
        self.endpoint = self.job.endpoint or profile.endpoint
        self.self_draft: str | None = None  # the target as its own drafter, where the profile can draft
        self.sessions: dict[str, Session] = {}
        self.history: dict[str, str] = {}
        self.engine = profile.engine_hooks()
        self.environment = pairing.environment or profile.environment
        # the interpreter servers run ({python}), and what their environment adds to os.environ
        self.python = sys.executable
        self.server_env: dict[str, str | None] = {}
        self.env_identity: dict[str, Any] | None = None
        self._oracle: Oracle | None = None
        self.reference: dict[str, str] = {}  # request id -> classic decode's text sha256
        self._prompt_ids: dict[str, list[int]] = {}
        self.findings: list[str] = []
        self.limits = RequestLimits(run.limit_rule, run.request_timeout)
        self.clock = Clock()
        # the reference beside the servers (a second copy of the target) only where the job opts in
        self.beside = bool(self.job.reference_beside)
        config = _config(pairing.target)
        self.dtype = _dtype(config)
        # the target ships its own model code: servers and reproductions need trust_remote_code for it
        self.own_code = "model_file" in config
        self.arms, self.width_mode = plan_arms(self.job, profile, pairing.draft is not None, self._self_drafts())
        if not profile.exercised:
            self.findings.append(f"profile {profile.name} {NOT_EXERCISED}")
            log.warning("profile %s %s", profile.name, NOT_EXERCISED)

    def _self_drafts(self) -> bool:
        """Whether the target can be its own drafter on this profile (a finding says why not)."""
        why = self_draft_refusal(self.profile, self.pairing.target, self.own_code)
        if why:
            self.note_once(why)
        return why is None

    # -- the pairing ---------------------------------------------------------------------------
    def prepare(self) -> str | None:
        """The checkpoints as the servers load them (witness wrappers, engine exports); None, or why not."""
        why = self.profile.available(self.environment)
        if why:
            return f"profile {self.profile.name} cannot run here: {why}"
        if self.environment is not None:
            from specparity.environments import ensure_environment

            env = ensure_environment(self.environment, progress=self.run_.note)
            self.python = str(env.python)
            # the caller's PYTHONPATH and PYTHONHOME unset (None), unless environ() gives the environment's own
            self.server_env = {"PYTHONPATH": None, "PYTHONHOME": None, **env.environ(base={})}
            self.env_identity = env.identity()
        self.work.mkdir(parents=True, exist_ok=True)
        for path, what in ((self.target, "target"), (self.draft, "draft")):
            if path is not None and not (Path(path) / "config.json").is_file():
                raise UsageError(f"pairing {self.pairing.name}: {what} {path} is not an mlx-lm checkpoint"
                                 " (no config.json)")
        if "target" in self.profile.witness:
            # a checkpoint with its own model_file is wrapped too, under the pairing's consent
            self.target = str(wrap_checkpoint(self.target, self.work / "witness-target", "target",
                                              trust_remote_code=self.pairing.trust_remote_code))
            self.trust = True
        if self.draft is not None and "draft" in self.profile.witness:
            self.draft = str(wrap_checkpoint(self.draft, self.work / "witness-draft", "draft",
                                             trust_remote_code=self.pairing.trust_remote_code))
            self.trust = True
        engine = self.engine
        self.target = engine.prepare_checkpoint(self.target, "target")
        if self.draft is not None:
            self.draft = engine.prepare_checkpoint(self.draft, "draft")
        if any(a.draft == Drafter.TARGET for a in self.arms):
            # the target as its own drafter: unwrapped (servers load drafters without trust_remote_code)
            self.self_draft = engine.prepare_checkpoint(self.pairing.target, "draft")
        return None

    def drafter(self, plan: ArmPlan) -> str | None:
        """The checkpoint ``plan``'s server loads as its drafter, as prepared (None: no drafter)."""
        if plan.draft == Drafter.TARGET:
            return self.self_draft
        return self.draft if plan.draft == Drafter.DRAFT else None

    @property
    def replay_model(self) -> tuple[str, bool]:
        """The checkpoint a printed reproduction loads, and whether it needs --trust-remote-code."""
        return self.pairing.target, self.pairing.trust_remote_code or self.own_code

    def run(self, only: list[str] | None) -> PairingResult:
        """Every arm of the pairing (``only``: these arm names), judged; the distribution arms last."""
        p = self.pairing
        res = PairingResult(p.name, self.profile.name, p.target, p.draft, width_mode=self.width_mode)
        self.clock = Clock()
        with self.clock.phase("prepare"):
            why = self.prepare()
        if why:
            res.verdict, res.reason = Verdict.ERROR, why
            return res
        if self.run_.sampler is not None:
            self.run_.sampler.reset()
        planned = [a for a in self.arms if only is None or a.name in only]
        arms = [a for a in planned if a.kind != ArmKind.DISTRIBUTION]
        dist = [a for a in planned if a.kind == ArmKind.DISTRIBUTION]
        baseline: dict[str, Completion] = {}
        pending: list[Served] = []
        try:
            if arms and self.beside:  # the worker loads beside the first server, and stays
                self.oracle([str(a) for a in self.server_argv(arms[0])], load=True)
            # one copy of the target at a time: the worker imports beside the first server, holding no weights,
            # and decodes everything it can once that server is gone (classic_first), before the next starts
            first = bool(arms) and not self.beside and self.decodes_first()
            if first:
                self.oracle([str(a) for a in self.server_argv(arms[0])], load=False)
            for i, plan in enumerate(arms):
                self.run_.arm_started(p.name, plan.name)
                last = i == len(arms) - 1
                if last and pending and self._oracle is not None and not self.beside:
                    # a worker for the arms left waiting for one (unless the one that gave its weights back
                    # stays): its imports beside this last server, no weights held; it loads once that server is gone
                    self._oracle.spawn(load=False)
                keep = any(a.server_key == plan.server_key for a in arms[i + 1:])
                served = self.serve_arm(plan, stop=not keep)
                if plan.name == BASELINE_START:
                    baseline = {ex.request.id: ex.completion for ex in served.exchanges}
                pending.append(served)
                if first and not self.sessions:
                    first = False
                    self.classic_first(arms[0])
                # the reference judges once no server is resident (opted in beside them: at once); until the
                # last arm, only arms whose every answer it already has: the rest wait for the last server to go
                if self.beside or not self.sessions:
                    self.flush(res, pending, baseline, offline=not (self.beside or last))
            if pending:
                self.flush(res, pending, baseline)
            if dist:
                from specparity.harness.distribution import run_distribution

                for arm in run_distribution(self, dist):  # its servers' phases timed as the others'
                    res.arms.append(arm)
                    self.run_.arm_finished(res, arm)
        finally:
            with self.clock.phase("server_stop"):
                for s in self.sessions.values():
                    s.server.stop()
            if self._oracle is not None:
                res.reference_cost = self._oracle.cost_dict()
                if self._oracle.failed:
                    self.note_once(self._oracle.failed)
                self._oracle.close()
            res.memory = self.memory_summary(res)
            res.request_limits = self.limits.to_dict()
            res.time = self.clock.to_dict()
        res.reference = dict(self.reference)
        res.findings += self.findings
        judge_pairing(res)
        return res

    # -- sessions ------------------------------------------------------------------------------
    def server_dir(self, plan: ArmPlan) -> Path:
        """The folder the record keeps for ``plan``'s server (an engine's own diagnostics)."""
        return self.work / f"server-{plan.server_key}"

    def server_argv(self, plan: ArmPlan) -> list[str]:
        """The argv ``plan``'s server starts with ({port} still to fill); no side effect."""
        profile = self.profile
        # the pairing's drafter: an engine that always loads one ({draft_model} in argv) has it in every arm
        argv = profile.render(profile.argv, model=self.target, python=self.python, draft_model=self.draft)
        w, draft = plan.server_width, self.drafter(plan)
        if draft is not None and w is not None:
            argv += profile.render(profile.draft_argv, draft_model=draft, num_draft=w.setting, width=w.rows,
                                   python=self.python)
        if self.trust:
            argv += profile.trust_remote_code_argv
        argv += self.engine.extra_argv(draft is not None, self.server_dir(plan))
        argv += self.job.extra_args.get("*", []) + self.job.extra_args.get(plan.name, [])
        return argv  # ArgTemplate items kept: the lifecycle fills {port} in them

    def new_session(self, plan: ArmPlan) -> Session:
        """A server for ``plan`` (not started): argv from the profile, env, log and a fresh witness file."""
        profile = self.profile
        argv = self.server_argv(plan)
        server_dir = self.server_dir(plan)
        witness = self.work / f"witness-{plan.server_key}.log"
        witness.unlink(missing_ok=True)
        env: dict[str, str | None] = {**self.server_env, **self.job.env, **plan.env, WITNESS_ENV: str(witness)}
        srv = Server(argv, log_path=self.work / f"server-{plan.server_key}.log", cwd=self.work, env=env,
                     ready_path=profile.ready_path, fail_regex=profile.fail_regex,
                     start_timeout=self.run_.start_timeout, graceful=profile.stop == "graceful",
                     name=f"{plan.server_key} server")
        info: dict[str, Any] = {"argv": argv, "env": {k: v for k, v in {**self.job.env, **plan.env}.items()},
                                "log": str(srv.log_path), "witness": str(witness), "profile": profile.name}
        if self.env_identity is not None:
            info["environment"] = self.env_identity["name"]
        return Session(srv, witness, info, server_dir=server_dir, history=ServerHistory([str(a) for a in argv]))

    def start(self, session: Session) -> None:
        """Start the session's server and wait until ready; raises ServerStartError (with the log
        tail and exit code put in ``session.info``)."""
        if self._oracle is not None and not self.beside:
            self._oracle.release()  # one copy of the target at a time: the worker ends before a server starts
        self.run_.note(f"  starting {session.server.name}")
        session.server_dir.mkdir(parents=True, exist_ok=True)
        version_env = self._version_env()
        # read beside the server's start-up (once per profile and interpreter): its interpreter imports, holding
        # no weights, as the reference's worker does beside the first server
        self.run_.start_version(self.profile, self.target, self.python, version_env)
        try:
            with self.clock.phase("server_start"):
                session.server.start()
        except ServerStartError as err:
            session.info["log_tail"] = err.log_tail
            session.info["returncode"] = err.returncode
            raise
        session.info["argv"] = list(session.server.resolved_argv)  # as run: the port filled in
        session.info["start_seconds"] = session.server.times.start
        session.info["pid"] = session.server.pid
        with self.clock.phase("version_line"):
            session.info["version"] = self.run_.version(self.profile, self.target, self.python, version_env)

    def _version_env(self) -> dict[str, str]:
        """The environment the profile's version line runs in: the servers'."""
        return {**os.environ, **{k: v for k, v in self.server_env.items() if v is not None}}

    def stop_session(self, session: Session) -> int | None:
        with self.clock.phase("server_stop"):
            return session.server.stop()

    def request_fields(self, plan: ArmPlan) -> dict[str, Any]:
        """Fields an arm adds to each request: the width, where the profile sets it per request."""
        if self.profile.per_request and plan.width is not None:
            return {self.profile.per_request: plan.width.setting}
        return {}

    # -- requests ------------------------------------------------------------------------------
    def send(self, client: Any, session: Session, req: Request, fields: dict[str, Any],
             plan: ArmPlan | None = None) -> Exchange:
        """Send one request (for ``plan``'s arm: its time limit, harness.limits) and read its evidence."""
        with self.clock.phase("evidence"):
            return self._send(client, session, req, fields, plan)

    def _send(self, client: Any, session: Session, req: Request, fields: dict[str, Any],
              plan: ArmPlan | None) -> Exchange:
        srv, timeout = session.server, self.limits.limit(plan, req)
        before = evidence_mod.mark(client, srv.url, session.witness_file, srv.log_path, self.profile, timeout)
        engine_mark = self.engine.mark(session)
        with self.clock.phase("generation"):
            comp = send(client, srv.url, req, self.profile, fields, timeout=timeout)
        if plan is not None and comp.ok and plan.kind in (ArmKind.BASELINE, ArmKind.REPEAT):
            # a drafter-less server, one request at a time: what later arms' limits follow
            self.limits.observe(req.id, comp.seconds, _emitted(comp), plan.name)
        if not comp.ok and not srv.alive():
            code = srv.proc.returncode if srv.proc else None
            comp.error = (comp.error or "") + f" (the server exited with code {code}; log tail: {srv.tail(5)!r})"
        elif not comp.ok:
            logged = evidence_mod.logged_error(srv.log_path, before.log)
            if logged:  # its handler's exception: the cause, where the connection alone says nothing of it
                comp.error = (comp.error or "") + f" (the server logged: {logged})"
        after = evidence_mod.read_counter(client, srv.url, self.profile, timeout)
        ev = evidence_mod.collect(self.profile, session.witness_file, srv.log_path, comp, before, after)
        found = self.engine.evidence(session, comp, engine_mark)
        evidence_mod.add_engine(ev, found)
        if found is not None and found.error:  # the engine failed it, even where a (partial) response came
            comp.error = f"{comp.error + '; ' if comp.error else ''}the engine's error: {found.error}"
        ids = self.engine.prompt_ids(client, srv.url, req) if comp.ok and self.job.reference else None
        return Exchange(req, comp, ev, ids)

    def send_concurrent(self, client: Any, session: Session, requests: list[Request], fields: dict[str, Any],
                        plan: ArmPlan) -> list[Exchange]:
        """The requests ``plan.concurrency`` at a time; a batch shares its evidence slices."""
        out: list[Exchange] = []
        n = plan.concurrency
        srv = session.server
        with ThreadPoolExecutor(max_workers=n) as pool, self.clock.phase("evidence"):
            for k in range(0, len(requests), n):
                batch = requests[k:k + n]
                limits = {r.id: self.limits.limit(plan, r) for r in batch}
                timeout = max(limits.values())
                self.run_.note(f"  requests {', '.join(r.id for r in batch)} at once")
                before = evidence_mod.mark(client, srv.url, session.witness_file, srv.log_path, self.profile,
                                           timeout)
                t0 = time.perf_counter()
                with self.clock.phase("generation"):
                    comps = list(pool.map(lambda r: send(client, srv.url, r, self.profile, fields,
                                                         timeout=limits[r.id]), batch))
                session.generation += time.perf_counter() - t0
                after = evidence_mod.read_counter(client, srv.url, self.profile, timeout)
                for r, c in zip(batch, comps):
                    ev = evidence_mod.collect(self.profile, session.witness_file, srv.log_path, c, before, after)
                    ids = self.engine.prompt_ids(client, srv.url, r) if c.ok and self.job.reference else None
                    out.append(Exchange(r, c, ev, ids))
        return out

    # -- judging against classic decode -----------------------------------------------------------
    def oracle(self, argv: list[str], load: bool = True) -> Oracle | None:
        """The classic reference for this pairing (None when the job asks for none), its worker started
        with the tokenizer settings of a server's ``argv`` (the chat template) the first time (``load``
        False: it imports beside a server and loads at its first question, :meth:`Oracle.spawn`)."""
        if not self.job.reference:
            return None
        if self._oracle is None:
            from specparity.mlx_server import ServerSettings

            target, trust = self.replay_model
            self.run_.note("  starting the classic reference (classic decode in process)")
            from specparity.harness.reproduce import SPECPARITY_SERVE_LOOP
            from specparity.probes.replay.sequence import LOOP

            # mlx_lm.server (and specparity serve, its batch loop kept) batch what they can; another loop's
            # classic path is its sequential one (dflash serve: mlx_lm.server's _serve_single)
            self._oracle = Oracle(target, trust, self.python, self.server_env,
                                  ServerSettings.from_argv([str(a) for a in argv]),
                                  timeout=self.limits.answer_limit(),
                                  batches=self.profile.loop in (LOOP, SPECPARITY_SERVE_LOOP))
            self._oracle.clock = self.clock
            self._oracle.spawn(load=load)
        self._oracle.timeout = self.limits.answer_limit()  # as long as the slowest request measured may take
        return self._oracle

    def classic(self, session: Session, ex: Exchange, fields: dict[str, Any]) -> ClassicAnswer | None:
        """Classic decode's answer to this exchange's request under its server's settings."""
        oracle = self.oracle(session.history.argv)
        if oracle is None or not ex.completion.ok:
            return None
        from specparity.mlx_server import ServerSettings

        settings = ServerSettings.from_argv([str(a) for a in session.history.argv])
        usage = ex.completion.usage or {}
        tokens = usage.get("prompt_tokens")
        # an engine that reports its prompt ids is decoded from them, and they are checked against the
        # harness's own tokenization (a mismatch is a finding)
        answer = oracle.complete(ex.request.endpoint, {**ex.request.body, **fields}, settings,
                                 server_prompt_tokens=tokens if isinstance(tokens, int) else None,
                                 prompt_ids=ex.prompt_ids, server_prompt_ids=ex.prompt_ids)
        found = classic_answer(answer.completion, answer.error)
        if found.side is not None:
            self.reference[ex.request.id] = found.sha256
            self._prompt_ids[ex.request.id] = list(answer.completion.prompt_ids) if answer.completion else []
        return found

    def judge_exchanges(self, arm: ArmResult, plan: ArmPlan, session: Session, exchanges: list[Exchange],
                        baseline: dict[str, Completion], first: int) -> None:
        """Judge each exchange against classic decode, baseline-start and the same request answered cold;
        every diverged request gets its reproduction (a command, or why none)."""
        fields = self.request_fields(plan)
        own = {ex.request.id: ex.completion for ex in exchanges}
        exact = self.profile.arithmetic == "mlx"
        judged: list[tuple[int, Exchange, RequestResult]] = []
        # every answer first (a NeedsWorker leaves the arm untouched), then reproductions and the arm
        for i, ex in enumerate(exchanges):
            classic = self.classic(session, ex, fields)
            base = baseline.get(ex.request.id)
            rep = ex.request.repeats
            cold = (Cold(own[rep], f"its own fresh answer ({rep})")
                    if rep and rep in own and own[rep].ok else None)
            r = judge_request(plan, ex.request, ex.completion, ex.evidence, base, classic, cold, exact=exact,
                              dtype=self.dtype, lossy=self.profile.lossy)
            if r.classic is not None and cold is None and r.verdict != Verdict.LOSSY:
                # it left classic decode with no earlier twin: compared with its cold answer, or told why none (a
                # documented lossy mode's answer is no finding: whether it depends on state is not asked)
                cold = self.cold(session, first + i, plan, ex, fields)
                r = judge_request(plan, ex.request, ex.completion, ex.evidence, base, classic, cold, exact=exact,
                                  dtype=self.dtype, lossy=self.profile.lossy)
            judged.append((i, ex, r))
        for i, ex, r in judged:
            if r.verdict == Verdict.DIVERGED and r.reproduction is None:
                r.reproduction = self.reproduction(session, first + i, plan, r, ex)
                r.replay = r.reproduction.get("command")
            arm.requests.append(r)

    def cold(self, session: Session, index: int, plan: ArmPlan, ex: Exchange, fields: dict[str, Any]) -> Cold:
        """The arm's own cold answer to ``ex``'s request: its answer itself where it was the first request its
        server received; mlx_lm.server's loop in process on a fresh cache where the server runs that loop
        (only for requests that left classic decode: the cost is bounded, and counted in the reference's);
        elsewhere why there is none."""
        from specparity.probes.replay.sequence import LOOP

        fresh = "its cold answer in process (mlx_lm.server's loop on a fresh prompt cache)"
        if index == 0 and not plan.concurrency:
            return Cold(ex.completion, "its own answer, the first request its server received (a fresh cache)")
        if plan.concurrency:
            return Cold(None, fresh, "requests sent concurrently: no cold answer stands for a batch's")
        if plan.env:
            return Cold(None, fresh, "a control arm: its environment variables do not reach the reference's worker")
        loop = self.profile.loop
        if loop != LOOP:
            return Cold(None, fresh, f"{self.profile.name} runs the serving loop {loop or '(unknown)'}, which no"
                                     " in-process replay rebuilds, and no fresh server answered this request")
        other = self._other_mlx_lm()
        if other is not None:  # the in-process loop is mlx_lm.server 0.32's
            return Cold(None, fresh, other)
        oracle = self.oracle(session.history.argv)
        if oracle is None:
            return Cold(None, fresh, "no classic reference in this run")
        from specparity.mlx_server import RequestParams, ServerSettings

        body = {**ex.request.body, **fields}
        settings = ServerSettings.from_argv([str(a) for a in session.history.argv])
        try:
            params = RequestParams.from_body(body, settings)
        except SpecparityError as err:
            return Cold(None, fresh, str(err))
        if not params.deterministic:
            return Cold(None, fresh, f"sampled at temperature {params.temperature:g} without a seed: no process"
                                     " draws what the server drew")
        answer, why = oracle.cold(ex.request.endpoint, body, settings, self._original_draft(plan))
        if answer is None:
            return Cold(None, fresh, why)
        comp = Completion(text=answer.text, sha256=hashlib.sha256(answer.text.encode("utf-8")).hexdigest(),
                          token_ids=list(answer.token_ids), finish_reason=answer.finish_reason)
        return Cold(comp, fresh)

    def _other_mlx_lm(self) -> str | None:
        """Why ``specparity replay`` (run with this interpreter's mlx-lm) is not the server's mlx-lm, where the
        servers ran another one in a pinned environment (None: the same, or no environment)."""
        from importlib.metadata import PackageNotFoundError, version

        theirs = ((self.env_identity or {}).get("packages") or {}).get("mlx-lm")
        try:
            ours = version("mlx-lm")
        except PackageNotFoundError:
            ours = None
        if theirs is None or theirs == ours:
            return None
        return (f"the server ran mlx-lm {theirs} (environment {(self.env_identity or {}).get('name')}): the"
                f" in-process replays rebuild mlx_lm.server's loop and speculative path as mlx-lm {ours} runs"
                " them, not that server's")

    def _replay_environment(self) -> str | None:
        """The pinned environment the servers ran in, as a printed ``--environment`` takes it from any folder: its
        name, or its YAML file's absolute path (None: no environment, or one written inline in the job, which no
        ``--environment`` names: the record then says why it prints no replay)."""
        if not isinstance(self.environment, str):
            return None
        spec = Path(self.environment)
        return str(spec.resolve()) if spec.is_file() else str(self.environment)

    def _original_draft(self, plan: ArmPlan) -> str | None:
        """The drafter checkpoint an arm ran, as the user gave it (no witness wrapper, no export)."""
        if plan.draft == Drafter.TARGET:
            return self.pairing.target
        return self.pairing.draft if plan.draft == Drafter.DRAFT else None

    def reproduction(self, session: Session, index: int, plan: ArmPlan, r: RequestResult,
                     ex: Exchange) -> dict[str, Any]:
        target, trust = self.replay_model
        folder = self.work / "sequences" if self.run_.keeps_files else None
        d = r.divergence
        finding = Finding(self.profile.name, self.profile.loop, self.engine, session.info.get("version"),
                          token_index=d.token_index if d is not None else None,
                          prompt_ids=self._prompt_ids.get(r.id), declined=ex.evidence.declined,
                          other_mlx_lm=self._other_mlx_lm(), environment=self._replay_environment())
        try:
            return reproduce(session.history, index, plan, finding, model=target, draft=self._original_draft(plan),
                             trust_remote_code=trust, folder=folder)
        except SpecparityError as err:
            return {"command": None, "reason": f"could not write the reproduction ({err})"}

    def decodes_first(self) -> bool:
        """Whether classic decode answers the job's requests ahead of the servers after the first, once that one is
        gone (:meth:`classic_first`; its worker imports beside the first server).

        Not where the engine tokenizes on its own and the job has a reference (llama.cpp): classic decode starts
        from the prompt tokens the server says it decoded, known only once it has answered, so an answer decoded
        here from the harness's own tokens would never be used; those requests' limits follow the baselines."""
        return bool(self.job.reference) and not self.engine.tokenizes_itself

    def classic_first(self, plan: ArmPlan) -> None:
        """Classic decode of every request whose text does not depend on a server's answer, once the first
        server is gone (the worker, its imports done beside that server, loaded once; it stays to judge that
        server's arms and gives the weights back before the next server starts: one copy of the target at a
        time). A second turn carries classic decode's own first-turn answer: a server that answers the first turn
        as classic decode does sends those very bytes, and its second turn is answered from here too. Each
        answer's time is what
        the later requests' time limits follow, beside the first server's own (harness.limits)."""
        from specparity.harness.limits import CLASSIC
        from specparity.mlx_server import ServerSettings

        argv = [str(a) for a in self.server_argv(plan)]
        oracle = self.oracle(argv, load=True)
        if oracle is None:
            return
        settings = ServerSettings.from_argv(argv)
        fields = self.request_fields(plan)
        history: dict[str, str] = {}
        asked: set[str] = set()
        while True:
            new = [r for r in build_sequence(self.job, self.endpoint, history) if r.id not in asked]
            if not new:
                break
            for r in new:
                asked.add(r.id)
                if r.repeats:  # the same body as an earlier request: one answer
                    continue
                answer = oracle.complete(r.endpoint, {**r.body, **fields}, settings)
                if answer.completion is None:  # judging says why, request by request
                    oracle.release()
                    return
                got = answer.completion
                self.limits.observe(r.id, got.seconds, len(got.token_ids), CLASSIC)
                if r.turn == 1:
                    history[r.id] = got.text

    def note_once(self, finding: str) -> None:
        if finding not in self.findings:
            self.findings.append(finding)

    # -- one arm -------------------------------------------------------------------------------
    def too_wide(self, plan: ArmPlan) -> str | None:
        """Why the engine cannot run ``plan``'s width with its drafter (None: it can): never clamped."""
        draft = self.drafter(plan)
        if draft is None or plan.width is None:
            return None
        limit = self.engine.max_width(draft)
        if limit is None or plan.width.rows <= limit:
            return None
        if limit < 2:
            return f"{self.profile.name} cannot draft with {draft}: not a drafter its engine takes"
        return (f"{plan.width.describe()} is wider than the {limit} rows {self.profile.name} verifies with drafter"
                f" {draft}: not run (the engine would clamp it)")

    def serve_arm(self, plan: ArmPlan, stop: bool) -> Served:
        """Start (or reuse) the arm's server and send its sequence; ``stop``: stop the server after it
        (no later arm shares it). Judging waits for :meth:`flush`, once no server is resident."""
        from specparity.harness.transport import loopback_client

        arm = ArmResult(plan.name, plan.kind, plan.width)
        t0 = time.perf_counter()
        why = self.too_wide(plan)
        if why:
            arm.verdict, arm.reason = Verdict.NOT_RUN, why
            return Served(plan, arm)
        arm.served_by = WidthMode.REQUEST if plan.per_request else WidthMode.PROCESS
        session = self.sessions.get(plan.server_key)
        if session is None:
            session = self.new_session(plan)
            try:
                self.start(session)
            except ServerStartError as err:
                arm.verdict, arm.reason = Verdict.ERROR, str(err)
                arm.server = dict(session.info)
                arm.seconds = time.perf_counter() - t0
                return Served(plan, arm)
            self.sessions[plan.server_key] = session
        arm.server = dict(session.info)
        # a shared server's start-up is counted once, by the first arm on it
        arm.server["start_seconds"] = 0.0 if session.start_counted else session.info.get("start_seconds")
        session.start_counted = True
        fields = self.request_fields(plan)
        owner = plan.name == BASELINE_START
        requests = build_sequence(self.job, self.endpoint, self.history)
        with loopback_client() as client:
            if plan.concurrency:
                exchanges = self.send_concurrent(client, session, requests, fields, plan)
            else:
                exchanges = []
                i = 0
                while i < len(requests):
                    req = requests[i]
                    self.run_.note(f"  request {req.id}")
                    exchanges.append(self.send(client, session, req, fields, plan))
                    if owner and req.turn == 1 and exchanges[-1].completion.ok:
                        # the next turn carries this answer: every arm sends the same bytes
                        self.history[req.id] = exchanges[-1].completion.text
                        requests = build_sequence(self.job, self.endpoint, self.history)
                    i += 1
        first = len(session.history.sent)
        session.history.sent += [Sent(ex.request, fields, ex.completion) for ex in exchanges]
        served = Served(plan, arm, session, exchanges, first, time.perf_counter() - t0)
        if stop:
            self.stop_arm_session(served)
        return served

    def stop_arm_session(self, served: Served) -> None:
        """Stop the arm's server, its peak memory read first (the process must be there to read it)."""
        session = served.session
        if session is None:
            return
        served.arm.server["peak_rss_bytes"] = memory.peak_rss(session.server.pid, self.run_.sampler)
        with self.clock.phase("server_stop"):
            session.server.stop()
        self.sessions.pop(served.plan.server_key, None)
        served.arm.server["returncode"] = session.server.proc.returncode if session.server.proc else None

    def flush(self, res: PairingResult, pending: list[Served], baseline: dict[str, Completion],
              offline: bool = False) -> None:
        """Judge the served arms in order (the classic reference loads now, unless it is already there)
        and hand each to the record. ``offline``: only while the reference answers from what it already
        decoded; the first arm that needs its worker (a request not decoded before, a cold answer) stops
        the flush, and it and the arms after it stay pending (judged in order later)."""
        oracle = self._oracle if offline else None
        while pending:
            served = pending[0]
            arm, session = served.arm, served.session
            if session is not None:
                hits = oracle.hits_so_far if oracle is not None else 0
                try:
                    if oracle is not None:
                        oracle.offline = True
                    with self.clock.phase("judge"):
                        self.judge_served(served, baseline)
                except NeedsWorker:
                    assert oracle is not None
                    oracle.hits_so_far = hits  # judged again later: its cache hits counted then
                    return
                finally:
                    if oracle is not None:
                        oracle.offline = False
            pending.pop(0)
            res.arms.append(arm)
            self.run_.arm_finished(res, arm)

    def judge_served(self, served: Served, baseline: dict[str, Completion]) -> None:
        """Judge one served arm's exchanges and set its verdict, generation time and wall time."""
        arm, session = served.arm, served.session
        assert session is not None
        t0 = time.perf_counter()
        if "peak_rss_bytes" not in arm.server:  # its server still runs (shared, or the opt-in)
            arm.server["peak_rss_bytes"] = memory.peak_rss(session.server.pid, self.run_.sampler)
        self.judge_exchanges(arm, served.plan, session, served.exchanges, baseline, served.first)
        arm.generation_seconds = (session.generation if served.plan.concurrency
                                  else sum(ex.completion.seconds for ex in served.exchanges))
        judge_arm(arm, served.plan)
        arm.seconds = served.seconds + time.perf_counter() - t0
        arm.server.setdefault("returncode", None)

    def memory_summary(self, res: PairingResult) -> dict[str, Any]:
        """What the pairing's processes held at their peak (measured): each server's and each reference
        worker's peak resident bytes, and the largest; the opt-in that put the reference beside them."""
        servers = {a.name: a.server.get("peak_rss_bytes") for a in res.arms if a.server.get("peak_rss_bytes")}
        workers = list((res.reference_cost or {}).get("worker_peaks") or [])
        known = [v for v in servers.values() if v]
        largest = max(known) if known else None
        sampler = self.run_.sampler
        out: dict[str, Any] = {"servers_peak_rss_bytes": servers, "largest_server_bytes": largest,
                               "reference_workers_peak_rss_bytes": workers, "reference_beside": self.beside}
        if sampler is not None:
            sampler.sample()
            # sampled every few tenths of a second (or less often, where a sample costs more: see
            # memory.SAMPLE_OVERHEAD): the sum of the harness and every process it started
            out["peak_total_bytes"] = sampler.peak_total
            out["peak_sampled_every_s"] = round(sampler.longest_wait, 3)
            out["peak_children_bytes"] = sampler.peak_children
            out["harness_peak_rss_bytes"] = sampler.peak_of(sampler.root)
            out["at_peak"] = dict(sampler.at_peak)
            if largest:
                out["peak_total_over_largest_server"] = round(sampler.peak_total / largest, 3)
        if self.run_.budget is not None:
            out["expected_bytes"] = self.run_.budget.expected
            out["limit_bytes"] = self.run_.budget.limit
        return out
