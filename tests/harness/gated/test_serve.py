"""specparity serve on real server processes: gate, text, counts, replay, cache state, bad input.

Every server is a real process on 127.0.0.1 started by the one lifecycle
(``specparity.harness.lifecycle``), on the embedded fixtures; baselines are a
plain ``mlx_lm.server`` without a drafter, or a fresh in-process classic decode.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

import httpx
import pytest
from conftest import build, run_cli
from specparity.harness.lifecycle import PORT_ARG, Server

BIN = Path(sys.executable).parent
# A verify-kernel fault: multi-row calls (>= 4 rows) past 12 cached positions. It diverges
# at widths >= 4 in decode, while prefill (one-shot from 0; the gate's chunked arm starts
# its second chunk below 12 on the built-in prompts) stays exact, so the gate's prefill
# parity passes and widths 2 and 3 are allowed.
FAULT = [{"kind": "depth", "layer": 2, "subop": "mlp", "min_rows": 4, "min_offset": 12}]
PROMPTS = ["the quick brown fox", "hello world, this is a test of", "once upon a time there"]
# prompts on which the fault fixture's speculative text leaves classic within MAX_TOKENS
FAULT_PROMPTS = ["numbers: 1 2 3 4 5", "The quick brown fox jumps over the lazy dog."]
MAX_TOKENS = 24


def _server(name: str, argv: list[str], logs: Path, home: Path, **env: str) -> Server:
    return Server(argv, log_path=logs / f"{name}.log", name=name, start_timeout=300,
                  env={"SPECPARITY_HOME": str(home), **env})


def _plain(model: str, *extra: str) -> list[str]:
    return [str(BIN / "mlx_lm.server"), "--model", model, "--port", PORT_ARG, *extra]


def _serve(model: str, draft: str | None, *extra: str) -> list[str]:
    argv = [str(BIN / "specparity"), "serve", "--model", model, "--port", PORT_ARG]
    return argv + (["--draft-model", draft] if draft else []) + list(extra)


def complete(srv: Server, prompt: str, **body) -> dict:
    r = httpx.post(srv.url + "/v1/completions", timeout=120,
                   json={"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()


def text(resp: dict) -> str:
    return resp["choices"][0]["text"]


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("serve-home")


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("serve-logs")


@pytest.fixture(scope="module")
def clean(fixture_root, logs, home):
    """A drafter-less mlx_lm.server and specparity serve with the drafter, on the clean pair."""
    info = build(fixture_root, "llama-float32", arch="llama")
    base = _server("clean-plain", _plain(info.target), logs, home).start()
    ours = None
    try:
        ours = _server("clean-serve", _serve(info.target, info.draft, "--num-draft-tokens", "3"),
                       logs, home).start()
        yield info, base, ours
    finally:
        for s in (ours, base):
            if s is not None:
                s.stop()


@pytest.fixture(scope="module")
def fault(fixture_root, logs, home):
    """The rows>=4 fault pair: a drafter-less baseline and specparity serve."""
    info = build(fixture_root, "llama-depth12-rows4", arch="llama", faults=FAULT)
    base = _server("fault-plain", _plain(info.target, "--trust-remote-code"), logs, home).start()
    ours = None
    try:
        ours = _server("fault-serve", _serve(info.target, info.draft, "--trust-remote-code"),
                       logs, home).start()
        yield info, base, ours
    finally:
        for s in (ours, base):
            if s is not None:
                s.stop()


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.server
def test_clean_pair_engages_at_several_widths_with_baseline_text(clean, tmp_path, cli_bin):
    info, base, ours = clean
    engaged = []
    for k in (1, 3, 5):  # widths 2, 4, 6
        for p in PROMPTS:
            want = complete(base, p)
            got = complete(ours, p, num_draft_tokens=k)
            assert text(got) == text(want), (k, p)
            spec = got["speculative"]
            assert spec["engaged"] and spec["decision"] == "ALLOW" and spec["width"] == k + 1
            assert spec["rule"] == "greedy-argmax"
            assert spec["rounds"] == len(spec["accepts"]) > 0
            assert got["timings"]["draft_n"] == spec["proposed"] == sum(w - 1 for w in spec["widths"])
            assert got["timings"]["draft_n_accepted"] == spec["accepted"] == sum(spec["accepts"])
            engaged.append(spec)
    assert any(s["accepted"] for s in engaged)  # the drafter's proposals were taken

    # the replayer reads the response field as it is ...
    body = tmp_path / "responses.jsonl"
    body.write_text(json.dumps(engaged[4]) + "\n")
    r = run_cli(cli_bin, "replay", "--log", str(body), "--model", info.target, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["verdict"] == "equal"
    # ... and the server's log, one SPEC line per request
    log_text = Path(ours.log_path).read_text()
    lines = [ln for ln in log_text.splitlines() if "specparity-serve: SPEC " in ln]
    assert len(lines) >= len(engaged)
    one = tmp_path / "one.log"
    one.write_text(next(ln for ln in lines if engaged[4]["request_id"] in ln) + "\n")
    r = run_cli(cli_bin, "replay", "--log", str(one), "--model", info.target)
    assert r.returncode == 0, r.stderr
    for key in ("width=6", "rounds=", "proposed=", "positions_tested=", "accepted=",
                "per_position_acceptance=", "acceptance_rate=", "mean_accepted_len=", "accepts=["):
        assert key in lines[-1]
    # the gate probed each width once: one ALLOW line per width
    for w in (2, 4, 6):
        assert len(re.findall(rf"specparity-gate: ALLOW width={w} ", log_text)) == 1


@pytest.mark.model
@pytest.mark.server
def test_streaming_and_sampled_requests_report_the_rule(clean):
    _, base, ours = clean
    want = text(complete(base, PROMPTS[0]))
    chunks = []
    with httpx.stream("POST", ours.url + "/v1/completions", timeout=120,
                      json={"prompt": PROMPTS[0], "max_tokens": MAX_TOKENS, "temperature": 0,
                            "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    assert "".join(c["choices"][0].get("text", "") for c in chunks) == want
    last = chunks[-1]
    assert last["speculative"]["engaged"] and last["speculative"]["rule"] == "greedy-argmax"
    assert last["timings"]["draft_n"] == last["speculative"]["proposed"]
    assert last["speculative"]["path"] == "speculative" and last["speculative"]["draws"] == "greedy"
    hot = complete(ours, PROMPTS[1], temperature=0.8, seed=7)
    assert hot["speculative"]["engaged"] and hot["speculative"]["rule"] == "sampler-match"
    assert re.search(rf"SPEC request={hot['id']} rule=sampler-match ",
                     Path(ours.log_path).read_text())
    # drafted sampling: mlx-lm's sampler-match draws other tokens than classic decode with that
    # seed (from the same distribution), and the response says so ...
    assert hot["speculative"]["draws"] == "distribution"
    # ... declined (one verify row): classic decode's own draws for the seed, a drafter-less
    # server's text
    declined = complete(ours, PROMPTS[1], temperature=0.8, seed=7, num_draft_tokens=0)
    cold = declined["speculative"]
    assert cold["declined"] and cold["path"] == "sequential" and cold["draws"] == "seeded-classic"
    assert text(declined) == text(complete(base, PROMPTS[1], temperature=0.8, seed=7))


@pytest.mark.model
@pytest.mark.server
def test_metrics_count_what_the_responses_reported(clean):
    from prometheus_client.parser import text_string_to_metric_families

    _, _, ours = clean

    def scrape() -> dict:
        r = httpx.get(ours.url + "/metrics", timeout=30)
        assert r.status_code == 200
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for f in text_string_to_metric_families(r.text) for s in f.samples}

    before = scrape()
    resps = [complete(ours, p, num_draft_tokens=2)["speculative"] for p in PROMPTS]
    after = scrape()

    def delta(name, labels=()):
        return after.get((name, labels), 0) - before.get((name, labels), 0)

    # the prompt cache: the policy said at start-up, each lookup counted by what the response says
    assert after[("specparity_prompt_cache_policy", (("policy", "reuse"),))] == 1
    assert after[("specparity_prompt_cache_policy", (("policy", "re-prefill"),))] == 0
    outcomes = Counter(s["prompt_cache"]["outcome"] for s in resps)
    for outcome in ("miss", "hit", "partial", "re-prefilled"):
        labels = (("outcome", outcome), ("policy", "reuse"))
        assert delta("specparity_prompt_cache_lookups_total", labels) == outcomes[outcome], outcome
    assert delta("specparity_prompt_cache_reused_tokens_total", (("policy", "reuse"),)) == sum(
        s["prompt_cache"]["reused"] for s in resps)

    assert delta("spec_decode_num_drafts_total") == sum(s["rounds"] for s in resps)
    assert delta("spec_decode_num_draft_tokens_total") == sum(s["proposed"] for s in resps)
    assert delta("spec_decode_num_accepted_tokens_total") == sum(s["accepted"] for s in resps)
    assert delta("spec_decode_num_accepted_tokens_per_pos_total", (("position", "0"),)) == sum(
        s["accepted_per_position"][0] if s["accepted_per_position"] else 0 for s in resps)
    assert delta("specparity_gate_decisions_total", (("decision", "ALLOW"), ("width", "3"))) == 3


@pytest.mark.model
@pytest.mark.server
@pytest.mark.slow
def test_repeated_and_prefix_sharing_requests_equal_a_fresh_process(clean, fixture_root):
    """The prompt cache reused across requests holds exactly its tokens (mlx-lm 0.32's does not)."""
    info, _, ours = clean
    fresh = _fresh_classic(info.target)
    a, b = "the quick brown fox", "the quick brown fox jumps over the lazy"
    sequence = [(a, 3), (a, 3), (b, 3), (a, 3), (b, 0), (b, 3), (a + " dog", 2), (a, 3)]
    accepts: dict[tuple[str, int], list[int]] = {}
    for prompt, k in sequence:  # k = 0: one verify row, the gate declines: classic decode
        got = complete(ours, prompt, num_draft_tokens=k)
        spec = got["speculative"]
        assert spec["tokens"] == fresh(spec["prompt_ids"]), (prompt, k)
        assert spec["engaged"] == (k > 0)
        if spec["engaged"]:
            accepts.setdefault((prompt, k), spec["accepts"])
            if prompt == a and k == 3:  # the drafter's cache is exact too: same rounds again
                assert spec["accepts"] == accepts[(prompt, k)]
        else:
            assert spec["declined"] and "W < 2" in spec["reason"]
    assert httpx.get(ours.url + "/health", timeout=10).status_code == 200


def _fresh_classic(model_dir: str, **cache_kw):
    """Greedy classic decode in this process, from an empty cache: the reference."""
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import stream_generate

    model, tok = load(model_dir)[:2]

    def run(prompt_ids: list[int]) -> list[int]:
        return [r.token for r in stream_generate(model, tok, mx.array(prompt_ids), MAX_TOKENS,
                                                 **cache_kw)]

    return run


@pytest.mark.model
@pytest.mark.server
@pytest.mark.slow
def test_quantized_kv_cache_reuse_equals_a_fresh_process(fixture_root, logs, home):
    info = build(fixture_root, "llama-float32", arch="llama")
    kv = ["--kv-bits", "8", "--kv-group-size", "32", "--quantized-kv-start", "8"]
    fresh = _fresh_classic(info.target, kv_bits=8, kv_group_size=32, quantized_kv_start=8)
    with _server("kv8-serve", _serve(info.target, info.draft, *kv), logs, home) as ours:
        a = "hello world, this is a test of"
        for prompt, k in [(a, 3), (a, 3), (a + " the cache", 3), (a, 0), (a, 3)]:
            spec = complete(ours, prompt, num_draft_tokens=k)["speculative"]
            assert spec["tokens"] == fresh(spec["prompt_ids"]), (prompt, k)


@pytest.mark.model
@pytest.mark.server
@pytest.mark.slow
def test_fault_declined_at_exactly_the_divergent_widths(fault, home):
    from specparity.probes.gate import GateStore, gate_key

    from specparity.decode import CacheOptions

    info, base, ours = fault
    store = GateStore(home / "gate" / "store.json")
    for k in (1, 2, 3, 5, 3):  # widths 2, 3, 4, 6, and 4 again
        for p in FAULT_PROMPTS:
            got = complete(ours, p, num_draft_tokens=k)
            spec = got["speculative"]
            assert text(got) == text(complete(base, p)), (k, p)
            probe = store.get(gate_key(info.target, k + 1, CacheOptions())[0])
            assert probe is not None  # the server's probe, memoized
            assert spec["declined"] == (probe["verdict"] != "equal") == (k + 1 >= 4), k
            assert spec["engaged"] == (not spec["declined"])
            if spec["declined"]:
                assert spec["decision"] == "DECLINE" and probe["reason"] in spec["reason"]
                assert got["timings"]["draft_n"] == 0
    log_text = Path(ours.log_path).read_text()
    for w in (4, 6):  # the fixed decline line names the probe's reason, once per width
        lines = re.findall(rf"specparity-gate: DECLINE width={w} .*", log_text)
        assert len(lines) == 1 and 'reason="divergent: ' in lines[0]
        assert len(re.findall(rf"specparity-serve: DECLINED request=\S+ width={w} ", log_text)) \
            == (4 if w == 4 else 2)
    for w in (2, 3):
        assert len(re.findall(rf"specparity-gate: ALLOW width={w} ", log_text)) == 1


@pytest.mark.model
@pytest.mark.server
@pytest.mark.slow
def test_allow_inexact_engages_the_declined_arm_and_it_diverges(fault, logs, home):
    info, base, _ = fault
    argv = _serve(info.target, info.draft, "--trust-remote-code", "--num-draft-tokens", "3")
    with _server("fault-forfeit", argv, logs, home, SPECPARITY_ALLOW_INEXACT="1") as ours:
        diverged = 0
        for p in FAULT_PROMPTS:
            got = complete(ours, p)
            spec = got["speculative"]
            assert spec["engaged"] and spec["forfeit"] and spec["decision"] == "FORFEIT"
            diverged += text(got) != text(complete(base, p))
        assert diverged == len(FAULT_PROMPTS)
        assert ours.log_path is not None  # a started server has its log
        log_text = Path(ours.log_path).read_text()
    assert re.search(r"specparity-gate: FORFEIT width=4 .*reason=\"divergent: ", log_text)
    assert "decision=FORFEIT" in log_text


@pytest.mark.model
@pytest.mark.server
@pytest.mark.slow
def test_bad_input_keeps_the_server_serving(clean, logs, home, tmp_path):
    info, base, ours = clean
    # a width the server cannot draft, and one mlx-lm refuses: clear answers, then service
    r = httpx.post(ours.url + "/v1/completions", timeout=60,
                   json={"prompt": "x", "max_tokens": 4, "num_draft_tokens": -1})
    assert r.status_code == 400 and "num_draft_tokens" in r.json()["error"]
    one = complete(ours, PROMPTS[0], num_draft_tokens=0)["speculative"]
    assert one["declined"] and one["width"] == 1 and "W < 2" in one["reason"]
    # a request naming a draft model that will not load: mlx-lm's error response
    r = httpx.post(ours.url + "/v1/completions", timeout=60,
                   json={"prompt": "x", "max_tokens": 4, "draft_model": str(tmp_path / "nope")})
    assert r.status_code >= 400 and "error" in r.json()
    assert text(complete(ours, PROMPTS[0])) == text(complete(base, PROMPTS[0]))

    # an unreadable --draft-model at start-up: said once, then classic decode, still serving
    bad = tmp_path / "bad-draft"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    argv = _serve(info.target, str(bad), "--gate", "off")
    with _server("bad-draft", argv, logs, home) as srv:
        got = complete(srv, PROMPTS[0])
        assert text(got) == text(complete(base, PROMPTS[0]))
        spec = got["speculative"]
        assert not spec["engaged"] and str(bad) in spec["reason"] and "would not load" in spec["reason"]
        assert srv.log_path is not None  # a started server has its log
        log_text = Path(srv.log_path).read_text()
    assert "specparity-serve: DRAFT-UNAVAILABLE draft model " + str(bad) in log_text
    assert "specparity-serve: GATE-OFF" in log_text
    assert "Traceback" not in log_text


def test_bad_flag_is_one_usage_line(cli_bin):
    r = run_cli(cli_bin, "serve", "--model", "m", "--port", "notaport")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "Error: argument --port: invalid int value: 'notaport'"]
