"""`specparity serve` behaves like a server, on real processes.

A port in use is one line and exit 4, never a hang; Ctrl-C exits 130, idle or
busy, never MLX's abort (134); /metrics label values are bounded whatever
clients ask; a client that gives up cancels its generation, in prefill or in
decode; requests get only the checkpoint the operator named unless the server
was started with --allow-request-models, and no error says what exists on disk.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from conftest import build
from specparity.harness.lifecycle import PORT_ARG, Server

BIN = Path(sys.executable).parent
# every forward sleeps 10 ms, one of 8 rows or more 50 ms more: a prefill of many chunks and
# a long decode take seconds
SLOW = [{"kind": "slow", "seconds": 0.01}, {"kind": "slow", "seconds": 0.05, "min_rows": 8}]
NO_EOS = {"0": -100.0}  # the fixture's <|endoftext|>: a decode that runs to max_tokens
STEP = ("--prefill-step-size", "8")
LONG_PROMPT = " ".join(["the quick brown fox jumps over the lazy dog"] * 40)  # ~400 tokens


def _serve(model: str, *extra: str) -> list[str]:
    return [str(BIN / "specparity"), "serve", "--model", model, "--port", PORT_ARG, *extra]


def _server(name: str, argv: list[str], tmp_path: Path) -> Server:
    return Server(argv, log_path=tmp_path / f"{name}.log", name=name, start_timeout=300,
                  env={"SPECPARITY_HOME": str(tmp_path / "home")})


def _complete(srv: Server, **body) -> httpx.Response:
    return httpx.post(srv.url + "/v1/completions", timeout=120,
                      json={"prompt": "hello world", "max_tokens": 8, "temperature": 0, **body})


def _wait_for(path: Path, pattern: str, timeout: float = 120.0) -> re.Match:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(pattern, path.read_text(errors="replace"))
        if m:
            return m
        time.sleep(0.05)
    raise AssertionError(f"{pattern!r} not in {path} after {timeout:g} s")


@pytest.fixture(scope="module")
def pair(fixture_root):
    return build(fixture_root, "llama-float32", arch="llama")


@pytest.fixture(scope="module")
def slow_pair(fixture_root):
    return build(fixture_root, "llama-slow8", arch="llama", faults=SLOW)


# -- a port in use: one line, exit 4, no hang (it bound before anything started) ---------------

@pytest.mark.model
@pytest.mark.server
def test_a_port_in_use_is_one_line_and_exit_4(pair, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run([str(BIN / "specparity"), "serve", "--model", pair.target,
                            "--port", str(port)], capture_output=True, text=True, timeout=120,
                           env={"SPECPARITY_HOME": str(tmp_path), "PATH": str(BIN)})
    assert r.returncode == 4, r.stderr
    assert r.stderr.splitlines() == [f"Error: cannot listen on 127.0.0.1:{port} (Address already in use);"
                                     " choose another --port"], r.stderr
    assert r.stdout == ""


def test_more_draft_tokens_than_max_draft_tokens_at_start_up_is_one_line_and_exit_2(tmp_path):
    r = subprocess.run([str(BIN / "specparity"), "serve", "--max-draft-tokens", "4", "--model", "m",
                        "--draft-model", "d", "--num-draft-tokens", "5", "--port", "0"],
                       capture_output=True, text=True, timeout=120,
                       env={"SPECPARITY_HOME": str(tmp_path), "PATH": str(BIN)})
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == ["Error: --num-draft-tokens 5: more than --max-draft-tokens 4"]


# -- Ctrl-C: exit 130, idle or in the middle of a request ---------------------------------------

def _interrupt(srv: Server) -> int:
    assert srv.proc is not None
    srv.proc.send_signal(signal.SIGINT)  # what a terminal's Ctrl-C sends
    return srv.proc.wait(120)


@pytest.mark.slow
@pytest.mark.server
@pytest.mark.model
def test_ctrl_c_exits_130_idle_and_busy(pair, slow_pair, tmp_path):
    srv = _server("idle", _serve(pair.target, "--draft-model", pair.draft), tmp_path).start()
    try:
        assert _complete(srv).status_code == 200
        assert _interrupt(srv) == 130
    finally:
        srv.stop()
    argv = _serve(slow_pair.target, "--draft-model", slow_pair.draft, "--trust-remote-code", *STEP)
    srv = _server("busy", argv, tmp_path).start()
    try:
        threading.Thread(target=lambda: _quietly(srv, prompt=LONG_PROMPT, max_tokens=2000),
                         daemon=True).start()
        _wait_for(Path(str(srv.log_path)), r'"POST /v1/completions HTTP/1.1" 200')  # generating
        assert _interrupt(srv) == 130
    finally:
        srv.stop()
    for name in ("idle", "busy"):
        text = (tmp_path / f"{name}.log").read_text()
        assert "specparity-serve: INTERRUPTED" in text
        assert "terminate called" not in text and "Traceback" not in text


def _quietly(srv: Server, timeout: float = 120, **body) -> None:
    try:
        httpx.post(srv.url + "/v1/completions", timeout=timeout,
                   json={"temperature": 0, **body})
    except httpx.HTTPError:
        pass


# -- /metrics: bounded label values --------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.server
@pytest.mark.model
def test_metrics_label_values_stay_bounded_whatever_clients_ask(pair, tmp_path):
    argv = _serve(pair.target, "--draft-model", pair.draft, "--max-draft-tokens", "4")
    with _server("labels", argv, tmp_path) as srv:
        for k in (5, 99, 10**6, 10**12):
            r = _complete(srv, num_draft_tokens=k)
            assert r.status_code == 400 and "--max-draft-tokens" in r.json()["error"], k
        assert _complete(srv, num_draft_tokens=2).status_code == 200
        metrics = httpx.get(srv.url + "/metrics", timeout=30).text
    widths = set(re.findall(r'width="([^"]+)"', metrics))
    positions = set(re.findall(r'position="([^"]+)"', metrics))
    assert widths <= {"2", "3", "4", "5", "other"} and "3" in widths
    assert positions <= {"0", "1", "2", "3"}
    log_text = (tmp_path / "labels.log").read_text()
    assert not re.search(r"specparity-gate: \w+ width=(?:6|100|1000001) ", log_text)  # no probe


# -- a client that gives up cancels its generation ---------------------------------------------

def _leave_stream(srv: Server, after: float = 1.0, **body) -> None:
    """A streaming client that reads what comes for ``after`` seconds, then closes."""
    t0 = time.monotonic()
    try:
        with httpx.stream("POST", srv.url + "/v1/completions", timeout=after,
                          json={"temperature": 0, **body, "stream": True}) as r:
            for _ in r.iter_lines():
                if time.monotonic() - t0 > after:
                    break
    except httpx.ReadTimeout:
        pass


CANCELLED = r"specparity-serve: CANCELLED request=\S+ stage=(\w+) tokens=(\d+) max_tokens=(\d+) .* path=(\w+)"


@pytest.mark.slow
@pytest.mark.server
@pytest.mark.model
@pytest.mark.parametrize("drafter", [False, True], ids=["no-drafter", "drafter"])
def test_a_client_that_gives_up_cancels_its_generation(pair, slow_pair, tmp_path, drafter):
    draft = ("--draft-model", slow_pair.draft) if drafter else ()
    argv = _serve(slow_pair.target, *draft, "--trust-remote-code", *STEP)
    # without a drafter an unseeded request joins mlx-lm's batch loop, a seeded one runs alone
    batch, seeded = ("speculative", "speculative") if drafter else ("batch", "sequential")
    with _server("cancel", argv, tmp_path) as srv:
        log = Path(str(srv.log_path))
        for i in range(8):  # a client that reads its whole answer, then closes, gave up nothing
            assert _complete(srv, prompt=f"hello {i}", stream=bool(i % 2)).status_code == 200
        # prefill: ~50 chunks of 8 rows at 50 ms each; the client leaves after 1 s
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(srv.url + "/v1/completions", timeout=1.0,
                       json={"prompt": LONG_PROMPT, "max_tokens": 4, "temperature": 0})
        m = _wait_for(log, CANCELLED)
        assert m.groups() == ("prefill", "0", "4", batch), m.group(0)
        # the same, streamed (another prompt: nothing of the first one's is cached)
        _leave_stream(srv, prompt=LONG_PROMPT.replace("fox", "cat"), max_tokens=5)
        m = _wait_for(log, CANCELLED.replace(r"max_tokens=(\d+)", "max_tokens=(5)"))
        assert m.groups() == ("prefill", "0", "5", batch), m.group(0)
        # decode: 3000 steps of 10 ms; the client leaves after 1 s
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(srv.url + "/v1/completions", timeout=1.0,
                       json={"prompt": "hello", "max_tokens": 3000, "temperature": 0, "seed": 1,
                             "logit_bias": NO_EOS})
        m = _wait_for(log, CANCELLED.replace(r"max_tokens=(\d+)", "max_tokens=(3000)"))
        assert m.group(1) == "decode" and int(m.group(2)) < 3000 and m.group(4) == seeded, m.group(0)
        # the server is free and serves the next request whole
        r = _complete(srv, max_tokens=6)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 6
        assert r.json()["speculative"]["path"] == batch
        metrics = httpx.get(srv.url + "/metrics", timeout=30).text
    cancelled = dict(re.findall(r'specparity_cancelled_requests_total\{stage="(\w+)"\} (\S+)', metrics))
    assert cancelled == {"prefill": "2.0", "decode": "1.0"}, cancelled


# -- only what the operator named; errors say nothing about the file system ----------------------

FS_WORDS = ("No such file", "Errno", "config.json", "safetensors", "not a directory", "exist")


@pytest.mark.slow
@pytest.mark.server
@pytest.mark.model
def test_requests_get_only_the_operators_checkpoint(pair, fixture_root, tmp_path):
    other = build(fixture_root, "llama-bfloat16", arch="llama", dtype="bfloat16")
    missing, existing = str(tmp_path / "nope"), str(tmp_path)
    named = tmp_path / "target-link"  # the operator names the model by another path to it
    named.symlink_to(pair.target)
    chat = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "temperature": 0}
    refused = [(body, field) for field, body in (
        ("model", {"model": missing}), ("model", {"model": existing}), ("model", {"model": other.target}),
        ("model", {"model": "/etc"}), ("draft_model", {"draft_model": pair.draft}),
        ("draft_model", {"draft_model": missing}), ("adapters", {"adapters": existing}),
        ("adapters", {"adapters": missing}),
        # mlx-lm would read this as the adapter folder ./default_model, unloading the served model
        ("adapters", {"model": pair.target, "adapters": "default_model"}),
        ("adapters", {"adapters": "default_model"}))]
    with _server("named", _serve(str(named)), tmp_path) as srv:
        for body, field in [*refused, ({**chat, "model": "/etc"}, "model")]:
            path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
            r = httpx.post(srv.url + path, timeout=120,
                           json={"prompt": "hello world", "max_tokens": 8, **body} if "messages" not in body
                           else body)
            assert r.status_code == 404, (body, r.text)
            assert r.json()["error"] == (f"{field} {body[field]!r} is not served here: this server serves"
                                         " what its operator named (GET /v1/models)")
        # the operator's checkpoint by any of its names: the model loaded at start-up, never again
        for name in ("default_model", str(named), pair.target):
            assert _complete(srv, model=name).status_code == 200
        models = httpx.get(srv.url + "/v1/models", timeout=30).json()["data"]
        assert [m["id"] for m in models] == [str(named)]
        log_text = Path(str(srv.log_path)).read_text()
    assert "MODEL-UNAVAILABLE" not in log_text and other.target not in log_text.split("POST")[0]
    assert len(re.findall(r"specparity-serve: PROMPT-CACHE ", log_text)) == 1, log_text  # one load

    argv = _serve(pair.target, "--allow-request-models")
    with _server("open", argv, tmp_path) as srv:
        errors = []
        for value in (missing, existing):
            r = _complete(srv, model=value)
            assert r.status_code == 404
            errors.append(r.json()["error"])
        assert errors == [f"model {missing!r} could not be loaded",
                          f"model {existing!r} could not be loaded"]
        assert not any(w in e for e in errors for w in FS_WORDS)
        assert _complete(srv, model=other.target).status_code == 200  # the opt-in loads it
        log_text = Path(str(srv.log_path)).read_text()
    assert log_text.count("specparity-serve: MODEL-UNAVAILABLE") == 2  # the detail stays here


# -- no request brings the server down: each bad one is a 400 naming its field -------------------

def _raw(srv: Server, content: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(srv.url + "/v1/completions", content=content, timeout=60,
                      headers={"Content-Type": "application/json", **(headers or {})})


def _body(**fields: object) -> bytes:
    """A completions body as JSON text, NaN and Infinity written as Python's reader accepts them."""
    import json

    return json.dumps({"prompt": "hello world", "max_tokens": 8, "temperature": 0, **fields}).encode()


def _bad_requests(vocab: int) -> list[tuple[str, bytes, dict[str, str], int, str]]:
    """(name, body, headers, status, what the error names) for each request that must be refused."""
    nan, inf = float("nan"), float("inf")
    deep = b'{"prompt": "x", "tools": ' + b"[" * 100 + b"]" * 100 + b"}"
    cases = [
        ("logit_bias past the vocabulary", _body(logit_bias={str(vocab + 99_487): 5}), "logit_bias"),
        ("logit_bias at the vocabulary", _body(logit_bias={str(vocab): 5}), "logit_bias"),
        ("logit_bias negative id", _body(logit_bias={"-1": 5}), "logit_bias"),
        ("logit_bias NaN", _body(logit_bias={"3": nan}), "logit_bias"),
        ("logit_bias huge id", _body(logit_bias={str(2**70): 1}), "logit_bias"),
        ("temperature NaN", _body(temperature=nan), "temperature"),
        ("repetition_penalty NaN", _body(repetition_penalty=nan), "repetition_penalty"),
        ("presence_penalty -inf", _body(presence_penalty=-inf), "presence_penalty"),
        ("top_p inf", _body(top_p=inf), "top_p"),
        ("max_tokens 10^30", _body(max_tokens=10**30), "max_tokens"),
        ("max_tokens 1e30", _body(max_tokens=1e30), "max_tokens"),
        ("top_k the vocabulary", _body(top_k=vocab, temperature=1.0, seed=1), "top_k"),
        ("seed negative", _body(seed=-1), "seed"),
        ("seed past 64 bits", _body(seed=2**64), "seed"),
        ("repetition_context_size 10^20", _body(repetition_penalty=1.1, repetition_context_size=10**20),
         "repetition_context_size"),
        ("xtc_threshold 0.9", _body(xtc_probability=0.5, xtc_threshold=0.9), "xtc_threshold"),
        ("stop of numbers", _body(stop=[1, 2]), "stop"),
        ("top_logprobs 50", _body(logprobs=True, top_logprobs=50), "top_logprobs"),
        ("stream_options a number", _body(stream=True, stream_options=5), "stream_options"),
        ("non-UTF-8", b'{"prompt": "\xff\xfe", "max_tokens": 8}', "not UTF-8"),
        ("100,000 deep", b"[" * 100_000 + b"]" * 100_000, "nested deeper"),
        ("100 deep in tools", deep, "nested deeper"),
        ("5,000 digits", b'{"prompt": "x", "max_tokens": 1' + b"0" * 5000 + b"}", "not JSON"),
    ]
    out: list[tuple[str, bytes, dict[str, str], int, str]] = [(name, body, {}, 400, word) for name, body, word in cases]
    out += [("Content-Length 10^12", b"{}", {"Content-Length": str(10**12)}, 413, "Content-Length"),
            ("Content-Length negative", b"{}", {"Content-Length": "-5"}, 400, "Content-Length")]
    return out


@pytest.fixture(scope="module")
def guarded(pair, tmp_path_factory):
    """One `specparity serve` with the fixture's drafter, for the bad-request test."""
    tmp = tmp_path_factory.mktemp("guarded")
    srv = _server("guarded", _serve(pair.target, "--draft-model", pair.draft), tmp).start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.mark.server
@pytest.mark.model
def test_each_bad_request_is_a_400_naming_its_field_and_the_server_keeps_serving(pair, guarded):
    from specparity.reference import ClassicReference
    from specparity.inputs import config_vocab_size, vocab_size

    vocab = config_vocab_size(pair.target)
    assert vocab is not None
    for name, body, headers, status, word in _bad_requests(vocab):
        if "Content-Length" in headers:  # a header httpx would correct: sent by hand
            answer = _by_hand(guarded, body, headers["Content-Length"])
            assert answer.startswith(f"HTTP/1.0 {status} ".encode()) or \
                answer.startswith(f"HTTP/1.1 {status} ".encode()), (name, answer[:200])
            assert word.encode() in answer, (name, answer[:300])
        else:
            r = _raw(guarded, body, headers)
            assert r.status_code == status, (name, r.status_code, r.text[:300])
            assert word in r.json()["error"], (name, r.json())
        assert guarded.proc is not None and guarded.proc.poll() is None, name
        assert httpx.get(guarded.url + "/v1/models", timeout=30).status_code == 200, name
    # the checks name the vocabulary the model has, not another: its last id is a token
    classic = ClassicReference(pair.target)
    assert vocab_size(classic.loaded) == vocab
    good = {"prompt": "hello world", "max_tokens": 12, "temperature": 0,
            "logit_bias": {str(vocab - 1): 0.5, "0": -100.0}}
    r = httpx.post(guarded.url + "/v1/completions", json=good, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == classic.complete("completions", good).text
    log_text = Path(str(guarded.log_path)).read_text()
    assert "Traceback" not in log_text and "Segmentation" not in log_text


def _by_hand(srv: Server, body: bytes, length: str) -> bytes:
    """A POST with this Content-Length header, whatever the body: the raw answer."""
    host, port = srv.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  + f"Content-Length: {length}\r\n\r\n".encode() + body)
        chunks = []
        while True:
            data = s.recv(65536)
            if not data:
                break
            chunks.append(data)
    return b"".join(chunks)
