"""specparity serve's parts in process: the round counts, the log line read back, cache exactness."""

from __future__ import annotations

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
    assert offsets(got) == [len(prompt) - len(rest)] * len(got)  # exactly what it is filed under


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

    from specparity.harness.gated.server import GateMemo, ServeConfig

    cli = argparse.Namespace(trust_remote_code=False, kv_bits=None, kv_group_size=64,
                             quantized_kv_start=5000, prefill_step_size=2048)
    memo = GateMemo(ServeConfig(), cli)
    caplog.set_level("WARNING", logger="specparity.serve")
    d = memo.decide(str(tmp_path), 4)  # a directory that is not a checkpoint
    assert not d.allow and d.verdict == "not_run" and "the gate could not run" in d.reason
    assert memo.decide(str(tmp_path), 4) is d  # asked once per width
    lines = [r.message for r in caplog.records if "specparity-gate: DECLINE width=4" in r.message]
    assert len(lines) == 1
