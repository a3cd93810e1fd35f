"""mlx-vlm 0.7.10 (issue 47): its own speculative loops against classic decode, in its pinned environment.

Each entry point is mlx-vlm's ``generate_step`` with a drafter from its own ``load_drafter``, the target loaded by
its own ``load``, judged token by token against mlx-lm's classic decode on the same weights; the drafter's own
``accept_lens`` / ``draft_lens`` are the acceptance record. The fixture is yunshu's (the project's DFlash pair
re-dressed as a Qwen3.5 VLM checkpoint, a random MTP head inside: ``fixtures make --dflash qwen3_5
--drafter-format yunshu``). What they pin, MLX's CPU backend, float32 (tied head, DFlash block 8), 48 tokens
of the drafter's first fit prompt, mlx-lm 0.32.2 beside it:

- ``draft_kind=dflash`` equals classic decode with drafts accepted (26 of 68);
- ``draft_kind=mtp`` (the head split out of the target by its own splitter) drafts and has nothing accepted:
  not engaged, not a pass;
- ``draft_kind=eagle3``: no EAGLE-3 drafter is built here: not run, with that cause;
- a fault put into its DFlash walk (every draft accepted) is found: diverged, at its round and row.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from builds import REAL_CACHE, built
from conftest import run_cli
from fixture_cache import cached
from specparity.environments import ENV_CACHE_VAR

ENV = "mlx-vlm"
TOKENS = 48


def test_mlx_vlm_is_one_package_of_its_own() -> None:
    from test_engine_packages import test_each_builtin_engine_is_one_package_of_its_own

    test_each_builtin_engine_is_one_package_of_its_own("mlx-vlm")


def test_its_record_becomes_rounds_that_commit_each_accepted_draft_and_one_more_cut_at_the_end() -> None:
    from types import SimpleNamespace

    from specparity.engines.mlx_vlm.loops import rounds_of

    drafter = SimpleNamespace(accept_lens=[3.0, 0.0, 15.0], draft_lens=[15, 3, 15])
    got = rounds_of(drafter, 1 + 4 + 1 + 5)  # the prefill's token, then 4, 1, and 5 of 16 (max_tokens)
    assert [(r["drafted"], r["accepted"], r["committed"]) for r in got] == [(15, 3, 4), (3, 0, 1), (15, 15, 5)]


@pytest.fixture(scope="module")
def fixture(tmp_path_factory: pytest.TempPathFactory) -> dict:
    from specparity.engines.yunshu.fixtures import build_yunshu_fixture

    return cached(build_yunshu_fixture, tmp_path_factory.mktemp("mlx-vlm"), "mlx-vlm-yunshu", block_size=8).to_dict()


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.build
def test_e2e_its_dflash_loop_matches_its_mtp_loop_is_not_engaged_and_eagle3_cannot_run(
        fixture: dict, cli_bin: str) -> None:
    built(ENV)
    proc = run_cli(cli_bin, "e2e", "--engine", "mlx-vlm", "--model", fixture["target"], "--draft-model",
                   fixture["draft"], "--prompt-ids", ",".join(map(str, fixture["fit_prompts"][0])),
                   "--max-tokens", str(TOKENS), "--json", env={ENV_CACHE_VAR: str(REAL_CACHE)})
    assert proc.returncode == 3, proc.stderr[-2000:]  # not engaged / not run: never a pass
    got = {e["entry"]: e for e in json.loads(proc.stdout)["entries"]}
    dflash = got["generate_step draft_kind=dflash"]
    assert dflash["verdict"] == "match", dflash
    assert dflash["drafter"]["tokens"] == dflash["classic"]["tokens"] and len(dflash["classic"]["tokens"]) == TOKENS
    assert (dflash["drafter"]["proposed"], dflash["drafter"]["drafted"]) == (68, 26), dflash["drafter"]
    mtp = got["generate_step draft_kind=mtp"]
    assert mtp["verdict"] == "not_engaged" and mtp["drafter"]["proposed"] > 0 and mtp["drafter"]["drafted"] == 0
    assert mtp["drafter"]["tokens"] == mtp["classic"]["tokens"]
    eagle = got["generate_step draft_kind=eagle3"]
    assert eagle["verdict"] == "not_run" and "no fixture in that format" in eagle["drafter"]["error"], eagle


FAULT = """
import json, sys
import mlx_vlm.speculative.dflash as d
from specparity.engines.mlx_vlm.loops import load_target, run_entry
from specparity.probes.engine_e2e import Classic, load_once
target, draft, prompt, n = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
walk = d._speculative_walk
def accept_all(draft_tokens, target_tokens, budget):  # the fault: every draft accepted
    _, tokens = walk(draft_tokens, draft_tokens, budget)
    return len(tokens) - 1, tokens
if sys.argv[5] == "fault":
    d._speculative_walk = accept_all
ref = Classic(target, n)
f = run_entry("generate_step draft_kind=dflash", load_once(lambda: load_target(target)), target, draft, prompt, n,
              ref.tokens(prompt), ref.eos)
print(json.dumps(f.to_dict()))
"""


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.build
@pytest.mark.parametrize("arm", ["fault", "clean"])
def test_a_fault_in_its_dflash_walk_is_found_at_its_round_and_the_clean_walk_matches(fixture: dict, arm: str) -> None:
    env = built(ENV)
    proc = subprocess.run([str(env.python), "-P", "-c", FAULT, fixture["target"], fixture["draft"],
                           json.dumps(fixture["fit_prompts"][0]), str(TOKENS), arm],
                          capture_output=True, text=True, timeout=600, env=dict(env.environ()))
    assert proc.returncode == 0, proc.stderr[-2000:]
    f = json.loads(proc.stdout.strip().splitlines()[-1])
    if arm == "clean":
        assert f["verdict"] == "match" and f["accepted"] == 26, f
        return
    assert f["verdict"] == "diverged" and f["round"] >= 1 and f["row"] < f["rounds"][f["round"] - 1]["accepted"], f
    assert f["tokens"][:f["index"]] == f["classic"][:f["index"]] and f["engine_token"] != f["classic_token"], f
