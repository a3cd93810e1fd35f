"""A client that gives up cancels its generation.

mlx-lm 0.32's server notices a departed client only when it next writes to it:
a non-streamed request writes nothing until its last token, and nothing is
checked during prefill, so a long prompt keeps the server busy for minutes
after the client left. Two parts fix that:

- :class:`ClientWatch` watches the request's connection from the handler
  thread's side (a peek every ``interval`` seconds) and calls ``on_gone`` when
  the client closes it;
- :func:`install_prefill_check` makes mlx-lm's own per-chunk hook (the KV
  quantization step both ``generate_step`` and ``speculative_generate_step``
  call after every prefill chunk and every decode step) raise :class:`Cancelled`
  for the request this thread is generating for, once its client is gone.
"""

from __future__ import annotations

import select
import socket
import threading
from collections.abc import Callable
from typing import Any

WATCH_INTERVAL = 0.2


class Cancelled(Exception):
    """The request's client closed its connection; its generation stopped."""


class ClientWatch:
    """Calls ``on_gone`` once when the peer of ``sock`` closes the connection."""

    def __init__(self, sock: socket.socket, on_gone: Callable[[], None],
                 interval: float = WATCH_INTERVAL):
        self.sock = sock
        self.on_gone = on_gone
        self.interval = interval
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="specparity-client-watch",
                                        daemon=True)

    def start(self) -> ClientWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._done.set()

    def _run(self) -> None:
        while not self._done.is_set():
            try:
                readable, _, _ = select.select([self.sock], [], [], self.interval)
                if not readable:
                    continue
                data = self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except BlockingIOError:
                continue
            except (OSError, ValueError):  # reset, or closed under us: gone
                data = b""
            if self._done.is_set():
                return
            if data == b"":
                self.on_gone()
            return  # gone, or the client sent more (a pipelined request): stop watching


_current = threading.local()


def watching(event: threading.Event | None) -> None:
    """Make ``event`` the cancel flag of the request this thread generates for (None: none)."""
    _current.event = event


def check() -> None:
    """Raise Cancelled when the request this thread generates for has lost its client."""
    event = getattr(_current, "event", None)
    if event is not None and event.is_set():
        raise Cancelled("the client closed its connection")


def install_prefill_check() -> None:
    """Route mlx-lm's per-chunk KV quantization hook through :func:`check` (idempotent)."""
    from specparity.mlx_compat import generate_module, replace_in_generate

    original: Any = getattr(generate_module(), "maybe_quantize_kv_cache")
    if getattr(original, "specparity_checked", False):
        return

    def checked(prompt_cache: Any, quantized_kv_start: int, kv_group_size: int,
                kv_bits: int | None) -> None:
        check()
        original(prompt_cache, quantized_kv_start, kv_group_size, kv_bits)

    checked.specparity_checked = True  # type: ignore[attr-defined]
    replace_in_generate("maybe_quantize_kv_cache", checked)
