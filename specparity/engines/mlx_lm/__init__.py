"""mlx-lm: the default engine (its verify forward, trim and speculative loop, its server and generate).

Its probe, bisect and e2e run through its adapter
(:class:`specparity.probes.engines.mlx_lm.MlxLmEngine`), as every engine's do; the adapter
supports every optional check (cache options, walk, prefill parity, aimed blocks, bisect's
control arms) and is what an engine built on mlx-lm subclasses. Its replay runs through the
adapter too: its session prefills to the anchor token, rewinds by trim or snapshot-and-recompute
and reports every layer's offset (``adapter_features``), so an accept vector, a served log with
its tokens and processors, ``--algebra-only``, ``--locate`` and ``--sequence`` take the replay
core with rewind offsets. Its
environments pin one mlx-lm release each (a version matrix runs one job on several).
"""

from __future__ import annotations

from typing import Any

from specparity.engines import EngineSpec, LoadRequest, PinnedEnv


def load(request: LoadRequest) -> Any:
    """mlx-lm's adapter on the target, with the request's cache options; the drafter loads when its loop runs."""
    from specparity.checkpoint import load_checkpoint
    from specparity.probes.engines.mlx_lm import MlxLmEngine

    target = request.loaded or load_checkpoint(request.target, trust_remote_code=request.trust_remote_code)
    eng = MlxLmEngine(target, request.draft, opts=request.cache, trust_remote_code=request.trust_remote_code)
    # its trim is replayed round by round by `replay`; the probe checks every accept k when asked (--rollback)
    eng.rollback_default = False
    return eng


ENGINE = EngineSpec(
    name="mlx-lm",
    description="mlx-lm's own verify forward, trim and speculative decoding",
    module="mlx_lm",
    environments=(
        PinnedEnv("mlx-lm-0.31.3", ("mlx-lm==0.31.3",), "mlx-lm 0.31.3 (its server and generate)",
                  imports=("mlx_lm",)),
        PinnedEnv("mlx-lm-0.32.2", ("mlx-lm==0.32.2",), "mlx-lm 0.32.2 (its server and generate)",
                  imports=("mlx_lm",)),
    ),
    profiles=("mlx-lm", "specparity-serve"),
    adapter=load,
    # what replay routes on before anything loads (MlxLmEngine supports every feature)
    adapter_features=frozenset({"anchor-prefill", "layer-offsets", "rewind-modes"}),
    e2e_entry_points=("stream_generate", "generate", "cli"),
    e2e_options=True,
    e2e="specparity.probes.e2e:run_mlx_lm_e2e",
)
