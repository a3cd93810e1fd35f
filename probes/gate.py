"""The memoized gate: may a server verify W rows at once on this checkpoint, here?

A verdict is memoized per key: checkpoint fingerprint (config + weight digests,
dtype, quantization), width, cache options, backend (device, mlx and mlx-lm
versions) and the kernel-changing environment variables (default: ``MLX_*``).
A hit answers from the store without loading the model. A miss runs the
block-vs-chain probe (with the long walk) and stores its verdict.

Allow, decline and forfeit each log one fixed, greppable line::

    specparity-gate: ALLOW width=4 key=1a2b3c4d5e6f reason="..."
    specparity-gate: DECLINE width=4 key=1a2b3c4d5e6f reason="..."
    specparity-gate: FORFEIT width=4 key=1a2b3c4d5e6f reason="..."

``SPECPARITY_ALLOW_INEXACT=1`` turns a decline into a forfeit: allowed, logged.

Python API for a server::

    from specparity.probes.gate import gate_check
    if gate_check("/models/target", width=4).allow: ...
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
from specparity.verdicts import PROBE_VERDICTS, Decision, Verdict, decision_exit_code

log = logging.getLogger("specparity.gate")

STORE_VERSION = 1
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


def gate_key(model_dir: str | os.PathLike, width: int, opts: CacheOptions | None = None,
             env_prefixes: tuple[str, ...] | list[str] = DEFAULT_ENV_PREFIXES,
             probe_spec: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """The memo key and the fields it hashes."""
    from specparity.checkpoint import fingerprint

    fp = fingerprint(model_dir)
    fields = {
        "fingerprint": fp.digest,
        "dtype": fp.dtype,
        "quantization": fp.quantization,
        "width": int(width),
        "cache": (opts or CacheOptions()).to_dict(),
        "backend": backend(),
        "env": kernel_env(tuple(env_prefixes)),
        "probe": probe_spec or gate_probe_spec(DEFAULT_GATE_DEPTHS, DEFAULT_GATE_WALK),
    }
    key = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
    return key, fields


def gate_probe_spec(depths: tuple[int, ...] | list[int], walk: int) -> dict[str, Any]:
    """What the gate's probe covers (part of the key: a wider probe never reuses a narrower verdict)."""
    return {"depths": list(depths), "walk": walk, "aim_limit": DEFAULT_GATE_AIM_LIMIT,
            "prefill": True, "bracket": True}


def _line(action: str, width: int, key: str, reason: str) -> str:
    reason = reason.replace('"', "'")
    return f'specparity-gate: {action} width={width} key={key[:12]} reason="{reason}"'


def _default_probe(model_dir: str, width: int, opts: CacheOptions, trust_remote_code: bool,
                   depths: tuple[int, ...], walk: int) -> tuple[str, str]:
    from specparity.checkpoint import load_checkpoint
    from specparity.probes.forward.probe import run_probe
    from specparity.prompts import encode_prompts

    loaded = load_checkpoint(model_dir, trust_remote_code=trust_remote_code)
    prompts = encode_prompts(loaded.tokenizer)
    run = run_probe(loaded, [width], list(depths), prompts, opts, walk_positions=walk,
                    prefill=True, aim=True, aim_limit=DEFAULT_GATE_AIM_LIMIT)
    return run.verdict, summarize(run.probe, run.prefill)


def summarize(report: Any, prefill: list[Any] | None = None) -> str:
    """One line of evidence from a ProbeReport (and its prefill parity): the finding, else the reach."""
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
    for r in prefill or []:
        if r.verdict == Verdict.DIVERGENT:
            from specparity.probes.forward.render import prefill_line

            return prefill_line(r)
    for c in report.cells:
        if c.verdict == Verdict.NOT_RUN:
            return f"not run at width {c.width} depth {c.depth}: {c.reason}"
    for a in report.aimed:
        if a.verdict == Verdict.NOT_RUN:
            return f"not run at width {a.width} across {a.boundary['kind']} {a.boundary['position']}: {a.reason}"
    for r in prefill or []:
        if r.verdict == Verdict.NOT_RUN:
            return f"prefill parity not run on prompt {r.prompt_index}"
    depths = sorted({c.depth for c in report.cells})
    walked = f", long walk {report.walks[0].positions} positions" if report.walks else ""
    aimed = sorted({f"{a.boundary['kind']} {a.boundary['position']}" for a in report.aimed})
    reach = f"; blocks across {', '.join(aimed)}" if aimed else "; no cache boundary within reach"
    pre = f"; prefill parity on {len(prefill)} prompts" if prefill else ""
    notes = "".join(f"; {n}" for n in report.notes)
    return (f"equal at depths {','.join(map(str, depths))} over {len(report.prompts)} prompts"
            f"{walked}{reach}{pre}{notes}")


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
) -> GateDecision:
    """Allow or decline verifying ``width`` rows; memoized, probing on a miss.

    ``log_line=False``: the caller prints ``decision.line`` itself (the CLI), so it
    appears once.
    """
    from specparity.inputs import check_positions, check_width

    check_width(width)
    for d in depths:
        check_positions(d, "depth")
    check_positions(walk, "walk")
    opts = opts or CacheOptions()
    store = store or GateStore()
    spec = gate_probe_spec(depths, walk)
    key, fields = gate_key(model_dir, width, opts, env_prefixes, spec)
    entry = store.get(key)
    hit = entry is not None
    if entry is None:
        run = probe or _default_probe
        verdict, reason = run(str(model_dir), width, opts, trust_remote_code, depths, walk)
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
