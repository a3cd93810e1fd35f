"""mlx-flash 0.9.2: LayerSkip, EAGLE-3 and DFlash speculative decoding in its own loops, and a server.

Its claim: LayerSkip drafts from the target's early layers "while maintaining lossless verification"; each
engine verifies [context + drafts] with the full target and accepts the longest prefix equal to the target's
argmax, plus a bonus token. What that rests on: ``LayerSkipEngine.generate`` (its KV cache, the first half of
the layers drafting K = 5 tokens, a trim of the draft rows, one verify of [last, drafts], a trim of the
rejected ones), ``EAGLE3Engine.generate`` (its own hidden-state head, ``EAGLEDraftHead``, saved by its
``EAGLE3Trainer``; every verify re-runs the whole sequence without a cache), ``DFlashEngine.generate`` (its
``BlockDiffusionDrafter``; the server builds it without one: plain decoding) and ``DFlashRunner.generate``
(a z-lab DFlash drafter from ``DFlashDraftModel.from_pretrained``: a cache snapshot per round, a replay of
the accepted tokens; ``accept_top_k`` > 1 and ``acceptance_threshold`` > 0 are its documented quality-for-speed
modes). Each takes the raw-logit argmax of its verify rows.

Here: its own loops against classic decode (:mod:`specparity.engines.mlx_flash.loops`, ``e2e --engine
mlx-flash``), each loop's record per round read off its own verify step; its lossy mode an entry point of its
own; its EAGLE head a fixture format of this package (:mod:`specparity.engines.mlx_flash.fixtures`). No
adapter (its verify and rollback live inside each loop). Its server (``mlx-flash --speculative ...``) cannot
start on Linux (:mod:`specparity.engines.mlx_flash.served`).
"""

from __future__ import annotations

from specparity.engines import DrafterFormat, EngineSpec, PinnedEnv
from specparity.engines.mlx_flash.loops import ENTRY_NAMES

_IMPORTS = ("mlx_lm", "mlx_flash_compress", "mlx_flash_compress.layerskip", "mlx_flash_compress.eagle3",
            "mlx_flash_compress.dflash", "mlx_flash_compress.dflash_model")

ENGINE = EngineSpec(
    name="mlx-flash",
    description="mlx-flash 0.9.2: LayerSkip (self-speculative), EAGLE-3 head and DFlash loops, full-target verify",
    module="mlx_flash_compress",
    environments=(
        # its pins: mlx-lm >= 0.32.0 (0.32.2 the newest); pyyaml, which its server imports undeclared, is
        # specparity's own dependency
        PinnedEnv("mlx-flash", ("mlx-flash==0.9.2", "mlx-lm==0.32.2"),
                  "mlx-flash 0.9.2 (LayerSkipEngine, EAGLE3Engine, DFlashEngine, DFlashRunner; its server) on"
                  " mlx-lm 0.32.2", imports=_IMPORTS),
    ),
    # its loops only: verify and rollback live inside each loop (no block a probe could drive from outside)
    e2e_entry_points=ENTRY_NAMES,
    loops="specparity.engines.mlx_flash.loops:loops",
    drafter_format=DrafterFormat("mlx-flash", "specparity.engines.mlx_flash.fixtures:build",
                                 "a DFlash pair with mlx-flash's own EAGLE head (EAGLEDraftHead, fitted) beside it",
                                 default={"shape": "qwen3", "block_size": 8}),
)
