"""``records compare OLD NEW``: what changed between two records of the same kind (night over night).

Served records are matched part by part: pairing + arm + request id (a
pairing's own verdict is the part ``<pairing> / * / *``, an arm that sent no
request is ``<pairing> / <arm> / -``). Other kinds match their JSONL lines by
their identifying keys (width, depth, layer, ...). Each matched part whose
verdict changed is one of:

    regressed  it passed (match, equal, pass) and now does not, or it now
               diverges where it did not
    fixed      it did not pass and now does
    changed    any other verdict change (error -> not_engaged, ...)

and, beside verdicts:

    evidence   the drafter was witnessed and now is not (engaged -> not
               engaged), or a decline line appeared (or went away)
    identity   model fingerprint, mlx / mlx-lm / specparity / Python version,
               device, git commit, kernel env, a server's version output
    coverage   parts only one record has (an arm added or gone)

The comparison's verdict: ``diverged`` when anything regressed (exit 1),
``match`` otherwise (exit 0), whatever else changed: identity, evidence and
coverage changes are reported, and are not regressions by themselves.
"""

from __future__ import annotations

import functools
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specparity.errors import UsageError
from specparity.harness.evidence import Evidence
from specparity.harness.plan import ArmKind
from specparity.records.record import read_complete
from specparity.records.served import KIND as SERVED, ServedRecord
from specparity.records.text import printable
from specparity.verdicts import ReportMixin, Verdict, is_pass, verdict

# the JSONL keys that say which part a line is, in the order a reader wants them
ID_KEYS = ("request", "source", "arm", "role", "rule", "width", "depth", "walk_width", "arm_name",
           "layer", "kind", "prompt_index", "first_row", "absolute_position", "position")
IDENTITY_KEYS = ("specparity", "git_commit", "mlx", "mlx_lm", "python", "device", "platform", "os", "env")
CATEGORIES = ("regressed", "fixed", "changed", "evidence", "identity", "coverage")
DIVERGING = (Verdict.DIVERGED, Verdict.DIVERGENT)


@dataclass
class Change:
    """One difference between the records.

    category: one of CATEGORIES. part: which part ("pairing / arm / request", a JSONL key,
    or an identity key). old / new: the value on each side (None: absent).
    detail: what a reader needs to act (width, first divergence index, reason).
    engine: a served part's engine (its pairing's profile's ``engine:``, by its registry name; a
    profile without one: the profile's name); "" for what no one engine owns (the host, the job).
    """

    category: str
    part: str
    old: Any
    new: Any
    detail: str = ""
    engine: str = ""

    def line(self) -> str:
        return f"  {self.part}: {self.old} -> {self.new}" + (f" ({self.detail})" if self.detail else "")


@dataclass
class CompareReport(ReportMixin):
    """Two records of one kind, compared. verdict: diverged on any regression, else match."""

    kind: str
    old: str
    new: str
    changes: list[Change] = field(default_factory=list)
    parts: int = 0
    engines: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> Verdict:
        return Verdict.DIVERGED if self.of("regressed") else Verdict.MATCH

    def of(self, category: str) -> list[Change]:
        return [c for c in self.changes if c.category == category]

    def by_engine(self) -> dict[str, dict[str, int]]:
        """engine -> category -> changes, for every engine the records hold (none changed: all zero)."""
        out = {e: dict.fromkeys(CATEGORIES, 0) for e in self.engines}
        for c in self.changes:
            if c.engine:
                out.setdefault(c.engine, dict.fromkeys(CATEGORIES, 0))[c.category] += 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "exit_code": self.exit_code, "kind": self.kind, "old": self.old,
                "new": self.new, "parts_compared": self.parts,
                **{cat: [asdict(c) for c in self.of(cat)] for cat in CATEGORIES},
                "engines": self.by_engine()}

    def lines(self) -> list[str]:
        out = [f"compare {self.kind} records: {self.parts} parts matched",
               f"  old {self.old}", f"  new {self.new}"]
        for cat in CATEGORIES:
            found = self.of(cat)
            out.append(f"{cat}: {len(found)}" if not found else f"{cat} ({len(found)}):")
            if len({c.engine for c in found}) <= 1 and len(self.engines) <= 1:
                out += [c.line() for c in found]
                continue
            # more than one engine in the night: each engine's changes under its name, the shared ones first
            for engine in dict.fromkeys(c.engine for c in found):
                mine = [c for c in found if c.engine == engine]
                if engine:
                    out.append(f"  {engine} ({len(mine)}):")
                out += [("  " + c.line()) if engine else c.line() for c in mine]
        if len(self.engines) > 1:
            words = []
            for engine, counts in self.by_engine().items():
                said = ", ".join(f"{n} {cat}" for cat, n in counts.items() if n)
                words.append(f"  {engine}: {said or 'no change'}")
            out += ["by engine:", *words]
        return out


def _passes(word: Any) -> bool:
    """A verdict word that passes; a part's own word that is no verdict (a control's ``rejected``) does not."""
    try:
        return is_pass(verdict(word))
    except ValueError:
        return False


def _classify(old: str, new: str) -> str:
    try:
        o, n = verdict(old), verdict(new)
    except ValueError:  # a part's own vocabulary (dist controls: rejected / accepted): a change, never judged
        return "changed"
    if (is_pass(o) and not is_pass(n)) or (n in DIVERGING and o not in DIVERGING):
        return "regressed"
    if not is_pass(o) and is_pass(n):
        return "fixed"
    return "changed"


@functools.cache
def profile_engine(profile: str) -> str:
    """The engine a served profile runs: its ``engine:`` by the registry's name (``mlx_dspark`` ->
    ``mlx-dspark``); a profile without one (mlx-lm's own server), or one that no longer loads here: its name."""
    from specparity.errors import SpecparityError

    try:
        from specparity.engines import for_profile
        from specparity.harness.profiles import load_profile

        key = load_profile(profile).engine
        return for_profile(key).name if key else Path(profile).stem
    except (SpecparityError, OSError):
        return Path(profile).stem


def pairing_engines(summary: dict[str, Any] | None) -> dict[str, str]:
    """pairing name -> its engine (:func:`profile_engine`), from a served record's summary."""
    return {p["name"]: profile_engine(str(p.get("profile") or "mlx-lm"))
            for p in (summary or {}).get("pairings") or []}


def _served_parts(sr: ServedRecord) -> dict[str, dict[str, Any]]:
    """part -> {verdict, width, divergence, evidence, reason, engine} for every pairing, arm and request."""
    parts: dict[str, dict[str, Any]] = {}
    engines = pairing_engines(sr.summary)
    for p in sr.summary.get("pairings") or []:
        engine = engines[p["name"]]
        parts[f"{p['name']} / * / *"] = {"verdict": p["verdict"], "reason": p.get("reason") or "", "engine": engine}
        for a in p.get("arms") or []:
            reqs = sr.requests(p["name"], a["name"])
            if not reqs:
                parts[f"{p['name']} / {a['name']} / -"] = {"verdict": a["verdict"], "width": a.get("width"),
                                                            "reason": a.get("reason") or "", "engine": engine}
            for r in reqs:
                parts[f"{p['name']} / {a['name']} / {r['id']}"] = {
                    "verdict": r["verdict"], "width": a.get("width"), "divergence": r.get("divergence"),
                    "evidence": r.get("evidence") or {}, "reason": r.get("reason") or "", "arm_kind": a.get("kind"),
                    "engine": engine}
    return parts


def _generic_parts(rows: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    parts: dict[str, dict[str, Any]] = {}
    for stem, lines in rows.items():
        for i, r in enumerate(lines):
            if "verdict" not in r:
                continue
            ident = ", ".join(f"{k} {r[k]}" for k in ID_KEYS if k in r and not isinstance(r[k], (dict, list)))
            key = f"{stem} / {ident or f'line {i + 1}'}"
            parts[key] = {"verdict": r["verdict"], "width": r.get("width"), "reason": str(r.get("reason") or "")}
    return parts


def _detail(p: dict[str, Any]) -> str:
    bits = []
    if p.get("width") is not None:
        bits.append(f"width {p['width']}")
    d = p.get("divergence") or {}
    if d.get("token_index") is not None:
        bits.append(f"first divergence at token {d['token_index']}, char {d.get('char_offset')}")
    elif d.get("char_offset") is not None:
        bits.append(f"first divergence at char {d['char_offset']}")
    if not d and p.get("reason"):
        bits.append(str(p["reason"])[:160])
    return ", ".join(bits)


def _identity(ident: dict[str, Any], summary: dict[str, Any] | None) -> dict[str, Any]:
    out = {k: ident.get(k) for k in IDENTITY_KEYS}
    model = ident.get("model")
    if isinstance(model, dict) and model.get("digest"):
        out["model fingerprint"] = model["digest"]
    for pname, fps in (ident.get("models") or {}).items():
        for role, fp in (fps or {}).items():
            out[f"{pname} {role} fingerprint"] = fp
    for pname, env in (ident.get("environments") or {}).items():
        for pkg, version in ((env or {}).get("packages") or {}).items():
            out[f"{pname} environment {pkg}"] = version
    for p in (summary or {}).get("pairings") or []:
        for a in p.get("arms") or []:
            srv = a.get("server") or {}
            if srv.get("version") is not None:
                out.setdefault(f"{srv.get('profile') or p['profile']} server version", srv["version"])
    return out


def _evidence_changes(key: str, old: Evidence, new: Evidence, detail: str) -> list[Change]:
    """Engaged -> not engaged (and back), a decline line that appeared (or went away)."""
    out = []
    if old.engaged != new.engaged:
        words = {True: "engaged", False: "not engaged"}
        out.append(Change("evidence", key, words[old.engaged], words[new.engaged], detail))
    if old.declined != new.declined:
        words = {True: "decline line", False: "no decline line"}
        out.append(Change("evidence", key, words[old.declined], words[new.declined],
                          "; ".join((new.lines or old.lines)[:1])))
    return out


def _identity_engine(key: str, engines: dict[str, str]) -> str:
    """The engine an identity key belongs to: a pairing's fingerprints and environment (``<pairing> ...``),
    a profile's server version (``<profile> server version``); "" for the host's own keys."""
    for pairing, engine in sorted(engines.items(), key=lambda kv: -len(kv[0])):
        if key.startswith(f"{pairing} "):
            return engine
    if key.endswith(" server version"):
        return profile_engine(key.removesuffix(" server version"))
    return ""


def compare_records(old_path: str | os.PathLike, new_path: str | os.PathLike) -> CompareReport:
    """Compare two complete records of one kind; a UsageError names a file that cannot be compared."""
    sides = []
    for path in (old_path, new_path):
        rec, ident, rows = read_complete(path)
        sides.append((str(path), rec, ident, rows))
    (op, orec, oid, orows), (np_, nrec, nid, nrows) = sides
    if orec.kind != nrec.kind:
        raise UsageError(f"{np_}: a {printable(nrec.kind)} record, but {op} is a {printable(orec.kind)} record:"
                         " compare one kind")
    rep = CompareReport(orec.kind, op, np_)
    engines: dict[str, str] = {}  # pairing -> engine (either night's; the new one's where both name it)
    if orec.kind == SERVED:
        # both records checked (ServedRecord.of names a damaged file) before anything in them is read
        osr, nsr = ServedRecord.of(op, orec, oid, orows), ServedRecord.of(np_, nrec, nid, nrows)
        engines = {**pairing_engines(orec.summary), **pairing_engines(nrec.summary)}
        rep.engines = list(dict.fromkeys(engines.values()))
        old, new = _served_parts(osr), _served_parts(nsr)
        if (orec.summary or {}).get("job") != (nrec.summary or {}).get("job"):
            rep.changes.append(Change("identity", "job config", (orec.summary or {}).get("job", {}).get("source"),
                                      (nrec.summary or {}).get("job", {}).get("source"),
                                      "the job's config differs (widths, prompts, params, ...)"))
    else:
        old, new = _generic_parts(orows), _generic_parts(nrows)
        old["record"] = {"verdict": orec.verdict}
        new["record"] = {"verdict": nrec.verdict}
    for key in old.keys() | new.keys():
        if key in old and key in new:
            continue
        rep.changes.append(Change("coverage", key, old.get(key, {}).get("verdict"), new.get(key, {}).get("verdict"),
                                  "only in the old record" if key in old else "only in the new record",
                                  (new.get(key) or old.get(key) or {}).get("engine", "")))
    rep.parts = len(old.keys() & new.keys())
    for key in [k for k in old if k in new]:
        o, n = old[key], new[key]
        if o["verdict"] != n["verdict"]:
            rep.changes.append(Change(_classify(o["verdict"], n["verdict"]), key, o["verdict"], n["verdict"],
                                      _detail(n if not _passes(n["verdict"]) else o), n.get("engine", "")))
        oe, ne = o.get("evidence"), n.get("evidence")
        if o.get("arm_kind") not in (None, ArmKind.BASELINE, ArmKind.REPEAT, ArmKind.CONCURRENT) and oe and ne:
            for c in _evidence_changes(key, Evidence.from_dict(oe), Evidence.from_dict(ne), _detail(n)):
                c.engine = n.get("engine", "")
                rep.changes.append(c)
    # only a served summary's shape is known (checked by ServedRecord.of): other kinds' is not read
    oi = _identity(oid, orec.summary if orec.kind == SERVED else None)
    ni = _identity(nid, nrec.summary if nrec.kind == SERVED else None)
    for key in sorted(oi.keys() | ni.keys()):
        if oi.get(key) != ni.get(key):
            rep.changes.append(Change("identity", key, oi.get(key), ni.get(key), engine=_identity_engine(key, engines)))
    order = {c: i for i, c in enumerate(CATEGORIES)}
    rep.changes.sort(key=lambda c: (order[c.category], c.part))
    return rep
