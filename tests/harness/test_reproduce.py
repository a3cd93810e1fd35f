"""Which reproduction a served finding gets: decided by the serving loop the server runs, not its name.

Units of harness.reproduce.reproduce over a server's request history (no model,
no server): the served tests run every printed command on real ones
(tests/reproductions.py).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import yaml

from specparity.harness.client import Completion, Request
from specparity.harness.plan import ArmKind, ArmPlan, Drafter
from specparity.harness.profiles import Width, load_profile
from specparity.harness.reproduce import Finding, Sent, ServerHistory, reproduce
from specparity.probes.replay.sequence import read_sequence

BODY = {"prompt": "The cache holds keys", "max_tokens": 12, "temperature": 0}
IDS = [1, 5, 9, 13]


def _history(*bodies: dict) -> ServerHistory:
    sent = [Sent(Request(f"r{i}", "fresh", "completions", b), {}, Completion(text="x", token_ids=[3, 4]))
            for i, b in enumerate(bodies)]
    return ServerHistory(["python", "-m", "mlx_lm", "server", "--model", "/t", "--num-draft-tokens", "3"], sent)


W4 = ArmPlan("w4", ArmKind.WIDTH, Width(4, 3, "num_draft_tokens"), Drafter.DRAFT, server_key="w4")
BASE = ArmPlan("baseline-start", ArmKind.BASELINE, server_key="baseline-start")


def _run(profile_name: str, plan: ArmPlan, history: ServerHistory, index: int, folder: Path | None,
         draft: str | None = "/draft", prompt_ids: list[int] | None = IDS) -> dict:
    profile = load_profile(profile_name)
    finding = Finding(profile.name, profile.loop, profile.engine_hooks(), "0.32.2", token_index=3,
                      prompt_ids=prompt_ids)
    return reproduce(history, index, plan, finding, model="/t", draft=draft, trust_remote_code=False, folder=folder)


def test_a_profile_extending_mlx_lm_under_its_own_name_replays_mlx_lm_servers_loop(tmp_path: Path) -> None:
    mine = tmp_path / "my-mlx.yaml"
    mine.write_text(yaml.safe_dump({"extends": "mlx-lm", "name": "my-mlx"}))
    assert load_profile(str(mine)).loop == "mlx_lm.server"  # inherited
    first = _run(str(mine), W4, _history(BODY), 0, tmp_path / "seq")
    argv = shlex.split(first["command"])
    assert argv[:2] == ["specparity", "replay"] and argv[argv.index("--draft-model") + 1] == "/draft"
    assert argv[argv.index("--prompt-ids") + 1] == "1,5,9,13" and "--num-draft-tokens" in argv
    later = _run(str(mine), W4, _history(BODY, BODY), 1, tmp_path / "seq")
    path = Path(shlex.split(later["command"])[3])
    header, entries = read_sequence(path)
    assert (header.engine, header.serving_loop, header.draft_model) == ("my-mlx", "mlx_lm.server", "/draft")
    assert [e.id for e in entries] == ["r0", "r1"] and header.finding == {"request": "r1", "token_index": 3}
    # a drafter-less server's first request: its loop on a fresh cache (a one-entry sequence), not "no drafter"
    base = _run("mlx-lm", BASE, _history(BODY), 0, tmp_path / "seq")
    assert base["command"] and "--sequence" in base["command"]
    header, _ = read_sequence(Path(shlex.split(base["command"])[3]))
    assert header.draft_model is None
    # without files to keep, the reason says so
    assert "--record-dir" in str(_run("mlx-lm", W4, _history(BODY, BODY), 1, None)["reason"])


def test_specparity_serve_replays_only_where_mlx_lms_path_is_its_own(tmp_path: Path) -> None:
    ok = _run("specparity-serve", W4, _history(BODY), 0, tmp_path)
    assert ok["command"] and "--draft-model /draft" in ok["command"]
    penalized = _run("specparity-serve", W4, _history({**BODY, "repetition_penalty": 1.3}), 0, tmp_path)
    assert penalized["command"] is None and "hands its logits processors the whole history" in penalized["reason"]
    warm = _run("specparity-serve", W4, _history(BODY, BODY), 1, tmp_path)
    assert warm["command"] is None and "not mlx_lm.server's" in warm["reason"]
    assert not list(tmp_path.glob("*.jsonl"))  # no sequence file claims to stand for its loop


def test_dflash_mlx_replays_a_first_request_through_the_engine_and_says_why_not_otherwise(tmp_path: Path) -> None:
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({"block_size": 4}))
    got = _run("dflash-mlx", W4, _history(BODY), 0, None, draft=str(draft))
    argv = shlex.split(got["command"])
    assert argv[:4] == ["specparity", "replay", "--engine", "dflash-mlx"]
    assert argv[argv.index("--draft-model") + 1] == str(draft) and argv[argv.index("--verify-mode") + 1] == "dflash"
    assert argv[argv.index("--prompt-ids") + 1] == "1,5,9,13" and argv[argv.index("--max-tokens") + 1] == "12"
    w2 = ArmPlan("w2", ArmKind.WIDTH, Width(2, 2, "verify_len_cap"), Drafter.DRAFT, server_key="w2")
    capped = _run("dflash-mlx", w2, _history(BODY), 0, None, draft=str(draft))
    assert capped["command"] is None and "capped its blocks at 2" in capped["reason"]
    warm = _run("dflash-mlx", W4, _history(BODY, BODY), 1, None, draft=str(draft))
    assert warm["command"] is None and "no replay rebuilds dflash-mlx's prefix cache" in warm["reason"]
    processors = _run("dflash-mlx", W4, _history({**BODY, "logit_bias": {"3": 1.0}}), 0, None, draft=str(draft))
    assert processors["command"] is None and "logits processors" in processors["reason"]


def test_another_engines_loop_says_why_no_replay_rebuilds_it() -> None:
    from specparity.harness.profiles import Profile

    got = _run("mlx-lm", W4, _history(BODY), 0, None)
    assert got["command"]
    other = Profile("llama.cpp", ["x"], loop="llama-server")
    finding = Finding(other.name, other.loop, other.engine_hooks(), prompt_ids=IDS)
    why = reproduce(_history(BODY), 0, W4, finding, model="/t", draft="/d", trust_remote_code=False, folder=None)
    assert why == {"command": None, "reason": "llama.cpp runs the serving loop llama-server: no in-process replay"
                                              " rebuilds it"}


def test_a_server_on_another_mlx_lm_is_replayed_in_its_environment_and_never_by_this_interpreters(
        tmp_path: Path) -> None:
    """A pairing in a pinned environment (mlx-lm 0.31.3 servers) is replayed there: the command this interpreter
    would print, with ``--environment`` naming it (a name as it is, a file's path quoted). Where no environment
    can be named, the record says why instead of printing a command that replays another version's loop."""
    from dataclasses import replace

    profile = load_profile("mlx-lm")
    why = "the server ran mlx-lm 0.31.3 (environment mlx-lm-0.31.3); specparity replay runs ..."
    finding = Finding(profile.name, profile.loop, profile.engine_hooks(), prompt_ids=IDS)
    for index in (0, 1):
        here = reproduce(_history(BODY, BODY), index, W4, finding, model="/t", draft="/d", trust_remote_code=False,
                         folder=tmp_path / "here")
        for env in ("mlx-lm-0.31.3", "/my envs/old.yaml"):
            there = reproduce(_history(BODY, BODY), index, W4, replace(finding, other_mlx_lm=why, environment=env),
                              model="/t", draft="/d", trust_remote_code=False, folder=tmp_path / "here")
            assert there["command"] == here["command"] + " --environment " + shlex.quote(env), there
            assert shlex.split(there["command"])[-2:] == ["--environment", env]
        got = reproduce(_history(BODY, BODY), index, W4, replace(finding, other_mlx_lm=why), model="/t", draft="/d",
                        trust_remote_code=False, folder=tmp_path / "none")
        assert got == {"command": None, "reason": why}
    assert "--sequence" in there["command"] and not (tmp_path / "none").exists()


def test_every_replay_command_is_one_quoted_line_with_every_request_parameter() -> None:
    """request_command and sequence_command both build through replay_command: flags in order,
    lists comma-joined, a repeated flag repeated, off flags left out, every value shell-quoted."""
    from specparity.probes.replay.sequence import replay_command, request_command, sequence_command
    from specparity.reference import ServerSettings

    body = {**BODY, "max_tokens": 7, "repetition_penalty": 1.25, "repetition_context_size": 9,
            "logit_bias": {"3": -1.5, "10": 2}, "stop": ["\n\n", "it's"], "num_draft_tokens": 2}
    settings = ServerSettings.from_argv(["python", "-m", "mlx_lm", "server", "--kv-bits", "4",
                                         "--prefill-step-size", "64"])
    got = request_command("/t m", body, [1, 5, 9], draft_model="/d", settings=settings, trust_remote_code=True)
    assert got.command == ("specparity replay --model '/t m' --trust-remote-code --draft-model /d"
                           " --num-draft-tokens 2 --max-tokens 7 --stop-at-eos --stop '\n\n' --stop 'it'\"'\"'s'"
                           " --prompt-ids 1,5,9 --repetition-penalty 1.25 --repetition-context-size 9"
                           " --logit-bias 3:-1.5,10:2.0 --prefill-step-size 64 --kv-bits 4")
    assert shlex.split(got.command)[shlex.split(got.command).index("--stop") + 1] == "\n\n"
    assert request_command("/t", BODY, [1, 2], accepts=[2, 0, 3], width=4).command == \
        "specparity replay --model /t --accepts 2,0,3 --width 4 --prompt-ids 1,2"
    assert sequence_command("/r/a b.jsonl", True) == "specparity replay --sequence '/r/a b.jsonl' --trust-remote-code"
    assert replay_command(("--a", None), ("--b", False), ("--c", True), ("--d", 0)) == "specparity replay --c --d 0"
