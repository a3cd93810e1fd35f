"""A toy engine in one module (registered with SPECPARITY_ENGINES=toy_engine): mlx-lm whose rollback keeps
one rejected row, the fault every command must find and name.

In process: its adapter (mlx-lm's, the rollback one row short) and its own loop. Served: ``python -m
toy_engine serve ...`` is mlx_lm.server with the same fault in its rewind (profile toy_engine.yaml; its
``{toy_module}`` placeholder comes from this module's served hook). ``$TOY_ENGINE_CLEAN``: the clean path.
"""

from __future__ import annotations

import os
from typing import Any

from specparity.engines import EngineSpec, LoadRequest


def load(request: LoadRequest) -> Any:
    from specparity.checkpoint import load_checkpoint
    from specparity.probes.engines.base import EngineRound, EngineRun
    from specparity.probes.engines.mlx_lm import MlxLmEngine, MlxLmSession

    class StaleSession(MlxLmSession):
        def rollback(self, accepted: int) -> None:
            # the deliberate fault: one rejected row too many kept ($TOY_ENGINE_CLEAN: the clean path)
            stale = min(accepted + 1, len(self._block) - 1)
            super().rollback(accepted if os.environ.get("TOY_ENGINE_CLEAN") else stale)

    class ToyEngine(MlxLmEngine):
        def session(self) -> StaleSession:
            return StaleSession(self.model, self.opts)

        def generate(self, prompt: list[int], max_tokens: int, record_states: bool = True) -> EngineRun:
            """Its own loop: propose the last token three times, verify the block, keep the agreeing
            prefix and the target's next token, roll back the rest (through its faulty rollback)."""
            from specparity.decode import greedy_token

            sess = self.session()
            token = int(greedy_token(sess.prefill(prompt)[-1]))
            tokens, start = [token], len(prompt)
            rounds: list[EngineRound] = []
            while len(tokens) < max_tokens:
                block = [token] * 4
                logits = sess.verify(block)
                picks = [int(greedy_token(logits[i])) for i in range(len(block))]
                accepted = 0
                while accepted < 3 and picks[accepted] == block[accepted + 1]:
                    accepted += 1
                sess.rollback(accepted)
                rounds.append(EngineRound(len(rounds), 4, accepted, "repeat-last", block, start))
                start += accepted + 1
                tokens += picks[: accepted + 1]
                token = tokens[-1]
            return EngineRun(list(prompt), tokens[:max_tokens], rounds, first_from_prefill=True)

    eng = ToyEngine(load_checkpoint(request.target, trust_remote_code=request.trust_remote_code))
    eng.info.name = "toy"
    return eng


def placeholders() -> dict[str, str]:
    """Served hook: the module its profile's argv runs."""
    return {"toy_module": __name__ if __name__ != "__main__" else "toy_engine"}


def serve(argv: list[str]) -> None:
    """mlx_lm.server whose speculative rewind trims one row short (its target keeps a rejected row)."""
    import sys

    import importlib

    from mlx_lm.server import main

    generate: Any = importlib.import_module("mlx_lm.generate")  # the module (the package exports a function so named)

    trim = generate.trim_prompt_cache

    def short_trim(cache: Any, n: int) -> Any:
        return trim(cache, n if os.environ.get("TOY_ENGINE_CLEAN") or n <= 0 else n - 1)

    generate.trim_prompt_cache = short_trim
    sys.argv = ["mlx_lm.server", *argv]
    main()


ENGINE = EngineSpec(name="toy", description="mlx-lm with a rollback that keeps one rejected row", adapter=load,
                    e2e_entry_points=("generate",), e2e="specparity.probes.engine_e2e:run_generate_e2e",
                    hooks="toy_engine", profiles=("tests/toy_engine.yaml",))

if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2:])
