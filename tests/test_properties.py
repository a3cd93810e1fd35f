"""Issue 10, item 9: every parser of user input, driven by hypothesis.

Property: any input yields a result or a one-line UsageError, never another
exception, within a bounded time (``deadline``) and bounded output (sizes are
capped by the limits, checked before anything is expanded).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from specparity.probes.sampling.dist import make_problem, parse_logits
from specparity.probes.replay.logs import (
    FORMATS,
    parse_accept_list,
    parse_transcript_line,
    read_log,
)
from specparity.probes.sampling.rules import check_tokens

from specparity.errors import UsageError
from specparity.inputs import Limits, check_token_ids, parse_fault, parse_int_list, set_limits
from specparity.prompts import parse_prompt_ids

PROFILE = settings(max_examples=150, deadline=500,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

ints = st.integers(min_value=-(10**15), max_value=10**15)
noise = st.text(alphabet="0123456789-,+ []_.eE\t\nxnaif", max_size=40)


def _items(draw_int: st.SearchStrategy) -> st.SearchStrategy:
    item = st.one_of(draw_int.map(str), st.tuples(draw_int, draw_int).map(lambda t: f"{t[0]}-{t[1]}"))
    return st.lists(item, min_size=0, max_size=8).map(",".join)


def _one_line(err: UsageError) -> None:
    msg = str(err)
    assert msg and "Traceback" not in msg


@pytest.fixture(autouse=True)
def _limits():
    set_limits(Limits(max_width=64, max_positions=256, max_samples=1000))
    yield
    set_limits(None)


@PROFILE
@given(st.one_of(_items(ints), _items(st.integers(0, 300)), noise, st.text(max_size=30)),
       st.sampled_from(["max_width", "max_positions"]), st.integers(0, 3))
def test_int_lists_and_ranges(text, limit, minimum):
    try:
        out = parse_int_list(text, "--widths", minimum=minimum, limit=limit)
    except UsageError as err:
        _one_line(err)
        return
    cap = 64 if limit == "max_width" else 256
    assert out == sorted(set(out)) and len(out) <= cap + 1
    assert all(minimum <= v <= cap for v in out)


@PROFILE
@given(st.lists(st.one_of(st.lists(ints, max_size=6).map(lambda x: ",".join(map(str, x))), noise),
                min_size=0, max_size=3))
def test_prompt_ids(values):
    try:
        out = parse_prompt_ids(values)
    except UsageError as err:
        _one_line(err)
        return
    for ids in out:
        try:
            check_token_ids(ids, 512, "--prompt-ids")
        except UsageError as err:
            _one_line(err)
            continue
        assert all(0 <= t < 512 for t in ids)


accept_vectors = st.one_of(
    st.lists(st.integers(-3, 10**6), max_size=10).map(lambda x: ",".join(map(str, x))),
    st.lists(st.integers(-3, 50), max_size=10).map(lambda x: "[" + ", ".join(map(str, x)) + "]"),
    noise,
)


@PROFILE
@given(accept_vectors)
def test_accept_lists(text):
    try:
        out = parse_accept_list(text)
    except UsageError as err:
        _one_line(err)
        return
    assert all(isinstance(a, int) and a >= 0 for a in out)


def _log_lines() -> st.SearchStrategy:
    obj = st.fixed_dictionaries({"format": st.sampled_from(["specparity.accepts/1", "x"])},
                                optional={"accepts": st.lists(st.integers(-2, 9), max_size=5),
                                          "width": st.one_of(st.integers(-2, 10**6), st.text(max_size=3)),
                                          "widths": st.lists(st.integers(-1, 9), max_size=5),
                                          "prompt_ids": st.lists(ints, max_size=4),
                                          "tokens": st.lists(st.integers(-1, 9), max_size=5),
                                          "prefill_emits": st.one_of(st.booleans(), st.integers())})
    accept_lens = st.lists(st.integers(-2, 9), max_size=5).map(
        lambda x: f"INFO DFlash accept lengths accept_lens=[{', '.join(map(str, x))}]")
    transcript = st.tuples(st.integers(-1, 3), st.integers(-1, 5), ints,
                           st.lists(st.integers(-1, 9), max_size=4),
                           st.lists(st.integers(-1, 9), max_size=4), st.integers(-1, 5),
                           st.lists(st.integers(-1, 9), max_size=4)).map(
        lambda t: f"DFlash round transcript round={t[0]} bs={t[1]} bonus={t[2]}"
                  f" draft_tokens={t[3]} target_tokens={t[4]} accepted={t[5]} new_tokens={t[6]}")
    line = st.one_of(obj.map(json.dumps), accept_lens, transcript, noise,
                     st.text(max_size=40), st.just("accepted=3"))
    return st.lists(line, max_size=6).map("\n".join)


@PROFILE
@given(_log_lines(), st.sampled_from(FORMATS),
       st.sampled_from([None, r"accepted=(\d+)", r"(?P<accepts>\[.*\])", "(", "no group"]))
def test_logs_in_every_format(text, fmt, regex):
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "run.log"
        p.write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            reqs = read_log(p, fmt, regex)
        except UsageError as err:
            _one_line(err)
            return
    for r in reqs:
        assert all(isinstance(a, int) and a >= 0 for a in r.accepts)


@PROFILE
@given(st.text(max_size=120))
def test_transcript_lines(tail):
    try:
        parse_transcript_line("DFlash round transcript " + tail, "f:1", 1)
    except UsageError as err:
        _one_line(err)


logits = st.one_of(
    st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=10).map(
        lambda x: ",".join(map(str, x))),
    noise,
)


@PROFILE
@given(logits, logits, st.one_of(st.floats(-1, 3), st.just(float("nan"))), st.integers(-2, 12),
       st.floats(-0.5, 1.5), st.integers(-1, 40))
def test_logits_and_problems(target, draft, temperature, top_k, top_p, num_draft):
    try:
        tl = parse_logits(target, "--target-logits")
        dl = parse_logits(draft, "--draft-logits")
        prob = make_problem(tl, dl, temperature=temperature, top_k=top_k, top_p=top_p,
                            num_draft=num_draft)
    except UsageError as err:
        _one_line(err)
        return
    assert prob.vocab ** prob.num_draft <= 200_000


fault_json = st.fixed_dictionaries(
    {"kind": st.sampled_from(["rows", "depth", "stale_trim", "other", 3])},
    optional={"layer": st.one_of(st.integers(-3, 10), st.text(max_size=3), st.none()),
              "subop": st.one_of(st.sampled_from(["mlp", "self_attn", "", "a b"]), st.integers()),
              "min_rows": st.one_of(st.integers(-2, 9), st.floats()),
              "min_offset": st.one_of(st.integers(-2, 99), st.booleans())},
).map(json.dumps)


@PROFILE
@given(st.one_of(fault_json, st.text(max_size=60)), st.sampled_from([None, 4, 6]))
def test_fault_specs(text, layers):
    try:
        out = parse_fault(text, layers)
    except UsageError as err:
        _one_line(err)
        return
    assert out["kind"] in ("rows", "depth", "stale_trim")
    if out["kind"] != "stale_trim" and layers is not None:
        assert 0 <= out["layer"] < layers


rule_outputs = st.one_of(
    ints, st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=4), st.none(),
    st.booleans(), st.lists(st.one_of(ints, st.floats()), max_size=4),
    st.lists(st.lists(st.integers(-2, 10), min_size=3, max_size=3), max_size=3).map(np.array),
)


@PROFILE
@given(rule_outputs, st.booleans())
def test_rule_outputs(value, padded):
    try:
        out = check_tokens("r", value, 8, 0, padded=padded)
    except UsageError as err:
        _one_line(err)
        return
    assert out.dtype == np.int64
    assert ((out >= (-1 if padded else 0)) & (out < 8)).all()


@PROFILE
@given(st.binary(max_size=200))
def test_gate_store_bytes(raw):
    from specparity.probes.gate import GateStore

    with tempfile.TemporaryDirectory() as d:
        store = GateStore(Path(d) / "store.json")
        store.path.write_bytes(raw)
        entries, _problem = store.read_only()
        assert isinstance(entries, dict)
        assert isinstance(store.entries(), dict)  # repairs, never raises
        store.put("k", {"verdict": "equal", "reason": "r", "fields": {}})
        entry = store.get("k")
        assert entry is not None and entry["reason"] == "r"
