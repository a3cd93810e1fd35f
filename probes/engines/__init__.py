"""Engine adapters: one interface (``base.py``), one implementation module per engine.

    base.py        the interface: Engine, TargetSession (prefill, verify, rollback, state), EngineRun
    mlx_lm.py      mlx-lm: Decoder forwards, trim_prompt_cache / snapshot-and-recompute

Every other engine's adapter lives in its own package (``specparity/engines/NAME/adapter.py``).
Which adapter an engine uses, and how it loads, is declared in the engine registry
(:mod:`specparity.engines`: an engine's ``adapter``). Nothing here imports mlx or an
engine at import time.
"""
