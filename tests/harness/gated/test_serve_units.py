"""specparity serve's parts in process: the round counts, the log line read back, cache exactness."""

from __future__ import annotations

import threading
from typing import Any

import mlx.core as mx
import pytest
from conftest import build
from specparity.harness.gated.cache import ExactPromptCache, SplitCache, exact_entry, offsets
from specparity.harness.gated.stats import ServeMetrics, SpecStats, rule_for
from specparity.probes.replay.logs import read_log

from specparity.errors import UsageError


def _stats(flags: list[bool], k: int = 3, max_tokens: int = 100) -> SpecStats:
    s = SpecStats(request_id="cmpl-1", engaged=True, decision="ALLOW", width=k + 1,
                  num_draft_tokens=k, max_tokens=max_tokens, prompt_ids=[5, 6, 7])
    for i, f in enumerate(flags):
        s.add(100 + i, f)
    return s


def test_counts_use_positions_tested_not_proposed():
    # rounds: accept 3 (full), accept 0, accept 1, accept 2 -> 4 rounds, 12 proposed
    flags = [True, True, True, False] + [False] + [True, False] + [True, True, False]
    s = _stats(flags).summary()
    assert s["rounds"] == 4 and s["proposed"] == 12 and s["accepted"] == 6
    # a full accept tests 3 positions, a rejection at position a tests a + 1
    assert s["positions_tested"] == 3 + 1 + 2 + 3
    assert s["per_position_acceptance"] == pytest.approx(6 / 9)
    assert s["acceptance_rate"] == pytest.approx(6 / 12)
    assert s["mean_accepted_len"] == pytest.approx(6 / 4)
    assert s["tested_per_position"] == [4, 3, 2] and s["accepted_per_position"] == [3, 2, 1]


def test_a_round_cut_by_the_budget_tests_only_what_it_accepted():
    s = _stats([True, False, True, True], k=3, max_tokens=4)
    accepts, widths = s.rounds_view
    assert accepts == [1, 2] and widths == [4, 3]  # mlx-lm drafts min(K, budget left) + 1 rows
    assert s.summary()["positions_tested"] == 2 + 2


def test_not_engaged_counts_nothing_and_says_why():
    s = SpecStats(request_id="cmpl-2", declined=True, decision="DECLINE", width=4,
                  num_draft_tokens=3, max_tokens=8, gate_key="abcdef123456",
                  reason='divergent: at width 4 "row 0"')
    s.add(1, False)
    assert s.summary()["rounds"] == 0 and s.timings()["draft_n"] == 0
    line = s.log_line()
    assert line.startswith("specparity-serve: DECLINED request=cmpl-2 width=4 key=abcdef123456")
    assert "reason=\"divergent: at width 4 'row 0'\"" in line
    r = s.to_response()
    assert r["engaged"] is False and r["declined"] is True and "format" not in r


def test_rule_names():
    assert rule_for(0) == "greedy-argmax" and rule_for(0.7) == "sampler-match"


def test_log_line_and_response_read_back_by_the_replayer(tmp_path):
    import json

    s = _stats([True, False, False, True, True, True, False], k=3)
    log = tmp_path / "server.log"
    log.write_text("2026-01-01 - INFO - other line\n"
                   f"2026-01-01 - INFO - {s.log_line()}\n"
                   "127.0.0.1 - - POST /v1/completions 200\n")
    (req,) = read_log(log)  # auto-detected
    assert req.accepts == [1, 0, 3] and req.width == 4 and req.widths == [4, 4, 4]
    assert req.prompt_ids == [5, 6, 7] and req.tokens == s.tokens
    assert req.meta["rule"] == "greedy-argmax" and not req.prefill_emits
    body = tmp_path / "resp.jsonl"
    body.write_text(json.dumps(s.to_response()) + "\n")
    (same,) = read_log(body)
    assert (same.accepts, same.widths, same.prompt_ids) == (req.accepts, req.widths, req.prompt_ids)


def test_truncated_serve_line_is_an_error_naming_the_line(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("x\nspecparity-serve: SPEC request=a rule=greedy-argmax width=4 accepts=[1,2\n")
    with pytest.raises(UsageError, match=r"server.log:2: .*accepts"):
        read_log(log)


def test_metrics_use_vllm_names():
    from prometheus_client.parser import text_string_to_metric_families

    m = ServeMetrics()
    m.observe(_stats([True, True, False, False]))
    m.observe(SpecStats(declined=True, decision="DECLINE", width=4, num_draft_tokens=3))
    body, ctype = m.exposition()
    assert ctype.startswith("text/plain")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(body.decode()) for s in f.samples}
    assert samples[("spec_decode_num_drafts_total", ())] == 2
    assert samples[("spec_decode_num_draft_tokens_total", ())] == 6
    assert samples[("spec_decode_num_accepted_tokens_total", ())] == 2
    assert samples[("spec_decode_num_accepted_tokens_per_pos_total", (("position", "1"),))] == 1
    assert samples[("specparity_gate_decisions_total",
                    (("decision", "DECLINE"), ("width", "4")))] == 1


# -- cache exactness, in process, on mlx-lm's own speculative loop ------------------------------

def _pair(fixture_root):
    from mlx_lm import load

    info = build(fixture_root, "llama-float32", arch="llama")
    assert info.draft is not None
    model, tok = load(info.target)  # type: ignore[misc]  # mlx-lm types load() as a 2- or 3-tuple Union
    draft, _ = load(info.draft)  # type: ignore[misc]
    return model, draft, tok


def _speculate(model, draft, tok, cache, prompt, n=12, **kw):
    from mlx_lm.generate import stream_generate

    return [r.token for r in stream_generate(model, tok, mx.array(prompt), n, draft_model=draft,
                                             prompt_cache=cache, num_draft_tokens=3, **kw)]


@pytest.mark.model
def test_upstream_files_a_speculative_cache_one_token_short_and_exact_cache_refiles_it(
        fixture_root):
    from mlx_lm.models.cache import make_prompt_cache

    model, draft, tok = _pair(fixture_root)
    prompt = tok.encode("the quick brown fox")
    cache = make_prompt_cache(model) + make_prompt_cache(draft)
    toks = _speculate(model, draft, tok, cache, prompt)
    key = prompt + toks  # what mlx_lm.server files the entry under
    n = len(model.layers)
    held = offsets(cache)
    assert held is not None
    assert max(held[:n]) < len(key)  # the target never ran its last emitted token
    fixed = exact_entry(key, cache)
    assert fixed is not None and offsets(cache) == [len(fixed)] * len(cache)
    store = ExactPromptCache(4)
    store.insert_cache("m", key, cache)
    got, rest = store.fetch_nearest_cache("m", prompt)
    assert got is not None and offsets(got) == [len(prompt) - len(rest)] * len(got)  # exactly what it is filed under


@pytest.mark.model
def test_split_cache_keeps_quantized_layers_that_mlx_lm_assigns_into_a_slice(fixture_root):
    from mlx_lm.models.cache import QuantizedKVCache, make_prompt_cache

    model, draft, tok = _pair(fixture_root)
    prompt = tok.encode("the quick brown fox jumps over")
    kw = {"kv_bits": 8, "kv_group_size": 32, "quantized_kv_start": 4}
    plain = make_prompt_cache(model) + make_prompt_cache(draft)
    _speculate(model, draft, tok, plain, prompt, **kw)
    assert not any(isinstance(c, QuantizedKVCache) for c in plain)  # upstream: left stale
    split = SplitCache(make_prompt_cache(model) + make_prompt_cache(draft))
    _speculate(model, draft, tok, split, prompt, **kw)
    assert all(isinstance(c, QuantizedKVCache) for c in split)
    target_offsets = offsets(list(split)[: len(model.layers)])
    assert target_offsets is not None and len(set(target_offsets)) == 1


def test_a_gate_that_cannot_run_declines_with_its_reason(tmp_path, caplog):
    import argparse

    from specparity.harness.gated.gate import GateMemo, ServeConfig

    cli = argparse.Namespace(trust_remote_code=False, kv_bits=None, kv_group_size=64,
                             quantized_kv_start=5000, prefill_step_size=2048)
    memo = GateMemo(ServeConfig(), cli)
    caplog.set_level("WARNING", logger="specparity.serve")
    d = memo.decide(str(tmp_path), 4)  # a directory that is not a checkpoint
    assert not d.allow and d.verdict == "not_run" and "the gate could not run" in d.reason
    assert memo.decide(str(tmp_path), 4) is d  # asked once per width
    lines = [r.message for r in caplog.records if "specparity-gate: DECLINE width=4" in r.message]
    assert len(lines) == 1


# -- processors with classic decode's history (issue 18) ------------------------------------------

def test_missing_prefix_per_path():
    from specparity.mlx_server import missing_prefix

    prompt = [5, 6, 7, 8]
    assert missing_prefix(prompt, prompt, speculative=True) == [5, 6, 7]  # keeps only the last
    assert missing_prefix(prompt, prompt, speculative=False) == []  # classic on the whole prompt
    assert missing_prefix(prompt, [7, 8], speculative=False) == [5, 6]  # after a cache hit
    assert missing_prefix(prompt, [8], speculative=True) == [5, 6, 7]
    with pytest.raises(ValueError, match="not the end"):
        missing_prefix(prompt, [6, 7], speculative=False)


def test_with_history_hands_each_processor_the_prefix_first():
    from specparity.mlx_server import with_history

    seen = []

    def record(tokens, logits):
        seen.append(tokens.tolist())
        return logits + 1

    assert with_history(None, [1]) is None and with_history([record], []) == [record]
    processors = with_history([record], [1, 2])
    assert processors is not None
    (wrapped,) = processors
    out = wrapped(mx.array([3, 4], dtype=mx.int32), mx.zeros((1, 4)))
    assert seen == [[1, 2, 3, 4]] and out.tolist() == [[1.0] * 4]
    wrapped(mx.array([5], dtype=mx.uint32), mx.zeros((1, 4)))
    assert seen[-1] == [1, 2, 5]


def test_with_history_leaves_mlx_lms_logit_bias_alone_and_wraps_a_penalty_beside_it():
    """The logit bias never reads its tokens: it is handed on as it is (no array built on every token);
    a penalty in the same list still sees the prefix, and the logits are what each computes."""
    from mlx_lm.sample_utils import make_logits_processors
    from specparity.mlx_server import with_history

    only_bias = make_logits_processors(logit_bias={2: 5.0})
    assert with_history(only_bias, [1, 2, 3]) is only_bias
    bias, penalty = make_logits_processors(logit_bias={2: 5.0}, repetition_penalty=2.0)
    got = with_history([bias, penalty], [1, 2])
    assert got is not None and got[0] is bias and got[1] is not penalty
    # the penalty sees 1, 2 (the prefix) and 4: those ids are divided by 2 (mlx-lm's penalty writes
    # into the logits it is handed: each call gets its own)
    assert got[1](mx.array([4], dtype=mx.uint32), mx.ones((1, 6))).tolist() == [[1, 0.5, 0.5, 1, 0.5, 1]]
    assert got[0](mx.array([4], dtype=mx.uint32), mx.ones((1, 6))).tolist() == [[1, 1, 6, 1, 1, 1]]


@pytest.mark.model
def test_penalized_speculative_and_warm_sequential_decode_equal_classic_in_process(fixture_root):
    """mlx-lm 0.32's own paths differ from classic decode with a penalty; with the history
    put back they do not (the speculative path at several widths, and a warm cache)."""
    from mlx_lm.generate import stream_generate
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.sample_utils import make_logits_processors
    from specparity.mlx_server import missing_prefix, with_history

    model, draft, tok = _pair(fixture_root)
    prompt = tok.encode("def add(a, b):")

    def run(procs, **kw):
        return [r.token for r in stream_generate(model, tok, mx.array(kw.pop("fed", prompt)), 24,
                                                 logits_processors=procs, **kw)]

    procs = lambda: make_logits_processors(repetition_penalty=1.5)  # noqa: E731
    classic = run(procs())
    upstream = run(procs(), draft_model=draft, num_draft_tokens=3)
    assert upstream != classic  # the speculative path saw only the last prompt token
    for k in (1, 3, 5):
        fixed = with_history(procs(), missing_prefix(prompt, prompt, speculative=True))
        assert run(fixed, draft_model=draft, num_draft_tokens=k) == classic, k
    for cut in (1, len(prompt) - 1):
        def warm():
            cache = make_prompt_cache(model)
            model(mx.array(prompt[:cut])[None], cache=cache)
            return cache
        if cut == len(prompt) - 1:  # the history held only the last prompt token
            assert run(procs(), fed=prompt[cut:], prompt_cache=warm()) != classic
        fixed = with_history(procs(), missing_prefix(prompt, prompt[cut:], speculative=False))
        assert run(fixed, fed=prompt[cut:], prompt_cache=warm()) == classic, cut


# -- the prompt-cache policy -------------------------------------------------------------------------

def test_proven_prefix_is_what_a_fresh_prefill_computes_alike():
    from specparity.harness.gated.cache import proven_prefix

    # an entry computed as the fresh prefill of a 10-token prompt (positions 0..8), step 2048
    assert proven_prefix(9, 10, shared=9, step=2048) == 9  # the same prompt again: all of it
    assert proven_prefix(9, 14, shared=9, step=2048) == 0  # longer: its one chunk ends elsewhere
    assert proven_prefix(9, 14, shared=9, step=4) == 8  # the full chunks both made
    assert proven_prefix(9, 6, shared=5, step=4) == 4
    assert proven_prefix(None, 10, shared=9, step=4) == 0  # nothing known: nothing proven
    assert proven_prefix(9, 10, shared=7, step=2048) == 0  # shares less than its prefill


def _filled(model, tokens, **kv):
    from mlx_lm.models.cache import make_prompt_cache

    from specparity.harness.gated.cache import offsets

    cache = make_prompt_cache(model)
    model(mx.array(tokens)[None], cache=cache)
    if kv:
        from mlx_lm.generate import maybe_quantize_kv_cache

        maybe_quantize_kv_cache(cache, kv["start"], 32, 8)
    mx.eval([c.state for c in cache])
    assert offsets(cache) == [len(tokens)] * len(cache)
    return cache


@pytest.mark.model
def test_prompt_cache_reuses_by_policy_and_says_what_it_did(fixture_root):
    from specparity.verdicts import CachePolicy

    model, _, _ = _pair(fixture_root)
    seen: list[Any] = []
    policy = {"p": CachePolicy.REUSE}
    store = ExactPromptCache(4, policy_for=lambda m: policy["p"], step=4, on_lookup=seen.append)
    a = list(range(20, 30))
    store.held_next = 9  # computed as a fresh prefill of a 10-token prompt (then 1 decoded)
    store.insert_cache("m", a + [40], _filled(model, a + [40]))

    # an exact hit keeps one token to feed (mlx-lm 0.32 returns none, and generation fails)
    cache, rest = store.fetch_nearest_cache("m", a + [40])
    assert cache is not None and rest == [40] and offsets(cache) == [10] * len(cache)
    assert seen[-1].to_dict()["outcome"] == "hit" and seen[-1].reused == 10

    policy["p"] = CachePolicy.REPREFILL
    cache, rest = store.fetch_nearest_cache("m", a)  # the same prompt again
    assert rest == a[9:] and seen[-1].reused == 9 and seen[-1].outcome == "hit"
    cache, rest = store.fetch_nearest_cache("m", a + [41, 42, 43])  # longer: full chunks only
    assert len(rest) == 13 - 8 and seen[-1].outcome == "partial" and "re-prefill" in seen[-1].reason
    cache, rest = store.fetch_nearest_cache("m", a[:3] + [99])  # less than a chunk shared
    assert cache is None and rest == a[:3] + [99] and seen[-1].outcome == "re-prefilled"
    store.held_next = None
    store.insert_cache("m", [7, 8, 9, 10, 11], _filled(model, [7, 8, 9, 10, 11]))
    assert store.fetch_nearest_cache("m", [7, 8, 9, 10, 11, 12])[0] is None  # nothing proven
    cache, _ = store.fetch_nearest_cache("m", [1, 2, 3])
    assert cache is None and seen[-1].outcome == "miss"


def test_a_lookups_response_field_carries_every_field_and_what_follows_from_them():
    import dataclasses

    from specparity.harness.gated.cache import CacheLookup

    lookup = CacheLookup("re-prefill", 12, shared=8, reused=4, reason="why")
    out = lookup.to_dict()
    assert set(out) == {f.name for f in dataclasses.fields(CacheLookup)} | {"prefilled", "outcome"}
    assert out == {"policy": "re-prefill", "prompt_tokens": 12, "shared": 8, "reused": 4,
                   "reason": "why", "prefilled": 8, "outcome": "partial"}


@pytest.mark.model
def test_a_quantized_entry_is_not_cut_below_quantized_kv_start(fixture_root):
    from mlx_lm.models.cache import QuantizedKVCache

    from specparity.verdicts import CachePolicy

    model, _, _ = _pair(fixture_root)
    seen: list[Any] = []
    store = ExactPromptCache(4, policy_for=lambda m: CachePolicy.REUSE, quantized_kv_start=8,
                             on_lookup=seen.append)
    a = list(range(20, 32))
    filled = _filled(model, a, start=8)
    assert all(isinstance(c, QuantizedKVCache) for c in filled)
    store.insert_cache("m", a, filled)
    cache, rest = store.fetch_nearest_cache("m", a[:5] + [99, 98])  # shares 5 < 8
    assert cache is None and "quantized" in seen[-1].reason
    cache, rest = store.fetch_nearest_cache("m", a[:10] + [99])  # shares 10 >= 8: reused
    assert rest == [99] and seen[-1].reused == 10


def test_metrics_labels_stay_bounded_and_count_the_prompt_cache():
    from prometheus_client.parser import text_string_to_metric_families

    m = ServeMetrics(max_width=5)
    for w in (2, 5, 6, 10_000, 10_001):
        m.observe(SpecStats(declined=True, decision="DECLINE", width=w, num_draft_tokens=w - 1))
    s = SpecStats(prompt_cache={"policy": "re-prefill", "outcome": "partial", "shared": 9,
                                "reused": 8}, cancelled="decode")
    m.observe(s)
    m.set_policy("re-prefill")
    body, _ = m.exposition()
    samples = {(x.name, tuple(sorted(x.labels.items()))): x.value
               for f in text_string_to_metric_families(body.decode()) for x in f.samples}
    widths = {dict(k[1]).get("width") for k in samples if k[0] == "specparity_gate_decisions_total"}
    assert widths == {"2", "5", "other"}
    assert samples[("specparity_prompt_cache_reused_tokens_total", (("policy", "re-prefill"),))] == 8
    assert samples[("specparity_prompt_cache_reprefilled_tokens_total",
                    (("policy", "re-prefill"),))] == 1
    assert samples[("specparity_prompt_cache_lookups_total",
                    (("outcome", "partial"), ("policy", "re-prefill")))] == 1
    assert samples[("specparity_cancelled_requests_total", (("stage", "decode"),))] == 1
    assert samples[("specparity_prompt_cache_policy", (("policy", "re-prefill"),))] == 1
    assert samples[("specparity_prompt_cache_policy", (("policy", "reuse"),))] == 0


# -- a gate miss in the server probes the model the server loaded (issue 18) ----------------------

def _cli(model: str, **kw: Any) -> Any:
    import argparse

    base = {"model": model, "adapter_path": None, "draft_model": None, "trust_remote_code": False,
            "chat_template": "", "use_default_chat_template": False, "pipeline": False,
            "kv_bits": None, "kv_group_size": 64, "quantized_kv_start": 5000,
            "prefill_step_size": 2048, "num_draft_tokens": 3}
    return argparse.Namespace(**{**base, **kw})


def _refuse_load(*_a: Any, **_k: Any) -> Any:
    raise AssertionError("a second load of the checkpoint")


@pytest.mark.slow
@pytest.mark.model
def test_a_gate_miss_in_the_server_probes_the_model_it_loaded(llama_pair, monkeypatch):
    """GateMemo on the server's own provider: with every way to load a checkpoint broken, a
    miss still decides (a load would make the gate decline with 'could not run')."""
    import mlx_lm
    import mlx_lm.server
    import mlx_lm.utils
    import specparity.checkpoint
    from specparity.harness.gated.gate import GateMemo, ServeConfig, loaded_model
    from specparity.harness.gated.server import _classes

    provider_cls, _, _ = _classes()
    cli = _cli(llama_pair.target)
    provider = provider_cls(cli)
    provider.load_default()
    assert provider.model is not None
    for module, name in ((specparity.checkpoint, "load_checkpoint"), (mlx_lm.utils, "load"),
                         (mlx_lm, "load"), (mlx_lm.server, "load")):
        monkeypatch.setattr(module, name, _refuse_load)
    memo = GateMemo(ServeConfig(), cli)
    built = []

    def loaded() -> Any:
        built.append(1)
        return loaded_model(provider)

    d = memo.decide(llama_pair.target, 3, loaded)
    assert d.allow and not d.hit and d.verdict == "equal", d.reason
    assert memo.decide(llama_pair.target, 3, loaded) is d and built == [1]  # asked once
    p = memo.policy(llama_pair.target, loaded_model(provider))
    assert p.policy == "reuse" and not p.hit and p.verdict == "equal", p.reason


# -- a fed prompt that is not the end of the request's prompt: classic decode, fresh cache ----------

@pytest.mark.model
def test_a_fed_prompt_that_is_not_the_prompts_end_runs_classic_on_a_fresh_cache(fixture_root, caplog):
    """mlx-lm hands stream_generate the prompt past its cached prefix; when what it feeds is
    not the end of the prompt, history.missing_prefix cannot say what the processors miss:
    the request runs classic decode from an empty cache, and says why."""
    import types

    from mlx_lm.generate import stream_generate
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.sample_utils import make_logits_processors
    from specparity.harness.gated.gate import ServeConfig
    from specparity.harness.gated.server import _classes

    model, _, tok = _pair(fixture_root)
    prompt = tok.encode("def add(a, b):")
    want = [r.token for r in stream_generate(model, tok, mx.array(prompt), 12,
                                             logits_processors=make_logits_processors(
                                                 repetition_penalty=1.5))]
    _, generator_cls, _ = _classes()
    gen = object.__new__(generator_cls)  # its serving state only: no generation thread
    gen.config = ServeConfig()
    gen.metrics = ServeMetrics()
    gen._finish_lock = threading.Lock()
    gen._pending = None
    gen.model_provider = types.SimpleNamespace(draft_error=None, draft_model=None)
    gen.prompt_cache = ExactPromptCache(2)
    stats = SpecStats(request_id="cmpl-x", prompt_ids=list(prompt),
                      prompt_cache={"policy": "reuse", "prompt_tokens": len(prompt), "shared": 3,
                                    "reused": 3, "prefilled": len(prompt) - 3, "outcome": "partial",
                                    "reason": ""})
    gen._active = (stats, types.SimpleNamespace(sampling=types.SimpleNamespace(temperature=0.0),
                                                seed=None))
    cache = make_prompt_cache(model)
    model(mx.array([7, 8, 9])[None], cache=cache)  # an entry that is not this prompt's prefix
    caplog.set_level("WARNING", logger="specparity.serve")
    got = [r.token for r in gen.stream_generate(
        model, tok, mx.array(prompt[2:5]), 12, prompt_cache=cache,
        logits_processors=make_logits_processors(repetition_penalty=1.5))]
    assert got == want  # classic decode of the whole prompt, its processors on the whole history
    # the fresh cache, filled by the whole prompt and what followed (not the 3 stale tokens + 3 fed)
    assert offsets(cache) == [len(prompt) + len(got)] * len(cache)
    pc = stats.prompt_cache
    assert pc is not None and pc["reused"] == 0 and pc["prefilled"] == len(prompt)
    assert pc["outcome"] == "re-prefilled" and "are not the end of the" in pc["reason"]
    assert stats.path == "sequential" and not stats.engaged and stats.reason == pc["reason"]
    assert any("specparity-serve: FRESH-CACHE request=cmpl-x" in r.message for r in caplog.records)


def test_a_response_says_which_path_served_it_and_what_its_draws_promise():
    greedy = SpecStats(path="batch")
    assert greedy.to_response()["path"] == "batch" and greedy.to_response()["draws"] == "greedy"
    seeded = SpecStats(path="sequential", temperature=0.8, seed=7)
    assert seeded.to_response()["draws"] == "seeded-classic"
    assert SpecStats(temperature=0.8).to_response()["draws"] == "distribution"  # no seed
    drafted = _stats([True, False])
    drafted.temperature, drafted.seed = 0.8, 7  # mlx-lm's speculative sampling draws otherwise
    assert drafted.to_response()["draws"] == "distribution"


def test_bench_serve_counted_resolves_1_percent_from_enough_request_pairs(repo_root):
    import importlib.util

    path = repo_root / "scripts" / "bench_serve_counted.py"
    spec = importlib.util.spec_from_file_location("bench_serve_counted", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    # one pair's "interval" is a point: no 95% interval of a median, nothing resolved
    assert "not resolved (1 pairs" in bench.overhead_lines([1.0064], 1)[1]
    # the 9 pairs of docs/speed.md: the median and its order-statistic interval, resolved below 1%
    ratios = [1.00638, 1.00341, 1.00388, 1.00559, 1.00453, 1.00635, 1.00546, 1.00567, 1.00466]
    head, verdict = bench.overhead_lines(ratios, 3)
    assert head.startswith("serve_counted_overhead: +0.546% (95% CI [+0.388%, +0.635%]; 9 request pairs")
    assert "resolved, <= 1%" in verdict
    # the same spread around +1.2%: resolved, above the goal
    assert "resolved, > 1%" in bench.overhead_lines([r + 0.007 for r in ratios], 3)[1]


def test_bench_serve_resolves_1_percent_only_with_an_interval_that_narrow(repo_root):
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_serve", repo_root / "scripts" / "bench_serve.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    # 4.8 points wide, a negative point estimate inside: it resolves nothing
    assert "not resolved" in bench.verdict("x", -0.0325, 0.0155)
    assert "resolved, <= 1%" in bench.verdict("x", -0.0065, 0.0082)
    assert "resolved, > 1%" in bench.verdict("x", 0.012, 0.025)
    assert "spans 1%" in bench.verdict("x", 0.002, 0.018)
    # two rounds' range is no 95% interval, however narrow
    assert "not resolved (2 rounds" in bench.verdict("x", -0.0077, -0.0005, rounds=2)
    # a server's CPU time counts its threads that ended (a served request's own threads)
    import os
    import threading
    import time

    def spin() -> None:
        end = time.thread_time() + 0.1
        while time.thread_time() < end:
            pass

    before = bench.cpu_seconds(os.getpid())
    worker = threading.Thread(target=spin)
    worker.start()
    worker.join()
    assert bench.cpu_seconds(os.getpid()) - before >= 0.08  # the ended thread's 100 ms, to a tick


def test_the_client_watch_peeks_only_when_due_and_tells_once_that_the_client_left():
    """The handler thread polls its client's connection: a peek at most every interval, never
    blocking; a closed connection calls on_gone once; a client that sent more is not gone."""
    import socket
    import time

    from specparity.harness.gated.cancel import ClientWatch, poll_client, watching

    server_end, client_end = socket.socketpair()
    gone: list[int] = []
    watch = ClientWatch(server_end, lambda: gone.append(1), interval=0.05)
    watching(threading.Event(), watch)
    try:
        client_end.close()
        poll_client()  # not due yet: no peek, the departure is not seen
        assert gone == []
        time.sleep(0.06)
        t0 = time.monotonic()
        poll_client()
        assert gone == [1] and time.monotonic() - t0 < 0.05  # seen, without blocking
        time.sleep(0.06)
        poll_client()
        assert gone == [1]  # once
    finally:
        watching(None)
        server_end.close()

    server_end, client_end = socket.socketpair()
    watch = ClientWatch(server_end, lambda: gone.append(2), interval=0.0)
    try:
        watch.poll()
        assert gone == [1] and not watch.stopped  # connected and quiet: still watching
        client_end.sendall(b"GET")  # a pipelined request: not a departure, stop watching
        watch.poll()
        client_end.close()
        watch.poll()
        assert gone == [1] and watch.stopped
        watch2 = ClientWatch(socket.socket(), lambda: gone.append(3), interval=0.0)
        watch2.sock.close()  # closed under it: gone
        watch2.poll()
        assert gone == [1, 3]
    finally:
        server_end.close()


def test_a_request_may_name_the_operators_checkpoint_by_its_flag_or_the_path_it_resolves_to(tmp_path):
    from specparity.harness.gated.gate import request_names

    (tmp_path / "model").mkdir()
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "model")
    assert request_names(str(link)) == ("default_model", str(link), str(tmp_path / "model"))
    assert request_names(str(link), default=False) == (str(link), str(tmp_path / "model"))
    assert request_names(None) == ("default_model",) and request_names(None, default=False) == ()
