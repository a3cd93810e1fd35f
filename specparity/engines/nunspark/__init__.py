"""nunspark 0.13.0: a weight-streaming target in its own packed format, a resident drafter, one verify per round.

Its claim: at ``accept_top_k=1`` (its default) a draft is accepted only where it equals the target's argmax,
"lossless-by-construction" (tiny fixtures "exactly bit-identical"); ``accept_top_k`` > 1 is its documented
lossy fast mode. What that rests on: ``nunspark pack`` splits an mlx-lm checkpoint into pieces a
``StreamingEngine`` streams through one compute slot (mlx-lm's own layer classes); each round drafts K tokens
(a plain mlx-lm draft model, an n-gram lookup, an EAGLE head or a Gemma 4 assistant), verifies [b, drafts] in
one pass (``verify_forward`` on ephemeral cache clones, then ``commit_verified`` of the accepted rows; the
adaptive, EAGLE and Gemma 4 loops ``forward`` and ``kv.truncate``) and takes the raw-logit argmax of each row.

Here: its own loops and its CLI against classic decode (:mod:`specparity.engines.nunspark.loops`, ``e2e --engine
nunspark``), its record per round read off its own ``SpecStats``; its lossy mode an entry point of its own
(``speculative_generate accept_top_k=4``), reported ``lossy_by_design`` with what it changed. No adapter (its
verify and commit live inside each loop) and no served profile (its server takes chat messages only and says
nothing of its drafts). Its pins allow mlx-lm >= 0.31.0: one environment on 0.31.3, one on 0.32.2 (where
``verify_forward`` raises).
"""

from __future__ import annotations

from specparity.engines import EngineSpec, PinnedEnv
from specparity.engines.nunspark.loops import ENTRY_NAMES

_IMPORTS = ("mlx_lm", "nunspark", "nunspark.generate", "nunspark.engine", "nunspark.server", "nunspark.cli")

ENGINE = EngineSpec(
    name="nunspark",
    description="nunspark 0.13.0: streamed packed target, draft-model / n-gram / adaptive drafting, one verify",
    module="nunspark",
    environments=(
        PinnedEnv("nunspark", ("nunspark==0.13.0", "mlx-lm==0.31.3"),
                  "nunspark 0.13.0 (speculative_generate, nunspark generate / serve) on mlx-lm 0.31.3",
                  imports=_IMPORTS),
        PinnedEnv("nunspark-mlx-lm-0.32.2", ("nunspark==0.13.0", "mlx-lm==0.32.2"),
                  "nunspark 0.13.0 on mlx-lm 0.32.2", imports=_IMPORTS),
    ),
    # its loops only: its verify and commit live inside each loop (no block a probe could drive from outside)
    e2e_entry_points=ENTRY_NAMES,
    loops="specparity.engines.nunspark.loops:loops",
)
