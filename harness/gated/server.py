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
import json
import logging
import os
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any

from specparity.errors import EXIT_INTERRUPTED, InfrastructureError, UsageError
from specparity.harness.gated.cancel import install_prefill_check
from specparity.harness.gated.gate import GateMemo, ServeConfig
from specparity.harness.gated.stats import ServeMetrics
from specparity.mlx_server import ServerSettings

log = logging.getLogger("specparity.serve")

GATE_OFF_LINE = ("specparity-serve: GATE-OFF the exactness gate is disabled (--gate off):"
                 " requests with a draft model run speculative decoding unchecked")
STOP_TIMEOUT = 10.0  # seconds Ctrl-C waits for the generation thread before exiting anyway


class _ArgumentParser(argparse.ArgumentParser):
    """mlx-lm's flags, with a bad one reported as specparity's one-line usage error."""

    def error(self, message: str) -> Any:
        raise UsageError(message)


class _ArgparseShim:
    """``mlx_lm.server.argparse`` in this process: the same module, our parser class."""

    def __getattr__(self, name: str) -> Any:
        return _ArgumentParser if name == "ArgumentParser" else getattr(argparse, name)


def _classes() -> tuple[Any, Any, Any]:
    """The subclasses (:mod:`.classes`), imported on first use so importing this module does not import mlx."""
    from specparity.harness.gated.classes import GatedGenerator, GatedHandler, GatedProvider

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

    from specparity.mlx_compat.server import require_hooks, route_stream_generate, run_server_main

    require_hooks()
    config = config or ServeConfig()
    provider_cls, generator_cls, handler_cls = _classes()

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
