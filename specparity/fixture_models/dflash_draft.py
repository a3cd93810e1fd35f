"""The DFlash block drafter in plain MLX, laid out as dflash-mlx 0.1.8 loads real ones.

A DFlash drafter (Chen et al., arXiv:2602.06036; z-lab's ``*-DFlash``
checkpoints) has no embedding and no output head of its own: it embeds its
block ``[staged token, mask, mask, ...]`` with the target's embedding, reads
the target's hidden states at ``target_layer_ids`` (concatenated, through
``fc`` and ``hidden_norm``) as attention context, runs a few decoder layers
whose attention spans [context, block] without a causal mask, and turns its
final norm's output into logits with the target's head. Parameter names are
the checkpoints' own (``layers.N.self_attn.q_proj.weight``, ``fc.weight``,
``hidden_norm.weight``, ``norm.weight``...), so a file written from
:class:`DFlashDrafter` loads with dflash-mlx's ``load_draft_bundle``.

This module computes the drafter's block the way dflash-mlx's uncached path
does (context keys at positions 0.., block keys and queries after them). The
fixture builder uses it to fit a drafter to its target and to measure the
accept mix without dflash-mlx installed; the engine runs its own copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn


@dataclass
class DraftArgs:
    """The drafter's config.json fields (those dflash-mlx's ``DFlashDraftModelArgs`` reads).

    hidden_size: must equal the target's (the block is embedded by the target).
    num_target_layers: the target's decoder layers. block_size: rows per drafted block.
    target_layer_ids: target layers whose outputs form the context (0-based; the
      engine reads the output of layer i). mask_token_id: the id filling the block
      after its first row.
    """

    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    num_target_layers: int
    block_size: int
    target_layer_ids: list[int]
    mask_token_id: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    extra: dict[str, Any] = field(default_factory=dict)

    def config(self, dtype: str) -> dict[str, Any]:
        """config.json as z-lab's DFlash checkpoints write it."""
        return {
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta,
            "tie_word_embeddings": False,
            "attention_bias": False,
            "num_target_layers": self.num_target_layers,
            "block_size": self.block_size,
            "layer_types": ["full_attention"] * self.num_hidden_layers,
            "dflash_config": {"target_layer_ids": list(self.target_layer_ids),
                              "mask_token_id": self.mask_token_id},
            "torch_dtype": dtype,
            **self.extra,
        }


class DraftAttention(nn.Module):
    def __init__(self, a: DraftArgs):
        super().__init__()
        from mlx_lm.models.rope_utils import initialize_rope

        self.n_heads, self.n_kv_heads, self.head_dim = a.num_attention_heads, a.num_key_value_heads, a.head_dim
        self.scale = a.head_dim ** -0.5
        h = a.hidden_size
        self.q_proj = nn.Linear(h, self.n_heads * a.head_dim, bias=False)
        self.k_proj = nn.Linear(h, self.n_kv_heads * a.head_dim, bias=False)
        self.v_proj = nn.Linear(h, self.n_kv_heads * a.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * a.head_dim, h, bias=False)
        self.q_norm = nn.RMSNorm(a.head_dim, eps=a.rms_norm_eps)
        self.k_norm = nn.RMSNorm(a.head_dim, eps=a.rms_norm_eps)
        self.rope = initialize_rope(a.head_dim, base=a.rope_theta, traditional=False,
                                    scaling_config=None, max_position_embeddings=a.max_position_embeddings)

    def _heads(self, x: mx.array, n: int) -> mx.array:
        return x.reshape(x.shape[0], x.shape[1], n, -1).transpose(0, 2, 1, 3)

    def __call__(self, x: mx.array, context: mx.array) -> mx.array:
        from mlx_lm.models.base import scaled_dot_product_attention

        b, rows, _ = x.shape
        ctx = int(context.shape[1])
        q = self.rope(self.q_norm(self.q_proj(x).reshape(b, rows, self.n_heads, -1)).transpose(0, 2, 1, 3),
                      offset=ctx)
        ck = self.k_norm(self.k_proj(context).reshape(b, ctx, self.n_kv_heads, -1)).transpose(0, 2, 1, 3)
        nk = self.k_norm(self.k_proj(x).reshape(b, rows, self.n_kv_heads, -1)).transpose(0, 2, 1, 3)
        keys = mx.concatenate([self.rope(ck, offset=0), self.rope(nk, offset=ctx)], axis=-2)
        values = mx.concatenate([self._heads(self.v_proj(context), self.n_kv_heads),
                                 self._heads(self.v_proj(x), self.n_kv_heads)], axis=-2)
        out = scaled_dot_product_attention(q, keys, values, cache=None, scale=self.scale, mask=None)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(b, rows, -1))


class DraftLayer(nn.Module):
    def __init__(self, a: DraftArgs):
        super().__init__()
        from mlx_lm.models.qwen3 import MLP

        self.self_attn = DraftAttention(a)
        self.mlp = MLP(a.hidden_size, a.intermediate_size)
        self.input_layernorm = nn.RMSNorm(a.hidden_size, eps=a.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(a.hidden_size, eps=a.rms_norm_eps)

    def __call__(self, x: mx.array, context: mx.array) -> mx.array:
        h = x + self.self_attn(self.input_layernorm(x), context)
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashDrafter(nn.Module):
    """The drafter's weights and its block forward (uncached: the whole context each call)."""

    def __init__(self, a: DraftArgs):
        super().__init__()
        self.args = a
        self.layers = [DraftLayer(a) for _ in range(a.num_hidden_layers)]
        self.norm = nn.RMSNorm(a.hidden_size, eps=a.rms_norm_eps)
        self.fc = nn.Linear(len(a.target_layer_ids) * a.hidden_size, a.hidden_size, bias=False)
        self.hidden_norm = nn.RMSNorm(a.hidden_size, eps=a.rms_norm_eps)

    def __call__(self, block_embedding: mx.array, target_features: mx.array) -> mx.array:
        """Hidden states of the block (batch, rows, hidden) from its embedding and the raw target features."""
        context = self.hidden_norm(self.fc(target_features))
        h = block_embedding
        for layer in self.layers:
            h = layer(h, context)
        return self.norm(h)
