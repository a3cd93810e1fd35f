"""mlx-lm: the default engine (its verify forward, trim and speculative loop, its server and generate).

Its probe, replay, bisect and e2e run the toolkit's own mlx-lm paths
(``classic_paths``); its adapter (:class:`specparity.probes.engines.mlx_lm.MlxLmEngine`)
is what an engine built on mlx-lm subclasses. Its environments pin one mlx-lm
release each (a version matrix runs one job on several).
"""

from __future__ import annotations

from typing import Any

from specparity.engines import EngineSpec, LoadRequest, PinnedEnv


def load(request: LoadRequest) -> Any:
    """mlx-lm's adapter on the target (and drafter), loaded by mlx-lm."""
    from specparity.checkpoint import load_checkpoint
    from specparity.probes.engines.mlx_lm import MlxLmEngine

    target = load_checkpoint(request.target, trust_remote_code=request.trust_remote_code)
    draft = (load_checkpoint(request.draft, trust_remote_code=request.trust_remote_code, flag="--draft-model")
             if request.draft is not None else None)
    return MlxLmEngine(target, draft)


ENGINE = EngineSpec(
    name="mlx-lm",
    description="mlx-lm's own verify forward, trim and speculative decoding (the toolkit's own paths)",
    module="mlx_lm",
    environments=(
        PinnedEnv("mlx-lm-0.31.3", ("mlx-lm==0.31.3",), "mlx-lm 0.31.3 (its server and generate)",
                  imports=("mlx_lm",)),
        PinnedEnv("mlx-lm-0.32.2", ("mlx-lm==0.32.2",), "mlx-lm 0.32.2 (its server and generate)",
                  imports=("mlx_lm",)),
    ),
    profiles=("mlx-lm", "specparity-serve"),
    adapter=load,
    classic_paths=True,
    e2e_entry_points=("stream_generate", "generate", "cli"),
)
