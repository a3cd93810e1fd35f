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
from specparity.verdicts import Decision, Verdict, decision_exit_code

log = logging.getLogger("specparity.gate")

STORE_VERSION = 1
DEFAULT_GATE_DEPTHS = (0, 32)
DEFAULT_GATE_WALK = 128


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
    verdict: str | Verdict
    forfeit: bool
    hit: bool
    key: str
    width: int
    reason: str
    line: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

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

    def _read(self) -> dict[str, Any]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
                raise ValueError("not a gate store")
            return data["entries"]
        except ValueError as err:
            aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
            moved_to: Path | None = aside
            try:
                os.replace(self.path, aside)
            except OSError:
                moved_to = None
            log.warning(
                "specparity-gate: STORE-CORRUPT path=%s moved_to=%s (%s); rebuilding",
                self.path, moved_to, err,
            )
            return {}

    def get(self, key: str) -> dict[str, Any] | None:
        return self._read().get(key)

    def put(self, key: str, entry: dict[str, Any]) -> None:
        with locked(self.path):
            entries = self._read()
            entries[key] = entry
            atomic_write_text(
                self.path, json.dumps({"version": STORE_VERSION, "entries": entries}, indent=1)
            )

    def entries(self) -> dict[str, Any]:
        return self._read()


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
        "probe": probe_spec or {"depths": list(DEFAULT_GATE_DEPTHS), "walk": DEFAULT_GATE_WALK},
    }
    key = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
    return key, fields


def _line(action: str, width: int, key: str, reason: str) -> str:
    reason = reason.replace('"', "'")
    return f'specparity-gate: {action} width={width} key={key[:12]} reason="{reason}"'


def _default_probe(model_dir: str, width: int, opts: CacheOptions, trust_remote_code: bool,
                   depths: tuple[int, ...], walk: int) -> tuple[str, str]:
    from specparity.checkpoint import load_checkpoint
    from specparity.probes.forward.blockchain import probe_block_vs_chain
    from specparity.prompts import encode_prompts

    loaded = load_checkpoint(model_dir, trust_remote_code=trust_remote_code)
    prompts = encode_prompts(loaded.tokenizer)
    report = probe_block_vs_chain(loaded.model, [width], list(depths), prompts, opts,
                                  walk_positions=walk)
    return report.verdict, summarize(report)


def summarize(report: Any) -> str:
    """One line of evidence from a ProbeReport."""
    for c in report.cells:
        if c.verdict == Verdict.DIVERGENT:
            return (f"divergent at width {c.width} depth {c.depth} prompt {c.prompt_index}"
                    f" row {c.first_row}: {c.diff.summary('logit bytes')}")
    for w in report.walks:
        if w.verdict == Verdict.DIVERGENT:
            return (f"long walk at width {w.width} diverges at step {w.first_step}"
                    f" (position {w.first_position}): {w.diff.summary('logit bytes')}")
    for c in report.cells:
        if c.verdict == Verdict.NOT_RUN:
            return f"not run at width {c.width} depth {c.depth}: {c.reason}"
    depths = sorted({c.depth for c in report.cells})
    walked = f", long walk {report.walks[0].positions} positions" if report.walks else ""
    return (f"equal at depths {','.join(map(str, depths))} over {len(report.prompts)} prompts"
            f"{walked}")


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
) -> GateDecision:
    """Allow or decline verifying ``width`` rows; memoized, probing on a miss."""
    opts = opts or CacheOptions()
    store = store or GateStore()
    spec = {"depths": list(depths), "walk": walk}
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
    (log.warning if action != Decision.ALLOW else log.info)("%s", line)
    return GateDecision(allow, verdict, forfeit, hit, key, int(width), reason, line)
