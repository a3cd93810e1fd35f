"""yunshu's format (``fixtures make --dflash qwen3_5 --drafter-format yunshu``): a Qwen3.5 checkpoint as yunshu serves
one, its MTP head inside it, and a DFlash drafter beside it.

yunshu 0.1.5 drafts only in its VLM lane: a checkpoint reaches it when its ``config.json`` has a
``vision_config`` (else it goes to its text engine, which has no DFlash or MTP path), and ``mlx_vlm`` loads it
(``qwen3_5``: ``text_config`` with ``rope_parameters.mrope_section``, a vision tower). Its MTP head is used only
where ``model.safetensors.index.json`` maps ``mtp.*`` keys to a file that exists (``mlxvlm_mtp.is_mtp_capable``).
Every completion prompt is templated as one user message, so the tokenizer carries a chat template that renders
the message's text as it is (the prompt's tokens are the text's, as classic decode reads them).

Built from the project's DFlash pair (:func:`specparity.fixtures.dflash.build_dflash_pair`: the same hybrid
target weights, the same fitted z-lab-format drafter, which mlx-vlm's ``qwen3_dflash`` reads), the target
re-dressed: the text config nested under ``text_config``, a one-block vision tower (random, seeded: a text prompt
never runs it) and an MTP head in the layout mtplx and mlx-vlm share
(:func:`specparity.engines.mtplx.fixtures.mtp_head_weights`: random, so it drafts and is never accepted),
every tensor in MLX's own convention (``format: mlx``: no norm offset is added on load). mlx-lm reads the same
directory (it drops the vision tower and the head), so classic decode runs on the same weights.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from specparity.errors import UsageError
from specparity.fixtures import Fixture, MadeFixture, pair_lines

log = logging.getLogger(__name__)

KIND = "yunshu"
# the text as it is: yunshu templates a completion prompt as [{"role": "user", "content": prompt}]
IDENTITY_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
# a one-block Qwen3-VL vision tower whose merger projects onto the fixture's hidden size (64)
VISION = {"model_type": "qwen3_5", "depth": 1, "hidden_size": 32, "intermediate_size": 64, "out_hidden_size": 64,
          "num_heads": 2, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
          "num_position_embeddings": 16, "in_channels": 3}
# its tensors as mlx-vlm 0.7.8's qwen3_5 VisionModel names them, for VISION
_VISION_TENSORS = {
    "patch_embed.proj.weight": (32, 2, 16, 16, 3), "patch_embed.proj.bias": (32,), "pos_embed.weight": (16, 32),
    "blocks.0.norm1.weight": (32,), "blocks.0.norm1.bias": (32,), "blocks.0.norm2.weight": (32,),
    "blocks.0.norm2.bias": (32,), "blocks.0.attn.qkv.weight": (96, 32), "blocks.0.attn.qkv.bias": (96,),
    "blocks.0.attn.proj.weight": (32, 32), "blocks.0.attn.proj.bias": (32,),
    "blocks.0.mlp.linear_fc1.weight": (64, 32), "blocks.0.mlp.linear_fc1.bias": (64,),
    "blocks.0.mlp.linear_fc2.weight": (32, 64), "blocks.0.mlp.linear_fc2.bias": (32,),
    "merger.norm.weight": (32,), "merger.norm.bias": (32,), "merger.linear_fc1.weight": (128, 128),
    "merger.linear_fc1.bias": (128,), "merger.linear_fc2.weight": (64, 128), "merger.linear_fc2.bias": (64,),
}
# rotary pairs of the fixture's partial rotary (head 128 x 0.25 = 32 dims, 16 pairs) split over t, h, w as the
# published [11, 11, 10] splits 32; a text prompt's three positions are equal, so it is plain rotary
MROPE_SECTION = [6, 5, 5]


@dataclass(kw_only=True)
class YunshuFixture(Fixture):
    """What :func:`build_yunshu_fixture` made: ``target`` (the VLM-shaped checkpoint, MTP head inside) and
    ``draft`` (the DFlash drafter).

    shape, shape_note, dtype, tied, block_size, seed: how the DFlash pair under it was built. mask_token_id,
    target_layer_ids, accept_mix, fit_prompts: its drafter's (:class:`~specparity.fixtures.dflash.DFlashFixtureInfo`).
    mtp_tensors: the head's tensor names. vision: the vision tower's config.
    """

    shape: str
    shape_note: str
    dtype: str
    tied: bool
    block_size: int
    seed: int
    mask_token_id: int
    target_layer_ids: list[int]
    accept_mix: dict[str, Any]
    fit_prompts: list[list[int]]
    mtp_tensors: list[str]
    vision: dict[str, Any]
    kind: str = KIND
    WHAT: ClassVar[str] = "a yunshu fixture"


def vlm_config(flat: dict[str, Any]) -> dict[str, Any]:
    """The VLM ``config.json`` of a flat mlx-lm ``qwen3_5`` config: its keys under ``text_config`` (with one MTP
    layer and an mrope section), :data:`VISION` beside them."""
    rope = {**flat["rope_parameters"], "mrope_section": list(MROPE_SECTION), "mrope_interleaved": True}
    text = {**flat, "mtp_num_hidden_layers": 1, "rope_parameters": rope}
    return {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5", "text_config": text,
            "vision_config": dict(VISION), "tie_word_embeddings": flat["tie_word_embeddings"],
            "torch_dtype": flat["torch_dtype"], "vocab_size": flat["vocab_size"]}


def dress(target: Path, seed: int) -> list[str]:
    """Re-dress an mlx-lm ``qwen3_5`` checkpoint in place as yunshu serves one; the MTP head's tensor names."""
    import mlx.core as mx

    from specparity.engines.mtplx.fixtures import mtp_head_weights

    flat = json.loads((target / "config.json").read_text())
    if flat.get("model_type") != "qwen3_5" or "text_config" in flat:
        raise UsageError(f"{target}: yunshu's fixture dresses a flat qwen3_5 target, not {flat.get('model_type')!r}")
    loaded: Any = mx.load(str(target / "model.safetensors"))  # a .safetensors file: a dict of arrays
    weights: dict[str, Any] = dict(loaded)
    dtype = getattr(mx, flat["torch_dtype"])
    mx.random.seed(seed + 2)
    for name, shape in _VISION_TENSORS.items():
        weights[f"vision_tower.{name}"] = (mx.random.normal(shape) * 0.02).astype(dtype)
    head = mtp_head_weights(flat, seed)
    weights.update(head)
    mx.save_safetensors(str(target / "model.safetensors"), weights, metadata={"format": "mlx"})
    index = {"metadata": {}, "weight_map": {k: "model.safetensors" for k in sorted(weights)}}
    (target / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    (target / "config.json").write_text(json.dumps(vlm_config(flat), indent=2, sort_keys=True))
    tok_cfg_path = target / "tokenizer_config.json"
    tok_cfg = json.loads(tok_cfg_path.read_text())
    tok_cfg["chat_template"] = IDENTITY_TEMPLATE
    tok_cfg_path.write_text(json.dumps(tok_cfg, indent=2))
    return sorted(head)


def build_yunshu_fixture(out: str | os.PathLike, shape: str = "qwen3_5", block_size: int = 8,
                         dtype: str = "float32", tied: bool = True, seed: int = 0,
                         overwrite: bool = False) -> YunshuFixture:
    """Build ``out/target`` and ``out/draft`` (see the module), atomically; an existing one built with these
    arguments is returned as it is unless ``overwrite``."""
    from specparity.fixtures import check_out_dir, publishing
    from specparity.fixtures.dflash import SHAPES, build_dflash_pair

    out = Path(out)
    check_out_dir(out, overwrite)
    if not shape.startswith("qwen3_5"):
        raise UsageError(f"--drafter-format yunshu: yunshu drafts for the qwen3_5 family only, not {shape!r}")
    if os.path.lexists(out) and not overwrite:
        return YunshuFixture.existing(out, shape=shape, block_size=block_size, dtype=dtype, tied=bool(tied),
                                      seed=seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    with publishing(out, overwrite) as tmp:
        pair = build_dflash_pair(tmp / "pair", shape=shape, block_size=block_size, dtype=dtype, tied=tied,
                                 seed=seed)
        shutil.move(str(tmp / "pair" / "target"), tmp / "target")
        shutil.move(str(tmp / "pair" / "draft"), tmp / "draft")
        shutil.rmtree(tmp / "pair")
        head = dress(tmp / "target", seed)
        info = YunshuFixture(
            target=str(out / "target"), draft=str(out / "draft"), shape=shape, shape_note=SHAPES[shape][1],
            dtype=dtype, tied=bool(tied), block_size=block_size, seed=seed, mask_token_id=pair.mask_token_id,
            target_layer_ids=pair.target_layer_ids, accept_mix=pair.accept_mix, fit_prompts=pair.fit_prompts,
            mtp_tensors=head, vision=dict(VISION))
        (tmp / "fixture.json").write_text(json.dumps(info.record(), indent=2))
    log.info("built yunshu %s %s fixture in %s", shape, dtype, out)
    return info


def yunshu_format(out: str, *, shape: str, dtype: str, tied: bool, block_size: int | None, seed: int,
                  overwrite: bool, note: Callable[[str], None]) -> MadeFixture:
    """``fixtures make --dflash qwen3_5 --drafter-format yunshu`` (``block_size`` None: 8)."""
    if not os.path.lexists(out) or overwrite:
        note(f"building a yunshu {shape} fixture (a DFlash pair, re-dressed as a Qwen3.5 VLM with an MTP head);"
             " fitting the drafter takes a minute on a CPU")
    record = build_yunshu_fixture(out, shape=shape, block_size=block_size or 8, dtype=dtype, tied=tied, seed=seed,
                                  overwrite=overwrite).to_dict()
    lines = pair_lines(record, f"DFlash drafter: reads target layers {record['target_layer_ids']}, block"
                               f" {record['block_size']}")
    lines.append(f"MTP head: {len(record['mtp_tensors'])} mtp.* tensors in the target (random: drafts, never"
                 " accepted); vision tower: 1 block (a text prompt never runs it)")
    return MadeFixture(record, lines)
