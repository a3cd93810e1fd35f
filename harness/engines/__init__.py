"""Engines: the code a server profile needs beyond its YAML, one module per engine.

A profile names its engine (``engine: llama_cpp``); the module
``specparity.harness.engines.<engine>`` may define any of these hooks (a hook
it does not define is simply not used):

    placeholders() -> dict[str, str]
        values of engine-specific argv placeholders (llama.cpp: ``{llama_server}``,
        the binary scripts/build-llama-server built)
    unavailable() -> str | None
        why the engine cannot run here (None: it can); a pairing on it is ``error``
    prepare_checkpoint(path: str, role: str) -> str
        the checkpoint as the server loads it (llama.cpp: a GGUF export, made once)

Add a server: write one profile YAML (``harness/profiles/*.yaml`` documents
every key; a user's file is passed by path). Add an engine that needs code (an
evidence reader, a pinned environment, a checkpoint export): one module here,
named by the profile's ``engine`` key.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from specparity.errors import UsageError

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass
class Engine:
    """An engine module's hooks, each a no-op where the module does not define it."""

    name: str
    module: ModuleType | None = None

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


GENERIC = Engine("generic")


def load_engine(name: str | None) -> Engine:
    """The engine module a profile names (None: the generic engine, no hooks)."""
    if not name:
        return GENERIC
    if not _NAME.match(name):
        raise UsageError(f"engine {name!r}: a module name under specparity.harness.engines (e.g. llama_cpp)")
    try:
        module = importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError:
        raise UsageError(f"engine {name!r}: no module specparity.harness.engines.{name}") from None
    return Engine(name, module)
