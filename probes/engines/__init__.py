"""Engine adapters: one interface (``base.py``), one implementation module per engine.

    base.py        the interface: Engine, TargetSession (prefill, verify, rollback, state), EngineRun
    mlx_lm.py      mlx-lm: Decoder forwards, trim_prompt_cache / snapshot-and-recompute
    dflash_mlx.py  dflash-mlx: its TargetOps verify forward, tape-replay rollback, its own loop
    mlx_dspark.py  mlx-dspark: its Target.verify, KV trim / gated-delta re-run rollback, its own loop
    own_loop.py    dspark-mlx, dfly-mlx, mtplx: checked through their own loops only (e2e)

Which adapter an engine uses, and how it loads, is declared in the engine registry
(:mod:`specparity.engines`: an engine's ``adapter``). Nothing here imports mlx or an
engine at import time.
"""
