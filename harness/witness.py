"""The witness: engine-agnostic evidence that a server ran the speculative path.

Plain mlx-lm's server reports nothing about drafting, so the harness serves
witness wrappers of the checkpoints: the same weights and tokenizer (linked,
not copied; a checkpoint's own ``model_file`` too, which the wrapper loads and
wraps, under --trust-remote-code), with ``model_file`` = the fixture model file, whose forward
appends ``<pid> <role> <rows> <cache offset>`` to the file named by
``SPECPARITY_WITNESS_FILE`` (the server must load them with
``--trust-remote-code``). From one request's slice of that file:

- target side: a call of >= 2 rows at a cache offset at or past the prompt's
  last token is a verify block (classic decode feeds one row at a time there);
  consecutive verify offsets give the accept vector
  (accepted = next offset - this offset - 1);
- draft side: any drafter forward at all.

No witness line and no other evidence means ``not_engaged``, never ``match``.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specparity import fixtures
from specparity.errors import UsageError
from specparity.fixtures import FIXTURE_MODULE

WITNESS_ENV = "SPECPARITY_WITNESS_FILE"
FIXTURE_MODEL_PATH = Path(fixtures.__file__).parent / "fixture_models" / FIXTURE_MODULE
_KEEP_OUT = {"config.json", FIXTURE_MODULE, "fixture.json"}


def wrap_checkpoint(src: str | os.PathLike, dst: str | os.PathLike, role: str,
                    trust_remote_code: bool = False) -> Path:
    """``dst``: ``src`` with the witness model_file (its faults, if any, kept).

    A checkpoint that ships its own ``model_file`` is wrapped too: the witness
    loads that file (linked into ``dst`` with the rest) and wraps its model. That
    runs the checkpoint's code, so it needs ``trust_remote_code`` (the consent the
    server is given with ``--trust-remote-code``); without it, a UsageError.
    """
    src, dst = Path(src), Path(dst)
    cfg_path = src / "config.json"
    if not cfg_path.is_file():
        raise UsageError(f"{src}: no config.json: not an mlx-lm checkpoint")
    config = json.loads(cfg_path.read_text())
    own = config.get("model_file")
    if own is not None and own != FIXTURE_MODULE:
        if not isinstance(own, str) or Path(own).name != own or not (src / own).is_file():
            raise UsageError(f"{src}: its model_file {own!r} is not a file in the checkpoint")
        if not trust_remote_code:
            raise UsageError(f"{src}: has its own model_file {own!r}: the witness runs it only with"
                             " --trust-remote-code")
        spec = {"module_file": own, "faults": []}
    else:
        spec = dict(config.get("specparity") or {"base": config["model_type"], "faults": []})
    spec["witness"] = role
    config["model_file"] = FIXTURE_MODULE
    config["specparity"] = spec
    dst.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.name in _KEEP_OUT:
            continue
        link = dst / item.name
        if not link.exists():
            link.symlink_to(item.resolve())
    (dst / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    shutil.copy(FIXTURE_MODEL_PATH, dst / FIXTURE_MODULE)
    return dst


@dataclass
class WitnessCall:
    role: str
    rows: int
    offset: int


@dataclass
class Evidence:
    """What one request (or one batch of requests) showed.

    verify_calls: target forwards of >= 2 rows in the decode phase.
    draft_calls: drafter forwards.
    accepts: accepted proposals per verify round (the last round's from the token count).
    widths: rows per verify round.
    lines: the log lines / fields that are evidence (engaged or declined).
    declined: a decline line was seen.
    source: witness, log, response, metrics (what gave the evidence).
    """

    verify_calls: int = 0
    draft_calls: int = 0
    accepts: list[int] = field(default_factory=list)
    widths: list[int] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    declined: bool = False
    sources: list[str] = field(default_factory=list)

    @property
    def engaged(self) -> bool:
        return bool(self.verify_calls or self.draft_calls or {"log", "response", "metrics"} & set(self.sources))

    @property
    def acceptance(self) -> float | None:
        """Accepted / proposed over the rounds (None without rounds)."""
        proposed = sum(w - 1 for w in self.widths)
        return sum(self.accepts) / proposed if proposed else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "engaged": self.engaged, "acceptance": self.acceptance}


def read_calls(path: str | os.PathLike, start: int = 0, end: int | None = None) -> list[WitnessCall]:
    """The witness lines between byte offsets ``start`` and ``end``."""
    p = Path(path)
    if not p.exists():
        return []
    with open(p, "rb") as f:
        f.seek(start)
        data = f.read() if end is None else f.read(max(end - start, 0))
    calls = []
    for line in data.decode("utf-8", "replace").splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2].isdigit() and parts[3].isdigit():
            calls.append(WitnessCall(parts[1], int(parts[2]), int(parts[3])))
    return calls


def file_size(path: str | os.PathLike | None) -> int:
    if path is None:
        return 0
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def evidence_from_calls(calls: list[WitnessCall], prompt_tokens: int | None,
                        completion_tokens: int | None) -> Evidence:
    """Verify rounds and drafter calls of one request's witness slice."""
    ev = Evidence()
    ev.draft_calls = sum(1 for c in calls if c.role == "draft")
    target = [c for c in calls if c.role == "target"]
    decode_from = (prompt_tokens - 1) if prompt_tokens else None
    verify = [c for c in target if c.rows >= 2 and (decode_from is None or c.offset >= decode_from)]
    ev.verify_calls = len(verify)
    for i, c in enumerate(verify):
        if i + 1 < len(verify):
            ev.accepts.append(max(verify[i + 1].offset - c.offset - 1, 0))
        elif completion_tokens is not None:
            emitted = completion_tokens - sum(a + 1 for a in ev.accepts)
            ev.accepts.append(min(max(emitted - 1, 0), c.rows - 1))
        ev.widths.append(c.rows)
    if len(ev.accepts) < len(ev.widths):
        ev.widths = ev.widths[:len(ev.accepts)]
    if ev.verify_calls or ev.draft_calls:
        ev.sources.append("witness")
        ev.lines.append(f"witness: {ev.verify_calls} verify blocks of {sorted({c.rows for c in verify})} rows,"
                        f" {ev.draft_calls} drafter forwards")
    return ev
