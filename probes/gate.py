"""The memoized gate: may a server verify W rows at once on this checkpoint, here?

Two decisions, each memoized per key: checkpoint fingerprint (config + weight
digests, dtype, quantization; an adapter's digest when one is applied), cache
options, backend (device, mlx and mlx-lm versions), the kernel-changing
environment variables (default: ``MLX_*``), and which decision it is (the key's
``decision`` field):

- ``width`` (:func:`gate_check`): block vs chain at that width, at the gate's
  depths, over the long walk, at every aimed cache boundary, inside the
  reproducibility bracket. It rests only on what the width changes.
- ``prompt-cache`` (:func:`prompt_cache_policy`): prefill parity (one-shot vs
  chunked vs token-by-token prefill). It does not depend on the width and
  declines no drafter: a drafter-less server prefills in chunks as much as a
  drafting one. What chunk dependence threatens is prompt-cache reuse (a warm
  request prefills only its suffix, a chunked prefill), so it decides the
  server's policy: ``reuse`` or ``re-prefill``.

A hit answers from the store without loading the model. A miss runs the probe,
on the caller's loaded model when it passes one (a server probes the model it
serves), else on a fresh load, and stores its verdict.

Allow, decline, forfeit and the policy each log one fixed, greppable line::

    specparity-gate: ALLOW width=4 key=1a2b3c4d5e6f reason="..."
    specparity-gate: DECLINE width=4 key=1a2b3c4d5e6f reason="..."
    specparity-gate: FORFEIT width=4 key=1a2b3c4d5e6f reason="..."
    specparity-gate: PROMPT-CACHE policy=re-prefill key=1a2b3c4d5e6f reason="..."

``SPECPARITY_ALLOW_INEXACT=1`` turns a decline into a forfeit: allowed, logged.

Python API for a server::

    from specparity.probes.gate import gate_check, prompt_cache_policy
    if gate_check("/models/target", width=4, loaded=loaded).allow: ...
    policy = prompt_cache_policy("/models/target", loaded=loaded).policy
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable

from specparity.decode import CacheOptions
from specparity.identity import DEFAULT_ENV_PREFIXES, backend, kernel_env
from specparity.store import atomic_write_text, locked
from specparity.verdicts import PROBE_VERDICTS, CachePolicy, Decision, Verdict, decision_exit_code

log = logging.getLogger("specparity.gate")

STORE_VERSION = 1
WIDTH_DECISION = "width"
PROMPT_CACHE_DECISION = "prompt-cache"
DEFAULT_GATE_DEPTHS = (0, 32)
DEFAULT_GATE_WALK = 128
DEFAULT_GATE_AIM_LIMIT = 1024  # blocks aimed at every cache boundary up to this position


@dataclass
class GateDecision:
    """The gate's answer.

    allow: True if the speculative path may run at this width.
    verdict: the memoized probe verdict (equal | divergent | not_run).
    forfeit: allowed only because SPECPARITY_ALLOW_INEXACT=1.
    hit: answered from the store (no model loaded).
    key: the memo key (sha256 hex). width: verify rows.
    reason: one line of evidence. line: the logged line.
    """

    allow: bool
    verdict: Verdict
    forfeit: bool
    hit: bool
    key: str
    width: int
    reason: str
    line: str

    def __post_init__(self) -> None:
        self.verdict = Verdict(self.verdict)  # a store entry holds the word

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "decision": self.decision, "exit_code": self.exit_code}

    def lines(self) -> list[str]:
        """The decision word (allow / decline), then its width, evidence and key."""
        word = {Decision.ALLOW: "allow", Decision.FORFEIT: "allow (forfeit: SPECPARITY_ALLOW_INEXACT=1)",
                Decision.DECLINE: "decline"}[self.decision]
        return [word, f"width {self.width}: {self.verdict}: {self.reason}",
                f"key {self.key[:12]} ({'answered from the store' if self.hit else 'probed now'})"]

    @property
    def decision(self) -> Decision:
        return Decision.FORFEIT if self.forfeit else Decision.ALLOW if self.allow else Decision.DECLINE

    @property
    def exit_code(self) -> int:
        return decision_exit_code(self.decision)


def store_path() -> Path:
    from specparity.paths import home

    return home() / "gate" / "store.json"


class GateStore:
    """A JSON store of verdicts; atomic replace, flock-serialized writers."""

    def __init__(self, path: Path | None = None):
        self.path = path or store_path()

    def _load(self) -> tuple[dict[str, Any], str | None]:
        """(the readable entries, why the store is unreadable or None when it is whole)."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}, None
        except OSError as err:
            return {}, f"cannot read: {err.strerror}"
        try:
            data = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            return {}, "not UTF-8"
        except (ValueError, RecursionError) as err:
            return {}, f"not JSON: {str(err).splitlines()[0]}"
        if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
            return {}, "not a gate store (no 'entries' object)"
        good = {k: e for k, e in data["entries"].items() if valid_entry(e)}
        bad = [k for k in data["entries"] if k not in good]
        if bad:
            return good, f"{len(bad)} malformed entr{'y' if len(bad) == 1 else 'ies'} (first {bad[0][:12]!r})"
        return good, None

    def _read(self) -> dict[str, Any]:
        """The entries; an unreadable store is moved aside, reported once and rebuilt."""
        entries, problem = self._load()
        if problem is None:
            return entries
        with locked(self.path):
            entries, problem = self._load()  # another process may have repaired it meanwhile
            if problem is None:
                return entries
            aside = self._set_aside()
            log.warning(
                "specparity-gate: STORE-CORRUPT path=%s moved_to=%s (%s); rebuilding with %d"
                " readable entries", self.path, aside, problem, len(entries),
            )
            if entries:
                self._write(entries)
        return entries

    def _set_aside(self) -> Path | None:
        """Move the store to ``store.json.corrupt-<time>[-n]``, never over an earlier copy.

        Called with the store's lock held, so no other specparity process races the rename.
        """
        stamp = int(time.time())
        for n in range(1000):
            aside = self.path.with_name(
                f"{self.path.name}.corrupt-{stamp}" + (f"-{n}" if n else ""))
            if aside.exists() or aside.is_symlink():
                continue
            try:
                os.rename(self.path, aside)
            except OSError:
                return None
            return aside
        return None

    def _write(self, entries: dict[str, Any]) -> None:
        atomic_write_text(
            self.path, json.dumps({"version": STORE_VERSION, "entries": entries}, indent=1)
        )

    def get(self, key: str) -> dict[str, Any] | None:
        return self._read().get(key)

    def put(self, key: str, entry: dict[str, Any]) -> None:
        with locked(self.path):
            entries, problem = self._load()
            if problem is not None:
                aside = self._set_aside()
                log.warning("specparity-gate: STORE-CORRUPT path=%s moved_to=%s (%s); rebuilding",
                            self.path, aside, problem)
            entries[key] = entry
            self._write(entries)

    def entries(self) -> dict[str, Any]:
        return self._read()

    def read_only(self) -> tuple[dict[str, Any], str | None]:
        """The readable entries and the store's problem, moving nothing (``gate list``)."""
        return self._load()


def valid_entry(entry: Any) -> bool:
    """A stored verdict: an object with a known probe verdict and a string reason."""
    return (isinstance(entry, dict) and entry.get("verdict") in PROBE_VERDICTS
            and isinstance(entry.get("reason"), str)
            and isinstance(entry.get("fields", {}), dict))


def _identity_fields(model_dir: str | os.PathLike, opts: CacheOptions | None,
                     env_prefixes: tuple[str, ...] | list[str],
                     adapter: str | os.PathLike | None) -> dict[str, Any]:
    """What both decisions are keyed by: the computation (weights, adapter, cache, backend, env)."""
    from specparity.checkpoint import adapter_digest, fingerprint

    fp = fingerprint(model_dir)
    fields = {
        "fingerprint": fp.digest,
        "dtype": fp.dtype,
        "quantization": fp.quantization,
        "cache": (opts or CacheOptions()).to_dict(),
        "backend": backend(),
        "env": kernel_env(tuple(env_prefixes)),
    }
    if adapter is not None:  # absent, not None, without one: keys made before adapters stay valid
        fields["adapter"] = adapter_digest(adapter)
    return fields


def _key(fields: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def gate_key(model_dir: str | os.PathLike, width: int, opts: CacheOptions | None = None,
             env_prefixes: tuple[str, ...] | list[str] = DEFAULT_ENV_PREFIXES,
             probe_spec: dict[str, Any] | None = None,
             adapter: str | os.PathLike | None = None) -> tuple[str, dict[str, Any]]:
    """The width decision's memo key and the fields it hashes."""
    fields = _identity_fields(model_dir, opts, env_prefixes, adapter)
    fields.update({
        "decision": WIDTH_DECISION,
        "width": int(width),
        "probe": probe_spec or gate_probe_spec(DEFAULT_GATE_DEPTHS, DEFAULT_GATE_WALK),
    })
    return _key(fields), fields


def gate_probe_spec(depths: tuple[int, ...] | list[int], walk: int) -> dict[str, Any]:
    """What the width probe covers (part of the key: a wider probe never reuses a narrower verdict).

    No prefill parity: it is the prompt-cache decision's (:func:`policy_key`).
    """
    return {"depths": list(depths), "walk": walk, "aim_limit": DEFAULT_GATE_AIM_LIMIT,
            "bracket": True}


def policy_key(model_dir: str | os.PathLike, opts: CacheOptions | None = None,
               env_prefixes: tuple[str, ...] | list[str] = DEFAULT_ENV_PREFIXES,
               adapter: str | os.PathLike | None = None) -> tuple[str, dict[str, Any]]:
    """The prompt-cache decision's memo key and the fields it hashes (no width: it has none)."""
    fields = _identity_fields(model_dir, opts, env_prefixes, adapter)
    fields.update({
        "decision": PROMPT_CACHE_DECISION,
        "probe": {"prefill": "one-shot vs chunked vs token-by-token",
                  "aim_limit": DEFAULT_GATE_AIM_LIMIT},
    })
    return _key(fields), fields


def _line(action: str, width: int, key: str, reason: str) -> str:
    reason = reason.replace('"', "'")
    return f'specparity-gate: {action} width={width} key={key[:12]} reason="{reason}"'


def _loaded(model_dir: str, trust_remote_code: bool, loaded: Any | None) -> Any:
    from specparity.checkpoint import load_checkpoint

    return loaded if loaded is not None else load_checkpoint(model_dir,
                                                             trust_remote_code=trust_remote_code)


def _default_probe(model_dir: str, width: int, opts: CacheOptions, trust_remote_code: bool,
                   depths: tuple[int, ...], walk: int, loaded: Any | None = None) -> tuple[str, str]:
    from specparity.probes.forward.probe import run_probe
    from specparity.prompts import encode_prompts

    model = _loaded(model_dir, trust_remote_code, loaded)
    prompts = encode_prompts(model.tokenizer)
    run = run_probe(model, [width], list(depths), prompts, opts, walk_positions=walk,
                    prefill=False, aim=True, aim_limit=DEFAULT_GATE_AIM_LIMIT)
    return run.verdict, summarize(run.probe)


def _default_prefill_probe(model_dir: str, opts: CacheOptions, trust_remote_code: bool,
                           loaded: Any | None = None) -> tuple[str, str]:
    """Prefill parity on the gate's prompts, plus prompts aimed at the boundaries a warm
    request's suffix prefill can straddle: ``prefill_step_size`` and, with ``--kv-bits``,
    ``quantized_kv_start`` (a fresh prefill attends across it unquantized, a suffix
    prefilled after it attends over the quantized cache)."""
    from specparity.probes.forward.boundaries import aimed_prompt
    from specparity.probes.forward.prefill import prefill_parity
    from specparity.probes.forward.probe import run_prefill_parity
    from specparity.probes.forward.render import prefill_line
    from specparity.prompts import encode_prompts
    from specparity.verdicts import combine

    model = _loaded(model_dir, trust_remote_code, loaded)
    prompts = encode_prompts(model.tokenizer)
    limit = DEFAULT_GATE_AIM_LIMIT
    aim = opts.prefill_step_size + 2 <= limit
    reports = run_prefill_parity(model.model, prompts, opts, aim=aim)
    notes = [] if aim else [f"prefill_step_size {opts.prefill_step_size}"]
    if opts.kv_bits is not None:
        start = opts.quantized_kv_start
        if 0 < start and start + 2 <= limit:
            r = prefill_parity(model.model, [aimed_prompt(prompts[0], start + 2)], opts, chunk=start,
                               token_by_token=False)[0]
            r.prompt_index = len(reports)
            reports.append(r)
        elif start > 0:
            notes.append(f"quantized_kv_start {start}")
    verdict = combine(r.verdict for r in reports)
    for r in reports:
        if r.verdict != Verdict.EQUAL:
            return verdict, prefill_line(r)
    lengths = ", ".join(str(r.prompt_len) for r in reports)
    past = f"; not aimed: {', '.join(notes)} past the aim limit of {limit} positions" if notes else ""
    return verdict, (f"one-shot, chunked and token-by-token prefill equal on {len(reports)}"
                     f" prompts ({lengths} tokens){past}")


def summarize(report: Any) -> str:
    """One line of evidence from a ProbeReport: the finding, else the reach."""
    if not report.reproducible:
        return report.bracket.line()
    for c in report.cells:
        if c.verdict == Verdict.DIVERGENT:
            return (f"divergent at width {c.width} depth {c.depth} prompt {c.prompt_index}"
                    f" row {c.first_row}: {c.diff.summary('logit bytes')}")
    for w in report.walks:
        if w.verdict == Verdict.DIVERGENT:
            return (f"long walk at width {w.width} diverges at step {w.first_step}"
                    f" (position {w.first_position}): {w.diff.summary('logit bytes')}")
    for a in report.aimed:
        if a.verdict == Verdict.DIVERGENT:
            return (f"divergent at width {a.width} across {a.boundary['kind']} {a.boundary['position']}"
                    f" (block at positions {a.start}-{a.start + a.width - 1}, first at position"
                    f" {a.absolute_position}): {a.diff.summary('logit bytes')}")
        if a.walk is not None and a.walk.verdict == Verdict.DIVERGENT:
            return (f"aimed walk at width {a.width} across {a.boundary['kind']} {a.boundary['position']}"
                    f" diverges at position {a.walk.first_position}: {a.walk.diff.summary('logit bytes')}")
    for c in report.cells:
        if c.verdict == Verdict.NOT_RUN:
            return f"not run at width {c.width} depth {c.depth}: {c.reason}"
    for a in report.aimed:
        if a.verdict == Verdict.NOT_RUN:
            return f"not run at width {a.width} across {a.boundary['kind']} {a.boundary['position']}: {a.reason}"
    depths = sorted({c.depth for c in report.cells})
    walked = f", long walk {report.walks[0].positions} positions" if report.walks else ""
    aimed = sorted({f"{a.boundary['kind']} {a.boundary['position']}" for a in report.aimed})
    reach = f"; blocks across {', '.join(aimed)}" if aimed else "; no cache boundary within reach"
    notes = "".join(f"; {n}" for n in report.notes)
    return (f"equal at depths {','.join(map(str, depths))} over {len(report.prompts)} prompts"
            f"{walked}{reach}{notes}")


def gate_check(
    model_dir: str | os.PathLike,
    width: int,
    opts: CacheOptions | None = None,
    *,
    env_prefixes: tuple[str, ...] | list[str] = DEFAULT_ENV_PREFIXES,
    trust_remote_code: bool = False,
    depths: tuple[int, ...] = DEFAULT_GATE_DEPTHS,
    walk: int = DEFAULT_GATE_WALK,
    store: GateStore | None = None,
    probe: Callable[..., tuple[str, str]] | None = None,
    log_line: bool = True,
    loaded: Any | None = None,
    adapter: str | os.PathLike | None = None,
) -> GateDecision:
    """Allow or decline verifying ``width`` rows; memoized, probing on a miss.

    ``loaded``: the checkpoint already in memory (a ``checkpoint.Loaded`` of
    ``model_dir``, with ``adapter`` applied when one is named): a miss probes it
    instead of loading a second copy. ``log_line=False``: the caller prints
    ``decision.line`` itself (the CLI), so it appears once.
    """
    from specparity.inputs import check_positions, check_width

    check_width(width)
    for d in depths:
        check_positions(d, "depth")
    check_positions(walk, "walk")
    opts = opts or CacheOptions()
    store = store or GateStore()
    spec = gate_probe_spec(depths, walk)
    key, fields = gate_key(model_dir, width, opts, env_prefixes, spec, adapter)
    entry = store.get(key)
    hit = entry is not None
    if entry is None:
        if probe is not None:
            verdict, reason = probe(str(model_dir), width, opts, trust_remote_code, depths, walk)
        else:
            verdict, reason = _default_probe(str(model_dir), width, opts, trust_remote_code,
                                             depths, walk, loaded)
        entry = {"verdict": verdict, "reason": reason, "fields": fields, "at": time.time()}
        store.put(key, entry)
    verdict, reason = entry["verdict"], entry["reason"]
    allow = verdict == Verdict.EQUAL  # not_run, inconclusive and anything unknown decline
    forfeit = False
    if not allow and os.environ.get("SPECPARITY_ALLOW_INEXACT") == "1":
        allow, forfeit = True, True
    action = Decision.FORFEIT if forfeit else Decision.ALLOW if allow else Decision.DECLINE
    line = _line(action, width, key, f"{verdict}: {reason}")
    if log_line:
        (log.warning if action != Decision.ALLOW else log.info)("%s", line)
    return GateDecision(allow, verdict, forfeit, hit, key, int(width), reason, line)


@dataclass
class PolicyDecision:
    """The prompt-cache policy for one checkpoint and cache configuration.

    policy: reuse | re-prefill. verdict: the memoized prefill-parity verdict
    (equal -> reuse; divergent, not_run, anything else -> re-prefill).
    hit: answered from the store. key: the memo key (sha256 hex).
    reason: one line of evidence. line: the logged line.
    """

    policy: CachePolicy
    verdict: str | Verdict
    hit: bool
    key: str
    reason: str
    line: str

    @property
    def reuse(self) -> bool:
        return self.policy == CachePolicy.REUSE

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def prompt_cache_policy(
    model_dir: str | os.PathLike,
    opts: CacheOptions | None = None,
    *,
    env_prefixes: tuple[str, ...] | list[str] = DEFAULT_ENV_PREFIXES,
    trust_remote_code: bool = False,
    store: GateStore | None = None,
    probe: Callable[..., tuple[str, str]] | None = None,
    log_line: bool = True,
    loaded: Any | None = None,
    adapter: str | os.PathLike | None = None,
) -> PolicyDecision:
    """Whether a server may reuse cached prompt prefixes as they are; memoized, probing on a miss.

    ``probe(model_dir, opts, trust_remote_code)`` replaces prefill parity (tests).
    """
    opts = opts or CacheOptions()
    store = store or GateStore()
    key, fields = policy_key(model_dir, opts, env_prefixes, adapter)
    entry = store.get(key)
    hit = entry is not None
    if entry is None:
        if probe is not None:
            verdict, reason = probe(str(model_dir), opts, trust_remote_code)
        else:
            verdict, reason = _default_prefill_probe(str(model_dir), opts, trust_remote_code,
                                                     loaded)
        entry = {"verdict": verdict, "reason": reason, "fields": fields, "at": time.time()}
        store.put(key, entry)
    verdict, reason = entry["verdict"], entry["reason"]
    policy = CachePolicy.REUSE if verdict == Verdict.EQUAL else CachePolicy.REPREFILL
    text = f"{verdict}: {reason}".replace('"', "'")
    line = f'specparity-gate: PROMPT-CACHE policy={policy} key={key[:12]} reason="{text}"'
    if log_line:
        (log.info if policy == CachePolicy.REUSE else log.warning)("%s", line)
    return PolicyDecision(policy, verdict, hit, key, reason, line)
