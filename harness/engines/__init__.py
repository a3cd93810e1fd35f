"""Engines' served code: one module per engine that needs code beyond its profile YAML.

Which module serves which engine is declared in the engine registry
(:mod:`specparity.engines`: an engine's ``hooks``), which also documents every
hook (:class:`specparity.engines.ServedHooks`); a profile names its engine
(``engine: llama_cpp`` or ``engine: llama.cpp``) and gets its hooks from
:func:`specparity.engines.served_hooks`. What lives here is the type the hooks
return, :class:`EngineEvidence`, and the engines' hook modules themselves.

Add a server: write one profile YAML (``harness/profiles/*.yaml`` documents
every key; a user's file is passed by path). Add an engine: one module under
``specparity/engines/`` (see its docstring).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
