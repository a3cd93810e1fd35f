"""Unit tests of single functions: witness evidence, the completion comparison, profiles, wrapping."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from specparity.harness.client import Completion
from specparity.harness.profiles import load_profile, packaged_profiles
from specparity.completions import first_difference
from specparity.harness.evidence import WitnessCall, evidence_from_calls, read_calls
from specparity.harness.judge import side
from specparity.harness.results import format_groups
from specparity.harness.witness import wrap_checkpoint

from specparity.errors import UsageError


def calls(*rows_offsets, role="target"):
    return [WitnessCall(role, r, o) for r, o in rows_offsets]


def test_verify_blocks_give_the_accept_vector_and_classic_decode_gives_none():
    # prompt of 17 tokens: prefill 16 rows, then verify blocks of 4 rows accepting 3, 0, then the last round
    ev = evidence_from_calls(calls((16, 0), (4, 16), (4, 20), (4, 21)), prompt_tokens=17, completion_tokens=7)
    assert ev.engaged and ev.verify_calls == 3
    assert ev.accepts == [3, 0, 1] and ev.widths == [4, 4, 4]
    classic = evidence_from_calls(calls((16, 0), (1, 16), (1, 17), (1, 18)), 17, 3)
    assert not classic.engaged and classic.accepts == []
    # a warm prompt cache prefills only the rest: still not a verify block
    warm = evidence_from_calls(calls((5, 11), (1, 16)), 17, 1)
    assert not warm.engaged


def test_witness_file_slices_by_byte_offset(tmp_path):
    f = tmp_path / "w.log"
    f.write_text("1 target 16 0\n1 target 4 16\n")
    size = f.stat().st_size
    with f.open("a") as h:
        h.write("1 draft 1 20\n")
    assert read_calls(f, size) == [WitnessCall("draft", 1, 20)]
    assert evidence_from_calls(read_calls(f, size), None, None).engaged


def _comp(text, ids=None, lps=None, top=None):
    import hashlib

    return Completion(text=text, sha256=hashlib.sha256(text.encode()).hexdigest(), token_ids=ids, logprobs=lps,
                      top=top)


def test_compare_names_token_char_logprobs_and_margins():
    base = _comp("abcdef", [1, 2, 3], [-1.0, -2.0, -0.5], [[(1, -1.0), (9, -3.0)], [(2, -2.0), (5, -2.1)],
                                                          [(3, -0.5), (4, -0.6)]])
    same = _comp("abcdef")
    def compare(a, b):
        return first_difference(side("baseline", a), side("arm", b))

    assert compare(base, same) is None
    arm = _comp("abcxyz", [1, 2, 4], [-1.0, -2.0000001, -0.6], [[(1, -1.0), (9, -3.0)], [(2, -2.0000001), (5, -2.1)],
                                                               [(4, -0.6), (3, -0.61)]])
    d = compare(base, arm)
    assert d.char_offset == 3 and d.token_index == 2
    assert d.logprobs_equal_before is False and d.first_logprob_diff == 1
    assert d.margin_reference == pytest.approx(0.1) and d.margin_other == pytest.approx(0.01)
    assert "token 2, char 3" in d.line() and "logprobs first differ at token 1" in d.line()


def test_groups_read_like_the_issue():
    assert format_groups([["baseline-start", "baseline-end", "w2", "w3"], ["w4", "w8"]]) == \
        "2 groups: {baseline x2, w2, w3} {w4, w8}"


def test_packaged_profiles_load_and_bad_ones_are_usage_errors(tmp_path):
    assert {"mlx-lm", "specparity-serve", "openai"} <= set(packaged_profiles())
    mlx = load_profile("mlx-lm")
    assert mlx.width(4).setting == 3 and mlx.per_request == "num_draft_tokens" and mlx.witness == ["target"]
    serve = load_profile("specparity-serve")
    assert serve.witness == ["target"] and serve.log_declined and serve.width_setting == "num_draft_tokens"
    with pytest.raises(UsageError, match="argv is empty"):
        load_profile("openai")
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"extends": "mlx-lm", "endpoint": "embeddings"}))
    with pytest.raises(UsageError, match=r"bad.yaml: endpoint: expected one of completions, chat, got 'embeddings'"):
        load_profile(str(bad))
    assert mlx.stop == "graceful" and load_profile("vllm-mlx").stop == "kill"
    stop = tmp_path / "stop.yaml"
    stop.write_text(yaml.safe_dump({"extends": "mlx-lm", "stop": "SIGTERM"}))
    with pytest.raises(UsageError, match=r"stop.yaml: stop: expected one of graceful, kill, got 'SIGTERM'"):
        load_profile(str(stop))
    loop = tmp_path / "loop.yaml"
    loop.write_text(yaml.safe_dump({"extends": str(loop)}))
    with pytest.raises(UsageError, match="loop"):
        load_profile(str(loop))


def _schema_keys(fields: object, prefix: str = "") -> list[tuple[str, str]]:
    """(dotted path, key) of every key of a Fields schema, nested mappings included."""
    from specparity.schema import Fields, Nullable

    out: list[tuple[str, str]] = []
    assert isinstance(fields, Fields)
    for key, check in fields.fields.items():
        out.append((prefix + key, key))
        inner = check.inner if isinstance(check, Nullable) else check
        if isinstance(inner, Fields):
            out += _schema_keys(inner, f"{prefix}{key}.")
    return out


def test_the_mlx_lm_profile_documents_every_profile_key_and_loads_as_before():
    """profiles/mlx-lm.yaml is where a newcomer reads what a profile can say: every PROFILE_SCHEMA
    key is in it, set or (extends, which this file cannot use) named in a comment."""
    import re

    from specparity.harness.profiles import PROFILE_SCHEMA

    text = packaged_profiles()["mlx-lm"].read_text()
    raw = yaml.safe_load(text)
    keys = _schema_keys(PROFILE_SCHEMA)
    assert len(keys) > 30 and ("evidence.metrics_path", "metrics_path") in keys
    missing = [path for path, key in keys if not re.search(rf"^\s*(# )?{re.escape(key)}:", text, re.MULTILINE)]
    assert not missing, f"PROFILE_SCHEMA keys not documented in mlx-lm.yaml: {missing}"
    unset = [path for path, _ in keys if "." not in path and path not in raw]
    assert unset == ["extends"]  # every other top key is set, with its default said beside it
    mlx = load_profile("mlx-lm")  # the values set are the defaults: nothing a run does changes
    assert (mlx.arithmetic, mlx.exercised, mlx.engine, mlx.environment, mlx.requires_module) == (
        "mlx", True, None, None, None)
    assert (mlx.usage_field, mlx.metrics_counter, mlx.metrics_path, mlx.flush) == (None, None, "/metrics", None)


def test_wrap_keeps_faults_links_weights_and_wraps_a_foreign_model_file_with_consent(tmp_path):
    src = tmp_path / "ckpt"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (src / "model.safetensors").write_bytes(b"w")
    out = wrap_checkpoint(src, tmp_path / "wrapped", "target")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_file"] == "specparity_fixture.py" and cfg["specparity"] == {
        "base": "llama", "faults": [], "witness": "target"}
    assert (out / "model.safetensors").is_symlink() and (out / "specparity_fixture.py").is_file()
    (src / "config.json").write_text(json.dumps({"model_type": "llama", "model_file": "mine.py"}))
    with pytest.raises(UsageError, match="model_file 'mine.py' is not a file"):
        wrap_checkpoint(src, tmp_path / "w2", "target", trust_remote_code=True)
    (src / "mine.py").write_text("")
    # the checkpoint's own code runs only with the consent it needs anyway
    with pytest.raises(UsageError, match="own model_file 'mine.py'.*--trust-remote-code"):
        wrap_checkpoint(src, tmp_path / "w2", "target")
    out = wrap_checkpoint(src, tmp_path / "w3", "target", trust_remote_code=True)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_file"] == "specparity_fixture.py" and cfg["specparity"] == {
        "module_file": "mine.py", "faults": [], "witness": "target"}
    assert (out / "mine.py").is_symlink()


@pytest.mark.parametrize("field", [{"accepts": "abc"}, {"accepts": [1, "x"], "widths": [2, 2]},
                                   {"accepts": [1, 2], "width": None}, {"accepts": [1], "widths": [2, 3]}])
def test_a_response_evidence_field_that_is_not_rounds_gives_no_rounds(field: dict) -> None:
    """A response is data (issue 20, class 4): `accepts: "abc"` became rounds ['a', 'b', 'c'] and the
    arm's acceptance sum raised."""
    from pathlib import Path

    from specparity.harness.evidence import Marks, collect
    from specparity.harness.profiles import Profile

    comp = Completion(text="x", raw={"timings": field})
    ev = collect(Profile("p", [], response_field="timings"), Path("/nonexistent"), None, comp, Marks(), None)
    assert ev.accepts == [] and ev.widths == [] and ev.engaged and ev.acceptance is None


def test_two_entries_of_one_kind_get_distinct_ids_and_a_repeat_names_its_first_answer() -> None:
    from specparity.harness.config import Job, Pairing
    from specparity.harness.plan import build_sequence

    job = Job(pairings=[Pairing("p", "t", "d")], prompts=["a", "b", "c", "d"],
              sequence=["fresh", "repeat", "repeat", "multi-turn", "multi-turn"])
    reqs = build_sequence(job, "completions", {"chat-1": "x", "chat-1-2": "y"})
    ids = [r.id for r in reqs]
    assert ids == ["p0", "p0-again", "p0-again-2", "chat-1", "chat-2", "chat-1-2", "chat-2-2"]
    assert len(set(ids)) == len(ids)
    by = {r.id: r for r in reqs}
    assert by["p0-again"].repeats == "p0" and by["p0-again-2"].repeats == "p0" and by["p0"].repeats is None
    assert by["chat-1-2"].repeats == "chat-1"  # the same first turn, answered before on the same server
    assert by["chat-2-2"].body["messages"][1]["content"] == "y"  # each second turn carries its own first turn
    assert [r.turn for r in reqs[3:]] == [1, 2, 1, 2]


def test_a_failed_requests_cause_is_the_last_traceback_the_server_logged_after_it_began(tmp_path: Path) -> None:
    """harness.evidence.logged_error: a request that fails without an answer (the server closed the connection)
    is told the exception line of the last traceback in its slice of the log; nothing before the slice, and
    nothing where the slice holds no traceback."""
    from specparity.harness.evidence import logged_error

    log = tmp_path / "server.log"
    before = "Traceback (most recent call last):\n  File \"x.py\", line 1, in f\nValueError: an earlier request's\n"
    ours = ("127.0.0.1 - - POST /v1/completions\n"
            "Traceback (most recent call last):\n  File \"s.py\", line 9, in make_cache\n    raise KeyError(1)\n"
            "KeyError: 1\n\nDuring handling of the above exception, another exception occurred:\n\n"
            "Traceback (most recent call last):\n  File \"s.py\", line 12, in make_cache\n"
            "NotImplementedError: Gemma 4 assistant has no KV cache of its own\n----\n")
    log.write_text(before + ours)
    assert logged_error(log, len(before)) == "NotImplementedError: Gemma 4 assistant has no KV cache of its own"
    assert logged_error(log, 0) == "NotImplementedError: Gemma 4 assistant has no KV cache of its own"
    log.write_text(before + "127.0.0.1 - - POST /v1/completions 200\n")
    assert logged_error(log, len(before)) is None and logged_error(None, 0) is None
