"""Reproductions that reproduce: served findings on real mlx_lm.server, and the printed commands run.

Each test serves a real sequence on a real ``mlx_lm.server`` (the served
answers are the finding), writes what the served job would write, runs the
command it would print, and asserts that it exits 1 at the same first index.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import run_cli

from specparity.harness.lifecycle import PORT_ARG, Server
from specparity.reference import ClassicReference, ServerSettings
from specparity.completions import first_difference
from specparity.probes.replay.sequence import (
    SequenceEntry, SequenceHeader, not_reproducible, read_sequence, request_command, sequence_command,
    sequence_reproduction, write_sequence,
)

PROMPT = "Speculative decoding drafts several tokens with a small model and verifies them"


def _serve(target: str, log: Path, requests: list[tuple[str, str, dict]], extra: list[str] | None = None,
           ) -> list[SequenceEntry]:
    """Send ``requests`` (id, kind, body) in order to one fresh server; the entries with its answers (a
    streamed one carries text only, as mlx-lm 0.32.2 streams it)."""
    argv = [sys.executable, "-m", "mlx_lm", "server", "--model", target, "--port", PORT_ARG, *(extra or [])]
    out = []
    with Server(argv, log_path=log, name="mlx_lm.server") as srv:
        for rid, kind, body in requests:
            if body.get("stream"):
                text, finish = "", None
                with httpx.stream("POST", srv.url + "/v1/completions", timeout=300, json=body) as r:
                    assert r.status_code == 200
                    for line in r.iter_lines():
                        if line.startswith("data: ") and line[6:].strip() != "[DONE]":
                            for c in json.loads(line[6:]).get("choices") or []:
                                text += c.get("text") or ""
                                finish = c.get("finish_reason") or finish
                out.append(SequenceEntry(rid, "completions", body, kind=kind, served={
                    "token_ids": None, "text": text, "finish_reason": finish, "usage": None}))
                continue
            r = httpx.post(srv.url + "/v1/completions", json={**body, "logprobs": True}, timeout=300)
            assert r.status_code == 200, r.text
            resp = r.json()
            c = resp["choices"][0]
            out.append(SequenceEntry(rid, "completions", body, kind=kind, served={
                "token_ids": [e["id"] for e in c["logprobs"]["content"]], "text": c["text"],
                "finish_reason": c["finish_reason"], "usage": resp["usage"]}))
    return out


def _served_first(ref: ClassicReference, entries: list[SequenceEntry]) -> tuple[str, int] | None:
    """Where the served answers first leave classic decode, as a token index (what the judge reports:
    a streamed answer's from classic decode's pieces)."""
    for e in entries:
        served = e.served_side()
        assert served is not None
        classic = ref.complete(e.endpoint, e.body)
        d = first_difference(classic.side(), served)
        if d is not None:
            index = d.token_index if d.token_index is not None else classic.token_index_at(d.char_offset)
            assert index is not None
            return e.id, index
    return None


def _run(cli_bin: str, command: str, *more: str):
    argv = shlex.split(command)
    assert argv[:2] == ["specparity", "replay"]
    return run_cli(cli_bin, *argv[1:], "--json", *more)


@pytest.mark.model
@pytest.mark.server
def test_seeded_repeat_with_a_penalty_reproduces_through_one_prompt_cache(llama_pair, tmp_path, cli_bin):
    """``seed`` sends a request down the server's sequential path, where a prompt-cache hit feeds the
    processors only the uncached suffix: the repeat differs from classic decode, on a drafter-less server.
    The repeat is streamed (text only): the replay names the same token, not the character offset."""
    body = {"prompt": PROMPT, "max_tokens": 24, "repetition_penalty": 1.3, "seed": 0}
    entries = _serve(llama_pair.target, tmp_path / "server.log",
                     [("p0", "fresh", body), ("p0-again", "repeat", {**body, "stream": True})])
    assert entries[1].served is not None and entries[1].served["token_ids"] is None
    ref = ClassicReference(llama_pair.target)
    served = _served_first(ref, entries)
    assert served is not None and served[0] == "p0-again"  # the baseline itself left classic decode
    header = SequenceHeader(model=llama_pair.target, engine_version="0.32.2", arm="baseline-start",
                            finding={"request": served[0], "token_index": served[1]})
    rep = sequence_reproduction(tmp_path / "baseline.sequence.jsonl", header, entries)
    assert rep.command == sequence_command(tmp_path / "baseline.sequence.jsonl") and rep.reason is None
    out = _run(cli_bin, rep.command)
    assert out.returncode == 1, out.stderr
    report = json.loads(out.stdout)
    assert tuple(report["first"]) == served == tuple(report["served_first"])
    again = report["requests"][1]
    # the streamed answer's first differing character is not its token: the index is the token's
    assert again["served_vs_classic"]["char_offset"] != again["served_vs_classic"]["token_index"] == served[1]
    assert again["reproduced"] and again["served"]["cached"] == 16 and again["served"]["path"] == "sequential"
    assert "uncached suffix" in again["cause"] and "seed in the request" in again["cause"]
    # the same sequence without the seed takes the batched path, whose processors see everything
    clean = [SequenceEntry(e.id, e.endpoint, {k: v for k, v in e.body.items() if k != "seed"}, kind=e.kind)
             for e in entries]
    path = write_sequence(tmp_path / "clean.sequence.jsonl", SequenceHeader(model=llama_pair.target), clean)
    out = _run(cli_bin, sequence_command(path))
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.model
@pytest.mark.server
@pytest.mark.slow
def test_drafter_repeat_reproduces_and_names_the_cache_entry(llama_pair, tmp_path, cli_bin):
    """mlx-lm 0.32.2 with a drafter stores a cache entry one position short of its key: a repeated
    request is fed at the wrong position and differs from classic decode from its first token."""
    body = {"prompt": PROMPT, "max_tokens": 24, "num_draft_tokens": 3}
    entries = _serve(llama_pair.target, tmp_path / "server.log",
                     [("p0", "fresh", body), ("p0-again", "repeat", body)],
                     ["--draft-model", llama_pair.draft])
    served = _served_first(ClassicReference(llama_pair.target), entries)
    assert served == ("p0-again", 0)
    header = SequenceHeader(model=llama_pair.target, draft_model=llama_pair.draft, arm="w4")
    rep = sequence_reproduction(tmp_path / "w4.sequence.jsonl", header, entries)
    assert rep.command is not None
    out = _run(cli_bin, rep.command)
    assert out.returncode == 1, out.stderr
    report = json.loads(out.stdout)
    assert tuple(report["first"]) == served
    assert "held 15 positions" in report["requests"][1]["cause"]
    # a lone request reproduces nothing: the state was the finding
    lone = request_command(llama_pair.target, body, ClassicReference(llama_pair.target).prompt(
        "completions", body).ids, draft_model=llama_pair.draft)
    assert lone.command is not None
    assert _run(cli_bin, lone.command).returncode == 0


@pytest.mark.model
@pytest.mark.server
@pytest.mark.slow
def test_drafter_processor_divergence_reproduces_with_every_request_parameter(llama_pair, tmp_path, cli_bin):
    """The drafter path's processors see the last prompt token and the emitted tokens only: a fresh
    request with penalties, a logit bias and a stop word differs, and the printed command says where."""
    from specparity.checkpoint import load_checkpoint
    from specparity.probes.replay.sequence import ServingLoop

    ref = ClassicReference(llama_pair.target)
    base = {"prompt": PROMPT, "max_tokens": 40, "repetition_penalty": 1.3, "repetition_context_size": 30,
            "presence_penalty": 0.2, "logit_bias": {"200": 0.5}, "num_draft_tokens": 3}
    # a stop word from late in the drafter path's own answer, so the server stops there
    loop = ServingLoop(ref.model, ref.tokenizer, ref.settings, load_checkpoint(llama_pair.draft).model)
    decoded = loop.serve("completions", base).decoded
    assert decoded is not None
    pieces = decoded.pieces
    k = next(k for k in range(len(pieces) - 8, 12, -1) if pieces[k] and pieces[k + 1]
             and ("".join(pieces)).find(pieces[k] + pieces[k + 1]) == len("".join(pieces[:k])))
    body = {**base, "stop": [pieces[k] + pieces[k + 1]]}
    [entry] = _serve(llama_pair.target, tmp_path / "server.log", [("p0", "fresh", body)],
                     ["--draft-model", llama_pair.draft])
    assert entry.served is not None
    assert entry.served["finish_reason"] == "stop" and len(entry.served["token_ids"]) < 40
    served = _served_first(ref, [entry])
    assert served is not None
    rep = request_command(llama_pair.target, body, ref.prompt("completions", body).ids,
                          draft_model=llama_pair.draft)
    assert rep.command is not None
    for flag in ("--repetition-penalty", "--repetition-context-size", "--presence-penalty", "--logit-bias",
                 "--max-tokens", "--prompt-ids", "--num-draft-tokens", "--stop"):
        assert flag in rep.command
    out = _run(cli_bin, rep.command)
    assert out.returncode == 1, out.stdout + out.stderr
    result = json.loads(out.stdout)["requests"][0]
    assert result["served_first_mismatch"] == served[1]
    assert result["served_checked"] == len(entry.served["token_ids"])  # the recording stopped where the server did


def test_sequence_file_round_trip_and_what_cannot_be_replayed(tmp_path):
    header = SequenceHeader(model="/m", draft_model=None, server=ServerSettings(kv_bits=8).to_dict(),
                            finding={"request": "b", "token_index": 3})
    entries = [SequenceEntry("a", "completions", {"prompt": "x", "seed": 1}),
               SequenceEntry("b", "chat", {"messages": [{"role": "user", "content": "x"}]}, kind="repeat",
                             served={"token_ids": [1, 2], "text": "hi"})]
    path = write_sequence(tmp_path / "s.jsonl", header, entries)
    h2, e2 = read_sequence(path)
    assert h2 == header and e2 == entries and h2.settings().kv_bits == 8
    assert not_reproducible(header, entries) is None
    assert "temperature 0.7" in str(not_reproducible(header, [SequenceEntry("a", "completions",
                                                                            {"prompt": "x", "temperature": 0.7})]))
    assert "concurrent" in str(not_reproducible(SequenceHeader(model="/m", concurrent=True), entries))
    assert "llama.cpp" in str(not_reproducible(SequenceHeader(model="/m", engine="llama.cpp"), entries))
    # the loop the server ran decides, not the engine's name: a profile extending mlx-lm under its own name
    # replays; specparity-serve (mlx_lm.server with its cache and processors fixed) does not
    assert not_reproducible(SequenceHeader(model="/m", engine="my-mlx", loop="mlx_lm.server"), entries) is None
    why = not_reproducible(SequenceHeader(model="/m", engine="specparity-serve", loop="specparity-serve"), entries)
    assert why is not None and "runs the serving loop specparity-serve" in why
    h3, _ = read_sequence(write_sequence(tmp_path / "loop.jsonl", SequenceHeader(model="/m", loop="x"), entries))
    assert h3.loop == "x" and h3.serving_loop == "x"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"format": "specparity.sequence/1", "model": "/m"}\n{"id": "a"}\n')
    from specparity.errors import UsageError

    with pytest.raises(UsageError, match=":2:"):
        read_sequence(bad)
    # a sampled request has no command, and says why; every parameter reaches the command
    assert "temperature" in str(request_command("/m", {"temperature": 1.0}, [1], draft_model="/d").reason)
    cmd = request_command("/m", {"max_tokens": 9, "frequency_penalty": 0.5, "stop": ["a b"]}, [1, 2],
                          draft_model="/d", settings=ServerSettings(kv_bits=4, kv_group_size=32)).command
    assert cmd is not None and "--frequency-penalty 0.5" in cmd and "--stop 'a b'" in cmd
    assert "--kv-bits 4 --kv-group-size 32" in cmd and "--max-tokens 9" in cmd


def test_cli_usage_errors(tmp_path, cli_bin):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"format": "something else"}\n')
    r = run_cli(cli_bin, "replay", "--sequence", str(bad))
    assert r.returncode == 2 and "Error: " in r.stderr and "not a sequence file" in r.stderr
    r = run_cli(cli_bin, "replay", "--sequence", str(bad), "--accepts", "1,2")
    assert r.returncode == 2 and "exactly one of" in r.stderr
    r = run_cli(cli_bin, "replay", "--accepts", "1,2", "--width", "4", "--stop", "x")
    assert r.returncode == 2 and "--stop" in r.stderr
    header = SequenceHeader(model="/m", trust_remote_code=True)
    path = write_sequence(tmp_path / "s.jsonl", header, [SequenceEntry("a", "completions", {"prompt": "x"})])
    r = run_cli(cli_bin, "replay", "--sequence", str(path))
    assert r.returncode == 2 and "--trust-remote-code" in r.stderr


@pytest.mark.model
@pytest.mark.slow
def test_a_served_difference_the_replay_does_not_rebuild_is_not_reproduced_exit_3(llama_pair, tmp_path, cli_bin):
    """The served answer (here an injected one) leaves classic decode, the in-process loop does not:
    exit 3, the report says the finding is not reproduced in process and why, and names the token."""
    body = {"prompt": PROMPT, "max_tokens": 8}
    served = {"token_ids": None, "text": "an answer no process gives", "finish_reason": "length"}
    header = SequenceHeader(model=llama_pair.target, arm="w2", finding={"request": "p0", "token_index": 0})
    path = write_sequence(tmp_path / "s.jsonl", header, [SequenceEntry("p0", "completions", body, served=served)])
    r = run_cli(cli_bin, "replay", "--sequence", str(path))
    assert r.returncode == 3, r.stdout + r.stderr
    assert ("not reproduced in process: the served request p0 differs from classic decode at token 0, the replay"
            " does not (the in-process loop answers every request as classic decode does: the served difference"
            " comes from serving-loop state this replay does not rebuild)") in r.stdout, r.stdout


# -- a sequence file is checked whole before anything loads (issue 30, class 7) -----------------

VOCAB = 512
HEADER: dict[str, Any] = {"format": "specparity.sequence/1", "model": "MODEL"}
GOOD: dict[str, Any] = {"id": "a", "endpoint": "completions", "body": {"prompt": "x", "max_tokens": 4}}


def _line(obj: object) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def _with(**changes: object) -> dict[str, Any]:
    """GOOD with ``changes``; a key ``body__k`` changes the body's ``k``."""
    out: dict[str, Any] = {**GOOD, "body": dict(GOOD["body"])}
    for k, v in changes.items():
        if k.startswith("body__"):
            out["body"][k[6:]] = v
        else:
            out[k] = v
    return out


def _bad_sequences() -> list[tuple[str, bytes | None, bytes, int, str]]:
    """(name, header line (None: the good one), the lines after it, the bad line, what the error names)."""
    nan = float("nan")
    rows: list[tuple[str, bytes | None, bytes, int, str]] = [
        ("non-UTF-8", None, b'{"id": "\xff\xfe"}\n', 2, "not UTF-8"),
        ("100,000-deep array", None, b"[" * 100_000 + b"]" * 100_000 + b"\n", 2, "nested deeper"),
        ("5,000 digits", None, b'{"id": 1' + b"0" * 5000 + b"}\n", 2, "not JSON"),
        ("concurrent 'no'", _line({**HEADER, "concurrent": "no"}), _line(GOOD), 1, "concurrent"),
        ("trust_remote_code 'yes'", _line({**HEADER, "trust_remote_code": "yes"}), _line(GOOD), 1,
         "trust_remote_code"),
        ("model a number", _line({**HEADER, "model": 5}), _line(GOOD), 1, "model"),
        ("prompt_cache_size -1", _line({**HEADER, "server": {"prompt_cache_size": -1}}), _line(GOOD), 1,
         "server.prompt_cache_size"),
        ("server max_tokens 10^12", _line({**HEADER, "server": {"max_tokens": 10**12}}), _line(GOOD), 1,
         "server.max_tokens"),
        ("finding a list", _line({**HEADER, "finding": [1]}), _line(GOOD), 1, "finding"),
        ("server top_k the vocabulary", _line({**HEADER, "server": {"top_k": VOCAB}}), _line(GOOD), 1,
         "server.top_k"),
    ]
    for name, ids in (("negative", [-1]), ("huge", [10**30]), ("strings", ["a"]), ("floats", [1.5]),
                      ("past the vocabulary", [VOCAB]), ("'abc'", "abc"), ("empty", [])):
        rows.append((f"prompt_ids {name}", None, _line(_with(prompt_ids=ids)), 2, "prompt_ids"))
    rows += [
        ("200,000 prompt ids", None, _line(_with(prompt_ids=[1] * 200_000)), 2, "prompt_ids"),
        ("served ids past the vocabulary", None, _line(_with(served={"token_ids": [1, VOCAB]})), 2,
         "served.token_ids[1]"),
        ("max_tokens 10^12", None, _line(_with(body__max_tokens=10**12)), 2, "max_tokens"),
        ("max_tokens a string", None, _line(_with(body__max_tokens="4")), 2, "max_tokens"),
        ("logit_bias past the vocabulary", None, _line(_with(body__logit_bias={"99999": 5})), 2, "logit_bias"),
        ("logit_bias NaN", None, _line(_with(body__logit_bias={"3": nan})), 2, "logit_bias"),
        ("repetition_penalty -1", None, _line(_with(body__repetition_penalty=-1)), 2, "repetition_penalty"),
        ("repetition_penalty NaN", None, _line(_with(body__repetition_penalty=nan)), 2, "repetition_penalty"),
        ("temperature NaN", None, _line(_with(body__temperature=nan)), 2, "temperature"),
        ("endpoint unknown", None, _line(_with(endpoint="embeddings")), 2, "endpoint"),
        ("no prompt", None, _line({**GOOD, "body": {"max_tokens": 4}}), 2, "body.prompt"),
        ("chat without messages", None, _line(_with(endpoint="chat")), 2, "body.messages"),
        ("no id", None, _line({k: v for k, v in GOOD.items() if k != "id"}), 2, "id"),
        ("a list, not a request", None, b"[1, 2]\n", 2, "not a JSON object"),
        # over --max-items (1024): the first request past it is named before any line is parsed
        ("2,000 requests", None, _line(GOOD) * 2000, 1026, "2000 requests, above the maximum 1024"),
        ("10^6 requests", None, b"{}\n" * 10**6, 1026, "1000000 requests, above the maximum 1024"),
    ]
    return rows


@pytest.fixture(scope="module")
def config_only(tmp_path_factory) -> Path:
    """A checkpoint directory with a config and no weights: anything that loads it fails (exit 4)."""
    d = tmp_path_factory.mktemp("config-only")
    (d / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": VOCAB}))
    return d


def _cli(capsys, *argv: str) -> tuple[int, str]:
    from specparity.cli import main

    with pytest.raises(SystemExit) as ex:
        main(list(argv))
    return int(ex.value.code or 0), capsys.readouterr().err


@pytest.mark.parametrize("case", _bad_sequences(), ids=lambda c: c[0])
def test_each_bad_sequence_file_is_one_line_exit_2_naming_file_line_and_field(case, config_only, tmp_path, capsys):
    name, head, rest, line, word = case
    path = tmp_path / "s.jsonl"
    head = head if head is not None else _line(HEADER)
    path.write_bytes(head.replace(b"MODEL", str(config_only).encode()) + rest)
    code, err = _cli(capsys, "replay", "--sequence", str(path))
    assert code == 2, (name, err)
    assert len(err.splitlines()) == 1 and err.startswith(f"Error: {path}:{line}: "), (name, err)
    assert word in err, (name, err)


def test_a_sequence_file_past_the_size_limit_is_refused_before_it_is_read(config_only, tmp_path, capsys):
    from specparity.schema import MAX_FILE_BYTES

    path = tmp_path / "big.jsonl"
    with open(path, "wb") as f:  # a 50 MB prompt
        f.write(_line({**HEADER, "model": str(config_only)}))
        f.write(_line(_with(body__prompt="x" * 50_000_000)))
    code, err = _cli(capsys, "replay", "--sequence", str(path))
    assert code == 2 and err.startswith(f"Error: {path}: ") and f"{MAX_FILE_BYTES} bytes" in err, err


def test_a_good_sequence_file_passes_the_checks_and_reaches_the_model(config_only, tmp_path, capsys):
    """The clean path: nothing in the file is refused; the checkpoint without weights is what stops it."""
    path = tmp_path / "s.jsonl"
    good = _with(prompt_ids=[1, VOCAB - 1], body__logit_bias={str(VOCAB - 1): -1.0}, body__seed=3,
                 served={"token_ids": [VOCAB - 1], "text": "x", "usage": {"prompt_tokens": 2}})
    path.write_bytes(_line({**HEADER, "model": str(config_only), "concurrent": False,
                            "server": {"prompt_cache_size": 0}}) + _line(good) * 1024)
    code, err = _cli(capsys, "replay", "--sequence", str(path))
    assert code == 2 and "not a checkpoint (no model*.safetensors)" in err, err
    assert str(path) not in err, err
