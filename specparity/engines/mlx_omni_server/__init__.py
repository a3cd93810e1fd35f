"""mlx-omni-server 0.5.3: an OpenAI-style server whose chat requests may name a plain mlx-lm drafter.

Its speculative entry point: a chat request's ``draft_model`` field (beside the required ``model``): its
``ChatGenerator`` for that (model, drafter) pair loads both with ``mlx_lm.load`` and generates with mlx-lm's own
``stream_generate(draft_model=...)`` at mlx-lm's default of 2 drafts per round (no request field or flag sets it),
behind its own prompt cache (one per model, trimmed to the common prefix). It states no lossless claim.

Here: its generation path in process (:mod:`specparity.engines.mlx_omni_server.loops`, ``e2e --engine
mlx-omni-server``: its ``ChatGenerator`` and prompt cache against classic decode); its server has a profile
(``mlx-omni-server``) whose hooks say why it cannot run here: its app imports misaki's English G2P at start, which
downloads spaCy's ``en_core_web_sm`` from outside the package registries.

Its pinned dependencies do not install beside the shared CPU mlx: ``mflux`` (image generation) needs
``mlx[cuda13]`` below 0.32 on Linux. The environment installs the server with ``--no-deps`` and the dependencies
its chat path and its app's start need (``left_out`` says what is missing and why).
"""

from __future__ import annotations

from specparity.engines import EngineSpec, PinnedEnv
from specparity.engines.mlx_omni_server.loops import ENTRY_POINTS

# its chat path and its app's start (misaki's G2P runs at import), at the newest releases its pins allow (resolved
# here, Dec 2026); outlines 1.0.4 (its pin) needs torch: the CPU build on this machine's disk
_CHAT_SERVER = (
    "mlx-lm==0.31.3", "fastapi==0.139.2", "pydantic==2.14.4", "python-multipart==0.0.34", "rich==15.0.0",
    "sse-starlette==2.4.1", "uvicorn==0.34.3", "outlines==1.0.4", "torch==2.13.0", "misaki[en]==0.9.4",
)

ENGINE = EngineSpec(
    name="mlx-omni-server",
    description="mlx-omni-server 0.5.3: OpenAI-style server, a per-request draft_model (mlx-lm's stream_generate)",
    module="mlx_omni_server.chat.mlx.chat_generator",
    environments=(
        PinnedEnv("mlx-omni-server", _CHAT_SERVER,
                  "mlx-omni-server 0.5.3 (its chat path, a per-request draft_model) on mlx-lm 0.31.3",
                  imports=("mlx_lm", "mlx_omni_server.chat.mlx.chat_generator",
                           "mlx_omni_server.chat.mlx.wrapper_cache", "misaki.en"),
                  no_deps=("mlx-omni-server==0.5.3",),
                  left_out=(
                      "mflux (image generation): every release its pins allow needs mlx[cuda13]<0.32 on Linux, the"
                      " CUDA build (pip install mlx-omni-server==0.5.3 alone takes mlx 0.31.1 with CUDA 13 and"
                      " torch's NVIDIA libraries; no GPU here), below the mlx 0.32.4 every environment shares",
                      "f5-tts-mlx, mlx-audio, mlx-whisper, mlx-embeddings, mlx-vlm, numba: its speech, transcription,"
                      " embedding and vision routers, which its application imports after misaki's G2P (which stops"
                      " it here first: it downloads spaCy's en_core_web_sm from outside the package registries)",
                      "transformers<5.9: every packaged environment shares transformers 5.24.0",
                  )),
    ),
    # no adapter: its verify and rollback are mlx-lm's speculative_generate_step (e2e --engine mlx-lm); its own is
    # the chat path around it (its ChatGenerator, its prompt cache), run in process by its loops
    e2e_entry_points=ENTRY_POINTS,
    loops="specparity.engines.mlx_omni_server.loops:loops",
    profiles=("mlx-omni-server",),
    hooks="specparity.engines.mlx_omni_server.served",
)
