"""``specparity serve``: mlx-lm's server with the exactness gate and per-request instrumentation.

It is ``mlx_lm.server`` itself (its argument parser, endpoints, batching and
prompt cache), run with four subclasses and one function swapped in:

- :class:`GatedProvider` (its ModelProvider): a draft model that will not load
  is reported at start-up and the server serves classic decode instead of dying;
- :class:`GatedGenerator` (its ResponseGenerator): a request that would draft
  (a draft model, ``num_draft_tokens = K``, so K + 1 verify rows) asks the
  memoized gate (``specparity.probes.gate``) about K + 1 rows; allow runs
  mlx-lm's speculative decoding, decline runs its classic decode (text
  identical to a server without a drafter), and every request's rounds are
  counted (:mod:`specparity.harness.gated.stats`);
- :class:`ExactPromptCache` (its prompt cache) and the cache fixes of
  :mod:`specparity.harness.gated.cache`;
- :class:`GatedHandler` (its APIHandler): ``/metrics`` (Prometheus), and the
  ``speculative`` and ``timings`` fields on each completion, streamed or not.

``mlx_lm.server._serve_single`` calls the module's ``stream_generate``; in
this process that name is :meth:`GatedGenerator.stream_generate`, which runs
mlx-lm's own ``stream_generate`` for the chosen path.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from collections.abc import Iterator
from typing import Any

from specparity.harness.gated.stats import ServeMetrics, SpecStats, rule_for

from specparity.errors import UsageError
from specparity.verdicts import Decision, Verdict

log = logging.getLogger("specparity.serve")

GATE_OFF_LINE = ("specparity-serve: GATE-OFF the exactness gate is disabled (--gate off):"
                 " requests with a draft model run speculative decoding unchecked")


class _ArgumentParser(argparse.ArgumentParser):
    """mlx-lm's flags, with a bad one reported as specparity's one-line usage error."""

    def error(self, message: str) -> Any:
        raise UsageError(message)


class _ArgparseShim:
    """``mlx_lm.server.argparse`` in this process: the same module, our parser class."""

    def __getattr__(self, name: str) -> Any:
        return _ArgumentParser if name == "ArgumentParser" else getattr(argparse, name)


class ServeConfig:
    """What ``specparity serve`` adds to mlx-lm's flags.

    gate: consult the gate (False: ``--gate off``, said at start-up).
    env_prefixes: environment variable prefixes the gate key includes.
    """

    def __init__(self, gate: bool = True, env_prefixes: tuple[str, ...] | None = None):
        from specparity.identity import DEFAULT_ENV_PREFIXES

        self.gate = gate
        self.env_prefixes = tuple(env_prefixes or DEFAULT_ENV_PREFIXES)


class GateMemo:
    """The gate's decisions for this process, one per (checkpoint, width).

    ``gate_check`` logs its ALLOW / DECLINE / FORFEIT line on each call, so
    asking once per width here logs it once per width per process.
    """

    def __init__(self, config: ServeConfig, cli_args: argparse.Namespace):
        from specparity.decode import CacheOptions

        self.config = config
        self.trust_remote_code = bool(cli_args.trust_remote_code)
        self.opts = CacheOptions(kv_bits=cli_args.kv_bits, kv_group_size=cli_args.kv_group_size,
                                 quantized_kv_start=cli_args.quantized_kv_start,
                                 prefill_step_size=cli_args.prefill_step_size)
        self._memo: dict[tuple[str, int], Any] = {}

    def decide(self, model_path: str, width: int) -> Any:
        """The GateDecision for ``width`` rows on ``model_path``; a gate that cannot run declines."""
        from mlx_lm.utils import _download
        from specparity.probes.gate import GateDecision, gate_check

        memo = (model_path, width)
        if memo not in self._memo:
            try:
                self._memo[memo] = gate_check(
                    _download(model_path), width, self.opts,
                    env_prefixes=self.config.env_prefixes,
                    trust_remote_code=self.trust_remote_code)
            except Exception as err:  # noqa: BLE001 (any gate failure declines: never a pass)
                reason = f"the gate could not run: {type(err).__name__}: {err}".replace('"', "'")
                line = f'specparity-gate: DECLINE width={width} key=- reason="{reason}"'
                log.warning("%s", line)
                self._memo[memo] = GateDecision(False, Verdict.NOT_RUN, False, False, "",
                                                width, reason, line)
        return self._memo[memo]


def _classes(config: ServeConfig) -> tuple[Any, Any, Any]:
    """The subclasses, built on first use so importing this module does not import mlx."""
    import mlx_lm.server as up
    from specparity.harness.gated.cache import SplitCache, catch_up, offsets

    upstream_stream_generate = up.stream_generate

    class GatedProvider(up.ModelProvider):
        """Loads as mlx-lm does; a draft model that fails to load leaves a classic server."""

        # mlx-lm sets these to None in __init__ unannotated, so mypy would infer type None
        model_key: Any
        draft_model: Any

        def __init__(self, cli_args: argparse.Namespace):
            super().__init__(cli_args)
            self.draft_error: str | None = None

        def _load(self, model_path, adapter_path=None, draft_model_path=None):
            self.draft_error = None
            try:
                super()._load(model_path, adapter_path, draft_model_path)
            except Exception as err:
                if draft_model_path is None or draft_model_path != self.cli_args.draft_model:
                    raise  # a request's own draft_model: mlx-lm's error response
                self.draft_error = f"draft model {draft_model_path} would not load: {err}"
                log.error("specparity-serve: DRAFT-UNAVAILABLE %s; serving classic decode",
                          self.draft_error)
                super()._load(model_path, adapter_path, None)
                self.model_key = (model_path, adapter_path, draft_model_path)

    class GatedGenerator(up.ResponseGenerator):
        """mlx-lm's generation loop with the gate in its speculative path."""

        model_provider: GatedProvider

        def __init__(self, model_provider: GatedProvider, prompt_cache: Any,
                     metrics: ServeMetrics, gate: GateMemo):
            self.config = config
            self.metrics = metrics
            self.gate = gate
            self._active: tuple[SpecStats, Any] | None = None
            self._finish_lock = threading.Lock()
            super().__init__(model_provider, prompt_cache)

        # -- the request being served (one generation thread) ----------------------------------
        def _serve_single(self, request, stream):
            _rqueue, req, args = request
            stats = getattr(req, "specparity", None)
            self._active = (stats, args) if stats is not None else None
            try:
                super()._serve_single(request, stream)
            finally:
                if stats is not None and not stats.finished:
                    self.finish(stats)
                self._active = None

        def _tokenize(self, tokenizer, request, args):
            out = super()._tokenize(tokenizer, request, args)
            stats = getattr(request, "specparity", None)
            if stats is not None:
                stats.prompt_ids = [int(t) for t in out[0]]
            return out

        def finish(self, stats: SpecStats) -> None:
            """Log the request's line and count it, once."""
            with self._finish_lock:
                if stats.finished:
                    return
                stats.finished = True
            if stats.width is not None:
                line = stats.log_line()
                (log.info if stats.engaged else log.warning)("%s", line)
            self.metrics.observe(stats)

        def stream_generate(self, model, tokenizer, prompt, max_tokens=256, draft_model=None,
                            **kwargs) -> Iterator[Any]:
            """mlx-lm's stream_generate on the path the gate chose; counts the rounds."""
            if self._active is None:
                yield from upstream_stream_generate(model, tokenizer, prompt, max_tokens,
                                                    draft_model=draft_model, **kwargs)
                return
            stats, args = self._active
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
            start = offsets(cache[:n_target]) if cache is not None else None
            fed = [int(t) for t in (prompt.tolist() if hasattr(prompt, "tolist") else prompt)]
            split = SplitCache(cache if cache is not None else [])
            if engage:
                gen = upstream_stream_generate(model, tokenizer, prompt, max_tokens,
                                               draft_model=draft_model, prompt_cache=split,
                                               **kwargs)
            else:  # classic decode on the target's layers only
                target = split[:n_target] if cache is not None else None
                gen = upstream_stream_generate(model, tokenizer, prompt, max_tokens,
                                               prompt_cache=target, **kwargs)
            try:
                for resp in gen:
                    stats.add(resp.token, resp.from_draft)
                    if resp.finish_reason is not None:
                        self.finish(stats)
                    yield resp
            finally:
                gen.close()  # mlx-lm rewinds its caches in its own finally
                if not stats.finished:  # the server stopped early (a stop word)
                    self.finish(stats)
                if cache is not None:
                    cache[:] = list(split)
                    if not engage and len(cache) > n_target:
                        self._catch_up_drafter(cache, n_target, start, fed + stats.tokens)

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
            decision = self.gate.decide(str(provider.model_key[0]), stats.width or 1)
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
            cli = self.model_provider.cli_args
            catch_up(draft_model, draft, missed, step=cli.prefill_step_size,
                     kv_bits=cli.kv_bits, kv_group_size=cli.kv_group_size,
                     quantized_kv_start=cli.quantized_kv_start)
            cache[n_target:] = list(draft)

    class GatedHandler(up.APIHandler):
        """mlx-lm's handler plus ``/metrics`` and the per-response speculative facts."""

        metrics: ServeMetrics
        response_generator: GatedGenerator

        def do_GET(self):
            if self.path.split("?", 1)[0] == "/metrics":
                body, content_type = self.metrics.exposition()
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            super().do_GET()

        def handle_completion(self, request, stop_words):
            self.spec = SpecStats(request_id=getattr(self, "request_id", ""))
            provider = self.response_generator.model_provider
            if provider.draft_error:
                self.spec.reason = provider.draft_error
                self.spec.num_draft_tokens = self.num_draft_tokens
                self.spec.width = self.num_draft_tokens + 1
            request.specparity = self.spec
            super().handle_completion(request, stop_words)
            if not self.spec.finished:  # served by mlx-lm's batch loop, not _serve_single
                self.response_generator.finish(self.spec)

        def generate_response(self, text, finish_reason, *args, **kwargs):
            out = super().generate_response(text, finish_reason, *args, **kwargs)
            spec = getattr(self, "spec", None)
            if finish_reason is not None and spec is not None:
                out["speculative"] = spec.to_response()
                out["timings"] = spec.timings()
            return out

    return GatedProvider, GatedGenerator, GatedHandler


def serve(argv: list[str], config: ServeConfig | None = None) -> None:
    """Run mlx-lm's server with ``argv`` (its own flags) until interrupted."""
    import mlx_lm.server as up

    config = config or ServeConfig()
    provider_cls, generator_cls, handler_cls = _classes(config)
    metrics = ServeMetrics()
    handler_cls.metrics = metrics

    def run(host: str, port: int, model_provider: Any, **_: Any) -> None:
        from specparity.harness.gated.cache import ExactPromptCache

        if not config.gate:
            log.warning("%s", GATE_OFF_LINE)
        cli = model_provider.cli_args
        gate = GateMemo(config, cli)
        if config.gate and cli.model and cli.draft_model:
            # before the server answers: the first request does not wait for a probe, and
            # the start-up decision is not logged in the middle of a request
            gate.decide(cli.model, cli.num_draft_tokens + 1)
        prompt_cache = ExactPromptCache(cli.prompt_cache_size)
        generator = generator_cls(model_provider, prompt_cache, metrics, gate)
        up.stream_generate = generator.stream_generate
        up._run_http_server(host, port, generator, handler_class=handler_cls)

    # mlx-lm configures logging itself; a handler installed earlier would silence it
    for h in list(logging.root.handlers):
        logging.root.removeHandler(h)
    up.argparse = _ArgparseShim()  # type: ignore[assignment]
    up.ModelProvider = provider_cls  # type: ignore[misc]
    up.run = run  # type: ignore[assignment]
    old_argv = sys.argv
    sys.argv = ["specparity serve", *argv]
    try:
        up.main()
    finally:
        sys.argv = old_argv

