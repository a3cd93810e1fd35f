"""mlx-vlm's format (``fixtures make --dflash qwen3_5 --drafter-format mlx-vlm``): yunshu's fixture, its chat template
reading a message's content as mlx-vlm's server hands it over.

yunshu's fixture (:mod:`specparity.engines.yunshu.fixtures`: a Qwen3.5 VLM checkpoint, its MTP head inside, a DFlash
drafter beside it) is what mlx-vlm loads; its chat template renders ``message['content']`` as it is, and mlx-vlm's
server turns a text message's content into a list of parts (``[{'type': 'text', 'text': ...}]``) before it applies
the template, so the prompt it decodes would be that list's Python repr. This format's template renders each text
part's text as it is, and a plain string as it is: a chat request's prompt is its text's tokens on both sides (the
server's, and classic decode's, which applies the same template to a string). Weights and drafter are yunshu's.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from specparity.engines.yunshu.fixtures import YunshuFixture, build_yunshu_fixture
from specparity.fixtures import MadeFixture, pair_lines

log = logging.getLogger(__name__)

KIND = "mlx-vlm"
# a message's text as it is: a string, or the text of each of its text parts (mlx-vlm's server hands over parts)
PARTS_TEMPLATE = ("{% for message in messages %}{% if message['content'] is string %}{{ message['content'] }}"
                  "{% else %}{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}"
                  "{% endif %}{% endfor %}{% endif %}{% endfor %}")


@dataclass(kw_only=True)
class MLXVLMFixture(YunshuFixture):
    """What :func:`build_mlx_vlm_fixture` made: yunshu's fixture (its fields), :data:`PARTS_TEMPLATE` its template."""

    kind: str = KIND
    WHAT: ClassVar[str] = "an mlx-vlm fixture"


def build_mlx_vlm_fixture(out: str | os.PathLike, shape: str = "qwen3_5", block_size: int = 8,
                          dtype: str = "float32", tied: bool = True, seed: int = 0,
                          overwrite: bool = False) -> MLXVLMFixture:
    """Build ``out/target`` and ``out/draft`` (yunshu's, re-templated: see the module), atomically; an existing one
    built with these arguments is returned as it is unless ``overwrite``."""
    from specparity.fixtures import check_out_dir, publishing

    out = Path(out)
    check_out_dir(out, overwrite)
    if os.path.lexists(out) and not overwrite:
        return MLXVLMFixture.existing(out, shape=shape, block_size=block_size, dtype=dtype, tied=bool(tied),
                                      seed=seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    with publishing(out, overwrite) as tmp:
        base = build_yunshu_fixture(tmp / "yunshu", shape=shape, block_size=block_size, dtype=dtype, tied=tied,
                                    seed=seed)
        for member in ("target", "draft"):
            shutil.move(str(tmp / "yunshu" / member), tmp / member)
        shutil.rmtree(tmp / "yunshu")
        tok_cfg_path = tmp / "target" / "tokenizer_config.json"
        tok_cfg = json.loads(tok_cfg_path.read_text())
        tok_cfg["chat_template"] = PARTS_TEMPLATE
        tok_cfg_path.write_text(json.dumps(tok_cfg, indent=2))
        fields = {**base.to_dict(), "target": str(out / "target"), "draft": str(out / "draft"), "kind": KIND}
        info = MLXVLMFixture(**fields)
        (tmp / "fixture.json").write_text(json.dumps(info.record(), indent=2))
    log.info("built mlx-vlm %s %s fixture in %s", shape, dtype, out)
    return info


def mlx_vlm_format(out: str, *, shape: str, dtype: str, tied: bool, block_size: int | None, seed: int,
                   overwrite: bool, note: Callable[[str], None]) -> MadeFixture:
    """``fixtures make --dflash qwen3_5 --drafter-format mlx-vlm`` (``block_size`` None: 8)."""
    if not os.path.lexists(out) or overwrite:
        note(f"building an mlx-vlm {shape} fixture (yunshu's qwen3_5 VLM with an MTP head and a DFlash drafter, its"
             " chat template reading text parts); fitting the drafter takes a minute on a CPU")
    record = build_mlx_vlm_fixture(out, shape=shape, block_size=block_size or 8, dtype=dtype, tied=tied, seed=seed,
                                   overwrite=overwrite).to_dict()
    lines = pair_lines(record, f"DFlash drafter: reads target layers {record['target_layer_ids']}, block"
                               f" {record['block_size']}")
    lines.append(f"MTP head: {len(record['mtp_tensors'])} mtp.* tensors in the target (random: drafts, never"
                 " accepted); chat template: a message's text parts as they are")
    return MadeFixture(record, lines)
