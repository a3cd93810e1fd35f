"""The findings of a served record that ``diagnose`` can work on, read without mlx.

A finding is one request of one arm whose verdict is ``diverged``: it left classic
decode (or, where classic decode does not decide, baseline-start's answer).

Within a record a finding is named ``PAIRING/ARM/REQUEST``. Across records (one night's and the
next's) it is identified by its ``key``: a digest of what makes it the same finding whatever the
job's names or the record's date: the engine (the pairing's profile, its pinned environment's
packages, the host's mlx and mlx-lm), the checkpoints (their fingerprint digests), the arm (its
kind, name, width and server setting), the request (its id and kind in the sequence, its body as
sent) and the answer (the completion's sha256 and the token where it left its reference). The same
request answered the same wrong way by the same server on the same weights is the same finding; any
of those changed, and it is diagnosed afresh.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specparity.errors import UsageError
from specparity.verdicts import Verdict

# the words the served judge opens a length finding with (harness.judge.past_max_tokens)
LENGTH_WORDS = "a length finding"


@dataclass
class Finding:
    """One diverged request of a served record.

    id: ``pairing/arm/request``. pairing / arm / request: their names. width / setting: the arm's verify
    rows and the server's setting (None without a drafter). target / draft: the pairing's checkpoints.
    token_index: where the answer first left what its verdict rests on (classic decode, else the baseline).
    against: that reference's name. reason: the judge's line. body: the request body as sent.
    max_tokens / completion_tokens: the request's limit and the tokens the server returned.
    reproduction: the record's in-process command (None: none) and reproduction_reason why not.
    length: the judge called it a length finding (tokens past max_tokens).
    tie: the judge's exact-tie call (None: none made).
    key: its identity across records (the module's docstring; "" where it was built without its record).
    env_controls: the job's own control arms' environment toggles, (NAME, VALUE) each (identity.json's job).
    served_accepts / served_widths: the served run's own rounds, as its evidence read them (the witness's verify
    calls: accepted proposals and rows per round; None: the record has none). served_tokens: the token ids the
    server answered (None: not in the record). Step 1 replays these before it reruns anything with the drafter.
    """

    id: str
    pairing: str
    arm: str
    request: str
    width: int | None
    setting: int | None
    target: str
    draft: str | None
    token_index: int | None
    against: str
    reason: str
    body: dict[str, Any] = field(default_factory=dict)
    max_tokens: int | None = None
    completion_tokens: int | None = None
    reproduction: str | None = None
    reproduction_reason: str | None = None
    length: bool = False
    tie: dict[str, Any] | None = None
    key: str = ""
    env_controls: list[tuple[str, str]] = field(default_factory=list)
    served_accepts: list[int] | None = None
    served_widths: list[int] | None = None
    served_tokens: list[int] | None = None

    def replay_argv(self) -> list[str] | None:
        """The reproduction's arguments after ``specparity replay`` (None: it is not a replay command)."""
        if self.reproduction is None:
            return None
        argv = shlex.split(self.reproduction)
        return argv[2:] if argv[:2] == ["specparity", "replay"] else None

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "pairing": self.pairing, "arm": self.arm, "request": self.request,
                "width": self.width, "setting": self.setting, "target": self.target, "draft": self.draft,
                "token_index": self.token_index, "against": self.against, "reason": self.reason,
                "max_tokens": self.max_tokens, "completion_tokens": self.completion_tokens,
                "reproduction": self.reproduction, "reproduction_reason": self.reproduction_reason,
                "length": self.length, "tie": self.tie, "key": self.key,
                "env_controls": [f"{k}={v}" for k, v in self.env_controls]}


def newest_served(path: str | os.PathLike[str]) -> Path:
    """``path`` itself when it is a record, else the newest complete served record in that directory."""
    from specparity.records.record import list_records, read_report
    from specparity.records.served import KIND

    p = Path(os.path.expanduser(str(path)))
    if not p.exists():
        raise UsageError(f"{path}: no such file or directory")
    if not p.is_dir() or (p / "report.json").exists():
        return p
    found = []
    for md in list_records(p):
        try:
            rec = read_report(md)
        except FileNotFoundError:
            continue
        if rec.kind == KIND and rec.is_complete:
            found.append((rec.started or "", md.name, md))
    if not found:
        raise UsageError(f"{path}: holds no complete served record (specparity served --record-dir)")
    return max(found)[2]


def read_findings(path: str | os.PathLike[str], only: str | None = None) -> tuple[Path, list[Finding]]:
    """(the record read, its findings in report order); ``only``: the findings whose request id, arm,
    ``arm/request`` or ``pairing/arm/request`` it names (a UsageError when it names none)."""
    from specparity.records.served import read_served

    where = newest_served(path)
    sr = read_served(where)
    toggles = sorted({(str(k), str(v)) for c in ((sr.identity.get("job") or {}).get("controls") or [])
                      if isinstance(c, dict) for k, v in (c.get("env") or {}).items()})
    out: list[Finding] = []
    for pname in sr.pairing_names():
        p = sr.pairing_summary(pname) or {}
        for arm in sr.final_arms(pname):
            for r in sr.requests(pname, str(arm["name"])):
                if r.get("verdict") == Verdict.DIVERGED:
                    f = _finding(p, pname, arm, r)
                    f.key = finding_key(sr.identity, p, arm, r)
                    f.env_controls = list(toggles)
                    _locate_sequence(f, where)
                    out.append(f)
    if only is not None:
        chosen = [f for f in out if only in (f.id, f.request, f.arm, f"{f.arm}/{f.request}")]
        if not chosen:
            names = ", ".join(f.id for f in out) or "none"
            raise UsageError(f"--finding {only}: no such finding in {where} (its findings: {names})")
        out = chosen
    return where, out


def _locate_sequence(f: Finding, record: Path) -> None:
    """A sequence replay's file as the record's command names it, relative to where ``served`` ran: found from
    here through the record's own data folder when that path does not lead to it (the command is rewritten with
    the path that does, so it runs from anywhere)."""
    argv = f.replay_argv() or []
    if "--sequence" not in argv[:-1]:
        return
    i = argv.index("--sequence") + 1
    given = Path(argv[i])
    if given.is_file():
        return
    parts = given.parts
    for k in range(len(parts) - 1):
        if parts[k] == "data" and parts[k + 1] == record.stem:
            found = record.parent.joinpath(*parts[k:])
            if found.is_file():
                argv[i] = str(found.resolve())
                f.reproduction = shlex.join(["specparity", "replay", *argv])
            return


def finding_key(identity: dict[str, Any], p: dict[str, Any], arm: dict[str, Any], r: dict[str, Any]) -> str:
    """The finding's identity across records (the module's docstring): a sha256 of what makes it the same."""
    pname = str(p.get("name"))
    env = ((identity.get("environments") or {}).get(pname) or {}).get("packages")
    comp = r.get("completion") or {}
    diff = r.get("classic") or r.get("divergence") or {}
    req = r.get("request") or {}
    what = {"engine": {"profile": p.get("profile"), "environment": env, "mlx": identity.get("mlx"),
                       "mlx_lm": identity.get("mlx_lm")},
            "models": (identity.get("models") or {}).get(pname) or {"target": p.get("target"), "draft": p.get("draft")},
            "arm": {k: arm.get(k) for k in ("kind", "name", "width", "setting")},
            "request": {"id": r.get("id"), "kind": r.get("kind"), "body": req.get("body")},
            "answer": {"sha256": comp.get("sha256"), "token_index": diff.get("token_index")}}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()


def _finding(p: dict[str, Any], pname: str, arm: dict[str, Any], r: dict[str, Any]) -> Finding:
    diff = r.get("classic") or r.get("divergence") or {}
    comp = r.get("completion") or {}
    req = r.get("request") or {}
    body: dict[str, Any] = req["body"] if isinstance(req.get("body"), dict) else {}
    limit = body.get("max_tokens", body.get("max_completion_tokens"))
    usage: dict[str, Any] = comp["usage"] if isinstance(comp.get("usage"), dict) else {}
    n = usage.get("completion_tokens")
    if not isinstance(n, int) and isinstance(comp.get("token_ids"), list):
        n = len(comp["token_ids"])
    rep = r.get("reproduction") or ({"command": r["replay"]} if r.get("replay") else {})
    reason = str(r.get("reason") or "")
    ev: dict[str, Any] = r["evidence"] if isinstance(r.get("evidence"), dict) else {}
    return Finding(id=f"{pname}/{arm['name']}/{r['id']}", pairing=pname, arm=str(arm["name"]), request=str(r["id"]),
                   width=arm.get("width"), setting=arm.get("setting"), target=str(p.get("target")),
                   draft=p.get("draft"), token_index=diff.get("token_index"),
                   against=str(diff.get("reference") or "classic decode"), reason=reason, body=dict(body),
                   max_tokens=limit if isinstance(limit, int) else None,
                   completion_tokens=n if isinstance(n, int) else None,
                   reproduction=rep.get("command"), reproduction_reason=rep.get("reason"),
                   length=LENGTH_WORDS in reason, tie=r.get("tie"), served_accepts=_ints(ev.get("accepts")),
                   served_widths=_ints(ev.get("widths")), served_tokens=_ints(comp.get("token_ids")))


def _ints(v: Any) -> list[int] | None:
    """A record's list of ints (None: missing, empty, or anything else)."""
    if isinstance(v, list) and v and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return list(v)
    return None
