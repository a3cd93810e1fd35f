"""DFlash fixture pairs (a target and a DFlash drafter dflash-mlx loads) for the served tests and bench.

One function, :func:`dflash_fixture`: the fixture builder's pair
(``specparity.dflash_fixtures.build_dflash_pair``: the drafter fitted to its
target, with a spread accept mix), built once per ``work`` directory and name.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from specparity.environments import Environment

_BUILT: dict[str, dict[str, str]] = {}


def fixture_name(shape: str, block_size: int, dtype: str, tied: bool) -> str:
    from specparity.dflash_fixtures import dflash_fixture_name

    return dflash_fixture_name(shape, block_size, dtype, tied)


def dflash_fixture(env: Environment, shape: str = "qwen3", block_size: int = 8, dtype: str = "float32",
                   tied: bool = False, work: Path | None = None) -> dict[str, str]:
    """``{"target": DIR, "draft": DIR, "fitted": "yes"}`` for a DFlash pair of this shape, built under ``work``.

    ``env``: the dflash-mlx environment the pair is served from (kept for the callers' signature: the
    builder runs here, in the toolkit's own interpreter).
    """
    from specparity.dflash_fixtures import build_dflash_pair

    root = work or Path(tempfile.mkdtemp(prefix="dflash-pair-"))
    out = root / fixture_name(shape, block_size, dtype, tied)
    if str(out) not in _BUILT:
        info = build_dflash_pair(out, shape=shape, block_size=block_size, dtype=dtype, tied=tied)
        _BUILT[str(out)] = {"target": str(info.target), "draft": str(info.draft), "fitted": "yes"}
    return _BUILT[str(out)]
