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
