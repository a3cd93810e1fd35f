"""Engine adapters: one interface (``base.py``), one implementation module per engine.

    base.py        the interface: Engine, TargetSession (prefill, verify, rollback, state), EngineRun
    mlx_lm.py      mlx-lm: Decoder forwards, trim_prompt_cache / snapshot-and-recompute
    dflash_mlx.py  dflash-mlx: its TargetOps verify forward, tape-replay rollback, its own loop
    mlx_dspark.py  mlx-dspark: its Target.verify, KV trim / gated-delta re-run rollback, its own loop
    dspark_mlx.py  dspark-mlx: its host adapter's verify_forward / kv_rollback, its generate_eager
    dfly_mlx.py    dfly-mlx: dflash-mlx's adapter as its load_runtime loads it, dflash-mlx's loop as it runs it
    own_loop.py    every engine's own loops against classic decode (e2e); mtplx: only those

Which adapter an engine uses, and how it loads, is declared in the engine registry
(:mod:`specparity.engines`: an engine's ``adapter``). Nothing here imports mlx or an
engine at import time.
"""
