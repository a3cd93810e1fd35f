"""vllm-mlx 0.6.0: an OpenAI-style server on mlx-lm with native MTP for Qwen3.5 / Qwen3-Next targets.

Its speculative entry points: ``vllm-mlx serve --enable-mtp --mtp-num-draft-tokens K`` (the target's own MTP
head drafts one token, the target verifies [primary, draft] in one forward; ``--mtp-optimistic`` skips that
check, documented lossy), ``--mllm-draft-model / --mllm-draft-kind mtp`` (an mlx-vlm drafter on the
multimodal path) and ``--specprefill-draft-model`` (a draft scores prompt tokens to prefill fewer: not token
drafting). Here: its server, served with its MTP on and off (:mod:`specparity.engines.vllm_mlx.served`).
"""

from __future__ import annotations

from specparity.engines import DrafterFormat, EngineSpec, PinnedEnv

ENGINE = EngineSpec(
    name="vllm-mlx",
    description="vllm-mlx 0.6.0: OpenAI-style server, native MTP heads of qwen3_5 targets (--enable-mtp)",
    module="vllm_mlx",
    environments=(
        # torch comes in through torchvision (a hard dependency); pinned to the CPU build on this machine's disk
        PinnedEnv("vllm-mlx", ("vllm-mlx==0.6.0", "mlx-lm==0.31.3", "torch==2.13.0", "torchvision==0.28.0"),
                  "vllm-mlx 0.6.0 (its server, MTP on qwen3_5) on mlx-lm 0.31.3 (its pins: >=0.31.3,<0.32)",
                  imports=("mlx_lm", "vllm_mlx", "vllm_mlx.server", "vllm_mlx.scheduler",
                           "vllm_mlx.patches.qwen3_5_mtp")),
        # outside its pins: the last mlx-lm whose BatchGenerator still has the _step hook its MTP patch needs
        PinnedEnv("vllm-mlx-mlx-lm-0.30.7", ("vllm-mlx==0.6.0", "torch==2.13.0", "torchvision==0.28.0"),
                  "vllm-mlx 0.6.0 on mlx-lm 0.30.7 (below its pins: where its MTP patch installs)",
                  imports=("mlx_lm", "vllm_mlx", "vllm_mlx.server", "vllm_mlx.scheduler"),
                  no_deps=("mlx-lm==0.30.7",),
                  left_out=("vllm-mlx 0.6.0's pin mlx-lm>=0.31.3,<0.32: mlx-lm 0.30.7 is installed over it without"
                            " dependencies (on 0.31.x its MTP patch is not installed: no BatchGenerator._step)",)),
    ),
    # served only: its MTP loop is a patch on mlx-lm's BatchGenerator inside its scheduler (no verify block or
    # rollback a probe could drive from outside, no library loop of its own)
    profiles=("vllm-mlx", "vllm-mlx-optimistic"),
    hooks="specparity.engines.vllm_mlx.served",
    drafter_checkpoint=False,
    # its fixture's head tensors are mtplx's (the same module tree), moved to vllm-mlx's file
    builds_on=("mtplx",),
    drafter_format=DrafterFormat("vllm-mlx-mtp", "specparity.engines.vllm_mlx.fixtures:vllm_mlx_mtp_format",
                                 "MTP head inside a qwen3_5 target (vllm-mlx's mtp/weights.safetensors; no drafter)",
                                 default={"shape": "qwen3_5"}),
)
