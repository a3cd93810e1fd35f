"""A client that gives up cancels its generation.

mlx-lm 0.32's server notices a departed client only when it next writes to it:
a non-streamed request writes nothing until its last token, and nothing is
checked during prefill, so a long prompt keeps the server busy for minutes
after the client left. Two parts fix that:

- :class:`ClientWatch` watches the request's connection from its handler thread,
  which waits for the request's next item in ``await_response``: it peeks at the
  connection (never blocking) at most every ``interval`` seconds, on each item
  and on each wait that timed out, and calls ``on_gone`` when the client closed
  it (no thread of its own: a request costs no thread start);
- :func:`install_prefill_check` makes mlx-lm's own per-chunk hook (the KV
  quantization step both ``generate_step`` and ``speculative_generate_step``
  call after every prefill chunk and every decode step) raise :class:`Cancelled`
  for the request this thread is generating for, once its client is gone.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

WATCH_INTERVAL = 0.2


class Cancelled(Exception):
    """The request's client closed its connection; its generation stopped."""


class ClientWatch:
    """Calls ``on_gone`` once when the peer of ``sock`` has closed the connection.

    Polled by the thread that serves the request (:func:`poll_client`): a peek at most every
    ``interval`` seconds, never blocking."""

    def __init__(self, sock: socket.socket, on_gone: Callable[[], None],
                 interval: float = WATCH_INTERVAL):
        self.sock = sock
        self.on_gone = on_gone
        self.interval = interval
        self.stopped = False
        self._due = time.monotonic() + interval

    def stop(self) -> None:
        self.stopped = True

    def poll(self) -> None:
        """Peek at the connection when a peek is due; ``on_gone`` if the client closed it."""
        if self.stopped:
            return
        now = time.monotonic()
        if now < self._due:
            return
        self._due = now + self.interval
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
            if not readable:
                return
            data = self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except (OSError, ValueError):  # reset, or closed under us: gone
            data = b""
        self.stopped = True  # gone, or the client sent more (a pipelined request): stop watching
        if data == b"":
            self.on_gone()


_current = threading.local()
GONE = "the client closed its connection"


def watching(event: threading.Event | None, watch: ClientWatch | None = None) -> None:
    """Make ``event`` the cancel flag of the request this thread generates for or serves, and
    ``watch`` its client's connection, polled by :func:`poll_client` (None: none)."""
    _current.event = event
    _current.watch = watch


def poll_client() -> None:
    """Poll the connection of the client this thread serves, if it watches one."""
    watch = getattr(_current, "watch", None)
    if watch is not None:
        watch.poll()


def check() -> None:
    """Raise Cancelled when the request this thread generates for has lost its client."""
    event = getattr(_current, "event", None)
    if event is not None and event.is_set():
        raise Cancelled(GONE)


def install_prefill_check() -> None:
    """Route mlx-lm's per-chunk KV quantization hook through :func:`check` (idempotent)."""
    from specparity.mlx_compat import generate_module, replace_in_generate

    original: Any = getattr(generate_module(), "maybe_quantize_kv_cache")
    if getattr(original, "specparity_checked", False):
        return

    def checked(prompt_cache: Any, quantized_kv_start: int, kv_group_size: int,
                kv_bits: int | None) -> None:
        # check()'s body, inline: mlx-lm calls this on every step (draft and verify), not only per chunk
        event = getattr(_current, "event", None)
        if event is not None and event.is_set():
            raise Cancelled(GONE)
        original(prompt_cache, quantized_kv_start, kv_group_size, kv_bits)

    checked.specparity_checked = True  # type: ignore[attr-defined]
    replace_in_generate("maybe_quantize_kv_cache", checked)
