"""nunspark 0.13.0: a weight-streaming target (its own packed format), a resident drafter, one verify per round.

(draft; filled in below as the package grows)
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
