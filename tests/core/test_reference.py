"""The classic reference equals what a fresh drafter-less mlx_lm.server returns, request by request.

Each served check starts one real ``mlx_lm.server`` on a fixture target and
sends every request to it once, each on a prompt no earlier request shares
(a prompt-cache hit on the sequential path is a finding of its own, judged
elsewhere), and compares the server's ids, logprobs and text with the
reference computed in this process.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest
from conftest import build
from builds import REAL_CACHE, built  # at collection: the real cache, before any test's home

from specparity.completions import Side, first_difference
from specparity.errors import UsageError
from specparity.harness.lifecycle import PORT_ARG, Server
from specparity.reference import (
    CONFIDENT, NEAR_TIE, UNKNOWN, ClassicReference, ReferenceCompletion, RequestParams, ServerSettings,
    check_prompt, near_tie, request_key,
)

PROMPTS = [
    "Speculative decoding drafts several tokens with a small model and verifies them",
    "The cache holds keys and values for every position; a rewind trims the rejected rows.",
    "def add(a, b):\n    return a + b\nfor i in range(10):",
    "A recurrent state cannot be trimmed and must be snapshotted instead.",
    "Pack my box with five dozen liquor jugs. How vexingly quick daft zebras jump!",
    "Sphinx of black quartz, judge my vow. 0123456789 + - * / = ( ) [ ] { } .",
    "The quick brown fox jumps over the lazy dog.",
    "Verify the block, rewind the rejected rows, and emit the accepted ones.",
    "for i in range(10):\n    print(i * i)",
]
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def _server(target: str, log: Path, extra: list[str] | None = None) -> Server:
    argv = [sys.executable, "-m", "mlx_lm", "server", "--model", target, "--port", PORT_ARG, *(extra or [])]
    return Server(argv, log_path=log, name="mlx_lm.server")


def _post(srv: Server, endpoint: str, body: dict) -> dict:
    path = "/v1/completions" if endpoint == "completions" else "/v1/chat/completions"
    r = httpx.post(srv.url + path, json={**body, "logprobs": True}, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def _side(endpoint: str, resp: dict) -> Side:
    c = resp["choices"][0]
    text = c.get("text") if endpoint == "completions" else (c["message"].get("content") or "")
    content = c["logprobs"]["content"]
    return Side("server", text or "", [e["id"] for e in content], [e["logprob"] for e in content])


def _stream_text(srv: Server, endpoint: str, body: dict) -> tuple[str, list[dict]]:
    path = "/v1/completions" if endpoint == "completions" else "/v1/chat/completions"
    chunks = []
    with httpx.stream("POST", srv.url + path, timeout=300,
                      json={**body, "stream": True, "logprobs": True, "top_logprobs": 2,
                            "stream_options": {"include_usage": True}}) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line[6:].strip() != "[DONE]":
                chunks.append(json.loads(line[6:]))
    key = "text" if endpoint == "completions" else "delta"
    text = "".join((c["choices"][0].get(key) if key == "text" else c["choices"][0]["delta"].get("content", ""))
                   or "" for c in chunks if c.get("choices"))
    return text, chunks


def _requests(ref: ClassicReference) -> list[tuple[str, dict]]:
    """One request per parameter the server reads; every prompt distinct, so every answer is cold."""
    # a stop word the answer really contains: two tokens from the middle of the plain answer
    plain = ref.complete("completions", {"prompt": PROMPTS[6], "max_tokens": 24})
    offsets = plain.offsets()
    k = next(k for k in range(4, len(plain.pieces) - 1) if plain.pieces[k] and plain.pieces[k + 1]
             and plain.text.find(plain.pieces[k] + plain.pieces[k + 1]) == offsets[k])
    stop = plain.pieces[k] + plain.pieces[k + 1]
    return [
        ("completions", {"prompt": PROMPTS[0], "max_tokens": 24}),
        ("completions", {"prompt": PROMPTS[1], "max_tokens": 24, "repetition_penalty": 1.3,
                         "repetition_context_size": 30}),
        ("completions", {"prompt": PROMPTS[2], "max_tokens": 24, "presence_penalty": 0.7,
                         "frequency_penalty": 0.4, "logit_bias": {"5": 4.0, "17": -3.0}}),
        ("completions", {"prompt": PROMPTS[3], "max_tokens": 24, "seed": 7, "repetition_penalty": 1.2}),
        ("completions", {"prompt": PROMPTS[6], "max_tokens": 24, "stop": [stop]}),
        ("chat", {"messages": [{"role": "user", "content": PROMPTS[4]}], "max_tokens": 20,
                  "repetition_penalty": 1.1}),
        # EOS forced by a bias: the server stops there and counts the EOS token
        ("completions", {"prompt": PROMPTS[8], "max_tokens": 10,
                         "logit_bias": {str(ref.tokenizer.eos_token_id): 40.0}}),
        # sampled, from a seeded generator: the sequential path draws the same numbers here
        ("completions", {"prompt": PROMPTS[7], "max_tokens": 20, "temperature": 0.9, "top_p": 0.9,
                         "top_k": 50, "seed": 5}),
    ]


def _check_against_server(ref: ClassicReference, srv: Server, requests: list[tuple[str, dict]]) -> list:
    refs = []
    for endpoint, body in requests:
        resp = _post(srv, endpoint, body)
        r = ref.complete(endpoint, body, server_prompt_tokens=resp["usage"]["prompt_tokens"])
        served = _side(endpoint, resp)
        d = first_difference(r.side(), served, ref.tokenizer)
        assert d is None, f"{body}: {d.line()}"
        assert r.logprobs == served.logprobs, body  # bitwise: the same arithmetic
        assert r.finish_reason == resp["choices"][0]["finish_reason"], body
        assert r.prompt_check is not None
        assert r.prompt_check.equal, r.prompt_check.line()
        refs.append(r)
    return refs


@pytest.mark.model
@pytest.mark.server
def test_reference_equals_a_fresh_server_float32(llama_pair, tmp_path):
    ref = ClassicReference(llama_pair.target)
    requests = _requests(ref)
    with _server(llama_pair.target, tmp_path / "server.log") as srv:
        refs = _check_against_server(ref, srv, requests)
        # the stop word was cut from the text where the server cut it
        stopped = refs[4]
        assert stopped.finish_reason == "stop" and requests[4][1]["stop"][0] not in stopped.text
        assert refs[3].path == "sequential" and refs[0].path == "batched"
        assert refs[6].finish_reason == "stop" and refs[6].token_ids == [ref.tokenizer.eos_token_id]
        # a streamed request: text only (no ids, no logprobs in any chunk); the reference gives the index
        endpoint, body = requests[0]
        text, chunks = _stream_text(srv, endpoint, {**body, "prompt": PROMPTS[5]})
        assert not any(c["choices"][0].get("logprobs") for c in chunks if c.get("choices"))
        assert chunks[-1]["usage"]["completion_tokens"] > 0
        streamed = ref.complete(endpoint, {**body, "prompt": PROMPTS[5], "stream": True})
        assert text == streamed.text
    # a repeated body (streamed or not) is computed once
    again = ref.complete(endpoint, {**body, "logprobs": True, "top_logprobs": 2})
    assert again.token_ids == refs[0].token_ids
    cost = ref.cost()
    assert cost.computed == len(requests) + 2 and cost.hits >= 1 and cost.tokens > 0 and cost.seconds > 0
    assert "distinct requests" in cost.line()
    # a fresh request's cold answer through mlx_lm.server's own loop is classic decode's; counted apart
    from specparity.probes.replay.sequence import ServingLoop

    cold = ref.cold(endpoint, body, loop=ServingLoop)
    assert (cold.token_ids, cold.text) == (refs[0].token_ids, refs[0].text) and ref.cost().cold == 1
    assert ref.cost().computed == cost.computed
    # an engine's own prompt ids: decoded from, their count checked against its usage, and the harness's own
    # tokenization checked against them (not the ids against themselves)
    ids = ref.prompt(endpoint, body).ids
    same = ref.complete(endpoint, body, server_prompt_ids=ids, server_prompt_tokens=len(ids), prompt_ids=ids)
    assert same.prompt_check is not None and same.prompt_check.equal
    assert same.own_prompt is not None and same.own_prompt.equal and same.own_prompt.server_ids_given
    other = [ids[0], *ids[2:]]  # a server that tokenized otherwise, and counts its own ids
    off = ref.complete(endpoint, body, server_prompt_ids=other, server_prompt_tokens=len(other), prompt_ids=other)
    assert off.prompt_ids == other and off.prompt_check is not None and off.prompt_check.equal
    assert off.own_prompt is not None and not off.own_prompt.equal and off.own_prompt.first_mismatch == 1


@pytest.mark.model
@pytest.mark.server
@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_reference_equals_a_fresh_server_half_precision(fixture_root, tmp_path, dtype):
    # bf16 / f16 logprobs tie now and then: classic decode keeps the lower id, and so must the reference
    pair = build(fixture_root, f"llama-{dtype}", arch="llama", dtype=dtype)
    ref = ClassicReference(pair.target)
    with _server(pair.target, tmp_path / "server.log") as srv:
        _check_against_server(ref, srv, _requests(ref))


@pytest.mark.model
@pytest.mark.server
@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_chat_template_segments_and_server_flags(fixture_root, tmp_path, dtype):
    """A chat template with a system prompt: the batched path prefills in segments; --kv-bits
    sends every request down the sequential path with a quantized cache (quantized from token 8)."""
    import shutil

    pair = build(fixture_root, f"llama-{dtype}", arch="llama", dtype=dtype)
    target = tmp_path / "target"
    shutil.copytree(pair.target, target)
    cfg = json.loads((target / "tokenizer_config.json").read_text())
    (target / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": TEMPLATE}))
    chat = ("chat", {"messages": [{"role": "system", "content": PROMPTS[3]},
                                  {"role": "user", "content": PROMPTS[0]}],
                     "max_tokens": 24, "repetition_penalty": 1.2})
    ref = ClassicReference(target)
    with _server(str(target), tmp_path / "server.log") as srv:
        [r] = _check_against_server(ref, srv, [chat])
    assert r.path == "batched" and len(r.prefill_segments) == 2
    flags = ["--kv-bits", "4", "--kv-group-size", "32", "--quantized-kv-start", "8", "--prefill-step-size", "16"]
    settings = ServerSettings.from_argv(flags)
    ref = ClassicReference(target, settings=settings)
    plain = ("completions", {"prompt": PROMPTS[1], "max_tokens": 24, "repetition_penalty": 1.2})
    with _server(str(target), tmp_path / "server-kv.log", flags) as srv:
        refs = _check_against_server(ref, srv, [chat, plain])
    assert {r.path for r in refs} == {"sequential"}
    # and the quantized cache changed the answer (the flags reached the reference)
    assert ClassicReference(target).complete(*plain).token_ids != refs[1].token_ids


def test_request_params_read_as_the_server_reads_them():
    s = ServerSettings.from_argv(["--max-tokens", "77", "--temp", "0.0", "--kv-bits", "8", "--model", "x"])
    p = RequestParams.from_body({"prompt": "x", "stop": "\n", "logit_bias": {"3": 1}}, s)
    assert p.max_tokens == 77 and p.stop == ["\n"] and p.logit_bias == {3: 1.0} and p.deterministic
    assert RequestParams.from_body({"max_tokens": 5, "max_completion_tokens": 9}).max_tokens == 9
    assert ServerSettings.from_argv(s.to_argv()) == s
    with pytest.raises(UsageError, match="request field top_p"):
        RequestParams.from_body({"top_p": 2})
    with pytest.raises(UsageError, match="logit_bias"):
        RequestParams.from_body({"logit_bias": {"a": 1}})
    # delivery fields do not make another request; generation fields do
    k = request_key("completions", {"prompt": "x"}, s)
    assert k == request_key("completions", {"prompt": "x", "stream": True, "logprobs": True}, s)
    assert k != request_key("completions", {"prompt": "x", "seed": 1}, s)


def test_prompt_check_and_stream_token_index():
    chk = check_prompt([1, 2, 3, 4], server_ids=[1, 2, 9, 4])
    assert not chk.equal and chk.first_mismatch == 2 and "position 2" in chk.line()
    assert check_prompt([1, 2], server_count=2).equal and check_prompt([1, 2]).equal is None
    assert check_prompt([1, 2, 3], server_ids=[1, 2]).first_mismatch == 2
    # pieces: "ab", "" (half a character), "é", "cd", then the EOS token (no text)
    r = ReferenceCompletion(key="k", endpoint="completions", prompt_ids=[1], token_ids=[5, 6, 7, 8, 0],
                            text="abécd", pieces=["ab", "", "é", "cd", ""], logprobs=[0.0] * 5,
                            top=[[(5, -0.1), (6, -0.3)]] * 5, finish_reason="stop", path="batched",
                            prefill_segments=[1], deterministic=True, params={}, settings={})
    assert [r.token_index_at(c) for c in (0, 1, 2, 3, 4)] == [0, 0, 1, 3, 3]
    assert r.token_index_at(5) == 4 and r.token_index_at(None) is None  # the other side went on
    assert r.margin(0) == pytest.approx(0.2) and r.margin(9) is None
    assert ReferenceCompletion.from_dict(json.loads(json.dumps(r.to_dict()))) == r


def test_near_tie_rule():
    assert near_tie(1e-4, 2.0).kind == NEAR_TIE
    assert near_tie(0.5, 2.0).kind == CONFIDENT
    assert near_tie(None, None).kind == UNKNOWN
    assert near_tie(None, 5e-4).kind == NEAR_TIE
    # the band widens with the dtype: 0.03 nats is confident in float32, a near tie in bfloat16
    assert near_tie(0.03, 1.0, dtype="float32").kind == CONFIDENT
    assert near_tie(0.03, 1.0, dtype="bfloat16").kind == NEAR_TIE
    # at large logprobs the dtype's own spacing decides: bf16 values near -40 are 0.25 apart
    assert near_tie(1.0, 3.0, dtype="bfloat16", logprob=-40.0).kind == NEAR_TIE
    assert near_tie(0.2, 1.0, threshold=0.1).kind == CONFIDENT
    assert "near tie" in near_tie(1e-4, 2.0).line() and "confident" in near_tie(1.0, 2.0).line()


@pytest.mark.model
@pytest.mark.server
@pytest.mark.build
@pytest.mark.slow
def test_reference_against_llama_server_reports_every_difference_with_margins(llama_pair, tmp_path):
    """llama.cpp computes the same network with other kernels: the reference runs on the weights the
    GGUF was exported from, from llama-server's own prompt ids, and every difference carries both
    sides' top-2 margins and a near-tie call (none is hidden, none is called a pass)."""
    from specparity.fixtures import pair_gguf
    from specparity.engines.llama_cpp.served import find_llama_server, llama_server_argv

    binary = find_llama_server()
    if binary is None:
        pytest.skip("llama-server is not built (scripts/build-llama-server)")
    target_gguf, _ = pair_gguf(llama_pair)
    ref = ClassicReference(llama_pair.target)
    equal, calls = 0, []
    with Server(llama_server_argv(binary, target_gguf), log_path=tmp_path / "llama.log", name="llama-server") as srv:
        for prompt in PROMPTS[:5]:
            ids = httpx.post(srv.url + "/tokenize", json={"content": prompt}, timeout=30).json()["tokens"]
            body = {"prompt": prompt, "max_tokens": 24, "temperature": 0}
            resp = httpx.post(srv.url + "/v1/completions", timeout=120,
                              json={**body, "n_probs": 2, "cache_prompt": False}).json()
            content = resp["choices"][0]["logprobs"]["content"]
            served = Side("llama-server", resp["choices"][0]["text"], [e["id"] for e in content],
                          [e["logprob"] for e in content],
                          [[(t["id"], t["logprob"]) for t in e["top_logprobs"]] for e in content])
            r = ref.complete("completions", body, server_prompt_ids=ids, prompt_ids=ids,
                             server_prompt_tokens=resp["usage"]["prompt_tokens"])
            assert r.prompt_check is not None and r.prompt_check.equal  # decoded from its ids, its count agrees
            # and the server tokenizes as mlx-lm does
            assert r.own_prompt is not None and r.own_prompt.equal, r.own_prompt
            assert ids == ref.prompt("completions", body).ids
            d = first_difference(r.side(), served, ref.tokenizer)
            if d is None:
                equal += 1
                continue
            assert d.margin_reference is not None and d.margin_other is not None, d.line()
            call = near_tie(d.margin_reference, d.margin_other, dtype="float32")
            assert call.kind in (NEAR_TIE, CONFIDENT)
            calls.append(f"{prompt[:20]!r}: token {d.index}: {call.line()}")
    assert equal >= 1, calls  # the reference is not wrong everywhere: most prompts agree
    print("\n".join(calls))


@pytest.mark.model
@pytest.mark.server
@pytest.mark.slow
@pytest.mark.parametrize("arch", ["qwen3_5", "gemma3_text", "qwen3_moe"])
def test_reference_equals_a_fresh_server_on_every_architecture(fixture_root, tmp_path, arch):
    # linear attention (qwen3_5), sliding windows (gemma3), experts (qwen3_moe): the same classic path
    pair = build(fixture_root, f"{arch}-float32", arch=arch)
    ref = ClassicReference(pair.target)
    with _server(pair.target, tmp_path / "server.log") as srv:
        _check_against_server(ref, srv, [
            ("completions", {"prompt": PROMPTS[0], "max_tokens": 24}),
            ("completions", {"prompt": PROMPTS[1], "max_tokens": 24, "repetition_penalty": 1.3}),
            ("completions", {"prompt": PROMPTS[3], "max_tokens": 24, "seed": 3, "presence_penalty": 0.4}),
        ])


@pytest.mark.model
@pytest.mark.server
@pytest.mark.build
@pytest.mark.slow
def test_reference_in_a_pinned_environment_equals_that_environments_server(llama_pair, tmp_path, monkeypatch):
    """mlx-lm 0.31.3's server (the version matrix's, and the one inside dflash serve) tokenizes into four
    parts, not five, and has its own stop and text machine: the reference worker in that environment
    (harness.oracle, as a served job runs it) answers as a fresh 0.31.3 server does, ids, logprobs, text
    and finish reason, on every request its server serves as classic decode (it refused every request
    before: "not enough values to unpack"). Found on the way: 0.31.3's batched path does not give the
    logits processors classic decode's history, so a penalized request without a seed differs there
    (a seeded one, served on its sequential path, equals the reference)."""
    from specparity.environments import ENV_CACHE_VAR
    from specparity.harness.oracle import Oracle

    monkeypatch.setenv(ENV_CACHE_VAR, str(REAL_CACHE))
    env = built("mlx-lm-0.31.3")
    server_env: dict[str, str | None] = {**env.environ(base={}), "PYTHONPATH": None, "PYTHONHOME": None}
    here = ClassicReference(llama_pair.target)  # this interpreter's: mlx-lm 0.32.2
    reqs = _requests(here)
    eos_bias = {**reqs[6][1], "seed": 1}  # a bias is a processor: seeded, so the sequential path serves it
    # an answer cut by max_tokens inside a character: 0.31's batched path never finalizes its detokenizer,
    # so its text drops the held bytes where 0.32 (and 0.31's sequential path) end it with U+FFFD
    cut = next({"prompt": p, "max_tokens": k} for p in PROMPTS for k in range(6, 24)
               if here.tokenizer.decode(here.complete("completions", {"prompt": p, "max_tokens": 24})
                                        .token_ids[:k]).endswith("\ufffd"))
    same = [reqs[0], reqs[4], reqs[3], ("completions", eos_bias), reqs[7], ("completions", cut),
            ("chat", {"messages": [{"role": "user", "content": PROMPTS[4]}], "max_tokens": 20})]
    oracle = Oracle(llama_pair.target, False, str(env.python), server_env)
    argv = [str(env.python), "-m", "mlx_lm", "server", "--model", llama_pair.target, "--port", PORT_ARG]
    try:
        with Server(argv, log_path=tmp_path / "server.log", name="mlx_lm.server 0.31.3",
                    env=dict(server_env)) as srv:
            for endpoint, body in same:
                resp = _post(srv, endpoint, body)
                answer = oracle.complete(endpoint, body, server_prompt_tokens=resp["usage"]["prompt_tokens"])
                assert answer.completion is not None, (body, answer.error)
                r, served = answer.completion, _side(endpoint, resp)
                assert (r.token_ids, r.text) == (served.token_ids, served.text), body
                assert r.logprobs == served.logprobs, body  # bitwise: the same arithmetic
                assert r.finish_reason == resp["choices"][0]["finish_reason"], body
                assert r.prompt_check is not None and r.prompt_check.equal, body
            assert oracle.complete(*same[3]).completion.finish_reason == "stop"  # type: ignore[union-attr]
            dropped = oracle.complete("completions", cut).completion
            assert dropped is not None and here.complete("completions", cut).text == dropped.text + "\ufffd"
            # a penalty on the batched path (no seed): not classic decode's history there (a seeded penalty,
            # reqs[3] above, is served as classic decode)
            endpoint, penalized = reqs[1]
            served = _side(endpoint, _post(srv, endpoint, penalized))
            classic = oracle.complete(endpoint, penalized).completion
            assert classic is not None and served.token_ids != classic.token_ids
    finally:
        oracle.close()
