"""Server profiles: how to start a server, map a width to it, and read its evidence.

A profile is YAML (read bounded and checked by type: PROFILE_SCHEMA): the packaged ones live in
``harness/profiles/*.yaml`` (``mlx-lm``, ``specparity-serve``, ``openai``);
a user file is named by path. ``extends: NAME`` starts from another profile
and overrides its keys (one level of dict merging). Keys: see
:class:`Profile` and ``profiles/mlx-lm.yaml``, which documents each.
"""

from __future__ import annotations

import re
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specparity.errors import InputError, UsageError
from specparity.schema import (
    Anything,
    AnyOf,
    Bool,
    Enum,
    Fields,
    Int,
    Json,
    ListOf,
    MapOf,
    Module,
    Nullable,
    Regex,
    Scalar,
    Str,
    check,
    describe,
    load_yaml_file,
)

if TYPE_CHECKING:
    from specparity.engines import ServedHooks

PROFILE_DIR = Path(__file__).parent / "profiles"
ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
WITNESS_ROLES = ("target", "draft")
ARITHMETIC = ("mlx", "other")


@dataclass(frozen=True)
class Width:
    """A verify width and the server's own setting for it, converted once (by the profile).

    rows: verify rows T (the M that picks a kernel). setting: the server's draft setting
    (mlx-lm: num_draft_tokens = T - 1). setting_name: that setting's name.
    """

    rows: int
    setting: int
    setting_name: str

    def describe(self) -> str:
        return f"width {self.rows} ({self.setting_name}={self.setting})"

    def to_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "setting": self.setting, "setting_name": self.setting_name}


@dataclass
class Profile:
    """One server kind.

    name, description: how reports name it.
    argv: the server command; placeholders {python} {model} {host} {port}.
    draft_argv: appended when an arm has a drafter; {draft_model} {num_draft} {width} (verify rows).
    trust_remote_code_argv: appended when a checkpoint needs its model_file.
    width_setting: the server's name for its draft setting (mlx-lm: num_draft_tokens).
    rows_offset: verify rows = setting + rows_offset (mlx-lm: K drafts verify K + 1 rows).
    per_request: the request field that sets the width per request (None: per process).
    ready_path, fail_regex: readiness (see harness.lifecycle.Server).
    stop: ``graceful`` (SIGTERM to the server's group, a wait, then SIGKILL) or ``kill`` (SIGKILL at once: for a
      server whose shutdown writes nothing the job reads, where its graceful shutdown is only the engine's own
      clean-up; the job's time then holds none of it).
    endpoint: completions or chat (the job may override per request).
    witness: which checkpoints the harness wraps with the witness model_file
      (target, draft): the server must load them with trust_remote_code.
    log_engaged / log_declined: regexes over the request's slice of the server log.
    response_field / usage_field: a response key (dotted) whose presence is evidence.
    metrics_counter: a Prometheus counter (e.g. vLLM's ``vllm:spec_decode_num_draft_tokens``) read from
      ``metrics_path`` before and after each request: a rise is evidence the drafter ran.
    request_fields: fields every request carries, streamed or not (a server whose schema requires ``model``:
      the name it was started with); a job's own field of the same name wins.
    logprobs_request: request fields asking for logprobs (not sent on a stream); logprobs_path: where they are.
    logprobs_real: False when the server's logprob values are not real numbers (dflash-mlx: a
      constant 0.0): the client keeps the token ids and drops the values (no margins from them).
    flush: a request path that empties the prompt cache (None: cannot flush).
    version_command: argv printing the server's version (kept in the record).
    requires_module: a module that must be importable for the profile to run.
    engine: the registered engine (specparity.engines) whose served hooks this server needs
      (placeholders such as ``{llama_server}``, availability, the checkpoint export it loads, extra
      argv, its own evidence), by name or module form (``llama.cpp`` / ``llama_cpp``); None: no code.
    arithmetic: ``mlx`` (the server computes with MLX on the checkpoint: classic decode computed in
      process is its exact reference and decides each verdict) or ``other`` (llama.cpp, vLLM...: a
      difference from classic decode in MLX is reported, a near tie apart from a confident one, and
      the verdict rests on the engine's own drafter-less server).
    environment: the pinned environment (specparity.environments: a packaged name, a YAML file or
      an inline mapping) the server runs in: ``{python}`` is its interpreter, ``requires_module`` is
      looked for there, and the record's identity lists its packages. None: this interpreter.
    exercised: False for a profile written from the server's documentation and not yet run
      against a live server (vLLM, SGLang, mlxcel): runs say so.
    lossy: a mode its authors document as lossy, in their words (``--mtp-optimistic``: it skips the verify):
      a drafted request of it that returns an answer is ``lossy_by_design`` with what it changed (or that it
      changed nothing there), never a pass and never a defect; None: the profile claims lossless decoding.
    loop: the serving loop the server runs (``mlx_lm.server``: the loop the sequence replay
      rebuilds in process; another name, or None, a loop no in-process replay rebuilds), inherited
      by ``extends``: reproductions and cold answers are decided by it, never by the profile's name.
    source: the YAML file it came from.
    """

    name: str
    argv: list[str]
    description: str = ""
    draft_argv: list[str] = field(default_factory=list)
    trust_remote_code_argv: list[str] = field(default_factory=list)
    width_setting: str = "num_draft_tokens"
    rows_offset: int = 1
    per_request: str | None = None
    ready_path: str = "/health"
    fail_regex: str | None = None
    endpoint: str = "completions"
    witness: list[str] = field(default_factory=list)
    log_engaged: str | None = None
    log_declined: str | None = None
    response_field: str | None = None
    usage_field: str | None = None
    metrics_counter: str | None = None
    metrics_path: str = "/metrics"
    request_fields: dict[str, Any] = field(default_factory=dict)
    logprobs_request: dict[str, Any] = field(default_factory=dict)
    logprobs_path: str = "choices.0.logprobs.content"
    logprobs_real: bool = True
    flush: str | None = None
    version_command: list[str] | None = None
    requires_module: str | None = None
    engine: str | None = None
    environment: str | dict[str, Any] | None = None
    arithmetic: str = "mlx"
    exercised: bool = True
    loop: str | None = None
    lossy: str | None = None
    stop: str = "graceful"
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def width(self, rows: int) -> Width:
        """``rows`` verify rows with this server's own setting for them (converted here, once)."""
        return Width(rows, rows - self.rows_offset, self.width_setting)

    def engine_hooks(self) -> ServedHooks:
        from specparity.engines import served_hooks

        return served_hooks(self.engine)

    def render(self, items: list[str], key: str = "", /, **values: Any) -> list[str]:
        """``items`` (the profile's templates, its ``key``: argv, draft_argv...) with their ``{name}``
        fields filled from ``values``.

        str.format's field syntax over the template only: a value goes in as it is, braces and all
        (a model path holding ``{port}`` stays that path), and a field is a whole value: a format
        spec or a conversion (``{model:>99999}``, ``{model!r}``) is refused (it could pad an
        argument to gigabytes). ``{port}`` and ``{host}`` given no value (or given as themselves)
        stay fields the lifecycle fills at spawn: such an item comes back as a
        ``lifecycle.ArgTemplate``, every other one as a plain string.
        """
        from string import Formatter

        from specparity.harness.lifecycle import ArgTemplate

        subs = {"python": sys.executable, **{k: str(v) for k, v in values.items() if v is not None}}
        deferred = {k for k in ("port", "host") if subs.get(k, f"{{{k}}}") == f"{{{k}}}"}
        where = f"profile {self.name} ({self.source})" + (f": {key}" if key else "")
        wanted: set[str] = set()
        for item in items:
            try:
                wanted |= {name for _, name, _, _ in Formatter().parse(item) if name}
            except ValueError:
                continue  # named below, item by item
        if wanted - subs.keys() - deferred:  # an engine's own placeholder ({llama_server}): ask the engine
            subs = {**self.engine_hooks().placeholders(), **subs}
        out: list[str] = []
        for item in items:
            try:
                pieces = list(Formatter().parse(item))
            except ValueError as err:
                raise UsageError(f"{where}: {item!r}: {err}") from None
            plain, template, is_template = [], [], False
            for text, name, spec, conv in pieces:
                plain.append(text)
                template.append(_braces(text))
                if name is None:
                    continue
                if spec or conv:
                    field = f"{{{name}{'!' + conv if conv else ''}{':' + spec if spec else ''}}}"
                    raise UsageError(f"{where}: placeholder {field} in {item!r}: no format spec or conversion"
                                     f" (a placeholder is its whole value: {{{name}}})")
                if name in deferred:
                    template.append(f"{{{name}}}")
                    is_template = True
                    continue
                if name not in subs:
                    raise UsageError(f"{where}: placeholder {{{name}}} in {item!r} has no value here"
                                     f" (known: {', '.join(sorted({*subs, *deferred}))})")
                value = subs[name]
                plain.append(value)
                template.append(_braces(value))
            out.append(ArgTemplate("".join(template)) if is_template else "".join(plain))
        return out

    def available(self, environment: str | dict[str, Any] | None = None) -> str | None:
        """None when the profile can run here, else why not (``environment``: overrides the profile's)."""
        env_ref = environment if environment is not None else self.environment
        if env_ref is not None:
            from specparity.environments import find_environment, load_spec

            env = find_environment(env_ref)
            if env is None:
                name = load_spec(env_ref).name
                return f"environment {name} is not built (run scripts/build-env {name})"
            if self.requires_module and not env.has_module(self.requires_module):
                return f"module {self.requires_module} is not installed in environment {env.name}"
        elif self.requires_module and not _importable(self.requires_module):
            return f"module {self.requires_module} is not installed"
        exe = self.argv[0] if self.argv else ""
        if "{" not in exe and shutil.which(exe) is None:
            return f"{exe} is not installed (not on PATH)"
        return self.engine_hooks().unavailable()


NOT_EXERCISED = "(not yet exercised against a live server)"


def _importable(module: str) -> bool:
    from specparity.engines import importable

    return importable(module)


def _braces(text: str) -> str:
    """``text`` as literal text inside a str.format template."""
    return text.replace("{", "{{").replace("}", "}}")


def packaged_profiles() -> dict[str, Path]:
    """Every profile known by name: the generic ones here (``profiles/*.yaml``), then each registered
    engine's own (a YAML file in its package, :meth:`specparity.engines.EngineSpec.profile_files`)."""
    from specparity.engines import registry

    out = {p.stem: p for p in sorted(PROFILE_DIR.glob("*.yaml"))}
    for spec in registry().values():
        for name, path in spec.profile_files().items():
            if name in out and out[name] != path:
                raise UsageError(f"engine {spec.name}: profile {name!r} ({path}) is packaged already ({out[name]})")
            out[name] = path
    return out


_ARGV = ListOf(Scalar(), what="a list of arguments (strings or numbers; no shell)")
_OPT_STR = Nullable(Str())
_OPT_REGEX = Nullable(Regex())

# Every key a profile file may hold (profiles/mlx-lm.yaml documents each), checked by type per file
# before anything is used; ``extends`` merges files already checked. Keys marked "not read yet" are
# what dflash-mlx's profile proposes (specparity/engines/dflash_mlx/dflash-mlx.yaml): accepted, typed, unused.
STOPS = ("graceful", "kill")  # how a server is stopped (Profile.stop)
PROFILE_SCHEMA = Fields({
    "name": Str(nonempty=True),
    "description": Str(),
    "extends": Str("a profile name or file", nonempty=True),
    "argv": Nullable(_ARGV),
    "draft_argv": Nullable(_ARGV),
    "trust_remote_code_argv": Nullable(_ARGV),
    "width": Nullable(Fields({
        "setting": Str(nonempty=True),
        "rows_offset": Int(-16, 16),
        "per_request": _OPT_STR,
    })),
    "ready_path": Str("a URL path (/health)", pattern=re.compile(r"^/")),
    "fail_regex": _OPT_REGEX,
    "endpoint": Enum(ENDPOINTS),
    "witness": Nullable(ListOf(Enum(WITNESS_ROLES))),
    "evidence": Nullable(Fields({
        "log_engaged": _OPT_REGEX,
        "log_declined": _OPT_REGEX,
        "response_field": _OPT_STR,
        "usage_field": _OPT_STR,
        "metrics_counter": _OPT_STR,
        "metrics_path": Nullable(Str("a URL path (/metrics)", pattern=re.compile(r"^/"))),
    })),
    "request": Nullable(MapOf(Json(), key=Str(), what="a mapping of request field to a JSON value")),
    "logprobs": Nullable(Fields({
        "request": Nullable(MapOf(Json(), key=Str(), what="a mapping of request field to a JSON value")),
        "path": Str(nonempty=True),
        "values_real": Bool(),
    })),
    "flush": _OPT_STR,
    "version_command": Nullable(_ARGV),
    "requires_module": Nullable(Module()),
    "engine": Nullable(Str("an engine module name", nonempty=True)),
    "environment": Nullable(AnyOf(Str(nonempty=True), MapOf(Anything(), key=Str()),
                                  what="a packaged environment name, a YAML file or a mapping")),
    "arithmetic": Enum(ARITHMETIC),
    "exercised": Bool(),
    "loop": _OPT_STR,
    "lossy": Nullable(Str("its authors' words for the lossy mode", nonempty=True)),
    "stop": Enum(STOPS),
})


def _read(path: Path) -> dict[str, Any]:
    where = f"profile {path}"
    raw = load_yaml_file(path, where)
    if not isinstance(raw, dict):
        raise UsageError(f"{where}: expected a mapping of keys, got {describe(raw)}")
    check(raw, PROFILE_SCHEMA, where)
    return raw


def _raw(name_or_path: str, seen: tuple[str, ...] = ()) -> tuple[dict[str, Any], Path]:
    known = packaged_profiles()
    if name_or_path in known:
        path = known[name_or_path]
    else:
        path = Path(name_or_path)
        if not path.is_file():
            raise InputError("profile", f"{name_or_path!r}: neither a file nor a packaged profile"
                             f" ({', '.join(known)})")
    raw = _read(path)
    base = raw.pop("extends", None)
    if base is not None:
        if base in seen:
            raise UsageError(f"profile {path}: extends {base!r} in a loop")
        parent, _ = _raw(str(base), (*seen, str(base)))
        merged = dict(parent)
        for k, v in raw.items():
            merged[k] = {**parent[k], **v} if isinstance(v, dict) and isinstance(parent.get(k), dict) else v
        raw = merged
    return raw, path


def load_profile(name_or_path: str) -> Profile:
    """A packaged profile by name, or a YAML file by path; a bad one is a UsageError naming it.

    Each file is checked against PROFILE_SCHEMA, then the templates are rendered once with sample
    values (:func:`dry_render`): a bad placeholder fails here, not when a server starts.
    """
    raw, path = _raw(name_or_path)
    where = f"profile {path}"
    width = raw.get("width") or {}
    evidence = raw.get("evidence") or {}
    logprobs = raw.get("logprobs") or {}
    if not raw.get("argv"):
        raise UsageError(f"{where}: argv is empty: give the server command (see {PROFILE_DIR / 'openai.yaml'})")
    engine = raw.get("engine")
    if engine is not None:
        from specparity.engines import served_hooks

        try:
            served_hooks(str(engine))
        except UsageError as err:
            raise UsageError(f"{where}: {err}") from None
    environment = raw.get("environment")
    if environment is not None:
        from specparity.environments import load_spec

        try:
            load_spec(environment)
        except UsageError as err:
            raise UsageError(f"{where}: environment: {err}") from None
    arithmetic = raw.get("arithmetic", "mlx")
    profile = Profile(
        name=str(raw.get("name") or path.stem),
        description=str(raw.get("description") or ""),
        argv=[str(a) for a in raw["argv"]],
        draft_argv=[str(a) for a in raw.get("draft_argv") or []],
        trust_remote_code_argv=[str(a) for a in raw.get("trust_remote_code_argv") or []],
        width_setting=str(width.get("setting", "num_draft_tokens")),
        rows_offset=int(width.get("rows_offset", 1)),
        per_request=width.get("per_request"),
        ready_path=str(raw.get("ready_path", "/health")),
        fail_regex=raw.get("fail_regex"),
        endpoint=raw.get("endpoint", "completions"),
        witness=list(raw.get("witness") or []),
        log_engaged=evidence.get("log_engaged"),
        log_declined=evidence.get("log_declined"),
        response_field=evidence.get("response_field"),
        usage_field=evidence.get("usage_field"),
        metrics_counter=evidence.get("metrics_counter"),
        metrics_path=str(evidence.get("metrics_path") or "/metrics"),
        request_fields=dict(raw.get("request") or {}),
        logprobs_request=dict(logprobs.get("request") or {}),
        logprobs_path=str(logprobs.get("path", "choices.0.logprobs.content")),
        logprobs_real=bool(logprobs.get("values_real", True)),
        flush=raw.get("flush"),
        version_command=[str(a) for a in raw["version_command"]] if raw.get("version_command") else None,
        requires_module=raw.get("requires_module"),
        engine=str(engine) if engine is not None else None,
        environment=environment,
        arithmetic=str(arithmetic),
        exercised=bool(raw.get("exercised", True)),
        loop=raw.get("loop"),
        lossy=raw.get("lossy"),
        stop=str(raw.get("stop") or "graceful"),
        source=str(path),
    )
    dry_render(profile)
    return profile


# what each template is rendered with at run time (harness.run, Profile.render's docstring)
_SAMPLES = {"model": "/checkpoints/target", "draft_model": "/checkpoints/draft", "num_draft": 3, "width": 4,
            "python": sys.executable, "host": "127.0.0.1", "port": 8080}
_TEMPLATE_VALUES = {"argv": ("model", "draft_model", "python"),
                    "draft_argv": ("draft_model", "num_draft", "width", "python"),
                    "version_command": ("model", "python", "host", "port")}


def dry_render(profile: Profile) -> None:
    """Render every template once with sample values, as a run would: a UsageError names a bad one.

    An engine's own placeholders (``{llama_server}``) take the engine's values where it can give
    them here, a sample otherwise (a binary not built yet is said when a run needs it).
    """
    from string import Formatter

    from specparity.errors import SpecparityError

    extra: dict[str, str] = {}
    if profile.engine is not None:
        try:
            extra = profile.engine_hooks().placeholders()
        except SpecparityError:
            names: set[str] = set()
            for items in (profile.argv, profile.draft_argv, profile.version_command or []):
                for item in items:
                    try:
                        names |= {n for _, n, _, _ in Formatter().parse(item) if n}
                    except ValueError:
                        continue  # named by the render below
            extra = {n: f"/{n}" for n in names if n.isidentifier()}
    for key, keys in _TEMPLATE_VALUES.items():
        items = getattr(profile, key) or []
        profile.render(items, key, **{**extra, **{k: _SAMPLES[k] for k in keys}})


def dig(obj: Any, dotted: str) -> Any:
    """``dig(resp, "choices.0.logprobs.content")``: None where a step is missing."""
    cur = obj
    for part in dotted.split("."):
        if isinstance(cur, list) and part.isdigit():
            i = int(part)
            cur = cur[i] if i < len(cur) else None
        elif isinstance(cur, dict):
            cur = cur.get(part)
        else:
            return None
        if cur is None:
            return None
    return cur
