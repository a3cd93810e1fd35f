"""mtplx's format (``fixtures make --dflash qwen3_5 --drafter-format mtp``): a ``qwen3_5`` target with MTP
heads attached as mtplx loads them (``mtp.safetensors`` beside the weights); no drafter directory."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from specparity.errors import UsageError
from specparity.fixtures import Fixture, MadeFixture
from specparity.fixtures.dflash import SHAPES, target_config

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class MTPFixtureInfo(Fixture):
    """What :func:`build_mtp_target` made: a target with MTP heads inside it (``draft``: None).

    shape, shape_note, dtype, tied, seed: how it was built. mtp_file / mtp_layers / mtp_tensors: the heads
    as mtplx loads them. fit_prompts: the built-in prompts as token ids.
    """

    shape: str
    shape_note: str
    dtype: str
    tied: bool
    seed: int
    mtp_file: str = ""
    mtp_layers: int = 1
    mtp_tensors: list[str] = field(default_factory=list)
    fit_prompts: list[list[int]] = field(default_factory=list)
    kind: str = "mtp"
    WHAT: ClassVar[str] = "an MTP target"

def mtp_format(out: str | os.PathLike, *, shape: str, dtype: str, tied: bool, block_size: int | None, seed: int,
               overwrite: bool, note: Callable[[str], None]) -> MadeFixture:
    """``fixtures make --dflash qwen3_5 --drafter-format mtp``: a target with MTP heads, no drafter
    (``block_size`` does not apply: mtplx's depth is its own)."""
    record = build_mtp_target(out, shape=shape, dtype=dtype, tied=tied, seed=seed, overwrite=overwrite).to_dict()
    lines = [f"target: {record['target']} ({record['shape_note']}; {'tied' if record['tied'] else 'untied'} head)",
             f"MTP heads: {record['target']}/{record['mtp_file']} ({record['mtp_layers']} layer,"
             f" {len(record['mtp_tensors'])} tensors, mtplx's format)"]
    return MadeFixture(record, lines)


def mtp_head_weights(config: dict[str, Any], seed: int) -> dict[str, Any]:
    """An MTP head in mtplx's layout for a ``qwen3_5`` target (``mtplx.mtp_patch.inject_mtp_support``'s
    module tree): ``mtp.pre_fc_norm_hidden`` / ``mtp.pre_fc_norm_embedding`` / ``mtp.norm`` (RMSNorm gains in
    the absolute convention, so mtplx shifts nothing), ``mtp.fc`` (2H -> H, no bias) and ``mtp.layers.0``: one
    full-attention decoder layer of the target's own class (mlx-lm's ``qwen3_5.DecoderLayer`` at a
    full-attention index), random, seeded."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten
    from mlx_lm.models.qwen3_5 import DecoderLayer, TextModelArgs

    args = TextModelArgs.from_dict(config)
    mx.random.seed(seed + 1)

    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pre_fc_norm_hidden = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
            self.pre_fc_norm_embedding = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
            self.fc = nn.Linear(args.hidden_size * 2, args.hidden_size, bias=False)
            self.layers = [DecoderLayer(args, layer_idx=args.full_attention_interval - 1)]
            self.norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)

    dtype = getattr(mx, config.get("torch_dtype") or "float32")
    flat: list[tuple[str, Any]] = tree_flatten(Head().parameters())  # type: ignore[assignment]
    return {f"mtp.{k}": v.astype(dtype) for k, v in flat}


def build_mtp_target(out: str | os.PathLike, shape: str = "qwen3_5", dtype: str = "float32", tied: bool = False,
                     seed: int = 0, overwrite: bool = False) -> MTPFixtureInfo:
    """Build ``out/target``: a ``qwen3_5`` target (mlx-lm) with MTP heads attached in mtplx's format
    (``mtp.safetensors`` beside the weights, ``mtp_num_hidden_layers: 1`` in its config), atomically; the
    fixture's record. MTP heads live inside the target: there is no drafter directory (``draft``: None).

    An existing fixture at ``out`` built with these arguments is returned as it is (unless ``overwrite``).
    """
    from specparity.fixtures import check_out_dir

    out = Path(out)
    check_out_dir(out, overwrite)
    if not shape.startswith("qwen3_5"):
        raise UsageError(f"--drafter-format mtp: MTP heads attach to a qwen3_5 target (mtplx's dense family),"
                         f" not {shape!r}")
    if out.exists() and not overwrite:
        return MTPFixtureInfo.existing(out, shape=shape, dtype=dtype, tied=bool(tied), seed=seed)
    import mlx.core as mx
    from tokenizers import Tokenizer

    from specparity.fixtures import build_tokenizer, instantiate, model_params, publishing
    from specparity.prompts import DEFAULT_PROMPTS

    config = target_config(shape, dtype, tied)  # validates shape and dtype
    out.parent.mkdir(parents=True, exist_ok=True)
    with publishing(out) as tmp:
        (tmp / "target").mkdir()
        build_tokenizer(tmp / "target")
        tok = Tokenizer.from_file(str(tmp / "target" / "tokenizer.json"))
        mx.random.seed(seed)
        target = instantiate(config)
        mx.save_safetensors(str(tmp / "target" / "model.safetensors"), model_params(target),
                            metadata={"format": "mlx"})
        head = mtp_head_weights(config, seed)
        mx.save_safetensors(str(tmp / "target" / MTP_FILE), head, metadata={"format": "mlx"})
        # mtplx counts MTP layers from the text config's mtp_num_hidden_layers (mlx-lm ignores the key)
        (tmp / "target" / "config.json").write_text(json.dumps({**config, "mtp_num_hidden_layers": 1}, indent=2,
                                                               sort_keys=True))
        info = MTPFixtureInfo(target=str(out / "target"), draft=None, shape=shape, dtype=dtype, tied=bool(tied),
                              seed=seed, shape_note=SHAPES[shape][1],
                              mtp_file=MTP_FILE, mtp_layers=1, mtp_tensors=sorted(head),
                              fit_prompts=[tok.encode(t).ids for t in DEFAULT_PROMPTS])
        (tmp / "fixture.json").write_text(json.dumps(info.record(), indent=2))
    log.info("built MTP %s %s fixture in %s (%d head tensors)", shape, dtype, out, len(head))
    return info


MTP_KIND = "mtp"


MTP_FILE = "mtp.safetensors"  # mtplx's expected_mtp_file when the config names no other

