"""yunshu 0.1.5: a local OpenAI/Anthropic-style server whose qwen3_5-family lane drafts with DFlash or the MTP head.

Its claim: "lossless: batch-invariant verify, spec on == off" (greedy output with speculation on is
token-identical to speculation off). What that rests on: a qwen3_5-family checkpoint that mlx-vlm loads (a
``vision_config``) is served by its VLM batch runner, whose single-request speculative lane drafts with a DFlash
drafter (``YUNSHU_VLM_DRAFT=DIR``) or the checkpoint's MTP head (``=mtp``), verifies in one target forward
through its own row-invariant kernels, and with the lane off (``=off``) decodes through the same kernels. A
text-only config goes to its text engine (no DFlash or MTP path).

Here: its server only (profiles ``yunshu`` and ``yunshu-mtp``, hooks :mod:`specparity.engines.yunshu.served`,
whose evidence is each response's ``x_yunshu.speculative`` block); its fixture format ``yunshu``
(:mod:`specparity.engines.yunshu.fixtures`). No adapter and no loops: its lane lives inside its batch runner.
It requires Python 3.13 and pins mlx < 0.32.4, which the shared mlx 0.32.4 replaces (``left_out``).
"""

from __future__ import annotations

from specparity.engines import DrafterFormat, EngineSpec, PinnedEnv

# yunshu's own dependencies at the newest releases its pins allow (resolved here under Python 3.13), its
# `vision` extra's mlx-vlm (its speculative lane is mlx-vlm's qwen3_5 model and drafters) at the release its
# own resolution picks (0.7.8: the last that allows mlx 0.32.3)
_DEPS = (
    "mlx-lm==0.32.2", "mlx-vlm==0.7.8", "pillow==13.0.0",
    "argon2-cffi==25.1.0", "fastapi==0.165.0", "httpx==0.29.0", "huggingface-hub==2.4.0", "jsonschema==4.26.0",
    "langdetect==1.0.9", "llguidance==1.9.1", "numpy==2.5.5", "openai==3.63.0", "opentelemetry-api==1.45.2",
    "opentelemetry-instrumentation-fastapi==0.66b2", "opentelemetry-sdk==1.45.2", "packaging==26.4",
    "prometheus-client==0.26.0", "psutil==7.2.2", "pycountry==26.2.16", "pydantic==2.14.4", "pyjwt==2.15.1",
    "pypdf==7.1.1", "pypdfium2==5.15.2", "python-multipart==0.0.34", "regex==2026.12.2", "rich==15.0.0",
    "safetensors==0.8.0", "scipy==1.18.1", "sse-starlette==3.7.1", "structlog==26.1.0", "tokenizers==0.23.3",
    "tqdm==4.70.1", "trafilatura==2.1.0", "typer==0.29.2", "uvicorn[standard]==0.55.0", "websockets==17.4",
)

ENGINE = EngineSpec(
    name="yunshu",
    description="yunshu 0.1.5: OpenAI-style server, DFlash or MTP-head drafting for qwen3_5 (mlx-vlm lane)",
    module="yunshu_engine",
    environments=(
        PinnedEnv("yunshu", _DEPS,
                  "yunshu 0.1.5 (yunshu serve, its qwen3_5 speculative lane) on mlx-lm 0.32.2, mlx-vlm 0.7.8",
                  imports=("mlx_lm", "mlx_vlm", "yunshu_engine", "yunshu_engine.vlm_engine", "yunshu_cli"),
                  no_deps=("yunshu==0.1.5",),
                  left_out=("yunshu's pin mlx>=0.32.3,<0.32.4: every packaged environment shares mlx 0.32.4,"
                            " which stands in (yunshu 0.1.5 installed without its dependencies, each listed here)",),
                  python="3.13"),
    ),
    # served only: its lane runs inside its server's batch runner (VLMBatchRunner on its one MLX thread), no
    # library loop a command can drive; its standalone mlxvlm_mtp backend is mlx-vlm's own loop ("no serving
    # dispatch", EXPERIMENTAL)
    profiles=("yunshu", "yunshu-mtp"),
    # its fixture's MTP head is mtplx's (the layout mlx-vlm's qwen3_5_mtp reads too)
    builds_on=("mtplx",),
    hooks="specparity.engines.yunshu.served",
    drafter_format=DrafterFormat("yunshu", "specparity.engines.yunshu.fixtures:yunshu_format",
                                 "a qwen3_5 VLM checkpoint with its MTP head inside, and a DFlash drafter (yunshu)",
                                 shapes=("qwen3_5", "qwen3_5-equal-heads"),
                                 default={"shape": "qwen3_5", "tied": True, "block_size": 8}),
)
