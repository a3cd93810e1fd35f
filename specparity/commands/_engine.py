"""What probe, replay, bisect and e2e share to run through an engine's in-process adapter.

The engines, their names, default and options come from the engine registry
(:mod:`specparity.engines`); nothing here names one.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from specparity.errors import UsageError

if TYPE_CHECKING:
    from specparity.engines import EngineRef


class RegistryChoice(click.Choice):
    """A choice whose values the engine registry gives when they are used (``$SPECPARITY_ENGINES``
    included), not when the command is defined: ``values()`` reads them."""

    def __init__(self, name: str, values: Callable[[], list[str]],
                 why_not: Callable[[str, str], str | None] | None = None,
                 to_value: Callable[[str], Any] | None = None) -> None:
        super().__init__([])
        self.name = name
        self._values = values
        self._why_not = why_not
        self._to_value = to_value
        self.follow = to_value is not None  # an engine's choice (a command that re-runs in an environment)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        # an engine this Python does not have, with --environment named: the command follows it there
        if self.follow and isinstance(value, str) and ctx is not None and value not in self.choices \
                and ctx.params.get("environment") and not _registered(value):
            ctx.exit(follow_into_environment(value, "engine", ctx.params["environment"]))
        # a value the registry knows but this command cannot take: why, and where it runs instead
        if self._why_not is not None and isinstance(value, str) and value not in self.choices:
            why = self._why_not(value, ctx.info_name or "" if ctx is not None else "")
            if why:
                self.fail(why, param, ctx)
        if self._to_value is not None and not isinstance(value, str):
            return value  # converted already (a default click passes again)
        chosen = super().convert(value, param, ctx)
        return self._to_value(chosen) if self._to_value is not None else chosen

    @property  # type: ignore[override]
    def choices(self) -> list[str]:
        return self._values()

    @choices.setter
    def choices(self, value: Any) -> None:
        pass


def _engine_names() -> list[str]:
    from specparity.engines import names

    return names(in_process=True)


def _e2e_engine_names() -> list[str]:
    from specparity.engines import names

    return names(e2e=True)


def _registered(name: str) -> bool:
    from specparity.engines import registry

    return name in registry()


def _not_offered(value: str, command: str) -> str | None:
    """Why a registered engine is not a choice of ``command`` (None: it is not registered)."""
    from specparity.engines import registry

    spec = registry().get(value)
    return spec.not_offered(command or "this command") if spec is not None else None


def _verify_modes() -> list[str]:
    from specparity.engines import registry

    return sorted({m for s in registry().values() for m in s.verify_modes})


def _drafter_formats() -> list[str]:
    from specparity.engines import drafter_formats

    return list(drafter_formats())


def _spec(name: str) -> Any:
    from specparity.engines import get

    return get(name)


def EngineChoice() -> RegistryChoice:  # noqa: N802  (a type for click, as click.Choice)
    """``--engine``'s choices: the engines with an in-process adapter; the value is the engine's spec, resolved
    here once and passed down (every helper below takes it as it is)."""
    return RegistryChoice("engine", _engine_names, _not_offered, _spec)


def E2EEngineChoice() -> RegistryChoice:  # noqa: N802
    """e2e's ``--engine`` choices: the engines with e2e entry points; the value is the engine's spec."""
    return RegistryChoice("engine", _e2e_engine_names, _not_offered, _spec)


def VerifyModeChoice() -> RegistryChoice:  # noqa: N802
    """Every registered engine's own verify policies."""
    return RegistryChoice("verify-mode", _verify_modes)


def DrafterFormatChoice() -> RegistryChoice:  # noqa: N802
    """``fixtures make --drafter-format``'s choices: every format an engine declares."""
    return RegistryChoice("drafter-format", _drafter_formats)


def environment_option(f: Callable) -> Callable:
    # eager: read before --engine, which follows an engine installed in that environment only
    return click.option(
        "--environment", default=None, metavar="NAME|FILE", is_eager=True,
        help="Run the whole command in this pinned environment (specparity env list, or a YAML file), built"
             " once: e.g. mlx-lm-0.31.3 to check another mlx-lm release, or an engine's on another mlx-lm.")(f)


def engine_option(f: Callable) -> Callable:
    from specparity.engines import DEFAULT

    f = environment_option(f)

    f = click.option("--verify-mode", type=VerifyModeChoice(), default=None,
                     help="The engine's own verify policy, one its package declares (default: the engine's;"
                          " docs/engines.md says each engine's).")(f)
    return click.option(
        "--engine", type=EngineChoice(), default=DEFAULT, show_default=True,
        help="Whose verify forward and rollback to check against classic decode (the engine registry;"
             " an engine of yours: $SPECPARITY_ENGINES=module.path). An engine that does not import here runs"
             " in its own environment ($SPECPARITY_<ENGINE>_PYTHON, else its pinned one, built once); without"
             " --model it runs on the engine's default fixture.")(f)


def engine_choice_option(f: Callable) -> Callable:
    """``--engine`` and ``--environment`` (e2e: the engine's own entry points against mlx-lm's classic arms)."""
    from specparity.engines import DEFAULT

    f = environment_option(f)

    return click.option(
        "--engine", type=E2EEngineChoice(), default=DEFAULT, show_default=True,
        help="Whose entry points to run (the engine registry; an engine of yours:"
             " $SPECPARITY_ENGINES=module.path): an engine other than mlx-lm runs its own entry points (its"
             " library's loops, its CLI) with --draft-model its drafter, against mlx-lm's classic arms.")(f)


def rerun_elsewhere(engine: EngineRef, model: str | None = None, draft_model: str | None = None,
                    trust_remote_code: bool = False, environment: str | None = None) -> int | None:
    """None to run here; else the exit code of this command re-run in the engine's environment
    (``environment``: the one the user named with --environment, whatever the engine).

    Consent comes first, here: a checkpoint's code is refused before anything loads or re-runs.
    The re-run is a tied child (it dies with this process, however this one ends), and its exit
    code is believed only from the result it writes (:func:`specparity.engine_env.read_rerun_result`).
    """
    import os

    from specparity.engine_env import RERUN_MARK, engine_environment
    from specparity.engines import get, require_consent
    from specparity.errors import InfrastructureError

    # the given paths as they are (a bad one is the loader's to name); the adapter's loader checks again
    require_consent([("--model", model), ("--draft-model", draft_model)], trust_remote_code)
    spec = get(engine)
    engine = spec.name  # its name from here on: an environment variable, a message, the re-run's argv
    if os.environ.get(RERUN_MARK):
        if spec.importable():
            return None
        raise InfrastructureError(f"{engine} does not import in its own environment ({sys.executable})")
    if environment is None and spec.importable():
        return None
    if environment is not None:
        from specparity.environments import load_spec

        load_spec(environment)  # an unknown name or a bad file: a usage error before anything is built
    python, environ = engine_environment(engine, environment)
    return _rerun(engine, environment, python, environ)


def follow_into_environment(name: str, what: str, environment: str | None) -> int:
    """This command re-run in ``environment`` for ``name``, ``what`` (``engine``, ``profile``), that is not
    registered here: an engine installed only in that pinned environment (its distribution, found there by its
    entry point) is reached by every command there. Exit code of the re-run; a usage error where no environment
    was named, or where this already is the re-run (the environment does not have it either)."""
    import os

    from specparity.engine_env import RERUN_MARK, engine_environment
    from specparity.engines import ENGINES_VAR, GROUP

    if environment is None or os.environ.get(RERUN_MARK):
        where = f" in the environment {os.environ.get(RERUN_MARK)!r} either" if environment is not None else ""
        raise UsageError(f"{what} {name!r}: not registered{where} (an engine is installed with its distribution's"
                         f" {GROUP!r} entry point, or named by ${ENGINES_VAR}; one installed in a pinned environment"
                         " only is reached with --environment NAME|FILE)")
    from specparity.environments import load_spec

    load_spec(environment)
    python, environ = engine_environment(name, environment)
    return _rerun(name, environment, python, environ)


def _rerun(engine: str, environment: str | None, python: str, environ: dict[str, str]) -> int:
    """This command line re-run for ``engine`` (its name) under ``python`` with ``environ``, tied, its exit code
    believed only from the result it writes (:func:`specparity.engine_env.read_rerun_result`)."""
    from specparity.engine_env import RERUN_MARK, RESULT_VAR, read_rerun_result, rerun_argv
    from specparity.errors import InfrastructureError

    root = click.get_current_context().find_root()
    given = (root.obj or {}).get("argv") if isinstance(root.obj, dict) else None
    argv = list(given) if given is not None else sys.argv[1:]
    click.echo(f"specparity: {engine} runs in {'environment ' + environment if environment else 'its own environment'}:"
               f" {python}", err=True)
    sys.stderr.flush()
    sys.stdout.flush()
    from specparity.harness.lifecycle import remove_scratch, run_tied, scratch_dir

    where = scratch_dir("specparity-rerun-")
    result = where / "result.json"
    try:
        try:
            code = run_tied(rerun_argv(python, argv), f"specparity re-run in {engine}'s environment",
                            env={**environ, RERUN_MARK: engine, RESULT_VAR: str(result)})
        except OSError as err:
            raise InfrastructureError(f"{engine}'s interpreter {python} would not start ({err})") from None
        return read_rerun_result(result, argv, code, engine, python)
    finally:
        remove_scratch(where)


def rerun_in_environment(engine: EngineRef, environment: str | None, model: str | None = None,
                         draft_model: str | None = None, trust_remote_code: bool = False) -> int | None:
    """The classic paths' --environment: None to run here (none named, or this is the re-run there);
    else the exit code of this command re-run in ``environment``."""
    if environment is None:
        return None
    return rerun_elsewhere(engine, model, draft_model, trust_remote_code, environment)


def engine_paths(engine: EngineRef, model: str | None, draft_model: str | None) -> tuple[Path, Path | None]:
    """The target and drafter directories: given, the fixture's own drafter, or the engine's default."""
    from specparity.checkpoint import resolve_model_dir
    from specparity.engines import get

    spec = get(engine)
    if model is None:
        default = spec.checkpoints()
        if default is None:
            from specparity.fixtures import default_pair

            click.echo("using the embedded fixture pair (built once)", err=True)
            info = default_pair()
            default = Path(info.target), Path(info.draft) if info.draft else None
        target, own_draft = default
        return target, resolve_model_dir(draft_model, "--draft-model") if draft_model else own_draft
    from specparity.commands._common import resolve_path

    target = resolve_model_dir(str(resolve_path(model)), "--model")  # a hub id too
    draft = resolve_model_dir(str(resolve_path(draft_model, "draft")), "--draft-model") if draft_model else None
    if draft is None:
        from specparity.fixtures import fixture_draft

        # the fixture's own record names its drafter relative to itself, wherever it was built or moved
        draft = fixture_draft(target, spec.fixture_kind)
    return target, draft


def load_adapter(engine: EngineRef, model: str | None, draft_model: str | None, need_draft: bool,
                 verify_mode: str | None, trust_remote_code: bool = False,
                 prefill_step_size: int | None = None, cache: Any = None,
                 paths: tuple[Path, Path | None] | None = None) -> Any:
    """``engine``'s in-process adapter on ``--model`` (and its drafter): consent checked before anything loads.

    cache: the cache options (decode.CacheOptions) for an adapter that takes them. paths: the
    ``engine_paths`` already resolved (None: resolved here).
    """
    from specparity.engines import LoadRequest, get

    spec = get(engine)
    target, draft = paths if paths is not None else engine_paths(engine, model, draft_model)
    if need_draft and draft is None and spec.drafter_checkpoint:
        raise UsageError(f"--engine {engine}: give --draft-model (the engine's drafter) for the engine's own loop")
    if verify_mode is not None and verify_mode not in spec.verify_modes:
        raise UsageError(f"--verify-mode {verify_mode}: --engine {engine} takes"
                         f" {', '.join(spec.verify_modes) or 'none'}")
    return spec.load(LoadRequest(target, draft, trust_remote_code=trust_remote_code, verify_mode=verify_mode,
                                 prefill_step_size=prefill_step_size, cache=cache))


def engine_prompts(engine: Any, texts: list[str] | None, ids: list[list[int]] | None) -> list[list[int]]:
    """Prompt ids for an engine run: --prompt-ids, --prompt, else the built-in probe prompts (the checkpoint the
    adapter loaded with the toolkit's loader, where it did: :func:`checked_prompts`)."""
    from specparity.inputs import check_prompts
    from specparity.prompts import encode_prompts

    loaded = engine.checkpoint()
    if loaded is not None:
        return checked_prompts(loaded, texts, ids)
    if ids:
        check_prompts(ids, engine.classic_model())
        return ids
    from mlx_lm.utils import load_tokenizer

    return encode_prompts(load_tokenizer(Path(engine.info.target)), texts or None, None)


def checked_prompts(loaded: Any, texts: list[str] | None, ids: list[list[int]] | None) -> list[list[int]]:
    """Prompt ids for a run judged against classic decode's checkpoint ``loaded`` (its tokenizer encodes
    --prompt, its vocabulary bounds --prompt-ids): --prompt-ids, --prompt, else the built-in prompts."""
    from specparity.inputs import check_prompts
    from specparity.prompts import encode_prompts

    if ids:
        check_prompts(ids, loaded)
        return ids
    return encode_prompts(loaded.tokenizer, texts or None, None)


def explicit(ctx: click.Context, *names: str) -> list[str]:
    """The options among ``names`` the user set (not left at their default)."""
    from click.core import ParameterSource

    return [n for n in names if ctx.get_parameter_source(n) not in (ParameterSource.DEFAULT, None)]
