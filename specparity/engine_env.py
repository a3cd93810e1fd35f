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
   interpreter that has the engine and specparity;
2. :func:`specparity.environments.ensure_environment` (the cached, pinned
   environment per engine, built once).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys

from specparity.errors import InfrastructureError

log = logging.getLogger(__name__)

# engine -> the module that must import for in-process work
ENGINE_MODULES = {"dflash-mlx": "dflash_mlx"}
# set in a re-run's environment: the re-run must not re-run again
RERUN_MARK = "SPECPARITY_ENGINE_RERUN"


def python_var(engine: str) -> str:
    """``SPECPARITY_DFLASH_MLX_PYTHON`` for ``dflash-mlx``."""
    return "SPECPARITY_" + engine.upper().replace("-", "_") + "_PYTHON"


def importable(engine: str) -> bool:
    module = ENGINE_MODULES.get(engine)
    return module is None or importlib.util.find_spec(module) is not None


def engine_environment(engine: str) -> tuple[str, dict[str, str]]:
    """The interpreter of ``engine``'s environment and the process environment to run specparity there
    (see the module docstring); InfrastructureError if there is none."""
    var = python_var(engine)
    if os.environ.get(var):
        path = os.environ[var]
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise InfrastructureError(f"{var}={path}: no such interpreter")
        import json

        from specparity.environments import SOURCE_VAR, source_mapping

        # an environment specparity built imports this checkout through $SPECPARITY_SOURCE
        return path, {**os.environ, SOURCE_VAR: json.dumps(source_mapping())}
    from specparity.environments import ensure_environment

    env = ensure_environment(engine, progress=lambda line: print(f"specparity: {line}", file=sys.stderr))
    return str(env.python), env.environ()


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
