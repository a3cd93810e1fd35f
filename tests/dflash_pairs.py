"""DFlash fixture pairs (a target and a DFlash drafter dflash-mlx loads) for the DFlash tests and bench.

The builder's pair (``specparity.fixtures.dflash.build_dflash_pair``: the drafter
fitted to its target), built once per process and root: :func:`dflash_info`
for the tests (under the session's ``fixture_root``, so tests/engines/test_dflash_mlx.py and
tests/engines/test_dflash_mlx_served.py share every pair), and :func:`dflash_fixture` for the
bench's ``{"target", "draft"}``.

The tests' pairs are fitted to :data:`TEST_BALANCE`: the drafter stops at the
first checkpoint where full, partial and zero-accept blocks all occur (what the
tests need, and what the fixture test asserts), a few seconds each; the bench's,
like ``specparity fixtures make --dflash``, until each kind is a tenth of the rounds.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from specparity.environments import Environment

if TYPE_CHECKING:
    from specparity.fixtures.dflash import DFlashFixtureInfo

TEST_BALANCE = 0.0
_BUILT: dict[str, DFlashFixtureInfo] = {}


def dflash_info(root: Path, shape: str = "qwen3", block_size: int = 8, dtype: str = "float32",
                tied: bool = False, balance: float = TEST_BALANCE) -> DFlashFixtureInfo:
    """The DFlash pair of these arguments under ``root``, built on first use in this process.

    Its directory is named by every argument (``dflash_fixture_name``, as the
    shared cache names it), so a cached pair is never one built with other arguments.
    """
    from fixture_pairs import dflash

    made = dflash(shape, block_size, dtype, tied, balance)
    if str(root / made.name) not in _BUILT:
        _BUILT[str(root / made.name)] = made.build(root)
    return _BUILT[str(root / made.name)]


def pair_dirs(info: DFlashFixtureInfo) -> dict[str, str]:
    """``{"target": DIR, "draft": DIR, "fitted": "yes"}``: what a served pairing takes."""
    return {"target": info.target, "draft": info.draft, "fitted": "yes"}


def dflash_fixture(env: Environment, shape: str = "qwen3", block_size: int = 8, dtype: str = "float32",
                   tied: bool = False, work: Path | None = None) -> dict[str, str]:
    """:func:`pair_dirs` of a DFlash pair fitted as ``fixtures make --dflash`` fits one, built under ``work``.

    ``env``: the dflash-mlx environment the pair is served from (kept for the callers' signature: the
    builder runs here, in the toolkit's own interpreter).
    """
    from specparity.fixtures.dflash import BALANCE

    root = work or Path(tempfile.mkdtemp(prefix="dflash-pair-"))
    return pair_dirs(dflash_info(root, shape, block_size, dtype, tied, balance=BALANCE))
