"""mlx-dspark 0.20.3: DSpark block drafting (plus DFlash heads and n-gram lookup drafts), one verify per round.

Its claim: ``speculative_generate`` at temperature 0 is "target-greedy by
construction (up to fp tie-breaking on near-ties)". What that rests on: each
round verifies [anchor, drafts] in one target forward (``Target.verify``, width
cap + 1: 3 rows by default, the whole block of 7 + 1 with ``max_draft_tokens=None``,
up to 33 on long n-gram lookup drafts), accepts the drafts equal to the raw-logit
argmax of each row (``mx.argmax`` on the logits, not on logprobs) and commits the
first disagreeing row's argmax; the rejected rows are trimmed from a dense KV
cache, and a gated-delta (``qwen3_5``) target's recurrent state is rebuilt by
re-running ``gated_delta_update`` over the kept rows from the recorded inputs.
Where it can leave classic decode: a verify row that differs from the single
step (block vs chain), the rebuilt recurrent state, the raw-logit argmax where
classic decode takes the logprob argmax (ties in bfloat16), and the kernels its
CLI and server calibrate per machine (small-M quantized matmul, split SDPA,
multi-row attention; off in the library's defaults, Metal only).

Here: in process, its own ``Target`` prefill, verify and rollback, and its own loop
recorded round by round (:mod:`specparity.engines.mlx_dspark.adapter`: ``probe`` and
``replay --engine mlx-dspark``, ``--verify-mode max-draft-N`` for the loop its server's
drafted arm runs); served: ``mlx-dspark serve`` (profile ``mlx-dspark``, hooks
:mod:`specparity.engines.mlx_dspark.served`, whose reproduction is that replay); its own loops against classic decode
(:mod:`specparity.probes.engine_e2e`), each difference located to its round and row
by its ``on_round`` record; its
drafters in DeepSeek's DeepSpec format (:mod:`specparity.fixtures.dspark`).
"""

from __future__ import annotations

from typing import Any

from specparity.engines import DrafterFormat, EngineSpec, LoadRequest, PinnedEnv
from specparity.engines.mlx_dspark.adapter import SERVED_MODES, served_cap


def load(request: LoadRequest) -> Any:
    """mlx-dspark loaded on the target (and its DSpark drafter) by its own loaders."""
    from specparity.engines.mlx_dspark.adapter import MlxDsparkEngine

    return MlxDsparkEngine(request.target, request.draft, cap=served_cap(request.verify_mode))


ENGINE = EngineSpec(
    name="mlx-dspark",
    description="mlx-dspark 0.20.3: DSpark drafting, one-forward verify, trim / gated-delta re-run rollback",
    module="mlx_dspark",
    environments=(
        # mlx-dspark needs mlx-lm >= 0.31.3 and mlx-vlm >= 0.6.12 (its gemma4 targets)
        PinnedEnv("mlx-dspark", ("mlx-dspark==0.20.3", "mlx-lm==0.31.3", "mlx-vlm==0.7.10"),
                  "mlx-dspark 0.20.3 (speculative_generate, mlx-dspark serve) on mlx-lm 0.31.3",
                  imports=("mlx_lm", "mlx_dspark", "mlx_dspark.generate", "mlx_dspark.server")),
    ),
    profiles=("mlx-dspark",),
    hooks="specparity.engines.mlx_dspark.served",
    adapter=load,
    e2e_entry_points=("speculative_generate", "speculative_generate-full-block"),
    loops="specparity.engines.mlx_dspark.loops:loops",
    default_checkpoints="specparity.fixtures.dspark:default_checkpoints",
    drafter_format=DrafterFormat("dspark", "specparity.fixtures.dspark:dspark_format",
                                 "DeepSeek's DeepSpec DSpark drafter"),
    verify_modes=SERVED_MODES,
    warm="specparity.engines.mlx_dspark.warm",
)
