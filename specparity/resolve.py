"""What a user types for a checkpoint, resolved to a local directory.

One resolver for every command and every role (``--model``, ``--draft-model``):

- nothing: the embedded default pair (built on first use, no hub needed);
- a local directory;
- a Hugging Face repo id (``mlx-community/Qwen3-0.6B-4bit``), resolved as
  mlx-lm resolves it: the local hub cache first (``HF_HUB_CACHE`` /
  ``HF_HOME``), then a download only where the hub is reachable.

Errors are library errors in library terms: they name the input ``checkpoint``
(errors.Name), which a command shows as its flag (``--model``, ``--draft-model``).
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from specparity.errors import InfrastructureError, Name, UsageError
from specparity.inputs import expand_user

log = logging.getLogger(__name__)

# how errors name the input being resolved (a command maps it to --model / --draft-model)
CHECKPOINT = Name("checkpoint")

# owner/name as the hub spells repo ids (no leading dot or slash, one slash)
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
# what mlx-lm downloads for a model (mlx_lm.utils.DEFAULT_ALLOW_PATTERNS)
_ALLOW = ["*.json", "model*.safetensors", "*.py", "tokenizer.model", "*.tiktoken",
          "tiktoken.model", "*.txt", "*.jsonl", "*.jinja"]


def is_repo_id(spec: str) -> bool:
    return bool(_REPO_ID.match(spec)) and ".." not in spec


def default_target() -> Path:
    from specparity.fixtures import default_pair

    return Path(default_pair().target)


def default_drafter() -> Path:
    from specparity.fixtures import default_pair

    draft = default_pair().draft
    assert draft is not None, "the embedded default pair always has a drafter"
    return Path(draft)


def resolve_checkpoint(spec: str | os.PathLike | None, role: str = "target") -> Path:
    """A local checkpoint directory for ``spec`` (see the module docstring).

    role: ``target`` or ``draft``; picks which half of the default pair a
    missing spec means. A path that does not exist and is not a repo id is a
    UsageError; a repo id neither cached nor reachable is an
    InfrastructureError naming the id and the cache looked in.
    """
    if spec is None or str(spec) == "":
        path = default_target() if role == "target" else default_drafter()
        log.info("using the embedded default %s %s", role, path)
        return path
    p = expand_user(spec, CHECKPOINT)
    if p.exists() or not is_repo_id(str(spec)):
        return p  # checkpoint.resolve_model_dir says what is wrong with a bad path
    return _from_hub(str(spec))


def _from_hub(repo_id: str) -> Path:
    try:
        from huggingface_hub import constants, snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:  # mlx-lm depends on it; only a broken install lacks it
        raise UsageError(CHECKPOINT, f" {repo_id}: no such directory (huggingface_hub is not installed"
                         " to resolve it as a hub id)") from None
    cache = constants.HF_HUB_CACHE
    try:
        return Path(snapshot_download(repo_id, local_files_only=True, allow_patterns=_ALLOW))
    except LocalEntryNotFoundError:
        pass
    except Exception as err:  # an incomplete or unreadable cache entry
        log.info("hub cache lookup of %s failed: %s", repo_id, err)
    if constants.HF_HUB_OFFLINE:
        raise InfrastructureError(
            CHECKPOINT, f" {repo_id}: not a local directory and not in the hub cache {cache}"
            " (HF_HUB_OFFLINE is set, so no download was tried)")
    try:
        return Path(snapshot_download(repo_id, allow_patterns=_ALLOW))
    except Exception as err:
        from huggingface_hub.errors import RepositoryNotFoundError

        if isinstance(err, RepositoryNotFoundError):
            raise UsageError(CHECKPOINT, f" {repo_id}: no such directory, and no such repository"
                             " on the hub") from err
        raise InfrastructureError(
            CHECKPOINT, f" {repo_id}: not a local directory, not in the hub cache {cache},"
            f" and the hub is unreachable ({type(err).__name__})") from err
