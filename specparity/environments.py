"""Engines in their own environments: pinned packages built once into a cached virtual environment.

A real engine pins its own versions (dflash-mlx 0.1.8 starts only with mlx-lm
0.31.x), and a version matrix runs one job on several mlx-lm releases. Each is
an :class:`EnvSpec`: a name and pinned requirements. :func:`ensure_environment`
builds it once into ``<cache>/<name>-<digest>/`` (a virtual environment outside
the repository; ``<digest>`` is a short hash of everything the build depends on,
so changing a pin builds a new one beside the old) and returns an
:class:`Environment`: its interpreter, its installed packages (for a record's
identity) and how to run specparity's own code there.

- Cache root: ``$SPECPARITY_ENV_CACHE``, else ``$SPECPARITY_HOME/envs``.
- Idempotent and offline once built: a built environment is found by its
  manifest (``specparity-env.json``, written last) without running anything.
- Atomic: built in a temporary directory in the cache and renamed into place,
  so an interrupted build leaves nothing that looks built.
- Locked: concurrent builds of one environment serialize on a ``flock``; the
  second finds the first one's result.
- Progress: one line per step (and pip's own Collecting/Installing lines) to
  the ``progress`` callback; pip's full output is in the environment's
  ``build.log``, or in ``<cache>/<name>-<digest>.failed.log`` after a failure.

specparity itself in an environment: its dependencies are installed there (at
versions the pins allow), and its code comes from the *running* checkout at run
time, not a copy made at build time: a ``.pth`` hook installs an import finder
from ``$SPECPARITY_SOURCE`` (see :meth:`Environment.environ`), so one built
environment serves every checkout and never runs stale code.

Packaged specs (:data:`PACKAGED`): every registered engine's environments
(:mod:`specparity.engines`: ``mlx-lm-0.31.3``, ``mlx-lm-0.32.2``, ``dflash-mlx``,
``dflash-mlx-mlx-lm-0.32.2``...), each with the mlx and transformers pins added. A
spec may also be a YAML file (keys as :class:`EnvSpec`) or a mapping given inline
in a profile.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import importlib.util
import json
import logging
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from specparity import paths
from specparity.errors import InfrastructureError, UsageError

log = logging.getLogger(__name__)

Progress = Callable[[str], None]

ENV_CACHE_VAR = "SPECPARITY_ENV_CACHE"
# the running checkout's package directories, as JSON {package: directory}, read by the .pth hook
SOURCE_VAR = "SPECPARITY_SOURCE"
# the PYTHONPATH of every process run in a pinned environment (the caller's own is dropped: its packages must not
# leak in): unset, none. For a start-up module every process must run, such as the test suite's
# (tests/startup/sitecustomize.py), and nothing a pinned environment imports.
PYTHONPATH_VAR = "SPECPARITY_ENV_PYTHONPATH"
MANIFEST = "specparity-env.json"
BUILD_LOG = "build.log"
# bump when the layout of a built environment changes: every digest changes with it
LAYOUT_VERSION = 1
DIGEST_CHARS = 12
# the packages whose directories the hook maps (pyproject's package-dir: folders outside specparity/)
SOURCE_PACKAGES = ("specparity", "specparity.probes", "specparity.bisect", "specparity.harness",
                   "specparity.records")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# a name is part of a directory name (name-digest) and of every record's identity: short, one line
NAME_MAX = 100
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
# C0 controls, DEL and C1 controls: a CR or LF in a spec would split the requirements file pip reads
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# pip output lines worth a progress line (the rest stays in build.log)
_PIP_PROGRESS = ("Collecting ", "Installing collected", "Successfully installed")
_NETWORK = re.compile(r"Failed to establish a new connection|Max retries exceeded|Name or service not known"
                      r"|Temporary failure in name resolution|Network is unreachable|Connection refused"
                      r"|ConnectTimeoutError|ReadTimeoutError|timed out|SSLError|ProxyError"
                      r"|No route to host|Could not fetch URL")
_NOT_FOUND = re.compile(r"No matching distribution found for (\S+)")
_CONFLICT = re.compile(r"ResolutionImpossible|conflicting dependencies|Cannot install .* because")

# mlx on Linux is the CPU build (mlx[cpu]); on macOS plain mlx (Metal). One mlx and one transformers
# in every packaged environment, so what differs between two of them is the engine release alone.
MLX_PIN = "0.32.4"
TRANSFORMERS_PIN = "5.24.0"
_MLX = (f"mlx[cpu]=={MLX_PIN}; sys_platform == 'linux'", f"mlx=={MLX_PIN}; sys_platform == 'darwin'")


def pin_problem(req: str) -> str | None:
    """Why ``req`` is not one pinned requirement (None: it is).

    One requirement as packaging parses it (PEP 508), pinned with ``==`` or ``===`` to one version, with
    extras and an environment marker allowed; no URL, no pip option, no control character. pip reads the
    specs as lines of a requirements file: a spec that is anything else could carry an option such as
    ``--index-url`` past the pins.
    """
    from packaging.requirements import InvalidRequirement, Requirement

    if not (req.isascii() and req.isprintable()):
        # pip splits its file at CR, LF, and at what str.splitlines splits (U+2028 in a marker's string too)
        return ("has a control character (a newline or carriage return) or one outside ASCII: write one"
                " requirement per entry")
    try:
        parsed = Requirement(req)
    except InvalidRequirement as err:
        return f"is not a requirement ({str(err).splitlines()[0]}): write name==version"
    if parsed.url:
        return "names a URL: write name==version, from the package index"
    pins = list(parsed.specifier)
    if len(pins) != 1 or pins[0].operator not in ("==", "===") or "*" in pins[0].version:
        return "is not pinned: write name==version (one exact version)"
    return None


@dataclass(frozen=True)
class EnvSpec:
    """A named set of pinned packages.

    name: how profiles, configs and records name it (``mlx-lm-0.31.3``).
    packages: pinned requirements (``mlx-lm==0.31.3``); extras and markers allowed.
    description: one line for ``specparity env list``.
    imports: modules the build imports once to prove the environment works.
    with_specparity: also install specparity's dependencies (at versions the pins allow)
      and the hook that imports specparity from the running checkout.
    no_deps: pinned requirements installed after the rest with ``pip --no-deps`` (a package whose declared
      dependencies cannot install here: what it needs of them is listed in ``packages``).
    left_out: what ``no_deps`` leaves out and why, one line each (``env show`` and ``env list`` say it).
    python: the interpreter's version to build with (``3.13``), found on PATH or under pyenv's versions;
      '' (default): the one running specparity.
    source: the YAML file it came from ('' when packaged or inline).
    """

    name: str
    packages: tuple[str, ...]
    description: str = ""
    imports: tuple[str, ...] = ()
    with_specparity: bool = True
    no_deps: tuple[str, ...] = ()
    left_out: tuple[str, ...] = ()
    python: str = ""
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        shown = self.name if len(self.name) <= 40 else self.name[:40] + "..."
        where = f"environment {shown!r}" + (f" ({self.source})" if self.source else "")
        if not _NAME.fullmatch(self.name) or len(self.name) > NAME_MAX:
            raise UsageError(f"{where}: a name is letters, digits, '.', '_' and '-', at most {NAME_MAX} of them")
        if not self.packages:
            raise UsageError(f"{where}: packages is empty: list pinned requirements (name==version)")
        for req in (*self.packages, *self.no_deps):
            why = pin_problem(req)
            if why is not None:
                raise UsageError(f"{where}: package {req!r} {why}")
        if self.python and not re.fullmatch(r"3\.\d{1,2}", self.python):
            raise UsageError(f"{where}: python {self.python!r} is not a version such as 3.13")
        if any(_CONTROL.search(line) for line in self.left_out):
            raise UsageError(f"{where}: a left_out line has a control character (a newline?): write one line each")
        for module in self.imports:
            if not _MODULE.fullmatch(module):
                raise UsageError(f"{where}: imports entry {module!r} is not a module name (a.b.c)")
        if _CONTROL.search(self.description):
            raise UsageError(f"{where}: description has a control character (a newline?): write one line")

    def requirements(self) -> list[str]:
        """What pip installs: the pins, then specparity's own dependencies (when ``with_specparity``)."""
        reqs = list(self.packages)
        if self.with_specparity:
            reqs += specparity_requirements()
        return reqs

    def key(self) -> dict[str, Any]:
        """Everything the build depends on; its hash names the directory."""
        return {
            "layout": LAYOUT_VERSION,
            "requirements": sorted(self.requirements()),
            "imports": sorted(self.imports),
            "with_specparity": self.with_specparity,
            "python": self.python.split(".") if self.python else list(platform.python_version_tuple()[:2]),
            "platform": f"{sys.platform}-{platform.machine()}",
            # only where given: every environment without them keeps the digest it was built under
            **({"no_deps": sorted(self.no_deps)} if self.no_deps else {}),
        }

    @property
    def digest(self) -> str:
        text = json.dumps(self.key(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:DIGEST_CHARS]

    @property
    def dirname(self) -> str:
        return f"{self.name}-{self.digest}"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "packages": list(self.packages), "description": self.description,
                "imports": list(self.imports), "with_specparity": self.with_specparity,
                "no_deps": list(self.no_deps), "left_out": list(self.left_out), "python": self.python,
                "digest": self.digest, "source": self.source}


def packaged() -> dict[str, EnvSpec]:
    """Every registered engine's environments (:mod:`specparity.engines`, which refuses a name two engines
    declare), the shared pins added. Asked when used, never at import: this module is imported by the error
    handler, which must not fail on the registry it reports."""
    global _PACKAGED
    from specparity.engines import registry

    engines = registry()
    if _PACKAGED is None or _PACKAGED[0] is not engines:  # one set of specs per registry
        _PACKAGED = (engines, {env.name: EnvSpec(env.name, (*env.packages, *_MLX, f"transformers=={TRANSFORMERS_PIN}"),
                                                 env.description, imports=env.imports, no_deps=env.no_deps,
                                                 left_out=env.left_out, python=env.python)
                               for spec in engines.values() for env in spec.environments})
    return _PACKAGED[1]


_PACKAGED: tuple[Any, dict[str, EnvSpec]] | None = None


def __getattr__(name: str) -> Any:
    # ``PACKAGED``: the packaged environments as of now (see :func:`packaged`)
    if name == "PACKAGED":
        return packaged()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def cache_root() -> Path:
    """``$SPECPARITY_ENV_CACHE``, else ``$SPECPARITY_HOME/envs`` (see :func:`specparity.paths.home`)."""
    env = os.environ.get(ENV_CACHE_VAR)
    if not env:
        return paths.usable_dir(paths.home() / "envs", "the environment cache")
    from specparity.inputs import expand_user

    return paths.usable_dir(expand_user(env, ENV_CACHE_VAR), ENV_CACHE_VAR)


def specparity_requirements() -> list[str]:
    """specparity's own runtime dependencies (no extras), from its installed metadata or pyproject.toml."""
    from importlib import metadata

    from packaging.requirements import Requirement

    try:
        reqs = metadata.requires("specparity") or []
    except metadata.PackageNotFoundError:
        reqs = _pyproject_requirements()
    # written as packaging writes them: the metadata's and pyproject's quoting differ ('linux' / "linux"), and
    # a spec's digest must be the same from an installed specparity and from a checkout (a pinned environment's)
    return sorted(str(Requirement(r)) for r in reqs if not re.search(r"\bextra\s*==", r))


def _pyproject_requirements() -> list[str]:
    import tomllib

    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    try:
        data = tomllib.loads(pyproject.read_text())
    except OSError:
        raise InfrastructureError("specparity is not installed and its pyproject.toml is not beside it:"
                                  " install it (README) to build environments") from None
    return [str(r) for r in data.get("project", {}).get("dependencies", [])]


def load_spec(ref: str | Mapping[str, Any] | EnvSpec) -> EnvSpec:
    """A packaged spec by name, a YAML file by path, or an inline mapping (a profile's ``environment:``)."""
    if isinstance(ref, EnvSpec):
        return ref
    if isinstance(ref, Mapping):
        return _from_mapping(ref, "")
    known = packaged()
    if ref in known:
        return known[ref]
    path = Path(ref)
    if not (ref.endswith((".yaml", ".yml")) or os.sep in ref) or not path.is_file():
        raise UsageError(f"environment {ref!r}: neither a packaged environment ({', '.join(known)})"
                         f" nor a YAML file")
    from specparity.schema import load_yaml_file

    raw = load_yaml_file(path, f"environment {path}")  # bounded: size, aliases, nesting
    if not isinstance(raw, Mapping):
        raise UsageError(f"environment {path}: expected a mapping of keys, got {type(raw).__name__}")
    return _from_mapping(raw, str(path), default_name=path.stem)


def _from_mapping(raw: Mapping[str, Any], source: str, default_name: str = "") -> EnvSpec:
    where = f"environment {source or dict(raw)}"
    known = {"name", "packages", "description", "imports", "with_specparity", "no_deps", "left_out", "python"}
    extra = sorted(map(str, set(raw) - known))
    if extra:
        raise UsageError(f"{where}: unknown keys {', '.join(map(str, extra))} (known: {', '.join(sorted(known))})")
    packages = raw.get("packages")
    imports = raw.get("imports") or []
    if not isinstance(packages, list) or not all(isinstance(p, str) for p in packages):
        raise UsageError(f"{where}: packages must be a list of pinned requirements (name==version)")
    if not isinstance(imports, list) or not all(isinstance(m, str) for m in imports):
        raise UsageError(f"{where}: imports must be a list of module names")
    name = str(raw.get("name") or default_name)
    if not name:
        raise UsageError(f"{where}: give it a name")
    with_specparity = raw.get("with_specparity", True)
    if not isinstance(with_specparity, bool):
        raise UsageError(f"{where}: with_specparity must be true or false")
    lists = {}
    for key in ("no_deps", "left_out"):
        value = raw.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise UsageError(f"{where}: {key} must be a list of strings")
        lists[key] = tuple(value)
    python = raw.get("python", "")
    if not isinstance(python, str | float):
        raise UsageError(f"{where}: python must be a version such as '3.13'")
    return EnvSpec(name=name, packages=tuple(packages), description=str(raw.get("description") or ""),
                   imports=tuple(imports), with_specparity=with_specparity, no_deps=lists["no_deps"],
                   left_out=lists["left_out"], python=str(python), source=source)


@dataclass(frozen=True)
class Environment:
    """A built environment.

    spec: what it was built from.
    path: its directory (``<cache>/<name>-<digest>``).
    manifest: what the build recorded (``specparity-env.json``): packages, python,
      build seconds, size in bytes, when and where it was built.
    """

    spec: EnvSpec
    path: Path
    manifest: dict[str, Any]

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def python(self) -> Path:
        """The environment's interpreter."""
        return interpreter(self.path)

    def packages(self) -> dict[str, str]:
        """Installed distributions, name -> version (recorded at build time; nothing is run)."""
        return dict(self.manifest.get("packages") or {})

    def identity(self) -> dict[str, Any]:
        """What a record's identity keeps about the environment a server or engine ran in."""
        return {
            "name": self.name,
            "digest": self.spec.digest,
            "path": str(self.path),
            "python": self.manifest.get("python"),
            "pins": list(self.spec.packages),
            "packages": self.packages(),
        }

    def environ(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """Process environment for running specparity's code here: ``base`` (default os.environ) plus
        ``$SPECPARITY_SOURCE`` naming the running checkout's package directories, without the caller's
        PYTHONPATH and PYTHONHOME (``$SPECPARITY_ENV_PYTHONPATH``, where set, is its PYTHONPATH)."""
        env = dict(os.environ if base is None else base)
        env[SOURCE_VAR] = json.dumps(source_mapping())
        env.pop("PYTHONPATH", None)
        env.pop("PYTHONHOME", None)
        if os.environ.get(PYTHONPATH_VAR):
            env["PYTHONPATH"] = os.environ[PYTHONPATH_VAR]
        return env

    def specparity_argv(self, *args: str) -> list[str]:
        """argv running ``specparity ARGS`` in this environment (with :meth:`environ`)."""
        return [str(self.python), "-P", "-m", "specparity.cli", *args]

    def has_module(self, module: str) -> bool:
        """Whether ``module`` is importable here (runs the interpreter once, finds without importing, its parent
        packages included: specparity.modfind)."""
        from specparity import modfind

        try:
            out = subprocess.run([str(self.python), "-P", modfind.__file__, module], env=self.environ(),
                                 capture_output=True, timeout=60, cwd=tempfile.gettempdir())
        except (OSError, subprocess.SubprocessError):
            return False
        return out.returncode == 0


def interpreter(env_dir: Path) -> Path:
    return env_dir / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")


def source_mapping() -> dict[str, str]:
    """The running checkout's package directories: {package: directory}, what the hook maps."""
    out = {}
    for name in SOURCE_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise InfrastructureError(f"package {name} has no directory: cannot run specparity in an environment")
        out[name] = str(Path(list(spec.submodule_search_locations)[0]).resolve())
    return out


def env_dir(spec: EnvSpec, root: Path | None = None) -> Path:
    """Where ``spec`` is (or would be) built: ``<root or cache_root()>/<name>-<digest>``."""
    return (root or cache_root()) / spec.dirname


def find_environment(ref: str | Mapping[str, Any] | EnvSpec, root: Path | None = None) -> Environment | None:
    """The built environment for ``ref`` (in ``root``, default :func:`cache_root`), or None.

    Nothing is built or run: offline and instant."""
    spec = load_spec(ref)
    return _read_built(spec, env_dir(spec, root))


def require_environment(ref: str | Mapping[str, Any] | EnvSpec) -> Environment:
    """The built environment for ``ref``; InfrastructureError naming the build command when missing."""
    spec = load_spec(ref)
    env = _read_built(spec, env_dir(spec))
    if env is None:
        raise InfrastructureError(f"environment {spec.name} is not built: run scripts/build-env {spec.name}"
                                  f" (or specparity env build {spec.name})")
    return env


def environment_at(path: str | os.PathLike) -> Environment | None:
    """The built environment in the directory ``path`` (as its manifest describes it), or None: not one.

    Nothing is run; a directory of any cache, current or stale, is read as it was built."""
    try:
        return read_environment_at(Path(path))
    except BrokenEnvironment:
        return None


def read_environment_at(path: Path) -> Environment | None:
    """:func:`environment_at`, with a directory whose manifest is there but unreadable, or not what a build
    writes, a :class:`BrokenEnvironment` (None: no manifest, not an environment)."""
    data = _read_manifest(path, path.name)
    if data is None:
        return None
    raw = data.get("spec")
    if not isinstance(raw, dict):
        raise BrokenEnvironment(path, path.name, f"its {MANIFEST} holds no spec")
    try:
        spec = _from_mapping({k: v for k, v in raw.items() if k in _SPEC_KEYS}, str(path / MANIFEST))
    except UsageError as err:
        raise BrokenEnvironment(path, path.name, f"its {MANIFEST} holds a spec this version refuses ({err})") from None
    return Environment(spec=spec, path=path, manifest=data)


_SPEC_KEYS = ("name", "packages", "description", "imports", "with_specparity")


class BrokenEnvironment(InfrastructureError):
    """A built environment's directory whose manifest cannot be read, or is not what a build writes (a
    corrupted cache): one line naming the directory and how to rebuild it (exit 4).

    path: the environment's directory. name: the name it is built by (the directory's when unknown).
    """

    def __init__(self, path: Path, name: str, why: str):
        self.path, self.name = path, name
        super().__init__(f"environment {name} at {path} is broken: {why}; rebuild it (specparity env remove"
                         f" {path.name}, then specparity env build {name})")


def _read_manifest(path: Path, name: str) -> dict[str, Any] | None:
    """The manifest of the environment in ``path``; None when there is none (not built)."""
    manifest = path / MANIFEST
    if not os.path.lexists(manifest):
        return None
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        cause = err.strerror if isinstance(err, OSError) and err.strerror else type(err).__name__
        raise BrokenEnvironment(path, name, f"its {MANIFEST} cannot be read ({cause})") from None
    why = _manifest_problem(data)
    if why is not None:
        raise BrokenEnvironment(path, name, f"its {MANIFEST} {why}")
    return data


def missing_module_message(module: str) -> str:
    """One line for a module this interpreter lacks: in a built environment, which one and how to rebuild it;
    elsewhere, which Python lacks it."""
    here = Path(sys.prefix)
    try:
        env = read_environment_at(here)
    except (BrokenEnvironment, UsageError):
        env = None
    if env is not None:
        return (f"environment {env.name} at {here} lacks the module {module} (a package missing from it):"
                f" rebuild it (specparity env remove {here.name}, then specparity env build {env.name})")
    return (f"this Python ({here}) lacks the module {module}: install specparity's dependencies there"
            " (pip install specparity, or pip install -e . in a checkout)")


def _manifest_problem(data: Any) -> str | None:
    """What makes ``data`` other than a manifest a build writes (None: nothing the readers rely on)."""
    if not isinstance(data, dict):
        return f"is a JSON {type(data).__name__}, not the mapping a build writes"
    packages = data.get("packages")
    if not isinstance(packages, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in packages.items()):
        return "has no packages mapping (name -> version)"
    for key, types in (("python", (str,)), ("built", (str,)), ("build_seconds", (int, float)),
                       ("size_bytes", (int,))):
        value = data.get(key)
        if value is not None and (not isinstance(value, types) or isinstance(value, bool)):
            return f"has a {key} of the wrong type ({type(value).__name__})"
    return None


def _read_built(spec: EnvSpec, path: Path) -> Environment | None:
    """The environment ``spec`` built in ``path``; None when not built (no manifest, or no interpreter:
    a build that never finished), :class:`BrokenEnvironment` when its manifest is corrupted."""
    if not interpreter(path).exists():
        return None
    data = _read_manifest(path, spec.name)
    return None if data is None else Environment(spec=spec, path=path, manifest=data)


def ensure_environment(ref: str | Mapping[str, Any] | EnvSpec, progress: Progress | None = None) -> Environment:
    """The built environment for ``ref``, building it first when missing (see the module docstring).

    A built one returns at once without the network. A pip failure (no package
    index reachable, no such version, conflicting pins) is an InfrastructureError
    with one line naming the cause and the kept build log.
    """
    spec = load_spec(ref)
    dest = env_dir(spec)
    say = progress or (lambda msg: log.info("%s", msg))
    built = _built_or_broken(spec, dest, say)
    if built is not None:
        return built
    base_interpreter(spec)  # a Python this machine lacks is said before anything is written
    root = cache_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"the environment cache {root} cannot be created ({err.strerror or type(err).__name__}):"
                         f" set {ENV_CACHE_VAR} or SPECPARITY_HOME to a directory of your own") from None
    with _lock(root / f".lock-{spec.dirname}", spec.name, say):
        built = _built_or_broken(spec, dest, say)
        if built is not None:
            return built
        return _build(spec, dest, say)


def _built_or_broken(spec: EnvSpec, dest: Path, say: Progress) -> Environment | None:
    """The built environment, or None to build it: a corrupted one is said and then rebuilt in its place."""
    try:
        return _read_built(spec, dest)
    except BrokenEnvironment as err:
        say(f"{err}: building it again")
        return None


@contextlib.contextmanager
def _lock(path: Path, name: str, say: Progress) -> Iterator[None]:
    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"environment {name}: waiting for another build or removal of it ({path})")
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _build(spec: EnvSpec, dest: Path, say: Progress) -> Environment:
    root = dest.parent
    # builds of this environment left by a killed process (the lock is ours: nobody is building them)
    for stale in root.glob(f".build-{spec.dirname}-*"):
        shutil.rmtree(stale, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=f".build-{spec.dirname}-", dir=root))
    failed_log = root / f"{spec.dirname}.failed.log"
    t0 = time.perf_counter()
    try:
        say(f"environment {spec.name}: building {dest} (in {work.name})")
        with open(work / BUILD_LOG, "w") as log_fh:
            _create(spec, work, say, log_fh)
            _pip_install(spec, work, say, log_fh, failed_log)
            _relocate(work, dest)
            if spec.with_specparity:
                write_source_hook(work)
            _check_imports(spec, work, say, log_fh, failed_log)
            packages = _installed(work)
        seconds = time.perf_counter() - t0
        size = tree_size(work)
        manifest = {
            "name": spec.name,
            "digest": spec.digest,
            "spec": spec.to_dict(),
            "requirements": spec.requirements(),
            "python": _version_of(interpreter(work)) or platform.python_version(),
            "base_python": str(base_interpreter(spec)),
            "packages": packages,
            "build_seconds": round(seconds, 1),
            "size_bytes": size,
            "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "host": socket.gethostname(),
        }
        (work / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        if dest.exists():
            # a broken earlier build (no manifest or no interpreter): out of the way, then replaced
            shutil.rmtree(dest)
        os.rename(work, dest)
        failed_log.unlink(missing_ok=True)
    except BaseException:
        if (work / BUILD_LOG).exists():
            shutil.copyfile(work / BUILD_LOG, failed_log)
        shutil.rmtree(work, ignore_errors=True)
        raise
    say(f"environment {spec.name}: built in {seconds:.0f} s, {size / 2**20:.0f} MiB: {dest}")
    env = _read_built(spec, dest)
    assert env is not None
    return env


def _version_of(python: Path | str) -> str | None:
    """``python``'s version (3.13.0), or None when it does not run."""
    try:
        out = subprocess.run([str(python), "-c", "import platform; print(platform.python_version())"],
                             capture_output=True, text=True, timeout=60, cwd=tempfile.gettempdir())
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def base_interpreter(spec: EnvSpec) -> Path:
    """The interpreter ``spec`` is built with: this one's base, or Python ``spec.python`` found on PATH or under
    pyenv's versions (``$PYENV_ROOT``, ~/.pyenv); InfrastructureError (exit 4) naming where it looked when none
    runs here."""
    if not spec.python or spec.python == ".".join(platform.python_version_tuple()[:2]):
        # the base interpreter, not this process's venv: the new environment sees none of its packages
        return Path(getattr(sys, "_base_executable", sys.executable))
    name = f"python{spec.python}"
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    candidates = [shutil.which(name), *sorted(glob.glob(str(pyenv / f"{spec.python}.*" / "bin" / name)), reverse=True),
                  f"/usr/bin/{name}", f"/usr/local/bin/{name}"]
    for c in candidates:
        version = _version_of(c) if c else None
        if version is not None and version.startswith(spec.python + "."):
            return Path(c)  # type: ignore[arg-type]
    raise InfrastructureError(f"environment {spec.name}: needs Python {spec.python}, and no {name} runs here"
                              f" (looked on PATH, in {pyenv} and /usr/bin): install Python {spec.python}")


def _create(spec: EnvSpec, work: Path, say: Progress, log_fh: IO[str]) -> None:
    base = base_interpreter(spec)
    say(f"environment {spec.name}: creating a virtual environment (python {_version_of(base)})")
    proc = subprocess.run([base, "-m", "venv", "--prompt", spec.name, str(work)], stdout=log_fh,
                          stderr=subprocess.STDOUT, cwd=tempfile.gettempdir())
    if proc.returncode != 0:
        raise InfrastructureError(f"environment {spec.name}: python -m venv failed (exit {proc.returncode});"
                                  f" see {work / BUILD_LOG}")


def _pip_install(spec: EnvSpec, work: Path, say: Progress, log_fh: IO[str], failed_log: Path) -> None:
    reqs = spec.requirements()
    say(f"environment {spec.name}: installing {len(spec.packages)} pinned packages"
        + (f" and specparity's {len(reqs) - len(spec.packages)} dependencies" if spec.with_specparity else "")
        + " with pip")
    _pip(spec, work, "requirements.txt", reqs, (), say, log_fh, failed_log)
    if spec.no_deps:
        say(f"environment {spec.name}: installing {', '.join(spec.no_deps)} without its declared dependencies"
            + (f" (left out: {'; '.join(spec.left_out)})" if spec.left_out else ""))
        _pip(spec, work, "no-deps.txt", list(spec.no_deps), ("--no-deps",), say, log_fh, failed_log)


def _pip(spec: EnvSpec, work: Path, file_name: str, reqs: list[str], flags: tuple[str, ...], say: Progress,
         log_fh: IO[str], failed_log: Path) -> None:
    """``pip install [flags] -r FILE`` of ``reqs`` into ``work``, its progress lines said; a failure is one
    InfrastructureError line naming the cause and the build log."""
    req_file = work / file_name
    req_file.write_text("".join(r + "\n" for r in reqs))
    argv = [str(interpreter(work)), "-m", "pip", "install", "--no-input", "--disable-pip-version-check", *flags,
            "-r", str(req_file)]
    log_fh.write("$ " + " ".join(argv) + "\n")
    log_fh.flush()
    lines: list[str] = []
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=tempfile.gettempdir())
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            log_fh.write(line)
            lines.append(line.rstrip())
            if line.startswith(_PIP_PROGRESS):
                # "Collecting x (from -r .../requirements.txt (line 3))": the package is enough
                short = line.split(" (from ", 1)[0].strip()
                say(f"  pip: {short[:160]}" + (" ..." if len(short) > 160 else ""))
        rc = proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log_fh.flush()
    if rc != 0:
        missing = _NOT_FOUND.search("\n".join(lines))
        if missing and not _NETWORK.search("\n".join(lines)):
            # pip says "no matching distribution" alike for a wrong pin and an index it could not
            # reach (it names the connection error only when it retries): ask once more, verbosely
            lines += _pip_verbose_lookup(work, missing.group(1), log_fh)
        raise InfrastructureError(f"environment {spec.name}: {pip_failure(lines)} (pip exit {rc};"
                                  f" the build log is {failed_log})")


def _pip_verbose_lookup(work: Path, requirement: str, log_fh: IO[str]) -> list[str]:
    argv = [str(interpreter(work)), "-m", "pip", "download", "-vv", "--no-deps", "--no-input",
            "--disable-pip-version-check", "-d", str(work / "lookup"), requirement]
    log_fh.write("$ " + " ".join(argv) + "\n")
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tempfile.gettempdir())
    except subprocess.TimeoutExpired:
        return ["Could not fetch URL (pip download timed out)"]
    text = out.stdout + out.stderr
    log_fh.write(text)
    return text.splitlines()


def pip_failure(lines: list[str]) -> str:
    """One line saying why pip failed, from its output."""
    text = "\n".join(lines)
    missing = _NOT_FOUND.search(text)
    what = missing.group(1) if missing else None
    if _NETWORK.search(text):
        return (f"pip could not reach a package index for {what}" if what
                else "pip could not reach a package index") + " (offline, or the index is down?)"
    if what:
        return f"no package index reachable here offers {what} (a wrong pin, or no index configured?)"
    if _CONFLICT.search(text):
        return "pip found the pins in conflict with each other or with specparity's dependencies"
    errors = [ln for ln in lines if ln.startswith("ERROR:")]
    return f"pip failed: {errors[-1][len('ERROR:'):].strip()}" if errors else "pip failed"


def _relocate(work: Path, dest: Path) -> None:
    """Rewrite the build directory's path to the final one in the scripts and pyvenv.cfg."""
    old, new = str(work).encode(), str(dest).encode()
    bindir = interpreter(work).parent
    for f in [*bindir.iterdir(), work / "pyvenv.cfg"]:
        if f.is_symlink() or not f.is_file():
            continue
        data = f.read_bytes()
        if old in data:
            f.write_bytes(data.replace(old, new))


HOOK_MODULE = "specparity_source_hook"
_HOOK = '''"""Import specparity from the checkout in $SPECPARITY_SOURCE (written by specparity.environments)."""
import importlib.util
import json
import os
import sys


class SourceFinder:
    def __init__(self, mapping):
        self.mapping = mapping

    def find_spec(self, fullname, path=None, target=None):
        directory = self.mapping.get(fullname)
        if directory is None:
            return None
        return importlib.util.spec_from_file_location(
            fullname, os.path.join(directory, "__init__.py"), submodule_search_locations=[directory])


def install():
    raw = os.environ.get("SPECPARITY_SOURCE")
    if raw:
        sys.meta_path.insert(0, SourceFinder(json.loads(raw)))
'''


def _site_packages(env: Path) -> Path:
    found = sorted(env.glob("lib/python*/site-packages")) or sorted(env.glob("Lib/site-packages"))
    if not found:
        raise InfrastructureError(f"environment {env}: no site-packages directory")
    return found[0]


def write_source_hook(env: Path) -> None:
    """Install the hook that imports specparity from ``$SPECPARITY_SOURCE`` into the environment ``env``."""
    site = _site_packages(env)
    (site / f"{HOOK_MODULE}.py").write_text(_HOOK)
    (site / f"{HOOK_MODULE}.pth").write_text(f"import {HOOK_MODULE}; {HOOK_MODULE}.install()\n")


def _check_imports(spec: EnvSpec, work: Path, say: Progress, log_fh: IO[str], failed_log: Path) -> None:
    modules = list(spec.imports) + (["specparity.cli", "specparity.harness.lifecycle"] if spec.with_specparity
                                    else [])
    if not modules:
        return
    say(f"environment {spec.name}: checking that it imports {', '.join(modules)}")
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\n"
    env = dict(os.environ, **{SOURCE_VAR: json.dumps(source_mapping())})
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([str(interpreter(work)), "-P", "-c", code, *modules], capture_output=True, text=True,
                          env=env, cwd=tempfile.gettempdir(), timeout=600)
    log_fh.write(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        raise InfrastructureError(f"environment {spec.name}: built, but importing {', '.join(modules)} failed:"
                                  f" {tail[-1] if tail else 'exit ' + str(proc.returncode)}"
                                  f" (the build log is {failed_log})")


def _installed(work: Path) -> dict[str, str]:
    code = ("import importlib.metadata as m, json\n"
            "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))")
    out = subprocess.run([str(interpreter(work)), "-P", "-c", code], capture_output=True, text=True,
                         cwd=tempfile.gettempdir(), timeout=120, check=True)
    found: dict[str, str] = json.loads(out.stdout)
    return dict(sorted(found.items(), key=lambda kv: kv[0].lower()))


def tree_size(path: Path) -> int:
    """Bytes of the regular files under ``path`` (links not followed)."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            p = os.path.join(dirpath, f)
            if not os.path.islink(p):
                total += os.path.getsize(p)
    return total


@dataclass(frozen=True)
class Listed:
    """One row of :func:`list_environments`.

    name: the environment's name; dirname: its directory name (name-digest).
    spec: the packaged spec of that name (None for a directory no packaged spec names).
    environment: the built environment (None: not built).
    current: the directory is the one the spec builds today (False: an older digest, left by a
      changed pin or specparity dependency; ``specparity env remove DIRNAME`` deletes it).
    broken: why the directory's manifest is unusable and how to rebuild it (None: not broken); a
      broken directory has no ``environment``.
    """

    name: str
    dirname: str
    spec: EnvSpec | None
    environment: Environment | None
    current: bool
    broken: str | None = None

    def to_dict(self) -> dict[str, Any]:
        env = self.environment
        return {"name": self.name, "dirname": self.dirname, "built": env is not None, "current": self.current,
                "path": str(env.path) if env else None,
                "python": str(env.python) if env else None,
                "description": self.spec.description if self.spec else "",
                "pins": list(self.spec.packages) if self.spec else [],
                "build_seconds": env.manifest.get("build_seconds") if env else None,
                "size_bytes": env.manifest.get("size_bytes") if env else None,
                "broken": self.broken}


def list_environments() -> list[Listed]:
    """Packaged specs (built or not), then every other built directory in the cache."""
    rows = []
    current = set()
    known = packaged()
    for spec in known.values():
        current.add(spec.dirname)
        try:
            rows.append(Listed(spec.name, spec.dirname, spec, _read_built(spec, env_dir(spec)), True))
        except BrokenEnvironment as err:
            rows.append(Listed(spec.name, spec.dirname, spec, None, True, broken=str(err)))
    root = cache_root()
    if root.is_dir():
        for d in sorted(root.iterdir()):
            if d.name.startswith(".") or d.name in current:
                continue
            try:
                env = read_environment_at(d)
            except BrokenEnvironment as err:
                rows.append(Listed(d.name, d.name, None, None, False, broken=str(err)))
                continue
            if env is not None:
                rows.append(Listed(env.name, d.name, known.get(env.name), env, env.spec.dirname == d.name))
    return rows


def remove_environment(ref: str, progress: Progress | None = None) -> Path | None:
    """Delete the built environment ``ref`` (a spec name, YAML path, or a directory name from
    :func:`list_environments`); returns the directory removed (None: nothing was built)."""
    say = progress or (lambda msg: log.info("%s", msg))
    root = cache_root()
    if _NAME.fullmatch(ref) and os.path.lexists(root / ref / MANIFEST):
        target = root / ref
    else:
        target = env_dir(load_spec(ref))
    if not target.exists():
        return None
    with _lock(root / f".lock-{target.name}", target.name, say):
        # renamed first, so nothing can find a half-deleted environment
        trash = Path(tempfile.mkdtemp(prefix=f".remove-{target.name}-", dir=root))
        os.rename(target, trash / target.name)
        shutil.rmtree(trash, ignore_errors=True)
    say(f"removed {target}")
    return target
