"""The ``gemma4-assistant`` drafter format: a Gemma 4 target and its ``gemma4_assistant`` MTP drafter.

``specparity fixtures make DIR --dflash gemma4-e2b --drafter-format gemma4-assistant`` builds ``DIR/target`` (an
mlx-lm ``gemma4`` checkpoint: the multimodal wrapper with a ``gemma4_text`` language model and no vision or audio
tower) and ``DIR/draft`` (a ``gemma4_assistant`` checkpoint as mlx-lm-broomva's ``mlx_lm/models/gemma4_assistant.py``
loads it). Nothing else reads this format: mlx-lm's own releases have no ``gemma4_assistant`` model.

The shapes keep what the engine's code paths depend on, at a size a CPU runs in seconds. From the published
configs (``config.json`` of google/gemma-4-E2B-it, -31B-it and their ``-assistant`` drafters):

    E2B target    35 layers, 4 sliding : 1 full, window 512; 8 heads : 1 KV head, head 256 (full 512, p-RoPE 0.25);
                  the last 20 layers reuse earlier layers' K/V (num_kv_shared_layers), per-layer inputs (256),
                  double-wide MLP on the shared layers; final logit softcap 30; tied head
    E2B assistant 4 layers (3 sliding, 1 full), hidden 256, 4 heads : 1 KV head, head 256 / 512, MLP 2048;
                  backbone 1536; ordered embeddings: 2048 centroids, top 32 (a 262144 vocabulary)
    31B target    60 layers, 5 sliding : 1 full, window 1024; 32 heads : 16 KV heads, full layers 4 KV heads with
                  K = V (attention_k_eq_v); no shared K/V, no per-layer inputs
    31B assistant 4 layers, hidden 1024, 32 heads : 16 KV heads (4 global, K = V), MLP 8192; no ordered embeddings

Here every width is scaled down (hidden 64, head 32 / 64, the fixture tokenizer's 512 ids) and so is the sliding
window (32 and 64 positions for 512 and 1024), so a 64-token run crosses it as a long real one does. The drafter
owns no K/V: it reads the target's last K/V of each attention type, so its head widths and K/V head counts are
the target's. A random drafter accepts almost nothing, so the drafter is fitted as the real ones are made, by
distillation: from the target's hidden state and its K/V it learns to predict the target's own greedy tokens
two ahead (the default ``num_draft_tokens``) on the fixture's prompts. Its acceptance is measured as the
engine's loop would see it, teacher-forced along classic decode (:class:`AssistantMix`).
"""

from __future__ import annotations

import json
import logging
import os
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from specparity.errors import UsageError
from specparity.fixtures import Fixture, MadeFixture

log = logging.getLogger(__name__)

KIND = "gemma4-assistant"
DTYPES = ("float32", "bfloat16")
DRAFTS = 2  # mtp_speculative_generate_step's default num_draft_tokens: the depth the drafter is fitted to
FIT_TOKENS = 64  # greedy tokens per fit prompt
EXTRA_FIT_PROMPTS = 2  # random-id prompts beside the built-in ones
# optimizer steps after which the mix is measured; the fit stops once full, partial and zero-accept rounds are
# each at least BALANCE of the rounds (a drafter fitted to the end accepts every draft of its fit prompts)
CHECKPOINTS = (10, 20, 30, 40, 50, 60, 80, 100, 130, 160, 200)
BALANCE = 0.1
# the share of each prompt's rows (per draft depth) the drafter is shown: it learns those and guesses the rest, so
# its rounds are full, partial and zero accepts along the whole run, as a real drafter's are
SHOWN = 0.6
_ROPE = {
    "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
    "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
}
_S, _F = "sliding_attention", "full_attention"

# name -> (target text_config, assistant text_config and top-level fields, what it stands for)
SHAPES: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {
    "gemma4-e2b": (
        {"num_hidden_layers": 10, "layer_types": [_S, _S, _S, _S, _F] * 2, "sliding_window": 32,
         "sliding_window_pattern": 5, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32,
         "global_head_dim": 64, "num_kv_shared_layers": 5, "hidden_size_per_layer_input": 16,
         "use_double_wide_mlp": True, "attention_k_eq_v": False, "num_global_key_value_heads": None},
        {"top": {"use_ordered_embeddings": True, "num_centroids": 32, "centroid_intermediate_top_k": 4},
         "text": {"hidden_size": 32, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 1,
                  "attention_k_eq_v": False, "num_global_key_value_heads": None}},
        "Gemma 4 E2B: 4 sliding : 1 full (window 32 for 512), 4:1 heads of 32 (full 64, p-RoPE 0.25), the last 5"
        " of 10 layers share K/V, per-layer inputs, double-wide shared MLP; assistant: 4 layers, hidden 32,"
        " ordered embeddings (32 centroids, top 4)",
    ),
    "gemma4-31b": (
        {"num_hidden_layers": 6, "layer_types": [_S, _S, _S, _S, _S, _F], "sliding_window": 64,
         "sliding_window_pattern": 6, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 32,
         "global_head_dim": 64, "num_kv_shared_layers": 0, "hidden_size_per_layer_input": 0,
         "vocab_size_per_layer_input": 0, "use_double_wide_mlp": False, "attention_k_eq_v": True,
         "num_global_key_value_heads": 1},
        {"top": {"use_ordered_embeddings": False, "num_centroids": 32, "centroid_intermediate_top_k": 4},
         "text": {"hidden_size": 32, "intermediate_size": 128, "num_attention_heads": 8, "num_key_value_heads": 4,
                  "attention_k_eq_v": True, "num_global_key_value_heads": 1}},
        "Gemma 4 31B: 5 sliding : 1 full (window 64 for 1024), 8:4 heads of 32, full layers 1 K/V head of 64 with"
        " K = V, no shared K/V; assistant: 4 layers, hidden 32, no ordered embeddings",
    ),
}
_TARGET_COMMON: dict[str, Any] = {
    "model_type": "gemma4_text", "hidden_size": 64, "intermediate_size": 128, "rms_norm_eps": 1e-6,
    "vocab_size_per_layer_input": 512, "max_position_embeddings": 4096, "final_logit_softcapping": 30.0,
    "enable_moe_block": False, "rope_parameters": _ROPE, "hidden_activation": "gelu_pytorch_tanh",
}


@dataclass
class AssistantMix:
    """How the drafter's proposals fare against the target's greedy tokens, round by round as the engine's loop
    runs them (each round drafts ``drafts`` from the token the last round emitted, accepted up to the first one
    classic decode would not emit), teacher-forced along classic decode.

    rounds: rounds counted. full / partial / zero: rounds with every / some / no draft accepted. accepted:
    drafts accepted in all. per_prompt: each fit prompt's accept vector.
    """

    drafts: int = DRAFTS
    rounds: int = 0
    full: int = 0
    partial: int = 0
    zero: int = 0
    accepted: int = 0
    per_prompt: list[list[int]] = field(default_factory=list)


@dataclass(kw_only=True)
class Gemma4FixtureInfo(Fixture):
    """What :func:`build_gemma4_pair` made: a Gemma 4 target and its ``gemma4_assistant`` drafter.

    shape, shape_note, dtype, tied, seed: how it was built. sliding_window: the target's window (positions).
    fit_steps: optimizer steps of the drafter's fit. mix: its acceptance on the fit prompts (:class:`AssistantMix`).
    fit_prompts: the built-in prompts as token ids.
    """

    shape: str
    shape_note: str
    dtype: str
    tied: bool
    seed: int
    sliding_window: int = 0
    fit_steps: int = 0
    mix: dict[str, Any] = field(default_factory=dict)
    fit_prompts: list[list[int]] = field(default_factory=list)
    kind: str = KIND
    WHAT: ClassVar[str] = "a Gemma 4 pair with its assistant drafter"


def gemma4_format(out: str | os.PathLike, *, shape: str, dtype: str, tied: bool, block_size: int | None, seed: int,
                  overwrite: bool, note: Callable[[str], None]) -> MadeFixture:
    """``fixtures make --dflash gemma4-e2b --drafter-format gemma4-assistant``: the pair (``block_size`` does not
    apply: the engine drafts ``num_draft_tokens`` per round; ``--tied-head`` is the published shape, and without it
    the target gets an ``lm_head`` of its own, which no published Gemma 4 has)."""
    info = build_gemma4_pair(out, shape=shape, dtype=dtype, tied=tied, seed=seed, overwrite=overwrite)
    record = info.to_dict()
    mix = info.mix
    lines = [f"target: {info.target} ({info.shape_note}; {'tied' if info.tied else 'untied'} head, {info.dtype})",
             f"draft:  {info.draft} (gemma4_assistant, fitted {info.fit_steps} steps: {mix.get('accepted', 0)} of"
             f" {mix.get('rounds', 0) * DRAFTS} drafts accepted over {mix.get('rounds', 0)} rounds on the fit prompts;"
             f" {mix.get('full', 0)} full, {mix.get('partial', 0)} partial, {mix.get('zero', 0)} zero)"]
    warning = None
    if not _balanced(AssistantMix(**mix)):
        warning = "warning: the drafter's rounds are not a mix of full, partial and zero accepts on the fit prompts"
    return MadeFixture(record, lines, warning)


def target_config(shape: str, dtype: str, tied: bool) -> dict[str, Any]:
    """The target's ``config.json``: the ``gemma4`` wrapper (as published) around its ``gemma4_text`` config."""
    if shape not in SHAPES:
        raise UsageError(f"--dflash {shape!r}: the gemma4-assistant format builds {', '.join(SHAPES)}")
    if dtype not in DTYPES:
        raise UsageError(f"--dtype {dtype!r}: the gemma4-assistant format builds {', '.join(DTYPES)}")
    from specparity.fixtures import VOCAB_SIZE

    text = {**_TARGET_COMMON, **SHAPES[shape][0], "vocab_size": VOCAB_SIZE, "tie_word_embeddings": bool(tied)}
    return {"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"], "text_config": text,
            "vocab_size": VOCAB_SIZE, "tie_word_embeddings": bool(tied), "torch_dtype": dtype, "eos_token_id": 0}


def draft_config(target: dict[str, Any], shape: str, dtype: str) -> dict[str, Any]:
    """The assistant's ``config.json`` (``gemma4_assistant``): 4 layers (3 sliding, 1 full) reading the target's
    K/V, so its head widths, K/V heads and RoPE are the target's."""
    t = target["text_config"]
    spec = SHAPES[shape][1]
    text = {"model_type": "gemma4_text", "num_hidden_layers": 4, "layer_types": [_S, _S, _S, _F],
            "num_kv_shared_layers": 4, "head_dim": t["head_dim"], "global_head_dim": t["global_head_dim"],
            "sliding_window": t["sliding_window"], "rope_parameters": _ROPE, "rms_norm_eps": 1e-6,
            "vocab_size": t["vocab_size"], "hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 0,
            "use_double_wide_mlp": False, "enable_moe_block": False, "final_logit_softcapping": None,
            "max_position_embeddings": t["max_position_embeddings"], "tie_word_embeddings": True,
            "hidden_activation": "gelu_pytorch_tanh", **spec["text"]}
    return {"model_type": "gemma4_assistant", "architectures": ["Gemma4AssistantForCausalLM"],
            "backbone_hidden_size": t["hidden_size"], "tie_word_embeddings": True, "vocab_size": t["vocab_size"],
            "torch_dtype": dtype, **spec["top"], "text_config": text}


def _assistant_module(config: dict[str, Any]) -> Any:
    """The assistant as an mlx module whose parameters carry mlx-lm-broomva's names and whose forward is its
    ``gemma4_assistant.Model``'s (this interpreter's mlx-lm may have no ``gemma4_assistant``): Q-only attention
    over the target's K/V, RoPE from one offset, the Gemma double-norm block, the tied or clustered head."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.models.base import scaled_dot_product_attention
    from mlx_lm.models.rope_utils import initialize_rope

    tc = config["text_config"]

    class Attention(nn.Module):
        def __init__(self, layer_type: str) -> None:
            super().__init__()
            self.n_heads, self.n_kv_heads = tc["num_attention_heads"], tc["num_key_value_heads"]
            self.head_dim = tc["global_head_dim"] if layer_type == _F else tc["head_dim"]
            self.q_proj = nn.Linear(tc["hidden_size"], self.n_heads * self.head_dim, bias=False)
            self.q_norm = nn.RMSNorm(self.head_dim, eps=tc["rms_norm_eps"])
            self.o_proj = nn.Linear(self.n_heads * self.head_dim, tc["hidden_size"], bias=False)
            rope = tc["rope_parameters"][layer_type]
            self.rope = initialize_rope(dims=self.head_dim, traditional=False, base=rope["rope_theta"],
                                        scaling_config=rope, max_position_embeddings=tc["max_position_embeddings"])

        def __call__(self, x: Any, k: Any, v: Any, offset: Any, mask: Any) -> Any:
            B, L, _ = x.shape
            q = self.q_norm(self.q_proj(x).reshape(B, L, self.n_heads, self.head_dim)).transpose(0, 2, 1, 3)
            q = self.rope(q, offset=offset)
            if self.n_kv_heads != self.n_heads:
                k = mx.repeat(k, self.n_heads // self.n_kv_heads, axis=1)
                v = mx.repeat(v, self.n_heads // self.n_kv_heads, axis=1)
            o = scaled_dot_product_attention(q, k, v, cache=None, scale=self.head_dim ** -0.5, mask=mask)
            return self.o_proj(o.transpose(0, 2, 1, 3).reshape(B, L, -1))

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            h, i = tc["hidden_size"], tc["intermediate_size"]
            self.gate_proj, self.up_proj = nn.Linear(h, i, bias=False), nn.Linear(h, i, bias=False)
            self.down_proj = nn.Linear(i, h, bias=False)

        def __call__(self, x: Any) -> Any:
            return self.down_proj(nn.gelu_approx(self.gate_proj(x)) * self.up_proj(x))

    class Layer(nn.Module):
        def __init__(self, layer_type: str) -> None:
            super().__init__()
            h, eps = tc["hidden_size"], tc["rms_norm_eps"]
            self.layer_type = layer_type
            self.self_attn, self.mlp = Attention(layer_type), MLP()
            self.input_layernorm, self.post_attention_layernorm = nn.RMSNorm(h, eps=eps), nn.RMSNorm(h, eps=eps)
            self.pre_feedforward_layernorm, self.post_feedforward_layernorm = (nn.RMSNorm(h, eps=eps),
                                                                               nn.RMSNorm(h, eps=eps))
            self.layer_scalar = mx.ones((1,))

        def __call__(self, x: Any, k: Any, v: Any, offset: Any, mask: Any) -> Any:
            h = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), k, v, offset, mask))
            h = h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))
            return h * self.layer_scalar

    class Text(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed_tokens = nn.Embedding(tc["vocab_size"], tc["hidden_size"])
            self.layers = [Layer(t) for t in tc["layer_types"]]
            self.norm = nn.RMSNorm(tc["hidden_size"], eps=tc["rms_norm_eps"])

    class Masked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.centroids = nn.Linear(tc["hidden_size"], config["num_centroids"], bias=False)

    class Assistant(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            backbone = config["backbone_hidden_size"]
            self.pre_projection = nn.Linear(2 * backbone, tc["hidden_size"], bias=False)
            self.model = Text()
            self.post_projection = nn.Linear(tc["hidden_size"], backbone, bias=False)
            if config["use_ordered_embeddings"]:
                self.masked_embedding = Masked()

        def __call__(self, embeds: Any, shared: dict[str, Any], offset: Any, mask: Any) -> tuple[Any, Any, Any]:
            """(hidden fed back, the tied head's logits, the centroid scores) of each query row."""
            h = self.pre_projection(embeds)
            for layer in self.model.layers:
                k, v = shared[layer.layer_type]
                h = layer(h, k, v, offset, mask)
            h = self.model.norm(h)
            centroids = self.masked_embedding.centroids(h) if config["use_ordered_embeddings"] else None
            return self.post_projection(h), self.model.embed_tokens.as_linear(h), centroids

    return Assistant()


def _target_pass(target: Any, seq: list[int]) -> tuple[Any, dict[str, Any]]:
    """The target over ``seq`` in one forward: its final (normed) hidden states, and the K/V of its last layer of
    each attention type (what the fork's ``return_shared_kv_states`` returns), captured from its attention."""
    import mlx.core as mx
    from mlx_lm.models import gemma4_text

    captured: dict[str, Any] = {}

    class Capturing(gemma4_text.Attention):
        def __call__(self, *args: Any, **kw: Any) -> Any:
            out = super().__call__(*args, **kw)
            captured[self.layer_type] = out[1]
            return out

    # this target's own attention modules take the capturing class for one forward; mlx-lm's class is untouched
    attention = [layer.self_attn for layer in target.language_model.model.layers]
    for module in attention:
        module.__class__ = Capturing
    try:
        hidden = target.language_model.model(mx.array(seq)[None])
    finally:
        for module in attention:
            module.__class__ = gemma4_text.Attention
    return hidden, captured


def _greedy(target: Any, prompt: list[int], n: int) -> list[int]:
    """The target's greedy continuation of ``prompt`` (classic decode: one token at a time on a cache)."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(target)
    logits = target(mx.array(prompt)[None], cache=cache)
    out: list[int] = []
    for _ in range(n):
        y = int(mx.argmax(logits[0, -1]).tolist())  # type: ignore[arg-type]  # a scalar's tolist is a number
        out.append(y)
        logits = target(mx.array([[y]]), cache=cache)
    return out


class _Fit:
    """The fit's data: per fit prompt, the target's greedy sequence, its hidden states and K/V, and the rows the
    drafter is trained on (position i: the token emitted there, the hidden state that emitted it, the keys before
    it; targets: the next ``DRAFTS`` greedy tokens)."""

    def __init__(self, target: Any, prompts: list[list[int]], seed: int):
        import mlx.core as mx

        rng = random.Random(seed)
        self.items: list[dict[str, Any]] = []
        text = target.language_model.model
        for prompt in prompts:
            seq = prompt + _greedy(target, prompt, FIT_TOKENS)
            hidden, shared = _target_pass(target, seq)
            # fitted in float32 whatever the target's dtype
            hidden = hidden.astype(mx.float32)
            shared = {t: (k.astype(mx.float32), v.astype(mx.float32)) for t, (k, v) in shared.items()}
            first = len(prompt)  # the first emitted token's position
            rows = list(range(first, len(seq) - DRAFTS))
            emb = (text.embed_tokens(mx.array([seq[i] for i in rows]))[None] * text.embed_scale).astype(mx.float32)
            self.items.append({
                "seq": seq, "first": first, "rows": rows, "hidden": hidden, "shared": shared,
                "inputs": mx.concatenate([emb, hidden[:, first - 1:len(seq) - DRAFTS - 1]], axis=-1),
                # query j (position first + j) sees the target's keys before it
                "mask": mx.arange(len(seq))[None] < (first + mx.arange(len(rows)))[:, None],
                "labels": [mx.array([seq[i + d + 1] for i in rows]) for d in range(DRAFTS)],
                "shown": [mx.array([float(rng.random() < SHOWN) for _ in rows]) for _ in range(DRAFTS)],
            })


def _loss(model: Any, fit: _Fit, embed: Any, scale: float, vocab_per_centroid: int, ordering: Any) -> Any:
    import mlx.core as mx
    import mlx.nn as nn

    total = mx.array(0.0)
    for item in fit.items:
        x, offset = item["inputs"], mx.array(item["first"])
        for d in range(DRAFTS):
            hid, logits, centroids = model(x, item["shared"], offset, item["mask"])
            labels, shown = item["labels"][d], item["shown"][d]
            total = total + (nn.losses.cross_entropy(logits[0], labels) * shown).sum() / shown.sum()
            if centroids is not None:  # the clustered head picks the label's cluster first
                cluster = mx.argsort(ordering)[labels] // vocab_per_centroid
                total = total + (nn.losses.cross_entropy(centroids[0], cluster) * shown).sum() / shown.sum()
            # the next draft: the drafted token's embedding (teacher-forced) and the drafter's own hidden state
            x = mx.concatenate([(embed(labels)[None] * scale).astype(mx.float32), hid], axis=-1)
    return total


def _balanced(mix: AssistantMix) -> bool:
    return bool(mix.rounds) and min(mix.full, mix.partial, mix.zero) >= BALANCE * mix.rounds


def _fit_drafter(target: Any, config: dict[str, Any], prompts: list[list[int]], measured: list[list[int]],
                 seed: int) -> tuple[Any, Any, AssistantMix, int]:
    """The assistant fitted to the target's greedy tokens: its module, its token ordering, its mix on
    ``measured`` and the steps it took (the first checkpoint whose mix is balanced, else the last)."""
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim

    mx.random.seed(seed + 1)
    model = _assistant_module(config)
    vocab = config["vocab_size"]
    rng = random.Random(seed)
    ordering = mx.array(rng.sample(range(vocab), vocab), dtype=mx.int32)  # cluster-ordered position -> token id
    per_centroid = vocab // config["num_centroids"]
    fit = _Fit(target, prompts, seed)
    text = target.language_model.model
    embed, scale = text.embed_tokens, text.embed_scale
    opt = optim.Adam(learning_rate=3e-3)
    step = nn.value_and_grad(model, lambda m: _loss(m, fit, embed, scale, per_centroid, ordering))
    done, mix = 0, AssistantMix()
    for checkpoint in CHECKPOINTS:
        for _ in range(checkpoint - done):
            _, grads = step(model)
            opt.update(model, grads)
            mx.eval(model.parameters(), opt.state)
        done = checkpoint
        mix = measure_mix(target, model, config, ordering, measured)
        log.info("assistant fit: %d steps, %d full / %d partial / %d zero of %d rounds", done, mix.full,
                 mix.partial, mix.zero, mix.rounds)
        if _balanced(mix):
            break
    return model, ordering, mix, done


def measure_mix(target: Any, model: Any, config: dict[str, Any], ordering: Any,
                prompts: list[list[int]]) -> AssistantMix:
    """The drafter's rounds as the engine runs them, teacher-forced along classic decode: each round drafts
    ``DRAFTS`` from the position after the last emitted token (its hidden state, the keys before it), the
    drafts accepted up to the first that differs from the greedy token, the next round after the bonus token."""
    import mlx.core as mx

    mix = AssistantMix()
    text = target.language_model.model
    per_centroid = config["text_config"]["vocab_size"] // config["num_centroids"]
    top_k = config["centroid_intermediate_top_k"]
    for prompt in prompts:
        seq = prompt + _greedy(target, prompt, FIT_TOKENS)
        hidden, shared = _target_pass(target, seq)
        accepts: list[int] = []
        i = len(prompt)
        while i + DRAFTS < len(seq):
            kv = {t: (k[..., :i, :], v[..., :i, :]) for t, (k, v) in shared.items()}
            tok, hid, n = seq[i], hidden[:, i - 1:i], 0
            drafts = []
            for _ in range(DRAFTS):
                x = mx.concatenate([text.embed_tokens(mx.array([[tok]])) * text.embed_scale, hid], axis=-1)
                hid, logits, centroids = model(x, kv, mx.array(i), None)
                if centroids is not None:  # only the top clusters' tokens compete, as the engine's head does
                    top = mx.argpartition(-centroids[0, -1], kth=top_k - 1)[:top_k]
                    allowed = mx.array(ordering).reshape(-1, per_centroid)[top].reshape(-1)
                    row = logits[0, -1]
                    tok = int(allowed[mx.argmax(row[allowed])].tolist())  # type: ignore[arg-type]
                else:
                    tok = int(mx.argmax(logits[0, -1]).tolist())  # type: ignore[arg-type]
                drafts.append(tok)
            while n < DRAFTS and drafts[n] == seq[i + 1 + n]:
                n += 1
            accepts.append(n)
            i += n + 1
        mix.per_prompt.append(accepts)
        mix.rounds += len(accepts)
        mix.accepted += sum(accepts)
        mix.full += sum(1 for a in accepts if a == DRAFTS)
        mix.zero += sum(1 for a in accepts if a == 0)
        mix.partial += sum(1 for a in accepts if 0 < a < DRAFTS)
    return mix


def build_gemma4_pair(out: str | os.PathLike, shape: str = "gemma4-e2b", dtype: str = "float32", tied: bool = True,
                      seed: int = 0, overwrite: bool = False) -> Gemma4FixtureInfo:
    """Build ``out/target`` (Gemma 4) and ``out/draft`` (its fitted ``gemma4_assistant``), atomically; the record.

    An existing fixture at ``out`` built with these arguments is returned as it is (unless ``overwrite``).
    """
    from specparity.fixtures import check_out_dir

    out = Path(out)
    check_out_dir(out, overwrite)
    config = target_config(shape, dtype, tied)  # validates shape and dtype
    if out.exists() and not overwrite:
        return Gemma4FixtureInfo.existing(out, shape=shape, dtype=dtype, tied=bool(tied), seed=seed)
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from tokenizers import Tokenizer

    from specparity.fixtures import build_tokenizer, instantiate, model_params, publishing
    from specparity.prompts import DEFAULT_PROMPTS

    dconfig = draft_config(config, shape, dtype)
    out.parent.mkdir(parents=True, exist_ok=True)
    with publishing(out, overwrite) as tmp:
        for member in ("target", "draft"):  # the fork's load() reads a tokenizer beside each checkpoint
            (tmp / member).mkdir()
            build_tokenizer(tmp / member)
        tok = Tokenizer.from_file(str(tmp / "target" / "tokenizer.json"))
        mx.random.seed(seed)
        target = instantiate(config)
        prompts = [tok.encode(t).ids for t in DEFAULT_PROMPTS]
        rng = random.Random(seed)
        fit_prompts = prompts + [[rng.randrange(1, config["vocab_size"]) for _ in range(12)]
                                 for _ in range(EXTRA_FIT_PROMPTS)]
        drafter, ordering, mix, steps = _fit_drafter(target, dconfig, fit_prompts, prompts, seed)
        mx.save_safetensors(str(tmp / "target" / "model.safetensors"), model_params(target),
                            metadata={"format": "mlx"})
        (tmp / "target" / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        wdtype = getattr(mx, dtype)
        flat: list[tuple[str, Any]] = tree_flatten(drafter.parameters())  # type: ignore[assignment]
        weights = {k: v.astype(wdtype) for k, v in flat}
        if dconfig["use_ordered_embeddings"]:
            # as published: the cluster ordering is a buffer the fork's sanitize installs (int64 on the hub)
            weights["masked_embedding.token_ordering"] = ordering.astype(mx.int64)
        mx.save_safetensors(str(tmp / "draft" / "model.safetensors"), weights, metadata={"format": "mlx"})
        (tmp / "draft" / "config.json").write_text(json.dumps(dconfig, indent=2, sort_keys=True))
        info = Gemma4FixtureInfo(target=str(out / "target"), draft=str(out / "draft"), shape=shape,
                                 shape_note=SHAPES[shape][2], dtype=dtype, tied=bool(tied), seed=seed,
                                 sliding_window=config["text_config"]["sliding_window"], fit_steps=steps,
                                 mix=asdict(mix), fit_prompts=prompts)
        (tmp / "fixture.json").write_text(json.dumps(info.record(), indent=2))
    log.info("built Gemma 4 %s %s pair in %s (%d of %d drafts accepted)", shape, dtype, out, mix.accepted,
             mix.rounds * DRAFTS)
    return info
