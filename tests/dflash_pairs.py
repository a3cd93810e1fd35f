"""DFlash fixture pairs (a target and a DFlash drafter dflash-mlx loads) for the DFlash tests and bench.

The builder's pair (``specparity.dflash_fixtures.build_dflash_pair``: the drafter
fitted to its target, with a spread accept mix), built once per process and
root: :func:`dflash_info` for the tests (under the session's ``fixture_root``,
so tests/test_dflash.py and tests/test_dflash_serve.py share every pair), and
:func:`dflash_fixture` for the served tests' and bench's ``{"target", "draft"}``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from specparity.environments import Environment

if TYPE_CHECKING:
    from specparity.dflash_fixtures import DFlashFixtureInfo

_BUILT: dict[str, DFlashFixtureInfo] = {}


def fixture_name(shape: str, block_size: int, dtype: str, tied: bool) -> str:
    from specparity.dflash_fixtures import dflash_fixture_name

    return dflash_fixture_name(shape, block_size, dtype, tied)


def dflash_info(root: Path, shape: str = "qwen3", block_size: int = 8, dtype: str = "float32",
                tied: bool = False) -> DFlashFixtureInfo:
    """The DFlash pair of these arguments under ``root``, built on first use in this process.

    Its directory is named by every argument (:func:`fixture_name`), so a cached
    pair is never one built with other arguments.
    """
    from specparity.dflash_fixtures import build_dflash_pair

    out = root / fixture_name(shape, block_size, dtype, tied)
    if str(out) not in _BUILT:
        _BUILT[str(out)] = build_dflash_pair(out, shape=shape, block_size=block_size, dtype=dtype, tied=tied)
    return _BUILT[str(out)]


def dflash_fixture(env: Environment, shape: str = "qwen3", block_size: int = 8, dtype: str = "float32",
                   tied: bool = False, work: Path | None = None) -> dict[str, str]:
    """``{"target": DIR, "draft": DIR, "fitted": "yes"}`` for a DFlash pair of this shape, built under ``work``.

    ``env``: the dflash-mlx environment the pair is served from (kept for the callers' signature: the
    builder runs here, in the toolkit's own interpreter).
    """
    info = dflash_info(work or Path(tempfile.mkdtemp(prefix="dflash-pair-")), shape, block_size, dtype, tied)
    return {"target": info.target, "draft": info.draft, "fitted": "yes"}
