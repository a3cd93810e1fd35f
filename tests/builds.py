"""The one-time builds the tests use (engines' pinned environments): where they are, and a skip, or
under CI a failure, when one is missing (``scripts/build-env NAME`` builds it; no test builds it)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from specparity import environments as envs

# read once, at collection: the real cache, before any test points $SPECPARITY_HOME elsewhere
REAL_CACHE = envs.cache_root()

def built(name: str) -> envs.Environment:
    """The packaged environment ``name`` from the real cache: skip when not built, fail under CI."""
    found = envs.find_environment(name, root=REAL_CACHE)
    if found is None:
        message = f"environment {name} is not built: run scripts/build-env {name}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def engine_warmth(name: str) -> Any:
    """The warm module of engine ``name`` (``EngineSpec.warm``: what scripts/warm-engines calls)."""
    from specparity.engines import get, resolve

    return resolve(get(name).warm)


def warmed(name: str) -> envs.Environment:
    """``built(name)``, whose server's first-start work on this machine scripts/warm-engines has done (mlx-dspark:
    its kernel calibration, 2 minutes and more): under CI a failure when not, so that no test pays it; elsewhere
    the test's server does it, once."""
    env = built(name)
    if os.environ.get("CI") and not engine_warmth(name).is_warm(env):
        pytest.fail(f"{name} has not calibrated on this machine: run scripts/warm-engines")
    return env


def engine_cli(cli_bin: str, info: dict, command: str, *args: str, fault: str | None = None,
                engine: str = "mlx-dspark") -> tuple[int, dict]:
    """``command --engine ENGINE`` on ``info``'s pair, re-run in the engine's built environment."""
    from conftest import run_cli
    from specparity.environments import ENV_CACHE_VAR
    from specparity.probes.engines.base import FAULT_ENV

    built(engine)
    env = {ENV_CACHE_VAR: str(REAL_CACHE), **({FAULT_ENV: fault} if fault else {})}
    proc = run_cli(cli_bin, command, "--engine", engine, "--model", info["target"], "--draft-model",
                   info["draft"], "--prompt-ids", ",".join(map(str, info["fit_prompts"][0])), *args, "--json",
                   env=env)
    assert proc.stdout.strip(), proc.stderr[-2000:]
    return proc.returncode, json.loads(proc.stdout)


def wheel(out: Path, dist: str, version: str, files: dict[str, str], entry_points: str = "",
          requires: tuple[str, ...] = ()) -> Path:
    """A pure-Python wheel of ``files`` (path in the wheel -> text), made without any build tool: what pip
    installs offline (an environment's test package, an outside engine's distribution). ``requires``: its
    declared dependencies (``Requires-Dist``)."""
    import base64
    import hashlib
    import zipfile

    info = f"{dist.replace('-', '_')}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires)
    files = {**files, f"{info}/METADATA": metadata,
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    if entry_points:
        files[f"{info}/entry_points.txt"] = entry_points
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    record.append(f"{info}/RECORD,,")
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{dist.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
        zf.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return path
