"""The engine registry: every engine the toolkit checks, one package each, found as a plugin is found.

An engine is one package (``specparity/engines/<name>/`` for a built-in, any package of
a distribution for an outside one) whose ``__init__`` defines ``ENGINE = EngineSpec(...)``:
its name, the module it needs, its pinned environment(s), its served profile(s) and
hooks, its in-process adapter, its own loops, its e2e entry points and its
drafter-format fixture builder; the package holds their code (``adapter.py``,
``loops.py``, ``served.py``, ``fixtures.py``, ``<profile>.yaml``: only the parts the
engine has). Commands take their ``--engine`` choices and default from here and never
name an engine; consent to run a checkpoint's code, the environment an engine runs in
and the re-run there are decided here, once, for every engine.

Where engines come from, in this order (a later one with a taken name is refused):

1. the ``specparity.engines`` entry-point group (``importlib.metadata``): specparity's
   own pyproject.toml registers the built-ins there exactly as an outside distribution
   registers its engine (``[project.entry-points."specparity.engines"]``, ``name =
   "package:ENGINE"``, the entry point named as the engine): mlx-lm (the default)
   first, then every other installed distribution's, by name. Where specparity runs
   from a checkout without installed metadata (a pinned environment's processes), its
   own come from that checkout's pyproject.toml;
2. ``$SPECPARITY_ENGINES``: a developer's override, comma-separated importable
   module paths (``SPECPARITY_ENGINES=my_pkg.my_engine`` or ``my_pkg:ENGINE``), reached
   by every command without installing anything.

The contract (stable; a change is said in the commit that makes it):

``EngineSpec`` fields (every reference to code is a ``"module:attr"`` string or
the object itself; strings are imported only when used, so nothing here imports
mlx, an engine, or a layer above this one):

    name           the ``--engine`` value and the record's engine name (``dflash-mlx``)
    description    one line for ``--help``
    module         the Python module that must import for in-process work (None: the
                   engine runs wherever specparity does); importability is asked here
                   only (:meth:`EngineSpec.importable`)
    environments   pinned environments (:class:`PinnedEnv`): packaged under their
                   names for ``specparity env``; the first is where a command re-runs
                   itself when ``module`` does not import here
    profiles       the served profiles that run this engine (names or YAML paths);
                   a profile's ``engine:`` key names its engine (``dflash-mlx``, or
                   the module form ``dflash_mlx``)
    hooks          the module of served hooks (see :class:`ServedHooks`), or None
    adapter        ``load(request: LoadRequest) -> Engine`` (the in-process adapter,
                   :class:`specparity.probes.engines.base.Engine`), or None (served only)
    adapter_features  the optional features its adapter supports that a command must know
                   before anything loads (names of
                   :data:`specparity.probes.engines.base.FEATURES`; the loaded adapter is
                   checked to hold them): ``replay`` runs an accept vector, a served log,
                   ``--algebra-only``, ``--locate`` and ``--sequence`` through the replay core
                   with rewind offsets when they hold ``anchor-prefill``, ``layer-offsets`` and
                   ``rewind-modes``, and through the whole-state replay otherwise
    e2e_entry_points  the names of the engine's own e2e entry points
    e2e_options    its entry points take mlx-lm's generation options (``--num-draft-tokens``,
                   ``--max-kv-size``, the processors...), the prompt as text and the chat template
                   (False: they run with their own defaults, and e2e refuses those options)
    e2e            ``run(adapter, classic: Loaded, prompt: list[int], max_tokens: int,
                   entry_points: list[str], observer) -> E2ERun``, or None (with ``loops``: their
                   driver, :data:`OWN_LOOPS_E2E`)
    loops          the engine's own generate loops against classic decode (its package's ``loops.py``):
                   ``loops(target, draft, prompt, max_tokens, classic, entries) -> list[Finding]``
                   (:mod:`specparity.probes.engine_e2e`); the e2e of an engine checked through its loops
                   (``specparity.probes.engine_e2e:run_own_loops_e2e``, ``e2e``'s default), the findings table and the
                   bench all drive them, nothing else
    default_checkpoints  ``() -> (target, draft | None)``: what ``--model`` defaults to (None: its
                   drafter format's default fixture where the format names one, :attr:`DrafterFormat.default`,
                   else the toolkit's embedded fixture pair)
    drafter_format the drafter format its fixtures are built in (:class:`DrafterFormat`), or
                   None (mlx-lm's plain pairs): ``specparity fixtures make --drafter-format NAME``
                   takes its choices from here, and ``--model FIXTURE/target`` finds the
                   drafter beside a target of that ``kind`` (:attr:`EngineSpec.fixture_kind`)
    verify_modes   values ``--verify-mode`` takes for this engine (its own policies)
    drafter_checkpoint  the engine drafts from a drafter checkpoint beside the target (False: its draft
                   heads live in the target, as MTP heads do: no ``--draft-model`` is asked for)
    builds_on      the engines whose packages this one imports (dfly-mlx runs on dflash-mlx's verify and
                   loop): their names may be code in its package
    warm           the work the engine does at its first start on a machine (a module with
                   ``is_warm(env) -> bool`` and ``warm(env) -> exit code``), done once by
                   ``scripts/warm-engines`` before the tests; None: none

Functions: :func:`drafter_formats` (every drafter format the engines declare, by name: what
``fixtures make --drafter-format`` offers), :func:`names` (every engine, the default first; ``in_process=True``: those
with an adapter, what ``--engine`` offers), :func:`get` (by name,
UsageError naming the choices), :data:`DEFAULT`, :func:`for_profile` (a profile's
``engine:`` key), :func:`served_hooks` (a profile's hooks, a no-op where none),
:func:`require_consent` (refuse a checkpoint's code without ``--trust-remote-code``,
before anything loads), :meth:`EngineSpec.load` (consent, then the adapter).
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from specparity.errors import InfrastructureError, UsageError

log = logging.getLogger(__name__)

# the engine commands use when --engine is not given
DEFAULT = "mlx-lm"
# comma-separated module paths (``module`` or ``module:ATTR``) of engines a developer adds without installing them
ENGINES_VAR = "SPECPARITY_ENGINES"
# the entry-point group every engine is registered in, the built-ins by specparity's own pyproject.toml
GROUP = "specparity.engines"
BUILTIN = "specparity"
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")

Ref = str | Callable[..., Any] | ModuleType | None


def resolve(ref: Ref, what: str = "") -> Any:
    """The object a ``"module:attr"`` reference names (an object is itself; None stays None)."""
    if ref is None or not isinstance(ref, str):
        return ref
    module, _, attr = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in filter(None, attr.split(".")):
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True)
class PinnedEnv:
    """A pinned environment an engine runs in (built by :mod:`specparity.environments`).

    name: as ``specparity env list`` shows it. packages: the engine's own pins (``name==version``);
    the environment adds the mlx and transformers every packaged environment shares.
    description: one line. imports: modules the build imports once to prove it works.
    no_deps: pins installed after the rest without their declared dependencies (a package one of whose
    dependencies has no build for this platform: list what it needs of the others in ``packages``).
    left_out: what that leaves out and why, one line each (``env show`` says it). python: the Python
    version to build it with (``"3.13"``; '' the toolkit's own): a version not found here is exit 4 naming it.
    """

    name: str
    packages: tuple[str, ...]
    description: str = ""
    imports: tuple[str, ...] = ()
    no_deps: tuple[str, ...] = ()
    left_out: tuple[str, ...] = ()
    python: str = ""

    def __post_init__(self) -> None:
        where = f"pinned environment {self.name!r}"
        _check(where, "name", self.name, str)
        _check_strings(where, "packages", self.packages)
        _check(where, "description", self.description, str)
        _check_strings(where, "imports", self.imports)
        _check_strings(where, "no_deps", self.no_deps)
        _check_strings(where, "left_out", self.left_out)
        _check(where, "python", self.python, str)


def _kind(value: Any) -> str:
    return "None" if value is None else f"a {type(value).__name__}"


def _check(where: str, field_name: str, value: Any, *types: type) -> None:
    """``value`` is one of ``types``: else a one-line UsageError naming the field (a user's spec, at registration)."""
    if not isinstance(value, types) or isinstance(value, bool) and bool not in types:
        want = " or ".join("None" if t is type(None) else t.__name__ for t in types)
        raise UsageError(f"{where}: {field_name} must be {want}, not {_kind(value)} ({value!r:.60})")


def _check_strings(where: str, field_name: str, value: Any) -> None:
    if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
        raise UsageError(f"{where}: {field_name} must be a tuple of strings, not {_kind(value)} ({value!r:.60})")


def _check_ref(where: str, field_name: str, value: Any, module: bool = False) -> None:
    """A code reference: None, a callable (a module, where ``module``), or an absolute ``module:attr`` (``module``
    for a module reference) string."""
    if value is None or callable(value) or (module and isinstance(value, ModuleType)):
        return
    if not isinstance(value, str):
        raise UsageError(f"{where}: {field_name} must be a 'module:attr' string or the object, not {_kind(value)}")
    mod, _, attr = value.partition(":")
    if not _MODULE.fullmatch(mod) or (not module and not attr) or (module and attr):
        shape = "an absolute module path" if module else "an absolute 'module.path:attr'"
        raise UsageError(f"{where}: {field_name} {value!r} is not {shape} (no relative import)")


_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


@dataclass(frozen=True)
class LoadRequest:
    """What a command hands an engine's adapter loader.

    target / draft: checkpoint directories (draft None: the target alone). trust_remote_code: the
    user's consent, already checked against both (:func:`require_consent`). verify_mode: the engine's
    own verify policy (None: its default). prefill_step_size: None: the engine's default.
    cache: the cache options (:class:`specparity.decode.CacheOptions`) for an adapter that supports
    them (its ``features`` hold ``cache-options``); None: the defaults. loaded: the target as the
    toolkit's loader already loaded it (:class:`specparity.checkpoint.Loaded`) from ``target``, for
    a loader that takes it rather than loading again (None: load ``target``).
    """

    target: Path
    draft: Path | None = None
    trust_remote_code: bool = False
    verify_mode: str | None = None
    prefill_step_size: int | None = None
    cache: Any = None
    loaded: Any = None


# the format ``fixtures make --dflash SHAPE`` builds when --drafter-format is not given
DEFAULT_DRAFTER_FORMAT = "dflash"


@dataclass(frozen=True)
class DrafterFormat:
    """A drafter format an engine reads, and the builder of a fixture in it.

    name   the ``--drafter-format`` value and the ``kind`` the fixture's ``fixture.json`` holds;
           engines that read the same format declare the same name and builder
    build  ``(out_dir, *, shape, dtype, tied, block_size, seed, overwrite, note) ->``
           :class:`specparity.fixtures.MadeFixture` (``block_size``: the verify rows asked, None: the
           format's own default; ``note``: a progress line before a long build)
    help   what it is, one line for ``--help``
    shapes the ``--dflash`` target shapes its builder takes (empty: every shape the DFlash formats build;
           the findings table builds these)
    default the fixture ``--model`` defaults to for an engine that reads this format and names no
           ``default_checkpoints`` of its own: ``fixtures make``'s arguments (``shape``, ``tied``,
           ``block_size``; float32, seed 0), built once into the fixtures home (None: the embedded pair,
           which such an engine cannot load, so a format an engine runs its loops on names one)
    """

    name: str
    build: Ref
    help: str = ""
    shapes: tuple[str, ...] = ()
    default: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        where = f"drafter format {self.name!r}"
        _check(where, "name", self.name, str)
        if not _NAME.match(self.name) or len(self.name) > 64:
            # it names a --drafter-format choice and the kind a fixture.json holds: no path separator or newline
            raise UsageError(f"{where}: a name is lowercase letters, digits, '.', '_' and '-' (at most 64)")
        _check_ref(where, "build", self.build)
        _check(where, "help", self.help, str)
        if not isinstance(self.shapes, tuple) or not all(isinstance(x, str) and x for x in self.shapes):
            raise UsageError(f"{where}: shapes is a tuple of shape names")
        if self.default is not None and (not isinstance(self.default, Mapping)
                                         or set(self.default) - {"shape", "tied", "block_size"}
                                         or not isinstance(self.default.get("shape", ""), str)
                                         or not isinstance(self.default.get("tied", False), bool)
                                         or not isinstance(self.default.get("block_size", 0), int | None)):
            raise UsageError(f"{where}: default is a mapping of shape (a name), tied (true or false) and"
                             " block_size (an integer)")

    def default_fixture(self) -> tuple[Path, Path | None]:
        """The :attr:`default` fixture's ``(target, draft | None)``, built once (a progress line on stderr the
        first time)."""
        import sys

        from specparity.fixtures import fixtures_home

        assert self.default is not None
        shape = str(self.default.get("shape") or (self.shapes[0] if self.shapes else "qwen3"))
        tied, block = bool(self.default.get("tied", False)), self.default.get("block_size")
        out = fixtures_home() / (f"{self.name}-{shape}-float32-{'tied' if tied else 'untied'}"
                                 + (f"-b{block}" if block else ""))
        made = self.make(str(out), shape=shape, dtype="float32", tied=tied, block_size=block, seed=0,
                         overwrite=False, note=lambda msg: print(msg, file=sys.stderr, flush=True))
        draft = made.record.get("draft")
        return Path(made.record["target"]), Path(draft) if draft else None

    def make(self, out_dir: str, *, shape: str, dtype: str, tied: bool, block_size: int | None, seed: int,
             overwrite: bool, note: Callable[[str], None]) -> Any:
        from specparity.fixtures import FixtureMismatch, MadeFixture
        from specparity.fixtures.build_cache import through_cache

        builder = resolve(self.build)
        args = {"shape": shape, "dtype": dtype, "tied": tied, "block_size": block_size, "seed": seed}

        def build(again: bool) -> MadeFixture:
            made = builder(out_dir, **args, overwrite=again, note=note)
            if not isinstance(made, MadeFixture):  # before the build cache keeps what it made
                raise UsageError(f"drafter format {self.name}: its builder {self.build!r} returned {_kind(made)},"
                                 " not the MadeFixture(record, lines) a builder returns")
            return made

        try:
            return through_cache(self.name, builder, out_dir, args, overwrite, note, build)
        except FixtureMismatch as err:  # a builder that left it in its own words: the command's flags
            raise err.as_flags(out_dir) from None


# the e2e of every engine that declares its own loops (EngineSpec.e2e's default when loops are given)
OWN_LOOPS_E2E = "specparity.probes.engine_e2e:run_own_loops_e2e"


@dataclass(frozen=True)
class EngineSpec:
    """One engine, everything about it in one place (the fields: the module docstring)."""

    name: str
    description: str = ""
    module: str | None = None
    environments: tuple[PinnedEnv, ...] = ()
    profiles: tuple[str, ...] = ()
    hooks: str | ModuleType | None = None
    adapter: Ref = None
    adapter_features: frozenset[str] = frozenset()
    e2e_entry_points: tuple[str, ...] = ()
    e2e_options: bool = False
    e2e: Ref = None
    loops: Ref = None
    default_checkpoints: Ref = None
    drafter_format: DrafterFormat | None = None
    verify_modes: tuple[str, ...] = ()
    drafter_checkpoint: bool = True
    warm: str | ModuleType | None = None
    builds_on: tuple[str, ...] = ()
    source: str = field(default="", compare=False)
    distribution: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        _check("engine", "name", self.name, str)
        if not _NAME.match(self.name):
            raise UsageError(f"engine {self.name!r}: a name is lowercase letters, digits, '.', '_' and '-'")
        # every field a command reads, typed here: a user's spec of the wrong shape is one line naming the field
        # when it registers, never a crash of a command later (issue 44)
        where = f"engine {self.name}"
        _check(where, "description", self.description, str)
        _check(where, "module", self.module, str, type(None))
        if self.module is not None and not _MODULE.fullmatch(self.module):
            raise UsageError(f"{where}: module {self.module!r} is not an absolute module path")
        if not isinstance(self.environments, tuple) or not all(isinstance(e, PinnedEnv) for e in self.environments):
            raise UsageError(f"{where}: environments must be a tuple of PinnedEnv, not {_kind(self.environments)}")
        _check_strings(where, "profiles", self.profiles)
        _check_strings(where, "e2e_entry_points", self.e2e_entry_points)
        _check_strings(where, "verify_modes", self.verify_modes)
        _check_strings(where, "builds_on", self.builds_on)
        for field_name in ("adapter", "e2e", "loops", "default_checkpoints"):
            _check_ref(where, field_name, getattr(self, field_name))
        if self.e2e is None and self.loops is not None:
            # an engine's loops are its e2e: one driver for every engine that declares them
            object.__setattr__(self, "e2e", OWN_LOOPS_E2E)
        for field_name in ("hooks", "warm"):
            _check_ref(where, field_name, getattr(self, field_name), module=True)
        if not isinstance(self.adapter_features, frozenset) or not all(isinstance(f, str) for f in
                                                                        self.adapter_features):
            raise UsageError(f"{where}: adapter_features must be a frozenset of strings, not"
                             f" {_kind(self.adapter_features)}")
        _check(where, "drafter_format", self.drafter_format, DrafterFormat, type(None))
        _check(where, "drafter_checkpoint", self.drafter_checkpoint, bool)
        _check(where, "e2e_options", self.e2e_options, bool)

    def __str__(self) -> str:
        # a command's --engine is resolved once, to its spec (the option type), and said by its name
        return self.name

    @property
    def key(self) -> str:
        """The name as a profile's ``engine:`` key may also write it (``dflash_mlx``)."""
        return profile_key(self.name)

    @property
    def fixture_kind(self) -> str | None:
        """The ``kind`` its fixtures' ``fixture.json`` holds (its drafter format's name; None: none)."""
        return self.drafter_format.name if self.drafter_format is not None else None

    @property
    def in_process(self) -> bool:
        return self.adapter is not None

    def not_offered(self, command: str) -> str:
        """Why ``command`` (probe, replay, bisect: a verify adapter's; e2e: entry points) cannot take this
        engine, and where it runs instead, one line."""
        served = f"specparity served --profile {self.profiles[0] if self.profiles else 'FILE'}"
        if command == "e2e":
            return f"engine {self.name}: no e2e entry points (it is checked served: {served})"
        elsewhere = (f"its own loops run under specparity e2e --engine {self.name}" if self.e2e is not None
                     else f"it is served only: {served}")
        return f"engine {self.name}: no in-process verify adapter for {command} ({elsewhere})"

    def importable(self) -> bool:
        """``module`` imports in this interpreter (None: always)."""
        return self.module is None or importable(self.module)

    @property
    def environment(self) -> PinnedEnv | None:
        """Where the engine re-runs when ``module`` does not import here (its first environment)."""
        return self.environments[0] if self.environments else None

    @property
    def python_var(self) -> str:
        """``SPECPARITY_DFLASH_MLX_PYTHON`` for ``dflash-mlx``: an interpreter that has the engine."""
        return "SPECPARITY_" + re.sub(r"[^A-Z0-9]", "_", self.name.upper()) + "_PYTHON"

    def load(self, request: LoadRequest) -> Any:
        """The engine's in-process adapter on ``request``'s checkpoints, after consent is checked."""
        if self.adapter is None:
            raise UsageError(f"engine {self.name}: no in-process adapter (served only)")
        require_consent([("--model", request.target), ("--draft-model", request.draft)],
                        request.trust_remote_code)
        return self.code("adapter")(request)

    def code(self, field_name: str) -> Any:
        """The object a code field of this spec names (``adapter``, ``loops``, ...), imported now; a module it
        names that does not import is one line naming the engine, where it was registered and the module."""
        ref = getattr(self, field_name)
        try:
            return resolve(ref)
        except ModuleNotFoundError as err:
            own = isinstance(ref, str) and err.name is not None and (
                ref.partition(":")[0] == err.name or ref.partition(":")[0].startswith(err.name + "."))
            whence = f"registered by {self.source} ({self.distribution or ENGINES_VAR})"
            if own:
                raise UsageError(f"engine {self.name}: its {field_name} {ref!r} names the module {err.name}, which"
                                 f" does not exist ({whence})") from None
            import sys

            raise InfrastructureError(f"engine {self.name}: its {field_name} needs the module {err.name}, which this"
                                      f" Python ({sys.prefix}) lacks ({whence})") from err
        except AttributeError as err:
            raise UsageError(f"engine {self.name}: its {field_name} {ref!r} names nothing there ({err})") from None

    def profile_files(self) -> dict[str, Path]:
        """Its profiles that live in its own package, by name (``NAME.yaml`` beside its ``__init__``): what
        ``served --profile NAME`` finds; a single-module engine's profiles are given by path."""
        import importlib.util

        if not self.source:
            return {}
        try:
            found = importlib.util.find_spec(self.source)
        except (ImportError, ValueError):
            return {}
        if found is None or not found.submodule_search_locations or not found.origin:
            return {}
        folder = Path(found.origin).parent
        return {name: folder / f"{name}.yaml" for name in self.profiles if (folder / f"{name}.yaml").is_file()}

    def served_hooks(self) -> ServedHooks:
        return ServedHooks(self.name, _hooks_module(self.hooks))

    def served_checkpoints(self) -> tuple[Path, Path] | None:
        """What a served job on this engine's profiles defaults to: :meth:`checkpoints` as :meth:`drafting_pair`
        (None: the embedded pair, or a default with no drafter)."""
        found = self.checkpoints()
        return None if found is None else self.drafting_pair(*found)

    def drafting_pair(self, target: Path, draft: Path | None) -> tuple[Path, Path] | None:
        """``(target, draft)`` as a drafted arm runs them: the target as its own drafter where its draft heads live
        in it; None where there is no drafter."""
        if draft is None and not self.drafter_checkpoint:
            draft = target
        return (target, draft) if draft is not None else None

    def checkpoints(self) -> tuple[Path, Path | None] | None:
        """The default ``(target, draft)``: :attr:`default_checkpoints`'s, else its drafter format's default fixture
        (:meth:`DrafterFormat.default_fixture`); None: the toolkit's embedded fixture pair."""
        fn = resolve(self.default_checkpoints)
        if fn is None:
            if self.drafter_format is not None and self.drafter_format.default is not None:
                return self.drafter_format.default_fixture()
            return None
        target, draft = fn()
        return Path(target), Path(draft) if draft is not None else None


def importable(module: str) -> bool:
    """``module`` can be imported in this interpreter: the one place the toolkit asks (an engine's
    module, a profile's ``requires_module``); a missing parent package is a missing module, not an error.
    Its parent packages are found, not imported (specparity.modfind)."""
    from specparity.modfind import found

    return found(module)


def profile_key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "_", name.lower())


def _hooks_module(hooks: str | ModuleType | None) -> ModuleType | None:
    if hooks is None or isinstance(hooks, ModuleType):
        return hooks
    # imported on every call: a missing dependency of the hooks module is a bug to show, each time
    return importlib.import_module(hooks)


class ServedHooks:
    """An engine's served hooks, each a no-op where its module does not define it.

    A hooks module may define any of:

        placeholders() -> dict[str, str]
            values of engine-specific argv placeholders (llama.cpp: ``{llama_server}``)
        unavailable() -> str | None
            why the engine cannot run here (None: it can); a pairing on it is ``error``
        prepare_checkpoint(path: str, role: str) -> str
            the checkpoint as the server loads it (llama.cpp: a GGUF export, made once)
        extra_argv(drafts: bool, server_dir: Path) -> list[str]
            argv appended to one server's (``server_dir``: the folder the record keeps for it)
        max_width(draft: str) -> int | None
            the widest verify block the engine takes with this drafter (None: no limit; 0: it
            cannot draft with it). A wider arm is not run, with the reason (never clamped)
        prompt_ids(client, url, request) -> list[int] | None
            the prompt tokens the server decodes a request from, asked of the server itself
        mark(session) -> Any / evidence(session, completion, mark) -> EngineEvidence | None
            the engine's own evidence over one request (``specparity.harness.engines.EngineEvidence``)
        reproduction(model, draft, body, prompt_ids, width, first) -> dict | None
            the command that reproduces a served finding with the engine in process, or why none does
    """

    def __init__(self, name: str, module: ModuleType | None = None):
        self.name = name
        self.module = module

    def _hook(self, hook: str) -> Any:
        return getattr(self.module, hook, None) if self.module is not None else None

    def placeholders(self) -> dict[str, str]:
        fn = self._hook("placeholders")
        return dict(fn()) if fn is not None else {}

    def unavailable(self) -> str | None:
        fn = self._hook("unavailable")
        return fn() if fn is not None else None

    def prepare_checkpoint(self, path: str, role: str) -> str:
        fn = self._hook("prepare_checkpoint")
        return str(fn(path, role)) if fn is not None else path

    def extra_argv(self, drafts: bool, server_dir: Path) -> list[str]:
        fn = self._hook("extra_argv")
        return [str(a) for a in fn(drafts, server_dir)] if fn is not None else []

    def max_width(self, draft: str) -> int | None:
        fn = self._hook("max_width")
        return fn(draft) if fn is not None else None

    @property
    def tokenizes_itself(self) -> bool:
        """Whether the server says which prompt tokens it decoded (classic decode then starts from those)."""
        return self._hook("prompt_ids") is not None

    def prompt_ids(self, client: Any, url: str, request: Any) -> list[int] | None:
        fn = self._hook("prompt_ids")
        return fn(client, url, request) if fn is not None else None

    def mark(self, session: Any) -> Any:
        fn = self._hook("mark")
        return fn(session) if fn is not None else None

    def evidence(self, session: Any, completion: Any, mark: Any) -> Any:
        fn = self._hook("evidence")
        return fn(session, completion, mark) if fn is not None else None

    def reproduction(self, *, model: str, draft: str | None, body: dict[str, Any], prompt_ids: list[int] | None,
                     width: int | None, first: bool) -> dict[str, Any] | None:
        fn = self._hook("reproduction")
        return fn(model=model, draft=draft, body=body, prompt_ids=prompt_ids, width=width,
                  first=first) if fn is not None else None


GENERIC = ServedHooks("generic")

_REGISTRY: dict[str, EngineSpec] | None = None
_REGISTRY_FOR: str | None = None


@dataclass(frozen=True)
class Registration:
    """Where an engine was registered: ``ref`` (``module:ATTR``, the spec), ``origin`` (``specparity`` for a
    built-in, ``DIST VERSION`` for an installed distribution's entry point, or ``$SPECPARITY_ENGINES``) and the
    entry point's name (None for the variable's modules), which must be the spec's name."""

    ref: str
    origin: str
    entry: str | None = None

    @property
    def builtin(self) -> bool:
        return self.origin == BUILTIN

    @property
    def module(self) -> str:
        return self.ref.partition(":")[0]

    def where(self) -> str:
        """How an error names it: the variable and the module, or the distribution and its entry point."""
        if self.origin == ENGINES_VAR:
            return f"{ENGINES_VAR}: engine module {self.module}"
        return f"engine entry point {self.entry} = {self.ref} ({self.origin})"


def _canonical(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def _pyproject_builtins() -> list[Registration]:
    """The built-ins from the checkout's pyproject.toml, where specparity runs from its source without installed
    metadata (a pinned environment's processes: ``specparity.environments``' source hook)."""
    import tomllib

    path = Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        table = tomllib.loads(path.read_text())["project"]["entry-points"][GROUP]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return [Registration(str(ref), BUILTIN, str(name)) for name, ref in table.items()]


_POINTS: tuple[Any, list[Any]] | None = None


def _entry_points() -> list[Any]:
    """The group's installed entry points, read again only where an import path or a folder on it changed (a
    distribution installed or removed changes its site-packages folder): reading every distribution's metadata
    takes ~25 ms, and a diagnosis asks for the registry at every step."""
    import sys
    from importlib import metadata

    global _POINTS
    stamp: list[Any] = []
    for entry in sys.path:
        try:
            stamp.append((entry, os.stat(entry or ".").st_mtime_ns))
        except OSError:
            stamp.append((entry, None))
    if _POINTS is None or _POINTS[0] != stamp:
        _POINTS = (stamp, list(metadata.entry_points(group=GROUP)))
    return list(_POINTS[1])


_REGISTRATIONS: tuple[Any, list[Registration]] | None = None


def registrations() -> list[Registration]:
    """Every engine registration, in order: specparity's own (its ``specparity.engines`` entry points), every
    other installed distribution's (by entry-point name), then ``$SPECPARITY_ENGINES``'s modules. Kept while the
    entry points and ``$SPECPARITY_ENGINES`` are what they were (each entry point's distribution name is read
    from its metadata file: 18 ms a time, and an engine's every error asked for them)."""
    global _REGISTRATIONS
    points = _entry_points()
    assert _POINTS is not None
    key = (tuple(_POINTS[0]), os.environ.get(ENGINES_VAR, ""))
    if _REGISTRATIONS is not None and _REGISTRATIONS[0] == key:
        return list(_REGISTRATIONS[1])
    regs = _registrations(points)
    _REGISTRATIONS = (key, regs)
    return list(regs)


def _registrations(points: list[Any]) -> list[Registration]:
    def own(ep: Any) -> bool:
        return ep.dist is not None and _canonical(ep.dist.name) == BUILTIN
    builtin = [Registration(ep.value, BUILTIN, ep.name) for ep in points if own(ep)] or _pyproject_builtins()
    others = [Registration(ep.value, f"{ep.dist.name} {ep.dist.version}" if ep.dist is not None else "?", ep.name)
              for ep in sorted((p for p in points if not own(p)), key=lambda p: p.name)]
    extra = [m.strip() for m in os.environ.get(ENGINES_VAR, "").split(",") if m.strip()]
    return [*builtin, *others, *(Registration(m if ":" in m else f"{m}:ENGINE", ENGINES_VAR) for m in extra)]


def _spec_of(reg: Registration) -> EngineSpec:
    external = not reg.builtin
    module_name, _, attr = reg.ref.partition(":")
    if not module_name or module_name.startswith(".") or not attr:
        raise UsageError(f"{reg.where()}: {reg.ref!r} is not an absolute module path and attribute"
                         " (module.path:ENGINE)")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        missing = err.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):  # the module itself
            raise UsageError(f"{reg.where()}: no module {module_name} (an importable module path)") from None
        if not external:
            raise  # a built-in engine module imports nothing optional: our bug, a traceback with --debug
        import sys

        raise InfrastructureError(f"{reg.where()} cannot be imported: it needs the module {missing or '?'}, which"
                                  f" this Python ({sys.prefix}) lacks (install it, or take the engine away)") from err
    except SyntaxError as err:
        if not external:
            raise  # a built-in engine that does not compile is our bug: a traceback with --debug
        where = f"{err.filename}:{err.lineno}" if err.filename else module_name
        raise UsageError(f"{reg.where()} does not compile: {where}: {err.msg}") from None
    except Exception as err:  # noqa: BLE001  (the user's module failed at import: theirs to fix, named)
        if not external:
            raise
        if isinstance(err, UsageError):  # an EngineSpec(...) of theirs refused its own fields
            raise UsageError(f"{reg.where()}: {err}") from err
        raise UsageError(f"{reg.where()} failed while importing:"
                         f" {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}".rstrip(": ")) from err
    spec: Any = module
    for part in attr.split("."):
        spec = getattr(spec, part, None)
    if not isinstance(spec, EngineSpec):
        raise UsageError(f"{reg.where()}: defines no {attr} = EngineSpec(...)")
    if reg.entry is not None and reg.entry != spec.name:
        raise UsageError(f"{reg.where()}: the entry point is named {reg.entry!r}, its engine {spec.name!r}: name it"
                         " as the engine")
    return dataclasses.replace(spec, source=module_name, distribution=reg.origin)


def registry() -> dict[str, EngineSpec]:
    """Every registered engine by name, the default first, then the order of :func:`registrations`."""
    global _REGISTRY, _REGISTRY_FOR
    regs = registrations()
    key = "\n".join(f"{r.ref}|{r.origin}" for r in regs)
    if _REGISTRY is not None and _REGISTRY_FOR == key:
        return _REGISTRY
    out: dict[str, EngineSpec] = {}
    envs: dict[str, str] = {}  # environment name -> the module that declared it
    for reg in regs:
        spec = _spec_of(reg)
        taken = next((s for s in out.values() if spec.name == s.name or spec.key == s.key), None)
        if taken is not None:
            raise UsageError(f"{reg.where()}: engine {spec.name!r} is registered already by {taken.source}"
                             f" ({taken.distribution})")
        for env in spec.environments:
            if env.name in envs:  # the second would run its own pins under the first's name
                raise UsageError(f"engine module {reg.module}: environment {env.name!r} is declared already by"
                                 f" {envs[env.name]}: an environment name is declared once (rename it)")
            envs[env.name] = reg.module
        out[spec.name] = spec
    if DEFAULT in out:
        out = {DEFAULT: out[DEFAULT], **{k: v for k, v in out.items() if k != DEFAULT}}
    _REGISTRY, _REGISTRY_FOR = out, key
    return out


def drafter_formats() -> dict[str, DrafterFormat]:
    """Every drafter format the registered engines declare, by name, the default first; two engines
    declaring one name must declare the same builder (one format, one builder)."""
    out: dict[str, DrafterFormat] = {}
    for spec in registry().values():
        fmt = spec.drafter_format
        if fmt is None:
            continue
        seen = out.get(fmt.name)
        if seen is not None and seen.build != fmt.build:
            raise UsageError(f"engine {spec.name}: drafter format {fmt.name!r} is declared already with"
                             f" another builder ({seen.build!r})")
        out.setdefault(fmt.name, fmt)
    if DEFAULT_DRAFTER_FORMAT in out:
        out = {DEFAULT_DRAFTER_FORMAT: out[DEFAULT_DRAFTER_FORMAT],
               **{k: v for k, v in out.items() if k != DEFAULT_DRAFTER_FORMAT}}
    return out


def names(in_process: bool = False, e2e: bool = False) -> list[str]:
    """Engine names, the default first (``in_process``: only those with a verify adapter, what probe, replay
    and bisect can run; ``e2e``: only those with e2e entry points)."""
    return [n for n, s in registry().items()
            if (s.in_process or not in_process) and ((s.e2e is not None and bool(s.e2e_entry_points)) or not e2e)]


# what a command hands down as its engine: the spec its --engine resolved to, or a name (a library caller)
EngineRef = str | EngineSpec


def get(name: EngineRef) -> EngineSpec:
    """The engine named ``name`` (a spec already resolved is itself); UsageError naming the choices."""
    if isinstance(name, EngineSpec):
        return name
    reg = registry()
    if name in reg:
        return reg[name]
    raise UsageError(f"engine {name!r}: not registered (choose from {', '.join(reg)};"
                     f" a module of yours: {ENGINES_VAR}=module.path)")


def for_profile(key: str) -> EngineSpec:
    """The engine a profile's ``engine:`` key names (its name, or the module form ``dflash_mlx``)."""
    reg = registry()
    for spec in reg.values():
        if key in (spec.name, spec.key):
            return spec
    raise UsageError(f"engine {key!r}: no module registers it (registered: {', '.join(reg)})")


def served_hooks(key: str | None) -> ServedHooks:
    """The served hooks of the engine a profile names (None: the generic engine, no hooks)."""
    if not key:
        return GENERIC
    return for_profile(key).served_hooks()


def require_consent(checkpoints: Iterable[tuple[str, str | os.PathLike[str] | None]], trust_remote_code: bool,
                    toolkit_code_ok: bool = False) -> None:
    """Refuse, before anything loads, a checkpoint that ships code when the user did not pass
    ``--trust-remote-code``: every engine path (in process, re-run, served) asks here first, so no
    engine runs a checkpoint's code unasked.

    checkpoints: (the flag or role that named it, its directory) pairs; None entries and paths that are
    not a local checkpoint (a hub id: its loader decides) are skipped. toolkit_code_ok: a ``model_file``
    that is byte for byte the toolkit's own fixture module (a fault fixture specparity built, whose
    code is already running here) is not foreign code: the served harness wraps such targets itself.
    """
    if trust_remote_code:
        return
    from specparity.checkpoint import read_config, remote_code
    from specparity.errors import Name

    for flag, path in checkpoints:
        if path is None:
            continue
        d = Path(path)
        if not (d / "config.json").is_file():
            continue  # not a local checkpoint: its loader says so
        cfg = read_config(d, model_type=False)  # only whether it names code: its loader judges the rest
        code = remote_code(d, cfg)
        if code and toolkit_code_ok and _toolkit_fixture(d, cfg):
            code = remote_code(d, {k: v for k, v in cfg.items() if k != "model_file"})  # any other code
        if code:
            raise UsageError(f"{flag} {path}: {code}; pass ", Name("trust-remote-code"), " to run it")


def _toolkit_fixture(d: Path, cfg: dict[str, Any]) -> bool:
    """``d``'s only code is the toolkit's own fixture module, byte for byte."""
    from specparity import fixtures

    name = cfg.get("model_file")
    if name != fixtures.FIXTURE_MODULE:
        return False
    packaged = fixtures.MODELS_DIR / fixtures.FIXTURE_MODULE
    try:
        return (d / name).read_bytes() == packaged.read_bytes()
    except OSError:
        return False
