"""HTTP with deadlines, below every part that talks to a server (the lifecycle's readiness poll,
the client's requests, an engine's own endpoints): a total deadline per request
(:func:`within`), never only a per-read timeout, and a body read boundedly.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast


# what one response may hold: far above any completion, far below what exhausts a machine
MAX_RESPONSE_BYTES = 64 << 20


class BadResponse(ValueError):
    """A response that is not what an OpenAI-style server sends; ``str()`` says what was wrong."""


class Late(Exception):
    """The request's total deadline passed before its answer was complete."""


T = TypeVar("T")


def loopback_client() -> Any:
    """An httpx client for the servers this process started on 127.0.0.1: plain HTTP, so no TLS context
    (building one reads the CA bundle: about 50 ms per client, 200 ms on a loaded machine, on every
    served arm), and no proxy from the environment (an ``HTTP_PROXY`` must not carry a loopback request)."""
    import httpx

    return httpx.Client(verify=False, trust_env=False)

def within(seconds: float, fn: Callable[[threading.Event], T]) -> T:
    """``fn(cancel)`` with a total deadline: its result (or its exception), or :class:`Late` once
    ``seconds`` pass. ``fn`` runs in a daemon thread and should return soon after ``cancel`` is set
    (it is set at the deadline); one blocked in a read ends when the server stops."""
    box: list[tuple[bool, Any]] = []
    cancel = threading.Event()

    def run() -> None:
        try:
            box.append((True, fn(cancel)))
        except BaseException as err:  # handed to the caller, re-raised there
            box.append((False, err))

    worker = threading.Thread(target=run, name="specparity-request", daemon=True)
    worker.start()
    try:
        worker.join(seconds)
    except BaseException:  # Ctrl-C / SIGTERM while waiting: the worker stops at its next chunk
        cancel.set()
        raise
    if not box:
        cancel.set()
        raise Late(f"no complete answer within {seconds:g} s")
    ok, value = box[0]
    if ok:
        return cast(T, value)
    raise value


def fetch(client: Any, method: str, url: str, timeout: float, json_body: Any = None,
          max_bytes: int = MAX_RESPONSE_BYTES) -> tuple[int, bytes]:
    """One request's status and whole body within ``timeout`` seconds in total (raises Late, the
    client's transport errors, or BadResponse for a body over ``max_bytes``)."""
    def run(cancel: threading.Event) -> tuple[int, bytes]:
        with client.stream(method, url, json=json_body, timeout=timeout) as r:
            return r.status_code, read_body(r, cancel, max_bytes)
    return within(timeout, run)


def chunks(r: Any, cancel: threading.Event, max_bytes: int) -> Iterator[bytes]:
    """The body's bytes as they come; stops at the deadline, refuses more than ``max_bytes``."""
    seen = 0
    for chunk in r.iter_bytes():
        if cancel.is_set():
            raise Late("the request's deadline passed")
        seen += len(chunk)
        if seen > max_bytes:
            raise BadResponse(f"more than {max_bytes} bytes")
        yield chunk


def read_body(r: Any, cancel: threading.Event, max_bytes: int, cut: bool = False) -> bytes:
    """The whole body, at most ``max_bytes`` (``cut``: its first ``max_bytes``, then stop reading)."""
    data = bytearray()
    for chunk in chunks(r, cancel, 1 << 62 if cut else max_bytes):
        data += chunk
        if cut and len(data) >= max_bytes:
            break
    return bytes(data[:max_bytes])


def lines(r: Any, cancel: threading.Event) -> Iterator[str]:
    """A streamed body's lines, decoded as they complete."""
    buf = b""
    for chunk in chunks(r, cancel, MAX_RESPONSE_BYTES):
        buf += chunk
        *done, buf = buf.split(b"\n")
        for line in done:
            yield utf8(line.rstrip(b"\r"))
    if buf:
        yield utf8(buf)


def utf8(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BadResponse(f"not UTF-8 (byte 0x{data[err.start]:02x} at offset {err.start})") from None


def parse_json(data: bytes) -> Any:
    """A response body as JSON; anything else is a BadResponse quoting its start."""
    try:
        return json.loads(utf8(data))
    except RecursionError:
        raise BadResponse("JSON nested too deeply") from None
    except ValueError as err:
        raise BadResponse(f"not JSON ({err}): {data[:80].decode('utf-8', 'replace')!r}") from None
