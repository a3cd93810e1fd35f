"""mlx-flash's format (``fixtures make --dflash qwen3 --drafter-format mlx-flash``): the project's DFlash pair
(``target/``, ``draft/``: a z-lab DFlash drafter, which its ``DFlashDraftModel.from_pretrained`` reads) with
mlx-flash's own EAGLE head beside them (``eagle/``).

mlx-flash's EAGLE-3 is not the published EAGLE-3 layout (no ``fc`` over three target layers, no ``midlayer``,
no draft vocabulary): it reads only its own ``EAGLEDraftHead`` as its ``EAGLE3Trainer.save`` writes it, a
safetensors file of ``input_proj`` (2H -> H), ``layers.N`` (``norm1``, ``attention`` of ``nn.MultiHeadAttention``:
``query_proj`` / ``key_proj`` / ``value_proj`` / ``out_proj``, ``norm2``, ``mlp.layers.0`` / ``.2``),
``output_norm`` and ``output_proj`` (H -> H), loaded by ``EAGLE3Trainer.load(path, hidden_dim, num_heads,
num_layers)``, whose shape the file does not carry (``eagle_head.json`` here). It is the shape its defaults
make: one layer, 4 heads, the target's hidden size. Its drafts: ``lm_head(head(h, embed(token)))``, the next
step fed the predicted hidden state and the drafted token. The head here is fitted by distillation to the
target's greedy tokens through that recurrence (three steps, on the fixture's fit prompts), so its rounds
accept drafts in full, in part and not at all; a random head accepts nothing.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from specparity.fixtures import MadeFixture
from specparity.fixtures.dflash import DFlashFixtureInfo

FORMAT = "mlx-flash"
EAGLE_DIR = "eagle"
EAGLE_CONFIG = "eagle_head.json"
EAGLE_WEIGHTS = "eagle_head.safetensors"
HEADS, LAYERS = 4, 1  # EAGLE3Config's defaults: what its server's untrained head has too
FIT_TOKENS = 48  # greedy tokens per fit prompt
UNROLL = 3  # draft steps the head is fitted through
STEPS = 400


@dataclass(kw_only=True)
class MlxFlashFixtureInfo(DFlashFixtureInfo):
    """The DFlash pair (every field of :class:`DFlashFixtureInfo`) and the EAGLE head beside it.

    eagle: the head's folder. eagle_heads / eagle_layers: its shape. eagle_fit: the share of its first drafts
    (teacher-forced along classic decode) equal to the target's greedy token on the fit prompts.
    """

    eagle: str = ""
    eagle_heads: int = HEADS
    eagle_layers: int = LAYERS
    eagle_fit: float = 0.0
    kind: str = FORMAT
    WHAT: ClassVar[str] = "an mlx-flash fixture"

    def record(self) -> dict[str, Any]:
        return {**super().record(), "eagle": EAGLE_DIR}


def eagle_head(hidden: int, heads: int = HEADS, layers: int = LAYERS) -> Any:
    """A module with ``EAGLEDraftHead``'s parameter tree and forward (mlx-flash not imported here)."""
    import mlx.core as mx
    import mlx.nn as nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1 = nn.RMSNorm(hidden)
            self.attention = nn.MultiHeadAttention(hidden, heads)
            self.norm2 = nn.RMSNorm(hidden)
            self.mlp = nn.Sequential(nn.Linear(hidden, hidden * 4), nn.GELU(), nn.Linear(hidden * 4, hidden))

        def __call__(self, x: Any) -> Any:
            h = self.norm1(x)
            x = x + self.attention(h, h, h)
            return x + self.mlp(self.norm2(x))

    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.input_proj = nn.Linear(hidden * 2, hidden)
            self.layers = [Block() for _ in range(layers)]
            self.output_norm = nn.RMSNorm(hidden)
            self.output_proj = nn.Linear(hidden, hidden)

        def __call__(self, state: Any, embed: Any) -> Any:
            x = self.input_proj(mx.concatenate([state, embed], axis=-1))
            for layer in self.layers:
                x = layer(x)
            return self.output_proj(self.output_norm(x))

    return Head()


def fit_eagle_head(target_dir: Path, prompts: list[list[int]], seed: int) -> tuple[Any, float]:
    """The head fitted to the target's greedy continuations of ``prompts`` through its draft recurrence."""
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    from mlx_lm import load

    from specparity.decode import classic_steps

    model: Any = load(str(target_dir))[0]
    outer = getattr(model, "language_model", model)
    inner = outer.model
    embed = inner.embed_tokens
    head_fn = getattr(outer, "lm_head", None) or embed.as_linear
    states, tokens = [], []
    for p in prompts:
        seq = list(p) + [int(t) for t, _ in classic_steps(model, mx.array(p), FIT_TOKENS)]
        hidden = inner(mx.array(seq)[None])[0]  # the final norm's output, causal: what its drafts start from
        for t in range(len(p) - 1, len(seq) - UNROLL):
            states.append(hidden[t])
            tokens.append(seq[t:t + UNROLL + 1])
    h0 = mx.stack(states)[:, None, :].astype(mx.float32)
    toks = mx.array(tokens)
    mx.random.seed(seed + 7)
    head = eagle_head(int(h0.shape[-1]))

    def loss_fn(m: Any) -> Any:
        state, total = h0, mx.array(0.0)
        for k in range(UNROLL):
            state = m(state, embed(toks[:, k:k + 1]).astype(mx.float32))
            logits = head_fn(state.astype(embed.weight.dtype)).astype(mx.float32)[:, 0]
            total = total + nn.losses.cross_entropy(logits, toks[:, k + 1], reduction="mean")
        return total

    opt = optim.Adam(learning_rate=3e-3)
    step = nn.value_and_grad(head, loss_fn)
    for _ in range(STEPS):
        _, grads = step(head)
        opt.update(head, grads)
        mx.eval(head.parameters(), opt.state)
    first = head_fn(head(h0, embed(toks[:, :1]).astype(mx.float32)).astype(embed.weight.dtype)).argmax(-1)[:, 0]
    return head, float((first == toks[:, 1]).astype(mx.float32).mean())


def build(out: str | os.PathLike, *, shape: str, dtype: str, tied: bool, block_size: int | None, seed: int,
          overwrite: bool, note: Callable[[str], None]) -> MadeFixture:
    """``fixtures make --dflash SHAPE --drafter-format mlx-flash``: the DFlash pair, then the EAGLE head."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from specparity.fixtures import FIXTURE_RECORD, check_out_dir, pair_lines, publishing
    from specparity.fixtures.dflash import build_dflash_pair

    out = Path(out)
    block = block_size if block_size is not None else 8
    check_out_dir(out, overwrite)
    if os.path.lexists(out) and not overwrite:
        info = MlxFlashFixtureInfo.existing(out, shape=shape, block_size=block, dtype=dtype, tied=bool(tied),
                                            seed=seed)
    else:
        note(f"building a DFlash {shape} pair (block {block}, {dtype}) and mlx-flash's EAGLE head; fitting both"
             " takes a minute or two on a CPU")
        out.parent.mkdir(parents=True, exist_ok=True)
        with publishing(out, overwrite) as tmp:
            pair = build_dflash_pair(tmp / "dflash", shape=shape, block_size=block, dtype=dtype, tied=tied, seed=seed)
            for member in ("target", "draft"):
                shutil.move(str(tmp / "dflash" / member), tmp / member)
            shutil.rmtree(tmp / "dflash")
            head, fit = fit_eagle_head(tmp / "target", pair.fit_prompts, seed)
            (tmp / EAGLE_DIR).mkdir()
            flat: Any = tree_flatten(head.parameters())
            weights = {k: v.astype(getattr(mx, dtype)) for k, v in flat}
            mx.save_safetensors(str(tmp / EAGLE_DIR / EAGLE_WEIGHTS), weights)
            hidden = int(weights["input_proj.weight"].shape[0])
            (tmp / EAGLE_DIR / EAGLE_CONFIG).write_text(json.dumps(
                {"hidden_dim": hidden, "num_heads": HEADS, "num_layers": LAYERS,
                 "loader": "mlx_flash_compress.eagle3.EAGLE3Trainer.load(path, hidden_dim, num_heads, num_layers)"},
                indent=2))
            fields = {k: v for k, v in pair.to_dict().items() if k in DFlashFixtureInfo.__dataclass_fields__}
            info = MlxFlashFixtureInfo(**{**fields, "kind": FORMAT, "target": str(out / "target"),
                                          "draft": str(out / "draft")},
                                       eagle=str(out / EAGLE_DIR), eagle_fit=round(fit, 3))
            (tmp / FIXTURE_RECORD).write_text(json.dumps(info.record(), indent=2))
    record = info.to_dict()
    lines = pair_lines(record, f"DFlash drafter: reads target layers {info.target_layer_ids}")
    lines.append(f"eagle:  {out / EAGLE_DIR} (mlx-flash's EAGLEDraftHead, {info.eagle_layers} layer,"
                 f" {info.eagle_heads} heads; first drafts equal to the target's on the fit prompts:"
                 f" {info.eagle_fit:.0%})")
    return MadeFixture(record, lines)
