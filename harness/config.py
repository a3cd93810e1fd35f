"""The served job: what to compare (YAML, ``yaml.safe_load``), and the request sequences.

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
    request_timeout: 120
    reference: true                 # every completion also against classic decode computed in process
    distribution: {temperature: 0.7, requests: 600, prefix: 1, alpha: 0.001, seed: 0, width: 4}
                                    # temperature > 0 arms: seeded draws with and without the
                                    # drafter, histograms compared (harness/distribution.py)

Every key is optional; without a config the built-in job runs on the embedded
fixture pair (:func:`builtin_job`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from specparity.errors import SpecparityError, UsageError
from specparity.harness.profiles import packaged_profiles

SEQUENCE_KINDS = ("fresh", "repeat", "shared-prefix", "stream", "multi-turn", "long")
DEFAULT_SEQUENCE = ("fresh", "repeat", "shared-prefix", "stream", "multi-turn")
REQUEST_PARAMS = ("repetition_penalty", "repetition_context_size", "presence_penalty", "frequency_penalty",
                  "logit_bias", "stop", "seed", "logprobs", "top_logprobs", "top_p", "top_k", "min_p")
WIDTH_MODES = ("process", "request")

DEFAULT_PROMPTS = [
    "Speculative decoding drafts several tokens with a small model and verifies them",
    "The cache holds keys and values for every position; a rewind trims the rejected rows.",
    "def add(a, b):\n    return a + b\nfor i in range(10):\n",
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.",
]


@dataclass
class Pairing:
    """One target and drafter on one server profile.

    environment: the pinned environment its servers run in (specparity.environments), over the
    profile's own (None: the profile's).
    """

    name: str
    target: str
    draft: str | None
    profile: str = "mlx-lm"
    trust_remote_code: bool = False
    environment: str | None = None


@dataclass
class Control:
    """An env control arm: a separate drafter server at ``width`` with ``env`` set."""

    name: str
    env: dict[str, str]
    width: int


DEFAULT_DIST_REQUESTS = 600
DEFAULT_ALPHA = 1e-3
MAX_PREFIX = 4


@dataclass
class DistSpec:
    """The job's ``distribution`` key: temperature > 0 arms (harness.distribution).

    temperature: the sampling temperature (> 0). requests: N per arm (the baseline, the
      drafted arm, and the wrong-temperature control each get N).
    prefix: tokens per request; the histogram is over the emitted k-prefix.
    alpha: each test's false-rejection probability. seed: the first request seed.
    width: verify rows of the drafted server (None: the job's widest).
    """

    temperature: float = 0.7
    requests: int = DEFAULT_DIST_REQUESTS
    prefix: int = 1
    alpha: float = DEFAULT_ALPHA
    seed: int = 0
    width: int | None = None


def parse_spec(raw: Any, where: str) -> DistSpec:
    """The ``distribution`` key of a job file; problems name the file and key."""
    if not isinstance(raw, dict):
        raise UsageError(f"{where}: distribution: a mapping of temperature, requests, prefix, alpha, seed, width")
    known = set(DistSpec.__dataclass_fields__)
    bad = sorted(set(raw) - known)
    if bad:
        raise UsageError(f"{where}: distribution: unknown key {bad[0]!r} (known: {', '.join(sorted(known))})")
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


@dataclass
class Job:
    """A whole served job (see the module docstring for each key)."""

    pairings: list[Pairing]
    widths: list[int] = field(default_factory=lambda: [2, 3, 4])
    width_mode: str = "process"
    max_tokens: int = 48
    prompts: list[str] = field(default_factory=lambda: list(DEFAULT_PROMPTS))
    params: dict[str, Any] = field(default_factory=dict)
    endpoint: str | None = None
    sequence: list[str] = field(default_factory=lambda: list(DEFAULT_SEQUENCE))
    concurrency: int = 0
    self_draft: bool = False
    repeats: int = 0
    extra_args: dict[str, list[str]] = field(default_factory=dict)
    controls: list[Control] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    start_timeout: float = 120.0
    request_timeout: float = 120.0
    source: str = "built-in"
    distribution: DistSpec | None = None
    reference: bool = True

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def builtin_job() -> Job:
    """The job ``specparity served`` runs without --config: the embedded pair on mlx-lm's server."""
    from specparity.fixtures import default_pair

    pair = default_pair()
    return Job(pairings=[Pairing("embedded-llama", pair.target, pair.draft, "mlx-lm")],
               widths=[2, 4], max_tokens=32, concurrency=3, self_draft=True, source="built-in")


def _ints(value: Any, key: str, where: str, minimum: int) -> list[int]:
    items = value if isinstance(value, list) else [value]
    out = []
    for v in items:
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise UsageError(f"{where}: {key}: {v!r} is not an integer >= {minimum}")
        out.append(v)
    return sorted(set(out))


def load_job(path: str | Path) -> Job:
    """Read a job file; every problem is a UsageError naming the file and key."""
    import yaml

    p = Path(path)
    where = f"--config {p}"
    try:
        raw = yaml.safe_load(p.read_text())
    except OSError as err:
        raise UsageError(f"{where}: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise UsageError(f"{where}: not valid YAML ({str(err).splitlines()[0]})") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise UsageError(f"{where}: expected a mapping of keys, got {type(raw).__name__}")
    known = {"pairings", "widths", "width_mode", "max_tokens", "prompts", "prompts_file", "params", "endpoint",
             "sequence", "concurrency", "self_draft", "repeats", "extra_args", "controls", "env",
             "start_timeout", "request_timeout", "profile", "distribution", "reference"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise UsageError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")
    job = builtin_job() if not raw.get("pairings") else Job(pairings=[])
    job.source = str(p)
    if raw.get("pairings"):
        for i, item in enumerate(raw["pairings"]):
            if not isinstance(item, dict) or not item.get("target"):
                raise UsageError(f"{where}: pairings[{i}] needs a target")
            target = resolve_model(str(item["target"]), p.parent, f"{where}: pairings[{i}].target")
            draft = item.get("draft")
            if draft is not None:
                draft = resolve_model(str(draft), p.parent, f"{where}: pairings[{i}].draft")
            env = item.get("environment")
            if env is not None and (not isinstance(env, str) or not env):
                raise UsageError(f"{where}: pairings[{i}].environment: {env!r} is not an environment name")
            job.pairings.append(Pairing(str(item.get("name") or f"pairing{i}"), target, draft,
                                        str(item.get("profile", "mlx-lm")), bool(item.get("trust_remote_code")),
                                        env))
    if "profile" in raw:
        if not isinstance(raw["profile"], str) or not raw["profile"]:
            raise UsageError(f"{where}: profile: {raw['profile']!r} is not a profile name or file")
        prof = raw["profile"]
        if prof not in packaged_profiles() and not Path(prof).is_absolute() and (p.parent / prof).is_file():
            prof = str((p.parent / prof).resolve())
        for pairing in job.pairings:
            pairing.profile = prof
    if "widths" in raw:
        job.widths = _ints(raw["widths"], "widths", where, 1)
    if "width_mode" in raw:
        if raw["width_mode"] not in WIDTH_MODES:
            raise UsageError(f"{where}: width_mode {raw['width_mode']!r}: choose from {', '.join(WIDTH_MODES)}")
        job.width_mode = raw["width_mode"]
    for key in ("max_tokens",):
        if key in raw:
            job.max_tokens = _ints(raw[key], key, where, 1)[0]
    for key in ("concurrency", "repeats"):
        if key in raw:
            setattr(job, key, _ints(raw[key], key, where, 0)[0])
    for key in ("start_timeout", "request_timeout"):
        if key in raw:
            if not isinstance(raw[key], (int, float)) or raw[key] <= 0:
                raise UsageError(f"{where}: {key}: {raw[key]!r} is not a positive number of seconds")
            setattr(job, key, float(raw[key]))
    if raw.get("distribution") is not None:
        job.distribution = parse_spec(raw["distribution"], where)
    if "self_draft" in raw:
        job.self_draft = bool(raw["self_draft"])
    if "reference" in raw:
        if not isinstance(raw["reference"], bool):
            raise UsageError(f"{where}: reference: {raw['reference']!r} is not true or false")
        job.reference = raw["reference"]
    if "prompts_file" in raw:
        pf = p.parent / raw["prompts_file"]
        try:
            job.prompts = [ln for ln in pf.read_text().splitlines() if ln.strip()]
        except OSError as err:
            raise UsageError(f"{where}: prompts_file {pf}: {err.strerror}") from None
    if "prompts" in raw:
        if not isinstance(raw["prompts"], list) or not all(isinstance(x, str) for x in raw["prompts"]):
            raise UsageError(f"{where}: prompts must be a list of strings")
        job.prompts = list(raw["prompts"])
    if not job.prompts:
        raise UsageError(f"{where}: no prompts")
    if "params" in raw:
        params = raw["params"] or {}
        bad = sorted(set(params) - set(REQUEST_PARAMS) - {"stream", "temperature"})
        if bad:
            raise UsageError(f"{where}: params: unknown request parameter {bad[0]!r}"
                             f" (known: {', '.join(REQUEST_PARAMS)})")
        if params.get("temperature", 0) != 0:
            raise UsageError(f"{where}: params.temperature: the served parity job is greedy (temperature 0)")
        job.params = dict(params)
    if "endpoint" in raw:
        if raw["endpoint"] not in ("completions", "chat"):
            raise UsageError(f"{where}: endpoint {raw['endpoint']!r}: choose from completions, chat")
        job.endpoint = raw["endpoint"]
    if "sequence" in raw:
        seq = raw["sequence"] if isinstance(raw["sequence"], list) else [raw["sequence"]]
        bad = [s for s in seq if s not in SEQUENCE_KINDS]
        if bad or not seq:
            raise UsageError(f"{where}: sequence {bad[0] if bad else '[]'!r}: choose from {', '.join(SEQUENCE_KINDS)}")
        job.sequence = list(seq)
    if "extra_args" in raw:
        ea = raw["extra_args"] or {}
        if not isinstance(ea, dict) or not all(isinstance(v, list) for v in ea.values()):
            raise UsageError(f"{where}: extra_args: a mapping of arm name (or '*') to a list of arguments")
        job.extra_args = {str(k): [str(a) for a in v] for k, v in ea.items()}
    if "env" in raw:
        job.env = {str(k): str(v) for k, v in (raw["env"] or {}).items()}
    for i, c in enumerate(raw.get("controls") or []):
        if not isinstance(c, dict) or not isinstance(c.get("env"), dict):
            raise UsageError(f"{where}: controls[{i}] needs env: {{VAR: value}}")
        width = c.get("width", max(job.widths))
        job.controls.append(Control(str(c.get("name") or f"control{i}"),
                                    {str(k): str(v) for k, v in c["env"].items()},
                                    _ints(width, f"controls[{i}].width", where, 2)[0]))
    return job


def resolve_model(spec: str, base: Path | None, where: str) -> str:
    """A pairing's checkpoint as a local directory: a path (relative to ``base``, the config's
    folder) or a Hugging Face repo id (the one resolver, specparity.resolve)."""
    from specparity.resolve import is_repo_id, resolve_checkpoint

    path = Path(spec).expanduser()
    if not path.is_absolute() and base is not None and (base / path).exists():
        return str((base / path).resolve())
    if path.exists() or not is_repo_id(spec):
        return str(path.resolve() if base is None or path.is_absolute() else (base / path).resolve())
    try:
        return str(resolve_checkpoint(spec))
    except SpecparityError as err:
        raise type(err)(f"{where}: {err}") from err


class OverrideError(UsageError):
    """A command-line override that cannot apply; ``field`` names the Overrides field (the command
    names its flag), ``detail`` says what is wrong."""

    def __init__(self, field: str, detail: str):
        super().__init__(f"{field}: {detail}")
        self.field = field
        self.detail = detail


@dataclass
class Overrides:
    """What a command line sets over a job; None leaves the job's own value.

    model / draft_model: one pairing instead of the job's (a path or a hub id).
    profile: every pairing's profile. trust_remote_code: every pairing's consent.
    environment: every pairing's environment (a packaged name or a YAML file).
    widths .. request_timeout: the job keys of the same names.
    temperature / dist_requests / dist_prefix: the distribution arms (any of them adds them).
    reference: whether completions are also judged against classic decode computed in process.
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


def apply_overrides(job: Job | None, o: Overrides) -> Job:
    """The job a command runs: ``job`` (a config's, or None for the built-in one) with ``o`` applied.

    Errors are usage errors in the job's own terms (the command maps them to its flags).
    """
    from specparity.harness.profiles import load_profile

    if o.profile is not None:
        load_profile(o.profile)
    if o.draft_model is not None and o.model is None:
        raise OverrideError("draft_model", "a drafter needs a target model")
    if o.model is not None:
        target = resolve_model(o.model, None, "model")
        draft = resolve_model(o.draft_model, None, "draft model") if o.draft_model is not None else None
        pairing = Pairing("cli", target, draft, o.profile or "mlx-lm", o.trust_remote_code)
        job = replace(builtin_job(), pairings=[pairing], source="command line") if job is None \
            else replace(job, pairings=[pairing])
    elif job is None:
        job = builtin_job()
    else:
        job = replace(job)
    if o.environment is not None:
        from specparity.environments import load_spec

        try:
            load_spec(o.environment)
        except UsageError as err:
            raise OverrideError("environment", str(err)) from None
    for p in job.pairings:
        if o.profile is not None:
            p.profile = o.profile
        if o.trust_remote_code:
            p.trust_remote_code = True
        if o.environment is not None:
            p.environment = o.environment
    if o.widths is not None:
        if not o.widths:
            raise OverrideError("widths", "give at least one width")
        job.widths = sorted(set(o.widths))
    if o.width_mode is not None:
        if o.width_mode not in WIDTH_MODES:
            raise OverrideError("width_mode", f"{o.width_mode!r}: choose from {', '.join(WIDTH_MODES)}")
        job.width_mode = o.width_mode
    job.max_tokens = o.max_tokens if o.max_tokens is not None else job.max_tokens
    job.concurrency = o.concurrency if o.concurrency is not None else job.concurrency
    job.repeats = o.repeats if o.repeats is not None else job.repeats
    job.reference = o.reference if o.reference is not None else job.reference
    job.start_timeout = o.start_timeout if o.start_timeout is not None else job.start_timeout
    job.request_timeout = o.request_timeout if o.request_timeout is not None else job.request_timeout
    if o.temperature is not None or o.dist_requests is not None or o.dist_prefix is not None:
        spec = replace(job.distribution or DistSpec())
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
        job.distribution = spec
    if job.distribution is not None and not any(p.draft for p in job.pairings):
        raise OverrideError("temperature", "no pairing has a drafter to compare with")
    return job

