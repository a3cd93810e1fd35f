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
    extra_argv(drafts: bool, server_dir: Path) -> list[str]
        argv appended to one server's (an arm with or without the drafter; ``server_dir``: the
        folder the record keeps for that server, e.g. for the engine's own diagnostics)
    max_width(draft: str) -> int | None
        the widest verify block the engine takes with this drafter (None: no limit; 0: it
        cannot draft with it). A wider arm is not run, with the reason (never clamped)
    prompt_ids(client, url, request) -> list[int] | None
        the prompt tokens the server decodes a request from, asked of the server itself (its own
        chat template and tokenizer): the classic reference decodes from exactly these
    mark(session) -> Any / evidence(session, completion, mark) -> EngineEvidence | None
        the engine's own evidence over one request: ``mark`` before it is sent, ``evidence``
        after (accept vector and widths per round, what drafted each round, cache state, and
        for a failed request the engine's own error message)
    reproduction(model, draft, body, prompt_ids, width, first) -> dict | None
        for a served finding on a loop no in-process replay of mlx_lm.server's stands for: the
        command that reproduces it with the engine in process, or why none does
        (``Reproduction.to_dict()``; None: the engine has nothing to say, the record gives the loop)

Add a server: write one profile YAML (``harness/profiles/*.yaml`` documents
every key; a user's file is passed by path). Add an engine that needs code (an
evidence reader, a pinned environment, a checkpoint export): one module here,
named by the profile's ``engine`` key.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from pathlib import Path
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


    def extra_argv(self, drafts: bool, server_dir: Path) -> list[str]:
        fn = self._hook("extra_argv")
        return [str(a) for a in fn(drafts, server_dir)] if fn is not None else []

    def max_width(self, draft: str) -> int | None:
        fn = self._hook("max_width")
        return fn(draft) if fn is not None else None

    def prompt_ids(self, client: Any, url: str, request: Any) -> list[int] | None:
        fn = self._hook("prompt_ids")
        return fn(client, url, request) if fn is not None else None

    def mark(self, session: Any) -> Any:
        fn = self._hook("mark")
        return fn(session) if fn is not None else None

    def evidence(self, session: Any, completion: Any, mark: Any) -> EngineEvidence | None:
        fn = self._hook("evidence")
        return fn(session, completion, mark) if fn is not None else None

    def reproduction(self, *, model: str, draft: str | None, body: dict[str, Any], prompt_ids: list[int] | None,
                     width: int | None, first: bool) -> dict[str, Any] | None:
        fn = self._hook("reproduction")
        return fn(model=model, draft=draft, body=body, prompt_ids=prompt_ids, width=width,
                  first=first) if fn is not None else None


@dataclass
class EngineEvidence:
    """What an engine's own evidence reader found over one request (engines' ``evidence`` hook).

    engaged: the drafter ran (None: cannot tell). declined: the engine fell back to its classic
    path for this request. accepts / widths: accepted drafts and verify rows per round.
    lines: evidence lines for the report. cache: prompt-cache state (``cold`` / ``warm``, None:
    unknown). cached_tokens: prompt tokens served from the cache. error: the engine failed this request
    (its own message, e.g. from its log): the request is an error, even where a response came.
    details: anything else to keep.
    """

    engaged: bool | None = None
    declined: bool = False
    accepts: list[int] = field(default_factory=list)
    widths: list[int] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    cache: str | None = None
    cached_tokens: int | None = None
    error: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


GENERIC = Engine("generic")


def load_engine(name: str | None) -> Engine:
    """The engine module a profile names (None: the generic engine, no hooks)."""
    if not name:
        return GENERIC
    if not _NAME.match(name):
        raise UsageError(f"engine {name!r}: a module name under specparity.harness.engines (e.g. llama_cpp)")
    module_name = f"{__name__}.{name}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name != module_name:  # the engine module exists and a module it imports is missing: a bug to show
            raise
        raise UsageError(f"engine {name!r}: no module {module_name}") from None
    return Engine(name, module)
