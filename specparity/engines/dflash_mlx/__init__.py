"""dflash-mlx 0.1.8: a DFlash block drafter, one-forward verify, tape-replay rollback.

In process: its own target adapter, verify forward, rollback and loop
(:mod:`specparity.engines.dflash_mlx.adapter`); e2e: its ``stream_dflash_generate``
and ``dflash generate`` CLI (:mod:`specparity.engines.dflash_mlx.e2e`); served: ``dflash
serve`` (profile ``dflash-mlx``, hooks :mod:`specparity.engines.dflash_mlx.served`);
fixtures: a target of a real DFlash family and a drafter it loads
(:mod:`specparity.fixtures.dflash`). It pins mlx-lm 0.31.x for its server, so it
lives in its own environment; a command that needs it in process re-runs there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specparity.engines import DrafterFormat, EngineSpec, LoadRequest, PinnedEnv

# its e2e module runs them (e2e.py: ENTRY_POINTS)
E2E_ENTRY_POINTS = ("dflash-stream", "dflash-cli")


def load(request: LoadRequest) -> Any:
    """dflash-mlx loaded on the target (and its DFlash drafter) by its own loader."""
    from specparity.engines.dflash_mlx.adapter import DflashEngine

    return DflashEngine(request.target, request.draft, verify_mode=request.verify_mode,
                        prefill_step_size=request.prefill_step_size)


def default_checkpoints() -> tuple[Path, Path | None]:
    """The default DFlash fixture pair, built once into the shared fixture cache."""
    import sys

    from specparity.fixtures.dflash import DEFAULT_PAIR_NOTE, dflash_pair

    print(f"using the default DFlash fixture ({DEFAULT_PAIR_NOTE}), built once", file=sys.stderr)
    info = dflash_pair()
    return Path(info.target), Path(info.draft) if info.draft else None


ENGINE = EngineSpec(
    name="dflash-mlx",
    description="dflash-mlx 0.1.8: its TargetOps verify forward, tape-replay rollback and its own loop",
    module="dflash_mlx",
    environments=(
        # dflash-mlx 0.1.8's server imports mlx_lm.generate.SequenceStateMachine, which 0.32 removed
        PinnedEnv("dflash-mlx", ("dflash-mlx==0.1.8", "mlx-lm==0.31.3"),
                  "dflash-mlx 0.1.8 (dflash serve / generate) on mlx-lm 0.31.3",
                  imports=("mlx_lm", "dflash_mlx", "dflash_mlx.serve")),
        # the in-process column of mlx-lm 0.32.2: dflash-mlx's generate and its engine API import with it,
        # its server does not (so no dflash_mlx.serve here)
        PinnedEnv("dflash-mlx-mlx-lm-0.32.2", ("dflash-mlx==0.1.8", "mlx-lm==0.32.2"),
                  "dflash-mlx 0.1.8 in process (dflash generate, no server) on mlx-lm 0.32.2",
                  imports=("mlx_lm", "dflash_mlx", "dflash_mlx.generate", "dflash_mlx.runtime.bundle",
                           "dflash_mlx.engine.spec_epoch")),
    ),
    profiles=("dflash-mlx",),
    hooks="specparity.engines.dflash_mlx.served",
    adapter=load,
    e2e_entry_points=E2E_ENTRY_POINTS,
    e2e="specparity.engines.dflash_mlx.e2e:run_dflash_e2e",
    default_checkpoints=default_checkpoints,
    drafter_format=DrafterFormat("dflash", "specparity.fixtures.dflash:dflash_format",
                                 "dflash-mlx's DFlash block drafter"),
    verify_modes=("adaptive", "dflash"),
)
