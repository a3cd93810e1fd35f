"""``specparity serve``: mlx-lm's server that returns classic decode's text for every request it accepts.

It is ``mlx_lm.server`` itself (its argument parser, endpoints, batching and
prompt cache), run with four subclasses and one function swapped in:

- :class:`GatedProvider` (its ModelProvider): a draft model that will not load
  is reported at start-up and the server serves classic decode instead of
  dying; a model a request names that will not load is one error line that
  says nothing about the file system;
- :class:`GatedGenerator` (its ResponseGenerator):
  - at start-up, on the generation thread and on the model it serves, asks the
    gate for the checkpoint's prompt-cache policy (``reuse`` / ``re-prefill``)
    and for the default width, before the port is served;
  - a request that would draft (a draft model, ``num_draft_tokens = K``, so
    K + 1 verify rows) asks the memoized gate about K + 1 rows: allow runs
    mlx-lm's speculative decoding, decline its classic decode;
  - every path hands the logits processors classic decode's history, the
    whole prompt plus every emitted token
    (:func:`specparity.mlx_server.missing_prefix`, :func:`~specparity.mlx_server.with_history`);
  - under ``re-prefill``, requests are served one at a time by classic
    prefill (mlx-lm's batch path prefills prompt segments separately);
  - a request whose client left stops (:mod:`.cancel`);
- :class:`ExactPromptCache` (its prompt cache, :mod:`.cache`): exact entries,
  reused as the policy allows;
- :class:`GatedHandler` (its APIHandler): ``/metrics`` (Prometheus), the
  ``speculative`` and ``timings`` fields on each completion, streamed or not,
  and only the checkpoint the operator named (``--allow-request-models``
  lets requests name others).

mlx-lm's sequential path (``serve_single``) calls the module's ``stream_generate``;
in this process that name is :meth:`GatedGenerator.stream_generate`, which runs
mlx-lm's own ``stream_generate`` for the chosen path. Every private method these
classes override or call is reached through :mod:`specparity.mlx_compat.server`.

The port is bound before anything loads (one ``Error:`` line, exit 4, when it
cannot be); Ctrl-C stops generation and exits 130.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from specparity.harness.gated import DEFAULT_MAX_DRAFT_TOKENS
from specparity.harness.gated.cancel import (
    Cancelled, ClientWatch, check, install_prefill_check, watching,
)
from specparity.harness.gated.stats import (
    PATH_BATCH, PATH_SEQUENTIAL, PATH_SPECULATIVE, ServeMetrics, SpecStats, rule_for,
)

from specparity.errors import EXIT_INTERRUPTED, InfrastructureError, UsageError
from specparity.inputs import check_request, config_vocab_size
from specparity.mlx_compat import download
from specparity.mlx_server import ServerSettings, fresh_cache, missing_prefix, with_history
from specparity.schema import MAX_REQUEST_BYTES, load_json
from specparity.verdicts import CachePolicy, Decision, Verdict

log = logging.getLogger("specparity.serve")

GATE_OFF_LINE = ("specparity-serve: GATE-OFF the exactness gate is disabled (--gate off):"
                 " requests with a draft model run speculative decoding unchecked")
COMPLETION_PATHS = ("/v1/completions", "/v1/chat/completions", "/chat/completions")  # mlx-lm's POSTs
STOP_TIMEOUT = 10.0  # seconds Ctrl-C waits for the generation thread before exiting anyway
POLICY_MEANING = {
    CachePolicy.REUSE: "cached prompt prefixes are reused",
    CachePolicy.REPREFILL: ("a cached prefix is reused only where it was computed by the calls a"
                            " fresh prefill makes, else the prompt is prefilled again; requests"
                            " are served one at a time"),
}


class _ArgumentParser(argparse.ArgumentParser):
    """mlx-lm's flags, with a bad one reported as specparity's one-line usage error."""

    def error(self, message: str) -> Any:
        raise UsageError(message)


class _ArgparseShim:
    """``mlx_lm.server.argparse`` in this process: the same module, our parser class."""

    def __getattr__(self, name: str) -> Any:
        return _ArgumentParser if name == "ArgumentParser" else getattr(argparse, name)


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


def _names(value: str | None, default: bool = True) -> list[str]:
    """How a request may name what the operator named: the flag's value, the path it resolves
    to, and (``default``) mlx-lm's ``default_model``. Not for adapters: mlx-lm reads
    ``adapters: default_model`` as a folder of that name, having unloaded the served model."""
    names = ["default_model"] if default else []
    if value:
        names += [value, str(Path(value).expanduser().resolve())]
    return names


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _classes(config: ServeConfig) -> tuple[Any, Any, Any]:
    """The subclasses, built on first use so importing this module does not import mlx."""
    import mlx_lm.server as up

    from specparity.harness.gated.cache import SplitCache, catch_up, offsets
    from specparity.mlx_compat.server import Generator, Handler, Provider, upstream_stream_generate

    upstream = upstream_stream_generate()

    class GatedProvider(Provider):
        """Loads as mlx-lm does; a draft model that fails to load leaves a classic server."""

        # mlx-lm sets these to None in __init__ unannotated, so mypy would infer type None
        model_key: Any
        draft_model: Any

        def __init__(self, cli_args: argparse.Namespace):
            super().__init__(cli_args)
            self.draft_error: str | None = None

        def load_checkpoint(self, model_path: Any, adapter_path: Any = None,
                            draft_model_path: Any = None) -> None:
            self.draft_error = None
            try:
                super().load_checkpoint(model_path, adapter_path, draft_model_path)
            except Exception as err:
                if draft_model_path is None or draft_model_path != self.cli_args.draft_model:
                    raise  # a request's own draft_model: load() reports it
                self.draft_error = f"draft model {draft_model_path} would not load: {err}"
                log.error("specparity-serve: DRAFT-UNAVAILABLE %s; serving classic decode",
                          self.draft_error)
                super().load_checkpoint(model_path, adapter_path, None)
                self.model_key = (model_path, adapter_path, draft_model_path)

        def load(self, model_path: Any, adapter_path: Any = None,
                 draft_model_path: Any = None) -> Any:
            try:
                return super().load(model_path, adapter_path, draft_model_path)
            except Exception as err:
                detail = f"{type(err).__name__}: {err}".splitlines()[0]
                log.error("specparity-serve: MODEL-UNAVAILABLE model=%s adapter=%s draft=%s: %s",
                          model_path, adapter_path, draft_model_path, detail)
                # the client learns nothing about the file system from this answer
                raise ModelUnavailable(f"model {_shown(model_path)} could not be loaded",
                                       detail) from None

    class GatedGenerator(Generator):
        """mlx-lm's generation loop with the gate in its speculative path."""

        model_provider: GatedProvider

        def __init__(self, model_provider: GatedProvider, prompt_cache: Any,
                     metrics: ServeMetrics, gate: GateMemo):
            self.config = config
            self.metrics = metrics
            self.gate = gate
            self.started = threading.Event()
            self.startup_error: BaseException | None = None
            self._active: tuple[SpecStats, Any] | None = None
            self._pending: SpecStats | None = None
            self._finish_lock = threading.Lock()
            self.vocab: int | None = None  # the operator's model's (and drafter's) vocabulary
            prompt_cache.policy_for = self.policy_for
            prompt_cache.on_lookup = self.on_lookup
            super().__init__(model_provider, prompt_cache)

        # -- start-up and shutdown -----------------------------------------------------------
        def run_generate(self) -> None:
            try:
                self.startup()
            except BaseException as err:  # noqa: BLE001 (reported by serve() on the main thread)
                self.startup_error = err
                self.started.set()
                return
            self.started.set()
            super().run_generate()

        def startup(self) -> None:
            """Load the default model; its policy and default width, decided on it."""
            provider: Any = self.model_provider
            provider.load_default()
            if provider.model is None:
                return
            self.vocab = served_vocab(provider.model, provider.draft_model)
            decision = self.policy_now()
            self.metrics.set_policy(str(decision.policy))
            cli = provider.cli_args
            if self.config.gate and provider.draft_model is not None:
                self.gate.decide(str(provider.model_key[0]), cli.num_draft_tokens + 1,
                                 lambda: loaded_model(provider), provider.model_key[1])

        def shutdown(self, timeout: float) -> None:
            """Stop generating (the active request cancelled) and wait up to ``timeout`` s."""
            self.request_stop()
            active = self._active
            if active is not None:
                active[0].cancel("the server is stopping")
            self.join_generation(timeout)

        # -- the prompt-cache policy -----------------------------------------------------------
        def policy_now(self) -> Any:
            """The loaded model's policy (probed on it on first use)."""
            provider: Any = self.model_provider
            path, adapter = str(provider.model_key[0]), provider.model_key[1]
            known = self.gate.known_policy(path, adapter)
            return known or self.gate.policy(path, loaded_model(provider), adapter)

        def policy_for(self, model_key: Any) -> CachePolicy:
            provider: Any = self.model_provider
            if tuple(model_key) != tuple(provider.model_key or ()):
                return CachePolicy.REPREFILL  # not the loaded model: nothing proven
            return self.policy_now().policy

        def on_lookup(self, lookup: Any) -> None:
            if self._pending is not None:
                self._pending.prompt_cache = lookup.to_dict()
                self._pending = None

        def is_batchable(self, args: Any) -> bool:
            # mlx-lm's batch path prefills a chat prompt's segments separately: a chunked
            # prefill, exact only where the policy says chunking does not matter
            if not super().is_batchable(args):
                return False
            provider: Any = self.model_provider
            m, a = provider.resolve(args.model.model, args.model.adapter)
            known = self.gate.known_policy(str(m), a)
            return known is not None and known.reuse

        # -- the request being served (one generation thread) ----------------------------------
        def generate(self, request: Any, generation_args: Any,
                     progress_callback: Any = None) -> Any:
            if not config.allow_request_models:
                # the handler let through only names of the operator's checkpoint: load the key
                # loaded at start-up (a name as spelled reloads it, and a model named by its path
                # loses --adapter-path); adapter None is what mlx-lm passes for no "adapters"
                generation_args.model = up.ModelDescription(
                    "default_model", "default_model", None)  # type: ignore[arg-type]
            stats = getattr(request, "specparity", None)
            if stats is not None:  # before the generation thread can read them
                stats.temperature = float(generation_args.sampling.temperature or 0.0)
                stats.seed = generation_args.seed
            ctx, response = super().generate(request, generation_args, progress_callback)
            if stats is None:
                return ctx, response
            stats.ctx = ctx
            if stats.gone.is_set():
                ctx.stop()

            def counted() -> Iterator[Any]:
                # mlx-lm's batch loop reports its tokens only here; _serve_single's
                # (stream_generate below) count their own, with their draft flags
                for r in response:
                    if not stats.single:
                        stats.add(r.token, False)
                    yield r

            return ctx, counted()

        def await_response(self, response_queue: Any) -> Any:
            # a handler thread waiting for its request's next item: gives up when its client
            # left (mlx-lm's batch loop drops a stopped request without a word to its queue)
            from queue import Empty

            while True:
                try:
                    return response_queue.get(timeout=0.25)
                except Empty:
                    if not self.generation_available():
                        raise RuntimeError("generation thread died") from None
                    check()

        def serve_single(self, request: Any, stream: Any) -> None:
            _rqueue, req, args = request
            stats = getattr(req, "specparity", None)
            self._active = (stats, args) if stats is not None else None
            try:
                super().serve_single(request, stream)
            finally:
                if stats is not None and not stats.finished:
                    self.finish(stats)
                self._active = None
                self._pending = None

        def tokenize(self, tokenizer: Any, request: Any, args: Any) -> Any:
            out = super().tokenize(tokenizer, request, args)
            stats = getattr(request, "specparity", None)
            if stats is not None:
                stats.prompt_ids = [int(t) for t in out[0]]
                self._pending = stats  # the lookup that follows is this request's
                if self._active is None or self._active[0] is not stats:
                    stats.path = PATH_BATCH  # mlx-lm tokenizes here as it admits it to its batch
            return out

        def finish(self, stats: SpecStats) -> None:
            """Log the request's line and count it, once."""
            with self._finish_lock:
                if stats.finished:
                    return
                stats.finished = True
            if stats.gone.is_set() and stats.cancelled is None:  # mlx-lm's batch loop stopped it
                stats.cancelled = "decode" if stats.tokens else "prefill"
            self.metrics.observe(stats)  # first: whoever reads the line finds it counted
            if stats.cancelled is not None:
                log.warning("%s", stats.cancel_line())
            level = logging.INFO if stats.engaged else logging.WARNING
            if stats.width is not None and log.isEnabledFor(level):  # (--log-level WARNING: no work)
                log.log(level, "%s", stats.log_line())

        def stream_generate(self, model: Any, tokenizer: Any, prompt: Any, max_tokens: int = 256,
                            draft_model: Any = None, **kwargs: Any) -> Iterator[Any]:
            """mlx-lm's stream_generate on the path the gate chose, with classic decode's
            processor history; counts the rounds and stops when the client leaves."""
            if self._active is None:
                yield from upstream(model, tokenizer, prompt, max_tokens,
                                                    draft_model=draft_model, **kwargs)
                return
            import mlx.core as mx

            stats, args = self._active
            stats.single = True
            if stats.gone.is_set():
                stats.cancelled = "queued"
                raise Cancelled("the client closed its connection before its turn")
            provider: Any = self.model_provider
            cache = kwargs.pop("prompt_cache", None)
            k = kwargs.get("num_draft_tokens", 0)
            stats.max_tokens = max_tokens
            stats.rule = rule_for(args.sampling.temperature)
            if draft_model is not None or provider.draft_error:
                stats.num_draft_tokens, stats.width = k, k + 1
            engage = draft_model is not None and self._engage(stats, provider, cache, model,
                                                               kwargs)
            n_target = len(model.layers)
            fed = [int(t) for t in (prompt.tolist() if hasattr(prompt, "tolist") else prompt)]
            try:
                prefix = missing_prefix(stats.prompt_ids, fed, engage) if stats.prompt_ids else []
            except ValueError as err:
                # what mlx-lm feeds is not the prompt past its cached prefix: nothing says what
                # that cache holds, so the request runs as a fresh one does
                if kwargs.get("input_embeddings") is not None:  # its image rows are for `fed`
                    raise ValueError(f"{err}; an image request cannot be prefilled again") from None
                engage = False
                prompt, fed, prefix = mx.array(stats.prompt_ids), list(stats.prompt_ids), []
                if cache is not None:
                    cache[:] = fresh_cache(model, draft_model)
                self._fresh_request(stats, f"{err}; served by classic decode on a fresh cache")
            stats.path = PATH_SPECULATIVE if engage else PATH_SEQUENTIAL
            start = offsets(cache[:n_target]) if cache is not None else None
            if kwargs.get("logits_processors"):
                kwargs["logits_processors"] = with_history(kwargs["logits_processors"], prefix)
            if args.seed is not None:  # again: a gate probe above must not move the draws
                mx.random.seed(args.seed)
            split = SplitCache(cache if cache is not None else [])
            if engage:
                gen = upstream(model, tokenizer, prompt, max_tokens,
                                               draft_model=draft_model, prompt_cache=split,
                                               **kwargs)
            else:  # classic decode on the target's layers only
                target = split[:n_target] if cache is not None else None
                gen = upstream(model, tokenizer, prompt, max_tokens,
                                               prompt_cache=target, **kwargs)
            # completed: mlx-lm files the cache next (it was read to its end, or closed by
            # mlx-lm after a finish, a stop word or a stop); False: an error, nothing filed
            completed = False
            prompt_cache: Any = self.prompt_cache
            prompt_cache.held_next = None
            watching(stats.gone)
            try:
                for resp in gen:
                    stats.add(resp.token, resp.from_draft)
                    if resp.finish_reason is not None:
                        self.finish(stats)
                    yield resp
                    if stats.gone.is_set():
                        break
                completed = True
            except GeneratorExit:
                completed = True
                raise
            except Cancelled:
                stats.cancelled = "prefill" if not stats.tokens else "decode"
                raise
            finally:
                watching(None)
                gen.close()  # mlx-lm rewinds its caches in its own finally
                if stats.gone.is_set() and stats.cancelled is None:
                    stats.cancelled = "decode" if stats.tokens else "prefill"
                if not stats.finished:  # the server stopped early (a stop word, a client gone)
                    self.finish(stats)
                if cache is not None:
                    cache[:] = list(split)
                    if completed:
                        self._file_next(stats)
                        if not engage and len(cache) > n_target:
                            self._catch_up_drafter(cache, n_target, start, fed + stats.tokens)

        @staticmethod
        def _fresh_request(stats: SpecStats, reason: str) -> None:
            """Say (response, log line) that the request runs classic decode from an empty cache."""
            n = len(stats.prompt_ids)
            pc = dict(stats.prompt_cache or {"policy": CachePolicy.REPREFILL.value, "shared": 0})
            pc.update(prompt_tokens=n, reused=0, prefilled=n, reason=reason,
                      outcome="re-prefilled" if pc.get("shared") else "miss")
            stats.prompt_cache = pc
            stats.engaged = False
            stats.reason = reason
            log.warning("specparity-serve: FRESH-CACHE request=%s reason=\"%s\"",
                        stats.request_id, reason.replace('"', "'"))

        def _file_next(self, stats: SpecStats) -> None:
            """Tell the prompt cache how the entry mlx-lm files next was computed."""
            pc = stats.prompt_cache or {}
            if pc.get("policy") == CachePolicy.REPREFILL.value:
                # everything reused was proven fresh-alike, the rest was a fresh prefill
                prompt_cache: Any = self.prompt_cache
                prompt_cache.held_next = len(stats.prompt_ids) - 1

        def _engage(self, stats: SpecStats, provider: GatedProvider, cache: Any, model: Any,
                    kwargs: dict[str, Any]) -> bool:
            """Whether this request drafts; fills the decision fields of ``stats``."""
            from mlx_lm.models.cache import can_trim_prompt_cache

            n_target = len(model.layers)
            if kwargs.get("input_embeddings") is not None:
                stats.reason = "mlx-lm's speculative decoding does not take image inputs"
                return False
            if cache is not None and not can_trim_prompt_cache(cache[:n_target]):
                kinds = sorted({type(c).__name__ for c in cache[:n_target] if not c.is_trimmable()})
                stats.reason = (f"cannot draft: the target's cache ({', '.join(kinds)}) cannot be"
                                " rewound")
                return False
            if not self.config.gate:
                stats.engaged = True
                stats.reason = "gate off"
                return True
            assert provider.model_key is not None  # a model is loaded
            decision = self.gate.decide(str(provider.model_key[0]), stats.width or 1,
                                        lambda: loaded_model(provider), provider.model_key[1])
            stats.gate_key = decision.key[:12]
            stats.reason = f"{decision.verdict}: {decision.reason}"
            stats.forfeit = decision.forfeit
            stats.decision = (Decision.FORFEIT if decision.forfeit
                              else Decision.ALLOW if decision.allow else Decision.DECLINE).value
            stats.engaged = decision.allow
            stats.declined = not decision.allow
            return decision.allow

        def _catch_up_drafter(self, cache: list[Any], n_target: int, start: list[int] | None,
                              new_tokens: list[int]) -> None:
            """After classic decode, run the drafter over what the target ran since ``start``."""
            draft_model = self.model_provider.draft_model
            if draft_model is None or start is None:
                return
            target_now = offsets(cache[:n_target])
            draft = list(cache[n_target:])
            draft_now = offsets(draft)
            if target_now is None or draft_now is None or not draft_now:
                return
            t0, t1, d = min(start), min(target_now), min(draft_now)
            if not (t0 <= d <= t1):
                return
            missed = new_tokens[d - t0:t1 - t0]
            s = ServerSettings.from_namespace(self.model_provider.cli_args)
            catch_up(draft_model, draft, missed, step=s.prefill_step_size, kv_bits=s.kv_bits,
                     kv_group_size=s.kv_group_size, quantized_kv_start=s.quantized_kv_start)
            cache[n_target:] = list(draft)

    class GatedHandler(Handler):
        """mlx-lm's handler plus ``/metrics``, the per-response facts, and the operator's models."""

        metrics: ServeMetrics
        response_generator: GatedGenerator
        watch: ClientWatch | None = None

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                body, content_type = self.metrics.exposition()
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            if path.startswith("/v1/models") and not config.allow_request_models:
                self._send_json(200, {"object": "list", "data": [
                    {"id": m, "object": "model", "created": self.created}
                    for m in [self.response_generator.cli_args.model] if m]})
                return
            super().do_GET()

        def do_POST(self) -> None:
            """Read the body bounded (size, UTF-8, JSON nesting) before mlx-lm's handler parses it:
            mlx-lm's reader waits for any Content-Length and drops the connection on bytes that are
            not UTF-8 or nest past Python's recursion limit."""
            if self.path not in COMPLETION_PATHS or self.headers.get("Content-Length") is None:
                super().do_POST()  # 404 or 411, as mlx-lm answers them
                return
            raw = self._bounded_body()
            if raw is None:
                return
            try:
                load_json(raw, "request body")
            except UsageError as err:
                self._send_json(400, {"error": str(err)})
                return
            # mlx-lm's handler reads the body again: from these bytes, then the connection again
            connection_rfile, self.rfile = self.rfile, io.BytesIO(raw)
            try:
                super().do_POST()
            finally:
                self.rfile = connection_rfile

        def _bounded_body(self) -> bytes | None:
            """The body's bytes; None when refused (answered, the connection closed) or cut short."""
            text = self.headers.get("Content-Length", "")
            try:
                n = int(text)
            except ValueError:
                n = -1
            if n < 0 or n > MAX_REQUEST_BYTES:
                self.close_connection = True  # the body is not read: nothing else on this connection
                status = 413 if n > MAX_REQUEST_BYTES else 400
                why = (f"more than the {MAX_REQUEST_BYTES} bytes a request may hold" if status == 413
                       else "not a byte count")
                self._send_json(status, {"error": f"Content-Length {_shown(text)}: {why}"})
                return None
            raw = self.rfile.read(n)
            if len(raw) < n:  # the client left mid-body
                self.close_connection = True
                return None
            return raw

        def validate_model_parameters(self) -> None:
            """mlx-lm's checks, after specparity's (:func:`specparity.inputs.check_request`): every
            field that reaches the sampler, the processors or the loop in the range that cannot fail
            or crash there, token ids within the vocabulary of the model that will serve it."""
            vocab, unknown = self._request_vocab()
            if unknown is not None and (self.body.get("logit_bias") or self.body.get("top_k")):
                raise ValueError(f"request field {'logit_bias' if self.body.get('logit_bias') else 'top_k'}:"
                                 f" cannot be checked against {unknown}'s vocabulary here")
            try:
                check_request(self.body, vocab)
            except UsageError as err:
                raise ValueError(str(err)) from None
            super().validate_model_parameters()

        def _request_vocab(self) -> tuple[int | None, str | None]:
            """(the vocabulary the request's ids must fit, None) or (None, the model whose is unknown)."""
            cli = self.response_generator.cli_args
            vocab = self.response_generator.vocab
            model, draft = self.body.get("model", "default_model"), self.body.get("draft_model", "default_model")
            for value, named in ((model, cli.model), (draft, cli.draft_model)):
                if not config.allow_request_models or not isinstance(value, str) or value in _names(named):
                    continue  # the operator's, or refused before it loads (a name that is not a string: 400)
                other = config_vocab_size(value) if value else None
                if other is None:
                    return None, _shown(value)
                vocab = other if vocab is None else min(vocab, other)
            return vocab, None

        def _send_json(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.set_completion_headers(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _refusal(self) -> tuple[int, str] | None:
            """(status, message) when the request asks for what this server does not serve."""
            cli = self.response_generator.cli_args
            k = self.num_draft_tokens  # a flag's default above the limit was refused at start-up
            if "num_draft_tokens" in self.body and isinstance(k, int) and k > config.max_draft_tokens:
                return 400, (f"num_draft_tokens {k} is more than this server allows"
                             f" ({config.max_draft_tokens}: specparity serve --max-draft-tokens)")
            if config.allow_request_models:
                return None
            asked = (("model", self.requested_model, cli.model),
                     ("draft_model", self.requested_draft_model, cli.draft_model),
                     ("adapters", self.adapter, cli.adapter_path))
            for field_name, value, named in asked:
                if field_name == "adapters" and value is None:
                    continue
                if value not in _names(named, default=field_name != "adapters"):
                    return 404, (f"{field_name} {_shown(value)} is not served here: this server"
                                 " serves what its operator named (GET /v1/models)")
            return None

        def handle_completion(self, request: Any, stop_words: Any) -> None:
            refused = self._refusal()
            if refused is not None:
                self._send_json(refused[0], {"error": refused[1]})
                return
            self.spec = SpecStats(request_id=getattr(self, "request_id", ""),
                                  max_tokens=self.max_tokens)
            generator: Any = self.response_generator
            provider = generator.model_provider
            if provider.draft_error:
                self.spec.reason = provider.draft_error
                self.spec.num_draft_tokens = self.num_draft_tokens
                self.spec.width = self.num_draft_tokens + 1
            request.specparity = self.spec
            watch = self.watch = ClientWatch(self.connection, self.spec.cancel).start()
            watching(self.spec.gone)  # this handler thread stops waiting once its client left
            try:
                super().handle_completion(request, stop_words)
            except (Cancelled, BrokenPipeError, ConnectionResetError):
                self.spec.gone.set()  # the client is gone: nothing to answer
                self.close_connection = True
            finally:
                watching(None)
                watch.stop()
            if not self.spec.finished:  # served by mlx-lm's batch loop, or never started
                generator.finish(self.spec)

        def generate_response(self, text: Any, finish_reason: Any, *args: Any,
                              **kwargs: Any) -> dict[str, Any]:
            if finish_reason is not None and self.watch is not None:
                # the last packet: a client that closes after reading it has not given up
                self.watch.stop()
            out = super().generate_response(text, finish_reason, *args, **kwargs)
            spec = getattr(self, "spec", None)
            if finish_reason is not None and spec is not None:
                out["speculative"] = spec.to_response()
                out["timings"] = spec.timings()
            return out

    return GatedProvider, GatedGenerator, GatedHandler


def _bind(host: str, port: int, factory: Any) -> Any:
    """The HTTP server, bound and listening (nothing served yet), or a one-line error."""
    from http.server import ThreadingHTTPServer

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as err:
        raise UsageError(f"--host {host}: cannot be resolved ({err})") from None
    family, _, _, _, address = infos[0]

    class Server(ThreadingHTTPServer):
        address_family = family
        daemon_threads = True

        def handle_error(self, request: Any, client_address: Any) -> None:
            # a client that hung up is not the server's error: one line, no traceback
            err = sys.exc_info()[1]
            if isinstance(err, ConnectionError):
                log.debug("client %s left: %s", client_address, err)
                return
            super().handle_error(request, client_address)

    try:
        # (getaddrinfo's AF_UNIX tuple shape never comes back for SOCK_STREAM on a host name)
        return Server(address, factory)  # type: ignore[arg-type]
    except OverflowError:
        raise UsageError(f"--port {port}: not a port number (0-65535)") from None
    except OSError as err:
        raise InfrastructureError(f"cannot listen on {host}:{port} ({err.strerror or err});"
                                  " choose another --port") from None


class _Starting(BaseHTTPRequestHandler):
    """What the port answers while the model loads and the gate decides: 503, then the server."""

    def _starting(self) -> None:
        body = json.dumps({"status": "starting", "error": "the server is starting"}).encode()
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Retry-After", "1")
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _starting

    def log_message(self, format: str, *args: Any) -> None:
        pass  # readiness polls: not worth a line each


def _interrupted(generator: Any) -> None:
    """Ctrl-C: stop generating, then leave at once with 130.

    os._exit, not an exception: MLX's C++ runtime aborts ("terminate called without
    an active exception", 134) when the interpreter tears it down while the generation
    thread or a handler thread still holds a stream.
    """
    log.warning("specparity-serve: INTERRUPTED stopping (Ctrl-C)")
    if generator is not None:
        generator.shutdown(STOP_TIMEOUT)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(EXIT_INTERRUPTED)


def serve(argv: list[str], config: ServeConfig | None = None) -> None:
    """Run mlx-lm's server with ``argv`` (its own flags) until interrupted."""
    import mlx_lm.server as up

    from specparity.mlx_compat.server import route_stream_generate, run_server_main

    config = config or ServeConfig()
    provider_cls, generator_cls, handler_cls = _classes(config)

    def run(host: str, port: int, model_provider: Any, **_: Any) -> None:
        from specparity.harness.gated.cache import ExactPromptCache

        cli = model_provider.cli_args
        if not cli.model and not config.allow_request_models:
            raise UsageError("--model is required (or --allow-request-models, to let each"
                             " request name its checkpoint)")
        if cli.draft_model and cli.num_draft_tokens > config.max_draft_tokens:
            raise UsageError(f"--num-draft-tokens {cli.num_draft_tokens}: more than"
                             f" --max-draft-tokens {config.max_draft_tokens}")
        metrics = ServeMetrics(max_width=config.max_draft_tokens + 1)
        handler_cls.metrics = metrics
        holder: dict[str, Any] = {}

        def factory(*args: Any, **kwargs: Any) -> Any:
            generator = holder.get("ready")
            if generator is None:
                return _Starting(*args, **kwargs)
            return handler_cls(generator, *args,
                               system_fingerprint=up.get_system_fingerprint(), **kwargs)

        httpd = _bind(host, port, factory)  # before any thread: a failure here just exits
        # the port answers (503) at once; the model loads and the gate decides on the
        # generation thread, then requests are served
        serving = threading.Thread(target=httpd.serve_forever, name="specparity-http",
                                   daemon=True)
        serving.start()
        generator = None
        try:
            if not config.gate:
                log.warning("%s", GATE_OFF_LINE)
            install_prefill_check()
            gate = GateMemo(config, cli)
            settings = ServerSettings.from_namespace(cli)
            quantized_start = settings.quantized_kv_start if settings.kv_bits is not None else None
            prompt_cache = ExactPromptCache(settings.prompt_cache_size, step=settings.prefill_step_size,
                                            quantized_kv_start=quantized_start)
            generator = generator_cls(model_provider, prompt_cache, metrics, gate)
            route_stream_generate(generator.stream_generate)
            while not generator.started.wait(0.5):
                pass
            if generator.startup_error is not None:
                err = generator.startup_error
                detail = getattr(err, "detail", None) or f"{type(err).__name__}: {err}"
                raise InfrastructureError(f"--model {cli.model}: would not load"
                                          f" ({str(detail).splitlines()[0]})")
            holder["ready"] = generator
            log.info("Starting httpd at %s on port %s...", host, port)
            while serving.is_alive():
                serving.join(0.5)
        except KeyboardInterrupt:
            httpd.shutdown()  # refuse new requests while generation stops
            _interrupted(generator)
        finally:
            httpd.shutdown()
            httpd.server_close()

    # mlx-lm configures logging itself; a handler installed earlier would silence it
    for h in list(logging.root.handlers):
        logging.root.removeHandler(h)
    run_server_main("specparity serve", argv, argparse_module=_ArgparseShim(), provider_cls=provider_cls, run=run)
