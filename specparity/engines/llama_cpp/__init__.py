"""llama.cpp: ``llama-server`` served only (no in-process adapter: it does not compute in MLX).

Its hooks (:mod:`specparity.engines.llama_cpp.served`) find the binary
``scripts/build-llama-server`` built and export each checkpoint to GGUF once.
"""

from __future__ import annotations

from specparity.engines import EngineSpec

ENGINE = EngineSpec(
    name="llama.cpp",
    description="llama.cpp's llama-server (served only; arithmetic other than MLX)",
    profiles=("llama.cpp",),
    hooks="specparity.engines.llama_cpp.served",
)
