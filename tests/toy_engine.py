"""A toy engine in one module (registered with SPECPARITY_ENGINES=toy_engine): mlx-lm whose rollback keeps
one rejected row, the fault every command must find and name."""

from __future__ import annotations

from typing import Any

from specparity.engines import EngineSpec, LoadRequest


def load(request: LoadRequest) -> Any:
    from specparity.checkpoint import load_checkpoint
    from specparity.probes.engines.mlx_lm import MlxLmEngine, MlxLmSession

    class StaleSession(MlxLmSession):
        def rollback(self, accepted: int) -> None:
            # the deliberate fault: one rejected row too many kept
            super().rollback(min(accepted + 1, len(self._block) - 1))

    class ToyEngine(MlxLmEngine):
        def session(self) -> StaleSession:
            return StaleSession(self.model, self.opts)

    eng = ToyEngine(load_checkpoint(request.target, trust_remote_code=request.trust_remote_code))
    eng.info.name = "toy"
    return eng


ENGINE = EngineSpec(name="toy", description="mlx-lm with a rollback that keeps one rejected row", adapter=load)
