"""The served job: what to compare (YAML, read bounded and checked by type: JOB_SCHEMA), and the request sequences.

    # job.yaml
    pairings:                       # each: a target, a drafter, a profile
      - name: llama
        target: ./target
        draft: ./draft
        profile: mlx-lm             # packaged name or a YAML file
        trust_remote_code: false
    widths: [2, 3, 4, 8]            # verify rows (mlx-lm: num_draft_tokens = width - 1)
    width_mode: process             # process: a server per width; request: one drafter
                                    # server, the width per request (profiles that allow it)
    max_tokens: 48
    prompts: ["...", "..."]         # or prompts_file: prompts.txt (one per line)
    params: {seed: 0, stop: ["\\n\\n"], repetition_penalty: 1.1, logit_bias: {"5": -1}}
    sequence: [fresh, repeat, shared-prefix, stream, multi-turn]
    concurrency: 4                  # the sequence's requests sent 4 at once (0: off)
    self_draft: true                # the target as its own drafter at the widest width
    repeats: 0                      # extra baseline processes (unique outputs counted)
    extra_args: {"4": ["--max-kv-size", "256"]}   # per arm name, or "*" for every arm
    controls: [{name: no-compile, env: {MLX_DISABLE_COMPILE: "1"}, width: 4}]
    profile: llama.cpp              # every pairing's profile (overrides each pairing's own)
    start_timeout: 120
    request_timeout: 300            # seconds for every request (default: derived from what the job
                                    # measures: harness/limits.py)
    reference: true                 # every completion also against classic decode computed in process
    reference_beside: false         # true: the reference's worker stays beside the servers (faster, a
                                    # second copy of the target in memory); false: only while no server runs
    distribution: {temperature: 0.7, requests: 600, prefix: 1, alpha: 0.001, seed: 0, width: 4}
                                    # temperature > 0 arms: seeded draws with and without the
                                    # drafter, histograms compared (harness/distribution.py)

Every key is optional; without a config the built-in job runs on the embedded
fixture pair (:func:`builtin_job`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from specparity.errors import Name, SpecparityError, UsageError
from specparity.harness.job import Control, DistSpec, Job, Pairing
from specparity.harness.plan import is_builtin_arm_name, plan_arms, request_stem
from specparity.harness.profiles import Profile, packaged_profiles
from specparity.inputs import request_schema
from specparity.paths import slugify
from specparity.schema import (
    Bool,
    Check,
    Enum,
    EnvName,
    Fields,
    Int,
    Json,
    ListOf,
    MapOf,
    Nullable,
    Number,
    Scalar,
    Seconds,
    Str,
    check,
    describe,
    load_yaml_file,
    read_text,
)

SEQUENCE_KINDS = ("fresh", "repeat", "shared-prefix", "stream", "multi-turn", "long")
REQUEST_PARAMS = ("repetition_penalty", "repetition_context_size", "presence_penalty", "frequency_penalty",
                  "logit_bias", "stop", "seed", "logprobs", "top_logprobs", "top_p", "top_k", "min_p")
WIDTH_MODES = ("process", "request")
MAX_PREFIX = 4


def parse_spec(raw: Any, where: str) -> DistSpec:
    """The ``distribution`` key of a job file; problems name the file and key."""
    check({"distribution": raw}, Fields({"distribution": JOB_SCHEMA.fields["distribution"]}), where)
    if raw is None:
        raise UsageError(f"{where}: distribution: a mapping of temperature, requests, prefix, alpha, seed, width")
    spec = DistSpec(**raw)
    check_spec(spec, f"{where}: distribution.")
    return spec


def check_spec(spec: DistSpec, where: str) -> None:
    """Every field in range (``where`` prefixes the key in a message); normalizes the floats."""
    t = spec.temperature
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
        raise UsageError(f"{where}temperature {t!r}: must be a number > 0")
    for key, lo, hi in (("requests", 50, 1_000_000), ("prefix", 1, MAX_PREFIX), ("seed", 0, 2**31)):
        v = getattr(spec, key)
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise UsageError(f"{where}{key} {v!r}: must be an integer in [{lo}, {hi}]")
    if isinstance(spec.alpha, bool) or not isinstance(spec.alpha, (int, float)) or not 0 < spec.alpha < 0.5:
        raise UsageError(f"{where}alpha {spec.alpha!r}: must be in (0, 0.5)")
    if spec.width is not None and (isinstance(spec.width, bool) or not isinstance(spec.width, int)
                                   or spec.width < 2):
        raise UsageError(f"{where}width {spec.width!r}: must be an integer >= 2")
    spec.temperature, spec.alpha = float(t), float(spec.alpha)


EMBEDDED_PAIRING = "embedded-llama"  # the built-in job's pairing on the embedded pair


def builtin_job() -> Job:
    """The job ``specparity served`` runs without --config: the embedded pair on mlx-lm's server."""
    from specparity.fixtures import default_pair

    pair = default_pair()
    return _builtin_settings([Pairing(EMBEDDED_PAIRING, pair.target, pair.draft, "mlx-lm")], "built-in")


def profile_job(profile: str) -> Job | None:
    """The built-in job on the default fixture of the engine whose package holds the profile named ``profile``,
    where that engine names one (its drafter format's: the embedded llama pair is no checkpoint its server
    loads); None for any other profile (the built-in job's embedded pair)."""
    from specparity.engines import registry

    for spec in registry().values():
        if profile in spec.profile_files():
            found = spec.served_checkpoints()
            if found is None:
                return None
            target, draft = found
            return _builtin_settings([Pairing(f"{spec.name}-default", str(target), str(draft), profile)], "built-in")
    return None


def _builtin_settings(pairings: list[Pairing], source: str) -> Job:
    """The built-in job's settings around ``pairings`` (the embedded pair is built only where it runs)."""
    return Job(pairings=pairings, widths=[2, 4], max_tokens=32, concurrency=3, self_draft=True, source=source)


# bounds on the counts a job expands into arms and requests (widths and max_tokens are bounded by
# specparity.inputs' --max-width and --max-positions, raisable)
MAX_REPEATS = 64
MAX_CONCURRENCY = 64
_NAME = re.compile(r"^(?!\.\.?$)[^/\\\x00-\x1f]+$")  # a name that is also a folder name: no /, no . or ..


def _width(lo: int) -> Check:
    return Int(lo, limit="max_width")


_ENV = MapOf(Scalar(), key=EnvName(), what="a mapping of environment variable to a string or number")
_ITEMS = "max_items"  # every list a job expands into servers or requests: specparity --max-items
_PROMPTS = ListOf(Str(), min_len=1, what="a list of strings (not empty)", limit=_ITEMS)
_ARM_NAME = Str("a name (no /, not . or ..)", nonempty=True, pattern=_NAME)

# The job file, key by key (see the module docstring); ranges beyond types are checked as they are read.
JOB_SCHEMA = Fields({
    "pairings": ListOf(Fields({
        "name": _ARM_NAME,
        "target": Str("a checkpoint path or hub id (a string)", nonempty=True),
        "draft": Nullable(Str("a checkpoint path or hub id (a string)", nonempty=True)),
        "profile": Str("a profile name or file", nonempty=True),
        "trust_remote_code": Bool(),
        "environment": Str("an environment name or file", nonempty=True),
    }, required=("target",)), limit=_ITEMS),
    "widths": ListOf(_width(1), min_len=1, scalar=True),
    "width_mode": Enum(WIDTH_MODES),
    "max_tokens": Int(1, limit="max_positions"),
    "prompts": _PROMPTS,
    "prompts_file": Str("a file name", nonempty=True),
    "params": Nullable(Fields({k: Json(limit=_ITEMS) for k in (*REQUEST_PARAMS, "stream", "temperature")},
                              what="a mapping of request parameters")),
    "endpoint": Nullable(Enum(("completions", "chat"))),
    "sequence": ListOf(Enum(SEQUENCE_KINDS), min_len=1, scalar=True, limit=_ITEMS),
    "concurrency": Int(0, MAX_CONCURRENCY),
    "self_draft": Bool(),
    "repeats": Int(0, MAX_REPEATS),
    "extra_args": Nullable(MapOf(ListOf(Scalar(), limit=_ITEMS),
                                 what="a mapping of arm name (or '*') to a list of arguments")),
    "controls": Nullable(ListOf(Fields({"name": _ARM_NAME, "env": _ENV, "width": _width(2)}, required=("env",)),
                                limit=_ITEMS)),
    "env": Nullable(_ENV),
    "start_timeout": Seconds(),
    "request_timeout": Seconds(),
    "profile": Str("a profile name or file", nonempty=True),
    "distribution": Nullable(Fields({"temperature": Number(), "requests": Int(), "prefix": Int(), "alpha": Number(),
                                     "seed": Int(), "width": Nullable(_width(2))},
                                    what="a mapping of temperature, requests, prefix, alpha, seed, width")),
    "reference": Bool(),
    "reference_beside": Bool(),
})


def load_job(path: str | Path) -> Job:
    """Read a job file; every problem is a UsageError naming the file and key.

    The file is read bounded (size, YAML aliases: specparity.schema) and checked whole against
    JOB_SCHEMA before any value is used.
    """
    p = Path(path)
    where = f"--config {p}"
    raw = load_yaml_file(p, where)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise UsageError(f"{where}: expected a mapping of keys, got {describe(raw)}")
    check(raw, JOB_SCHEMA, where)
    if raw.get("params"):  # the rules a served request's fields obey (specparity serve's, the replay's)
        check({"params": raw["params"]}, Fields({"params": request_schema()}), where)
    builtin = not raw.get("pairings")  # the built-in pairing, added once every key is checked
    job = _builtin_settings([], str(p)) if builtin else Job(pairings=[], source=str(p))
    for i, item in enumerate(raw.get("pairings") or []):
        target = resolve_model(str(item["target"]), p.parent, f"{where}: pairings[{i}].target")
        draft = item.get("draft")
        if draft is not None:
            draft = resolve_model(str(draft), p.parent, f"{where}: pairings[{i}].draft")
        job.pairings.append(Pairing(str(item.get("name") or f"pairing{i}"), target, draft,
                                    str(item.get("profile", "mlx-lm")), bool(item.get("trust_remote_code")),
                                    item.get("environment")))
    prof = raw.get("profile")
    if prof is not None and prof not in packaged_profiles() and not Path(prof).is_absolute() \
            and (p.parent / prof).is_file():
        prof = str((p.parent / prof).resolve())
    if "widths" in raw:
        widths = raw["widths"] if isinstance(raw["widths"], list) else [raw["widths"]]
        job.widths = sorted(set(widths))
    for key in ("width_mode", "max_tokens", "concurrency", "repeats", "self_draft"):
        if key in raw:
            setattr(job, key, raw[key])
    for key in ("start_timeout", "request_timeout"):
        if key in raw:
            setattr(job, key, float(raw[key]))
    if raw.get("distribution") is not None:
        job.distribution = parse_spec(raw["distribution"], where)
    if "reference" in raw:
        job.reference = raw["reference"]
    if "reference_beside" in raw:
        job.reference_beside = raw["reference_beside"]
    if "prompts_file" in raw:
        pf = p.parent / raw["prompts_file"]
        text = read_text(pf, f"{where}: prompts_file {pf}")
        job.prompts = [ln for ln in text.splitlines() if ln.strip()]
        if job.prompts:
            check(job.prompts, _PROMPTS, f"{where}: prompts_file {pf}")
    if "prompts" in raw:
        job.prompts = list(raw["prompts"])
    if not job.prompts:
        raise UsageError(f"{where}: no prompts")
    if "params" in raw:
        params = raw["params"] or {}
        if params.get("temperature", 0) != 0:
            raise UsageError(f"{where}: params.temperature: the served parity job is greedy (temperature 0)")
        job.params = dict(params)
    if "endpoint" in raw:
        job.endpoint = raw["endpoint"]
    if "sequence" in raw:
        seq = raw["sequence"]
        job.sequence = list(seq) if isinstance(seq, list) else [seq]
    if "extra_args" in raw:
        job.extra_args = {str(k): [str(a) for a in v] for k, v in (raw["extra_args"] or {}).items()}
    if "env" in raw:
        job.env = {str(k): str(v) for k, v in (raw["env"] or {}).items()}
    for i, c in enumerate(raw.get("controls") or []):
        job.controls.append(Control(str(c.get("name") or f"control{i}"),
                                    {str(k): str(v) for k, v in c["env"].items()},
                                    int(c.get("width", max(job.widths)))))
    if builtin:  # a bad file is refused before the embedded pair is built
        job.pairings = builtin_job().pairings
    if prof is not None:
        for pairing in job.pairings:
            pairing.profile = str(prof)
    check_names(job, where)
    return job


def _arm_names(job: Job) -> list[str]:
    """Every arm name a pairing of ``job`` can run (with a drafter and self-draft, as planned; the
    distribution arms included)."""
    arms, _ = plan_arms(job, Profile("names", ["x"]), True, True)
    return [a.name for a in arms]


def _builtin(slug: str) -> bool:
    """A control named so would share a built-in arm's server key (w2: the width's server, without the
    control's env) or its record files; ``dist-`` is the distribution arms' prefix, reserved whole."""
    key = slug.casefold()
    return is_builtin_arm_name(key) or key.startswith("dist-")


def check_names(job: Job, where: str) -> None:
    """Pairing and control names unique, controls not named as a built-in arm, and every record
    file name (``<pairing>-<arm>``, slugified) distinct: compared as slugs and case-blind, as a
    case-insensitive file system (macOS) compares them."""
    def unique(names: list[str], what: str) -> None:
        seen: dict[str, str] = {}
        for i, n in enumerate(names):
            key = slugify(n).casefold()
            if key in seen:
                same = "is named twice" if seen[key] == n else \
                    f"and {seen[key]!r} name the same files ({slugify(n)!r}, compared case-blind)"
                raise UsageError(f"{where}: {what}[{i}].name: {n!r} {same}: give each a name of its own")
            seen[key] = n

    unique([p.name for p in job.pairings], "pairings")
    for i, c in enumerate(job.controls):
        slug = slugify(c.name)
        if _builtin(slug):
            raise UsageError(f"{where}: controls[{i}].name: {c.name!r} is the name of a built-in arm"
                             " (baseline-start, baseline-end, w<N>, self-draft, concurrent, repeat<N>, dist-...,"
                             " drafter): name the control otherwise")
    unique([c.name for c in job.controls], "controls")
    stems: dict[str, tuple[str, str]] = {}
    arms = _arm_names(job)
    for p in job.pairings:
        for a in arms:
            key = request_stem(p.name, a).casefold()
            if key in stems and stems[key] != (p.name, a):
                other = stems[key]
                raise UsageError(f"{where}: pairing {p.name!r} arm {a!r} and pairing {other[0]!r} arm {other[1]!r}"
                                 f" would write one record file ({request_stem(p.name, a)}.jsonl): rename one")
            stems[key] = (p.name, a)


def resolve_model(spec: str, base: Path | None, where: str) -> str:
    """A pairing's checkpoint as a local directory: a path (relative to ``base``, the config's
    folder) or a Hugging Face repo id (the one resolver, specparity.resolve)."""
    from specparity.inputs import expand_user
    from specparity.resolve import is_repo_id, resolve_checkpoint

    path = expand_user(spec, where)
    if not path.is_absolute() and base is not None and (base / path).exists():
        return str((base / path).resolve())
    if path.exists() or not is_repo_id(spec):
        return str(path.resolve() if base is None or path.is_absolute() else (base / path).resolve())
    try:
        return str(resolve_checkpoint(spec))
    except SpecparityError as err:
        raise type(err)(f"{where}: {err}") from err


class OverrideError(UsageError):
    """A command-line override that cannot apply; ``field`` names the Overrides field (an
    errors.Name: the command shows its flag), ``detail`` says what is wrong."""

    def __init__(self, field: str, detail: str):
        super().__init__(Name(field), ": ", detail)
        self.field = field
        self.detail = detail


def _override_checkpoint(field: str, spec: str) -> str:
    """An override's checkpoint (a path or a hub id) as a local directory, resolved once; an
    error names ``field`` as the checkpoint."""
    from specparity.resolve import resolve_checkpoint

    try:
        return str(resolve_checkpoint(spec).resolve())
    except SpecparityError as err:
        raise err.renamed({"checkpoint": field}) from err


@dataclass
class Overrides:
    """What a command line sets over a job; None leaves the job's own value.

    model / draft_model: one pairing instead of the job's (a path or a hub id).
    profile: every pairing's profile. trust_remote_code: every pairing's consent.
    environment: every pairing's environment (a packaged name or a YAML file).
    widths .. request_timeout: the job keys of the same names.
    temperature / dist_requests / dist_prefix: the distribution arms (any of them adds them).
    reference: whether completions are also judged against classic decode computed in process.
    reference_beside: keep the reference's worker beside the servers (a second copy of the target).
    """

    model: str | None = None
    draft_model: str | None = None
    profile: str | None = None
    trust_remote_code: bool = False
    environment: str | None = None
    widths: list[int] | None = None
    width_mode: str | None = None
    max_tokens: int | None = None
    concurrency: int | None = None
    repeats: int | None = None
    start_timeout: float | None = None
    request_timeout: float | None = None
    temperature: float | None = None
    dist_requests: int | None = None
    dist_prefix: int | None = None
    reference: bool | None = None
    reference_beside: bool | None = None


def _checked_values(o: Overrides) -> dict[str, Any]:
    """The job keys ``o`` sets (widths, width_mode, the counts and timeouts), each checked as a job
    file's key is: name -> the value to set."""
    out: dict[str, Any] = {}
    if o.widths is not None:
        if not o.widths:
            raise OverrideError("widths", "give at least one width")
        for w in o.widths:
            try:
                check(w, _width(1), "widths")
            except UsageError as err:
                raise OverrideError("widths", str(err).split(": ", 1)[1]) from None
        out["widths"] = sorted(set(o.widths))
    if o.width_mode is not None:
        if o.width_mode not in WIDTH_MODES:
            raise OverrideError("width_mode", f"{o.width_mode!r}: choose from {', '.join(WIDTH_MODES)}")
        out["width_mode"] = o.width_mode
    for name, checker in (("max_tokens", Int(1, limit="max_positions")), ("concurrency", Int(0, MAX_CONCURRENCY)),
                          ("repeats", Int(0, MAX_REPEATS)), ("start_timeout", Seconds()),
                          ("request_timeout", Seconds())):
        value = getattr(o, name)
        if value is None:
            continue
        try:
            check(value, checker, name)
        except UsageError as err:
            raise OverrideError(name, str(err).split(": ", 1)[1]) from None
        out[name] = float(value) if isinstance(checker, Seconds) else value
    return out


def apply_overrides(job: Job | None, o: Overrides) -> Job:
    """The job a command runs: ``job`` (a config's, or None for the built-in one) with ``o`` applied.

    Every value is checked before the job is made: a bad flag never waits for the embedded pair's
    build. Errors are usage errors in the job's own terms (the command maps them to its flags).
    """
    from specparity.harness.profiles import load_profile

    if o.profile is not None:
        load_profile(o.profile)
    if o.draft_model is not None and o.model is None:
        raise UsageError(Name("draft_model"), " needs ", Name("model"))
    if o.environment is not None:
        from specparity.environments import load_spec

        try:
            load_spec(o.environment)
        except UsageError as err:
            raise OverrideError("environment", str(err)) from None
    values = _checked_values(o)
    spec = None  # the distribution arm's settings (the built-in job has none)
    if o.temperature is not None or o.dist_requests is not None or o.dist_prefix is not None:
        spec = replace((job.distribution if job is not None else None) or DistSpec())
        if o.temperature is not None:
            spec.temperature = o.temperature
        if o.dist_requests is not None:
            spec.requests = o.dist_requests
        if o.dist_prefix is not None:
            spec.prefix = o.dist_prefix
        try:
            check_spec(spec, "")
        except UsageError as err:
            raise OverrideError("temperature", str(err)) from None
    if o.model is not None:
        target = _override_checkpoint("model", o.model)
        draft = _override_checkpoint("draft_model", o.draft_model) if o.draft_model is not None else None
        pairing = Pairing("cli", target, draft, o.profile or "mlx-lm", o.trust_remote_code)
        job = _builtin_settings([pairing], "command line") if job is None else replace(job, pairings=[pairing])
    elif job is None:
        job = (profile_job(o.profile) if o.profile is not None else None) or builtin_job()
    else:
        job = replace(job)
    for p in job.pairings:
        if o.profile is not None:
            p.profile = o.profile
        if o.trust_remote_code:
            p.trust_remote_code = True
        if o.environment is not None:
            p.environment = o.environment
    for name, value in values.items():
        setattr(job, name, value)
    job.reference = o.reference if o.reference is not None else job.reference
    job.reference_beside = o.reference_beside if o.reference_beside is not None else job.reference_beside
    if spec is not None:
        job.distribution = spec
    if job.distribution is not None and not any(p.draft for p in job.pairings):
        raise OverrideError("temperature", "no pairing has a drafter to compare with")
    check_names(job, f"--config {job.source}")  # only a config's names can meet an override's (its widths)
    return job

