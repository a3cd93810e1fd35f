"""The witness: engine-agnostic evidence that a server ran the speculative path.

Plain mlx-lm's server reports nothing about drafting, so the harness serves
witness wrappers of the checkpoints: the same weights and tokenizer (linked,
not copied; a checkpoint's own ``model_file`` too, which the wrapper loads and
wraps, under --trust-remote-code), with ``model_file`` = the fixture model file, whose forward
appends ``<pid> <role> <rows> <cache offset>`` to the file named by
``SPECPARITY_WITNESS_FILE`` (the server must load them with
``--trust-remote-code``). :mod:`specparity.harness.evidence` reads one
request's slice of that file.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from specparity import fixtures
from specparity.errors import UsageError
from specparity.fixtures import FIXTURE_MODULE

WITNESS_ENV = "SPECPARITY_WITNESS_FILE"
FIXTURE_MODEL_PATH = fixtures.MODELS_DIR / FIXTURE_MODULE
_KEEP_OUT = {"config.json", FIXTURE_MODULE, "fixture.json"}


def wrap_checkpoint(src: str | os.PathLike, dst: str | os.PathLike, role: str,
                    trust_remote_code: bool = False) -> Path:
    """``dst``: ``src`` with the witness model_file (its faults, if any, kept).

    A checkpoint that ships its own ``model_file`` is wrapped too: the witness
    loads that file (linked into ``dst`` with the rest) and wraps its model. That
    runs the checkpoint's code, so it needs ``trust_remote_code`` (the consent the
    server is given with ``--trust-remote-code``); without it, a UsageError.
    """
    src, dst = Path(src), Path(dst)
    cfg_path = src / "config.json"
    if not cfg_path.is_file():
        raise UsageError(f"{src}: no config.json: not an mlx-lm checkpoint")
    try:
        config = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as err:
        raise UsageError(f"{src}: config.json is not readable JSON ({err}): not an mlx-lm checkpoint") from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise UsageError(f"{src}: config.json has no model_type: not an mlx-lm checkpoint")
    own = config.get("model_file")
    if own is not None and own != FIXTURE_MODULE:
        if not isinstance(own, str) or Path(own).name != own or not (src / own).is_file():
            raise UsageError(f"{src}: its model_file {own!r} is not a file in the checkpoint")
        if not trust_remote_code:
            raise UsageError(f"{src}: has its own model_file {own!r}: the witness runs it only with"
                             " --trust-remote-code")
        spec = {"module_file": own, "faults": []}
    else:
        spec = dict(config.get("specparity") or {"base": config["model_type"], "faults": []})
    spec["witness"] = role
    config["model_file"] = FIXTURE_MODULE
    config["specparity"] = spec
    dst.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.name in _KEEP_OUT:
            continue
        link = dst / item.name
        if not link.exists():
            link.symlink_to(item.resolve())
    (dst / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    shutil.copy(FIXTURE_MODEL_PATH, dst / FIXTURE_MODULE)
    return dst
