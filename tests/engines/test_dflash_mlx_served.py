"""dflash-mlx's server (``dflash serve``) live from its environment, as the dflash-mlx profile and its
engine (specparity/engines/dflash_mlx/served.py) drive it; and that engine's evidence readers on their own.

What these pin (/work/team/dflash-serve-notes.md has the reading behind them):
the arms without a drafter are served target only (``/metrics`` mode_used
ar_fastpath); a drafted arm's every verify round comes from ``--diagnostics
full`` (rows, accepted, DFlash-drafted or copied from the history), and only a
DFlash-drafted round is evidence the drafter ran; token ids are kept and the
constant 0.0 logprob values dropped; each request's prompt cache is cold or
warm; a width past the drafter's block is not run; a shape the engine cannot
verify is an error with the engine's own message; a load failure ends the
start at once. The pairs come from tests/dflash_pairs.py, built once per session under
``fixture_root`` and shared with tests/engines/test_dflash_mlx.py.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from specparity.environments import ENV_CACHE_VAR, Environment
from specparity.harness.config import Job, Pairing
import specparity.engines.dflash_mlx.served as dflash_mlx
from specparity.harness.lifecycle import Server
from specparity.harness.profiles import load_profile
from specparity.harness.results import ArmResult, ServedReport
from specparity.harness.run import ServedRun
from specparity.verdicts import Verdict

from dflash_pairs import dflash_info, pair_dirs
from builds import REAL_CACHE, built

PROMPT = "The quick brown fox jumps over the lazy dog, and then"
MAX_TOKENS = 24
BLOCK = 8

# classic decode in process, with the environment's own mlx-lm (the server's): mlx-lm's greedy
# (argmax of the logprobs in the model's dtype), one token a step
_CLASSIC = '''
import json, sys
import mlx.core as mx
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache
model, tok = load(sys.argv[1])
cache = make_prompt_cache(model)
logits = model(mx.array(tok.encode(sys.argv[2]))[None], cache=cache)
out = []
for _ in range(int(sys.argv[3])):
    row = logits[0, -1]
    y = int(mx.argmax(row - mx.logsumexp(row, keepdims=True)).item())
    out.append(y)
    logits = model(mx.array([[y]]), cache=cache)
print(json.dumps(out))
'''


def in_env(env: Environment, code: str, *args: str) -> Any:
    out = subprocess.run([str(env.python), "-P", "-c", code, *args], env=env.environ(), capture_output=True,
                         text=True, timeout=600, cwd=tempfile.gettempdir())
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(autouse=True)
def real_environments(monkeypatch: pytest.MonkeyPatch) -> None:
    """The served harness finds the built environments where scripts/build-env put them."""
    monkeypatch.setenv(ENV_CACHE_VAR, str(REAL_CACHE))


@pytest.fixture(scope="module")
def dflash_env() -> Environment:
    return built("dflash-mlx")


@pytest.fixture(scope="module")
def qwen3_pair(dflash_env: Environment, fixture_root: Path) -> dict[str, str]:
    return pair_dirs(dflash_info(fixture_root, "qwen3", BLOCK))


def served(pair: dict[str, str], work: Path, widths: list[int], sequence: list[str],
           **job: Any) -> ServedReport:
    """The served harness on one dflash-mlx pairing (its servers from the profile's environment)."""
    spec = Job(pairings=[Pairing("dflash", pair["target"], pair["draft"], "dflash-mlx")], widths=widths,
               max_tokens=MAX_TOKENS, prompts=[PROMPT, "def add(a, b):\n    return a + b\n"],
               sequence=sequence, **job)
    return ServedRun(spec, workdir=work).run()


def arms(report: ServedReport) -> dict[str, ArmResult]:
    return {a.name: a for a in report.pairings[0].arms}


# The classic reference (specparity/reference.py) runs in dflash-mlx's environment, mlx-lm 0.31.3, with that
# server's own tokenize step and stop and text machine: every request of a dflash-mlx served job is compared
# with classic decode (these tests also compute it by their own scripts, _CLASSIC and _CHAINS).


def assert_reference_compared(report: ServedReport) -> None:
    """Every request of every arm was compared with the classic reference (see above)."""
    for arm in report.pairings[0].arms:
        for r in arm.requests:
            assert r.reference is not None and r.reference["compared"] is True, (arm.name, r.id, r.reference)


# -- live: the served harness on dflash serve ------------------------------------------------------
@pytest.mark.slow
@pytest.mark.build
@pytest.mark.server
@pytest.mark.model
def test_a_served_dflash_job_reads_every_round_keeps_the_ids_and_refuses_a_width_past_the_block(
        dflash_env: Environment, qwen3_pair: dict[str, str], tmp_path: Path) -> None:
    report = served(qwen3_pair, tmp_path, [BLOCK, BLOCK + 1], ["fresh", "repeat"])
    got = arms(report)
    assert [a for a in got] == ["baseline-start", f"w{BLOCK}", f"w{BLOCK + 1}", "baseline-end"]
    # the width past the drafter's block_size: not run, with the reason (dflash would clamp it silently)
    wide = got[f"w{BLOCK + 1}"]
    assert wide.verdict == Verdict.NOT_RUN and not wide.requests
    assert f"wider than the {BLOCK} rows dflash-mlx verifies" in wide.reason
    assert report.pairings[0].verdict == Verdict.NOT_RUN
    # the arms without a drafter: dflash serve with its drafter set aside, target only
    for name in ("baseline-start", "baseline-end"):
        arm = got[name]
        assert arm.verdict == Verdict.MATCH and "--fastpath-max-tokens" in arm.server["argv"]
        for r in arm.requests:
            assert not r.evidence.engaged and "mode_used ar_fastpath" in r.evidence.lines[0], r.evidence.lines
    # the drafted arm: width pinned, every round read, only DFlash-drafted rounds count as engagement
    w = got[f"w{BLOCK}"]
    argv = w.server["argv"]
    assert argv[argv.index("--verify-len-cap") + 1] == str(BLOCK) and "--diagnostics" in argv
    assert w.verdict == Verdict.MATCH, [r.reason for r in w.requests]
    base = {r.id: r for r in got["baseline-start"].requests}
    for r in w.requests:
        ev, comp = r.evidence, r.completion
        assert ev.engaged and "engine" in ev.sources and "drafted by the DFlash drafter" in ev.lines[0]
        assert sum(a + 1 for a in ev.accepts) == comp.usage["completion_tokens"] == MAX_TOKENS
        assert max(ev.widths) <= BLOCK and all(0 <= a < wd for a, wd in zip(ev.accepts, ev.widths))
        # ids kept (the same as the target-only baseline's), the placeholder logprob values dropped
        assert comp.token_ids == base[r.id].completion.token_ids and len(comp.token_ids or []) == MAX_TOKENS
        assert comp.logprobs is None and comp.top is None
    # the prompt cache per request: the first cold, the same prompt again warm
    cold, warm = w.requests
    assert (cold.evidence.cache, cold.evidence.cached_tokens) == ("cold", 0)
    assert warm.evidence.cache == "warm" and warm.evidence.cached_tokens == cold.completion.usage["prompt_tokens"]


@pytest.mark.slow
@pytest.mark.build
@pytest.mark.server
@pytest.mark.model
def test_the_documented_job_with_its_default_arms_can_pass(dflash_env: Environment, qwen3_pair: dict[str, str],
                                                          cli_bin: str, tmp_path: Path) -> None:
    """docs/engines.md's `served --profile dflash-mlx --model T --draft-model D --widths ...` with the default
    arms (issue 46 item 6): the self-draft arm, which this engine cannot run (its drafters are DFlash's own
    format), is left out with the reason instead of planned as not_run, so a job whose every arm matched
    passes (exit 0) where it could never pass before."""
    from conftest import run_cli

    proc = run_cli(cli_bin, "served", "--profile", "dflash-mlx", "--model", qwen3_pair["target"], "--draft-model",
                   qwen3_pair["draft"], "--widths", "2,4", "--max-tokens", "16", "--json", cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    pairing = json.loads(proc.stdout)["pairings"][0]
    assert [a["name"] for a in pairing["arms"]] == ["baseline-start", "w2", "w4", "concurrent", "baseline-end"]
    assert pairing["verdict"] == "match"
    assert ("no self-draft arm: dflash-mlx cannot draft with the target itself (its engine takes drafters of its"
            " own format)") in pairing["findings"]


@pytest.mark.slow
@pytest.mark.build
@pytest.mark.server
@pytest.mark.model
def test_every_request_kind_at_every_width_matches_and_a_fallback_is_declined(
        dflash_env: Environment, qwen3_pair: dict[str, str], tmp_path: Path) -> None:
    """fresh, repeat, shared prefix, stream and a two-turn chat at widths 2, 4 and the block; then the
    same server made to fall back to target-only decoding (--dflash-max-ctx below the prompt): declined,
    never a pass."""
    report = served(qwen3_pair, tmp_path, [2, 4, BLOCK],
                    ["fresh", "repeat", "shared-prefix", "stream", "multi-turn"],
                    extra_args={"w4": ["--dflash-max-ctx", "8"]})
    got = arms(report)
    assert_reference_compared(report)
    for name in ("w2", f"w{BLOCK}"):
        assert got[name].verdict == Verdict.MATCH, [r.reason for r in got[name].requests]
        assert [r.id for r in got[name].requests] == ["p0", "p0-again", "p0-prefix", "p1-stream", "chat-1", "chat-2"]
        assert all(r.evidence.engaged for r in got[name].requests)
    declined = got["w4"]
    assert declined.verdict == Verdict.DECLINED
    assert all(r.verdict == Verdict.DECLINED and "dflash_fallback" in r.reason for r in declined.requests)


@pytest.mark.slow
@pytest.mark.build
@pytest.mark.server
@pytest.mark.model
def test_the_baseline_arm_is_target_only_and_both_equal_classic_decode(
        dflash_env: Environment, qwen3_pair: dict[str, str], tmp_path: Path) -> None:
    """On this pair (qwen3, float32) the DFlash path and the target-only path both emit exactly classic
    decode's tokens (mlx-lm 0.31.3 in process, same environment)."""
    classic = in_env(dflash_env, _CLASSIC, qwen3_pair["target"], PROMPT, str(MAX_TOKENS))
    got = arms(served(qwen3_pair, tmp_path, [BLOCK], ["fresh"]))
    assert got["baseline-start"].requests[0].completion.token_ids == classic
    assert got[f"w{BLOCK}"].requests[0].completion.token_ids == classic


# both greedy chains of one prompt in process (the environment's mlx-lm): mlx-lm's (argmax of the
# logprobs in the model's dtype) and the raw logits' argmax, and each step's top-2 of both
_CHAINS = '''
import json, sys
import mlx.core as mx
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache
model, tok = load(sys.argv[1])
prompt, n = mx.array(tok.encode(sys.argv[2]))[None], int(sys.argv[3])
out = {}
for rule in ("logprobs", "logits"):
    cache = make_prompt_cache(model)
    logits = model(prompt, cache=cache)
    chain, steps = [], []
    for _ in range(n):
        row = logits[0, -1]
        lp = row - mx.logsumexp(row, keepdims=True)
        y = int(mx.argmax(lp if rule == "logprobs" else row).item())
        top = mx.argsort(-row.astype(mx.float32))[:2].tolist()
        steps.append({"top": top, "logits": [float(row[t].item()) for t in top],
                      "logprobs": [float(lp[t].item()) for t in top]})
        chain.append(y)
        logits = model(mx.array([[y]]), cache=cache)
    out[rule] = {"chain": chain, "steps": steps}
print(json.dumps(out))
'''


@pytest.mark.slow
@pytest.mark.build
@pytest.mark.server
@pytest.mark.model
def test_on_a_bfloat16_hybrid_dflash_picks_the_larger_logit_where_classic_decode_sees_a_tie(
        dflash_env: Environment, fixture_root: Path, tmp_path: Path) -> None:
    """dflash-mlx 0.1.8's greedy is the argmax of the raw logits; mlx-lm's (classic decode, and the
    target-only baseline, mlx-lm's own server loop) is the argmax of the logprobs in the model's dtype.
    In bfloat16 two close logits can round to one logprob: classic decode then takes the lower id, dflash
    the larger logit. On the bfloat16 hybrid fixture (qwen3_5, as many linear value as key heads, block
    16) every drafted arm emits the raw-logit chain, at every width; the baseline emits classic decode's;
    where they part, classic decode's top two logprobs are equal and its logits are not."""
    try:
        pair = pair_dirs(dflash_info(fixture_root, "qwen3_5-equal-heads", 16, "bfloat16"))
    except LookupError as err:
        pytest.skip(str(err))
    chains = in_env(dflash_env, _CHAINS, pair["target"], PROMPT, str(48))
    classic, raw = chains["logprobs"]["chain"], chains["logits"]["chain"]
    # the pair is seeded: its two greedy rules part within 48 tokens (at token 26), whatever the fit
    assert classic != raw
    spec = Job(pairings=[Pairing("hybrid", pair["target"], pair["draft"], "dflash-mlx")], widths=[2, 16],
               max_tokens=48, prompts=[PROMPT], sequence=["fresh"])
    report = ServedRun(spec, workdir=tmp_path).run()
    got = arms(report)
    assert_reference_compared(report)
    assert got["baseline-start"].requests[0].completion.token_ids == classic
    for name in ("w2", "w16"):
        (req,) = got[name].requests
        assert req.completion.token_ids == raw and req.evidence.engaged, name
    k = next(i for i, (a, b) in enumerate(zip(classic, raw)) if a != b)
    assert k == 26
    step = chains["logprobs"]["steps"][k]
    assert step["logprobs"][0] == step["logprobs"][1] and step["logits"][0] > step["logits"][1]
    assert (raw[k], classic[k]) == tuple(step["top"]) and classic[k] < raw[k]  # the tie goes to the lower id
    assert all(r.verdict == Verdict.DIVERGED and r.divergence is not None and r.divergence.token_index == k
               for name in ("w2", "w16") for r in got[name].requests)


@pytest.mark.slow
@pytest.mark.build
@pytest.mark.server
@pytest.mark.model
def test_qwen3_bfloat16_tied_block_16_serves_classic_decodes_tokens_at_every_width(
        dflash_env: Environment, fixture_root: Path, tmp_path: Path) -> None:
    """The served table's qwen3 row in bfloat16 with a tied head and blocks of 16 (the block-16 shape the
    engine runs): at widths 2 and 16 every drafted request is engaged and emits classic decode's tokens
    (no exact logprob tie on this prompt: the raw-logit chain is the same one)."""
    pair = pair_dirs(dflash_info(fixture_root, "qwen3", 16, "bfloat16", tied=True))
    chains = in_env(dflash_env, _CHAINS, pair["target"], PROMPT, str(MAX_TOKENS))
    classic = chains["logprobs"]["chain"]
    assert chains["logits"]["chain"] == classic
    report = served(pair, tmp_path, [2, 16], ["fresh", "multi-turn"])
    got = arms(report)
    assert report.pairings[0].verdict == Verdict.MATCH, [(a.name, a.reason) for a in got.values()]
    for name in ("w2", "w16"):
        assert [r.id for r in got[name].requests] == ["p0", "chat-1", "chat-2"]
        assert all(r.verdict == Verdict.MATCH and r.evidence.engaged for r in got[name].requests), name
        assert got[name].requests[0].completion.token_ids == classic, name
        assert max(w for r in got[name].requests for w in r.evidence.widths) == int(name[1:])


@pytest.mark.slow
@pytest.mark.build
@pytest.mark.server
@pytest.mark.model
def test_a_served_hybrid_leaves_classic_decode_after_a_partly_accepted_block(
        dflash_env: Environment, fixture_root: Path, tmp_path: Path) -> None:
    """The in-process rollback finding, served: on the float32 hybrid with as many linear value as key
    heads (block 8), a verify round of 8 rows accepted in part leaves the gated-delta state wrong
    (test_dflash_mlx.py), and 48 tokens of p0 at width 8 leave classic decode at token 26, after such a round;
    the target-only baseline emits classic decode's tokens."""
    pair = pair_dirs(dflash_info(fixture_root, "qwen3_5-equal-heads", BLOCK))
    classic = in_env(dflash_env, _CLASSIC, pair["target"], PROMPT, "48")
    spec = Job(pairings=[Pairing("hybrid", pair["target"], pair["draft"], "dflash-mlx")], widths=[BLOCK],
               max_tokens=48, prompts=[PROMPT], sequence=["fresh"])
    got = arms(ServedRun(spec, workdir=tmp_path).run())
    assert got["baseline-start"].requests[0].completion.token_ids == classic
    (req,) = got[f"w{BLOCK}"].requests
    ids = req.completion.token_ids or []
    assert req.verdict == Verdict.DIVERGED and req.evidence.engaged
    assert req.divergence is not None and req.divergence.token_index == 26
    assert ids[:26] == classic[:26] and ids[26] != classic[26]
    # the rounds before token 26 (the first token is the prefill's): one of them accepted its block in part
    start, partial_before = 1, False
    for a, w in zip(req.evidence.accepts, req.evidence.widths):
        if start >= 26:
            break
        partial_before = partial_before or 0 < a < w - 1
        start += a + 1
    assert partial_before, (req.evidence.accepts, req.evidence.widths)


@pytest.mark.slow
@pytest.mark.build
@pytest.mark.server
@pytest.mark.model
def test_a_hybrid_target_with_more_value_than_key_heads_is_an_error_with_the_engines_message(
        dflash_env: Environment, fixture_root: Path, tmp_path: Path) -> None:
    """dflash-mlx 0.1.8 on the CPU backend cannot verify a qwen3_5 target whose linear-attention value
    heads outnumber its key heads (as the published Qwen3.5 configs do): its tape recording
    (target_qwen_gdn.py, the non-Metal branch) does not repeat the key heads. Every drafted request is
    an error carrying the engine's message, the stream included (its response ends with no token). The pair
    is test_dflash_mlx.py's for the same finding in process (block 16, tied head), verified here 8 rows wide."""
    pair = pair_dirs(dflash_info(fixture_root, "qwen3_5", 16, tied=True))
    report = served(pair, tmp_path / "run", [BLOCK], ["fresh", "stream"])
    got = arms(report)
    assert got["baseline-start"].verdict == Verdict.MATCH
    drafted = got[f"w{BLOCK}"]
    assert drafted.verdict == Verdict.ERROR and report.pairings[0].verdict == Verdict.ERROR
    for r in drafted.requests:
        assert r.verdict == Verdict.ERROR
        assert "the engine's error: ValueError: [broadcast_shapes]" in r.reason and "cannot be broadcast" in r.reason


@pytest.mark.slow
@pytest.mark.build
@pytest.mark.server
@pytest.mark.model
def test_dflash_serve_itself_gives_ids_with_zero_logprobs_and_no_ids_with_top_logprobs(
        dflash_env: Environment, qwen3_pair: dict[str, str], tmp_path: Path) -> None:
    """Why the profile asks for logprobs without top_logprobs and drops the values (the raw server)."""
    profile = load_profile("dflash-mlx")
    argv = profile.render(profile.argv + profile.draft_argv, python=dflash_env.python, model=qwen3_pair["target"],
                          draft_model=qwen3_pair["draft"], host="127.0.0.1", port="{port}", width=BLOCK)
    env: dict[str, str | None] = {**dflash_env.environ(base={})}
    with Server(argv, log_path=tmp_path / "raw.log", ready_path=profile.ready_path,
                fail_regex=profile.fail_regex, env=env) as srv:
        client = httpx.Client(base_url=srv.url, timeout=120)
        body = {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, "logprobs": True}
        plain = client.post("/v1/completions", json=body).json()
        top = client.post("/v1/completions", json={**body, "top_logprobs": 2}).json()
    entries = plain["choices"][0]["logprobs"]["content"]
    assert len(entries) == MAX_TOKENS and all(isinstance(e["id"], int) for e in entries)
    assert {e["logprob"] for e in entries} == {0.0}, "dflash's logprob values are a constant, not real numbers"
    assert top["choices"][0]["logprobs"]["content"] == [{}] * MAX_TOKENS, "top_logprobs drops the ids"


@pytest.mark.slow
@pytest.mark.build
@pytest.mark.server
@pytest.mark.model
def test_a_target_it_cannot_load_fails_the_start_at_once(dflash_env: Environment, qwen3_pair: dict[str, str],
                                                        tmp_path: Path) -> None:
    """A llama target (the embedded default pair): dflash's loader raises on its worker thread and the
    process keeps waiting (300 s); the profile's fail_regex ends the start with the engine's error."""
    from specparity.fixtures import default_pair

    t0 = time.perf_counter()
    report = served({"target": default_pair().target, "draft": qwen3_pair["draft"]}, tmp_path, [BLOCK], ["fresh"])
    start = arms(report)["baseline-start"]
    assert time.perf_counter() - t0 < 240
    assert start.verdict == Verdict.ERROR and report.pairings[0].verdict == Verdict.ERROR
    assert "Unsupported target architecture for DFlash target ops: model_type=llama" in start.server["log_tail"]
    # the message says the engine's own error, not only that its log matched a traceback (issue 30.10)
    assert ("failed while starting: NotImplementedError: Unsupported target architecture for DFlash target ops:"
            " model_type=llama,") in start.reason, start.reason


# -- the engine's readers on their own (no server) -------------------------------------------------
def _round(cycle: int, source: str, rows: int, accepted: int, request_id: int = 1) -> dict[str, Any]:
    return {"request_id": request_id, "cycle": cycle, "block_len": rows, "verify_token_count": rows,
            "acceptance_len": accepted, "commit_count": accepted + 1, "draft_source": source, "prefix_len": 7}


def test_only_a_dflash_drafted_round_is_evidence_the_drafter_ran() -> None:
    copied = [_round(1, "copyspec", 8, 7), _round(2, "copyspec", 8, 3), _round(3, "none", 1, 0)]
    engaged, line = dflash_mlx.summarize_rounds(copied)
    assert not engaged and "2 drafted by copying from the history (copyspec) (accepted 10 of 14)" in line
    engaged, line = dflash_mlx.summarize_rounds([_round(1, "dflash", 8, 0), *copied])
    assert engaged and "1 drafted by the DFlash drafter (accepted 0 of 7)" in line and "1 without a draft" in line
    # a DFlash round with a single row proposed nothing
    assert not dflash_mlx.summarize_rounds([_round(1, "dflash", 1, 0)])[0]


def test_rounds_are_read_per_request_after_the_mark(tmp_path: Path) -> None:
    path = tmp_path / "cycle_events.jsonl"
    old = json.dumps(_round(1, "dflash", 8, 2, request_id=1)) + "\n"
    lines = [_round(2, "dflash", 8, 1, request_id=2), {"request_id": 2, "cycle": 1, "memory_phase": "x"},
             _round(1, "copyspec", 4, 3, request_id=2), _round(1, "dflash", 8, 5, request_id=3)]
    path.write_text(old + "".join(json.dumps(x) + "\n" for x in lines) + "not json\n")
    rounds = dflash_mlx.read_rounds(path, len(old), 2)
    assert [(r["cycle"], r["draft_source"]) for r in rounds] == [(1, "copyspec"), (2, "dflash")]
    assert dflash_mlx.read_rounds(tmp_path / "missing.jsonl", 0, 2) == []


def test_max_width_is_the_drafters_block_size(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "config.json").write_text(json.dumps({"block_size": 16}))
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    assert dflash_mlx.max_width(str(tmp_path / "d")) == 16
    assert dflash_mlx.max_width(str(tmp_path / "t")) == 0  # not a DFlash drafter
    assert dflash_mlx.max_width(str(tmp_path / "none")) is None


def test_the_engines_error_is_the_last_exception_line_after_the_mark(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    before = "Traceback (most recent call last):\nRuntimeError: an earlier request\n"
    log.write_text(before + "INFO serving\nTraceback (most recent call last):\n  File \"x.py\", line 1\n"
                   "ValueError: [broadcast_shapes] Shapes (1,8,4) and (1,8,2) cannot be broadcast.\n")
    assert dflash_mlx.engine_error(log, len(before)) == (
        "ValueError: [broadcast_shapes] Shapes (1,8,4) and (1,8,2) cannot be broadcast.")
    assert dflash_mlx.engine_error(log, log.stat().st_size) is None


def test_arms_without_a_drafter_serve_target_only_and_cache_state_reads_usage(tmp_path: Path) -> None:
    where = str(tmp_path / dflash_mlx.DIAGNOSTICS_DIR)
    assert dflash_mlx.extra_argv(False, tmp_path) == ["--fastpath-max-tokens", str(dflash_mlx.FASTPATH_ALL),
                                                       "--diagnostics", "basic", "--diagnostics-dir", where]
    assert dflash_mlx.extra_argv(True, tmp_path) == ["--diagnostics", "full", "--diagnostics-dir", where]
    assert dflash_mlx.cache_state({"prompt_tokens_details": {"cached_tokens": 0}}) == ("cold", 0)
    assert dflash_mlx.cache_state({"prompt_tokens_details": {"cached_tokens": 17}}) == ("warm", 17)
    assert dflash_mlx.cache_state({}) == (None, None)


class _Srv:
    """What the engine's evidence reads of a server: its log, its URL (never asked here) and its argv."""

    def __init__(self, log_path: Path, url: str = "http://127.0.0.1:9", argv: list[str] | None = None):
        self.log_path = log_path
        self.url = url
        self.argv = argv or []


class _Session:
    def __init__(self, root: Path):
        self.server_dir = root
        self.server = _Srv(root / "server.log")
        (root / dflash_mlx.DIAGNOSTICS_DIR).mkdir(parents=True)
        for f in (dflash_mlx.POST_EVENTS, dflash_mlx.CYCLE_EVENTS):
            (root / dflash_mlx.DIAGNOSTICS_DIR / f).touch()
        self.server.log_path.touch()


def _request(session: _Session, mode: str, rounds: list[dict[str, Any]], completion: Any) -> Any:
    """One request's evidence as the engine reads it: its post event and rounds appended after the mark."""
    before = dflash_mlx.mark(session)
    diag = session.server_dir / dflash_mlx.DIAGNOSTICS_DIR
    with open(diag / dflash_mlx.CYCLE_EVENTS, "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in rounds)
    with open(diag / dflash_mlx.POST_EVENTS, "a") as f:
        f.write(json.dumps({"request_id": 1, "mode_used": mode, "cycles_completed": len(rounds),
                            "copyspec_hits": sum(r["draft_source"] == "copyspec" for r in rounds)}) + "\n")
    return dflash_mlx.evidence(session, completion, before)


def test_a_request_whose_only_speculation_was_copied_is_not_engaged_and_a_fallback_is_declined(
        tmp_path: Path) -> None:
    from specparity.harness.client import Completion

    done = Completion(text="x", finish_reason="length", usage={"prompt_tokens_details": {"cached_tokens": 5}})
    copied = _request(_Session(tmp_path / "a"), "dflash", [_round(1, "copyspec", 8, 7), _round(2, "none", 1, 0)],
                      done)
    assert copied.engaged is False and not copied.declined and (copied.cache, copied.cached_tokens) == ("warm", 5)
    assert "no round's block came from the DFlash drafter" in copied.lines[0]
    assert copied.accepts == [7, 0] and copied.widths == [8, 1]
    drafted = _request(_Session(tmp_path / "b"), "dflash", [_round(1, "dflash", 8, 0), _round(2, "copyspec", 8, 7)],
                       done)
    assert drafted.engaged is True and drafted.details["draft_sources"] == ["dflash", "copyspec"]
    fallback = _request(_Session(tmp_path / "c"), "dflash_fallback", [], done)
    assert fallback.declined and not fallback.engaged and "fell back" in fallback.lines[0]
    baseline = _request(_Session(tmp_path / "d"), "ar_fastpath", [], done)
    assert baseline.engaged is False and not baseline.declined and "target only" in baseline.lines[0]


class _Metrics:
    """A tiny /metrics server answering dflash serve's JSON, whose state a test changes between reads."""

    def __init__(self) -> None:
        import http.server
        import threading

        self.state: dict[str, Any] = {"last_request": {"request_id": 4, "cycles": 9, "copyspec_hits": 0}}
        self.reads = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802  (http.server's name)
                outer.reads += 1
                body = json.dumps(outer.state).encode() if self.path == "/metrics" else b"{}"
                self.send_response(200 if self.path == "/metrics" else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> _Metrics:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


class _MetricsSession:
    """A dflash serve session without diagnostics files (so /metrics is read), at a given verify cap."""

    def __init__(self, root: Path, url: str, cap: int | None):
        root.mkdir(parents=True)
        self.server_dir = root
        self.server = _Srv(root / "server.log", url,
                           ["dflash", "serve"] + (["--verify-len-cap", str(cap)] if cap is not None else []))
        self.server.log_path.touch()


def test_without_diagnostics_the_metrics_record_waits_for_the_request_and_counts_its_rounds(tmp_path: Path) -> None:
    """The /metrics fallback: the record of the request sent after the mark, once it is no longer current;
    engaged only where the round counts prove a DFlash-drafted round that proposed tokens."""
    import threading

    from specparity.harness.client import Completion

    done = Completion(text="x", finish_reason="length", usage={})
    with _Metrics() as metrics:
        s = _MetricsSession(tmp_path / "a", metrics.url, 8)
        before = dflash_mlx.mark(s)
        assert before.post_offset is None and before.request_id == 4
        # the request is still being served: its id is already last_request's, its counts not final
        metrics.state = {"current_request": {"request_id": 5},
                         "last_request": {"request_id": 5, "mode_used": "dflash", "cycles": 1, "copyspec_hits": 1}}
        final = {"request_id": 5, "mode_used": "dflash", "cycles": 6, "copyspec_hits": 4}
        threading.Timer(0.3, lambda: metrics.state.update(current_request=None, last_request=final)).start()
        ev = dflash_mlx.evidence(s, done, before)
        assert ev.details["cycles"] == 6 and ev.engaged is True, ev.lines
        assert ev.lines[0] == "dflash-mlx: mode_used dflash, 6 verify rounds, 4 copied from the history (copyspec)"
        # one round not copied may be the last, one-token round: not proof the drafter ran
        metrics.state = {"last_request": {"request_id": 6, "mode_used": "dflash", "cycles": 5, "copyspec_hits": 4}}
        ev = dflash_mlx.evidence(s, done, dflash_mlx.Mark(0, None, 5, 0))
        assert ev.engaged is False and "no round proven DFlash-drafted" in ev.lines[0]
        # a verify cap of one row: every round drafted, none verified a proposal
        one = _MetricsSession(tmp_path / "b", metrics.url, 1)
        metrics.state = {"last_request": {"request_id": 7, "mode_used": "dflash", "cycles": 9, "copyspec_hits": 0}}
        ev = dflash_mlx.evidence(one, done, dflash_mlx.Mark(0, None, 6, 0))
        assert ev.engaged is False and "--verify-len-cap 1: no round verifies a proposed token" in ev.lines[0]
        # nothing newer than the mark by the deadline: None, after polling until then
        reads = metrics.reads
        t0 = time.monotonic()
        # (a second of polling every 0.05 s: two reads at least, on a loaded machine too)
        assert dflash_mlx.wait_for_request(metrics.url, 7, time.monotonic() + 1.0) is None
        assert 1.0 <= time.monotonic() - t0 < 10 and metrics.reads - reads >= 2


def test_the_counted_rule_needs_two_rounds_not_copied_and_a_cap_of_two_rows() -> None:
    assert dflash_mlx.counted_engagement(2, 0, None) == (True, "")
    assert dflash_mlx.counted_engagement(3, 1, 2)[0] is True
    assert dflash_mlx.counted_engagement(1, 0, 16)[0] is False  # one round: it may have been the last, one row
    assert dflash_mlx.counted_engagement(9, 0, 1)[0] is False
    assert dflash_mlx.verify_cap(["x", "--verify-len-cap", "4"]) == 4
    assert dflash_mlx.verify_cap(["--verify-len-cap=3"]) == 3 and dflash_mlx.verify_cap(["x"]) is None
