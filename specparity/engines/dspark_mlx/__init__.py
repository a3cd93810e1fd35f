"""dspark-mlx 0.1.0: DSpark self-speculative decoding, "lossless, target-agnostic".

Its claim (``generate_eager``'s docstring): output identical to base greedy.
What that rests on: each round drafts ``block_size`` tokens, verifies
[anchor, drafts] in one forward of its host adapter (``MlxLmHostAdapter``: the
target's own layers re-run to capture the hidden states its drafter reads),
``greedy_accept`` takes the argmax of the float32-cast logits in NumPy, and the
rejected rows are dropped with ``KVCache.trim``; the legacy ``generate`` verifies
the drafts only and decodes the anchor alone. Where it can leave classic decode:
a verify row that differs from the single step, the argmax of raw logits where
classic decode takes the logprob argmax (ties in bfloat16), and any target whose
layers are not ``model.model.layers`` with trimmable caches (``qwen3_5``: its
host adapter fails before the first round).

Here: its own loops against classic decode (:mod:`specparity.probes.engine_e2e`),
located by each token's ``n_accepted``; its drafters in DeepSeek's DeepSpec
Qwen3 format (:mod:`specparity.fixtures.dspark`, the format mlx-dspark loads).
"""

from __future__ import annotations

from typing import Any

from specparity.engines import DrafterFormat, EngineSpec, LoadRequest, PinnedEnv


def load(request: LoadRequest) -> Any:
    """dspark-mlx's host adapter on the target, with its DSpark drafter, by its own loaders."""
    from specparity.engines.dspark_mlx.adapter import DsparkMlxEngine

    return DsparkMlxEngine(request.target, request.draft)

ENGINE = EngineSpec(
    name="dspark-mlx",
    description="dspark-mlx 0.1.0: DSpark drafting through its mlx-lm host adapter, greedy_accept, KV trim",
    module="dspark_mlx",
    environments=(
        PinnedEnv("dspark-mlx", ("dspark-mlx==0.1.0", "mlx-lm==0.31.3", "mlx-vlm==0.7.10"),
                  "dspark-mlx 0.1.0 (generate_eager, generate; no server) on mlx-lm 0.31.3",
                  imports=("mlx_lm", "dspark_mlx", "dspark_mlx.generate")),
    ),
    adapter=load,
    e2e_entry_points=("generate_eager", "generate"),
    loops="specparity.engines.dspark_mlx.loops:loops",
    default_checkpoints="specparity.fixtures.dspark:default_checkpoints",
    drafter_format=DrafterFormat("dspark", "specparity.fixtures.dspark:dspark_format",
                                 "DeepSeek's DeepSpec DSpark drafter"),
)
