"""Every parser of user input, driven by hypothesis.

Property: any input yields a result or a one-line UsageError, never another
exception, within a bounded time (``deadline``) and bounded output (sizes are
capped by the limits, checked before anything is expanded).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
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

# max_examples: the profile the conftest loads (150 in the whole suite, 40 in the fast tier)
PROFILE = settings(deadline=500,
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


# -- issue 20: the served half's parsers and readers -------------------------------------------------
# any YAML / JSON value: what a hostile file can put at a key
_leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=True),
                  st.text(max_size=8), st.sampled_from(["mlx-lm", "fresh", "stream", "chat", "process", "request",
                                                        "target", "{model}", "{port}", "(", "/health", "1", "-",
                                                        "~x/y", "~nosuchuser/x", "{model:>999999999}", "{model!r}",
                                                        "a\x00b", "\x00", "w2", "baseline-end", "llama_cpp",
                                                        "dflash-mlx", "mlx", "other", "."]))
J = dict[str, Any]  # a file's mapping
values = st.recursive(_leaf, lambda c: st.one_of(st.lists(c, max_size=3),
                                                 st.dictionaries(st.one_of(st.text(max_size=6), st.integers()), c,
                                                                 max_size=3)), max_leaves=8)


def _mutated(base: dict, *, nested: dict[str, st.SearchStrategy] | None = None,
             schema: Any = None) -> st.SearchStrategy:
    """``base`` (a valid file) with up to three of its keys (or a key it lacks) given any value, and its
    ``nested`` keys drawn from their own (mutated) strategies: the parser meets each bad value beside
    otherwise good ones, so no earlier check hides it. ``schema``: the file's Fields, whose every key
    is drawn (not only those ``base`` holds)."""
    missing = sorted(k for k in (schema.fields if schema is not None else ()) if k not in base)
    keys = st.one_of(*([st.sampled_from(missing)] if missing else []), st.sampled_from(sorted(base)),
                     st.text(max_size=6), st.integers(-2, 2))
    over = st.dictionaries(keys, values, max_size=3)
    inner = st.fixed_dictionaries({}, optional=nested or {})
    return st.tuples(inner, over).map(lambda t: {**base, **t[0], **t[1]})


def _spec_error(err: BaseException) -> None:
    """What the CLI maps to a documented exit code (never 70): a SpecparityError, one line."""
    from specparity.errors import SpecparityError

    assert isinstance(err, SpecparityError), f"{type(err).__name__}: {err}"
    assert str(err) and "\n" not in str(err)


def _yaml_file(d: str, name: str, raw: object, text: str | None) -> Path:
    import yaml

    p = Path(d) / name
    p.write_text(text if text is not None else yaml.safe_dump(raw, allow_unicode=True))
    return p


_yaml_texts = st.one_of(st.none(), st.none(), st.sampled_from([
    "env: &a {A: *a}", "params: {stop: &s [x, *s]}", "prompts: !!binary aGk=", "widths: !!set {2: null}",
    "params: {seed: 2020-13-45}", "max_tokens: !!float x", "- 1\n- 2", "\ufeffwidths: [2]", "env: {A: \x00}",
    "controls: [{env: {A: 1}, width: 2}]", "distribution: {temperature: .nan}", "request_timeout: .inf",
    "argv: [x]\nwidth: &w {rows_offset: *w}", "argv: ['{python}', '{model}']\nevidence: {log_engaged: '['}"]))

_JOB: J = {"pairings": [{"name": "p", "target": "/t", "draft": "/d", "profile": "mlx-lm"}], "widths": [2, 3],
        "width_mode": "process", "max_tokens": 8, "prompts": ["a"], "params": {"seed": 0}, "endpoint": "completions",
        "sequence": ["fresh", "stream"], "concurrency": 0, "self_draft": True, "repeats": 0,
        "extra_args": {"*": ["--x"]}, "controls": [{"name": "c", "env": {"A": "1"}, "width": 2}], "env": {"B": "2"},
        "start_timeout": 5, "request_timeout": 5}


def _job_strategy() -> st.SearchStrategy:
    from specparity.harness.config import JOB_SCHEMA

    def part(key: str) -> Any:
        checker = JOB_SCHEMA.fields[key]
        checker = getattr(checker, "inner", checker)  # Nullable
        return getattr(checker, "item", checker)  # ListOf

    return _mutated(_JOB, schema=JOB_SCHEMA, nested={
        "pairings": st.lists(_mutated(_JOB["pairings"][0], schema=part("pairings")), max_size=2),
        "controls": st.lists(_mutated(_JOB["controls"][0], schema=part("controls")), max_size=2),
        "params": _mutated({"stop": ["x"], "seed": 0, "logit_bias": {"5": -1}}, schema=part("params")),
        "distribution": _mutated({"temperature": 0.7, "requests": 100, "prefix": 1, "alpha": 0.001, "seed": 0},
                                 schema=part("distribution"))})


_job = _job_strategy()


@PROFILE
@given(_job, _yaml_texts)
def test_job_files(raw, text):
    """Any value at any key of a job file: a Job, or one line with a documented exit code."""
    from unittest import mock

    from specparity.errors import InfrastructureError
    from specparity.harness.config import Job, Pairing, load_job

    # no hub look-ups, no fixture builds: the parser is under test
    builtin = lambda: Job(pairings=[Pairing("embedded", "/target", "/draft")])  # noqa: E731
    with tempfile.TemporaryDirectory() as d, \
            mock.patch("specparity.resolve.resolve_checkpoint", side_effect=InfrastructureError("offline")), \
            mock.patch("specparity.harness.config.builtin_job", side_effect=builtin):
        try:
            job = load_job(_yaml_file(d, "job.yaml", raw, text))
        except Exception as err:  # noqa: BLE001 (the property: only SpecparityError)
            _spec_error(err)
            return
    assert isinstance(job, Job) and job.widths and all(1 <= w <= 64 for w in job.widths)
    assert 1 <= job.max_tokens <= 256 and job.prompts and all(isinstance(p, str) for p in job.prompts)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in job.env.items())
    assert job.repeats <= 64 and (job.request_timeout is None or 0 < job.request_timeout < float("inf"))
    json.dumps(job.to_dict(), allow_nan=False)  # every value reaches a request body or a record as JSON


_PROFILE_FILE: J = {"name": "p", "argv": ["{python}", "-m", "srv", "--model", "{model}", "--port", "{port}"],
                 "draft_argv": ["--draft", "{draft_model}", "--n", "{num_draft}"], "trust_remote_code_argv": ["--t"],
                 "width": {"setting": "n", "rows_offset": 1, "per_request": None}, "ready_path": "/health",
                 "fail_regex": "^Traceback", "endpoint": "completions", "witness": ["target"],
                 "evidence": {"log_engaged": "drafted", "response_field": "x.y"},
                 "logprobs": {"request": {"logprobs": True}, "path": "choices.0.logprobs.content"},
                 "version_command": ["{python}", "-V"], "requires_module": "json", "exercised": True}


def _profile_strategy() -> st.SearchStrategy:
    from specparity.harness.profiles import PROFILE_SCHEMA

    def part(key: str) -> Any:
        return PROFILE_SCHEMA.fields[key].inner  # type: ignore[attr-defined]  # Nullable(Fields)

    argv = st.lists(st.sampled_from(["{python}", "{model}", "{port}", "{0}", "{model", "x", "{width}", "}",
                                     "{model:>999999999}", "{model!r}", "{port:d}", "a\x00b", "~x/{model}"]),
                    min_size=1, max_size=4)
    return _mutated(_PROFILE_FILE, schema=PROFILE_SCHEMA, nested={
        "width": _mutated(_PROFILE_FILE["width"], schema=part("width")),
        "evidence": _mutated(_PROFILE_FILE["evidence"], schema=part("evidence")),
        "logprobs": _mutated(_PROFILE_FILE["logprobs"], schema=part("logprobs")),
        "argv": argv, "draft_argv": argv, "version_command": argv})


@PROFILE
@given(_profile_strategy(), _yaml_texts)
def test_profile_files(raw, text):
    """Any value at any key of a profile: a Profile that renders, or one line with a documented exit code."""
    from specparity.harness.profiles import Profile, load_profile

    with tempfile.TemporaryDirectory() as d:
        try:
            prof = load_profile(str(_yaml_file(d, "prof.yaml", raw, text)))
        except Exception as err:  # noqa: BLE001
            _spec_error(err)
            return
    assert isinstance(prof, Profile) and prof.argv and all(isinstance(a, str) for a in prof.argv)
    prof.render(prof.argv, model="/m", draft_model="/d")  # it loaded: it renders
    prof.render(prof.draft_argv, draft_model="/d", num_draft=1, width=2)
    assert isinstance(prof.width(4).setting, int)


_CHOICE: J = {"index": 0, "text": "a", "message": {"role": "assistant", "content": "a"}, "delta": {"content": "a"},
           "finish_reason": "length"}
_ENTRY: J = {"id": 5, "logprob": -0.5, "top_logprobs": [{"id": 5, "logprob": -0.5}, {"id": 6, "logprob": -1.0}]}
_choice = _mutated(_CHOICE, nested={"message": _mutated(_CHOICE["message"]), "delta": _mutated(_CHOICE["delta"])})
_entry = _mutated(_ENTRY, nested={"top_logprobs": st.lists(st.one_of(values, _mutated(_ENTRY["top_logprobs"][0])),
                                                           max_size=2)})
_response = st.one_of(values, _mutated({"choices": [_CHOICE], "usage": {"completion_tokens": 1}}, nested={
    "choices": st.lists(st.one_of(values, _choice.map(
        lambda c: {**c, "logprobs": {"content": [_ENTRY]}}),
        st.tuples(_choice, st.lists(st.one_of(values, _entry), max_size=3)).map(
            lambda t: {**t[0], "logprobs": {"content": t[1]}})), max_size=2)}))


@PROFILE
@given(_response, st.sampled_from(["completions", "chat"]))
def test_response_bodies(resp, endpoint):
    """Any JSON body: a completion, or a BadResponse saying what was wrong (the request's error)."""
    from specparity.harness.client import Completion, Request, read_json
    from specparity.harness.transport import BadResponse
    from specparity.harness.profiles import Profile

    out = Completion()
    try:
        read_json(resp, Request("p0", "fresh", endpoint, {}), Profile("p", []), out)
    except BadResponse as err:
        assert str(err)
        return
    assert isinstance(out.text, str) and isinstance(out.usage, dict) and isinstance(out.raw, dict)
    assert out.token_ids is None or all(isinstance(t, int) and not isinstance(t, bool) for t in out.token_ids)
    assert out.logprobs is None or all(isinstance(x, float) for x in out.logprobs)
    json.dumps(out.to_dict())


_chunk = st.one_of(values, _mutated({"choices": [_CHOICE]}, nested={"choices": st.lists(st.one_of(values, _choice),
                                                                                        max_size=2)}))


@PROFILE
@given(st.lists(st.one_of(_chunk.map(lambda c: "data: " + json.dumps(c)), st.just("data: [DONE]"),
                          st.just(": keep-alive"), st.just(""), st.text(max_size=12)), max_size=5),
       st.sampled_from(["completions", "chat"]))
def test_stream_events(lines, endpoint):
    """Any event stream: a completion, or a BadResponse naming the chunk."""
    from specparity.harness.client import Completion, Request, read_events
    from specparity.harness.transport import BadResponse

    out = Completion()
    try:
        read_events(lines, Request("p1-stream", "stream", endpoint, {"stream": True}), out)
    except BadResponse as err:
        assert str(err)
        return
    assert isinstance(out.text, str) and isinstance(out.usage, dict) and isinstance(out.raw, dict)


_ARM: J = {"pairing": "p", "name": "w2", "kind": "width", "width": 2, "setting": 1, "setting_name": "n",
        "verdict": "match", "reason": "", "served_by": "process", "server": {"log": "x"}, "seconds": 1.0,
        "generation_seconds": 0.5, "acceptance": 0.9, "digest": "d", "requests": 1, "verdicts": {"p0": "match"},
        "notes": []}
_REQ: J = {"id": "p0", "kind": "fresh", "verdict": "match", "reason": "", "request": {"prompt": "a"},
        "completion": {"text": "a", "sha256": "s", "token_ids": [1], "logprobs": [-0.1], "top": [[[1, -0.1]]],
                       "seconds": 0.1, "status": 200, "error": None, "usage": {}},
        "evidence": {"verify_calls": 1, "draft_calls": 1, "accepts": [1], "widths": [2], "lines": [], "declined": False,
                     "sources": ["witness"]},
        "divergence": None, "replay": None}
_arm = _mutated(_ARM)
_req = _mutated(_REQ, nested={"completion": _mutated(_REQ["completion"]), "evidence": _mutated(_REQ["evidence"]),
                              "divergence": _mutated({"token_index": 1, "char_offset": 2, "reference": "baseline",
                                                      "other": "arm", "margin_reference": 0.5})})
_PAIRING: J = {"name": "p", "profile": "mlx-lm", "target": "/t", "draft": "/d", "verdict": "match", "reason": "",
            "width_mode": "process", "groups": [["baseline-start", "w2"]], "request_groups": {}, "findings": [],
            "arms": [{**_ARM, "name": "baseline-start", "kind": "baseline", "width": None, "setting": None}, _ARM]}
_REPORT: J = {"kind": "served", "title": "t", "argv": ["specparity", "served"], "status": "complete",
           "verdict": "match",
           "exit_code": 0, "started": "s", "finished": "f", "timings": {"total": 1.0}, "arms": {"arms": 2},
           "summary": {"verdict": "match", "pairings": [_PAIRING], "job": {"max_tokens": 8}},
           "error": None, "schema": 1}
_report = _mutated(_REPORT, nested={"summary": _mutated(_REPORT["summary"], nested={
    "pairings": st.lists(_mutated(_PAIRING, nested={"arms": st.lists(_arm, max_size=2)}), max_size=2)})})


@PROFILE
@given(st.one_of(values, _report, _report.map(lambda r: {**r, "kind": "probe"})),
       st.one_of(values, _mutated({"host": "h", "models": {"p": {"target": "x"}},
                                   "environments": {"p": {"packages": {"mlx": "1"}}}})),
       st.lists(st.one_of(_arm.map(json.dumps), st.text(max_size=10), values.map(json.dumps)), max_size=3),
       st.lists(st.one_of(_req.map(json.dumps), values.map(json.dumps)), max_size=3))
def test_records(report, identity, arm_lines, request_lines):
    """Any report.json, identity.json and JSONL lines: every records command reads it, or names the file."""
    from specparity.commands.records import show_lines
    from specparity.records.compare import compare_records
    from specparity.records.junit import junit_xml
    from specparity.records.record import read_record
    from specparity.records.served import KIND, ServedRecord

    with tempfile.TemporaryDirectory() as d:
        data = Path(d) / "data" / "rec"
        data.mkdir(parents=True)
        (data / "report.json").write_text(json.dumps(report))
        (data / "identity.json").write_text(json.dumps(identity))
        (data / "arms.jsonl").write_text("\n".join(arm_lines))
        (data / "p-w2.jsonl").write_text("\n".join(request_lines))
        md = Path(d) / "rec.md"
        try:
            rec, ident, rows = read_record(md)
            assert all(isinstance(s, str) for s in show_lines(rec, ident, rows))
            if rec.kind == KIND:
                sr = ServedRecord.of(md, rec, ident, rows)
                sr.table_lines()
                junit_xml(sr)
                if rec.is_complete and rec.summary is not None:
                    sr.report().lines()
            if rec.is_complete and rec.summary is not None:
                compare_records(md, md).lines()
        except Exception as err:  # noqa: BLE001
            _spec_error(err)


# -- issue 30: the sequence file `replay --sequence` reads ----------------------------------------
SEQ_VOCAB = 64
_SEQ_HEADER: J = {"format": "specparity.sequence/1", "model": "MODEL", "draft_model": None,
                  "trust_remote_code": False, "server": {"max_tokens": 8, "prompt_cache_size": 2, "top_k": 0},
                  "engine": "mlx-lm", "engine_version": "0.32.2", "arm": "w2",
                  "finding": {"request": "a", "token_index": 0}, "concurrent": False}
_SEQ_ENTRY: J = {"id": "a", "kind": "fresh", "endpoint": "completions",
                 "body": {"prompt": "x", "max_tokens": 4, "logit_bias": {"5": -1}, "repetition_penalty": 1.1,
                          "seed": 0, "stop": ["\n"], "top_k": 3},
                 "prompt_ids": [1, 2], "served": {"token_ids": [3], "text": "x", "finish_reason": "length",
                                                  "usage": {"prompt_tokens": 2}}}
_token = st.one_of(st.integers(-2, SEQ_VOCAB + 2), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=3))


def _sequence_strategy() -> st.SearchStrategy:
    from specparity.probes.replay.sequence import _entry_schema, _header_schema, _server_schema

    from specparity.inputs import request_schema

    def sometimes(base: J, mutated: st.SearchStrategy) -> st.SearchStrategy:
        return st.one_of(st.just(base), mutated)  # a good part as often as a bad one: both paths run

    ids = st.one_of(st.lists(st.integers(0, SEQ_VOCAB - 1), min_size=1, max_size=4), st.lists(_token, max_size=4),
                    st.lists(st.integers(0, 3), min_size=250, max_size=260), values)
    body = sometimes(_SEQ_ENTRY["body"], _mutated(_SEQ_ENTRY["body"], schema=request_schema(), nested={
        "logit_bias": st.dictionaries(_token.map(str), st.one_of(st.floats(), st.integers()), max_size=2),
        "max_tokens": st.one_of(st.integers(-1, 300), st.just(10**12), st.floats()),
        "messages": st.lists(values, max_size=2)}))
    entry = sometimes(_SEQ_ENTRY, _mutated(_SEQ_ENTRY, schema=_entry_schema(None, False, "completions"), nested={
        "body": body, "prompt_ids": ids, "endpoint": st.sampled_from(["completions", "chat", "x"]),
        "served": sometimes(_SEQ_ENTRY["served"], _mutated(_SEQ_ENTRY["served"], nested={"token_ids": ids}))}))
    header = sometimes(_SEQ_HEADER, _mutated(_SEQ_HEADER, schema=_header_schema(), nested={
        "server": sometimes(_SEQ_HEADER["server"], _mutated(_SEQ_HEADER["server"], schema=_server_schema())),
        "concurrent": st.sampled_from([False, True, "no", 0])}))
    line = st.one_of(header.map(json.dumps), entry.map(json.dumps),
                     st.sampled_from(["", "[" * 5000, "{}", "[]", "x", '{"id": 1' + "0" * 5000 + "}", "NaN"]))
    # a header and requests, mostly in order; now and then a line of any kind anywhere, or raw bytes
    lines = st.tuples(header.map(json.dumps), st.lists(entry.map(json.dumps), max_size=3),
                      st.one_of(st.just([]), st.lists(line, max_size=2)), st.booleans())
    text = lines.map(lambda t: "\n".join([t[0], *t[1], *t[2]] if t[3] else [*t[2], t[0], *t[1]]).encode())
    return st.one_of(text, text, text, st.binary(max_size=60))


@PROFILE
@given(_sequence_strategy())
def test_sequence_files(data):
    """Any sequence file: accepted whole (and then every later reader of it accepts it too), or one
    line with exit 2: never another exception, never a hang."""
    from specparity.reference import RequestParams
    from specparity.probes.replay.sequence import not_reproducible, read_sequence

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "config.json").write_text(json.dumps({"vocab_size": SEQ_VOCAB}))
        path = Path(d) / "s.jsonl"
        path.write_bytes(data.replace(b"MODEL", d.encode()))
        try:
            header, entries = read_sequence(path)
        except Exception as err:  # noqa: BLE001 (the property: only a usage error)
            _spec_error(err)
            assert getattr(err, "exit_code", None) == 2, err
            event("refused")
            return
    event(f"accepted with {len(entries)} requests")
    settings = header.settings()
    assert isinstance(header.concurrent, bool) and settings.prompt_cache_size >= 0 and settings.top_k < SEQ_VOCAB
    for e in entries:
        params = RequestParams.from_body(e.body, settings, SEQ_VOCAB)
        assert 1 <= params.max_tokens <= 256
        assert all(0 <= t < SEQ_VOCAB for t in [*(e.prompt_ids or []), *(params.logit_bias or {})])
    not_reproducible(header, entries)


# an environment spec (issue 30.4): pins around the shapes that matter, and any text
_pin_parts = st.sampled_from(["six", "mlx-lm", "a.b_c", "x[cpu]", "-e", "--index-url", "$(id)", "six @ http://h/w"])
_pin_tail = st.sampled_from(["==1.0", "===1.0", ">=1", "==1.*", "", "==1.0; python_version > '3'",
                             "==1.0,==2.0", " && id", "\r--index-url http://127.0.0.1:1/simple",
                             "\n-r other.txt", "==1.0\x00", "==1.0 # c", "==1.0\u0085x",
                             "==1.0; python_version > '0\u2028--index-url http://127.0.0.1:1/simple'"])
_packages = st.lists(st.one_of(st.tuples(_pin_parts, _pin_tail).map("".join), st.text(max_size=30)),
                     max_size=4)
_env_spec = st.fixed_dictionaries({"packages": st.one_of(_packages, st.text(max_size=10), st.integers())},
                                  optional={"name": st.one_of(st.sampled_from(["ok", "a\nb", "x" * 300, "a/b"]),
                                                              st.text(max_size=12)),
                                            "imports": st.lists(st.text(max_size=8), max_size=3),
                                            "description": st.text(max_size=12),
                                            "with_specparity": st.booleans()})


@PROFILE
@given(_env_spec)
def test_environment_specs(raw):
    """A spec is refused in one line, or each of its packages is one pinned requirement on one line: the
    requirements file pip reads holds exactly these pins, no option, no other index."""
    from packaging.requirements import Requirement

    from specparity.environments import load_spec

    try:
        spec = load_spec(raw)
    except UsageError as err:
        _one_line(err)
        return
    text = "".join(r + "\n" for r in spec.packages)
    assert text.splitlines() == list(spec.packages) and len(spec.name) <= 100 and "\n" not in spec.name
    for line in spec.packages:
        req = Requirement(line)
        assert not line.lstrip().startswith("-") and req.url is None
        assert [s.operator for s in req.specifier] in (["=="], ["==="])


def test_each_tier_tries_its_number_of_inputs(pytestconfig):
    """The profile the conftest loads is the one in force: no property test pins its own count."""
    from conftest import PROPERTY_EXAMPLES

    tier = "fast" if "not slow" in (pytestconfig.getoption("markexpr") or "") else "whole"
    assert settings.default is not None and settings.default.max_examples == PROPERTY_EXAMPLES[tier]
    assert PROFILE.max_examples == PROPERTY_EXAMPLES[tier]
