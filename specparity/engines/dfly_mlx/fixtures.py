"""dfly-mlx's drafter format (``fixtures make --drafter-format dfly``): a DFly drafter made from a fitted
DFlash pair (:mod:`specparity.fixtures.dflash`); only dfly-mlx reads it."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from specparity.fixtures import MadeFixture, accept_mix_warning, pair_lines
from specparity.fixtures.dflash import DFlashFixtureInfo
from specparity.fixtures.dspark import building

DFLY_KIND = "dfly"
DFLY_FC_SCALE = 1e3  # fc scaled up: hidden_norm(c * fc(x) + fusion) is hidden_norm(fc(x)) to ~1/c


@dataclass(kw_only=True)
class DFlyFixtureInfo(DFlashFixtureInfo):
    """What :func:`build_dfly_pair` made: the DFlash pair's build details (its accept mix is the DFlash
    drafter's), the DFly drafter in ``draft``. derived_from: the DFlash pair it was made from."""

    derived_from: str = ""
    kind: str = DFLY_KIND
    WHAT: ClassVar[str] = "a DFly pair"


def build_dfly_pair(out: str | os.PathLike, shape: str = "qwen3", dtype: str = "float32", tied: bool = False,
                    block_size: int = 8, overwrite: bool = False) -> DFlyFixtureInfo:
    """Build ``out/target`` and ``out/draft``: a DFly drafter (dfly-mlx 0.1.0's format) from a fitted DFlash pair.

    DFly is dflash-mlx's DFlash drafter plus a per-layer fusion of the raw target features
    (``layer_fusion_weights``, draft layers x target layers, softmax-mixed into each layer's context)
    and a hidden-state correction before the target's own head (``hidden_correction.*``: two norms and
    a SwiGLU over [hidden, previous token's embedding]); its config names the target's depth
    (``target_num_hidden_layers``) and as many ``num_target_layers`` as it reads. The DFlash pair's
    fitted drafter (:func:`specparity.fixtures.dflash.build_dflash_pair`) keeps its proposals: its
    ``fc`` is scaled by :data:`DFLY_FC_SCALE` (the context norm cancels the scale, the random fusion
    term shrinks to ~1/scale), the fusion weights are random and the correction's down projection is
    zero (its norms and up/gate projections random). The accept mix reported is the DFlash drafter's,
    measured by that builder; the engine's own record in ``engine_e2e`` is the DFly drafter's.
    """
    import mlx.core as mx

    from specparity.fixtures.dflash import build_dflash_pair

    from specparity.fixtures import check_out_dir

    out = Path(out)
    check_out_dir(out, overwrite)  # a directory of the user's, or a link, is refused before any work
    if out.exists() and not overwrite:
        return DFlyFixtureInfo.existing(out, shape=shape, dtype=dtype, tied=bool(tied), block_size=block_size)
    parent = out.parent / (out.name + ".dflash")
    base = build_dflash_pair(parent, shape=shape, block_size=block_size, dtype=dtype, tied=tied, balance=0.0)
    from specparity.fixtures import publishing

    with publishing(out) as tmp:
        shutil.copytree(base.target, tmp / "target")
        shutil.copytree(base.draft, tmp / "draft")
        cfg = json.loads((tmp / "draft" / "config.json").read_text())
        n_taps = len(base.target_layer_ids)
        cfg.update(architectures=["DFlyDraftModel"], target_num_hidden_layers=cfg["num_target_layers"],
                   num_target_layers=n_taps)
        cfg["dflash_config"] = {**cfg["dflash_config"], "enable_hidden_correction": True,
                                "hidden_correction_intermediate_size": cfg["hidden_size"]}
        path = tmp / "draft" / "model.safetensors"
        w: dict[str, Any] = dict(mx.load(str(path)))  # type: ignore[arg-type]
        dt = w["fc.weight"].dtype
        h, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
        mx.random.seed(17)
        w["fc.weight"] = (w["fc.weight"].astype(mx.float32) * DFLY_FC_SCALE).astype(dt)
        w["layer_fusion_weights"] = mx.random.normal((layers, n_taps)).astype(dt)
        w.update({
            "hidden_correction.hidden_norm.weight": mx.ones((h,), dtype=dt),
            "hidden_correction.embed_norm.weight": mx.ones((h,), dtype=dt),
            "hidden_correction.gate_proj.weight": (mx.random.normal((h, 2 * h)) * 0.02).astype(dt),
            "hidden_correction.up_proj.weight": (mx.random.normal((h, 2 * h)) * 0.02).astype(dt),
            "hidden_correction.down_proj.weight": mx.zeros((h, h), dtype=dt),
        })
        mx.save_safetensors(str(path), w, metadata={"format": "mlx"})
        (tmp / "draft" / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
        info = DFlyFixtureInfo(**{**base.to_dict(), "kind": DFLY_KIND, "target": str(out / "target"),
                                  "draft": str(out / "draft"), "derived_from": str(parent)})
        (tmp / "fixture.json").write_text(json.dumps(info.record(), indent=2))
    return info


def dfly_format(out: str | os.PathLike, *, shape: str, dtype: str, tied: bool, block_size: int | None, seed: int,
                overwrite: bool, note: Callable[[str], None]) -> MadeFixture:
    """``fixtures make --dflash SHAPE --drafter-format dfly``: a DFly pair (from a fitted DFlash pair, whose
    seed is its own: ``seed`` is not used; ``block_size`` None: 8)."""
    block = block_size if block_size is not None else 8
    building(note, out, overwrite, f"a DFly {shape} pair (block {block}, {dtype})")
    record = build_dfly_pair(out, shape=shape, dtype=dtype, tied=tied, block_size=block,
                             overwrite=overwrite).to_dict()
    return MadeFixture(record, pair_lines(record, "DFly drafter: the target's embedding and head"),
                       accept_mix_warning(record))
