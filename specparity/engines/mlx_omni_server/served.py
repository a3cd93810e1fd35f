"""mlx-omni-server's server (``python -m mlx_omni_server.main``, 0.5.3): why it cannot be served here.

Two causes, each its own:

- its app imports misaki's English G2P at start (``main._initialize_kokoro_g2p``: ``G2P(trf=False)``), which
  runs ``spacy.cli.download("en_core_web_sm")`` when that spaCy model is not installed: a download from outside the
  package registries this machine reaches, so the server exits before it listens (:func:`unavailable` looks for the
  model in the engine's environment);
- its drafter is chosen per request (the ``model`` and ``draft_model`` fields of each chat request, a
  ``ChatGenerator`` per pair), and a profile cannot put a pairing's checkpoint paths into a request body: even
  started, no request of the served harness could name the drafter.

Its chat path runs in process instead (:mod:`specparity.engines.mlx_omni_server.loops`). :data:`CHAT_TEMPLATE`
is the chat template its tokenizer is given there.
"""

from __future__ import annotations

from pathlib import Path

# mlx_lm.server's convert_chat (mlx-lm 0.31.3) as a chat template: the prompt it builds for a tokenizer without one
# (each message as its role's prefix, its content and a newline, then "ASSISTANT: " stripped at the right)
CHAT_TEMPLATE = (
    "{%- set prefix = {'system': \"ASSISTANT's RULE: \", 'user': 'USER: ', 'assistant': 'ASSISTANT: '} -%}"
    "{%- for message in messages -%}"
    "{{- prefix.get(message['role'], '') ~ message['content'] ~ '\\n' -}}"
    "{%- endfor -%}"
    "ASSISTANT:"
)
SPACY_MODEL = "en_core_web_sm"
G2P_CAUSE = ("mlx-omni-server 0.5.3's application imports misaki's English G2P at start, which downloads spaCy's"
             f" {SPACY_MODEL} (spacy.cli.download) when it is not installed: that model is not on the package"
             " registries this machine reaches, so the server exits before it listens")
PER_REQUEST_CAUSE = ("mlx-omni-server names its drafter per request (the model and draft_model fields of each"
                     " chat request), and a served profile cannot put a pairing's checkpoints into a request body:"
                     " no request could name the drafter")


def _has_spacy_model(site_packages: list[Path]) -> bool:
    return any(any(d.glob(f"{SPACY_MODEL}-*.dist-info")) or (d / SPACY_MODEL).is_dir() for d in site_packages)


def unavailable() -> str | None:
    """Why its server cannot be served here (it always has the second cause; the first where the spaCy model is
    missing from its environment)."""
    from specparity import environments

    env = environments.find_environment("mlx-omni-server")
    if env is None:
        return "environment mlx-omni-server is not built: run scripts/build-env mlx-omni-server"
    site = sorted(Path(env.path).glob("lib/python*/site-packages"))
    if not _has_spacy_model(site):
        return f"{G2P_CAUSE}; and {PER_REQUEST_CAUSE}"
    return PER_REQUEST_CAUSE
