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
import subprocess
import sys
from pathlib import Path
from typing import Any

from specparity.errors import InfrastructureError

log = logging.getLogger(__name__)

# set in a re-run's environment: the re-run must not re-run again
RERUN_MARK = "SPECPARITY_ENGINE_RERUN"
# set in a re-run's environment: the directory of the built environment it runs in
ENVIRONMENT_VAR = "SPECPARITY_ENGINE_ENVIRONMENT"


def python_var(engine: str) -> str:
    """``SPECPARITY_DFLASH_MLX_PYTHON`` for ``dflash-mlx``."""
    from specparity.engines import get

    return get(engine).python_var


def importable(engine: str) -> bool:
    """``engine``'s module imports here (asked of the registry)."""
    from specparity.engines import get

    return get(engine).importable()


def engine_environment(engine: str) -> tuple[str, dict[str, str]]:
    """The interpreter of ``engine``'s environment and the process environment to run specparity there
    (see the module docstring); InfrastructureError if there is none."""
    from specparity.environments import environment_at, interpreter

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


def engine_python(engine: str) -> str:
    """The interpreter of ``engine``'s environment (see :func:`engine_environment`)."""
    return engine_environment(engine)[0]


def rerun_here_or_there(engine: str, argv: list[str]) -> int | None:
    """None when ``engine`` imports here (run in process); else the exit code of ``argv`` re-run in its environment."""
    if importable(engine):
        return None
    if os.environ.get(RERUN_MARK):
        raise InfrastructureError(f"{engine} does not import in its own environment ({sys.executable})")
    python, environ = engine_environment(engine)
    log.info("%s: re-running in %s", engine, python)
    print(f"specparity: {engine} runs in its own environment: {python}", file=sys.stderr, flush=True)
    return subprocess.call([python, "-P", "-m", "specparity.cli", *argv], env={**environ, RERUN_MARK: engine})
