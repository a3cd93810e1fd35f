"""Where an engine's in-process work runs: here, or in the engine's own environment.

An engine that pins its own versions (dflash-mlx 0.1.8 starts its server only
with mlx-lm 0.31.x) is not installed beside the toolkit; it lives in its own
environment with specparity installed into it. A command that needs the
engine in process runs here when the engine imports here, and otherwise
re-runs itself, whole, in the environment's interpreter: the classic
reference is then computed with the engine's own mlx-lm, and the record's
identity lists that interpreter's packages.

Where the environment's interpreter comes from, first found:

1. ``SPECPARITY_<ENGINE>_PYTHON`` (``SPECPARITY_DFLASH_MLX_PYTHON``): an
   interpreter that has the engine and specparity (such as another built
   environment's: ``specparity env path --python dflash-mlx-mlx-lm-0.32.2``);
2. :func:`specparity.environments.ensure_environment` of the engine's first
   pinned environment (its registry entry, :mod:`specparity.engines`), built once.

When that interpreter is a built environment's, the re-run is told which
(:data:`ENVIRONMENT_VAR`) and its record's identity lists it under
``environments`` (:func:`running_environment`): name, digest, pins, packages.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specparity.errors import InfrastructureError

if TYPE_CHECKING:
    from specparity.engines import EngineRef

log = logging.getLogger(__name__)

# set in a re-run's environment: the re-run must not re-run again
RERUN_MARK = "SPECPARITY_ENGINE_RERUN"
# set in a re-run's environment: the directory of the built environment it runs in
ENVIRONMENT_VAR = "SPECPARITY_ENGINE_ENVIRONMENT"
# set in a re-run's environment: the file its result goes to (report_rerun / read_rerun_result)
RESULT_VAR = "SPECPARITY_RERUN_RESULT"


def python_var(engine: EngineRef) -> str:
    """``SPECPARITY_DFLASH_MLX_PYTHON`` for ``dflash-mlx``."""
    from specparity.engines import get

    return get(engine).python_var


def importable(engine: EngineRef) -> bool:
    """``engine``'s module imports here (asked of the registry)."""
    from specparity.engines import get

    return get(engine).importable()


def engine_environment(engine: EngineRef, environment: str | None = None) -> tuple[str, dict[str, str]]:
    """The interpreter of ``engine``'s environment and the process environment to run specparity there
    (see the module docstring; ``environment``: this one, a name or YAML file, over both); InfrastructureError
    if there is none."""
    from specparity.environments import environment_at, interpreter

    if environment is not None:  # the engine is not asked of the registry: it may be installed there only
        from specparity.environments import ensure_environment

        env = ensure_environment(environment, progress=lambda line: print(f"specparity: {line}", file=sys.stderr))
        return str(env.python), {**env.environ(), ENVIRONMENT_VAR: str(env.path)}
    var = python_var(engine)
    if os.environ.get(var):
        path = os.environ[var]
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise InfrastructureError(f"{var}={path}: no such interpreter")
        import json

        from specparity.environments import SOURCE_VAR, source_mapping

        # an environment specparity built imports this checkout through $SPECPARITY_SOURCE
        environ = {**os.environ, SOURCE_VAR: json.dumps(source_mapping())}
        environ.pop(ENVIRONMENT_VAR, None)
        home = Path(path).absolute().parent.parent
        if environment_at(home) is not None and interpreter(home).absolute() == Path(path).absolute():
            environ[ENVIRONMENT_VAR] = str(home)
        return path, environ
    from specparity.engines import get
    from specparity.environments import ensure_environment

    pinned = get(engine).environment
    if pinned is None:
        raise InfrastructureError(f"{engine} does not import here and declares no environment to run in")
    env = ensure_environment(pinned.name, progress=lambda line: print(f"specparity: {line}", file=sys.stderr))
    return str(env.python), {**env.environ(), ENVIRONMENT_VAR: str(env.path)}


def running_environment() -> dict[str, Any]:
    """``{engine: Environment.identity()}`` of the built environment this process is an engine's re-run in
    ({}: none), keyed as a served record keys its pairings' (so ``records compare`` sets two versions side
    by side). Only when this interpreter is that environment's own: a value inherited elsewhere says nothing."""
    from specparity.environments import environment_at

    where = os.environ.get(ENVIRONMENT_VAR)
    env = environment_at(where) if where else None
    if env is None or Path(sys.prefix).resolve() != env.path.resolve():
        return {}
    return {os.environ.get(RERUN_MARK) or env.name: env.identity()}


def engine_python(engine: EngineRef) -> str:
    """The interpreter of ``engine``'s environment (see :func:`engine_environment`)."""
    return engine_environment(engine)[0]


def with_environment(command: str, environment: str) -> str:
    """A printed ``specparity`` command line run in ``environment``: ``--environment`` appended, shell-quoted; a
    line that already names an environment is left as it is."""
    import shlex

    if "--environment" in shlex.split(command):
        return command
    return f"{command} --environment {shlex.quote(environment)}"


def rerun_argv(python: str, argv: list[str]) -> list[str]:
    """The command line that re-runs ``specparity argv`` under ``python``."""
    return [python, "-P", "-m", "specparity.cli", *argv]


def claim_rerun_result() -> str | None:
    """In a re-run, the file its result goes to, taken out of the environment (a specparity the re-run
    starts in turn must not write it); None elsewhere."""
    path = os.environ.pop(RESULT_VAR, None)
    return path if path and os.environ.get(RERUN_MARK) else None


def report_rerun(path: str | None, argv: list[str], code: int) -> None:
    """Tell the parent what ran and how it ended (``path``: :func:`claim_rerun_result`'s): the parent
    believes the exit code only from this file (:func:`read_rerun_result`), never from the exit status alone."""
    if not path:
        return
    import json

    from specparity import __version__

    try:
        Path(path).write_text(json.dumps({"specparity": __version__, "argv": list(argv), "exit_code": int(code)}))
    except OSError as err:
        log.warning("could not write the re-run's result to %s: %s", path, err)


def read_rerun_result(path: Path, argv: list[str], returncode: int, engine: str, python: str) -> int:
    """The re-run's exit code, when ``path`` holds a well-formed result of exactly this command and this
    specparity version and it agrees with the process's exit status; InfrastructureError naming the
    interpreter otherwise (garbage printed with exit 0 is not a pass)."""
    import json

    from specparity import __version__

    def refuse(why: str) -> InfrastructureError:
        return InfrastructureError(f"{engine}'s interpreter {python} gave no specparity result for"
                                   f" `specparity {' '.join(argv[:1])}` (exit {returncode}): {why}")

    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise refuse("it wrote none (is specparity importable there, and is it a Python?)") from None
    except OSError as err:
        raise refuse(f"its result could not be read ({err})") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise refuse("its result is not JSON") from None
    if not isinstance(data, dict) or set(data) != {"specparity", "argv", "exit_code"}:
        raise refuse("its result is not a specparity result")
    if data["specparity"] != __version__:
        raise refuse(f"it ran specparity {data['specparity']!r}, this is {__version__}")
    if data["argv"] != list(argv):
        raise refuse("its result is of another command")
    code = data["exit_code"]
    if not isinstance(code, int) or isinstance(code, bool) or code != returncode:
        raise refuse(f"its result says exit {code!r}")
    return code
