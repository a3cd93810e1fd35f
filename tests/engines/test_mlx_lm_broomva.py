"""mlx-lm-broomva 0.31.3 (issue 47): mlx-lm's fork with Gemma 4 MTP drafting, in its pinned environment, on the
``gemma4-assistant`` fixtures (a Gemma 4 target and a fitted ``gemma4_assistant`` drafter, built by its format).

Each entry point (``mtp_speculative_generate_step``, ``stream_generate(draft_model=...)``, ``mlx_lm generate
--draft-model`` in process) runs with the fork's own loader and its library defaults, judged token by token against
the fork's classic ``generate_step``; its own ``from_draft`` flags are its round record, and every
``cache.trim_prompt_cache`` rollback it makes is recorded with what it trimmed. What they pin (MLX's CPU backend,
the embedded prompt, 16 tokens):

- E2B shape, float32, 64 tokens: each entry point leaves classic decode once the target's cache passes its sliding
  window (32 positions): from then on ``RotatingKVCache.is_trimmable()`` is False, ``trim_prompt_cache`` trims
  nothing (no layer's cache, the full-attention ones included) and the rejected draft rows stay; the library loop
  at token 19, round 10, after the rollback of round 9 trimmed 0 of 2 rows;
- within the window (14 tokens) and with the same weights' window past the run (64 tokens): match, drafts
  accepted: the detector is silent where the rollback works, so the window is the cause;
- the same in bfloat16 (every entry point at token 15) and in the 31B shape (a 64-position window: the library
  loop at token 49; its CLI's rounds roll nothing back past the window in 64 tokens and match);
- a plain mlx-lm drafter is refused with its cause (it would take mlx-lm's classic speculative loop);
- served (its server is mlx-lm 0.31.3's): the baselines match, every drafted request fails with the server's own
  error (a gemma4_assistant has no prompt cache of its own).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from builds import REAL_CACHE, built
from conftest import run_cli
from fixture_cache import cached
import fixture_pairs
from specparity.environments import ENV_CACHE_VAR
from specparity.fixtures import build_pair

ENV = "mlx-lm-broomva"
ENTRIES = ("mtp_speculative_generate_step", "stream_generate", "mlx_lm generate --draft-model")


@pytest.fixture(scope="module")
def e2b(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The E2B-shaped pair, float32, tied head (the published shape), built once."""
    return fixture_pairs.pair("broomva-e2b-float32", tmp_path_factory.mktemp("broomva")).to_dict()


def e2e(cli_bin: str, target: str, *extra: str, draft: str | None = None) -> tuple[int, dict]:
    """``specparity e2e --engine mlx-lm-broomva --environment mlx-lm-broomva`` as a user types it: its exit code
    and its --json entries by entry point."""
    built(ENV)
    argv = ["e2e", "--engine", ENV, "--environment", ENV, "--model", target,
            *(["--draft-model", draft] if draft else []), *extra, "--json"]
    proc = run_cli(cli_bin, *argv, env={ENV_CACHE_VAR: str(REAL_CACHE)})  # the built one, never a build here
    out = json.loads(proc.stdout)
    return proc.returncode, {e["entry"]: e for e in out["entries"]}


def in_env(code: str) -> dict:
    """``code`` run by the environment's interpreter; its last JSON line."""
    e = built(ENV)
    proc = subprocess.run([str(e.python), "-P", "-c", code], capture_output=True, text=True, timeout=600,
                          env=dict(e.environ()))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_mlx_lm_broomva_is_one_package_of_its_own() -> None:
    from test_engine_packages import test_each_builtin_engine_is_one_package_of_its_own

    test_each_builtin_engine_is_one_package_of_its_own("mlx-lm-broomva")


@pytest.mark.model
def test_here_its_loops_refuse_an_mlx_lm_that_is_not_the_fork(e2b: dict, cli_bin: str) -> None:
    """Here (mlx-lm 0.32.2, no fork) its loops run in process (the registry's module is None: the fork's modules
    live in mlx_lm) and refuse it, naming its environment: not a pass."""
    from specparity.engines import get

    env = get(ENV).environments[0]
    assert env.no_deps == ("mlx-lm-broomva==0.31.3",) and "mlx-lm==0.31.3" in env.packages
    proc = run_cli(cli_bin, "e2e", "--engine", ENV, "--model", e2b["target"], "--max-tokens", "4", "--entry-points",
                   "mtp_speculative_generate_step")
    assert proc.returncode == 3 and "--environment mlx-lm-broomva" in proc.stdout + proc.stderr, proc.stdout


@pytest.mark.model
def test_the_format_builds_through_fixtures_make(cli_bin: str, tmp_path: Path) -> None:
    out = tmp_path / "gemma4"
    proc = run_cli(cli_bin, "fixtures", "make", str(out), "--dflash", "gemma4-e2b", "--drafter-format",
                   "gemma4-assistant", "--tied-head", "--json")
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    assert record["kind"] == "gemma4-assistant" and record["sliding_window"] == 32
    mix = record["mix"]
    assert mix["full"] and mix["partial"] and mix["zero"], mix  # a drafter whose rounds are a mix
    target = json.loads((out / "target" / "config.json").read_text())
    draft = json.loads((out / "draft" / "config.json").read_text())
    assert target["model_type"] == "gemma4" and target["text_config"]["num_kv_shared_layers"] == 5
    assert draft["model_type"] == "gemma4_assistant" and draft["backbone_hidden_size"] == 64
    bad = run_cli(cli_bin, "fixtures", "make", str(tmp_path / "bad"), "--dflash", "qwen3", "--drafter-format",
                  "gemma4-assistant")
    assert bad.returncode == 2 and "gemma4-e2b" in bad.stderr


@pytest.mark.model
@pytest.mark.build
def test_the_fork_loads_the_pair_strictly_in_its_shapes(e2b: dict) -> None:
    got = in_env(f"""
import importlib, json
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache
g = importlib.import_module("mlx_lm.generate")
t, _ = load({e2b['target']!r}); d, _ = load({e2b['draft']!r})
cache = make_prompt_cache(t)
print(json.dumps({{"target": type(t).__module__, "draft": type(d).__module__, "mtp": g.is_mtp_drafter(d),
  "caches": [type(c).__name__ for c in cache], "ordering": sorted(d.masked_embedding._token_ordering.tolist()),
  "shared_kproj": hasattr(t.language_model.model.layers[7].self_attn, "k_proj")}}))
""")
    assert got["target"] == "mlx_lm.models.gemma4" and got["draft"] == "mlx_lm.models.gemma4_assistant"
    assert got["mtp"] and got["ordering"] == list(range(512))  # its cluster ordering installed by its sanitize
    # one cache per layer with its own K/V (the first 5): 4 sliding-window, 1 full
    assert got["caches"] == ["RotatingKVCache"] * 4 + ["KVCache"] and not got["shared_kproj"]


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.build
def test_past_the_sliding_window_its_rollback_trims_nothing_and_every_entry_point_leaves_classic_decode(
        e2b: dict, cli_bin: str) -> None:
    code, got = e2e(cli_bin, e2b["target"])
    assert code == 1 and set(got) == set(ENTRIES)
    for entry in ENTRIES:
        assert got[entry]["verdict"] == "diverged", got[entry]
        reason = got[entry]["reason"]
        assert "trimmed 0" in reason and "not trimmable: RotatingKVCache" in reason, reason
    lib = got["mtp_speculative_generate_step"]["reason"]
    assert "token 19: engine 436, classic 353, at round 10, row 0" in lib, lib
    assert "after round 9 its rollback asked cache.trim_prompt_cache for 2 rejected rows and it trimmed 0" in lib
    assert got["stream_generate"]["reason"] == lib  # the same loop, dispatched by stream_generate


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.build
def test_in_bfloat16_and_in_the_31b_shape_the_window_is_where_each_loop_leaves_classic_decode(
        cli_bin: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The findings table's other two columns. E2B in bfloat16: every entry point leaves classic decode at token 15,
    once the target's cache has passed its 32-position window (the rollback of round 7 trimmed nothing), by far
    more than a tie; the 31B shape (window 64): the library loop at token 49, after round 21's rollback at offset
    65 trimmed nothing, while its CLI's 3-draft rounds roll nothing back past the window in 64 tokens and match."""
    root = tmp_path_factory.mktemp("broomva-columns")
    bf16 = fixture_pairs.pair("broomva-e2b-bfloat16", root / "bf16").to_dict()
    code, got = e2e(cli_bin, bf16["target"])
    assert code == 1 and set(got) == set(ENTRIES)
    for entry, (token, drafts, offset) in {"mtp_speculative_generate_step": (369, 2, 32),
                                           "stream_generate": (369, 2, 32),
                                           "mlx_lm generate --draft-model": (464, 3, 33)}.items():
        reason = got[entry]["reason"]
        assert got[entry]["verdict"] == "diverged", got[entry]
        assert f"token 15: engine {token}, classic 511, at round 8, row 0" in reason, reason
        assert (f"after round 7 its rollback asked cache.trim_prompt_cache for {drafts} rejected rows and it trimmed"
                f" 0 (cache offsets [{offset}]; not trimmable: RotatingKVCache)") in reason, reason
        assert "not a tie" in reason and "bfloat16" in reason, reason
    big = fixture_pairs.pair("broomva-31b-float32", root / "31b").to_dict()
    code, got = e2e(cli_bin, big["target"])
    assert code == 1 and set(got) == set(ENTRIES)
    for entry in ("mtp_speculative_generate_step", "stream_generate"):
        reason = got[entry]["reason"]
        assert got[entry]["verdict"] == "diverged" and "token 49: engine 447, classic 308, at round 22" in reason
        assert ("after round 21 its rollback asked cache.trim_prompt_cache for 1 rejected rows and it trimmed 0"
                " (cache offsets [65]; not trimmable: RotatingKVCache)") in reason, reason
    cli = got["mlx_lm generate --draft-model"]
    assert cli["verdict"] == "match" and cli["drafter"]["drafted"] > 0, cli


# the findings table's columns the tests above leave (32 tokens of each pair's first fit prompt, as the table runs
# them): pair -> per entry point its accepted and proposed drafts where it matches, or (token index, round, engine
# token, classic token, rows the rollback before it asked to trim) where it leaves classic decode
TABLE_COLUMNS: dict[str, dict[str, tuple[int, ...]]] = {
    "broomva-e2b-bfloat16-untied": {"mtp_speculative_generate_step": (15, 15, 355, 82, 2),
                                    "stream_generate": (15, 15, 355, 82, 2),
                                    "mlx_lm generate --draft-model": (14, 14, 102, 326, 3)},
    "broomva-31b-bfloat16": {"mtp_speculative_generate_step": (18, 26), "stream_generate": (18, 26),
                             "mlx_lm generate --draft-model": (20, 36)},
    "broomva-31b-float32-untied": {"mtp_speculative_generate_step": (15, 33), "stream_generate": (15, 33),
                                   "mlx_lm generate --draft-model": (17, 43)},
    "broomva-31b-bfloat16-untied": {"mtp_speculative_generate_step": (4, 54), "stream_generate": (4, 54),
                                    "mlx_lm generate --draft-model": (4, 80)},
}


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.build
@pytest.mark.parametrize("name", sorted(TABLE_COLUMNS))
def test_the_findings_tables_other_columns_past_the_window_diverged_within_it_matched(
        name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """E2B untied in bfloat16 passes its 32-position window within the run: every entry point leaves classic decode
    the round after a rollback that trimmed nothing (far from a tie); the 31B shape (window 64) is not passed in
    16 + 32 positions, tied or untied, float32 or bfloat16: every entry point matches with drafts accepted."""
    from specparity.engine_findings import run_engine

    info = fixture_pairs.pair(name, tmp_path_factory.mktemp(name)).to_dict()
    got = {r["entry"]: r for r in run_engine(ENV, info, 32, env=built(ENV))}
    assert set(got) == set(ENTRIES), got
    for entry, want in TABLE_COLUMNS[name].items():
        f = got[entry]
        if len(want) == 2:
            assert (f["verdict"], f["accepted"], f["drafted"]) == ("match", *want), (entry, f)
            continue
        index, rnd, engine, classic, rows = want
        assert (f["verdict"], f["index"], f["round"], f["row"]) == ("diverged", index, rnd, 0), (entry, f)
        assert (f["engine_token"], f["classic_token"]) == (engine, classic), (entry, f)
        assert (f"after round {rnd - 1} its rollback asked cache.trim_prompt_cache for {rows} rejected rows and it"
                " trimmed 0 (cache offsets [32]; not trimmable: RotatingKVCache)") in f["reason"], f["reason"]
        assert "not a tie" in f["reason"], f["reason"]


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.build
def test_within_the_window_and_with_the_window_past_the_run_it_matches(e2b: dict, cli_bin: str,
                                                                       tmp_path: Path) -> None:
    code, got = e2e(cli_bin, e2b["target"], "--max-tokens", "14")  # 16 prompt + 14 tokens < 32
    assert code == 0, got
    for entry in ENTRIES:
        assert got[entry]["verdict"] == "match" and got[entry]["drafter"]["drafted"] > 0, got[entry]
    wide = tmp_path / "wide"
    shutil.copytree(Path(e2b["target"]).parent, wide)
    config = json.loads((wide / "target" / "config.json").read_text())
    config["text_config"]["sliding_window"] = 4096  # the same weights, a window no run here reaches
    (wide / "target" / "config.json").write_text(json.dumps(config))
    code, got = e2e(cli_bin, str(wide / "target"), "--entry-points", "mtp_speculative_generate_step",
                    draft=str(wide / "draft"))
    f = got["mtp_speculative_generate_step"]
    assert code == 0 and f["verdict"] == "match" and f["drafter"]["drafted"] > 0, f


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.build
@pytest.mark.server
def test_its_server_answers_without_a_drafter_and_fails_every_drafted_request_with_its_own_error(
        e2b: dict, cli_bin: str, tmp_path: Path) -> None:
    """Served (its profile: mlx-lm 0.31.3's ``mlx_lm server`` in the fork's environment): the drafter-less
    baselines equal classic decode; every request of the drafted arm fails, the server closing the connection, and
    the record says why with the server's own error (its handler builds a prompt cache for the drafter, and a
    gemma4_assistant has none): an error, exit 4, never a pass and never a divergence."""
    job = {"pairings": [{"name": "e2b", "target": e2b["target"], "draft": e2b["draft"], "profile": ENV}],
           "widths": [3], "max_tokens": 16, "sequence": ["fresh", "repeat"], "concurrency": 0, "self_draft": False}
    (tmp_path / "job.yaml").write_text(json.dumps(job))
    built(ENV)
    proc = run_cli(cli_bin, "served", "--config", str(tmp_path / "job.yaml"), "--json",
                   env={ENV_CACHE_VAR: str(REAL_CACHE)})
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    arms = {a["name"]: a for a in json.loads(proc.stdout)["pairings"][0]["arms"]}
    for base in ("baseline-start", "baseline-end"):
        assert {r["verdict"] for r in arms[base]["requests"]} == {"match"}, arms[base]
    drafted = arms["w3"]["requests"]
    assert [r["verdict"] for r in drafted] == ["error", "error"], drafted
    for r in drafted:
        assert "Server disconnected without sending a response" in r["reason"], r
        assert "(the server logged: NotImplementedError: Gemma 4 assistant has no KV cache of its own" in r["reason"]


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.build
def test_a_plain_drafter_is_refused_with_its_cause(cli_bin: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    pair = cached(build_pair, tmp_path_factory.mktemp("broomva-plain"), "broomva-plain-llama", arch="llama")
    code, got = e2e(cli_bin, pair.target, "--max-tokens", "8", "--entry-points", "mtp_speculative_generate_step",
                    draft=pair.draft)
    f = got["mtp_speculative_generate_step"]
    # the engine's error: e2e's not_run (exit 3), never a pass
    assert code == 3 and f["verdict"] == "not_run" and "not an MTP drafter" in json.dumps(f), f


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.build
def test_its_step_generator_is_read_to_eos_as_its_callers_read_it(cli_bin: str,
                                                                  tmp_path_factory: pytest.TempPathFactory) -> None:
    """The untied E2B pair: classic decode emits its eos after 8 tokens of the embedded prompt.
    ``mtp_speculative_generate_step`` (like mlx-lm's ``generate_step``) yields on past eos by design; its callers
    (``stream_generate``, its CLI) stop there. Read to eos as they read it, it matches with drafts accepted; read to
    ``max_tokens`` it was a false \"diverged at token 8\" (the findings table's row before)."""
    untied = fixture_pairs.pair("broomva-e2b-float32-untied", tmp_path_factory.mktemp("broomva-untied")).to_dict()
    code, got = e2e(cli_bin, untied["target"])
    assert code == 0, got
    for entry in ENTRIES:
        f = got[entry]
        assert f["verdict"] == "match" and f["drafter"]["drafted"] > 0, f
        assert len(f["drafter"]["tokens"]) == len(f["classic"]["tokens"]) < 32, f  # it stopped at classic's eos
