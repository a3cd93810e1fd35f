"""The embedded checkpoints: real mlx-lm models built deterministically from a seed.

No model hub is reachable in CI, so the project builds its own tiny target and
drafter pairs, in every architecture family the probes must handle, loadable
offline by ``mlx_lm.load``. Fault fixtures add a ``model_file`` (mlx-lm's
trust_remote_code path) that injects a known defect; see
``fixture_models/specparity_fixture.py``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specparity.errors import UsageError

log = logging.getLogger(__name__)

ARCHS = ("llama", "qwen3_5", "gemma3_text", "qwen3_moe")
DTYPES = ("float32", "bfloat16", "float16")
VOCAB_SIZE = 512
EOS_TOKEN = "<|endoftext|>"
FIXTURE_MODULE = "specparity_fixture.py"
# constant-logits fixtures: the live logits start at this token id; every other id
# gets CONSTANT_OFF, whose float32 exp underflows to exactly 0 at any T <= 1
CONSTANT_FIRST_TOKEN = 10
CONSTANT_OFF = -1.0e4

_COMMON: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "rms_norm_eps": 1e-5,
    "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "rope_theta": 10000.0,
}

ARCH_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {"model_type": "llama", "num_hidden_layers": 6},
    "qwen3_5": {
        "model_type": "qwen3_5",
        "num_hidden_layers": 4,
        "full_attention_interval": 2,
        "linear_num_value_heads": 4,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 32,
        "linear_value_head_dim": 32,
        "linear_conv_kernel_dim": 4,
        "rope_parameters": {
            "type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
        },
    },
    "gemma3_text": {
        "model_type": "gemma3_text",
        "num_hidden_layers": 6,
        "sliding_window": 32,
        "sliding_window_pattern": 3,
        "query_pre_attn_scalar": 32,
        "rope_local_base_freq": 10000.0,
    },
    "qwen3_moe": {
        "model_type": "qwen3_moe",
        "num_hidden_layers": 4,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "moe_intermediate_size": 32,
        "norm_topk_prob": True,
    },
}

# random-weight checkpoints in the dimensions of real small models (their published configs), for
# measuring cost against model size: the vocabulary is the real one (its embedding and head are most of a
# small model's bytes); rows past the fixture tokenizer's VOCAB_SIZE are zero, so greedy decode stays in it
SIZES: dict[str, dict[str, Any]] = {
    # Qwen2.5-0.5B's dimensions in llama's architecture
    "llama-0.5b": {"model_type": "llama", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                   "num_attention_heads": 14, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 151936,
                   "tie_word_embeddings": True, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6},
    # Qwen2.5-1.5B's dimensions in llama's architecture
    "llama-1.5b": {"model_type": "llama", "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
                   "num_attention_heads": 12, "num_key_value_heads": 2, "head_dim": 128, "vocab_size": 151936,
                   "tie_word_embeddings": True, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6},
    # Qwen3-0.6B
    "qwen3-0.6b": {"model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
                   "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
                   "tie_word_embeddings": True, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6},
    # Qwen3-1.7B
    "qwen3-1.7b": {"model_type": "qwen3", "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
                   "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
                   "tie_word_embeddings": True, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6},
    # a few narrow layers under a real vocabulary, untied: the weights (embedding and head) are most of a
    # process's memory, yet decode stays cheap on a CPU (the served memory test's checkpoint, in float32)
    "llama-wide-vocab": {"model_type": "llama", "hidden_size": 384, "intermediate_size": 1024, "num_hidden_layers": 2,
                         "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 151936,
                         "tie_word_embeddings": False},
}
# a sized fixture's drafter: the target's shape with this many layers (random: it measures cost, not acceptance)
SIZED_DRAFT_LAYERS = 2


_CORPUS = """\
Speculative decoding drafts several tokens with a small model and verifies them
with the large one in a single forward pass. When the verify block is computed
by a different kernel than single token decode, the logits can differ in their
last bits, and a greedy argmax can flip. The quick brown fox jumps over the lazy
dog. Pack my box with five dozen liquor jugs. How vexingly quick daft zebras
jump! Sphinx of black quartz, judge my vow. 0123456789 + - * / = ( ) [ ] { } .
def add(a, b):\n    return a + b\nfor i in range(10):\n    print(i * i)\n
The cache holds keys and values for every position; a rewind trims the rejected
rows. A recurrent state cannot be trimmed and must be snapshotted instead.
"""


@dataclass
class FixtureInfo:
    """What ``build_pair`` made.

    target / draft: checkpoint directories loadable by ``mlx_lm.load``.
    arch, dtype, bits, seed: how they were built (bits None = not quantized).
    agreement: fraction of positions where the drafter's greedy token equals
      the target's along the target's greedy trajectory (teacher forced).
    noise: relative weight noise that separates the drafter from the target.
    faults: injected behaviours (see specparity_fixture.py); empty for clean.
    """

    target: str
    draft: str | None
    arch: str
    dtype: str
    bits: int | None
    seed: int
    agreement: float | None
    noise: float | None
    faults: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def record(self) -> dict[str, Any]:
        """What ``fixture.json`` stores: :meth:`to_dict` with the members relative to the fixture, so it
        reads the same from any cwd and after a move."""
        return {**self.to_dict(), "target": "target", "draft": "draft" if self.draft else None}

    @classmethod
    def load(cls, out: Path) -> FixtureInfo:
        """The fixture in ``out`` as its record describes it (members as paths usable from here)."""
        data = read_record(out.resolve())
        if data is None or data.get("kind", "plain") != "plain":
            what = f"a {data.get('kind')} fixture, not a plain pair" if data else "no fixture record it can read"
            raise UsageError(f"{out} holds {what}: --overwrite rebuilds it, or choose another DIR")
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        try:
            info = cls(**fields)
        except TypeError as err:
            raise UsageError(f"{out / FIXTURE_RECORD} is not a fixture record this version reads ({err}):"
                             " --overwrite rebuilds the fixture") from None
        info.target = member(out, info.target) or str(out / "target")
        info.draft = member(out, info.draft)
        return info


def fixtures_home() -> Path:
    """Where built fixtures live: $SPECPARITY_HOME/fixtures, else the user cache dir."""
    from specparity.paths import home

    return home() / "fixtures"


def build_tokenizer(out_dir: Path, extra_special: tuple[str, ...] = ()) -> None:
    """A byte-level BPE tokenizer trained on a fixed corpus (deterministic).

    ``extra_special``: special tokens after the EOS (ids 1, 2, ...), e.g. a DFlash
    drafter's mask token; they are never produced by encoding text.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[EOS_TOKEN, *extra_special],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": EOS_TOKEN,
                "model_max_length": 4096,
                "clean_up_tokenization_spaces": False,
            },
            indent=2,
        )
    )
    (out_dir / "special_tokens_map.json").write_text(json.dumps({"eos_token": EOS_TOKEN}))


def _config_for(arch: str, dtype: str) -> dict[str, Any]:
    if arch not in ARCH_CONFIGS:
        raise UsageError(f"unknown architecture {arch!r}: choose from {', '.join(ARCHS)}")
    if dtype not in DTYPES:
        raise UsageError(f"unknown dtype {dtype!r}: choose from {', '.join(DTYPES)}")
    cfg = dict(_COMMON)
    cfg.update(ARCH_CONFIGS[arch])
    cfg["torch_dtype"] = dtype
    return cfg


def instantiate(config: dict[str, Any]) -> Any:
    """An mlx-lm model of ``config`` with random weights in its ``torch_dtype``, evaluated."""
    import mlx.core as mx

    from specparity.mlx_compat import model_classes

    model_class, args_class = model_classes(config)
    model = model_class(args_class.from_dict(dict(config)))
    dtype = getattr(mx, config["torch_dtype"])
    model.set_dtype(dtype)
    mx.eval(model.parameters())
    return model


def model_params(model: Any) -> dict[str, Any]:
    """A model's parameters by name."""
    from mlx.utils import tree_flatten

    return dict(tree_flatten(model.parameters()))


def _trajectory(target, prompt_ids: list[int], n: int) -> tuple[Any, Any]:
    """The target's greedy continuation of ``prompt_ids`` (``n`` tokens): the whole sequence, and the
    target's argmax at each continued position, teacher-forced in one forward."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(target)
    logits = target(mx.array(prompt_ids)[None], cache=cache)
    tokens = []
    y = mx.argmax(logits[0, -1]).item()
    for _ in range(n):
        tokens.append(y)
        logits = target(mx.array([[y]]), cache=cache)
        y = mx.argmax(logits[0, -1]).item()
    seq = mx.array(prompt_ids + tokens)[None]
    return seq, mx.argmax(target(seq), axis=-1)[0, len(prompt_ids) - 1 : -1]


def _agreement(draft, seq, t_arg, prompt_len: int) -> float:
    """Teacher-forced agreement of the drafter's greedy tokens with the target's along its trajectory
    (:func:`_trajectory`)."""
    import mlx.core as mx

    d_arg = mx.argmax(draft(seq), axis=-1)[0, prompt_len - 1 : -1]
    return float(mx.mean((t_arg == d_arg).astype(mx.float32)).item())  # type: ignore[arg-type]  # int | float | complex


def _perturbed(params: dict[str, Any], scale: float, seed: int) -> dict[str, Any]:
    import mlx.core as mx

    key = mx.random.key(seed)
    out = {}
    for name, w in sorted(params.items()):
        if not mx.issubdtype(w.dtype, mx.floating) or w.ndim < 2:
            out[name] = w
            continue
        key, k = mx.random.split(key)
        std = mx.sqrt(mx.mean(w.astype(mx.float32) ** 2))
        noise = mx.random.normal(w.shape, key=k) * std * scale
        out[name] = (w.astype(mx.float32) + noise).astype(w.dtype)
    return out


def _save(out_dir: Path, config: dict[str, Any], params: dict[str, Any], model=None,
          bits: int | None = None) -> None:
    import mlx.core as mx

    out_dir.mkdir(parents=True, exist_ok=True)
    if bits is not None and model is not None:
        import contextlib
        import sys

        from mlx_lm.utils import quantize_model

        model.load_weights(list(params.items()))
        with contextlib.redirect_stdout(sys.stderr):  # mlx-lm prints its bits-per-weight
            model, config = quantize_model(model, config, group_size=32, bits=bits)
        params = model_params(model)
    mx.save_safetensors(str(out_dir / "model.safetensors"), params, metadata={"format": "mlx"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    build_tokenizer(out_dir)


FIXTURE_RECORD = "fixture.json"


def read_record(out: Path) -> dict[str, Any] | None:
    """The record (``fixture.json``) of the fixture in ``out``: None when ``out`` is not a real directory
    holding one the builder wrote (a link, a file, a directory of the user's, a record that is not a JSON
    object naming its target)."""
    rec = out / FIXTURE_RECORD
    if out.is_symlink() or not out.is_dir() or rec.is_symlink() or not rec.is_file():
        return None
    try:
        data = json.loads(rec.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("target"), str) else None


def member(out: Path, stored: str | None) -> str | None:
    """A checkpoint path a fixture record stores, as a path usable from here.

    Records store each member relative to the fixture (``"target"``); an older one stored
    the path the build was given (relative to the cwd it ran in, or absolute). The fixture's
    own member of that name wins, so a moved fixture still finds its members.
    """
    if stored is None:
        return None
    p = Path(stored)
    for candidate in ([] if p.is_absolute() else [out / p]) + [out / p.name]:
        if candidate.exists():
            return str(candidate)
    return str(p) if p.is_absolute() else str(out / p)


@dataclass
class MadeFixture:
    """What a drafter format's builder made (:class:`specparity.engines.DrafterFormat`): the fixture's
    record (``--json`` prints it), the lines that say it, and a warning for a fit whose blocks never
    all occurred (None: they did, or the format has no drafter to fit)."""

    record: dict[str, Any]
    lines: list[str]
    warning: str | None = None


def accept_mix_warning(record: dict[str, Any]) -> str | None:
    """The warning for a fixture whose measured accept mix lacks a kind of block (None: all occur)."""
    mix = record.get("accept_mix")
    if not isinstance(mix, dict) or mix.get("spread"):
        return None
    return (f"warning: not every kind of block occurs ({mix.get('summary')}): a check on this pair may never"
            " see a partly accepted block")


def pair_lines(record: dict[str, Any], draft_note: str) -> list[str]:
    """A drafter fixture said in two or three lines: its target, its drafter, its accept mix."""
    lines = [f"target: {record['target']} ({record['shape_note']}; {'tied' if record['tied'] else 'untied'} head)",
             f"draft:  {record['draft']} ({draft_note})"]
    if isinstance(record.get("accept_mix"), dict):
        lines.append(f"accept mix on the fit prompts: {record['accept_mix']['summary']}")
    return lines


def fixture_draft(target: Path, kind: str | None = None) -> Path | None:
    """The drafter of the fixture whose target is ``target`` (``<fixture>/target``), found from the fixture's
    own record wherever it was built or moved; None when ``target`` is not the target of a fixture of this
    ``kind`` (the record's ``kind``: ``"dflash"``; None: a plain pair's record, which has none) or it has
    no drafter. What ``--model FIXTURE/target`` without ``--draft-model`` takes as its drafter."""
    data = read_record(target.parent)
    if data is None or data.get("kind") != kind or not isinstance(data.get("draft"), str):
        return None
    own = member(target.parent, data["target"])
    if own is None or not Path(own).exists() or not Path(own).samefile(target):
        return None  # a directory beside the fixture's target (its drafter, say) is not its target
    draft = member(target.parent, data["draft"])
    return Path(draft) if draft else None


def check_out_dir(out: Path, overwrite: bool, what: str = "OUT_DIR") -> None:
    """Refuse, before any work, an output directory a build would harm: anything but a fixture's own
    directory is never replaced (``overwrite`` replaces a fixture only), and a link is never built through."""
    if out.is_symlink():
        if not overwrite and read_record(out.resolve()) is not None:
            return  # an existing fixture behind a link is kept as it is, never written
        raise UsageError(f"{what} {out} is a symbolic link: give a directory of its own (a build replaces"
                         " OUT_DIR as a whole, never a link's target)")
    if not out.exists():
        return
    if read_record(out) is None:
        why = "--overwrite replaces only a fixture's directory" if overwrite else "choose another DIR"
        raise UsageError(f"{what} {out} exists and is not a specparity fixture (no {FIXTURE_RECORD} of its"
                         f" builder): {why}; it is left as it is")


@contextmanager
def publishing(out: Path, overwrite: bool = False) -> Iterator[Path]:
    """A temporary folder beside ``out`` to build into; it takes ``out``'s place when the block ends and is
    removed when the block raises, so no reader ever sees a fixture half built (Ctrl-C included).

    An ``out`` that is there at the end is replaced only when it is a fixture (the caller's
    :func:`check_out_dir` decided before the build whether one may be): the old fixture is moved aside,
    the new one renamed in, and only then the old one removed (put back when the rename fails). Without
    ``overwrite``, a fixture with this one's very record (a concurrent build of it) is kept as it is.
    """
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        yield tmp
        _swap_in(tmp, out, overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _swap_in(tmp: Path, out: Path, overwrite: bool) -> None:
    if not os.path.lexists(out):
        try:
            os.rename(tmp, out)
            return
        except OSError:
            if not os.path.lexists(out):
                raise
    if read_record(out) is None:
        raise UsageError(f"{out} appeared during the build and is not a specparity fixture: it is left as"
                         " it is; choose another DIR")
    if not overwrite and read_record(out) == read_record(tmp):
        shutil.rmtree(tmp)  # a concurrent build of this same fixture published first: keep it, no gap for readers
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
    os.rename(out, aside / out.name)
    try:
        os.rename(tmp, out)
    except BaseException:
        os.rename(aside / out.name, out)
        aside.rmdir()
        raise
    shutil.rmtree(aside, ignore_errors=True)


def build_pair(
    out: str | os.PathLike,
    arch: str = "llama",
    dtype: str = "float32",
    bits: int | None = None,
    seed: int = 0,
    faults: list[dict] | None = None,
    constant_logits: list[float] | None = None,
    with_draft: bool = True,
    overwrite: bool = False,
) -> FixtureInfo:
    """Build ``out/target`` (and ``out/draft``) deterministically from ``seed``.

    A non-empty ``faults`` (or ``constant_logits``) writes the target with
    ``model_file`` = specparity_fixture.py: loading it needs trust_remote_code.
    The build is atomic: it happens in a sibling temp dir that is renamed into
    place, so a crash leaves no half-built fixture and an existing one is kept
    unless ``overwrite``.
    """
    out = Path(out)
    check_out_dir(out, overwrite)
    if os.path.lexists(out) and not overwrite:
        return FixtureInfo.load(out)
    # only where it builds: a served job's harness reads the built pair without importing mlx
    import mlx.core as mx
    config = _config_for(arch, dtype)
    mx.random.seed(seed)
    target = instantiate(config)
    params = model_params(target)
    out.parent.mkdir(parents=True, exist_ok=True)
    with publishing(out, overwrite) as tmp:
        target_config = dict(config)
        injected = bool(faults) or constant_logits is not None
        if injected:
            target_config["model_file"] = FIXTURE_MODULE
            target_config["specparity"] = {
                "base": target_config["model_type"],
                "faults": list(faults or []),
            }
            if constant_logits is not None:
                target_config["specparity"]["constant_logits"] = list(constant_logits)
        _save(tmp / "target", target_config, params, target if bits else None, bits)
        if injected:
            shutil.copy(Path(__file__).parent / "fixture_models" / FIXTURE_MODULE, tmp / "target")
        agreement = noise = None
        if with_draft:
            draft = instantiate(config)
            prompt = list(range(7, 7 + 12))
            try:
                noise, agreement = _tune_draft(target, draft, params, prompt, seed)
            except RuntimeError as err:  # e.g. CPU GatherMM is float32-only (MoE in bf16)
                log.warning("cannot run the %s %s pair here to measure agreement: %s",
                            arch, dtype, err)
                noise, agreement = 0.05, None
                draft.load_weights(list(_perturbed(params, noise, seed + 1).items()))
            draft_params = model_params(draft)
            _save(tmp / "draft", config, draft_params, draft if bits else None, bits)
        info = FixtureInfo(
            target=str(out / "target"),
            draft=str(out / "draft") if with_draft else None,
            arch=arch,
            dtype=dtype,
            bits=bits,
            seed=seed,
            agreement=agreement,
            noise=noise,
            faults=list(faults or []),
        )
        (tmp / FIXTURE_RECORD).write_text(json.dumps(info.record(), indent=2))
    log.info("built %s %s fixture in %s (agreement %s)", arch, dtype, out, agreement)
    return info


def _tune_draft(target, draft, params, prompt, seed) -> tuple[float, float]:
    """Pick the smallest weight noise whose agreement falls in [0.3, 0.8] (the target's trajectory is
    decoded once: only the drafter changes from one noise to the next)."""
    best: tuple[float, float] | None = None
    seq, t_arg = _trajectory(target, prompt, 48)
    for scale in (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1.2):
        draft.load_weights(list(_perturbed(params, scale, seed + 1).items()))
        agreement = _agreement(draft, seq, t_arg, len(prompt))
        if best is None or abs(agreement - 0.55) < abs(best[1] - 0.55):
            best = (scale, agreement)
        if 0.3 <= agreement <= 0.8:
            return scale, agreement
    assert best is not None
    draft.load_weights(list(_perturbed(params, best[0], seed + 1).items()))
    return best


def default_pair() -> FixtureInfo:
    """The embedded default (6-layer llama, float32), built on first use."""
    return build_pair(fixtures_home() / "default-llama-float32")


def constant_logits(live: tuple[float, ...], vocab: int = VOCAB_SIZE,
                    first: int = CONSTANT_FIRST_TOKEN, off: float = CONSTANT_OFF) -> list[float]:
    """A full logits row: ``live`` at ids ``first..``, ``off`` everywhere else."""
    out = [off] * vocab
    out[first:first + len(live)] = list(live)
    return out


def build_constant_pair(root: Path, target_live: tuple[float, ...],
                        draft_live: tuple[float, ...]) -> tuple[str, str]:
    """Two constant-logits llama fixtures (target, drafter) under ``root``: logits that ignore the input."""
    tag = hashlib.sha256(repr((tuple(target_live), tuple(draft_live))).encode()).hexdigest()[:10]
    t = build_pair(root / f"const-target-{tag}", seed=0, with_draft=False,
                   constant_logits=constant_logits(target_live))
    d = build_pair(root / f"const-draft-{tag}", seed=1, with_draft=False,
                   constant_logits=constant_logits(draft_live))
    return t.target, d.target


def pair_gguf(info: FixtureInfo, outtype: str = "f32") -> tuple[str, str | None]:
    """GGUF files of a built llama pair (target, drafter) for llama.cpp, exported once.

    They live next to the pair (``<pair>/gguf-v<N>/target-<outtype>.gguf``); an
    existing file is reused, a missing one is written atomically.
    """
    from specparity.gguf_export import EXPORT_VERSION, export_gguf

    root = Path(info.target).parent / f"gguf-v{EXPORT_VERSION}"
    paths: list[str | None] = []
    for role, src in (("target", info.target), ("draft", info.draft)):
        if src is None:
            paths.append(None)
            continue
        out = root / f"{role}-{outtype}.gguf"
        if not out.exists():
            export_gguf(src, out, outtype=outtype, force=True)  # one per fixture: a concurrent export is the same
        paths.append(str(out))
    assert paths[0] is not None
    return paths[0], paths[1]


def default_pair_gguf(outtype: str = "f32") -> tuple[str, str | None]:
    """The embedded default pair as GGUF (target, drafter): see :func:`pair_gguf`."""
    return pair_gguf(default_pair(), outtype)


def build_plain_constant(root: Path, live: tuple[float, ...]) -> str:
    """A plain llama checkpoint (no ``model_file``) whose logits ignore the input, about ``live``.

    mlx-lm's server loads a drafter without trust_remote_code, so a drafter for a
    constant-logits target cannot be a ``build_constant_pair`` fixture. Here every
    embedding row is the same vector of ones, every attention and MLP output
    projection is zero (the residual stream stays that vector), and the head reads
    ``constant_logits(live)`` off its first column: logits = that row times the
    final RMSNorm's 1/sqrt(1 + eps), for every input. Only the drafter's proposals
    depend on it, never the law a lossless server emits.
    """
    import mlx.core as mx

    tag = hashlib.sha256(repr(("plain", tuple(live))).encode()).hexdigest()[:10]
    out = root / f"plain-const-{tag}"
    if read_record(out) is not None:
        return str(out / "target")
    config = _config_for("llama", "float32")
    model = instantiate(config)
    # what the logits are (up to the RMSNorm factor): readers such as harness.distribution look here
    config["specparity"] = {"constant_logits": constant_logits(live), "plain": True}
    params = model_params(model)
    row = mx.array(constant_logits(live), dtype=mx.float32)
    for name, w in params.items():
        if name == "model.embed_tokens.weight":
            params[name] = mx.ones(w.shape, dtype=w.dtype)
        elif name == "lm_head.weight":
            params[name] = mx.zeros(w.shape, dtype=w.dtype).at[:, 0].add(row)
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            params[name] = mx.zeros(w.shape, dtype=w.dtype)
    root.mkdir(parents=True, exist_ok=True)
    with publishing(out) as tmp:
        _save(tmp / "target", config, params)
        info = FixtureInfo(target=str(out / "target"), draft=None, arch="llama", dtype="float32", bits=None,
                           seed=0, agreement=None, noise=None)
        (tmp / FIXTURE_RECORD).write_text(json.dumps(info.record(), indent=2))
    return info.target


def _zero_rows_past(params: dict[str, Any], vocab: int) -> dict[str, Any]:
    """The embedding's and the head's rows past ``vocab`` set to zero: logits there are 0, below the
    largest live logit, so greedy decode emits only ids the fixture tokenizer has."""
    import mlx.core as mx

    out = dict(params)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        w = out.get(name)
        if w is not None and w.shape[0] > vocab:
            out[name] = mx.concatenate([w[:vocab], mx.zeros((w.shape[0] - vocab, *w.shape[1:]), dtype=w.dtype)])
    return out


def build_sized(out: str | os.PathLike, size: str, dtype: str = "bfloat16", bits: int | None = 4, seed: int = 0,
                with_draft: bool = True, overwrite: bool = False) -> FixtureInfo:
    """Build ``out/target`` (and a ``SIZED_DRAFT_LAYERS``-layer ``out/draft``) with random weights in the
    dimensions of ``size`` (:data:`SIZES`), quantized as ``mlx_lm.convert -q`` does (group size 64,
    ``bits``; None: not quantized), offline and deterministically from ``seed``. Atomic as build_pair."""
    if size not in SIZES:
        raise UsageError(f"unknown size {size!r}: choose from {', '.join(SIZES)}")
    if dtype not in DTYPES:
        raise UsageError(f"unknown dtype {dtype!r}: choose from {', '.join(DTYPES)}")
    out = Path(out)
    if out.exists() and not overwrite:
        marker = out / "fixture.json"
        if marker.exists():
            return FixtureInfo(**json.loads(marker.read_text()))
        raise UsageError(f"{out} exists and is not a specparity fixture: choose another DIR")
    import mlx.core as mx

    config = {**_COMMON, **SIZES[size], "torch_dtype": dtype}
    out.parent.mkdir(parents=True, exist_ok=True)
    with publishing(out) as tmp:
        for name, cfg, k in (("target", config, 0), ("draft", {**config, "num_hidden_layers": SIZED_DRAFT_LAYERS}, 1)):
            if name == "draft" and not with_draft:
                continue
            mx.random.seed(seed + k)
            model = instantiate(cfg)
            params = _zero_rows_past(model_params(model), VOCAB_SIZE)
            if bits is None:
                _save(tmp / name, cfg, params)
            else:
                import contextlib
                import sys

                from mlx_lm.utils import quantize_model

                model.load_weights(list(params.items()))
                with contextlib.redirect_stdout(sys.stderr):  # mlx-lm prints its bits-per-weight
                    model, qcfg = quantize_model(model, dict(cfg), group_size=64, bits=bits)
                _save(tmp / name, qcfg, model_params(model))
            del model, params
        info = FixtureInfo(target=str(out / "target"), draft=str(out / "draft") if with_draft else None,
                           arch=str(config["model_type"]), dtype=dtype, bits=bits, seed=seed, agreement=None,
                           noise=None)
        (tmp / "fixture.json").write_text(json.dumps({**info.to_dict()}, indent=2))
    log.info("built the %s fixture in %s (%s, %s bits)", size, out, dtype, bits)
    return info
