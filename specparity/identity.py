"""Who, where and with what a result was measured."""

from __future__ import annotations

import functools
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from specparity import __version__

DEFAULT_ENV_PREFIXES = ("MLX_",)


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    root = Path(__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True, text=True, timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


@functools.lru_cache(maxsize=1)
def device() -> str:
    """The mlx default device, e.g. ``gpu`` or ``cpu``.

    Asked of a child process where this one has not imported mlx (the served job's harness: mlx's
    libraries would be most of its own memory, held beside every server for the whole job)."""
    if "mlx.core" not in sys.modules:
        try:
            out = subprocess.run([sys.executable, "-P", "-c", "import mlx.core as mx; print(mx.default_device())"],
                                 capture_output=True, text=True, timeout=60, check=False)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip().replace("Device(", "").split(",")[0].strip(")")
        except (OSError, subprocess.SubprocessError):
            pass
    import mlx.core as mx

    return str(mx.default_device()).replace("Device(", "").split(",")[0].strip(")")


def kernel_env(prefixes: tuple[str, ...] | list[str] = DEFAULT_ENV_PREFIXES) -> dict[str, str]:
    """Environment variables that can change kernels (default: the ``MLX_`` ones)."""
    return {k: v for k, v in sorted(os.environ.items()) if any(k.startswith(p) for p in prefixes)}


@functools.lru_cache(maxsize=1)
def backend() -> dict[str, Any]:
    return {
        "device": device(),
        "mlx": _version("mlx"),
        "mlx_lm": _version("mlx-lm"),
        "platform": f"{platform.system()}-{platform.machine()}",
    }


def identity(**extra: Any) -> dict[str, Any]:
    """Host, OS, CPU, Python, mlx / mlx-lm / toolkit versions, git commit, plus ``extra``."""
    ident = {
        "host": socket.gethostname(),
        "os": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "specparity": __version__,
        "git_commit": git_commit(),
        "env": kernel_env(),
    }
    ident.update(backend())
    engines = outside_engines()
    if engines:
        ident["engines"] = engines
    ident.update(extra)
    return ident


def outside_engines() -> dict[str, str]:
    """The engines registered here that are not specparity's own, by name: the distribution and version they came
    from (``DIST VERSION``), or ``$SPECPARITY_ENGINES`` (a developer's module); {} where the registry is unread."""
    try:
        from specparity.engines import BUILTIN, registry

        return {name: spec.distribution for name, spec in registry().items() if spec.distribution != BUILTIN}
    except Exception:  # noqa: BLE001  (an identity is written whatever the registry's state)
        return {}
