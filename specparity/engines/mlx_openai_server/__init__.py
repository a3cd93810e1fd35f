"""mlx-openai-server 1.8.1: an OpenAI-style server whose text models draft with a plain mlx-lm drafter.

Its speculative entry point: ``mlx-openai-server launch --model-type lm --draft-model-path D
--num-draft-tokens K`` loads D with ``mlx_lm.load`` beside the target and hands every chat request to
mlx-lm's own ``stream_generate(draft_model=D, num_draft_tokens=K)`` (its single-request path: a drafter turns
its continuous batcher off). It states no lossless claim. Here: its server only (profile
``mlx-openai-server``, hooks :mod:`specparity.engines.mlx_openai_server.served`): its loop is mlx-lm's, its
prompt cache (an LRU of target + drafter caches, trimmed to the common prefix) is its own. It answers
``/v1/chat/completions`` only and reports nothing of its drafts, so the witness wrappers (both checkpoints load
through ``mlx_lm.load``, whose ``model_file`` runs without a switch in 0.31.3) are the evidence the drafter ran.

Its pinned dependencies do not install on Linux: ``mflux`` (image generation) needs ``mlx[cuda13]``, which has
no build here. The environment installs the server with ``--no-deps`` and the dependencies its text server
imports (``left_out`` says what is missing and why).
"""

from __future__ import annotations

from specparity.engines import EngineSpec, PinnedEnv
from specparity.engines.mlx_openai_server.loops import ENTRY_POINTS

# what `launch --model-type lm` imports, at the newest releases its pins allow (resolved here, Dec 2026); outlines
# (its JSON-schema processor, imported at start) needs torch: the CPU build on this machine's disk
_TEXT_SERVER = (
    "mlx-lm==0.31.3", "aiofiles==25.1.0", "dill==0.4.1", "fastapi==0.129.2", "json_repair==0.59.10",
    "loguru==0.7.3", "numpy==2.3.5", "openai==2.54.0", "openai-harmony==0.0.8", "outlines==1.1.1",
    "pillow==12.3.0", "pydantic==2.14.4", "python-multipart==0.0.24", "rich==14.3.4", "uvicorn==0.39.0",
    "xxhash==3.8.2", "torch==2.13.0",
)

ENGINE = EngineSpec(
    name="mlx-openai-server",
    description="mlx-openai-server 1.8.1: OpenAI-style server, mlx-lm's stream_generate with a plain drafter",
    # its handler's model wrapper (the package is named app)
    module="app.models.mlx_lm",
    environments=(
        PinnedEnv("mlx-openai-server", _TEXT_SERVER,
                  "mlx-openai-server 1.8.1 (launch --model-type lm --draft-model-path) on mlx-lm 0.31.3, text only",
                  imports=("mlx_lm", "app.cli", "app.server", "app.handler.mlx_lm", "app.models.mlx_lm"),
                  no_deps=("mlx-openai-server==1.8.1",),
                  left_out=(
                      "mflux (image generation): every release its pins allow needs mlx[cuda13] on Linux, which has"
                      " no build here (pip install mlx-openai-server==1.8.1 is ResolutionImpossible)",
                      "mlx-vlm, mlx-whisper, mlx-embeddings, av, librosa, torchvision: its multimodal, audio and"
                      " embedding model types, not imported by --model-type lm",
                      "click<8.4: transformers 5.24.0 needs huggingface-hub 2.x, which needs click>=8.4.2; the"
                      " server runs on the click specparity's pins give",
                  )),
    ),
    # no adapter: its verify and rollback are mlx-lm's speculative_generate_step (e2e --engine mlx-lm); its own
    # is the request path around it (its model wrapper, its prompt cache), run in process by its loops
    e2e_entry_points=ENTRY_POINTS,
    loops="specparity.engines.mlx_openai_server.loops:loops",
    profiles=("mlx-openai-server",),
    hooks="specparity.engines.mlx_openai_server.served",
)
