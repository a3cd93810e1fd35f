"""`specparity serve` returns classic decode's text for every request it accepts.

Every completion is compared with classic decode computed in this process:
mlx-lm's ``stream_generate`` on the whole prompt from an empty cache, with the
request's sampler, logits processors (full history), seed and the server's
cache flags. Requests cover fresh, repeated, prefix-sharing, streamed and
two-turn chat prompts, crossed with repetition_penalty, presence_penalty,
logit_bias and seed, on servers with and without a drafter and ``--kv-bits``.
Plain ``mlx_lm.server`` 0.32.2 runs the same requests and gets some wrong:
the test names them.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import build
from specparity.harness.lifecycle import PORT_ARG, Server

BIN = Path(sys.executable).parent
MAX_TOKENS = 24
KV = ("--kv-bits", "8", "--kv-group-size", "32")
KV8 = (*KV, "--quantized-kv-start", "8")  # quantizes inside every prompt: policy re-prefill

# processor options, each with prompts of its own (no option warms another's cache)
# (prompts on which the fixture's greedy text depends on the prompt part of the history)
OPTIONS: dict[str, dict[str, Any]] = {
    "repetition_penalty": {"repetition_penalty": 1.5},
    "presence_penalty": {"presence_penalty": 1.5},
    "logit_bias": {"logit_bias": {"260": 3.0, "97": -2.0}},
    "seed": {"seed": 0, "repetition_penalty": 1.5},
}
# sampled with a seed: classic decode's own draws (a drafter's sampler-match draws differ)
SAMPLED = {"seed-sampled": {"seed": 7, "temperature": 0.8, "presence_penalty": 1.5}}
STEMS = {
    "repetition_penalty": "def add(a, b):",
    "presence_penalty": "for i in range(10):",
    "logit_bias": "The quick brown fox jumps",
    "seed": "x = add(a, b)",
    "seed-sampled": "class add(a, b):",
}


@dataclass
class Ask:
    """One request of the sequence: its name (kind/option) and body."""

    name: str
    body: dict[str, Any]
    chat_turn: str | None = None  # a two-turn chat: the second turn carries the first's reply


@dataclass
class Answer:
    text: str
    tokens: list[int] | None
    speculative: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def sequence(options: dict[str, dict[str, Any]] = OPTIONS) -> list[Ask]:
    """fresh, repeat, shared prefix, stream (warm) and a two-turn chat, per option."""
    out = []
    for opt, extra in options.items():
        stem = STEMS[opt]
        base: dict[str, Any] = {"max_tokens": MAX_TOKENS, "temperature": 0, **extra}
        out += [
            Ask(f"fresh/{opt}", {**base, "prompt": stem}),
            Ask(f"repeat/{opt}", {**base, "prompt": stem}),
            Ask(f"shared-prefix/{opt}", {**base, "prompt": stem + " return a + b"}),
            Ask(f"stream/{opt}", {**base, "prompt": stem, "stream": True}),
            Ask(f"chat-1/{opt}", {**base, "messages": [{"role": "user", "content": stem}]}),
            Ask(f"chat-2/{opt}", {**base}, chat_turn=stem),
        ]
    return out


class Classic:
    """Classic decode in this process: the reference (mlx-lm's stream_generate, fresh cache)."""

    def __init__(self, model_dir: str, server_flags: tuple[str, ...] = (),
                 trust_remote_code: bool = False):
        from mlx_lm import load

        self.model, self.tokenizer = load(model_dir, trust_remote_code=trust_remote_code)[:2]
        valued = ("--kv-bits", "--kv-group-size", "--quantized-kv-start", "--prefill-step-size")
        flags = {f: server_flags[i + 1] for i, f in enumerate(server_flags) if f in valued}
        self.cache_kw: dict[str, Any] = {}
        self._answers: dict[str, Answer] = {}
        if "--prefill-step-size" in flags:
            self.cache_kw["prefill_step_size"] = int(flags["--prefill-step-size"])
        if "--kv-bits" in flags:
            self.cache_kw |= {"kv_bits": int(flags["--kv-bits"]),
                             "kv_group_size": int(flags.get("--kv-group-size", 64)),
                             "quantized_kv_start": int(flags.get("--quantized-kv-start", 5000))}

    def prompt_ids(self, body: dict[str, Any]) -> list[int]:
        from mlx_lm.server import convert_chat

        tok = self.tokenizer
        if "messages" in body:
            assert not tok.has_chat_template  # the fixture's: mlx-lm's plain chat format
            return list(tok.encode(convert_chat(body["messages"])))
        return list(tok.encode(body["prompt"]))

    def answer(self, body: dict[str, Any]) -> Answer:
        """Classic decode's answer to ``body``, computed once per body (a seeded body reseeds first,
        so its answer is the same each time: the second server's run reads it back)."""
        key = json.dumps(body, sort_keys=True)
        if key not in self._answers:
            self._answers[key] = self._compute(body)
        return self._answers[key]

    def _compute(self, body: dict[str, Any]) -> Answer:
        import mlx.core as mx
        from mlx_lm.generate import stream_generate
        from mlx_lm.sample_utils import make_logits_processors, make_sampler

        tok = self.tokenizer
        if body.get("seed") is not None:
            mx.random.seed(body["seed"])
        sampler = make_sampler(body.get("temperature", 0.0),
                               xtc_special_tokens=tok.encode("\n") + list(tok.eos_token_ids))
        bias = body.get("logit_bias")
        procs = make_logits_processors(
            {int(k): float(v) for k, v in bias.items()} if bias else None,
            body.get("repetition_penalty", 0.0), 20, body.get("presence_penalty", 0.0), 20,
            body.get("frequency_penalty", 0.0), 20)
        text, tokens = "", []
        for r in stream_generate(self.model, tok, mx.array(self.prompt_ids(body)),
                                 body["max_tokens"], sampler=sampler, logits_processors=procs,
                                 **self.cache_kw):
            tokens.append(int(r.token))
            if r.finish_reason != "stop":  # the server drops the stop token's segment
                text += r.text
            if r.finish_reason is not None:
                break
        return Answer(text, tokens)


def ask(srv: Server, body: dict[str, Any]) -> Answer:
    """One request; the text as the client sees it (streamed chunks joined)."""
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"

    def piece(choice: dict[str, Any]) -> str:
        if "text" in choice:
            return choice["text"] or ""
        return (choice.get("message") or choice.get("delta") or {}).get("content") or ""

    if not body.get("stream"):
        r = httpx.post(srv.url + path, json=body, timeout=300)
        assert r.status_code == 200, r.text
        out = r.json()
        spec = out.get("speculative")
        return Answer(piece(out["choices"][0]), spec["tokens"] if spec else None, spec, out)
    text, last = "", {}
    with httpx.stream("POST", srv.url + path, json=body, timeout=300) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                last = json.loads(line[6:])
                text += piece(last["choices"][0])
    spec = last.get("speculative")
    return Answer(text, spec["tokens"] if spec else None, spec, last)


def run_sequence(srv: Server, classic: Classic, asks: list[Ask]) -> dict[str, tuple[Answer, Answer]]:
    """Each request's (served, classic) answers, the chat's second turn built on the first's."""
    out: dict[str, tuple[Answer, Answer]] = {}
    replies: dict[str, str] = {}
    for a in asks:
        body = dict(a.body)
        if a.chat_turn is not None:
            first = a.name.replace("chat-2/", "chat-1/")
            body["messages"] = [{"role": "user", "content": a.chat_turn},
                                {"role": "assistant", "content": replies[first]},
                                {"role": "user", "content": "and then?"}]
        got = ask(srv, body)
        if a.name.startswith("chat-1/"):
            replies[a.name] = got.text
        out[a.name] = (got, classic.answer(body))
    return out


def wrong(results: dict[str, tuple[Answer, Answer]]) -> list[str]:
    """The requests whose served text (or tokens, where the server reports them) is not classic's."""
    bad = []
    for name, (got, want) in results.items():
        if got.text != want.text or (got.tokens is not None and got.tokens != want.tokens):
            bad.append(name)
    return bad


def _server(name: str, argv: list[str], logs: Path, home: Path) -> Server:
    return Server(argv, log_path=logs / f"{name}.log", name=name, start_timeout=300,
                  env={"SPECPARITY_HOME": str(home)})


def plain_argv(model: str, draft: str | None, flags: tuple[str, ...]) -> list[str]:
    argv = [str(BIN / "mlx_lm.server"), "--model", model, "--port", PORT_ARG, *flags]
    return argv + (["--draft-model", draft, "--num-draft-tokens", "3"] if draft else [])


def serve_argv(model: str, draft: str | None, flags: tuple[str, ...]) -> list[str]:
    argv = [str(BIN / "specparity"), "serve", "--model", model, "--port", PORT_ARG, *flags]
    return argv + (["--draft-model", draft, "--num-draft-tokens", "3"] if draft else [])


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("exact-logs")


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("exact-home")


@pytest.fixture(scope="module")
def pair(fixture_root):
    return build(fixture_root, "llama-float32", arch="llama")


# -- the fast representative: speculative decoding with a penalty, fresh and warm --------------

@pytest.mark.server
@pytest.mark.model
def test_penalized_speculative_requests_equal_classic_decode_fresh_and_warm(pair, logs, home):
    classic = Classic(pair.target)
    asks = [a for a in sequence({"repetition_penalty": OPTIONS["repetition_penalty"]})
            if a.name.split("/")[0] in ("fresh", "repeat", "shared-prefix")]
    with _server("fast-serve", serve_argv(pair.target, pair.draft, ()), logs, home) as srv:
        results = run_sequence(srv, classic, asks)
    assert wrong(results) == []
    for got, _ in results.values():
        spec = got.speculative
        assert spec is not None and spec["engaged"] and spec["decision"] == "ALLOW"
        assert spec["prompt_cache"]["policy"] == "reuse" and spec["path"] == "speculative"
    spec = results["repeat/repetition_penalty"][0].speculative
    assert spec is not None and spec["prompt_cache"]["reused"] > 0


# -- the matrix: specparity serve right everywhere, plain mlx_lm.server named where it is not ---

CONFIGS: dict[str, tuple[bool, tuple[str, ...], dict[str, dict[str, Any]], set[str]]] = {
    # name: (drafter?, flags, options, requests plain mlx_lm.server 0.32.2 must get wrong)
    # speculative decoding hands its processors only the last prompt token, fresh or warm
    "drafter": (True, (), OPTIONS, {"fresh/repetition_penalty", "fresh/presence_penalty",
                                    "repeat/repetition_penalty", "repeat/seed"}),
    "drafter-kv": (True, KV, OPTIONS, {"fresh/repetition_penalty", "repeat/seed"}),
    # a seed forces the sequential path: a warm request's processors see only its suffix
    "no-drafter": (False, (), {**OPTIONS, **SAMPLED}, {"repeat/seed"}),
    # --kv-bits forces it too (and quantizes inside every prompt here: policy re-prefill)
    "no-drafter-kv": (False, KV8, {**OPTIONS, **SAMPLED},
                      {"repeat/repetition_penalty", "repeat/presence_penalty", "repeat/seed"}),
}


@pytest.mark.slow
@pytest.mark.server
@pytest.mark.model
@pytest.mark.parametrize("config", list(CONFIGS))
def test_every_request_equals_classic_decode_where_plain_mlx_lm_server_does_not(
        config, pair, logs, home, capsys):
    drafter, flags, options, plain_wrong = CONFIGS[config]
    draft = pair.draft if drafter else None
    classic = Classic(pair.target, flags)
    asks = sequence(options)
    with _server(f"{config}-serve", serve_argv(pair.target, draft, flags), logs, home) as srv:
        served = run_sequence(srv, classic, asks)
        log_text = Path(str(srv.log_path)).read_text()
    with _server(f"{config}-plain", plain_argv(pair.target, draft, flags), logs, home) as srv:
        plain = run_sequence(srv, classic, asks)
    with capsys.disabled():
        print(f"\n[{config}] plain mlx_lm.server differs from classic decode on:"
              f" {', '.join(wrong(plain)) or 'nothing'}")
    assert wrong(served) == [], wrong(served)
    assert plain_wrong <= set(wrong(plain)), wrong(plain)
    for name, (got, _) in served.items():
        spec = got.speculative
        assert spec is not None, name
        pc = spec["prompt_cache"]
        assert pc["policy"] in ("reuse", "re-prefill") and pc["prompt_tokens"] == len(spec["prompt_ids"])
        if name.startswith("fresh/"):
            assert pc["outcome"] == "miss", (name, pc)  # no other prompt warmed it
        if drafter:  # engaged, or declined with the gate's evidence: never silently other text
            assert spec["engaged"] or (spec["declined"] and spec["reason"]), name
        # which of mlx-lm's paths served it: a drafter's, else the batch loop unless a seed,
        # --kv-bits or the re-prefill policy sends it one at a time
        body = next(a.body for a in asks if a.name == name)
        if drafter:
            want = "speculative" if spec["engaged"] else "sequential"
        else:
            want = "sequential" if body.get("seed") is not None or flags else "batch"
        assert spec["path"] == want, (name, spec["path"])
        temperature = body.get("temperature", 0)
        assert spec["draws"] == ("greedy" if temperature == 0 else "distribution" if spec["engaged"]
                                 else "seeded-classic"), name
    if drafter and not flags:
        assert all(got.speculative is not None and got.speculative["engaged"] for got, _ in served.values())
    policy = re.search(r"specparity-serve: PROMPT-CACHE policy=(\S+)", log_text)
    assert policy is not None
    assert policy.group(1) == ("re-prefill" if flags == KV8 else "reuse")


# -- the rows >= 5 fault checkpoint: the gate allows 2-4, declines 5+, the cache re-prefills ------

# scale 1.5: large enough that computing a position in a 1-4 row call instead of a 5+ row
# one flips greedy tokens (the default 1 + 2**-6 flips none on these prompts)
ROWS5 = [{"kind": "rows", "layer": 2, "subop": "mlp", "min_rows": 5, "scale": 1.5}]


@pytest.mark.slow
@pytest.mark.server
@pytest.mark.model
@pytest.mark.parametrize("step", [None, 4], ids=["default-step", "prefill-step-4"])
def test_rows5_fault_allows_widths_2_to_4_and_re_prefills_what_chunking_would_change(
        step, fixture_root, logs, home, capsys):
    """A kernel fault in calls of >= 5 rows: verify blocks of 2-4 rows are exact, prefill is
    chunk-dependent. Widths 2-4 are allowed, 5+ declined; the prompt-cache policy is
    re-prefill, and every request (a repeat, a shared prefix, a chat's second turn) equals a
    fresh classic decode, where a plain server's prompt cache returns other text."""
    info = build(fixture_root, "llama-rows5", arch="llama", faults=ROWS5)
    flags = ("--trust-remote-code",) + (("--prefill-step-size", str(step)) if step else ())
    classic = Classic(info.target, flags, trust_remote_code=True)
    prompt = "The quick brown fox jumps over the lazy dog. Pack my box"
    asks = [
        Ask("fresh", {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}),
        Ask("repeat", {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}),
        Ask("shared-prefix", {"prompt": prompt + " with", "max_tokens": MAX_TOKENS,
                              "temperature": 0}),
        Ask("chat-1/x", {"messages": [{"role": "user", "content": prompt}],
                         "max_tokens": MAX_TOKENS, "temperature": 0}),
        Ask("chat-2/x", {"max_tokens": MAX_TOKENS, "temperature": 0}, chat_turn=prompt),
    ]
    name = f"rows5-{step or 'default'}"
    with _server(f"{name}-serve", serve_argv(info.target, info.draft, flags), logs, home) as srv:
        widths = {k + 1: ask(srv, {"prompt": f"numbers: {k} 2 3 4 5", "max_tokens": 8,
                                   "temperature": 0, "num_draft_tokens": k}).speculative
                  for k in range(1, 7)}
        served = run_sequence(srv, classic, asks)
        log_text = Path(str(srv.log_path)).read_text()
        metrics = scrape(srv)
    with _server(f"{name}-plain", plain_argv(info.target, None, flags), logs, home) as srv:
        plain = run_sequence(srv, classic, asks)
    if step is None:  # without a drafter, re-prefill serves requests one at a time: never batched
        with _server(f"{name}-serve-alone", serve_argv(info.target, None, flags), logs, home) as srv:
            alone = ask(srv, asks[0].body)
        assert alone.speculative is not None and alone.text == served["fresh"][1].text
        assert alone.speculative["path"] == "sequential"
        assert alone.speculative["prompt_cache"]["policy"] == "re-prefill"
    with capsys.disabled():
        print(f"\n[rows5 {name}] plain mlx_lm.server differs from classic decode on:"
              f" {', '.join(wrong(plain)) or 'nothing'}")

    for w, spec in widths.items():
        assert spec is not None
        assert spec["engaged"] == (w <= 4) and spec["declined"] == (w >= 5), (w, spec["reason"])
        if w >= 5:
            assert spec["reason"].startswith("divergent: divergent at width")
    for w in (2, 3, 4):
        assert re.search(rf"specparity-gate: ALLOW width={w} ", log_text)
    for w in (5, 6, 7):
        assert re.search(rf"specparity-gate: DECLINE width={w} ", log_text)
    assert re.search(r"specparity-serve: PROMPT-CACHE policy=re-prefill .*prefill parity", log_text)

    assert wrong(served) == [], wrong(served)
    if step is None:  # its cache held the first reply decoded row by row, a fresh prefill not
        assert "chat-2/x" in wrong(plain)
    pcs = {name: (got.speculative or {})["prompt_cache"] for name, (got, _) in served.items()}
    assert all(pc["policy"] == "re-prefill" for pc in pcs.values())
    n = pcs["repeat"]["prompt_tokens"]
    # the repeat reuses the prefill it shares whole (the same calls as a fresh one) ...
    assert pcs["repeat"]["outcome"] == "hit" and pcs["repeat"]["reused"] == n - 1
    # ... a longer prompt only the full prefill chunks it shares, else nothing
    shared = pcs["shared-prefix"]
    assert shared["shared"] >= n - 1 and shared["reused"] == ((n - 1) // step * step if step else 0)
    assert shared["outcome"] == ("partial" if step else "re-prefilled") and shared["reason"]

    # /metrics says the same: the policy, and every lookup by what its response said it did
    responses = [*widths.values(), *((got.speculative or {}) for got, _ in served.values())]
    assert metrics[("specparity_prompt_cache_policy", (("policy", "re-prefill"),))] == 1
    assert metrics[("specparity_prompt_cache_policy", (("policy", "reuse"),))] == 0
    outcomes = Counter(spec["prompt_cache"]["outcome"] for spec in responses if spec)
    assert {"miss", "hit"} <= set(outcomes) and len(responses) == 6 + len(asks)
    lookups = {dict(k[1])["outcome"]: v for k, v in metrics.items()
               if k[0] == "specparity_prompt_cache_lookups_total"}
    assert lookups == {o: float(n) for o, n in outcomes.items()}, (lookups, outcomes)
    assert all(dict(k[1])["policy"] == "re-prefill" for k in metrics
               if k[0] == "specparity_prompt_cache_lookups_total")
    assert metrics[("specparity_prompt_cache_reused_tokens_total", (("policy", "re-prefill"),))] == sum(
        spec["prompt_cache"]["reused"] for spec in responses if spec)


def scrape(srv: Server) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The server's /metrics samples by (name, sorted labels)."""
    from prometheus_client.parser import text_string_to_metric_families

    r = httpx.get(srv.url + "/metrics", timeout=30)
    assert r.status_code == 200
    return {(x.name, tuple(sorted(x.labels.items()))): x.value
            for f in text_string_to_metric_families(r.text) for x in f.samples}
