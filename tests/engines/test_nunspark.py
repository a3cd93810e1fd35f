"""nunspark 0.13.0 (issue 47) against classic decode, in its pinned environments, on the project's fixture pairs.

Each entry point runs with nunspark's own packer, loaders and loop (its library defaults; the prompt's ids,
``max_tokens`` and the tokenizer's eos, as its CLI passes them), judged token by token against mlx-lm's
classic decode; its own stats and target passes are the acceptance record that places a difference in its
round and row. What they pin, MLX's CPU backend, 48 tokens of the embedded prompt:

- mlx-lm 0.31.3, float32 llama: ``speculative_generate``, ``ngram_speculative_generate`` and its CLI's
  ``--draft-model`` / ``--ngram-draft`` equal classic decode with drafts accepted;
  ``adaptive_speculative_generate`` leaves it in the first round after its first change of K (its rollback
  truncates with the new K: rejected rows stay in the target's cache), and equals it with K held;
  ``eagle_speculative_generate`` (the untrained drafter its CLI builds, its initialization seeded) accepts 3 of
  704 drafts and matches;
  ``gemma4_mtp_speculative_generate`` has no Gemma 4 pair here: an error, not a pass;
- mlx-lm 0.32.2: every loop that verifies through ``verify_forward`` raises (its cache clone unpacks
  ``KVCache.state`` as two values; 0.32 made it three), the others as on 0.31.3;
- bfloat16 llama: the verify row's raw-logit argmax at an exact tie of classic decode's bfloat16 logprobs;
- gemma3_text (sliding-window layers) and qwen3_moe: ``speculative_generate`` equals classic decode;
  qwen3_5: the engine's own "unsupported model_type" error; in bfloat16, gemma3_text: a near tie (one bfloat16
  step of classic decode's raw logits) flipped at token 11; qwen3_moe: classic decode itself cannot run (MLX's
  CPU backend has no bfloat16 GatherMM);
- ``accept_top_k`` > 1: lossy by design, with what it changed (never a pass, never a defect).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from builds import REAL_CACHE, built
from conftest import run_cli
from fixture_cache import cached
from specparity.engine_findings import run_engine
from specparity.environments import ENV_CACHE_VAR
from specparity.fixtures import build_pair

TOKENS = 48
# the embedded prompt (specparity.prompts.DEFAULT_PROMPTS[0]) as the fixture tokenizer encodes it
PROMPT = [307, 345, 448, 78, 468, 492, 485, 264, 502, 263, 79, 71, 12, 287, 264, 78]
ENV = "nunspark"
ENV_0_32 = "nunspark-mlx-lm-0.32.2"
VERIFY_FORWARD = ("speculative_generate", "ngram_speculative_generate", "nunspark generate --draft-model",
                  "nunspark generate --ngram-draft")


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """The project's plain target + drafter pairs nunspark takes (a plain mlx-lm drafter), built once each."""
    root = tmp_path_factory.mktemp("nunspark")

    def pair(arch: str, dtype: str = "float32") -> dict:
        return cached(build_pair, root, f"nunspark-{arch}-{dtype}", arch=arch, dtype=dtype).to_dict()

    class Pairs(dict):
        def __missing__(self, key: str) -> dict:
            arch, dtype = key.split(":")
            got = self[key] = pair(arch, dtype)
            return got
    return Pairs()


def findings(pair: dict, env: str = ENV, tokens: int = TOKENS) -> dict[str, dict]:
    """nunspark's findings by entry point, run in its built environment (skip when not built)."""
    got = {r["entry"]: r for r in run_engine("nunspark", pair, tokens, env=built(env), prompt=PROMPT)}
    assert "*" not in got, got["*"]  # the run itself failed (its last line): never read as an entry's finding
    return got


def in_env(env: str, code: str) -> dict:
    """``code`` run by the environment's interpreter (specparity from this checkout); its last JSON line."""
    e = built(env)
    proc = subprocess.run([str(e.python), "-P", "-c", code], capture_output=True, text=True, timeout=600,
                          env=dict(e.environ()))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_nunspark_is_one_package_of_its_own() -> None:
    from test_engine_packages import test_each_builtin_engine_is_one_package_of_its_own

    test_each_builtin_engine_is_one_package_of_its_own("nunspark")


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.build
def test_on_mlx_lm_0_31_3_its_loops_match_its_adaptive_loop_does_not_and_each_other_says_why(pairs) -> None:
    got = findings(pairs["llama:float32"])
    for entry in VERIFY_FORWARD:
        f = got[entry]
        assert f["verdict"] == "match" and f["accepted"] > 0 and f["tokens"] == f["classic"], f
    assert got["speculative_generate"]["tokens"] == got["nunspark generate --draft-model"]["tokens"]
    assert got["speculative_generate"]["accepted"] == got["nunspark generate --draft-model"]["accepted"] == 27
    assert got["ngram_speculative_generate"]["accepted"] == 23
    ad = got["adaptive_speculative_generate"]
    drafted = [r["drafted"] for r in ad["rounds"]]
    assert drafted[:4] == [32, 32, 32, 24], drafted  # K changed after round 3's verify
    assert ad["verdict"] == "diverged" and (ad["index"], ad["round"], ad["row"]) == (5, 4, 0), ad
    assert ad["after_rollback"] and ad["engine_token"] == 492 and ad["classic_token"] == 327
    assert not ad["tie"]["logprob_tie"], ad["tie"]
    # the untrained EAGLE drafter its CLI builds, its initialization seeded (EAGLE_SEED): the same weights every
    # run, 3 of its 704 drafts accepted (unseeded, this read not_engaged in one run and match in the next)
    eagle = got["eagle_speculative_generate"]
    assert eagle["verdict"] == "match" and (eagle["accepted"], eagle["drafted"]) == (3, 704), eagle
    assert eagle["tokens"] == eagle["classic"]
    mtp = got["gemma4_mtp_speculative_generate"]
    assert mtp["verdict"] == "error" and "gemma4_assistant" in mtp["failure"], mtp


@pytest.mark.model
@pytest.mark.build
@pytest.mark.slow
def test_its_adaptive_loop_matches_while_k_is_held_so_the_change_of_k_is_the_cause(pairs) -> None:
    pair = pairs["llama:float32"]
    code = f"""
import json
from specparity.engines.nunspark.loops import load_pair, run_entry
from specparity.probes.engine_e2e import Classic, load_once
ref = Classic({pair["target"]!r}, {TOKENS})
pair = load_once(lambda: load_pair({pair["target"]!r}, {pair["draft"]!r}))
out = {{}}
for name, opts in (("default", {{}}), ("held", {{"adjustment_interval": 10**9}})):
    f, st = run_entry("adaptive_speculative_generate", pair, {PROMPT!r}, {TOKENS}, ref.tokens({PROMPT!r}), ref.eos,
                      {pair["draft"]!r}, opts)
    out[name] = {{"verdict": f.verdict, "index": f.index, "accepted": f.accepted, "changes": st.adjustment_count}}
print(json.dumps(out))
"""
    got = in_env(ENV, code)
    assert got["default"]["verdict"] == "diverged" and got["default"]["changes"] > 0, got
    assert got["held"] == {"verdict": "match", "index": None, "accepted": 27, "changes": 0}, got


@pytest.mark.model
@pytest.mark.build
@pytest.mark.slow
def test_on_mlx_lm_0_32_2_its_verify_forward_raises_on_the_new_cache_state(pairs) -> None:
    got = findings(pairs["llama:float32"], ENV_0_32)
    for entry in VERIFY_FORWARD:
        f = got[entry]
        assert f["verdict"] == "error" and f["tokens"] == [], f
        assert "too many values to unpack (expected 2)" in f["failure"] and "nunspark/engine.py:132" in f["failure"]
    # the loops that verify with forward() and truncate run on 0.32.2 as on 0.31.3
    ad = got["adaptive_speculative_generate"]
    assert ad["verdict"] == "diverged" and (ad["index"], ad["round"], ad["row"]) == (5, 4, 0), ad
    eagle = got["eagle_speculative_generate"]  # the same seeded drafter, the same counts on 0.32.2
    assert eagle["verdict"] == "match" and (eagle["accepted"], eagle["drafted"]) == (3, 704), eagle


@pytest.mark.model
@pytest.mark.build
@pytest.mark.slow
def test_in_bfloat16_it_takes_the_raw_logit_argmax_at_an_exact_logprob_tie(pairs) -> None:
    got = findings(pairs["llama:bfloat16"])
    for entry in VERIFY_FORWARD:
        f = got[entry]
        assert f["verdict"] == "diverged" and f["index"] == 19 and f["tie"]["logprob_tie"], f
        assert (f["engine_token"], f["classic_token"]) == (80, 14) and "exact tie" in f["reason"], f
    assert (got["speculative_generate"]["round"], got["speculative_generate"]["row"]) == (7, 4)
    assert (got["ngram_speculative_generate"]["round"], got["ngram_speculative_generate"]["row"]) == (13, 1)


@pytest.mark.model
@pytest.mark.build
@pytest.mark.slow
def test_sliding_window_and_moe_targets_match_and_a_hybrid_is_its_own_error(pairs) -> None:
    """The findings table's gemma3_text and qwen3_moe float32 columns, every entry point: its draft-model loops
    (library and CLI) match with drafts accepted, its n-gram and untrained EAGLE drafters accept nothing (not
    engaged, never a pass), its adaptive loop leaves classic decode at its first change of K, far from a tie."""
    for key, accepted, adaptive in (("gemma3_text:float32", 9, (8, 4, 0, 253, 337)),
                                    ("qwen3_moe:float32", 28, (7, 5, 0, 15, 62))):
        got = findings(pairs[key])
        for entry in ("speculative_generate", "nunspark generate --draft-model"):
            f = got[entry]
            assert f["verdict"] == "match" and f["accepted"] == accepted, (key, entry, f)
        for entry in ("ngram_speculative_generate", "nunspark generate --ngram-draft", "eagle_speculative_generate"):
            f = got[entry]
            assert f["verdict"] == "not_engaged" and f["accepted"] == 0 and f["tokens"] == f["classic"], (key, f)
        f = got["adaptive_speculative_generate"]
        assert (f["index"], f["round"], f["row"], f["engine_token"], f["classic_token"]) == adaptive, (key, f)
        assert f["verdict"] == "diverged" and "not a tie" in f["reason"], (key, f)
        assert got["speculative_generate accept_top_k=4"]["verdict"] == "lossy_by_design", (key, got)
    f = findings(pairs["qwen3_5:float32"])["speculative_generate"]
    assert f["verdict"] == "error" and "unsupported model_type 'qwen3_5'" in f["failure"], f


@pytest.mark.model
@pytest.mark.build
@pytest.mark.slow
def test_in_bfloat16_a_sliding_window_target_flips_a_near_tie_and_a_moe_target_cannot_run_classic_decode(
        pairs) -> None:
    """gemma3_text in bfloat16 (16 tokens): every loop leaves classic decode at token 11, where classic decode's
    token leads by one bfloat16 step of its raw logits (a near tie, not an exact one), in the round and row its own
    record places it; qwen3_moe in bfloat16: MLX's CPU backend has no bfloat16 GatherMM, so not even classic decode
    runs, and the whole run is one error (never a pass, never a finding of nunspark's)."""
    got = findings(pairs["gemma3_text:bfloat16"], tokens=16)  # the same rounds as over 48, bfloat16 is slow on CPU
    where = {"speculative_generate": (2, 3), "nunspark generate --draft-model": (2, 3),
             "ngram_speculative_generate": (11, 0), "nunspark generate --ngram-draft": (11, 0),
             "eagle_speculative_generate": (11, 0)}
    for entry, (round_, row) in where.items():
        f = got[entry]
        assert f["verdict"] == "diverged" and f["index"] == 11, (entry, f)
        assert (f["engine_token"], f["classic_token"], f["round"], f["row"]) == (333, 258, round_, row), (entry, f)
        assert "a near tie, not an exact one" in f["reason"] and not f["tie"]["logprob_tie"], (entry, f)
    # the adaptive loop leaves it earlier, at its own rollback (its float32 finding), with no tie at all
    f = got["adaptive_speculative_generate"]
    assert (f["verdict"], f["index"], f["round"], f["row"]) == ("diverged", 10, 4, 0) and "not a tie" in f["reason"]
    rows = run_engine("nunspark", pairs["qwen3_moe:bfloat16"], 16, env=built(ENV), prompt=PROMPT)
    assert [r["entry"] for r in rows] == ["*"] and rows[0]["verdict"] == "error", rows
    assert "GatherMM::eval] Currently only supports float32" in rows[0]["failure"], rows


@pytest.mark.model
@pytest.mark.build
@pytest.mark.slow
def test_accept_top_k_above_one_is_reported_lossy_by_design_with_what_it_changed(pairs, cli_bin: str) -> None:
    """nunspark's documented lossy mode is an entry point of its own: ``lossy_by_design`` with what it changed
    (the first token it left classic decode at, its round and row, its own count of off-argmax accepts), exit 3:
    never a pass, never a defect."""
    pair = pairs["llama:float32"]
    got = findings(pair)["speculative_generate accept_top_k=4"]
    assert got["verdict"] == "lossy_by_design" and got["lossy"].startswith("accept_top_k=4")
    assert (got["index"], got["engine_token"], got["classic_token"], got["round"], got["row"]) == (1, 80, 14, 1, 0)
    assert "24 of 44 accepted drafts were not the target's argmax" in got["reason"]
    assert "not a pass, not a defect" in got["reason"]
    proc = run_cli(cli_bin, "e2e", "--engine", "nunspark", "--model", pair["target"], "--draft-model", pair["draft"],
                   "--prompt-ids", ",".join(map(str, PROMPT)), "--max-tokens", str(TOKENS), "--entry-points",
                   "speculative_generate accept_top_k=4", env={ENV_CACHE_VAR: str(REAL_CACHE)})
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "speculative_generate accept_top_k=4: lossy_by_design: lossy by design (accept_top_k=4" in proc.stdout


@pytest.mark.model
@pytest.mark.build
def test_e2e_engine_nunspark_through_the_cli(pairs, cli_bin: str) -> None:
    """``specparity e2e --engine nunspark`` as a user types it: it re-runs in nunspark's environment."""
    built(ENV)
    pair = pairs["llama:float32"]
    ids = ",".join(map(str, PROMPT))
    base = ("e2e", "--engine", "nunspark", "--model", pair["target"], "--draft-model", pair["draft"],
            "--prompt-ids", ids, "--max-tokens", str(TOKENS), "--json")
    env = {ENV_CACHE_VAR: str(REAL_CACHE)}
    ok = run_cli(cli_bin, *base, "--entry-points", "speculative_generate,nunspark generate --draft-model", env=env)
    assert ok.returncode == 0, ok.stderr[-2000:]
    out = json.loads(ok.stdout)
    assert out["verdict"] == "match" and [e["verdict"] for e in out["entries"]] == ["match", "match"]
    assert all(e["drafter"]["drafted"] == 27 for e in out["entries"])
    bad = run_cli(cli_bin, *base, "--entry-points", "adaptive_speculative_generate", env=env)
    assert bad.returncode == 1, bad.stderr[-2000:]
    out = json.loads(bad.stdout)
    assert out["verdict"] == "diverged" and "round 4, row 0" in json.dumps(out)
    assert Path(pair["target"]).is_dir()


@pytest.mark.model
@pytest.mark.build
@pytest.mark.server
@pytest.mark.slow
def test_nunspark_serve_takes_chat_only_and_says_nothing_of_its_drafts(pairs, tmp_path: Path) -> None:
    """``nunspark serve --draft-model`` live on the packed float32 pair: it answers ``/v1/chat/completions`` only
    (``/v1/completions`` is 404), refuses the fixture tokenizer (no chat template), and, given a chat template,
    answers with text and usage alone: no response carries evidence that the drafter ran, so a served arm of
    it could only read not_engaged (no served profile here: why, in docs/engines.md)."""
    import httpx

    from specparity.harness.lifecycle import HOST_ARG, PORT_ARG, Server

    env = built(ENV)
    pair = pairs["llama:float32"]
    nunspark = str(Path(env.python).parent / "nunspark")
    packed = tmp_path / "packed"
    subprocess.run([nunspark, "pack", pair["target"], str(packed)], check=True, capture_output=True,
                   env=dict(env.environ()), timeout=300)
    argv = [nunspark, "serve", str(packed), "--host", HOST_ARG, "--port", PORT_ARG, "--draft-model", pair["draft"]]
    chat = {"messages": [{"role": "user", "content": "The quick brown fox"}], "max_tokens": 16, "temperature": 0}
    with Server(argv, env=dict(env.environ()), ready_path="/v1/models", start_timeout=300, name="nunspark") as srv:
        refused = httpx.post(f"{srv.url}/v1/chat/completions", json=chat, timeout=120)
        plain = httpx.post(f"{srv.url}/v1/completions", json={"prompt": "x", "max_tokens": 4}, timeout=30)
    assert refused.status_code == 400 and "chat template" in refused.json()["error"]["message"]
    assert plain.status_code == 404
    config = json.loads((packed / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    (packed / "tokenizer_config.json").write_text(json.dumps(config))
    with Server(argv, env=dict(env.environ()), ready_path="/v1/models", start_timeout=300, name="nunspark") as srv:
        answer = httpx.post(f"{srv.url}/v1/chat/completions", json=chat, timeout=120)
    body = answer.json()
    assert answer.status_code == 200 and body["usage"]["completion_tokens"] == 16, body
    assert set(body) == {"id", "object", "created", "model", "choices", "usage"}, body
    assert set(body["choices"][0]) <= {"index", "message", "finish_reason", "logprobs"}, body


@pytest.mark.slow
def test_the_findings_table_runs_an_engine_that_drafts_with_a_plain_drafter(tmp_path: Path) -> None:
    """``python -P -m specparity.engine_findings --engine nunspark``: an engine whose drafter is a plain mlx-lm
    checkpoint (no drafter format of its own) gets a plain pair per architecture, its rows named by it, as a
    drafter format's engines get their fixtures (it exited 2 before: the table ran it without a pair)."""
    import os
    import sys

    built(ENV)
    proc = subprocess.run([sys.executable, "-P", "-m", "specparity.engine_findings", "--engine", "nunspark",
                           "--shape", "llama", "--dtype", "float32", "--max-tokens", "24", "--fixtures", str(tmp_path),
                           "--json"], capture_output=True, text=True, timeout=900,
                          env={**os.environ, ENV_CACHE_VAR: str(REAL_CACHE)})
    assert proc.returncode == 1, proc.stderr[-2000:]  # its adaptive loop diverges (see above)
    rows = {r["entry"]: r for r in json.loads(proc.stdout)}
    assert {r["shape"] for r in rows.values()} == {"llama"}
    assert rows["speculative_generate"]["verdict"] == "match" and rows["speculative_generate"]["accepted"] > 0
    assert rows["adaptive_speculative_generate"]["verdict"] == "diverged"
    # the same rows as one table (--grid, from the --json it wrote: nothing run again): a column per target, a
    # line per entry point, each cell the row's verdict and where it parted
    saved = tmp_path / "rows.json"
    saved.write_text(proc.stdout)
    table = subprocess.run([sys.executable, "-P", "-m", "specparity.engine_findings", "--grid", "--from-json",
                            str(saved)], capture_output=True, text=True, timeout=60)
    assert table.returncode == 1, table.stderr  # the rows hold a divergence: the exit code says so as the run did
    lines = table.stdout.splitlines()
    assert lines[0] == "| engine | entry point | llama float32 |" and len(lines) == 2 + len(rows)
    ad = rows["adaptive_speculative_generate"]
    tie = ("an exact logprob tie" if ad["tie"]["logprob_tie"] else f"a near tie, {ad['tie']['ulps']} ULPs"
           if ad["tie"]["near_tie"] else "not a tie")
    assert (f"| nunspark | adaptive_speculative_generate | diverged at token {ad['index']} (round {ad['round']}, row"
            f" {ad['row']}; {tie}) |") in lines
    sg = rows["speculative_generate"]
    assert f"| nunspark | speculative_generate | match, {sg['accepted']}/{sg['drafted']} accepted |" in lines
