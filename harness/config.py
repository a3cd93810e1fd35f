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
    distribution: {temperature: 0.7, requests: 600, prefix: 1, alpha: 0.001, seed: 0, width: 4}
                                    # temperature > 0 arms: seeded draws with and without the
                                    # drafter, histograms compared (harness/served_dist.py)

Every key is optional; without a config the built-in job runs on the embedded
fixture pair (:func:`builtin_job`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specparity.harness.client import Request
from specparity.harness.profiles import packaged_profiles

if TYPE_CHECKING:
    from specparity.harness.served_dist import DistSpec

from specparity.errors import UsageError

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
    name: str
    target: str
    draft: str | None
    profile: str = "mlx-lm"
    trust_remote_code: bool = False


@dataclass
class Control:
    """An env control arm: a separate drafter server at ``width`` with ``env`` set."""

    name: str
    env: dict[str, str]
    width: int


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
             "start_timeout", "request_timeout", "profile", "distribution"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise UsageError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")
    job = builtin_job() if not raw.get("pairings") else Job(pairings=[])
    job.source = str(p)
    if raw.get("pairings"):
        for i, item in enumerate(raw["pairings"]):
            if not isinstance(item, dict) or not item.get("target"):
                raise UsageError(f"{where}: pairings[{i}] needs a target")
            base = p.parent
            target = str((base / item["target"]).resolve()) if not Path(item["target"]).is_absolute() \
                else item["target"]
            draft = item.get("draft")
            if draft is not None and not Path(draft).is_absolute():
                draft = str((base / draft).resolve())
            job.pairings.append(Pairing(str(item.get("name") or f"pairing{i}"), target, draft,
                                        str(item.get("profile", "mlx-lm")), bool(item.get("trust_remote_code"))))
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
        from specparity.harness.served_dist import parse_spec

        job.distribution = parse_spec(raw["distribution"], where)
    if "self_draft" in raw:
        job.self_draft = bool(raw["self_draft"])
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


def build_sequence(job: Job, endpoint: str, history: dict[str, str]) -> list[Request]:
    """An arm's requests, in the order a client sends them.

    ``history``: the first baseline's answers by request id; the multi-turn
    request appends the first turn's baseline answer, so every arm sends the
    same bytes and its completion is comparable with the baseline's.
    """
    prompts = job.prompts
    common = {"max_tokens": job.max_tokens, "temperature": 0, **{k: v for k, v in job.params.items()
                                                                   if k != "stream"}}

    def body(prompt: str, stream: bool = False) -> dict[str, Any]:
        b: dict[str, Any] = dict(common)
        if endpoint == "chat":
            b["messages"] = [{"role": "user", "content": prompt}]
        else:
            b["prompt"] = prompt
        if stream:
            b["stream"] = True
        return b

    def p(i: int) -> str:
        return prompts[i % len(prompts)]

    out: list[Request] = []
    for kind in job.sequence:
        if kind == "fresh":
            out.append(Request("p0", kind, endpoint, body(p(0))))
        elif kind == "repeat":
            out.append(Request("p0-again", kind, endpoint, body(p(0))))
        elif kind == "shared-prefix":
            out.append(Request("p0-prefix", kind, endpoint, body(p(0) + " " + p(1))))
        elif kind == "stream":
            out.append(Request("p1-stream", kind, endpoint, body(p(1), stream=True)))
        elif kind == "long":
            out.append(Request("long", kind, endpoint, body(" ".join(prompts) * 2)))
        elif kind == "multi-turn":
            first = {**common, "messages": [{"role": "user", "content": p(2)}]}
            out.append(Request("chat-1", kind, "chat", first))
            answer = history.get("chat-1")
            if answer is not None:
                msgs = [*first["messages"], {"role": "assistant", "content": answer},
                        {"role": "user", "content": p(3)}]
                out.append(Request("chat-2", kind, "chat", {**common, "messages": msgs}))
    return out
