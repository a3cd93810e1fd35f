"""Engine adapters: one module per engine, one interface (``base.py``).

    base.py        the interface: Engine, TargetSession (prefill, verify, rollback, state), EngineRun
    mlx_lm.py      mlx-lm: Decoder forwards, trim_prompt_cache / snapshot-and-recompute
    dflash_mlx.py  dflash-mlx: its TargetOps verify forward, tape-replay rollback, its own loop

:func:`load_engine` builds one by name. Nothing here imports mlx or an engine at import time.
"""

from __future__ import annotations

from typing import Any

ENGINES = ("mlx-lm", "dflash-mlx")


def load_engine(name: str, target: Any, draft: Any = None, **options: Any) -> Any:
    """An :class:`~specparity.probes.engines.base.Engine` by name.

    ``target`` / ``draft``: for ``mlx-lm`` loaded checkpoints
    (:class:`specparity.checkpoint.Loaded`); for ``dflash-mlx`` checkpoint paths.
    """
    from specparity.errors import UsageError

    if name == "mlx-lm":
        from specparity.probes.engines.mlx_lm import MlxLmEngine

        return MlxLmEngine(target, draft, **options)
    if name == "dflash-mlx":
        from specparity.probes.engines.dflash_mlx import DflashEngine

        return DflashEngine(target, draft, **options)
    raise UsageError(f"unknown engine {name!r}: choose from {', '.join(ENGINES)}")
