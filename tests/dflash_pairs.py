"""DFlash fixture pairs (a target and a DFlash drafter dflash-mlx loads) for the served tests and bench.

TEMPORARY, one function to switch at merge: :func:`dflash_fixture` takes the
pair from ``specparity.dflash_fixtures.dflash_pair`` (the drafter fitted to
its target, with a spread accept mix: branch ``dflash``) once that module is
in the tree. Until then it takes a pair of the same name from the directory
``$SPECPARITY_DFLASH_FIXTURES`` (built there with that branch's builder), and
failing that makes one here with a random-weight drafter (qwen3 and qwen3_5
shapes only; a random drafter accepts almost nothing).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

from specparity.environments import Environment

# the shapes the random maker can make (the fitted builder has more: qwen3_5-27b, qwen3_5-equal-heads)
RANDOM_SHAPES = ("qwen3", "qwen3_5")

_MAKE_PAIR = '''
import json, sys
from pathlib import Path
import mlx.core as mx
from mlx.utils import tree_flatten
from dflash_mlx.model import DFlashDraftModel, DFlashDraftModelArgs
from specparity.fixtures import VOCAB_SIZE, build_pair, build_tokenizer

out, arch, block = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
if arch == "qwen3":
    from mlx_lm.models import qwen3
    cfg = {"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 4, "intermediate_size": 128,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "rms_norm_eps": 1e-5,
           "vocab_size": VOCAB_SIZE, "max_position_embeddings": 4096, "rope_theta": 10000.0,
           "tie_word_embeddings": False}
    mx.random.seed(0)
    model = qwen3.Model(qwen3.ModelArgs.from_dict(cfg))
    mx.eval(model.parameters())
    (out / "target").mkdir(parents=True)
    mx.save_safetensors(str(out / "target" / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (out / "target" / "config.json").write_text(json.dumps(cfg))
    build_tokenizer(out / "target")
    target = out / "target"
else:
    target = Path(build_pair(out / "pair", arch=arch, with_draft=False).target)
tc = json.loads((target / "config.json").read_text())
draft = {"model_type": "qwen3", "hidden_size": tc["hidden_size"], "num_hidden_layers": 1,
         "intermediate_size": tc["intermediate_size"], "num_attention_heads": tc["num_attention_heads"],
         "num_key_value_heads": tc["num_key_value_heads"], "head_dim": tc["head_dim"],
         "rms_norm_eps": tc["rms_norm_eps"], "vocab_size": tc["vocab_size"],
         "max_position_embeddings": tc["max_position_embeddings"], "rope_theta": 10000.0,
         "tie_word_embeddings": False, "num_target_layers": tc["num_hidden_layers"], "block_size": block,
         "dflash_config": {"target_layer_ids": [1, 2], "mask_token_id": tc["vocab_size"] - 1}}
mx.random.seed(1)
drafter = DFlashDraftModel(DFlashDraftModelArgs.from_dict(draft))
mx.eval(drafter.parameters())
(out / "draft").mkdir(parents=True)
mx.save_safetensors(str(out / "draft" / "model.safetensors"), dict(tree_flatten(drafter.parameters())))
(out / "draft" / "config.json").write_text(json.dumps(draft))
print(json.dumps({"target": str(target), "draft": str(out / "draft")}))
'''


def fixture_name(shape: str, block_size: int, dtype: str, tied: bool) -> str:
    """The name specparity.dflash_fixtures gives a pair in the shared cache."""
    return f"dflash-{shape}-b{block_size}-{dtype}-{'tied' if tied else 'untied'}"


def dflash_fixture(env: Environment, shape: str = "qwen3", block_size: int = 8, dtype: str = "float32",
                   tied: bool = False, work: Path | None = None) -> dict[str, str]:
    """``{"target": DIR, "draft": DIR, "fitted": "yes" | "no"}`` for a DFlash pair of this shape.

    ``env``: the dflash-mlx environment (the random maker runs there); ``work``: where it makes one.
    """
    try:
        from specparity.dflash_fixtures import dflash_pair  # type: ignore[import-not-found]
    except ImportError:
        pass
    else:
        info = dflash_pair(shape=shape, block_size=block_size, dtype=dtype, tied=tied)
        return {"target": info.target, "draft": info.draft, "fitted": "yes"}
    name = fixture_name(shape, block_size, dtype, tied)
    prebuilt = os.environ.get("SPECPARITY_DFLASH_FIXTURES")
    if prebuilt and (Path(prebuilt) / name / "fixture.json").is_file():
        root = Path(prebuilt) / name
        return {"target": str(root / "target"), "draft": str(root / "draft"), "fitted": "yes"}
    if shape not in RANDOM_SHAPES or dtype != "float32" or tied:
        raise LookupError(f"no DFlash fixture {name}: set $SPECPARITY_DFLASH_FIXTURES to a directory holding it")
    out = (work or Path(tempfile.mkdtemp(prefix="dflash-pair-"))) / name
    if (out / "pair.json").is_file():
        return dict(json.loads((out / "pair.json").read_text()))
    r = subprocess.run([str(env.python), "-P", "-c", _MAKE_PAIR, str(out), shape, str(block_size)],
                       env=env.environ(), capture_output=True, text=True, timeout=600, cwd=tempfile.gettempdir())
    if r.returncode != 0:
        raise RuntimeError(f"making the random DFlash pair {name} failed: {r.stderr[-2000:]}")
    pair = {**json.loads(r.stdout.strip().splitlines()[-1]), "fitted": "no"}
    (out / "pair.json").write_text(json.dumps(pair))
    return pair
