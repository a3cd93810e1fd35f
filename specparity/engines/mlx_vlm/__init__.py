"""mlx-vlm 0.7.10: vision-language models on MLX, whose decode loop drafts with DFlash, MTP or EAGLE-3 drafters.

Its claim: its verify helpers are "exact" (``exact_speculative_verify``, Metal kernels for some families), and a
greedy speculative round accepts a draft only where it equals the target's token (``_speculative_walk``). What
that rests on: ``generate_step(..., draft_model=D, draft_kind=K)`` (what its ``stream_generate``, its
``python -m mlx_vlm.generate --draft-model`` and ``mlx_vlm.server --draft-model`` run) prefills the target,
emits its first token, then runs the drafter's round loop: draft a block, verify it in one target forward,
walk the accepted prefix, roll the target's caches back (``commit_speculative_round``). Drafters load through
``mlx_vlm.speculative.load_drafter``: a DFlash drafter beside the target, or a native checkpoint's embedded MTP
head split out in memory.

Here: its own loops against classic decode (:mod:`specparity.engines.mlx_vlm.loops`, ``e2e --engine
mlx-vlm``), its record per round read off the drafter's own ``accept_lens`` / ``draft_lens``; its server (profile
``mlx-vlm``, hooks :mod:`specparity.engines.mlx_vlm.served`, started by :mod:`specparity.engines.mlx_vlm.serve`),
whose evidence is each response's ``timings``. Its fixture format ``mlx-vlm``
(:mod:`specparity.engines.mlx_vlm.fixtures`) is yunshu's (a qwen3_5 VLM checkpoint with its MTP head inside, and a
DFlash drafter), its chat template reading a message's text parts as its server hands them over; mlx-lm reads the
target too. No adapter: its verify and rollback live inside each round loop.
"""

from __future__ import annotations

from specparity.engines import DrafterFormat, EngineSpec, PinnedEnv
from specparity.engines.mlx_vlm.loops import ENTRY_NAMES

ENGINE = EngineSpec(
    name="mlx-vlm",
    description="mlx-vlm 0.7.10: VLM generate_step and server, DFlash / MTP / EAGLE-3 drafting",
    module="mlx_vlm",
    environments=(
        # its own dependencies resolve on Linux (mlx-audio, opencv-python among them); mlx-lm for classic decode
        PinnedEnv("mlx-vlm", ("mlx-vlm==0.7.10", "mlx-lm==0.32.2"),
                  "mlx-vlm 0.7.10 (generate_step's speculative loops, mlx_vlm.server) on mlx-lm 0.32.2",
                  imports=("mlx_lm", "mlx_vlm", "mlx_vlm.generate",
                           "mlx_vlm.speculative.dflash", "mlx_vlm.speculative.mtp", "mlx_vlm.server")),
    ),
    # its loops only: verify and rollback live inside each round loop (no block a probe could drive from outside)
    e2e_entry_points=ENTRY_NAMES,
    loops="specparity.engines.mlx_vlm.loops:loops",
    profiles=("mlx-vlm",),
    hooks="specparity.engines.mlx_vlm.served",
    # its fixture is yunshu's, re-templated for its server's chat prompts
    builds_on=("yunshu",),
    drafter_format=DrafterFormat("mlx-vlm", "specparity.engines.mlx_vlm.fixtures:mlx_vlm_format",
                                 "yunshu's qwen3_5 VLM fixture, its chat template reading a message's text parts",
                                 shapes=("qwen3_5", "qwen3_5-equal-heads"),
                                 default={"shape": "qwen3_5", "tied": True, "block_size": 8}),
)
