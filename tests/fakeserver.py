"""A fault-injection OpenAI-style server: real HTTP on 127.0.0.1, its own process.

Tests start it through ``harness.lifecycle.Server`` (see :func:`argv`), as the
served job starts a real engine, and choose what it answers:

    ok                    a well-formed completion (streamed or not), deterministic
    empty-choices         {"choices": []}
    choice-string         {"choices": ["..."]}
    text-int              {"choices": [{"text": 5}]}  (chat: "content": 5)
    logprobs-not-objects  logprobs.content entries that are numbers, not objects
    chunk-list            a stream chunk that is the JSON list [1, 2] (a plain body [1, 2] when not streamed)
    not-json              200 with a body that is not JSON
    http-500              500 with an error body
    keepalive             headers, then SSE keep-alive comments (or blanks) forever: never a byte of answer
    stall                 reads the request and never answers
    die                   sends half an answer, then the whole server process exits (code 3)

``--mode M`` sets it for every request; ``--draft-mode M`` for a server started
with ``--draft-model`` (a served drafter arm); a prompt holding ``[[fake:M]]``
sets it for that request. ``--require-field NAME=VALUE`` (repeatable) answers 422 to any completion
request whose body lacks that field with that value (a server whose schema requires ``model``).
``--trickle PATH`` (repeatable) answers any GET or POST
of PATH (``/health``, ``/metrics``, ``/tokenize``) with a 200 whose body trickles
in a byte at a time and never ends. ``--child`` starts a grandchild in the server's process
group (what an engine's workers are); ``--ignore-term`` ignores SIGTERM. ``--seconds-per-token S``
makes each answer take S seconds a token, one answer at a time (a compute-bound server: N requests
sent at once finish N times later). Any
other flag (a profile's ``--model``, ``--num-draft-tokens``) is accepted and
printed: the server's first log line is ``fakeserver argv: [...]`` (JSON), and
``GET /argv`` answers the same list, ``GET /pid`` its pid and its child's. A server
started with ``--draft-model`` names it in each plain answer (``"drafted": {"draft_model": ...}``):
evidence for a profile whose ``evidence.response_field`` is ``drafted``.

Standard library only, so it starts in a few tens of milliseconds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar, cast

MODES = ("ok", "empty-choices", "choice-string", "text-int", "logprobs-not-objects", "chunk-list", "not-json",
         "http-500", "keepalive", "stall", "die")
_DIRECTIVE = re.compile(r"\[\[fake:([a-z0-9-]+)\]\]")
FOREVER = 3600.0
T = TypeVar("T")
_COMPUTE = threading.Lock()  # --seconds-per-token: one answer computed at a time


def argv(*extra: str) -> list[str]:
    """The argv to start this server through ``lifecycle.Server`` (port and host filled at spawn)."""
    from specparity.harness.lifecycle import HOST_ARG, PORT_ARG

    return [sys.executable, "-I", os.path.abspath(__file__), "--host", HOST_ARG, "--port", PORT_ARG, *extra]


MARK_ENV = "SPECPARITY_TEST_MARK"


def marked(mark: str) -> list[int]:
    """Live processes (zombies not counted) whose environment holds ``MARK_ENV=mark``: everything a
    test started with that mark, however re-parented, found by scanning /proc, or by asking ps
    where there is no /proc (macOS)."""
    if not os.path.isdir("/proc"):
        return marked_by_ps(mark)
    needle = f"{MARK_ENV}={mark}".encode()
    found = []
    for d in os.scandir("/proc"):
        if not d.name.isdigit():
            continue
        try:
            with open(f"/proc/{d.name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
            with open(f"/proc/{d.name}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except (OSError, IndexError):
            continue
        if state != b"Z" and needle in env:
            found.append(int(d.name))
    return found


# every process with its state, command line and environment: macOS's ps, and procps' (Linux)
PS_WITH_ENV = (["ps", "-E", "-ww", "-axo", "pid=,stat=,command="] if sys.platform == "darwin"
               else ["ps", "axeww", "-o", "pid=,stat=,command="])


def marked_by_ps(mark: str) -> list[int]:
    """:func:`marked` through ps: its environment words follow the command on each line."""
    needle = f"{MARK_ENV}={mark}"
    out = subprocess.run(PS_WITH_ENV, capture_output=True, text=True, errors="replace", timeout=60, check=True)
    found = []
    for line in out.stdout.splitlines():
        parts = line.split(None, 2)
        if len(parts) == 3 and parts[0].isdigit() and not parts[1].startswith("Z") and needle in parts[2].split():
            found.append(int(parts[0]))
    return found


def bounded(fn: Callable[[], T], seconds: float) -> T:
    """``fn()`` in a thread, failing the test if it has not returned within ``seconds``: a regression
    that hangs fails instead of stalling the suite (clean up what ``fn`` waits on afterwards)."""
    box: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            box.append((True, fn()))
        except BaseException as err:  # noqa: BLE001 (re-raised in the test)
            box.append((False, err))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if not box:
        raise AssertionError(f"still running after {seconds:g} s")
    ok, value = box[0]
    if not ok:
        raise value
    return cast(T, value)


def wait_gone(mark: str, seconds: float = 60.0) -> list[int]:
    """Poll :func:`marked` until nothing carries ``mark`` or ``seconds`` pass; what is left."""
    deadline = time.monotonic() + seconds
    while True:
        left = marked(mark)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def _words(seed: str, n: int) -> list[tuple[int, str]]:
    """``n`` deterministic (token id, text) pairs for ``seed``."""
    h = hashlib.sha256(seed.encode()).digest()
    return [(h[i % len(h)] + 1, f" w{h[i % len(h)]}") for i in range(n)]


class Handler(BaseHTTPRequestHandler):
    server_version = "fakeserver/1"
    opts: argparse.Namespace
    child: int | None = None

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        sys.stdout.write(f"{self.command} {self.path} {format % args}\n")

    # -- GET ---------------------------------------------------------------------------------
    def do_GET(self) -> None:
        if self.path in self.opts.trickle:
            self._trickle()
        elif self.path == "/health":
            self._json(200, {"status": "ok"})
        elif self.path == "/argv":
            self._json(200, sys.argv)
        elif self.path == "/pid":
            self._json(200, {"pid": os.getpid(), "child": self.child})
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": self.opts.model or "fake"}]})
        elif self.path == "/metrics":
            self._send(200, b"fake_requests_total 0\n", "text/plain")
        else:
            self._json(404, {"error": f"no route {self.path}"})

    # -- POST --------------------------------------------------------------------------------
    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path in self.opts.trickle:
            self._trickle()
            return
        chat = self.path.endswith("/chat/completions")
        if not (chat or self.path.endswith("/completions")):
            self._json(404, {"error": f"no route {self.path}"})
            return
        for need in self.opts.require_field:
            name, _, value = need.partition("=")
            if body.get(name) != value:  # as a server whose schema requires the field (mlx-vlm, yunshu: "model")
                self._json(422, {"error": {"message": f"body.{name}: Field required ({value!r})"}})
                return
        prompt = json.dumps(body.get("messages")) if chat else str(body.get("prompt", ""))
        mode = self.opts.mode
        if self.opts.draft_model and self.opts.draft_mode:
            mode = self.opts.draft_mode
        found = _DIRECTIVE.search(prompt)
        if found:
            mode = found.group(1)
        stream = bool(body.get("stream"))
        print(f"fakeserver: {self.path} stream={stream} mode {mode}", flush=True)
        n = int(body.get("max_tokens") or 8)
        words = _words(prompt, n)
        if self.opts.seconds_per_token:
            with _COMPUTE:
                time.sleep(self.opts.seconds_per_token * n)
        if mode == "stall":
            time.sleep(FOREVER)
            return
        if mode == "http-500":
            self._json(500, {"error": {"message": "fake internal error"}})
            return
        if mode == "not-json":
            self._send(200, b"<html>not json</html>", "text/html")
            return
        if mode == "die":
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"choices": [{"te')
            self.wfile.flush()
            os._exit(3)
        if mode == "keepalive":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream" if stream else "application/json")
            self.end_headers()
            while True:  # never an answer, always another byte: a per-read timeout never fires
                self.wfile.write(b": keep-alive\n\n" if stream else b" ")
                self.wfile.flush()
                time.sleep(0.2)
        if stream:
            self._stream(mode, chat, words)
        else:
            self._json(200, self._response(mode, chat, words))

    def _response(self, mode: str, chat: bool, words: list[tuple[int, str]]) -> Any:
        text = "".join(w for _, w in words)
        content: list[Any] = [{"id": i, "token": w, "logprob": -0.5,
                               "top_logprobs": [{"id": i, "logprob": -0.5}, {"id": i + 1, "logprob": -1.5}]}
                              for i, w in words]
        if mode == "logprobs-not-objects":
            content = [1.0 for _ in words]
        if mode == "chunk-list":
            return [1, 2]
        value: Any = 5 if mode == "text-int" else text
        choice: Any = ({"index": 0, "message": {"role": "assistant", "content": value}} if chat
                       else {"index": 0, "text": value})
        choice.update(finish_reason="length", logprobs={"content": content})
        if mode == "choice-string":
            choice = text
        usage = {"prompt_tokens": 4, "completion_tokens": len(words), "total_tokens": 4 + len(words)}
        out = {"id": "fake-1", "object": "chat.completion" if chat else "text_completion",
               "model": self.opts.model or "fake", "choices": [] if mode == "empty-choices" else [choice],
               "usage": usage}
        if self.opts.draft_model:
            out["drafted"] = {"draft_model": self.opts.draft_model}
        return out

    def _stream(self, mode: str, chat: bool, words: list[tuple[int, str]]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i, (_, w) in enumerate(words):
            choice: Any = {"index": 0, "delta": {"content": w}} if chat else {"index": 0, "text": w}
            choice["finish_reason"] = "length" if i == len(words) - 1 else None
            if mode == "text-int":
                choice["delta" if chat else "text"] = {"content": 5} if chat else 5
            if mode == "choice-string":
                choice = w
            chunk: Any = {"choices": [] if mode == "empty-choices" else [choice]}
            if mode == "chunk-list":
                chunk = [1, 2]
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            self.wfile.flush()
        usage = {"prompt_tokens": 4, "completion_tokens": len(words), "total_tokens": 4 + len(words)}
        self.wfile.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def _trickle(self) -> None:
        """A 200 promising a megabyte, a byte every 0.2 s: a per-read timeout never fires."""
        print(f"fakeserver: trickling {self.path}", flush=True)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(1 << 20))
        self.end_headers()
        try:
            while True:
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.2)
        except OSError:  # the client gave up
            return

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj).encode(), "application/json")

    def _send(self, status: int, data: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def main(args: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="fault-injection OpenAI-style server")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--mode", choices=MODES, default="ok")
    ap.add_argument("--draft-mode", choices=MODES, default=None)
    ap.add_argument("--require-field", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--model", default=None)
    ap.add_argument("--draft-model", default=None)
    ap.add_argument("--trickle", action="append", default=[], metavar="PATH",
                    help="answer PATH with a body that never ends (repeatable)")
    ap.add_argument("--child", action="store_true", help="start a grandchild in this process group")
    ap.add_argument("--ignore-term", action="store_true", help="ignore SIGTERM")
    ap.add_argument("--seconds-per-token", type=float, default=0.0,
                    help="each answer takes this long a token, one answer at a time")
    opts, unknown = ap.parse_known_args(args)
    print("fakeserver argv:", json.dumps(sys.argv), flush=True)
    if unknown:
        print("fakeserver: ignoring", json.dumps(unknown), flush=True)
    if opts.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    Handler.opts = opts
    if opts.child:
        child = subprocess.Popen([sys.executable, "-I", "-c", "import time; time.sleep(3600)"])
        Handler.child = child.pid
        print("fakeserver child", child.pid, flush=True)
    srv = ThreadingHTTPServer((opts.host, opts.port), Handler)
    srv.daemon_threads = True
    threading.current_thread().name = "fakeserver"
    print(f"fakeserver listening on {opts.host}:{opts.port}", flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
