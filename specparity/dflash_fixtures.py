"""DFlash drafter fixtures: a target in the shape of a real DFlash family and a drafter fitted to it.

dflash-mlx serves Qwen3.5/3.6 hybrid targets (mlx-lm ``qwen3_5``: gated-delta
linear attention with a full-attention layer every fourth) and plain Qwen3
targets with z-lab's block drafters. The shapes here keep what the engine's
code paths depend on, at a size a CPU runs in seconds: the layer pattern, the
ratio of linear-attention value heads to key heads (the engine repeats key
heads to value heads in its verify and rollback kernels; more than one key head,
as every published config has, since one key head broadcasts where several do
not), the attention output
gate and head width, tied or untied output heads. Numbers from the published
configs (``config.json`` of each checkpoint):

    Qwen3.5-4B / 9B, Qwen3.5/3.6-35B-A3B   linear key:value heads 16:32, attention 16:4 (or 16:2)
    Qwen3.5-27B, Qwen3.6-27B               linear key:value heads 16:48, attention 24:4
    Qwen3-4B (tied head), Qwen3-8B         plain attention, 32:8

A random drafter accepts almost nothing, so the drafter is fitted the way real
DFlash drafters are made, by distillation: it learns to predict the target's
own greedy continuations of the fixture's prompts (the built-in probe prompts
and a few more) from the target's hidden states. On those prompts its blocks
are accepted in full, in part and not at all; :class:`AcceptMix` measures how
often, teacher-forced along classic decode's tokens (what an exact engine
accepts). The drafter knows nothing it was not shown: on other prompts it
accepts little.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specparity.errors import UsageError

log = logging.getLogger(__name__)

MASK_TOKEN = "<|mask|>"
BLOCK_SIZES = (8, 16)
DTYPES = ("float32", "bfloat16")
FIT_TOKENS = 96  # greedy tokens per fit prompt
EXTRA_FIT_PROMPTS = 5  # random-id prompts beside the built-in ones
# optimizer steps after which the mix is measured (a small target loops early: look often at first)
CHECKPOINTS = (25, 50, 75, 100, 150, 200, 300, 400, 500, 600, 800)
# the fit stops once each kind of block (full, partial, zero) is at least this share of the rounds
BALANCE = 0.1

_LINEAR = {"linear_key_head_dim": 32, "linear_value_head_dim": 32, "linear_conv_kernel_dim": 4}
_HYBRID = {
    "model_type": "qwen3_5",
    "num_hidden_layers": 4,
    "full_attention_interval": 4,
    "rope_parameters": {"type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
}

# name -> (target config overrides, what it stands for)
SHAPES: dict[str, tuple[dict[str, Any], str]] = {
    "qwen3_5": (
        {**_HYBRID, **_LINEAR, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
         "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 128},
        "gated-delta hybrid, linear key:value heads 1:2 (Qwen3.5-4B/9B, 3.5/3.6-35B-A3B: 16:32),"
        " attention 4:1 heads of 128",
    ),
    "qwen3_5-27b": (
        {**_HYBRID, **_LINEAR, "linear_num_key_heads": 2, "linear_num_value_heads": 6,
         "num_attention_heads": 6, "num_key_value_heads": 1, "head_dim": 128},
        "gated-delta hybrid, linear key:value heads 2:6 (Qwen3.5/3.6-27B: 16:48), attention 6:1 heads of 128",
    ),
    "qwen3_5-equal-heads": (
        {**_HYBRID, **_LINEAR, "linear_num_key_heads": 2, "linear_num_value_heads": 2,
         "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 128},
        "gated-delta hybrid with as many linear value heads as key heads (no published"
        " checkpoint has it: the control shape for the head-repeat paths)",
    ),
    "qwen3": (
        {"model_type": "qwen3", "num_hidden_layers": 4, "rope_theta": 10000.0,
         "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32},
        "plain attention, 4:1 heads (Qwen3-4B/8B: 32:8)",
    ),
}
TARGET_LAYER_IDS = [1, 2]
_COMMON: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 4096,
}
_DRAFT: dict[str, Any] = {"num_hidden_layers": 1, "intermediate_size": 128, "num_attention_heads": 4,
                          "num_key_value_heads": 2, "head_dim": 32}


@dataclass
class AcceptMix:
    """How the drafter's blocks fare against the target's greedy tokens.

    Rounds are simulated as an exact engine runs them: each block starts at the
    token the last round emitted, its proposals are accepted up to the first
    one classic decode would not emit, and the next block starts one past the
    accepted ones. Only full-width blocks count.

    block_size: rows per block (proposals = block_size - 1). rounds: blocks counted.
    full / partial / zero: blocks with every / some / no proposal accepted.
    accepted: proposals accepted in all. histogram: accepted count -> blocks.
    per_prompt: each fit prompt's accept vector.
    """

    block_size: int
    rounds: int = 0
    full: int = 0
    partial: int = 0
    zero: int = 0
    accepted: int = 0
    histogram: dict[int, int] = field(default_factory=dict)
    per_prompt: list[list[int]] = field(default_factory=list)

    def add(self, accepts: list[int]) -> None:
        self.per_prompt.append(list(accepts))
        for a in accepts:
            self.rounds += 1
            self.accepted += a
            self.histogram[a] = self.histogram.get(a, 0) + 1
            if a == self.block_size - 1:
                self.full += 1
            elif a == 0:
                self.zero += 1
            else:
                self.partial += 1

    @property
    def spread(self) -> bool:
        """Full, partial and zero-accept blocks all occur."""
        return self.full > 0 and self.partial > 0 and self.zero > 0

    def balance(self) -> float:
        """The rarest kind of block's share of the rounds."""
        return min(self.full, self.partial, self.zero) / max(self.rounds, 1)

    def balanced(self, floor: float = BALANCE) -> bool:
        """Each kind of block occurs and is at least ``floor`` of the rounds."""
        return self.spread and self.balance() >= floor

    def describe(self) -> str:
        mean = self.accepted / self.rounds if self.rounds else 0.0
        return (f"{self.rounds} blocks of {self.block_size} rows: {self.full} full, {self.partial} partial,"
                f" {self.zero} zero-accept (mean {mean:.2f} of {self.block_size - 1} proposals accepted)")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["histogram"] = {str(k): v for k, v in sorted(self.histogram.items())}
        d["spread"] = self.spread
        d["summary"] = self.describe()
        return d


@dataclass
class DFlashFixtureInfo:
    """What :func:`build_dflash_pair` made.

    target / draft: checkpoint directories (mlx-lm target; DFlash drafter for dflash-mlx).
    shape: a :data:`SHAPES` name; shape_note: what it stands for.
    dtype, tied (the target's head is its embedding), block_size, seed: how they were built.
    target_layer_ids: target layers the drafter reads. mask_token_id: the block's filler id.
    accept_mix: the measured mix on the fit prompts (AcceptMix.to_dict()).
    fit_prompts: the token-id prompts the drafter was fitted on (the built-in probe prompts first).
    train_steps: optimizer steps taken. balance: the share of the rounds each kind of block was
    fitted towards (:data:`BALANCE`; 0: the first checkpoint where all three occur).
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
    train_steps: int
    balance: float = BALANCE
    kind: str = "dflash"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DFlashFixtureInfo:
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})

    def record(self) -> dict[str, Any]:
        """What ``fixture.json`` stores: :meth:`to_dict` with the members relative to the fixture, so it
        reads the same from any cwd and after a move."""
        return {**self.to_dict(), "target": "target", "draft": "draft"}

    @classmethod
    def load(cls, out: Path) -> DFlashFixtureInfo:
        """The DFlash fixture in ``out`` as its record describes it (members as paths usable from here;
        a record of an older version, with paths as the build was given them, reads too)."""
        from specparity.fixtures import FIXTURE_RECORD, member, read_record

        data = read_record(out.resolve())
        if data is None or data.get("kind") != "dflash":
            what = "a fixture that is not a DFlash pair" if data else "no fixture record it can read"
            raise UsageError(f"{out} holds {what}: --overwrite rebuilds it, or choose another DIR")
        try:
            info = cls.from_dict(data)
        except TypeError as err:
            raise UsageError(f"{out / FIXTURE_RECORD} is not a DFlash fixture record this version reads"
                             f" ({err}): --overwrite rebuilds the fixture") from None
        info.target = member(out, info.target) or str(out / "target")
        info.draft = member(out, info.draft) or str(out / "draft")
        return info

    def differs(self, **asked: Any) -> dict[str, tuple[Any, Any]]:
        """The build arguments among ``asked`` this fixture was built with otherwise: name -> (built, asked)."""
        return {k: (getattr(self, k), v) for k, v in asked.items() if getattr(self, k) != v}


class FixtureMismatch(UsageError):
    """A DFlash fixture already at ``out`` was built with other arguments than the ones asked.

    differs: argument name (``block_size``, ``dtype``...) -> (what it was built with, what was asked).
    """

    def __init__(self, out: Path, differs: dict[str, tuple[Any, Any]]):
        self.out, self.differs = out, differs
        said = ", ".join(f"{k} {built!r} (asked {want!r})" for k, (built, want) in differs.items())
        super().__init__(f"{out} holds a DFlash fixture built with {said}: build into another directory,"
                         " or pass overwrite=True to rebuild it")


def target_config(shape: str, dtype: str, tied: bool) -> dict[str, Any]:
    """The target's config.json (mlx-lm ``qwen3_5`` or ``qwen3``) for ``shape``."""
    from specparity.fixtures import VOCAB_SIZE

    if shape not in SHAPES:
        raise UsageError(f"unknown DFlash target shape {shape!r}: choose from {', '.join(SHAPES)}")
    if dtype not in DTYPES:
        raise UsageError(f"DFlash fixtures are built in {' or '.join(DTYPES)}, not {dtype!r}")
    cfg = dict(_COMMON)
    cfg.update(SHAPES[shape][0])
    cfg.update(vocab_size=VOCAB_SIZE, tie_word_embeddings=bool(tied), torch_dtype=dtype)
    return cfg


def _embed(model: Any) -> Any:
    # qwen3_5's outer Model gained a ``model`` property only in mlx-lm 0.32
    return getattr(model, "language_model", model).model.embed_tokens


def _head(model: Any, tied: bool) -> Any:
    if tied:
        return _embed(model).as_linear
    owner = getattr(model, "language_model", model)
    return owner.lm_head


def layer_features(model: Any, tokens: list[int], layer_ids: list[int]) -> Any:
    """The outputs of ``layer_ids`` over ``tokens`` (one uncached forward), concatenated: (1, n, k * hidden)."""
    import mlx.core as mx

    got: dict[int, Any] = {}
    swapped = []
    for i in layer_ids:
        layer = model.layers[i]
        cls = type(layer)

        def make(orig: Any, i: int = i) -> Any:
            def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
                out = orig(self, *args, **kwargs)
                got[i] = out
                return out
            return __call__

        layer.__class__ = type(cls.__name__, (cls,), {"__call__": make(cls.__call__)})
        swapped.append((layer, cls))
    try:
        model(mx.array(tokens, dtype=mx.uint32)[None])
    finally:
        for layer, cls in swapped:
            layer.__class__ = cls
    return mx.concatenate([got[i] for i in layer_ids], axis=-1)


class _Fit:
    """The fit prompts' classic trajectories, their target features, and the drafter's block forward."""

    def __init__(self, target: Any, tied: bool, prompts: list[list[int]], n: int, mask_id: int,
                 block: int):
        import mlx.core as mx

        from specparity.decode import advance_to_depth

        self.target, self.tied, self.mask_id, self.block = target, tied, mask_id, block
        self.prompts = prompts
        width = max(len(p) for p in prompts) + n
        self.trajs = []
        for p in prompts:
            _, _, emitted = advance_to_depth(target, p, width - len(p))
            self.trajs.append(list(p) + emitted)
        self.tokens = mx.array(self.trajs, dtype=mx.uint32)
        self.features = mx.concatenate(
            [layer_features(target, t, TARGET_LAYER_IDS) for t in self.trajs]).astype(mx.float32)
        self.lo = max(len(p) for p in prompts)
        self.width = width
        mx.eval(self.features)

    def block_logits(self, drafter: Any, rows: Any, p: int, dtype: Any) -> Any:
        """The drafter's logits for proposals 1..block-1 of the block anchored at ``p``, for ``rows``."""
        import mlx.core as mx

        toks = self.tokens[rows]
        blk = mx.concatenate([toks[:, p:p + 1],
                              mx.full((toks.shape[0], self.block - 1), self.mask_id, dtype=toks.dtype)], axis=1)
        emb = _embed(self.target)(blk).astype(dtype)
        h = drafter(emb, self.features[rows, :p].astype(dtype))
        return _head(self.target, self.tied)(h[:, 1:].astype(_embed(self.target).weight.dtype))

    def mix(self, drafter: Any, dtype: Any) -> AcceptMix:
        import mlx.core as mx
        import numpy as np

        mix = AcceptMix(self.block)
        for r, prompt in enumerate(self.prompts):
            accepts = []
            p = len(prompt)
            while p + self.block <= self.width:
                pred = [int(t) for t in np.array(mx.argmax(self.block_logits(drafter, mx.array([r]), p, dtype)[0],
                                                           axis=-1))]
                truth = self.trajs[r][p + 1:p + self.block]
                a = 0
                while a < len(pred) and pred[a] == truth[a]:
                    a += 1
                accepts.append(a)
                p += a + 1
            mix.add(accepts)
        return mix


def _fit_drafter(fit: _Fit, args: Any, dtype_name: str, seed: int, balance: float) -> tuple[Any, AcceptMix, int]:
    """Distil the drafter on the fit trajectories until its accept mix is ``balance``d (or the step cap)."""
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim

    from specparity.fixture_models.dflash_draft import DFlashDrafter

    mx.random.seed(seed + 7)
    drafter = DFlashDrafter(args)
    mx.eval(drafter.parameters())
    rng = random.Random(seed)
    weights = mx.array([0.8 ** i for i in range(fit.block - 1)])
    rows = mx.arange(len(fit.trajs))

    def loss_fn(model: Any, p: int) -> Any:
        logits = fit.block_logits(model, rows, p, mx.float32).astype(mx.float32)
        labels = fit.tokens[:, p + 1:p + fit.block]
        return (nn.losses.cross_entropy(logits, labels) * weights).mean()

    opt = optim.Adam(learning_rate=3e-3)
    step_fn = nn.value_and_grad(drafter, loss_fn)
    dtype = getattr(mx, dtype_name)
    steps = 0
    best: tuple[float, int, dict[str, Any], AcceptMix] | None = None
    for checkpoint in CHECKPOINTS:
        while steps < checkpoint:
            _, grads = step_fn(drafter, rng.randrange(fit.lo, fit.width - fit.block))
            opt.update(drafter, grads)
            mx.eval(drafter.parameters(), opt.state)
            steps += 1
        weights_now = _cast(drafter, dtype)
        trial = DFlashDrafter(args)
        trial.load_weights(list(weights_now.items()))
        mix = fit.mix(trial, dtype)
        log.info("dflash drafter after %d steps: %s", steps, mix.describe())
        if best is None or mix.balance() > best[0]:
            best = (mix.balance(), steps, weights_now, mix)
        if mix.balanced(balance):
            break
    assert best is not None
    _, steps, chosen, mix = best
    drafter.load_weights(list(chosen.items()))
    return drafter, mix, steps


def _cast(module: Any, dtype: Any) -> dict[str, Any]:
    from specparity.decode import tree_items

    return {k: v.astype(dtype) for k, v in tree_items(module.parameters())}


def build_dflash_pair(
    out: str | os.PathLike,
    shape: str = "qwen3_5",
    block_size: int = 16,
    dtype: str = "float32",
    tied: bool = False,
    seed: int = 0,
    overwrite: bool = False,
    balance: float = BALANCE,
) -> DFlashFixtureInfo:
    """Build ``out/target`` (mlx-lm) and ``out/draft`` (a DFlash drafter dflash-mlx loads), atomically.

    The drafter is fitted until each kind of block (full, partial, zero-accept)
    is at least ``balance`` of the rounds on the fit prompts; ``balance=0``
    stops at the first checkpoint where all three occur (a few seconds: the
    tests' pairs). An existing fixture at ``out`` built with these arguments is
    returned as it is unless ``overwrite``; one built with others is refused
    (:class:`FixtureMismatch`, naming each argument that differs), never returned
    in their place. ``accept_mix["spread"]`` is false for a fit that stopped
    at the step cap before all three kinds of block occurred.
    """
    from specparity.fixtures import check_out_dir

    out = Path(out)
    check_out_dir(out, overwrite)
    if os.path.lexists(out) and not overwrite:
        found = DFlashFixtureInfo.load(out)
        differs = found.differs(shape=shape, block_size=block_size, dtype=dtype, tied=bool(tied),
                                seed=seed, balance=balance)
        if differs:
            raise FixtureMismatch(out, differs)
        return found
    if block_size not in BLOCK_SIZES:
        raise UsageError(f"block size {block_size}: DFlash fixtures use {' or '.join(map(str, BLOCK_SIZES))}")
    import mlx.core as mx

    from specparity.fixture_models.dflash_draft import DraftArgs
    from specparity.fixtures import (FIXTURE_RECORD, VOCAB_SIZE, build_tokenizer, instantiate, model_params,
                                     publishing)
    from specparity.prompts import DEFAULT_PROMPTS

    config = target_config(shape, dtype, tied)
    out.parent.mkdir(parents=True, exist_ok=True)
    with publishing(out, overwrite) as tmp:
        build_tokenizer(tmp, extra_special=(MASK_TOKEN,))
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tmp / "tokenizer.json"))
        mask_id = tok.token_to_id(MASK_TOKEN)
        assert mask_id is not None, "the tokenizer lost its mask token"
        prompts = [tok.encode(t).ids for t in DEFAULT_PROMPTS]
        rng = random.Random(seed)
        prompts += [[rng.randrange(2, VOCAB_SIZE) for _ in range(12)] for _ in range(EXTRA_FIT_PROMPTS)]

        mx.random.seed(seed)
        target = instantiate(config)
        args = DraftArgs(hidden_size=config["hidden_size"], vocab_size=VOCAB_SIZE,
                         num_target_layers=config["num_hidden_layers"], block_size=block_size,
                         target_layer_ids=list(TARGET_LAYER_IDS), mask_token_id=mask_id,
                         rms_norm_eps=config["rms_norm_eps"], **_DRAFT)
        fit = _Fit(target, tied, prompts, FIT_TOKENS, mask_id, block_size)
        drafter, mix, steps = _fit_drafter(fit, args, dtype, seed, balance)

        (tmp / "target").mkdir()
        target_params = model_params(target)
        mx.save_safetensors(str(tmp / "target" / "model.safetensors"), target_params, metadata={"format": "mlx"})
        (tmp / "target" / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        (tmp / "draft").mkdir()
        mx.save_safetensors(str(tmp / "draft" / "model.safetensors"), _cast(drafter, getattr(mx, dtype)),
                            metadata={"format": "mlx"})
        (tmp / "draft" / "config.json").write_text(json.dumps(args.config(dtype), indent=2, sort_keys=True))
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            shutil.copy(tmp / name, tmp / "target" / name)
            shutil.move(str(tmp / name), tmp / "draft" / name)
        info = DFlashFixtureInfo(
            target=str(out / "target"), draft=str(out / "draft"), shape=shape, shape_note=SHAPES[shape][1],
            dtype=dtype, tied=bool(tied), block_size=block_size, seed=seed,
            target_layer_ids=list(TARGET_LAYER_IDS), mask_token_id=mask_id, accept_mix=mix.to_dict(),
            fit_prompts=prompts, train_steps=steps, balance=balance,
        )
        (tmp / FIXTURE_RECORD).write_text(json.dumps(info.record(), indent=2))
    log.info("built DFlash %s %s block %d fixture in %s: %s", shape, dtype, block_size, out, mix.describe())
    return info


# a build argument of a DFlash fixture as `fixtures make --dflash`'s flag says it: (built with, asked) -> words
_FLAGS: dict[str, Callable[[Any, Any], str]] = {
    "shape": lambda b, a: f"--dflash {b} (asked {a})",
    "block_size": lambda b, a: f"--block-size {b} (asked {a})",
    "dtype": lambda b, a: f"--dtype {b} (asked {a})",
    "tied": lambda b, a: f"{'--tied-head' if b else 'no --tied-head'} (asked {'with' if a else 'without'})",
    "seed": lambda b, a: f"--seed {b} (asked {a})",
    "balance": lambda b, a: f"its drafter fitted to balance {b:g} (this command fits to {a:g})",
}


def make_dflash_fixture(out_dir: str, shape: str, block_size: int, dtype: str, tied: bool, seed: int,
                        overwrite: bool, note: Callable[[str], None]) -> DFlashFixtureInfo:
    """``specparity fixtures make --dflash``: :func:`build_dflash_pair` with the command's words.

    ``note`` gets the progress line before a build and the warning for a fit whose blocks never spread; a
    fixture already at ``out_dir`` built otherwise is a usage error naming the flags that differ.
    """
    if not os.path.lexists(out_dir) or overwrite:
        note(f"building a DFlash {shape} pair (block {block_size}, {dtype}); fitting the drafter takes"
             " a minute on a CPU")
    try:
        info = build_dflash_pair(out_dir, shape=shape, block_size=block_size, dtype=dtype, tied=tied, seed=seed,
                                 overwrite=overwrite)
    except FixtureMismatch as err:
        said = ", ".join(_FLAGS[k](built, want) for k, (built, want) in err.differs.items())
        raise UsageError(f"OUT_DIR {out_dir} holds a DFlash fixture built with {said}: --overwrite rebuilds it,"
                         " or choose another OUT_DIR") from None
    if not info.accept_mix.get("spread"):
        note(f"warning: the drafter's blocks never spread on its fit prompts ({info.accept_mix['summary']}):"
             " a check on this pair may never see a partly accepted block")
    return info


def dflash_format(out: str, *, shape: str, dtype: str, tied: bool, block_size: int, seed: int, overwrite: bool,
                  note: Callable[[str], None]) -> Any:
    """``fixtures make --dflash SHAPE`` (``--drafter-format dflash``): a DFlash pair dflash-mlx loads."""
    from specparity.fixtures import MadeFixture, pair_lines

    info = make_dflash_fixture(out, shape, block_size, dtype, tied, seed, overwrite, note)
    record = info.to_dict()
    draft = f"DFlash drafter: reads target layers {info.target_layer_ids}, mask token id {info.mask_token_id}"
    return MadeFixture(record, pair_lines(record, draft))  # its own warning went to note already


def fixture_draft(target: Path) -> Path | None:
    """The DFlash drafter of the fixture whose target is ``target`` (``<fixture>/target``), or None when
    ``target`` is not a DFlash fixture's (see :func:`specparity.fixtures.fixture_draft`)."""
    from specparity.fixtures import fixture_draft as drafter_of

    return drafter_of(target, "dflash")


def dflash_fixture_name(shape: str, block_size: int, dtype: str, tied: bool, balance: float = BALANCE) -> str:
    """A pair's directory name, from every argument it was built with (the default balance left unsaid)."""
    name = f"dflash-{shape}-b{block_size}-{dtype}-{'tied' if tied else 'untied'}"
    return name if balance == BALANCE else f"{name}-balance{balance:g}"


# the default pair of `--engine dflash-mlx` without --model: the gated-delta hybrid in a shape the engine
# runs (the published head ratios do not), with a head mlx-lm 0.31 and 0.32 both give it, its drafter
# fitted until each kind of block is 5% of the rounds (150 steps here; a tenth is never reached, and
# fitting for it runs all 800 steps to keep the same 150-step drafter)
DEFAULT_PAIR: dict[str, Any] = {"shape": "qwen3_5-equal-heads", "block_size": 8, "dtype": "float32", "tied": True,
                                "balance": 0.05}
DEFAULT_PAIR_NOTE = "qwen3_5-equal-heads, block 8, float32, tied head"


def dflash_pair(shape: str = DEFAULT_PAIR["shape"], block_size: int = DEFAULT_PAIR["block_size"],
                dtype: str = DEFAULT_PAIR["dtype"], tied: bool = DEFAULT_PAIR["tied"],
                balance: float = DEFAULT_PAIR["balance"]) -> DFlashFixtureInfo:
    """A DFlash fixture in the shared cache ($SPECPARITY_HOME/fixtures), built on first use (default:
    :data:`DEFAULT_PAIR`), in a directory named by every argument."""
    from specparity.fixtures import fixtures_home

    return build_dflash_pair(fixtures_home() / dflash_fixture_name(shape, block_size, dtype, tied, balance),
                             shape=shape, block_size=block_size, dtype=dtype, tied=tied, balance=balance)
