#!/usr/bin/env python3
"""The work an engine does at its first start on a machine, done once before the tests (scripts/warm-engines).

Each registered engine that declares such work (``EngineSpec.warm``: a module with ``is_warm(env)`` and
``warm(env) -> exit code``, in the engine's package) is warmed in its first pinned environment, once: a
machine already warm for it returns at once, an engine whose environment is not built is said and skipped.
Nothing here names an engine.

Usage: .venv/bin/python -P scripts/warm_engines.py
"""

from __future__ import annotations

import sys


def main() -> int:
    from specparity import environments as envs
    from specparity.engines import registry, resolve

    code = 0
    for name, spec in registry().items():
        if spec.warm is None:
            continue
        pinned = spec.environment
        env = envs.find_environment(pinned.name) if pinned is not None else None
        if env is None:
            where = pinned.name if pinned is not None else name
            print(f"warm-engines: {name}: its environment is not built (scripts/build-env {where}): nothing to warm",
                  file=sys.stderr)
            continue
        module = resolve(spec.warm)
        if not module.is_warm(env):
            code = max(code, int(module.warm(env)))
    return code


if __name__ == "__main__":
    sys.exit(main())
