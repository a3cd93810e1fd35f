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

from specparity.errors import CheckpointError, UsageError

log = logging.getLogger(__name__)


@dataclass
class Fingerprint:
    """Identity of a checkpoint.

    path: the directory as given, resolved.
    digest: sha256 over config.json and the sorted weight-file digests.
    model_type: config's ``model_type``.
    dtype: config's ``torch_dtype`` (or ``dtype``), as declared.
    quantization: config's ``quantization`` block, or None.
    weight_files: {file name: sha256}.
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


def resolve_model_dir(path: str | os.PathLike) -> Path:
    """The checkpoint directory, or a one-line UsageError saying what is wrong."""
    p = Path(path).expanduser()
    if not p.exists():
        raise UsageError(f"--model {path}: no such file or directory")
    if not p.is_dir():
        raise UsageError(f"--model {path}: not a directory (a checkpoint is a directory)")
    if not (p / "config.json").exists():
        raise UsageError(f"--model {path}: not a checkpoint (no config.json)")
    if not list(p.glob("model*.safetensors")):
        raise UsageError(f"--model {path}: not a checkpoint (no model*.safetensors)")
    return p.resolve()


def read_config(model_dir: Path) -> dict[str, Any]:
    try:
        cfg = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{model_dir / 'config.json'}: malformed config ({err})") from err
    if not isinstance(cfg, dict) or "model_type" not in cfg:
        raise CheckpointError(f"{model_dir / 'config.json'}: malformed config (no model_type)")
    return cfg


def _digest_cache_path() -> Path:
    from specparity.paths import home

    return home() / "digests.json"


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


def fingerprint(model_dir: str | os.PathLike) -> Fingerprint:
    """Fingerprint a checkpoint without loading it."""
    d = resolve_model_dir(model_dir)
    cfg = read_config(d)
    memo_path = _digest_cache_path()
    try:
        memo = json.loads(memo_path.read_text())
        if not isinstance(memo, dict):
            memo = {}
    except (OSError, ValueError):
        memo = {}
    before = len(memo)
    files = {f.name: _file_digest(f, memo) for f in sorted(d.glob("model*.safetensors"))}
    extra = cfg.get("model_file")
    if extra and (d / extra).exists():
        files[extra] = _file_digest(d / extra, memo)
    if len(memo) != before:
        from specparity.store import atomic_write_text

        try:
            atomic_write_text(memo_path, json.dumps(memo))
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


@dataclass
class Loaded:
    """A loaded checkpoint: model, tokenizer, config and fingerprint."""

    model: Any
    tokenizer: Any
    config: dict[str, Any]
    fingerprint: Fingerprint
    path: Path


def load_checkpoint(path: str | os.PathLike, trust_remote_code: bool = False) -> Loaded:
    """Load with mlx-lm, turning its failures into one-line errors."""
    d = resolve_model_dir(path)
    cfg = read_config(d)
    if cfg.get("model_file") and not trust_remote_code:
        raise UsageError(
            f"--model {path}: its config names model_file {cfg['model_file']!r};"
            " pass --trust-remote-code to run it"
        )
    fp = fingerprint(d)
    import mlx_lm

    try:
        # mypy cannot pick the 3-tuple arm of load's Union return from return_config=True
        model, tokenizer, config = mlx_lm.load(  # type: ignore[misc]
            str(d), return_config=True, trust_remote_code=trust_remote_code
        )
    except Exception as err:  # mlx-lm raises many kinds; all mean "would not load"
        raise CheckpointError(f"--model {path}: would not load ({type(err).__name__}: {err})") from err
    return Loaded(model=model, tokenizer=tokenizer, config=config, fingerprint=fp, path=d)


def model_dtype(model: Any) -> str:
    """The dtype the model computes its logits in (its embedding's dtype)."""
    import mlx.core as mx

    from specparity.decode import tree_items

    for _, v in tree_items(model.parameters()):
        if mx.issubdtype(v.dtype, mx.floating):
            return str(v.dtype).replace("mlx.core.", "")
    return "unknown"
