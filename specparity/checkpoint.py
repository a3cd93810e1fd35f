"""Loading checkpoints and fingerprinting them.

A fingerprint names exactly what was probed: the config and every weight
file's digest, the dtype and the quantization. Digests of large weight files
are memoized by (path, size, mtime) so a gate hit never rereads gigabytes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specparity.errors import CheckpointError, Name, UsageError, first_line
from specparity.inputs import expand_user

log = logging.getLogger(__name__)


@dataclass
class Fingerprint:
    """Identity of a checkpoint.

    path: the directory as given, resolved.
    digest: sha256 over config.json and the sorted weight-file digests.
    model_type: config's ``model_type``.
    dtype: config's ``torch_dtype`` (or ``dtype``), as declared.
    quantization: config's ``quantization`` block, or None.
    weight_files: {file name: sha256} of the weights, the tokenizer's files and any
      code the checkpoint ships.
    """

    path: str
    digest: str
    model_type: str | None
    dtype: str | None
    quantization: dict | None
    weight_files: dict[str, str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def short(self) -> str:
        return self.digest[:12]


def resolve_model_dir(path: str | os.PathLike, flag: str = "--model") -> Path:
    """The checkpoint directory, or a one-line UsageError naming ``flag`` and what is wrong."""
    if str(path).strip() == "":
        raise UsageError(f"{flag} {str(path)!r}: empty path")
    p = expand_user(path, flag)
    if not p.exists():
        raise UsageError(f"{flag} {path}: no such file or directory")
    if not p.is_dir():
        raise UsageError(f"{flag} {path}: not a directory (a checkpoint is a directory)")
    if not (p / "config.json").exists():
        raise UsageError(f"{flag} {path}: not a checkpoint (no config.json)")
    if not list(p.glob("model*.safetensors")):
        raise UsageError(f"{flag} {path}: not a checkpoint (no model*.safetensors)")
    return p.resolve()


# Files besides config.json and the weights that decide what a checkpoint computes or
# how it tokenizes: every file the tokenizer reads, and any code the checkpoint ships.
FINGERPRINT_GLOBS = ("*.py", "tokenizer*", "special_tokens_map.json", "added_tokens.json",
                     "vocab.*", "merges.txt", "*.tiktoken", "chat_template*",
                     "generation_config.json")


def remote_code(model_dir: Path, cfg: dict[str, Any]) -> str | None:
    """What code the checkpoint asks to run (model_file, auto_map), or None.

    mlx-lm runs ``model_file``; transformers runs an ``auto_map`` entry of
    tokenizer_config.json or config.json (its AutoTokenizer) when it loads the tokenizer.
    """
    if cfg.get("model_file"):
        return f"config.json names model_file {cfg['model_file']!r}"
    if cfg.get("auto_map"):
        return "config.json has an auto_map (code transformers would import)"
    tok_cfg = model_dir / "tokenizer_config.json"
    if tok_cfg.is_file():
        try:
            tc = json.loads(tok_cfg.read_bytes().decode("utf-8"))
        except (OSError, ValueError) as err:
            raise CheckpointError(f"{tok_cfg}: malformed tokenizer config"
                                  f" ({first_line(str(err))})") from err
        if isinstance(tc, dict) and tc.get("auto_map"):
            return "tokenizer_config.json has an auto_map (tokenizer code transformers would import)"
    return None


def read_config(model_dir: Path, model_type: bool = True) -> dict[str, Any]:
    """``model_dir``'s config.json. model_type: it must be a mapping with a ``model_type`` (what mlx-lm
    loads); False (consent, which asks only whether the config names code): any JSON, a non-mapping
    read as {} (a served checkpoint is the server's to load, and a fake server loads nothing)."""
    try:
        cfg = json.loads((model_dir / "config.json").read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError) as err:
        raise CheckpointError(f"{model_dir / 'config.json'}: malformed config"
                              f" ({first_line(str(err))})") from err
    if not model_type:
        return cfg if isinstance(cfg, dict) else {}
    if not isinstance(cfg, dict) or "model_type" not in cfg:
        raise CheckpointError(f"{model_dir / 'config.json'}: malformed config (no model_type)")
    return cfg


def _digest_cache_path() -> Path | None:
    """Where weight digests are cached; None (not cached: a warning) when $SPECPARITY_HOME is unusable,
    since the cache only saves time and a fingerprint needs none."""
    from specparity.paths import home

    try:
        return home() / "digests.json"
    except UsageError as err:
        log.warning("weight digests are not cached: %s", err)
        return None


def _file_digest(path: Path, memo: dict[str, Any]) -> str:
    st = path.stat()
    key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    if key in memo:
        return memo[key]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    memo[key] = h.hexdigest()
    return memo[key]


def _current(memo: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``memo`` whose file is still there as it was digested (same size and modification
    time): the cache keeps what a later fingerprint can use, not every file it ever saw (checkpoints in
    removed temporary folders, files rewritten since), so it does not grow without bound."""
    kept = {}
    for key, digest in memo.items():
        path, _, stamp = key.rpartition("|")
        path, _, size = path.rpartition("|")
        try:
            st = os.stat(path)
        except (OSError, ValueError):
            continue
        if f"{st.st_size}|{st.st_mtime_ns}" == f"{size}|{stamp}":
            kept[key] = digest
    return kept


def fingerprint(model_dir: str | os.PathLike, flag: str = "--model") -> Fingerprint:
    """Fingerprint a checkpoint without loading it.

    Digests config.json, every weight file, and the tokenizer's files and any code
    the checkpoint ships (FINGERPRINT_GLOBS): two checkpoints that differ only in
    tokenizer code are different checkpoints, with different gate verdicts.
    """
    d = resolve_model_dir(model_dir, flag)
    cfg = read_config(d)
    memo_path = _digest_cache_path()
    try:
        memo = json.loads(memo_path.read_text()) if memo_path is not None else {}
        if not isinstance(memo, dict):
            memo = {}
    except (OSError, ValueError):
        memo = {}
    before = len(memo)
    files = {f.name: _file_digest(f, memo) for f in sorted(d.glob("model*.safetensors"))}
    extra = cfg.get("model_file")
    if isinstance(extra, str) and extra and (d / extra).is_file():
        files[extra] = _file_digest(d / extra, memo)
    for pattern in FINGERPRINT_GLOBS:
        for f in sorted(d.glob(pattern)):
            if f.is_file() and f.name not in files:
                files[f.name] = _file_digest(f, memo)
    if len(memo) != before and memo_path is not None:
        from specparity.store import atomic_write_text

        try:
            atomic_write_text(memo_path, json.dumps(_current(memo)))
        except OSError as err:
            log.warning("could not save weight digests to %s: %s", memo_path, err)
    h = hashlib.sha256((d / "config.json").read_bytes())
    for name, digest in files.items():
        h.update(f"{name}={digest}".encode())
    return Fingerprint(
        path=str(d),
        digest=h.hexdigest(),
        model_type=cfg.get("model_type"),
        dtype=cfg.get("torch_dtype") or cfg.get("dtype"),
        quantization=cfg.get("quantization"),
        weight_files=files,
    )


def adapter_digest(path: str | os.PathLike) -> str:
    """sha256 over an adapter's files (a directory, mlx-lm's ``--adapter-path``), or one file.

    A gate verdict probed on a model with an adapter applied holds for that adapter only.
    """
    p = expand_user(path, "adapter")
    files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
    memo: dict[str, Any] = {}
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.relative_to(p) if p.is_dir() else f.name}={_file_digest(f, memo)}".encode())
    return h.hexdigest()


@dataclass
class Loaded:
    """A loaded checkpoint: model, tokenizer, config and fingerprint."""

    model: Any
    tokenizer: Any
    config: dict[str, Any]
    fingerprint: Fingerprint
    path: Path


def load_checkpoint(path: str | os.PathLike, trust_remote_code: bool = False,
                    flag: str = "--model", tokenizer_config: dict[str, Any] | None = None) -> Loaded:
    """Load with mlx-lm, turning its failures into one-line errors that name ``flag``.

    Nothing the checkpoint ships runs without ``trust_remote_code``: neither a
    ``model_file`` nor tokenizer code (an ``auto_map``); transformers is told so
    explicitly, so its interactive y/N prompt never appears. ``tokenizer_config``:
    more tokenizer options (a server's ``--chat-template``), as mlx-lm's ``load`` takes them.
    """
    d = resolve_model_dir(path, flag)
    cfg = read_config(d)
    code = remote_code(d, cfg)
    if code and not trust_remote_code:
        raise UsageError(f"{flag} {path}: {code}; pass ", Name("trust-remote-code"), " to run it")
    fp = fingerprint(d, flag)
    import inspect

    import mlx_lm

    # mlx-lm 0.31 has no trust_remote_code parameter (the check above already refused the code)
    extra: dict[str, Any] = ({"trust_remote_code": trust_remote_code}
                             if "trust_remote_code" in inspect.signature(mlx_lm.load).parameters else {})
    try:
        # mypy cannot pick the 3-tuple arm of load's Union return from return_config=True
        model, tokenizer, config = mlx_lm.load(  # type: ignore[misc]
            str(d), return_config=True,
            tokenizer_config={**(tokenizer_config or {}), "trust_remote_code": trust_remote_code}, **extra,
        )
    except SystemExit as err:  # the checkpoint's own code exited: a bug, never a verdict
        raise RuntimeError(f"{flag} {path}: code the checkpoint ships raised"
                           f" SystemExit({err.code!r}) while loading") from err
    except Exception as err:  # mlx-lm raises many kinds; all mean "would not load"
        raise CheckpointError(
            f"{flag} {path}: would not load ({type(err).__name__}: {first_line(str(err))})"
        ) from err
    return Loaded(model=model, tokenizer=tokenizer, config=config, fingerprint=fp, path=d)


def model_dtype(model: Any) -> str:
    """The dtype the model computes its logits in (its embedding's dtype)."""
    import mlx.core as mx

    from specparity.decode import tree_items

    for _, v in tree_items(model.parameters()):
        if mx.issubdtype(v.dtype, mx.floating):
            return str(v.dtype).replace("mlx.core.", "")
    return "unknown"
