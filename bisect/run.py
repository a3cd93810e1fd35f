"""The in-process bisect: both arms captured once each, then the per-layer report."""

from __future__ import annotations

from typing import Any

from specparity.bisect.arms import BisectCapture, run_arms
from specparity.bisect.report import BisectReport, compare_arms
from specparity.decode import CacheOptions


def model_meta(loaded: Any) -> dict[str, Any]:
    """What a report and a dump say about the model: type, fingerprint, dtype, path."""
    from specparity.checkpoint import model_dtype

    fp = loaded.fingerprint
    return {"model_type": fp.model_type, "fingerprint": fp.digest,
            "dtype": model_dtype(loaded.model), "path": str(loaded.path)}


def bisect_model(loaded: Any, prompt: list[int], width: int, depth: int,
                 opts: CacheOptions | None = None) -> tuple[BisectCapture, BisectReport]:
    """Run chain and block once each with capture on; compare chain against block."""
    bc = run_arms(loaded.model, prompt, width, depth, opts)
    meta = model_meta(loaded)
    meta.update(prompt_tokens=len(prompt),
                cache_options=(opts or CacheOptions()).describe(),
                capture_bytes=bc.capture_bytes)
    report = compare_arms(bc.arms["chain"], bc.arms["block"], width, depth, bc.layer_kinds,
                          meta=meta)
    return bc, report
