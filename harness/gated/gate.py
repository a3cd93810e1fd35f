"""``specparity serve``'s settings and its memo of the gate's decisions (no mlx here).

:class:`ServeConfig` (what ``specparity serve`` adds to mlx-lm's flags), :class:`GateMemo` (the
gate's decisions and prompt-cache policies for the process), :class:`ModelUnavailable`, and the
helpers :mod:`.classes` and :mod:`.server` share.
"""

from __future__ import annotations

import argparse
import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specparity.errors import UsageError
from specparity.harness.gated import DEFAULT_MAX_DRAFT_TOKENS
from specparity.mlx_compat import download
from specparity.mlx_server import ServerSettings
from specparity.verdicts import CachePolicy, Verdict

log = logging.getLogger("specparity.serve")

POLICY_MEANING = {
    CachePolicy.REUSE: "cached prompt prefixes are reused",
    CachePolicy.REPREFILL: ("a cached prefix is reused only where it was computed by the calls a"
                            " fresh prefill makes, else the prompt is prefilled again; requests"
                            " are served one at a time"),
}


class ModelUnavailable(Exception):
    """A model would not load. ``str()`` is what a client sees; ``detail`` stays in the log."""

    def __init__(self, message: str, detail: str):
        super().__init__(message)
        self.detail = detail


class ServeConfig:
    """What ``specparity serve`` adds to mlx-lm's flags.

    gate: consult the gate (False: ``--gate off``, said at start-up).
    env_prefixes: environment variable prefixes the gate key includes.
    allow_request_models: requests may name other checkpoints, drafters and
      adapters (``model`` / ``draft_model`` / ``adapters``); off, only the operator's.
    max_draft_tokens: the largest ``num_draft_tokens`` a request may ask for
      (each new width is a gate probe and a metrics series).
    """

    def __init__(self, gate: bool = True, env_prefixes: tuple[str, ...] | None = None,
                 allow_request_models: bool = False,
                 max_draft_tokens: int = DEFAULT_MAX_DRAFT_TOKENS):
        from specparity.identity import DEFAULT_ENV_PREFIXES

        self.gate = gate
        self.env_prefixes = tuple(env_prefixes or DEFAULT_ENV_PREFIXES)
        self.allow_request_models = allow_request_models
        self.max_draft_tokens = max_draft_tokens


def served_vocab(model: Any, draft_model: Any = None) -> int | None:
    """The token ids a request's logit_bias and top_k must fit: the model's vocabulary and the
    drafter's (its logits get the same processors), the smaller. None: neither is known."""
    from specparity.inputs import vocab_size

    sizes = []
    for m in (model, draft_model):
        if m is None:
            continue
        try:
            sizes.append(vocab_size(m))
        except UsageError:
            pass
    return min(sizes) if sizes else None


def loaded_model(provider: Any) -> Any:
    """The provider's model in memory as a ``checkpoint.Loaded`` (what the gate probes)."""
    from specparity.checkpoint import Loaded, fingerprint

    path = Path(download(str(provider.model_key[0])))
    return Loaded(model=provider.model, tokenizer=provider.tokenizer, config={},
                  fingerprint=fingerprint(path), path=path)


class GateMemo:
    """The gate's decisions for this process: one per (checkpoint, adapter, width), and the
    prompt-cache policy per (checkpoint, adapter).

    ``gate_check`` logs its ALLOW / DECLINE / FORFEIT line on each call, so asking
    once per width here logs it once per width per process. A gate or policy probe
    that cannot run declines, or re-prefills: never a pass.
    """

    def __init__(self, config: ServeConfig, cli_args: argparse.Namespace):
        self.config = config
        self.trust_remote_code = bool(cli_args.trust_remote_code)
        self.opts = ServerSettings.from_namespace(cli_args).cache_options()
        self._memo: dict[tuple[str, str | None, int], Any] = {}
        self._policies: dict[tuple[str, str | None], Any] = {}

    def decide(self, model_path: str, width: int, loaded: Callable[[], Any] | None = None,
               adapter: str | None = None) -> Any:
        """The GateDecision for ``width`` rows on ``model_path``; a miss probes ``loaded()``
        (the model in memory, built only then) or loads the checkpoint."""
        memo = (model_path, adapter, width)
        if memo in self._memo:  # every request after the first at a width: nothing else
            return self._memo[memo]
        from specparity.probes.gate import GateDecision, gate_check

        try:
            self._memo[memo] = gate_check(
                download(model_path), width, self.opts,
                env_prefixes=self.config.env_prefixes,
                trust_remote_code=self.trust_remote_code,
                loaded=loaded() if loaded is not None else None, adapter=adapter)
        except Exception as err:  # noqa: BLE001 (any gate failure declines: never a pass)
            reason = f"the gate could not run: {type(err).__name__}: {err}".replace('"', "'")
            line = f'specparity-gate: DECLINE width={width} key=- reason="{reason}"'
            log.warning("%s", line)
            self._memo[memo] = GateDecision(False, Verdict.NOT_RUN, False, False, "",
                                            width, reason, line)
        return self._memo[memo]

    def policy(self, model_path: str, loaded: Any | None = None,
               adapter: str | None = None) -> Any:
        """The PolicyDecision for ``model_path`` (prefill parity on ``loaded`` on a miss)."""
        from specparity.probes.gate import PolicyDecision, prompt_cache_policy

        memo = (model_path, adapter)
        if memo not in self._policies:
            try:
                decision = prompt_cache_policy(
                    download(model_path), self.opts, env_prefixes=self.config.env_prefixes,
                    trust_remote_code=self.trust_remote_code, loaded=loaded, adapter=adapter,
                    log_line=False)
            except Exception as err:  # noqa: BLE001 (a probe that cannot run: re-prefill)
                reason = f"prefill parity could not run: {type(err).__name__}: {err}"
                decision = PolicyDecision(CachePolicy.REPREFILL, Verdict.NOT_RUN.value, False,
                                          "", reason, "")
            text = f"{decision.verdict}: {decision.reason}".replace('"', "'")
            line = (f"specparity-serve: PROMPT-CACHE policy={decision.policy}"
                    f" key={decision.key[:12] or '-'} model={model_path}"
                    f" ({POLICY_MEANING[decision.policy]}) reason=\"{text}\"")
            (log.info if decision.reuse else log.warning)("%s", line)
            self._policies[memo] = decision
        return self._policies[memo]

    def known_policy(self, model_path: str, adapter: str | None) -> Any | None:
        return self._policies.get((model_path, adapter))


@functools.lru_cache(maxsize=64)
def request_names(value: str | None, default: bool = True) -> tuple[str, ...]:
    """How a request may name what the operator named: the flag's value, the path it resolved
    to when first asked (the checkpoint the server loaded at start-up), and (``default``)
    mlx-lm's ``default_model``. Not for adapters: mlx-lm reads ``adapters: default_model`` as a
    folder of that name, having unloaded the served model."""
    names: tuple[str, ...] = ("default_model",) if default else ()
    if value:
        names += (value, str(Path(value).expanduser().resolve()))
    return names


def shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."
