"""The fixture pairs that take seconds to build: built once, before pytest, by ``scripts/build-test-fixtures``
(README's test line and ``.ci/run`` run it after the engines' environments), into the tests' fixture cache
(tests/fixture_cache.py), so that no test pays a fit.

Each is named here with its builder and arguments, and the tests ask for it by name (:func:`pair`), or through
a helper that computes the same name and arguments (:func:`dflash`, :func:`built_pair`): what is built before
pytest is what the tests read. Under ``CI``, a test that would build one of these (the script was not run, or
the pair it built changed) fails and says so; a pair not listed here that took more than
:data:`SLOW_BUILD` seconds to build in a run is named in the run's summary (tests/conftest.py), so the list
keeps up with the tests. The cheap pairs (a tiny random model: under a second or two) are built where they are
first used, as before.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SLOW_BUILD = 5.0  # seconds: a pair built in a run that took longer belongs in PAIRS


@dataclass(frozen=True)
class Pair:
    name: str
    builder: str  # "module:function"
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    def function(self) -> Any:
        module, _, qualname = self.builder.partition(":")
        return getattr(importlib.import_module(module), qualname)

    def build(self, root: Path) -> Any:
        """The pair, from the cache (or built into it; under ``root`` when the cache is off)."""
        from fixture_cache import cached

        return cached(self.function(), root, self.name, *self.args, **self.kwargs)

    def key(self) -> tuple[str, str]:
        from fixture_cache import spec_of

        return self.name, spec_of(self.function(), self.args, self.kwargs)


def dflash(shape: str = "qwen3", block_size: int = 8, dtype: str = "float32", tied: bool = False,
           balance: float = 0.0) -> Pair:
    """The DFlash pair of these arguments (tests/dflash_pairs.py's ``dflash_info`` builds through this)."""
    from specparity.fixtures.dflash import dflash_fixture_name

    return Pair(dflash_fixture_name(shape, block_size, dtype, tied, balance),
                "specparity.fixtures.dflash:build_dflash_pair",
                kwargs={"shape": shape, "block_size": block_size, "dtype": dtype, "tied": tied, "balance": balance})


def built_pair(name: str, **kwargs: Any) -> Pair:
    """``build_pair(**kwargs)`` as tests/conftest.py's ``build`` names it: NAME-DIGEST of the arguments, so a
    name reused with other arguments never lands in the same folder."""
    digest = hashlib.sha256(json.dumps(kwargs, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return Pair(f"{name}-{digest}", "specparity.fixtures:build_pair", kwargs=kwargs)


def _mlx_flash(name: str, shape: str, tied: bool, dtype: str = "float32") -> Pair:
    return Pair(name, "specparity.engines.mlx_flash.fixtures:build",
                kwargs={"shape": shape, "dtype": dtype, "tied": tied, "block_size": 8, "seed": 0,
                        "overwrite": False, "note": print})


# build seconds on the 2-core machine of docs/install.md, to the right: the longest first
PAIRS: dict[str, Pair] = {p.name: p for p in [
    _mlx_flash("mlx-flash-qwen3_5-tied-b8", "qwen3_5", True),  # 170 s (a 400-step EAGLE-head fit)
    _mlx_flash("mlx-flash-qwen3_5-untied-b8", "qwen3_5", False),  # 163 s
    _mlx_flash("mlx-flash-qwen3-b8", "qwen3", False),  # 144 s
    _mlx_flash("mlx-flash-qwen3-bfloat16-b8", "qwen3", False, "bfloat16"),
    _mlx_flash("mlx-flash-qwen3_5-bfloat16-tied-b8", "qwen3_5", True, "bfloat16"),
    _mlx_flash("mlx-flash-qwen3_5-bfloat16-untied-b8", "qwen3_5", False, "bfloat16"),
    _mlx_flash("mlx-flash-qwen3_5-equal-heads-tied-b8", "qwen3_5-equal-heads", True),
    _mlx_flash("mlx-flash-qwen3_5-equal-heads-bfloat16-tied-b8", "qwen3_5-equal-heads", True, "bfloat16"),
    Pair("yunshu-qwen3_5-b8", "specparity.engines.yunshu.fixtures:build_yunshu_fixture",
         kwargs={"block_size": 8}),  # 49 s
    Pair("mlx-vlm", "specparity.engines.mlx_vlm.fixtures:build_mlx_vlm_fixture", kwargs={"block_size": 8}),  # 48 s
    Pair("mlx-vlm-equal-heads-bfloat16", "specparity.engines.mlx_vlm.fixtures:build_mlx_vlm_fixture",
         kwargs={"shape": "qwen3_5-equal-heads", "dtype": "bfloat16", "block_size": 8}),  # 26 s
    Pair("mlx-vlm-bfloat16-untied", "specparity.engines.mlx_vlm.fixtures:build_mlx_vlm_fixture",
         kwargs={"shape": "qwen3_5", "dtype": "bfloat16", "tied": False, "block_size": 8}),
    Pair("mlx-vlm-equal-heads-bfloat16-untied", "specparity.engines.mlx_vlm.fixtures:build_mlx_vlm_fixture",
         kwargs={"shape": "qwen3_5-equal-heads", "dtype": "bfloat16", "tied": False, "block_size": 8}),
    Pair("mlx-vlm-bfloat16", "specparity.engines.mlx_vlm.fixtures:build_mlx_vlm_fixture",
         kwargs={"shape": "qwen3_5", "dtype": "bfloat16", "block_size": 8}),
    Pair("mlx-vlm-untied", "specparity.engines.mlx_vlm.fixtures:build_mlx_vlm_fixture",
         kwargs={"shape": "qwen3_5", "tied": False, "block_size": 8}),
    Pair("mlx-vlm-equal-heads", "specparity.engines.mlx_vlm.fixtures:build_mlx_vlm_fixture",
         kwargs={"shape": "qwen3_5-equal-heads", "block_size": 8}),
    Pair("mlx-vlm-equal-heads-untied", "specparity.engines.mlx_vlm.fixtures:build_mlx_vlm_fixture",
         kwargs={"shape": "qwen3_5-equal-heads", "tied": False, "block_size": 8}),
    dflash("qwen3_5-27b", 8, "bfloat16"),  # 21 s
    dflash("qwen3_5-equal-heads", 8),  # 21 s
    Pair("llama-wide-vocab-float32", "specparity.fixtures:build_sized", args=("llama-wide-vocab",),
         kwargs={"dtype": "float32", "bits": None}),  # 21 s
    dflash("qwen3_5-equal-heads", 16, "bfloat16"),  # 18 s
    Pair("broomva-e2b-float32-untied", "specparity.engines.mlx_lm_broomva.fixtures:build_gemma4_pair",
         kwargs={"shape": "gemma4-e2b", "dtype": "float32", "tied": False}),  # 15 s
    Pair("broomva-e2b-float32", "specparity.engines.mlx_lm_broomva.fixtures:build_gemma4_pair",
         kwargs={"shape": "gemma4-e2b", "dtype": "float32", "tied": True}),  # 13 s
    Pair("broomva-e2b-bfloat16", "specparity.engines.mlx_lm_broomva.fixtures:build_gemma4_pair",
         kwargs={"shape": "gemma4-e2b", "dtype": "bfloat16", "tied": True}),  # 19 s
    Pair("broomva-31b-float32", "specparity.engines.mlx_lm_broomva.fixtures:build_gemma4_pair",
         kwargs={"shape": "gemma4-31b", "dtype": "float32", "tied": True}),  # 15 s
    Pair("broomva-e2b-bfloat16-untied", "specparity.engines.mlx_lm_broomva.fixtures:build_gemma4_pair",
         kwargs={"shape": "gemma4-e2b", "dtype": "bfloat16", "tied": False}),
    Pair("broomva-31b-bfloat16", "specparity.engines.mlx_lm_broomva.fixtures:build_gemma4_pair",
         kwargs={"shape": "gemma4-31b", "dtype": "bfloat16", "tied": True}),
    Pair("broomva-31b-float32-untied", "specparity.engines.mlx_lm_broomva.fixtures:build_gemma4_pair",
         kwargs={"shape": "gemma4-31b", "dtype": "float32", "tied": False}),
    Pair("broomva-31b-bfloat16-untied", "specparity.engines.mlx_lm_broomva.fixtures:build_gemma4_pair",
         kwargs={"shape": "gemma4-31b", "dtype": "bfloat16", "tied": False}),
    dflash("qwen3_5-equal-heads", 8, tied=True, balance=0.05),  # 10 s: the DFlash default (docs pages)
    built_pair("qwen3_5-float32", arch="qwen3_5"),  # 10 s
    dflash("qwen3_5", 16, tied=True),  # 9 s
    Pair("dfly-qwen3_5-equal", "specparity.engines.dfly_mlx.fixtures:build_dfly_pair",
         kwargs={"shape": "qwen3_5-equal-heads", "tied": True}),  # 8 s
    Pair("dfly-qwen3", "specparity.engines.dfly_mlx.fixtures:build_dfly_pair"),  # 6 s
    dflash("qwen3", 8),  # 6 s
    dflash("qwen3", 8, "bfloat16"),  # 6 s
    Pair("dfly-qwen3_5", "specparity.engines.dfly_mlx.fixtures:build_dfly_pair",
         kwargs={"shape": "qwen3_5", "tied": True}),  # 5 s
    dflash("qwen3", 16, "bfloat16", tied=True),  # 5 s
    built_pair("gemma3_text-float32", arch="gemma3_text"),  # 5 s
]}


def pair(name: str, root: Path) -> Any:
    """The listed pair ``name`` (see the module)."""
    return PAIRS[name].build(root)


def listed() -> set[tuple[str, str]]:
    """Every listed pair's (name, spec), as tests/fixture_cache.py's ``cached`` names and specifies it."""
    return {p.key() for p in PAIRS.values()}
