"""Captures on disk: one safetensors file plus a JSON manifest, and reading them back.

A dump holds one arm or both, every capture in the dtype the model computed
it in (bfloat16 included), and every layer's cache arrays. The manifest is
stored twice: in the safetensors metadata (so the file alone is enough for
``bisect diff``) and beside it as ``<name>.json`` for people to read.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from specparity.bisect.arms import ArmCapture, BisectCapture
from specparity.decode import LayerState
from specparity.errors import InputError, UsageError

log = logging.getLogger(__name__)

FORMAT = "specparity-bisect-dump"
VERSION = 1
_META_KEY = "specparity_manifest"


@dataclass
class Dump:
    """A dump read back.

    path: the safetensors file.
    manifest: the JSON manifest (identity, model fingerprint, env, width, depth, prompt...).
    arms: ``chain`` and/or ``block`` -> ArmCapture.
    """

    path: Path
    manifest: dict[str, Any]
    arms: dict[str, ArmCapture]

    @property
    def width(self) -> int:
        return int(self.manifest["width"])

    @property
    def depth(self) -> int:
        return int(self.manifest["depth"])

    @property
    def layer_kinds(self) -> list[str]:
        return list(self.manifest["layer_kinds"])

    @property
    def fingerprint(self) -> str:
        return str(self.manifest["model"]["fingerprint"])

    def arm(self, name: str | None, flag: str) -> ArmCapture:
        """The arm ``name``, or the only arm held; a clear error otherwise."""
        if name is None:
            if len(self.arms) != 1:
                raise UsageError(f"{self.path} holds arms {', '.join(self.arms)}:"
                                 f" choose one with {flag} chain|block")
            return next(iter(self.arms.values()))
        if name not in self.arms:
            raise UsageError(f"{flag} {name}: {self.path} holds only {', '.join(self.arms)}")
        return self.arms[name]


def manifest_path(out: str | os.PathLike) -> Path:
    p = Path(out)
    return p.with_suffix(".json") if p.suffix == ".safetensors" else Path(f"{p}.json")


def write_dump(out: str | os.PathLike, bc: BisectCapture, arms: tuple[str, ...],
               info: dict[str, Any], force: bool = False) -> dict[str, Any]:
    """Write ``arms`` of ``bc`` to ``out`` (safetensors) and its manifest as new files (existing ones only
    with ``force``: :func:`specparity.store.new_files`); returns the manifest.

    ``info`` carries identity, model (fingerprint...), env, cache options, prompt text.
    """
    import mlx.core as mx

    from specparity.compare import sha256_of

    path = Path(out)
    if path.exists() and path.is_dir():
        raise InputError("out", f"{out}: is a directory")
    if not path.parent.exists():
        raise InputError("out", f"{out}: directory {path.parent} does not exist")
    tensors: dict[str, Any] = {}
    cache_meta: dict[str, list[dict[str, Any]]] = {}
    for arm in arms:
        cap = bc.arms[arm]
        for name in cap.order:
            tensors[f"{arm}/{name}"] = cap.arrays[name]
        cache_meta[arm] = []
        for i, st in enumerate(cap.cache):
            for key, arr in st.arrays.items():
                tensors[f"{arm}/cache/{i}/{key}"] = arr
            cache_meta[arm].append({"kind": st.kind, "offset": st.offset,
                                    "arrays": list(st.arrays)})
    first = bc.arms[arms[0]]
    manifest = {
        "format": FORMAT, "version": VERSION, "arms": list(arms),
        "width": bc.width, "depth": bc.depth, "prompt": bc.prompt, "tokens": bc.tokens,
        "layer_kinds": bc.layer_kinds, "order": first.order,
        "row_axes": first.row_axes, "cache": cache_meta,
        "logits_sha256": {arm: sha256_of(bc.arms[arm].logits) for arm in arms},
        "capture_bytes": sum(bc.arms[a].nbytes() for a in arms),
        **info,
    }
    text = json.dumps(manifest, indent=2, default=str)
    from specparity.store import new_files

    with new_files([path, manifest_path(path)], force=force, flag="--out") as (tmp, tmp_manifest):
        # mlx names the file it writes: a name without the suffix gets one, so the suffix is given
        written = tmp if tmp.suffix == ".safetensors" else tmp.with_name(tmp.name + ".safetensors")
        mx.save_safetensors(str(written), {k: mx.contiguous(v) for k, v in tensors.items()},
                            metadata={_META_KEY: text})
        if written != tmp:
            os.rename(written, tmp)
        tmp_manifest.write_text(text + "\n")
    log.info("dumped %d arrays (%s) to %s", len(tensors), ", ".join(arms), path)
    return manifest


def read_dump(path: str | os.PathLike) -> Dump:
    """Read a dump written by :func:`write_dump`; a one-line UsageError if it is not one."""
    import mlx.core as mx

    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{path}: no such dump file")
    try:
        # return_metadata=True returns (arrays, metadata); the annotation admits every form
        tensors, meta = cast(tuple[dict[str, Any], dict[str, str]],
                             mx.load(str(p), return_metadata=True))
    except Exception as err:  # mlx raises RuntimeError/ValueError for foreign files
        raise UsageError(f"{path}: not a safetensors file ({err})") from None
    try:
        manifest = json.loads(meta[_META_KEY])
        if manifest.get("format") != FORMAT:
            raise KeyError
    except (KeyError, ValueError, TypeError):
        raise UsageError(f"{path}: not a specparity bisect dump (no manifest)") from None
    if int(manifest.get("version", 0)) > VERSION:
        raise UsageError(f"{path}: dump format version {manifest['version']} is newer than"
                         f" this specparity reads ({VERSION})")
    arms: dict[str, ArmCapture] = {}
    row_axes = {k: (None if v is None else int(v)) for k, v in manifest["row_axes"].items()}
    for arm in manifest["arms"]:
        order = [n for n in manifest["order"] if f"{arm}/{n}" in tensors]
        arrays = {n: tensors[f"{arm}/{n}"] for n in order}
        cache = []
        for i, c in enumerate(manifest["cache"][arm]):
            cache.append(LayerState(c["kind"], c["offset"],
                                    {k: tensors[f"{arm}/cache/{i}/{k}"] for k in c["arrays"]}))
        arms[arm] = ArmCapture(arm, order, arrays, dict(row_axes), cache)
    return Dump(p, manifest, arms)


def check_partners(a: Dump, b: Dump) -> None:
    """Refuse a diff whose two dumps did not run the same model, width, depth and prompt."""
    ma, mb = a.manifest, b.manifest
    if a.fingerprint != b.fingerprint:
        raise UsageError(
            f"{a.path} and {b.path} come from different models (fingerprints"
            f" {a.fingerprint[:12]} {ma['model'].get('model_type')} vs"
            f" {b.fingerprint[:12]} {mb['model'].get('model_type')}): a diff would mislead")
    for key in ("width", "depth"):
        if ma[key] != mb[key]:
            raise UsageError(f"{a.path} has {key} {ma[key]} but {b.path} has {key} {mb[key]}:"
                             f" dump both at the same {key}")
    if ma["prompt"] != mb["prompt"]:
        raise UsageError(f"{a.path} and {b.path} were dumped from different prompts")
    if ma["order"] != mb["order"] or len(ma["layer_kinds"]) != len(mb["layer_kinds"]):
        raise UsageError(f"{a.path} and {b.path} captured different modules")
