"""``mlx_lm.server``'s classes with the private methods ``specparity serve`` overrides or calls
under public names, and the module globals it rebinds (see the table in :mod:`specparity.mlx_compat`).

Importing this module imports ``mlx_lm.server``: import it where the server runs.
Override the public name; ``super().<name>`` runs mlx-lm's own.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import mlx_lm.server as up

from specparity.errors import InfrastructureError
from specparity.mlx_compat import check_version, mlx_lm_version

check_version()
# the private methods of mlx_lm.server's classes the classes below override or call (0.31 lacks two)
HOOKS: dict[str, tuple[str, ...]] = {
    "ModelProvider": ("_load",),
    "ResponseGenerator": ("_run_generate", "_is_batchable", "_await_response", "_serve_single", "_tokenize"),
    "APIHandler": ("_set_completion_headers",),
}
# mlx-lm's own classes and stream_generate, as this module first saw them (run_server_main and
# route_stream_generate rebind the module's globals)
_UPSTREAM_STREAM_GENERATE = up.stream_generate


class Provider(up.ModelProvider):
    """``load_checkpoint`` (mlx-lm's ``_load``) and ``resolve`` (its name maps)."""

    def _load(self, model_path: Any, adapter_path: Any = None, draft_model_path: Any = None) -> None:
        self.load_checkpoint(model_path, adapter_path, draft_model_path)

    def load_checkpoint(self, model_path: Any, adapter_path: Any = None, draft_model_path: Any = None) -> None:
        super()._load(model_path, adapter_path, draft_model_path)

    def resolve(self, model: Any, adapter: Any) -> tuple[Any, Any]:
        """(checkpoint, adapter) a request's names load, as the provider maps them."""
        return self._model_map.get(model, model), self._adapter_map.get(model, adapter)


class Generator(up.ResponseGenerator):
    """``run_generate``, ``is_batchable``, ``await_response``, ``serve_single``, ``tokenize``
    (mlx-lm's ``_``-named methods), ``request_stop`` and ``join_generation`` (its ``_stop`` and
    ``_generation_thread``)."""

    def _run_generate(self) -> None:
        self.run_generate()

    def run_generate(self) -> None:
        super()._run_generate()

    def _is_batchable(self, args: Any) -> bool:
        return self.is_batchable(args)

    def is_batchable(self, args: Any) -> bool:
        return bool(super()._is_batchable(args))

    def _await_response(self, response_queue: Any) -> Any:
        return self.await_response(response_queue)

    def await_response(self, response_queue: Any) -> Any:
        return super()._await_response(response_queue)

    def _serve_single(self, request: Any, stream: Any) -> None:
        self.serve_single(request, stream)

    def serve_single(self, request: Any, stream: Any) -> None:
        super()._serve_single(request, stream)

    def _tokenize(self, tokenizer: Any, request: Any, args: Any) -> Any:
        return self.tokenize(tokenizer, request, args)

    def tokenize(self, tokenizer: Any, request: Any, args: Any) -> Any:
        return super()._tokenize(tokenizer, request, args)

    def request_stop(self) -> None:
        """Tell the generation thread to stop after its current step."""
        self._stop = True

    def join_generation(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for the generation thread to end."""
        self._generation_thread.join(timeout)


class Handler(up.APIHandler):
    """``set_completion_headers`` (mlx-lm's ``_set_completion_headers``)."""

    def set_completion_headers(self, status: int) -> None:
        self._set_completion_headers(status)


def missing_hooks() -> list[str]:
    """The :data:`HOOKS` the installed mlx_lm.server lacks, as ``Class._method`` (sorted)."""
    return sorted(f"{cls}.{name}" for cls, names in HOOKS.items() for name in names
                  if not hasattr(getattr(up, cls), name))


def require_hooks() -> None:
    """Raise InfrastructureError naming the installed mlx-lm when its server lacks a hook: without
    them ``specparity serve`` would never finish starting (mlx-lm 0.31 has no ``_run_generate``)."""
    missing = missing_hooks()
    if missing:
        raise InfrastructureError(
            f"specparity serve needs mlx-lm 0.32 or later: mlx-lm {mlx_lm_version()}'s server has no"
            f" {', '.join(missing)} to hook (pip install 'mlx-lm>=0.32')")


def upstream_stream_generate() -> Any:
    """mlx-lm's own ``stream_generate``, as ``mlx_lm.server`` imported it."""
    return _UPSTREAM_STREAM_GENERATE


def route_stream_generate(fn: Callable[..., Any]) -> None:
    """Make ``mlx_lm.server``'s sequential path (``_serve_single``) call ``fn`` for ``stream_generate``."""
    setattr(up, "stream_generate", fn)


def run_server_main(argv0: str, argv: list[str], *, argparse_module: Any, provider_cls: type,
                    run: Callable[..., None]) -> None:
    """Run ``mlx_lm.server.main()`` with its ``argparse``, ``ModelProvider`` and ``run`` globals
    rebound (its parser, provider class and serving loop are looked up there at call time)."""
    setattr(up, "argparse", argparse_module)
    setattr(up, "ModelProvider", provider_cls)
    setattr(up, "run", run)
    old_argv = sys.argv
    sys.argv = [argv0, *argv]
    try:
        up.main()
    finally:
        sys.argv = old_argv
