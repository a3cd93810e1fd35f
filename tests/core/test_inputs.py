"""Token ids against the vocabulary, bounds before expansion.

Each detector is shown both ways: it fires on the bad input and stays silent on
the good one next to it (the last in-vocabulary id, a width at the limit).
"""

from __future__ import annotations

import json
import time

import pytest
from conftest import run_cli

from specparity import inputs
from specparity.errors import UsageError
from specparity.inputs import (
    Limits,
    check_token_ids,
    check_width,
    parse_fault,
    parse_int_list,
    set_limits,
    vocab_size,
)

VOCAB = 512  # the embedded fixtures' vocabulary
FAST = ("--widths", "2", "--depths", "0", "--walk", "0", "--no-prefill")


@pytest.fixture(autouse=True)
def default_limits():
    set_limits(None)
    yield
    set_limits(None)


# ---------------------------------------------------------------- lists and ranges


def test_range_bound_is_checked_before_expanding():
    t0 = time.perf_counter()
    with pytest.raises(UsageError, match=r"--widths '2-99999999999': 99999999999 is above the"
                                         r" maximum 1024 \(raise it: specparity --max-width"):
        parse_int_list("2-99999999999", "--widths", minimum=1, limit="max_width")
    assert time.perf_counter() - t0 < 0.1
    assert parse_int_list("2-4,8", "--widths", minimum=1, limit="max_width") == [2, 3, 4, 8]
    assert parse_int_list("1024", "--widths", minimum=1, limit="max_width") == [1024]


def test_unbounded_lists_still_refuse_a_huge_expansion():
    with pytest.raises(UsageError, match="more than 1000000 values"):
        parse_int_list("0-99999999999", "--x")
    with pytest.raises(UsageError, match="range '5-3' is empty"):
        parse_int_list("5-3", "--x")
    with pytest.raises(UsageError, match="-1 is below the minimum 0"):
        parse_int_list("-1", "--depths")


def test_limits_are_options_and_env(monkeypatch):
    with pytest.raises(UsageError):
        check_width(2000)
    set_limits(Limits(max_width=4096))
    assert check_width(2000) == 2000
    set_limits(None)
    monkeypatch.setenv("SPECPARITY_MAX_WIDTH", "4096")
    assert check_width(2000) == 2000
    monkeypatch.setenv("SPECPARITY_MAX_WIDTH", "lots")
    with pytest.raises(UsageError, match="SPECPARITY_MAX_WIDTH='lots': not an integer"):
        inputs.limits()


def test_commands_keep_the_old_import_of_parse_int_list():
    from specparity.commands._common import parse_int_list as old

    assert old is parse_int_list


# ---------------------------------------------------------------- token ids


def test_check_token_ids_fires_on_every_impossible_id_and_passes_the_edges():
    assert check_token_ids([0, VOCAB - 1], VOCAB, "x") == [0, VOCAB - 1]
    for bad in (VOCAB, -1, 10**12):
        with pytest.raises(UsageError, match=f"token {bad} is outside the vocabulary"):
            check_token_ids([1, bad], VOCAB, "--prompt-ids")
    for not_an_id in (1.5, "3", True, None):
        with pytest.raises(UsageError, match="is not a token id"):
            check_token_ids([not_an_id], VOCAB, "--prompt-ids")


@pytest.mark.model
def test_vocab_size_is_the_embedding_rows(llama_pair):
    from specparity.checkpoint import load_checkpoint

    assert vocab_size(load_checkpoint(llama_pair.target)) == VOCAB


@pytest.mark.model
@pytest.mark.parametrize("ids,code", [pytest.param("1,2,511", 0, marks=pytest.mark.slow), ("1,2,512", 2),
                                      pytest.param("1,2,999999", 2, marks=pytest.mark.slow),
                                      pytest.param("-1,2", 2, marks=pytest.mark.slow)])
def test_probe_prompt_ids_outside_the_vocabulary(cli_bin, llama_pair, ids, code):
    r = run_cli(cli_bin, "probe", "--model", llama_pair.target, "--prompt-ids", ids, *FAST)
    assert r.returncode == code, r.stderr
    if code:
        assert r.stderr.count("\n") == 1 and "outside the vocabulary (0..511)" in r.stderr
        assert "verdict" not in r.stdout


@pytest.mark.model
@pytest.mark.slow
def test_replay_checks_ids_from_the_flag_and_inside_a_log(cli_bin, llama_pair, tmp_path):
    base = {"format": "specparity.accepts/1", "width": 3, "accepts": [1, 1],
            "prompt_ids": [1, 2, 3]}
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps(base) + "\n")
    assert run_cli(cli_bin, "replay", "--model", llama_pair.target, "--log",
                   str(good)).returncode == 0
    for key, value, shown in (("prompt_ids", [1, 2, 70000], 70000),
                              ("tokens", [5, 600, 7, 8, 9], 600)):
        bad = tmp_path / f"bad-{key}.jsonl"
        bad.write_text(json.dumps({**base, key: value}) + "\n")
        r = run_cli(cli_bin, "replay", "--model", llama_pair.target, "--log", str(bad))
        assert r.returncode == 2, r.stderr
        assert f"bad-{key}.jsonl:1 '{key}': token {shown} is outside the vocabulary" in r.stderr
    r = run_cli(cli_bin, "replay", "--model", llama_pair.target, "--accepts", "1,1", "--width",
                "3", "--prompt-ids", "1,2,999999")
    assert r.returncode == 2 and "token 999999" in r.stderr
    transcript = tmp_path / "t.log"
    transcript.write_text("DFlash round transcript round=0 bs=2 bonus=9999 draft_tokens=[1]"
                          " target_tokens=[1, 2] accepted=1 new_tokens=[1, 2]\n")
    r = run_cli(cli_bin, "replay", "--model", llama_pair.target, "--log", str(transcript))
    assert r.returncode == 2 and "t.log:1 'bonus': token 9999" in r.stderr


@pytest.mark.model
def test_accept_and_bisect_check_prompt_ids(cli_bin, llama_pair):
    r = run_cli(cli_bin, "accept", "--model", llama_pair.target, "--draft-model",
                llama_pair.draft, "--prompt-ids", "1,2,999999", "--positions", "4")
    assert r.returncode == 2 and "token 999999 is outside the vocabulary" in r.stderr
    r = run_cli(cli_bin, "bisect", "--model", llama_pair.target, "--prompt-ids", "1,512",
                "--width", "2")
    assert r.returncode == 2 and "token 512 is outside the vocabulary" in r.stderr


# ---------------------------------------------------------------- bounds on every command


NOWHERE = ("--model", "/nonexistent")


@pytest.mark.parametrize("args", [
    ("probe", *NOWHERE, "--widths", "2-99999999999"),
    ("probe", *NOWHERE, "--depths", "99999999"),
    ("probe", *NOWHERE, "--walk", "99999999"),
    ("probe", *NOWHERE, "--walk-widths", "2-5000"),
    ("bisect", *NOWHERE, "--width", "100000"),
    ("bisect", *NOWHERE, "--width", "4", "--depth", "99999999"),
    ("bisect", "dump", *NOWHERE, "--width", "100000", "--out", "x.safetensors"),
    ("replay", *NOWHERE, "--accepts", "1", "--width", "100000"),
    ("replay", *NOWHERE, "--draft-model", "/nonexistent", "--max-tokens", "99999999"),
    ("gate", "check", *NOWHERE, "--width", "100000"),
    ("accept", *NOWHERE, "--draft-model", "/nonexistent", "--positions", "99999999"),
    ("accept", *NOWHERE, "--draft-model", "/nonexistent", "--draws", "999999999999"),
    ("dist", "--samples", "999999999999"),
    ("dist", "--num-draft", "1000000000"),
], ids=lambda a: " ".join(x for x in a if x not in NOWHERE))
def test_every_command_bounds_its_sizes_before_any_work(cli_bin, tmp_path, args):
    t0 = time.perf_counter()
    r = run_cli(cli_bin, *args, cwd=str(tmp_path))
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1, r.stderr
    assert "/nonexistent" not in r.stderr  # the bound fired before the model was looked at
    assert time.perf_counter() - t0 < 30


def test_a_width_inside_a_log_is_bounded(cli_bin, tmp_path):
    log = tmp_path / "w.jsonl"
    log.write_text(json.dumps({"format": "specparity.accepts/1", "width": 100000,
                               "accepts": [1]}) + "\n")
    r = run_cli(cli_bin, "replay", "--model", "/nonexistent", "--log", str(log))
    assert r.returncode == 2 and "w.jsonl:1 'width' 100000: 100000 is above the maximum" in r.stderr


@pytest.mark.model
def test_a_user_raises_a_limit_with_the_root_option(cli_bin, llama_pair):
    args = ("probe", "--model", llama_pair.target, "--widths", "3", "--depths", "0", "--walk", "0",
            "--no-prefill")
    low = run_cli(cli_bin, "--max-width", "2", *args)
    assert low.returncode == 2 and "3 is above the maximum 2" in low.stderr
    assert run_cli(cli_bin, "--max-width", "3", *args).returncode == 0
    env = run_cli(cli_bin, *args, env={"SPECPARITY_MAX_WIDTH": "2"})
    assert env.returncode == 2


@pytest.mark.model
def test_gate_check_in_process_is_bounded(llama_pair):
    from specparity.probes.gate import gate_check

    with pytest.raises(UsageError, match="above the maximum 1024"):
        gate_check(llama_pair.target, 100000)


# ---------------------------------------------------------------- fault specs


def test_fault_specs_are_checked_field_by_field():
    ok = parse_fault('{"kind":"rows","layer":3,"subop":"mlp","min_rows":4}', 6)
    assert ok["layer"] == 3
    assert parse_fault('{"kind":"stale_trim"}')["kind"] == "stale_trim"
    for text, msg in (('{"kind":"rows","layer":"x"}', "'layer' must be an integer 0..5"),
                      ('{"kind":"rows","layer":6}', "'layer' must be an integer 0..5"),
                      ('{"kind":"rows"}', "rows needs 'layer'"),
                      ('{"kind":"depth","layer":1}', "depth needs 'min_offset'"),
                      ('{"kind":"rows","layer":1,"subop":"a b"}', "'subop' must be"),
                      ('[1]', "kind must be"), ("{", "not JSON")):
        with pytest.raises(UsageError, match=msg):
            parse_fault(text, 6)


def test_fixtures_make_refuses_a_bad_fault_before_building(cli_bin, tmp_path):
    out = tmp_path / "fx"
    r = run_cli(cli_bin, "fixtures", "make", str(out), "--fault", '{"kind":"rows","layer":"x"}')
    assert r.returncode == 2 and "'layer' must be an integer" in r.stderr
    assert not out.exists()


# -- one set of rules for a request's fields: specparity serve, the reference, replay --sequence ---

@pytest.mark.parametrize("body, field", [
    ({"temperature": float("nan")}, "temperature"), ({"repetition_penalty": float("nan")}, "repetition_penalty"),
    ({"logit_bias": {"512": 1}}, "logit_bias['512']"), ({"logit_bias": {"-1": 1}}, "logit_bias['-1']"),
    ({"logit_bias": {"3": float("nan")}}, "logit_bias['3']"), ({"logit_bias": {"x": 1}}, "logit_bias.x"),
    ({"max_tokens": 10**30}, "max_tokens"), ({"max_tokens": 1e30}, "max_tokens"), ({"top_k": 512}, "top_k"),
    ({"top_p": float("inf")}, "top_p"), ({"min_p": 1.5}, "min_p"), ({"seed": 2**64}, "seed"),
    ({"presence_context_size": 2**31}, "presence_context_size"), ({"xtc_threshold": 0.6}, "xtc_threshold"),
    ({"xtc_probability": 1}, "xtc_probability"), ({"stop": [None]}, "stop"), ({"stream": "yes"}, "stream"),
    ({"stream_options": {}}, "stream_options.include_usage"), ({"top_logprobs": 12}, "top_logprobs"),
    ({"chat_template_kwargs": [1]}, "chat_template_kwargs"), ({"draft_model": 5}, "draft_model"),
])
def test_check_request_names_the_field_of_each_value_that_would_fail_or_crash(body, field):
    from specparity.reference import RequestParams

    with pytest.raises(UsageError) as err:
        inputs.check_request(body, 512)
    assert str(err.value).startswith(f"request field {field}: "), str(err.value)
    with pytest.raises(UsageError, match=r"request field "):  # the reference reads bodies by the same rules
        RequestParams.from_body(body, vocab=512)


def test_check_request_passes_the_edges():
    edges = {"temperature": 0, "top_p": 1, "min_p": 0.0, "top_k": 511, "seed": 2**64 - 1, "max_tokens": 16384,
             "logit_bias": {"0": -1e30, "511": 100}, "repetition_penalty": 0, "xtc_threshold": 0.5,
             "stop": "x", "top_logprobs": -1, "stream_options": {"include_usage": False}, "model": "m"}
    inputs.check_request(edges, 512)
    inputs.check_request({"logit_bias": {str(10**6): 1}, "top_k": 10**6})  # no vocabulary known: ids >= 0


def test_json_and_config_readers_are_bounded(tmp_path):
    from specparity.schema import MAX_JSON_DEPTH, load_json

    assert load_json("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH, "x") is not None
    for data, message in ((b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1), "nested deeper"),
                          (b"[" * 100_000, "nested deeper"), (b'"\xff"', "not UTF-8"),
                          (b"1" * 5000, "not JSON"), (b"{", "not JSON")):
        with pytest.raises(UsageError, match=f"^where: {message}"):
            load_json(data, "where")
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"vocab_size": 7}}))
    assert inputs.config_vocab_size(tmp_path) == 7
    (tmp_path / "config.json").write_text("[1]")
    assert inputs.config_vocab_size(tmp_path) is None
    assert inputs.config_vocab_size("x" * 5000) is None and inputs.config_vocab_size("~nosuchuser/x") is None


@pytest.mark.model
def test_fixtures_make_builds_the_tie_and_noise_faults_and_a_probe_names_each(cli_bin, tmp_path):
    """`fixtures make --fault` as a user types it: an exact bfloat16 tie a 2-row block breaks the other way (the
    probe's block differs: exit 1) and a forward that is not reproducible (the probe's bracket: exit 3); a scale
    that is not a positive number is refused before anything is built."""
    probe = ["probe", "--trust-remote-code", "--widths", "2", "--depths", "0", "--walk", "0", "--no-aim",
             "--no-prefill"]
    for name, fault, extra, code in (("tie", '{"kind":"tie","min_rows":2}', ["--dtype", "bfloat16"], 1),
                                     ("noise", '{"kind":"noise","layer":2,"subop":"mlp","scale":0.5}', [], 3)):
        made = run_cli(cli_bin, "fixtures", "make", str(tmp_path / name), "--no-draft", "--fault", fault, *extra)
        assert made.returncode == 0, made.stderr[-2000:]
        config = json.loads((tmp_path / name / "target" / "config.json").read_text())
        assert config["specparity"]["faults"] == [json.loads(fault)], config
        r = run_cli(cli_bin, *probe, "--model", str(tmp_path / name / "target"))
        assert r.returncode == code, (name, r.stdout[-2000:], r.stderr[-2000:])
    out = tmp_path / "bad"
    r = run_cli(cli_bin, "fixtures", "make", str(out), "--fault", '{"kind":"noise","scale":-1}')
    assert r.returncode == 2 and "'scale' must be a positive number, got -1" in r.stderr and not out.exists()


@pytest.mark.model
def test_a_prefill_path_fault_differs_only_in_the_block_that_continues_the_prefill(cli_bin, tmp_path):
    """`fixtures make --fault prefill_path` as a user types it: the probe's 2-row block at depth 0 (it carries the
    prompt's last token on from the prefill) differs, the same block at depth 1 and 2 equals the chain, and the
    prefill chunked in two (its second call continues the first) differs from one-shot; token by token, which
    never runs 2 rows, equals it. A layer past the model's is refused before anything is built."""
    fault = '{"kind":"prefill_path","layer":2,"subop":"mlp","min_rows":2,"scale":1.5}'
    made = run_cli(cli_bin, "fixtures", "make", str(tmp_path / "fx"), "--no-draft", "--fault", fault)
    assert made.returncode == 0, made.stderr[-2000:]
    r = run_cli(cli_bin, "probe", "--trust-remote-code", "--model", str(tmp_path / "fx" / "target"), "--widths",
                "2,4", "--depths", "0,1,2", "--walk", "0", "--no-aim", "--json")
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert {(c["width"], c["depth"]): c["verdict"] for c in out["cells"]} == {
        (w, d): "divergent" if d == 0 else "equal" for w in (2, 4) for d in (0, 1, 2)}
    for pre in out["prefill"]:
        assert {a["name"]: a["verdict"] for a in pre["arms"]} == {"chunked": "divergent",
                                                                  "token_by_token": "equal"}, pre
    out_dir = tmp_path / "bad"
    r = run_cli(cli_bin, "fixtures", "make", str(out_dir), "--fault", '{"kind":"prefill_path","layer":99}')
    assert r.returncode == 2 and "'layer' must be an integer" in r.stderr and not out_dir.exists(), r.stderr
