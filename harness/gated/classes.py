"""``specparity serve``'s subclasses of mlx_lm.server's ModelProvider, ResponseGenerator and APIHandler.

Importing this module imports mlx-lm (:mod:`.server` imports it only when it serves). What each
class changes: :mod:`.server`'s docstring. Every private method these classes override or call
is reached through :mod:`specparity.mlx_compat.server`.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

import mlx_lm.server as up

from specparity.harness.gated.cache import SplitCache, catch_up, offsets
from specparity.harness.gated.cancel import (
    WATCH_INTERVAL, Cancelled, ClientWatch, check, poll_client, watching,
)
from specparity.harness.gated.gate import (
    GateMemo, ModelUnavailable, ServeConfig, loaded_model, log, request_names, served_vocab, shown,
)
from specparity.harness.gated.stats import (
    PATH_BATCH, PATH_SEQUENTIAL, PATH_SPECULATIVE, ServeMetrics, SpecStats, rule_for,
)
from specparity.errors import UsageError
from specparity.inputs import check_request, config_vocab_size
from specparity.mlx_compat.server import Generator, Handler, Provider, upstream_stream_generate
from specparity.mlx_server import ServerSettings, fresh_cache, missing_prefix, with_history
from specparity.schema import MAX_REQUEST_BYTES, load_json
from specparity.verdicts import CachePolicy, Decision

upstream = upstream_stream_generate()
COMPLETION_PATHS = ("/v1/completions", "/v1/chat/completions", "/chat/completions")  # mlx-lm's POSTs

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
            raise ModelUnavailable(f"model {shown(model_path)} could not be loaded",
                                   detail) from None


class GatedGenerator(Generator):
    """mlx-lm's generation loop with the gate in its speculative path."""

    model_provider: GatedProvider

    def __init__(self, model_provider: GatedProvider, prompt_cache: Any,
                 metrics: ServeMetrics, gate: GateMemo):
        self.config = gate.config
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
        if not self.config.allow_request_models:
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
        # a handler thread waiting for its request's next item: watches its client's connection
        # and gives up when the client left (mlx-lm's batch loop drops a stopped request without
        # a word to its queue)
        from queue import Empty

        while True:
            try:
                item = response_queue.get(timeout=WATCH_INTERVAL)
            except Empty:
                if not self.generation_available():
                    raise RuntimeError("generation thread died") from None
                poll_client()
                check()
                continue
            poll_client()
            return item

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

    @property
    def config(self) -> ServeConfig:
        return self.response_generator.config

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
        if path.startswith("/v1/models") and not self.config.allow_request_models:
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
            self._send_json(status, {"error": f"Content-Length {shown(text)}: {why}"})
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
            if not self.config.allow_request_models or not isinstance(value, str) or value in request_names(named):
                continue  # the operator's, or refused before it loads (a name that is not a string: 400)
            other = config_vocab_size(value) if value else None
            if other is None:
                return None, shown(value)
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
        if "num_draft_tokens" in self.body and isinstance(k, int) and k > self.config.max_draft_tokens:
            return 400, (f"num_draft_tokens {k} is more than this server allows"
                         f" ({self.config.max_draft_tokens}: specparity serve --max-draft-tokens)")
        if self.config.allow_request_models:
            return None
        asked = (("model", self.requested_model, cli.model),
                 ("draft_model", self.requested_draft_model, cli.draft_model),
                 ("adapters", self.adapter, cli.adapter_path))
        for field_name, value, named in asked:
            if field_name == "adapters" and value is None:
                continue
            if value not in request_names(named, default=field_name != "adapters"):
                return 404, (f"{field_name} {shown(value)} is not served here: this server"
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
        watch = self.watch = ClientWatch(self.connection, self.spec.cancel)
        # this handler thread polls its client's connection as it waits, and stops once it left
        watching(self.spec.gone, watch)
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
