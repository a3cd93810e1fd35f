"""mlx-flash 0.9.2 (issue 47) against classic decode, in its pinned environment, on its fixture format.

Each entry point runs mlx-flash's own loop with its library defaults (the target loaded by ``mlx_lm.load`` as its
server loads it; the prompt's ids and ``max_tokens``), judged token by token against mlx-lm's classic decode;
each loop's own verify step is the acceptance record that places a difference in its round and row. What they
pin, MLX's CPU backend, mlx-lm 0.32.2, the qwen3 float32 DFlash pair (block 8) with its fitted EAGLE head, the
embedded prompt:

- ``LayerSkipEngine.generate`` and ``DFlashRunner.generate`` equal classic decode over 48 tokens, drafts accepted;
- every loop appends whole rounds until it holds ``max_tokens``: ``EAGLE3Engine.generate`` emits 49 tokens for 48
  (its first 48 classic decode's), ``DFlashRunner.generate`` 27 for 20; where its last round ends at
  ``max_tokens`` (DFlash at 48, EAGLE at 20) the same check is silent;
- ``DFlashRunner.generate accept_top_k=4``: lossy by design, with what it changed;
- ``DFlashEngine.generate`` (no drafter, as its server builds it) drafts nothing, its ``BlockDiffusionDrafter``
  (no loader, no trained weights) and the untrained EAGLE head its server builds accept nothing: not engaged;
- its server (``mlx-flash --speculative ...``) cannot start on Linux: ``system_profiler``;
- on the qwen3_5 hybrid: ``LayerSkipEngine`` cannot trim its linear-attention cache, ``DFlashRunner`` stops on a
  tied head, ``EAGLE3Engine`` passes ``max_tokens`` on the untied one;
- qwen3 in bfloat16: every loop takes the raw-logit argmax at an exact tie of classic decode's logprobs (token 21).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from builds import REAL_CACHE, built
from conftest import run_cli
from fixture_pairs import pair
from specparity.engine_findings import run_engine
from specparity.environments import ENV_CACHE_VAR

ENV = "mlx-flash"
TOKENS = 48
SERVER = ("mlx-flash --speculative layerskip", "mlx-flash --speculative eagle3", "mlx-flash --speculative dflash")
NOT_ENGAGED = ("DFlashEngine.generate", "DFlashEngine.generate BlockDiffusionDrafter",
               "EAGLE3Engine.generate untrained head")


@pytest.fixture(scope="module")
def fixture(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The qwen3 float32 DFlash pair (block 8) with mlx-flash's EAGLE head beside it, built once."""
    return pair("mlx-flash-qwen3-b8", tmp_path_factory.mktemp("mlx-flash")).record


def findings(info: dict, tokens: int = TOKENS) -> dict[str, dict]:
    """mlx-flash's findings by entry point, run in its built environment (skip when not built)."""
    got = {r["entry"]: r for r in run_engine("mlx-flash", info, tokens, env=built(ENV))}
    assert "*" not in got, got["*"]  # the run itself failed (its last line): never read as an entry's finding
    return got


def test_mlx_flash_is_one_package_of_its_own() -> None:
    from test_engine_packages import test_each_builtin_engine_is_one_package_of_its_own

    test_each_builtin_engine_is_one_package_of_its_own("mlx-flash")


@pytest.mark.slow
def test_its_fixture_holds_its_own_eagle_head_in_the_shape_its_defaults_make(fixture) -> None:
    folder = Path(fixture["target"]).parent / "eagle"
    shape = json.loads((folder / "eagle_head.json").read_text())
    assert shape["num_heads"] == 4 and shape["num_layers"] == 1 and shape["hidden_dim"] == 64, shape
    assert fixture["kind"] == "mlx-flash" and fixture["eagle_fit"] > 0.5, fixture


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.build
def test_its_loops_against_classic_decode_each_with_its_own_record(fixture) -> None:
    got = findings(fixture)
    for entry in ("LayerSkipEngine.generate", "DFlashRunner.generate"):
        f = got[entry]
        assert f["verdict"] == "match" and f["accepted"] > 0 and f["tokens"] == f["classic"], f
        assert len(f["tokens"]) == TOKENS
    eagle = got["EAGLE3Engine.generate"]
    assert eagle["verdict"] == "diverged" and eagle["index"] == TOKENS and len(eagle["tokens"]) == TOKENS + 1, eagle
    assert eagle["tokens"][:TOKENS] == eagle["classic"] and eagle["classic_token"] is None
    assert (eagle["round"], eagle["row"]) == (23, 4) and eagle["accepted"] > 0, eagle
    lossy = got["DFlashRunner.generate accept_top_k=4"]
    assert lossy["verdict"] == "lossy_by_design" and "accept_top_k=4" in lossy["reason"], lossy
    assert "token 4" in lossy["reason"] and "not a pass, not a defect" in lossy["reason"]
    for entry in NOT_ENGAGED:
        f = got[entry]
        assert f["verdict"] == "not_engaged" and f["accepted"] == 0 and f["tokens"] == f["classic"], f
    assert got["DFlashEngine.generate"]["drafted"] == 0 and got["EAGLE3Engine.generate untrained head"]["drafted"] > 0
    for entry in SERVER:
        f = got[entry]
        assert f["verdict"] == "cannot_run" and "'system_profiler'" in f["reason"] and not f["tokens"], f


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.build
def test_in_bfloat16_every_loop_takes_the_other_side_of_an_exact_logprob_tie(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """The findings table's qwen3 bfloat16 column (32 tokens of the fixture's first fit prompt): at token 21 classic
    decode's bfloat16 logprobs tie exactly and it keeps the lower id (15); every loop takes 392, its verify row's
    raw-logit argmax, in the round and row its own record places it (DFlashEngine's drafter-less single steps
    too: the greedy rule, not a verify kernel). Its documented lossy mode is reported as such; its server cannot
    start here."""
    info = pair("mlx-flash-qwen3-bfloat16-b8", tmp_path_factory.mktemp("mlx-flash-bf16")).record
    got = findings(info, 32)
    where = {"LayerSkipEngine.generate": (20, 0), "DFlashRunner.generate": (19, 1), "DFlashEngine.generate": (22, 0),
             "DFlashEngine.generate BlockDiffusionDrafter": (22, 0), "EAGLE3Engine.generate": (17, 1),
             "EAGLE3Engine.generate untrained head": (22, 0)}
    for entry, (round_, row) in where.items():
        f = got[entry]
        assert (f["verdict"], f["index"], f["engine_token"], f["classic_token"]) == ("diverged", 21, 392, 15), f
        assert (f["round"], f["row"]) == (round_, row) and f["tie"]["logprob_tie"], (entry, f)
        assert "an exact tie in mlx.core.bfloat16" in f["reason"], f["reason"]
    assert got["DFlashRunner.generate accept_top_k=4"]["verdict"] == "lossy_by_design"
    assert {got[e]["verdict"] for e in SERVER} == {"cannot_run"}


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.build
def test_its_last_round_past_max_tokens_is_found_where_it_overshoots_and_silent_where_it_does_not(fixture) -> None:
    got = findings(fixture, 20)
    dflash = got["DFlashRunner.generate"]
    assert dflash["verdict"] == "diverged" and dflash["index"] == 20 and len(dflash["tokens"]) == 27, dflash
    assert dflash["tokens"][:20] == dflash["classic"] and (dflash["round"], dflash["row"]) == (17, 1), dflash
    eagle = got["EAGLE3Engine.generate"]
    assert eagle["verdict"] == "match" and len(eagle["tokens"]) == 20 and eagle["accepted"] > 0, eagle


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.build
def test_e2e_as_a_user_types_it(cli_bin, fixture) -> None:
    built(ENV)
    proc = run_cli(cli_bin, "e2e", "--engine", "mlx-flash", "--model", fixture["target"], "--max-tokens",
                   str(TOKENS), "--json", env={ENV_CACHE_VAR: str(REAL_CACHE)})
    assert proc.returncode == 1, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    verdicts = {e["entry"]: e["verdict"] for e in out["entries"]}
    assert verdicts["LayerSkipEngine.generate"] == verdicts["DFlashRunner.generate"] == "match", verdicts
    assert verdicts["EAGLE3Engine.generate"] == "diverged"
    assert verdicts["DFlashRunner.generate accept_top_k=4"] == "lossy_by_design"
    assert all(verdicts[e] == "not_engaged" for e in NOT_ENGAGED), verdicts
    assert all(verdicts[e] == "not_run" for e in SERVER), verdicts


@pytest.mark.slow
@pytest.mark.build
def test_its_server_stops_at_the_macos_tool_before_it_listens(fixture) -> None:
    env = built(ENV)
    exe = Path(env.python).parent / "mlx-flash"
    proc = subprocess.run([str(exe), "--model", fixture["target"], "--speculative", "layerskip", "--port", "0"],
                          capture_output=True, text=True, timeout=120, env=dict(env.environ()))
    assert proc.returncode != 0 and "Server listening" not in proc.stdout + proc.stderr
    assert "FileNotFoundError" in proc.stderr and "'system_profiler'" in proc.stderr, proc.stderr[-1500:]
    assert "detect_hardware" in proc.stderr


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.build
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_on_a_gated_delta_hybrid_layerskip_cannot_trim_and_its_dflash_runner_needs_an_untied_head(
        tmp_path_factory: pytest.TempPathFactory, tied: bool) -> None:
    """The qwen3_5 hybrid (float32, block 8; the findings table's rows, docs/engines.md): ``LayerSkipEngine``
    stops on the linear-attention layers' ``ArraysCache`` (no ``trim``) with either head; ``DFlashRunner`` stops
    on a tied head (``TypeError``) and matches on an untied one; ``EAGLE3Engine`` matches on the tied target and on
    the untied one appends a round past ``max_tokens`` (35 tokens for 32, the first 32 classic decode's)."""
    name = f"mlx-flash-qwen3_5-{'tied' if tied else 'untied'}-b8"
    info = pair(name, tmp_path_factory.mktemp(name)).record
    got = findings(info, 32)
    layer = got["LayerSkipEngine.generate"]
    assert layer["verdict"] == "error" and not layer["tokens"], layer
    assert "AttributeError: 'ArraysCache' object has no attribute 'trim'" in layer["failure"], layer
    runner, eagle = got["DFlashRunner.generate"], got["EAGLE3Engine.generate"]
    if tied:
        assert runner["verdict"] == "error" and "TypeError: 'NoneType' object is not callable" in runner["failure"]
        assert eagle["verdict"] == "match" and eagle["accepted"] > 0 and eagle["tokens"] == eagle["classic"], eagle
        return
    assert runner["verdict"] == "match" and runner["tokens"] == runner["classic"], runner
    assert eagle["verdict"] == "diverged" and eagle["index"] == 32 and eagle["classic_token"] is None, eagle
    assert len(eagle["tokens"]) > 32 and eagle["tokens"][:32] == eagle["classic"], eagle
    assert "classic stopped at max_tokens=32" in eagle["reason"] and eagle["accepted"] > 0, eagle


# the findings table's other columns (32 tokens of each pair's first fit prompt): per pair, per entry point, what
# it finds. ("error", the engine's own error); ("not_engaged",); ("match", accepted, drafted); ("tie", index,
# round): it leaves classic decode at an exact bfloat16 logprob tie, engine 470 where classic decode keeps 41, at
# the first row of the round; ("past", tokens emitted, round, row): a round appended past max_tokens=32, its first
# 32 tokens classic decode's; ("lossy",): accept_top_k=4, its documented lossy mode
TRIM = ("error", "AttributeError: 'ArraysCache' object has no attribute 'trim'")
TIED_HEAD = ("error", "TypeError: 'NoneType' object is not callable")
TABLE_COLUMNS: dict[str, dict[str, tuple[Any, ...]]] = {
    "mlx-flash-qwen3_5-bfloat16-tied-b8": {
        "LayerSkipEngine.generate": TRIM, "DFlashRunner.generate": TIED_HEAD,
        "DFlashRunner.generate accept_top_k=4": TIED_HEAD, "DFlashEngine.generate": ("not_engaged",),
        "DFlashEngine.generate BlockDiffusionDrafter": ("match", 1, 465), "EAGLE3Engine.generate": ("past", 35, 7, 3),
        "EAGLE3Engine.generate untrained head": ("not_engaged",)},
    "mlx-flash-qwen3_5-bfloat16-untied-b8": {
        "LayerSkipEngine.generate": TRIM, "DFlashRunner.generate": ("tie", 5, 6),
        "DFlashRunner.generate accept_top_k=4": ("lossy",), "DFlashEngine.generate": ("tie", 5, 6),
        "DFlashEngine.generate BlockDiffusionDrafter": ("tie", 5, 6), "EAGLE3Engine.generate": ("tie", 5, 2),
        "EAGLE3Engine.generate untrained head": ("tie", 5, 6)},
    "mlx-flash-qwen3_5-equal-heads-tied-b8": {
        "LayerSkipEngine.generate": TRIM, "DFlashRunner.generate": TIED_HEAD,
        "DFlashRunner.generate accept_top_k=4": TIED_HEAD, "DFlashEngine.generate": ("not_engaged",),
        "DFlashEngine.generate BlockDiffusionDrafter": ("not_engaged",), "EAGLE3Engine.generate": ("match", 29, 36),
        "EAGLE3Engine.generate untrained head": ("match", 1, 186)},
    "mlx-flash-qwen3_5-equal-heads-bfloat16-tied-b8": {
        "LayerSkipEngine.generate": TRIM, "DFlashRunner.generate": TIED_HEAD,
        "DFlashRunner.generate accept_top_k=4": TIED_HEAD, "DFlashEngine.generate": ("not_engaged",),
        "DFlashEngine.generate BlockDiffusionDrafter": ("not_engaged",), "EAGLE3Engine.generate": ("past", 36, 6, 2),
        "EAGLE3Engine.generate untrained head": ("not_engaged",)},
}


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.build
@pytest.mark.parametrize("name", sorted(TABLE_COLUMNS))
def test_the_findings_tables_hybrid_columns_in_bfloat16_and_on_equal_heads(
        name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The qwen3_5 bfloat16 columns (tied and untied) and the equal-heads ones (float32 and bfloat16, tied), each
    cell as the findings table gives it: LayerSkip cannot trim a hybrid's cache, DFlashRunner stops on a tied head,
    on the untied bfloat16 target every loop breaks an exact logprob tie the other way at token 5, EAGLE3Engine
    appends a round past max_tokens where its head drafts well, and a loop that accepted nothing is never a
    pass. Its CLI cannot start on Linux in any column (its server calls system_profiler)."""
    info = pair(name, tmp_path_factory.mktemp(name)).record
    got = findings(info, 32)
    for entry, want in TABLE_COLUMNS[name].items():
        f, kind = got[entry], want[0]
        if kind == "error":
            assert f["verdict"] == "error" and want[1] in f["failure"], (entry, f)
        elif kind in ("not_engaged", "lossy"):
            assert f["verdict"] == {"lossy": "lossy_by_design"}.get(kind, kind), (entry, f)
            assert kind == "lossy" or (f["accepted"] == 0 and f["tokens"] == f["classic"]), (entry, f)
        elif kind == "match":
            assert (f["verdict"], f["accepted"], f["drafted"]) == ("match", *want[1:]), (entry, f)
        elif kind == "tie":
            assert (f["verdict"], f["index"], f["round"], f["row"]) == ("diverged", want[1], want[2], 0), (entry, f)
            assert (f["engine_token"], f["classic_token"], f["tie"]["logprob_tie"]) == (470, 41, True), (entry, f)
        else:
            emitted, rnd, row = want[1:]
            assert (f["verdict"], f["index"], f["round"], f["row"]) == ("diverged", 32, rnd, row), (entry, f)
            assert len(f["tokens"]) == emitted and f["tokens"][:32] == f["classic"], (entry, f)
            assert "classic stopped at max_tokens=32" in f["reason"], (entry, f)
    for mode in ("layerskip", "eagle3", "dflash"):
        cli = got[f"mlx-flash --speculative {mode}"]
        assert cli["verdict"] == "cannot_run" and "system_profiler" in cli["reason"], cli

