"""Every reach into mlx-lm's private names and module internals, in one place.

The toolkit rebuilds ``mlx_lm.server`` (:mod:`specparity.mlx_server`) and runs it
with hooks (``specparity serve``), so it reads names mlx-lm does not promise to
keep: a leading underscore, a module global the server looks up at call time, a
class's private method. Each is reached here, or in :mod:`.server` (the server's
classes with their private hooks under public names; importing it imports
mlx-lm's server), and nowhere else: ``tests/core/test_compat.py`` fails on a module
that reaches one on its own, and reads every row below in both pinned
environments. Each is reached through one function or method; a later mlx-lm
that moved one fails there, with a line naming the version.

    reach                                        what for                             0.31.3   0.32.2
    -------------------------------------------  -----------------------------------  -------  -------
    mlx_lm.utils._parse_size                     --prompt-cache-bytes, as read        yes      yes
    mlx_lm.utils._get_classes                    a fixture's model class              yes      yes
    mlx_lm.utils._download                       a served model's directory           yes      yes
    mlx_lm.server._image_parts                   refuse image requests                absent   yes
    ResponseGenerator._tokenize                  the server's tokenize step           yes      yes
    ResponseGenerator._make_state_machine        0.31's stop and text machine         yes      (other)
    mlx_lm.generate.make_stop_sequences present  0.32's server, not 0.31's            absent   yes
    RotatingKVCache._temporal_order              a rotating cache in position order   yes      yes
    LRUPromptCache._trie                         the gated server's exact entries     yes      yes
    mlx_lm.generate's step functions rebound     the e2e spy, the prefill cancel hook yes      yes
    sample_utils' logit_bias_processor by name   a processor that ignores its tokens  yes      yes
    ModelProvider._load, ._model_map,            specparity serve's hooks (.server)   (a)      yes
      ._adapter_map; ResponseGenerator's
      _run_generate, _is_batchable,
      _await_response, _serve_single,
      _tokenize, _stop, _generation_thread;
      APIHandler._set_completion_headers
    mlx_lm.server's argparse, ModelProvider,     specparity serve runs mlx-lm's       yes      yes
      run, stream_generate rebound               main() with its own (.server)

(a) 0.31.3 has all but ``_run_generate`` and ``_await_response``; ``specparity
serve`` runs in the toolkit's own environment (mlx-lm 0.32), and refuses to start
on one whose server lacks a hook (``server.require_hooks``: one line, exit 4).
(other): 0.32 has the name with another signature; the 0.32 path does not use it.

An installed mlx-lm outside :data:`CHECKED_VERSIONS` is not refused:
:func:`check_version` logs one warning naming it (on the first version-sensitive
reach of the process), and a reach that moved fails where it is made.
"""

from __future__ import annotations

import logging
import types
from typing import Any

log = logging.getLogger(__name__)

# the mlx-lm versions every reach below was read in (the project's venv and its pinned environments)
CHECKED_VERSIONS: tuple[str, ...] = ("0.31.3", "0.32.2")
_warned: set[str] = set()
_checked: str | None = None  # the version check_version last found


def mlx_lm_version() -> str:
    """The installed mlx-lm's version (``unknown`` when it does not say)."""
    import mlx_lm

    return str(getattr(mlx_lm, "__version__", "unknown"))


def check_version() -> bool:
    """Whether the installed mlx-lm is one this module was checked against; if not, one warning
    (per process) naming it. Never raises: a reach that moved fails where it is made."""
    global _checked
    version = mlx_lm_version()
    _checked = version
    if version in CHECKED_VERSIONS:
        return True
    if version not in _warned:
        _warned.add(version)
        log.warning("mlx-lm %s: specparity's reaches into its internals were checked against %s only"
                    " (specparity.mlx_compat); one that moved fails where it is used", version,
                    ", ".join(CHECKED_VERSIONS))
    return False


def _checked_once() -> None:
    """:func:`check_version` on the first version-sensitive reach of the process."""
    if _checked is None:
        check_version()


def _moved(what: str, err: BaseException) -> Exception:
    from specparity.errors import InfrastructureError

    return InfrastructureError(f"mlx-lm {mlx_lm_version()}: {what} moved ({type(err).__name__}: {err});"
                               f" specparity.mlx_compat was checked against {', '.join(CHECKED_VERSIONS)}")


# --- mlx_lm.utils ----------------------------------------------------------------------------

def parse_size(text: str) -> int:
    """A size as ``mlx_lm.server`` reads ``--prompt-cache-bytes`` (``10GB``, ``512M``, a plain byte count)."""
    from mlx_lm import utils

    return int(utils._parse_size(text))


def model_classes(config: dict[str, Any]) -> tuple[Any, Any]:
    """(Model, ModelArgs) of ``config``'s ``model_type``, as mlx-lm's loader picks them."""
    from mlx_lm import utils

    model_class, args_class = utils._get_classes(config=config)
    return model_class, args_class


def download(path_or_repo: str) -> Any:
    """The local directory of a model name as ``mlx_lm.server`` resolves it (a path stays a path)."""
    from mlx_lm import utils

    return utils._download(path_or_repo)


# --- mlx_lm.generate -------------------------------------------------------------------------

def generate_module() -> Any:
    """The module ``mlx_lm.generate`` (``mlx_lm``'s ``__init__`` binds that name to the function)."""
    import importlib

    return importlib.import_module("mlx_lm.generate")


def server_031() -> bool:
    """The installed mlx-lm's server is 0.31's (no ``make_stop_sequences``), not 0.32's."""
    _checked_once()
    return not hasattr(generate_module(), "make_stop_sequences")


def stop_sequences(tokenizer: Any, stop_words: list[str]) -> Any:
    """What ends a completion as the installed mlx-lm's server ends it: an object whose ``matcher()`` has
    ``advance(token) -> bool``. 0.32: ``make_stop_sequences``. 0.31 (which has none): its server's own rule
    (``ResponseGenerator._make_state_machine``'s stops): an EOS id, or a stop word's ids
    (``encode(w, add_special_tokens=False)``) just emitted."""
    g = generate_module()
    if hasattr(g, "make_stop_sequences"):
        return g.make_stop_sequences(tokenizer, stop_words)
    seqs: list[tuple[int, ...]] = [(int(t),) for t in getattr(tokenizer, "eos_token_ids", None) or ()]
    seqs += [tuple(int(t) for t in tokenizer.encode(w, add_special_tokens=False)) for w in stop_words]
    return _TokenStops([x for x in seqs if x])


class _TokenStops:
    """mlx-lm 0.31's server stops, read as 0.32's ``StopSequences`` are (``matcher().advance``)."""

    def __init__(self, seqs: list[tuple[int, ...]]):
        self.seqs = seqs

    def matcher(self) -> Any:
        seqs, tail = self.seqs, []

        class _Matcher:
            def advance(self, token: int) -> bool:
                tail.append(int(token))
                return any(tuple(tail[-len(x):]) == x for x in seqs)

        return _Matcher()


def replace_in_generate(name: str, fn: Any) -> Any:
    """Rebind ``mlx_lm.generate.<name>`` (looked up at call time by ``stream_generate`` and the
    server); returns what was there, to put back."""
    g = generate_module()
    old = getattr(g, name)
    setattr(g, name, fn)
    return old


# --- mlx_lm.models.cache ---------------------------------------------------------------------

def temporal_order(cache: Any, x: Any) -> Any:
    """A ``RotatingKVCache``'s keys or values in position order (its ring unrolled)."""
    return cache._temporal_order(x)


def prompt_cache_trie(lru: Any) -> Any:
    """An ``LRUPromptCache``'s trie of entries (``search`` / ``get``)."""
    return lru._trie


def ignores_history(processor: Any) -> bool:
    """Whether ``processor`` is the logit bias ``make_logits_processors`` builds: it adds a bias and
    never reads the tokens it is handed (the penalties read them). Known by its name in
    ``mlx_lm.sample_utils`` (0.31.3, 0.32.2: ``logit_bias_processor(_, logits)``); any other
    processor, or one so named elsewhere, reads them as far as this says."""
    return getattr(processor, "__module__", None) == "mlx_lm.sample_utils" and \
        getattr(processor, "__qualname__", None) == "make_logits_processors.<locals>.logit_bias_processor"


# --- mlx_lm.server: its tokenize step and 0.31's state machine ---------------------------------

def has_image_parts(messages: list[Any]) -> bool:
    """Whether ``mlx_lm.server`` sees image content parts in ``messages`` (0.31 serves text only:
    it has no such step, and this is False)."""
    from mlx_lm import server

    image_parts = getattr(server, "_image_parts", None)
    return image_parts is not None and any(True for _ in image_parts(messages))


def server_tokenize(tokenizer: Any, request: Any, chat_template_args: dict[str, Any],
                    chat_template_kwargs: dict[str, Any] | None) -> tuple[Any, ...]:
    """``mlx_lm.server``'s own tokenize step for a ``CompletionRequest`` (its code, not a copy):
    (prompt ids, segments, segment types, initial state[, images from 0.32])."""
    from mlx_lm import server

    _checked_once()
    try:
        tokenize: Any = server.ResponseGenerator._tokenize
    except AttributeError as err:
        raise _moved("its server's tokenize step", err) from None
    # the two things the step reads off its model provider, and the request's template kwargs
    provider = types.SimpleNamespace(model_provider=types.SimpleNamespace(
        processor=None, cli_args=types.SimpleNamespace(chat_template_args=dict(chat_template_args))))
    args = types.SimpleNamespace(chat_template_kwargs=chat_template_kwargs)
    return tuple(tokenize(provider, tokenizer, request, args))


def state_machine_031(tokenizer: Any, stop_words: list[str], initial_state: str) -> Any:
    """mlx-lm 0.31's server's ``SequenceStateMachine`` for a request (its ``_make_state_machine``):
    EOS and each stop word's tokens end it; think and tool-call tokens switch state."""
    from mlx_lm import server

    shim = types.SimpleNamespace(_state_machine_cache={})
    make: Any = server.ResponseGenerator._make_state_machine  # 0.31's signature, not 0.32's
    sm, _ = make(shim, None, tokenizer, list(stop_words), initial_state=initial_state)
    return sm
