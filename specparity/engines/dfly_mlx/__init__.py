"""dfly-mlx 0.1.0: DFly drafting on dflash-mlx 0.1.8's runtime ("lossless greedy DFly").

What its claim rests on: dflash-mlx's loop (``stream_dflash_generate``) and its
verify and rollback, unchanged; DFly only replaces the draft backend (the
DFlash backbone once, then a hidden-state correction and the target's own head
token by token). So it leaves classic decode exactly where dflash-mlx 0.1.8
does on the same target (see :mod:`specparity.engines.dflash_mlx`), and its
``generate`` always prompts with the tokenizer's no-thinking chat template
(a tokenizer without one: its error).

Here: in process, dflash-mlx's verify and rollback reached through dfly-mlx's
``load_runtime`` bundle, and dflash-mlx's loop as ``dfly_mlx.generate`` runs it,
recorded round by round (:mod:`specparity.engines.dfly_mlx.adapter`: ``probe``,
``replay`` and ``bisect --engine dfly-mlx``); ``generate`` and the loop it drives
(``dfly-stream``) against classic decode (:mod:`specparity.probes.engine_e2e`),
located by the summary's ``acceptance_history``; its drafters made from fitted
DFlash drafters (:func:`specparity.engines.dfly_mlx.fixtures.build_dfly_pair`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specparity.engines import DrafterFormat, EngineSpec, LoadRequest, PinnedEnv


def load(request: LoadRequest) -> Any:
    """dflash-mlx's target adapter as dfly-mlx's ``load_runtime`` loads it with the DFly drafter."""
    from specparity.engines.dfly_mlx.adapter import DflyEngine

    return DflyEngine(request.target, request.draft, prefill_step_size=request.prefill_step_size)


def default_checkpoints() -> tuple[Path, Path | None]:
    """The default DFly fixture (dense qwen3, float32), built once into the shared fixture cache."""
    from specparity.engines.dfly_mlx.fixtures import build_dfly_pair
    from specparity.fixtures import fixtures_home

    info = build_dfly_pair(fixtures_home() / "dfly-qwen3-float32-untied")
    return Path(info.target), Path(info.draft)


ENGINE = EngineSpec(
    name="dfly-mlx",
    description="dfly-mlx 0.1.0: DFly drafting on dflash-mlx 0.1.8's verify, tape-replay rollback and loop",
    module="dfly_mlx",
    environments=(
        PinnedEnv("dfly-mlx", ("dfly-mlx==0.1.0", "dflash-mlx==0.1.8", "mlx-lm==0.31.3"),
                  "dfly-mlx 0.1.0 (load_runtime + generate on dflash-mlx 0.1.8; no server) on mlx-lm 0.31.3",
                  imports=("mlx_lm", "dflash_mlx", "dfly_mlx", "dfly_mlx.generate", "dfly_mlx.loading")),
    ),
    adapter=load,
    builds_on=("dflash-mlx",),
    e2e_entry_points=("generate", "dfly-stream"),
    loops="specparity.engines.dfly_mlx.loops:loops",
    default_checkpoints=default_checkpoints,
    drafter_format=DrafterFormat("dfly", "specparity.engines.dfly_mlx.fixtures:dfly_format",
                                 "a DFly drafter that reads the target's embedding and head"),
)
