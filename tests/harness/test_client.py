"""A response is data, a timeout is a deadline.

harness.client.send against tests/fakeserver.py (real HTTP on 127.0.0.1, its own
process): each malformed answer is that request's ``error`` saying what was wrong,
never an exception; a server that streams keep-alive comments forever, or stalls,
is cut off at the request's total deadline. One server serves every case (a
``[[fake:MODE]]`` directive in the prompt picks the answer).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fakeserver import argv, bounded

from specparity.harness.client import Request, send
from specparity.harness.lifecycle import Server
from specparity.harness.profiles import Profile

pytestmark = pytest.mark.server
PROFILE = Profile(name="fake", argv=[], logprobs_request={"logprobs": True, "top_logprobs": 2})


@pytest.fixture(scope="module")
def fake() -> Iterator[Server]:
    srv = Server(argv(), name="fake").start()
    try:
        yield srv
    finally:
        srv.stop()


def _request(mode: str, endpoint: str = "completions", stream: bool = False) -> Request:
    prompt = f"hello [[fake:{mode}]]"
    body: dict[str, Any] = {"max_tokens": 4, "temperature": 0}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if stream:
        body["stream"] = True
    return Request("p0", "fresh", endpoint, body)


# mode, endpoint, stream -> what the error says (each exited 70, or read as a completion, before)
CASES = [
    ("empty-choices", "completions", False, "unreadable response: choices is empty: no completion"),
    ("empty-choices", "completions", True, "none of the stream's 5 chunks held a choice"),
    ("choice-string", "completions", False, "choices[0] is a string, not an object"),
    ("choice-string", "chat", True, "stream chunk 1 choices[0] is a string, not an object"),
    ("text-int", "completions", False, "choices[0].text is an integer, not a string"),
    ("text-int", "chat", False, "choices[0].message.content is an integer, not a string"),
    ("text-int", "completions", True, "stream chunk 1 choices[0].text is an integer, not a string"),
    ("text-int", "chat", True, "stream chunk 1 choices[0].delta.content is an integer, not a string"),
    ("logprobs-not-objects", "completions", False, "choices.0.logprobs.content[0] is a number, not an object"),
    ("chunk-list", "completions", False, "the response is a list, not an object"),
    ("chunk-list", "chat", True, "stream chunk 1 is a list, not an object"),
    ("not-json", "completions", False, "not JSON (Expecting value: line 1 column 1 (char 0)): '<html>not json"),
    ("not-json", "completions", True, "no data events in the stream"),
    ("http-500", "completions", False, "HTTP 500: {\"error\": {\"message\": \"fake internal error\"}}"),
    ("http-500", "chat", True, "HTTP 500: "),
]


@pytest.mark.parametrize("mode, endpoint, stream, message", CASES)
def test_a_malformed_answer_is_the_requests_error(fake: Server, mode: str, endpoint: str, stream: bool,
                                                  message: str) -> None:
    with httpx.Client() as client:
        comp = send(client, fake.url, _request(mode, endpoint, stream), PROFILE, timeout=60)
    assert comp.error is not None and comp.error.startswith(("unreadable response: ", "HTTP ")), comp.error
    assert message in comp.error, comp.error
    assert comp.text == "" and comp.token_ids is None and not comp.ok


@pytest.mark.parametrize("endpoint, stream", [("completions", False), ("chat", False), ("completions", True)])
def test_a_well_formed_answer_still_reads(fake: Server, endpoint: str, stream: bool) -> None:
    with httpx.Client() as client:
        comp = send(client, fake.url, _request("ok", endpoint, stream), PROFILE, timeout=60)
    assert comp.ok and comp.text.startswith(" w") and comp.finish_reason == "length", comp
    if not stream:
        assert comp.token_ids and len(comp.token_ids) == 4 and comp.usage["completion_tokens"] == 4


@pytest.mark.parametrize("mode, stream", [("keepalive", True), ("keepalive", False), ("stall", False)])
def test_a_request_has_a_total_deadline(fake: Server, mode: str, stream: bool) -> None:
    """keep-alive bytes every 0.2 s never let a per-read timeout fire: the old client waited forever
    (run in a thread: a regression fails at 60 s instead of hanging the suite)."""
    t0 = time.monotonic()
    with httpx.Client() as client:
        comp = bounded(lambda: send(client, fake.url, _request(mode, stream=stream), PROFILE, timeout=1.0), 60)
    assert comp.error == "no complete answer within the request timeout of 1 s", comp.error
    assert time.monotonic() - t0 < 60  # a deadline, with any slack a loaded machine needs
    assert fake.alive()


@pytest.fixture(scope="module")
def trickler() -> Iterator[Server]:
    """Ready, but its engine side-channels (dflash-mlx's /metrics, llama-server's /tokenize) never finish."""
    srv = Server(argv("--trickle", "/metrics", "--trickle", "/tokenize"), name="trickler").start()
    try:
        yield srv
    finally:
        srv.stop()


def test_the_engines_side_requests_have_total_deadlines(trickler: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """dflash-mlx's /metrics read and llama-server's /tokenize had per-read timeouts only: a server that
    trickles bytes held the job there for good."""
    from specparity.engines.dflash_mlx import served as dflash_mlx
    from specparity.engines.llama_cpp import served as llama_cpp

    t0 = time.monotonic()
    assert bounded(lambda: dflash_mlx.read_metrics(trickler.url, timeout=0.5), 60) is None
    monkeypatch.setattr(llama_cpp, "PROMPT_IDS_TIMEOUT", 0.5)
    with httpx.Client() as client:
        assert bounded(lambda: llama_cpp.prompt_ids(client, trickler.url, _request("ok")), 60) is None
    assert time.monotonic() - t0 < 30


def test_a_server_that_dies_mid_answer_is_the_requests_error() -> None:
    """Half a body, then the process exits: the body ends at the close (no Content-Length), cut short."""
    srv = Server(argv(), name="fake-die").start()
    try:
        with httpx.Client() as client:
            comp = send(client, srv.url, _request("die"), PROFILE, timeout=60)
        assert srv.proc is not None and srv.proc.wait(60) == 3
    finally:
        srv.stop()
    assert comp.error is not None and comp.error.startswith(("unreadable response: not JSON (Unterminated string",
                                                             "connection failed: ")), comp.error


def test_the_loopback_client_reaches_a_local_server_past_a_proxy_in_the_environment(monkeypatch) -> None:
    """Requests to the servers a job started go straight to 127.0.0.1: an HTTP_PROXY in the user's
    environment (here one where nothing listens) is not used for them, and no TLS context is built."""
    import http.server
    import threading

    import httpx

    from specparity.harness.transport import loopback_client

    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"hello")

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/"
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("ALL_PROXY", "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    try:
        with httpx.Client() as proxied:  # what a default client does: through the dead proxy
            with pytest.raises(httpx.TransportError):
                proxied.get(url, timeout=5)
        with loopback_client() as client:
            assert client.get(url, timeout=5).text == "hello"
    finally:
        srv.shutdown()


def test_a_profiles_request_fields_ride_on_every_request_streams_too() -> None:
    """A server that refuses a request without ``model`` (mlx-vlm, yunshu, vllm-mlx: HTTP 422 or 400): the
    profile's ``request`` fields go with every request, streamed or not; its ``logprobs.request`` fields only
    with a plain one, so a stream without the field is refused (as every such stream was)."""
    srv = Server(argv("--require-field", "model=specparity-target"), name="fake-model").start()
    try:
        with httpx.Client() as client:
            named = Profile(name="named", argv=[], request_fields={"model": "specparity-target"})
            only_logprobs = Profile(name="old", argv=[], logprobs_request={"model": "specparity-target"})
            for stream in (False, True):
                comp = send(client, srv.url, _request("ok", stream=stream), named, timeout=60)
                assert comp.ok and comp.text, (stream, comp.error)
            assert send(client, srv.url, _request("ok"), only_logprobs, timeout=60).ok
            refused = send(client, srv.url, _request("ok", stream=True), only_logprobs, timeout=60)
            assert not refused.ok and "HTTP 422" in str(refused.error) and "body.model: Field required" in str(
                refused.error)
    finally:
        srv.stop()
