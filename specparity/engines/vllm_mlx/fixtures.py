"""vllm-mlx's MTP format (``fixtures make --dflash qwen3_5 --drafter-format vllm-mlx-mtp``): a ``qwen3_5`` target
with its MTP head where vllm-mlx looks for one, no drafter directory.

vllm-mlx 0.6.0 (``vllm_mlx.patches.qwen3_5_mtp.inject_mtp_support``) counts MTP layers from the config's
``mtp_num_hidden_layers``, reads the head from ``mtp/weights.safetensors`` (else ``model-mtp.safetensors``: a
name mlx-lm's own ``model*.safetensors`` glob would also load), strips the ``mtp.`` key prefix and builds the
same module tree as mtplx (``pre_fc_norm_hidden``, ``pre_fc_norm_embedding``, ``fc`` 2H -> H, one
full-attention ``qwen3_5.DecoderLayer``, ``norm``). The head's tensors are therefore mtplx's
(:func:`specparity.engines.mtplx.fixtures.build_mtp_target`), moved to vllm-mlx's file; the ``mtp/manifest.json``
beside them says their RMSNorm gains are MLX's (absolute), so vllm-mlx adds no +1 offset to them. The config
nests the text model's keys under ``text_config``, as a real Qwen3.5 checkpoint's does (:func:`nested_config`).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from specparity.engines.mtplx.fixtures import MTP_FILE, MTPFixtureInfo, build_mtp_target
from specparity.fixtures import MadeFixture

KIND = "vllm-mlx-mtp"
# where vllm-mlx 0.6.0 reads the head first; its manifest.json beside it (artifact_schema_version 1)
VLLM_MTP_FILE = "mtp/weights.safetensors"
MANIFEST = {"artifact_schema_version": 1, "rmsnorm_weight_format": "mlx_gamma"}


@dataclass(kw_only=True)
class VllmMlxMTPFixture(MTPFixtureInfo):
    """What :func:`build_vllm_mlx_mtp_target` made: mtplx's head tensors in vllm-mlx's file (``mtp_file``)."""

    kind: str = KIND
    WHAT: ClassVar[str] = "a vllm-mlx MTP target"


def build_vllm_mlx_mtp_target(out: str | os.PathLike, shape: str = "qwen3_5", dtype: str = "float32",
                              tied: bool = False, seed: int = 0, overwrite: bool = False) -> VllmMlxMTPFixture:
    """Build ``out/target``: a ``qwen3_5`` target with its MTP head in ``target/mtp/weights.safetensors``,
    atomically. An existing fixture built with these arguments is returned as it is (unless ``overwrite``)."""
    from specparity.fixtures import check_out_dir, publishing

    out = Path(out)
    check_out_dir(out, overwrite)
    if out.exists() and not overwrite:
        return VllmMlxMTPFixture.existing(out, shape=shape, dtype=dtype, tied=bool(tied), seed=seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    with publishing(out, overwrite) as tmp:
        base = build_mtp_target(tmp / "heads", shape=shape, dtype=dtype, tied=tied, seed=seed)
        os.rename(Path(base.target), tmp / "target")
        shutil.rmtree(tmp / "heads")
        head = tmp / "target" / VLLM_MTP_FILE
        head.parent.mkdir()
        os.rename(tmp / "target" / MTP_FILE, head)
        (head.parent / "manifest.json").write_text(json.dumps(MANIFEST, indent=2))
        config_file = tmp / "target" / "config.json"
        config_file.write_text(json.dumps(nested_config(json.loads(config_file.read_text())), indent=2,
                                          sort_keys=True))
        fields = {k: v for k, v in base.to_dict().items() if k not in ("target", "draft", "kind", "mtp_file")}
        info = VllmMlxMTPFixture(target=str(out / "target"), draft=None, mtp_file=VLLM_MTP_FILE, **fields)
        (tmp / "fixture.json").write_text(json.dumps(info.record(), indent=2))
    return info


def nested_config(flat: dict[str, Any]) -> dict[str, Any]:
    """The config as a real Qwen3.5 checkpoint writes it: the text model's keys (``mtp_num_hidden_layers``
    among them) under ``text_config``. vllm-mlx reads ``mtp_num_hidden_layers`` only there on the load path a
    text-only checkpoint takes (``_try_inject_mtp_post_load``); mlx-lm reads either form."""
    text = {**flat, "model_type": "qwen3_5_text"}
    return {"model_type": flat["model_type"], "tie_word_embeddings": flat["tie_word_embeddings"],
            "torch_dtype": flat["torch_dtype"], "text_config": text}


def vllm_mlx_mtp_format(out: str | os.PathLike, *, shape: str, dtype: str, tied: bool, block_size: int | None,
                        seed: int, overwrite: bool, note: Callable[[str], None]) -> MadeFixture:
    """``fixtures make --dflash qwen3_5 --drafter-format vllm-mlx-mtp``: a target with its MTP head, no drafter
    (``block_size`` does not apply: vllm-mlx drafts one token per verify)."""
    record = build_vllm_mlx_mtp_target(out, shape=shape, dtype=dtype, tied=tied, seed=seed,
                                       overwrite=overwrite).to_dict()
    lines = [f"target: {record['target']} ({record['shape_note']}; {'tied' if record['tied'] else 'untied'} head)",
             f"MTP head: {record['target']}/{record['mtp_file']} ({record['mtp_layers']} layer,"
             f" {len(record['mtp_tensors'])} tensors, vllm-mlx's format)"]
    return MadeFixture(record, lines)
