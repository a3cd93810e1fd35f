"""DSpark drafter fixtures: a target in a real family's shape and a DeepSpec-format DSpark drafter for it.

Two engines load this format: mlx-dspark 0.20.3 (``load_drafter``, strict on
tensor names) and dspark-mlx 0.1.0 (``load_draft`` through its ``qwen3``
architecture). Both read DeepSeek's standalone DeepSpec drafters
(``deepseek-ai/dspark_qwen3_*_block7``): ``config.json`` with the backbone's
``model_type`` (``qwen3``), ``hidden_size`` / ``num_hidden_layers`` /
``intermediate_size`` / ``num_attention_heads`` / ``num_key_value_heads`` /
``head_dim``, the DSpark keys ``block_size``, ``mask_token_id``,
``target_layer_ids``, ``num_target_layers``, ``markov_rank``,
``enable_confidence_head``, ``confidence_head_with_markov``; tensors
``embed_tokens``, ``fc`` (the concatenated target features, ``hidden x
len(target_layer_ids)``), ``hidden_norm``, ``layers.N.{self_attn,mlp,...}``,
``norm``, ``lm_head``, ``markov_head.markov_w{1,2}`` and
``confidence_head.proj`` (with a bias). The block samples from its anchor slot:
a block of ``block_size`` rows proposes ``block_size`` tokens.

Every weight is random except the Markov head, which decides each proposal:
a DSpark block adds ``markov_w2(markov_w1[prev])`` to the backbone's logits
before it picks each token from the previous one. The head is written as a
bigram table of the target's own greedy continuations of the fit prompts
(margin :data:`MARKOV_MARGIN` over a backbone whose output head is near zero),
with a share of its rows (:data:`HOLDOUT`) pointing at a token classic decode
does not emit. So the drafts are known in advance: where the target's next
token follows from the previous one alone, blocks are accepted in full; where
it does not, or a held-out row is reached, in part or not at all.
:class:`~specparity.dflash_fixtures.AcceptMix` measures the mix along classic
decode's tokens (what an exact engine accepts), and the fixture reports it.

Targets are the DFlash fixtures' (:data:`specparity.dflash_fixtures.SHAPES`):
dense ``qwen3`` and the gated-delta hybrid ``qwen3_5`` in the published head
ratios, tied or untied heads, float32 or bfloat16.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specparity.dflash_fixtures import DTYPES, MASK_TOKEN, SHAPES, TARGET_LAYER_IDS, AcceptMix, target_config
from specparity.errors import UsageError
from specparity.fixtures import MadeFixture, accept_mix_warning, pair_lines

log = logging.getLogger(__name__)

KIND = "dspark"
BLOCK_SIZE = 7  # DeepSeek's published heads: dspark_qwen3_*_block7
FIT_TOKENS = 64  # greedy tokens per fit prompt
EXTRA_FIT_PROMPTS = 5
MARKOV_MARGIN = 8.0  # the table's logit: exact in bfloat16 and in a 4-bit affine quantization (mlx-dspark's default)
HEAD_SCALE = 1e-4  # the backbone's output head: random, three orders of magnitude under the margin
HOLDOUT = 0.25  # share of the table's rows written wrong on purpose (zero-accept blocks)
_DRAFT = {"num_hidden_layers": 1, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 32}


@dataclass
class DSparkFixtureInfo:
    """What :func:`build_dspark_pair` made.

    target / draft: checkpoint directories (mlx-lm target; DeepSpec DSpark drafter).
    shape, shape_note, dtype, tied, block_size, seed: how they were built.
    target_layer_ids, mask_token_id: what the drafter reads and fills its block with.
    accept_mix: AcceptMix.to_dict() along classic decode of the fit prompts (rows = block_size + 1).
    fit_prompts: the token-id prompts (the built-in probe prompts first).
    table_rows / held_out: bigram rows written from classic decode / written wrong on purpose.
    """

    target: str
    draft: str
    shape: str
    shape_note: str
    dtype: str
    tied: bool
    block_size: int
    seed: int
    target_layer_ids: list[int]
    mask_token_id: int
    accept_mix: dict[str, Any]
    fit_prompts: list[list[int]]
    table_rows: int
    held_out: int
    kind: str = KIND

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DSparkFixtureInfo:
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def drafter_config(target_cfg: dict[str, Any], block_size: int, mask_id: int, dtype: str) -> dict[str, Any]:
    """The drafter's config.json, keys as DeepSeek's DeepSpec Qwen3 heads write them."""
    from specparity.fixtures import VOCAB_SIZE

    return {
        "architectures": ["Qwen3DSparkModel"],
        "model_type": "qwen3",
        "hidden_size": target_cfg["hidden_size"],
        "vocab_size": VOCAB_SIZE,
        "rms_norm_eps": target_cfg["rms_norm_eps"],
        "rope_theta": 10000.0,
        "max_position_embeddings": target_cfg["max_position_embeddings"],
        "target_layer_ids": list(TARGET_LAYER_IDS),
        "num_target_layers": target_cfg["num_hidden_layers"],
        "block_size": block_size,
        "mask_token_id": mask_id,
        "markov_rank": VOCAB_SIZE,  # a full-rank table: every previous token has its own row
        "enable_confidence_head": True,
        "confidence_head_with_markov": True,
        "temperature": 0.0,
        "torch_dtype": dtype,
        **_DRAFT,
    }


def drafter_weights(cfg: dict[str, Any], table: list[int], seed: int) -> dict[str, Any]:
    """Random DeepSpec-format tensors (float32) whose Markov head is ``table`` (previous token -> proposal)."""
    import mlx.core as mx

    mx.random.seed(seed + 11)
    h, v, r = cfg["hidden_size"], cfg["vocab_size"], cfg["markov_rank"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    inter = cfg["intermediate_size"]

    def rnd(*shape: int, scale: float = 0.02) -> Any:
        return mx.random.normal(shape) * scale

    w: dict[str, Any] = {
        "embed_tokens.weight": rnd(v, h),
        "fc.weight": rnd(h, h * len(cfg["target_layer_ids"])),
        "hidden_norm.weight": mx.ones((h,)),
        "norm.weight": mx.ones((h,)),
        "lm_head.weight": rnd(v, h, scale=HEAD_SCALE),
        "markov_head.markov_w1.weight": mx.eye(v, r),
        "confidence_head.proj.weight": rnd(1, h + r),
        "confidence_head.proj.bias": mx.zeros((1,)),
    }
    w2 = [[0.0] * r for _ in range(v)]
    for prev, nxt in enumerate(table):
        w2[nxt][prev] = MARKOV_MARGIN
    w["markov_head.markov_w2.weight"] = mx.array(w2)
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        w.update({
            p + "self_attn.q_proj.weight": rnd(nh * hd, h), p + "self_attn.k_proj.weight": rnd(nkv * hd, h),
            p + "self_attn.v_proj.weight": rnd(nkv * hd, h), p + "self_attn.o_proj.weight": rnd(h, nh * hd),
            p + "self_attn.q_norm.weight": mx.ones((hd,)), p + "self_attn.k_norm.weight": mx.ones((hd,)),
            p + "mlp.gate_proj.weight": rnd(inter, h), p + "mlp.up_proj.weight": rnd(inter, h),
            p + "mlp.down_proj.weight": rnd(h, inter),
            p + "input_layernorm.weight": mx.ones((h,)), p + "post_attention_layernorm.weight": mx.ones((h,)),
        })
    return w


def bigram_table(trajs: list[list[int]], starts: list[int], vocab: int, holdout: float,
                 seed: int) -> tuple[list[int], int, int]:
    """previous token -> proposal: classic decode's first successor of each token emitted after the prompts,
    ``holdout`` of those rows (and every row never seen) pointing at another token. Returns (table, rows
    written from classic decode, rows held out)."""
    rng = random.Random(seed + 3)
    seen: dict[int, int] = {}
    for traj, start in zip(trajs, starts, strict=True):
        for a, b in zip(traj[start - 1:-1], traj[start:], strict=True):
            seen.setdefault(a, b)
    table = [0] * vocab
    held = 0
    for prev in range(vocab):
        if prev in seen and rng.random() >= holdout:
            table[prev] = seen[prev]
        else:
            # never what classic decode emitted after ``prev`` first
            table[prev] = (seen.get(prev, 0) + 1 + rng.randrange(vocab - 1)) % vocab
            held += prev in seen
    return table, len(seen) - held, held


def simulate(trajs: list[list[int]], starts: list[int], table: list[int], block_size: int) -> AcceptMix:
    """The accept mix an exact engine sees: each round drafts ``block_size`` tokens from the anchor by the
    table, accepts up to the first one classic decode does not emit, and moves one past the accepted."""
    mix = AcceptMix(block_size + 1)
    for traj, start in zip(trajs, starts, strict=True):
        accepts = []
        p = start - 1  # the anchor: the last prompt token
        while p + 1 + block_size <= len(traj):
            prev, a = traj[p], 0
            while a < block_size:
                prev = table[prev]
                if prev != traj[p + 1 + a]:
                    break
                a += 1
            accepts.append(a)
            p += a + 1
        mix.add(accepts)
    return mix


_TRAJECTORIES: dict[str, list[list[int]]] = {}


def _fit_trajectories(target: Any, config: dict[str, Any], seed: int, prompts: list[list[int]]) -> list[list[int]]:
    """Each prompt followed by the target's FIT_TOKENS greedy tokens (classic decode's).

    Kept in this process by (config, seed, prompts), which make the target: the pairs one process
    builds on one target (a DSpark pair and its all-wrong variant, ``holdout`` 1.0) decode it once.
    """
    from specparity.decode import advance_to_depth

    key = json.dumps([config, seed, prompts], sort_keys=True)
    if key not in _TRAJECTORIES:
        if len(_TRAJECTORIES) >= 16:
            _TRAJECTORIES.clear()
        _TRAJECTORIES[key] = [list(p) + advance_to_depth(target, p, FIT_TOKENS)[2] for p in prompts]
    return [list(t) for t in _TRAJECTORIES[key]]


def build_dspark_pair(out: str | os.PathLike, shape: str = "qwen3", dtype: str = "float32", tied: bool = False,
                      seed: int = 0, block_size: int = BLOCK_SIZE, holdout: float = HOLDOUT,
                      overwrite: bool = False) -> DSparkFixtureInfo:
    """Build ``out/target`` (mlx-lm) and ``out/draft`` (a DeepSpec DSpark drafter), atomically.

    An existing fixture at ``out`` built with these arguments is returned as it is (unless
    ``overwrite``); one built with others, or another kind of directory, is refused.
    """
    from specparity.fixtures import check_out_dir

    out = Path(out)
    check_out_dir(out, overwrite)  # a directory of the user's, or a link, is refused before any work
    asked = {"shape": shape, "dtype": dtype, "tied": bool(tied), "seed": seed, "block_size": block_size}
    if out.exists() and not overwrite:
        marker = out / "fixture.json"
        data = json.loads(marker.read_text()) if marker.exists() else {}
        if data.get("kind") != KIND:
            raise UsageError(f"{out} exists and is not a specparity DSpark fixture: choose another DIR")
        found = DSparkFixtureInfo.from_dict(data)
        differs = {k: v for k, v in asked.items() if getattr(found, k) != v}
        if differs:
            said = ", ".join(f"{k} {getattr(found, k)!r} (asked {v!r})" for k, v in differs.items())
            raise UsageError(f"{out} holds a DSpark fixture built with {said}: build into another directory")
        return found
    if block_size < 2:
        raise UsageError(f"block size {block_size}: a DSpark block proposes at least 2 tokens")
    import mlx.core as mx
    from tokenizers import Tokenizer

    from specparity.fixtures import VOCAB_SIZE, build_tokenizer, instantiate, model_params, publishing
    from specparity.prompts import DEFAULT_PROMPTS

    config = target_config(shape, dtype, tied)  # validates shape and dtype
    out.parent.mkdir(parents=True, exist_ok=True)
    with publishing(out) as tmp:
        build_tokenizer(tmp, extra_special=(MASK_TOKEN,))
        tok = Tokenizer.from_file(str(tmp / "tokenizer.json"))
        mask_id = tok.token_to_id(MASK_TOKEN)
        assert mask_id is not None, "the tokenizer lost its mask token"
        prompts = [tok.encode(t).ids for t in DEFAULT_PROMPTS]
        rng = random.Random(seed)
        prompts += [[rng.randrange(2, VOCAB_SIZE) for _ in range(12)] for _ in range(EXTRA_FIT_PROMPTS)]

        mx.random.seed(seed)
        target = instantiate(config)
        trajs = _fit_trajectories(target, config, seed, prompts)
        starts = [len(p) for p in prompts]
        table, rows, held = bigram_table(trajs, starts, VOCAB_SIZE, holdout, seed)
        mix = simulate(trajs, starts, table, block_size)

        (tmp / "target").mkdir()
        mx.save_safetensors(str(tmp / "target" / "model.safetensors"), model_params(target),
                            metadata={"format": "mlx"})
        (tmp / "target" / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        dcfg = drafter_config(config, block_size, mask_id, dtype)
        (tmp / "draft").mkdir()
        weights = {k: v.astype(getattr(mx, dtype)) for k, v in drafter_weights(dcfg, table, seed).items()}
        mx.save_safetensors(str(tmp / "draft" / "model.safetensors"), weights, metadata={"format": "mlx"})
        (tmp / "draft" / "config.json").write_text(json.dumps(dcfg, indent=2, sort_keys=True))
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            shutil.copy(tmp / name, tmp / "target" / name)
            shutil.move(str(tmp / name), tmp / "draft" / name)
        info = DSparkFixtureInfo(
            target=str(out / "target"), draft=str(out / "draft"), shape=shape, shape_note=SHAPES[shape][1],
            dtype=dtype, tied=bool(tied), block_size=block_size, seed=seed,
            target_layer_ids=list(TARGET_LAYER_IDS), mask_token_id=mask_id, accept_mix=mix.to_dict(),
            fit_prompts=prompts, table_rows=rows, held_out=held)
        (tmp / "fixture.json").write_text(json.dumps(info.to_dict(), indent=2))
    log.info("built DSpark %s %s fixture in %s: %s", shape, dtype, out, mix.describe())
    return info


def dspark_fixture_name(shape: str, dtype: str, tied: bool) -> str:
    return f"dspark-{shape}-{dtype}-{'tied' if tied else 'untied'}"


def dspark_pair(shape: str = "qwen3", dtype: str = "float32", tied: bool = False) -> DSparkFixtureInfo:
    """A DSpark fixture in the shared cache ($SPECPARITY_HOME/fixtures), built on first use."""
    from specparity.fixtures import fixtures_home

    if dtype not in DTYPES:
        raise UsageError(f"DSpark fixtures are built in {' or '.join(DTYPES)}, not {dtype!r}")
    return build_dspark_pair(fixtures_home() / dspark_fixture_name(shape, dtype, tied), shape=shape, dtype=dtype,
                             tied=tied)


DFLY_KIND = "dfly"
DFLY_FC_SCALE = 1e3  # fc scaled up: hidden_norm(c * fc(x) + fusion) is hidden_norm(fc(x)) to ~1/c


def build_dfly_pair(out: str | os.PathLike, shape: str = "qwen3", dtype: str = "float32", tied: bool = False,
                    block_size: int = 8, overwrite: bool = False) -> dict[str, Any]:
    """Build ``out/target`` and ``out/draft``: a DFly drafter (dfly-mlx 0.1.0's format) from a fitted DFlash pair.

    DFly is dflash-mlx's DFlash drafter plus a per-layer fusion of the raw target features
    (``layer_fusion_weights``, draft layers x target layers, softmax-mixed into each layer's context)
    and a hidden-state correction before the target's own head (``hidden_correction.*``: two norms and
    a SwiGLU over [hidden, previous token's embedding]); its config names the target's depth
    (``target_num_hidden_layers``) and as many ``num_target_layers`` as it reads. The DFlash pair's
    fitted drafter (:func:`specparity.dflash_fixtures.build_dflash_pair`) keeps its proposals: its
    ``fc`` is scaled by :data:`DFLY_FC_SCALE` (the context norm cancels the scale, the random fusion
    term shrinks to ~1/scale), the fusion weights are random and the correction's down projection is
    zero (its norms and up/gate projections random). The accept mix reported is the DFlash drafter's,
    measured by that builder; the engine's own record in ``engine_e2e`` is the DFly drafter's.
    """
    import mlx.core as mx

    from specparity.dflash_fixtures import build_dflash_pair

    from specparity.fixtures import check_out_dir

    out = Path(out)
    check_out_dir(out, overwrite)  # a directory of the user's, or a link, is refused before any work
    marker = out / "fixture.json"
    if out.exists() and not overwrite:
        data = json.loads(marker.read_text()) if marker.exists() else {}
        if data.get("kind") != DFLY_KIND:
            raise UsageError(f"{out} exists and is not a specparity DFly fixture: choose another DIR")
        asked = {"shape": shape, "dtype": dtype, "tied": bool(tied), "block_size": block_size}
        differs = {k: v for k, v in asked.items() if data.get(k) != v}
        if differs:
            raise UsageError(f"{out} holds a DFly fixture built with other arguments ({', '.join(differs)})")
        return data
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
        info = {**base.to_dict(), "kind": DFLY_KIND, "target": str(out / "target"), "draft": str(out / "draft"),
                "derived_from": str(parent)}
        (tmp / "fixture.json").write_text(json.dumps(info, indent=2))
    return info


def _building(note: Callable[[str], None], out: str | os.PathLike, overwrite: bool, what: str) -> None:
    if not os.path.lexists(out) or overwrite:
        note(f"building {what}; fitting the drafter takes a minute on a CPU")


def dspark_format(out: str | os.PathLike, *, shape: str, dtype: str, tied: bool, block_size: int, seed: int,
                  overwrite: bool, note: Callable[[str], None]) -> MadeFixture:
    """``fixtures make --dflash SHAPE --drafter-format dspark``: a DeepSpec DSpark pair. A DeepSpec block of
    7 proposes 7 tokens: ``block_size`` (8 or 16 verify rows) maps to 7 or 15 proposals."""
    _building(note, out, overwrite, f"a DSpark {shape} pair ({block_size} verify rows, {dtype})")
    record = build_dspark_pair(out, shape=shape, dtype=dtype, tied=tied, seed=seed, block_size=block_size - 1,
                               overwrite=overwrite).to_dict()
    return MadeFixture(record, pair_lines(record, "DeepSpec DSpark drafter"), accept_mix_warning(record))


def dfly_format(out: str | os.PathLike, *, shape: str, dtype: str, tied: bool, block_size: int, seed: int,
                overwrite: bool, note: Callable[[str], None]) -> MadeFixture:
    """``fixtures make --dflash SHAPE --drafter-format dfly``: a DFly pair (from a fitted DFlash pair, whose
    seed is its own: ``seed`` is not used)."""
    _building(note, out, overwrite, f"a DFly {shape} pair (block {block_size}, {dtype})")
    record = build_dfly_pair(out, shape=shape, dtype=dtype, tied=tied, block_size=block_size, overwrite=overwrite)
    return MadeFixture(record, pair_lines(record, "DFly drafter: the target's embedding and head"),
                       accept_mix_warning(record))


def mtp_format(out: str | os.PathLike, *, shape: str, dtype: str, tied: bool, block_size: int, seed: int,
               overwrite: bool, note: Callable[[str], None]) -> MadeFixture:
    """``fixtures make --dflash qwen3_5 --drafter-format mtp``: a target with MTP heads, no drafter
    (``block_size`` does not apply: mtplx's depth is its own)."""
    record = build_mtp_target(out, shape=shape, dtype=dtype, tied=tied, seed=seed, overwrite=overwrite)
    lines = [f"target: {record['target']} ({record['shape_note']}; {'tied' if record['tied'] else 'untied'} head)",
             f"MTP heads: {record['target']}/{record['mtp_file']} ({record['mtp_layers']} layer,"
             f" {len(record['mtp_tensors'])} tensors, mtplx's format)"]
    return MadeFixture(record, lines)


MTP_KIND = "mtp"
MTP_FILE = "mtp.safetensors"  # mtplx's expected_mtp_file when the config names no other


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
                     seed: int = 0, overwrite: bool = False) -> dict[str, Any]:
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
    asked = {"shape": shape, "dtype": dtype, "tied": bool(tied), "seed": seed}
    if out.exists() and not overwrite:
        marker = out / "fixture.json"
        data = json.loads(marker.read_text()) if marker.exists() else {}
        if data.get("kind") != MTP_KIND:
            raise UsageError(f"{out} exists and is not a specparity MTP fixture: choose another DIR")
        differs = {k: v for k, v in asked.items() if data.get(k) != v}
        if differs:
            said = ", ".join(f"{k} {data.get(k)!r} (asked {v!r})" for k, v in differs.items())
            raise UsageError(f"{out} holds an MTP fixture built with {said}: build into another directory")
        return dict(data)
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
        info = {"kind": MTP_KIND, "target": str(out / "target"), "draft": None, **asked,
                "shape_note": SHAPES[shape][1], "mtp_file": MTP_FILE, "mtp_layers": 1,
                "mtp_tensors": sorted(head), "fit_prompts": [tok.encode(t).ids for t in DEFAULT_PROMPTS]}
        (tmp / "fixture.json").write_text(json.dumps(info, indent=2))
    log.info("built MTP %s %s fixture in %s (%d head tensors)", shape, dtype, out, len(head))
    return info
