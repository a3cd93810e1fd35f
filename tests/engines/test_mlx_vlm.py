"""mlx-vlm 0.7.10 (issue 47): its own speculative loops against classic decode, in its pinned environment.

Each entry point is mlx-vlm's ``generate_step`` with a drafter from its own ``load_drafter``, the target loaded by
its own ``load``, judged token by token against mlx-lm's classic decode on the same weights; the drafter's own
``accept_lens`` / ``draft_lens`` are the acceptance record. The fixture is yunshu's (the project's DFlash pair
re-dressed as a Qwen3.5 VLM checkpoint, a random MTP head inside: ``fixtures make --dflash qwen3_5
--drafter-format yunshu``). What they pin, MLX's CPU backend, float32 (tied head, DFlash block 8), 48 tokens
of the drafter's first fit prompt, mlx-lm 0.32.2 beside it:

- ``draft_kind=dflash`` equals classic decode with drafts accepted (26 of 68), through ``generate_step`` and through
  its public ``stream_generate`` alike;
- ``draft_kind=mtp`` (the head split out of the target by its own splitter) drafts and has nothing accepted:
  not engaged, not a pass;
- ``draft_kind=eagle3``: no EAGLE-3 drafter is built here: not run, with that cause;
- a fault put into its DFlash walk (every draft accepted) is found: diverged, at its round and row;
- bfloat16, equal heads, tied (its own format): every loop parts at token 4 at a one-ULP near tie of classic
  decode's raw logits (the findings table's cell).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from builds import REAL_CACHE, built
from conftest import run_cli
from fixture_pairs import pair
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
    return pair("yunshu-qwen3_5-b8", tmp_path_factory.mktemp("mlx-vlm")).to_dict()


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.build
def test_e2e_its_dflash_loops_match_its_mtp_loop_is_not_engaged_and_eagle3_cannot_run(
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
    public = got["stream_generate draft_kind=dflash"]
    assert public["verdict"] == "match" and public["drafter"]["tokens"] == dflash["drafter"]["tokens"], public
    assert (public["drafter"]["proposed"], public["drafter"]["drafted"]) == (68, 26), public["drafter"]
    eagle = got["generate_step draft_kind=eagle3"]
    assert eagle["verdict"] == "not_run" and "no fixture in that format" in eagle["drafter"]["error"], eagle


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.build
def test_in_bfloat16_on_equal_heads_its_verify_row_flips_a_one_ulp_near_tie(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """The findings table's equal-heads bfloat16 tied cell (mlx-vlm's own fixture format, 32 tokens of its first
    fit prompt): the DFlash and MTP loops (and the public stream_generate) part from classic decode at token 4,
    round 4's first row, where classic decode's raw bfloat16 logit leads by one ULP (3.0 against 2.984375): a
    near tie, never called an exact one, the same token whichever drafter ran (so the target's verify row)."""
    from specparity.engine_findings import run_engine

    info = pair("mlx-vlm-equal-heads-bfloat16", tmp_path_factory.mktemp("mlx-vlm-bf16")).to_dict()
    got = {r["entry"]: r for r in run_engine(ENV, info, 32, env=built(ENV))}
    for entry in ("generate_step draft_kind=dflash", "generate_step draft_kind=mtp",
                  "stream_generate draft_kind=dflash"):
        f = got[entry]
        assert (f["verdict"], f["index"], f["round"], f["row"]) == ("diverged", 4, 4, 0), (entry, f)
        assert (f["engine_token"], f["classic_token"]) == (353, 87), (entry, f)
        assert (f["tie"]["classic_logit"], f["tie"]["engine_logit"]) == (3.0, 2.984375), (entry, f["tie"])
        assert not f["tie"]["logprob_tie"] and "a near tie, not an exact one" in f["reason"], (entry, f)
        assert "(1 ULP)" in f["reason"], f["reason"]
    assert got["generate_step draft_kind=eagle3"]["verdict"] == "error"  # no EAGLE-3 drafter here: never a pass


# the findings table's untied bfloat16 cells: (first differing token, its round for the DFlash loops, for the MTP
# loop), the engine's token and classic decode's, their shared bfloat16 logprob, the raw logits classic decode's
# lower id loses on
UNTIED_BF16 = {"mlx-vlm-bfloat16-untied": (5, 5, 5, 470, 41, -4.8125, (1.609375, 1.6015625)),
               "mlx-vlm-equal-heads-bfloat16-untied": (26, 13, 26, 271, 225, -4.625, (1.796875, 1.765625))}


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.build
@pytest.mark.parametrize("name", sorted(UNTIED_BF16))
def test_in_bfloat16_with_an_untied_head_every_loop_takes_the_other_side_of_an_exact_logprob_tie(
        name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The findings table's qwen3_5 and equal-heads bfloat16 untied cells (its own fixture format, 32 tokens of the
    first fit prompt): the DFlash loops (generate_step, the public stream_generate) and the MTP loop all part from
    classic decode at the same token, each at the first row of a round that accepted nothing (the target's verify
    row, whichever drafter ran), where classic decode's bfloat16 logprobs tie exactly and it keeps the lower id:
    an exact tie broken the other way (the loop takes the larger raw logit), never a near tie and never a pass."""
    from specparity.engine_findings import run_engine

    index, dflash_round, mtp_round, engine, classic, logprob, logits = UNTIED_BF16[name]
    info = pair(name, tmp_path_factory.mktemp(name)).to_dict()
    got = {r["entry"]: r for r in run_engine(ENV, info, 32, env=built(ENV))}
    for entry, rnd in (("generate_step draft_kind=dflash", dflash_round), ("stream_generate draft_kind=dflash",
                                                                           dflash_round),
                       ("generate_step draft_kind=mtp", mtp_round)):
        f = got[entry]
        assert (f["verdict"], f["index"], f["round"], f["row"]) == ("diverged", index, rnd, 0), (entry, f)
        assert (f["engine_token"], f["classic_token"]) == (engine, classic), (entry, f)
        tie = f["tie"]
        assert tie["logprob_tie"] and tie["engine_logprob"] == tie["classic_logprob"] == logprob, (entry, tie)
        assert (tie["engine_logit"], tie["classic_logit"]) == logits and engine > classic, (entry, tie)
        assert "an exact tie in mlx.core.bfloat16 logprobs" in f["reason"], f["reason"]
    eagle = got["generate_step draft_kind=eagle3"]
    assert eagle["verdict"] == "error" and "not run, not a pass" in eagle["reason"], eagle


# the findings table's matches but the float32 tied qwen3_5 one (its e2e test, at 48 tokens): pair -> the DFlash
# loops' accepted drafts and drafted tokens over 32 tokens of the first fit prompt
MATCHES = {"mlx-vlm-bfloat16": (17, 48), "mlx-vlm-untied": (16, 49), "mlx-vlm-equal-heads": (16, 49),
           "mlx-vlm-equal-heads-untied": (15, 53)}


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.build
@pytest.mark.parametrize("name", sorted(MATCHES))
def test_its_dflash_loops_match_where_the_table_says_match_and_its_random_mtp_head_is_never_a_pass(
        name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The findings table's other match cells (qwen3_5 bfloat16 tied, qwen3_5 float32 untied, equal heads float32
    tied and untied): generate_step and the public stream_generate with its DFlash drafter equal classic decode
    over all 32 tokens, with the drafts accepted the table gives (so it drafted: a match with no accepted draft is
    not one); its MTP loop on the checkpoint's random head accepts nothing (not engaged, never a pass)."""
    from specparity.engine_findings import run_engine

    accepted, drafted = MATCHES[name]
    info = pair(name, tmp_path_factory.mktemp(name)).to_dict()
    got = {r["entry"]: r for r in run_engine(ENV, info, 32, env=built(ENV))}
    for entry in ("generate_step draft_kind=dflash", "stream_generate draft_kind=dflash"):
        f = got[entry]
        assert (f["verdict"], f["accepted"], f["drafted"]) == ("match", accepted, drafted), (entry, f)
    assert got["generate_step draft_kind=mtp"]["verdict"] == "not_engaged", got["generate_step draft_kind=mtp"]
    assert got["generate_step draft_kind=eagle3"]["verdict"] == "error"  # no EAGLE-3 drafter here: never a pass


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
    assert f["verdict"] == "diverged" and (f["index"], f["round"], f["row"]) == (1, 1, 0), f
    assert f["row"] < f["rounds"][0]["accepted"], f  # an accepted draft
    assert f["tokens"][:f["index"]] == f["classic"][:f["index"]] and f["engine_token"] != f["classic_token"], f


@pytest.fixture(scope="module")
def served_fixture(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return pair("mlx-vlm", tmp_path_factory.mktemp("mlx-vlm-served")).to_dict()


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.build
@pytest.mark.server
def test_served_its_drafts_are_accepted_and_the_whitespace_every_arm_strips_is_named_not_a_divergence(
        served_fixture: dict, cli_bin: str, tmp_path: Path) -> None:
    """``served --config JOB``: two of the drafter's fit prompts (fresh and repeated, a shared prefix), 32 tokens,
    widths 4 and 8 and the target drafting for itself; no stream request and no multi-turn."""
    target, draft = served_fixture["target"], served_fixture["draft"]
    job = {"pairings": [{"name": "mlx-vlm-qwen3_5", "profile": "mlx-vlm", "target": target, "draft": draft}],
           "widths": [4, 8], "max_tokens": 32, "sequence": ["fresh", "repeat", "shared-prefix"],
           "prompts": ["The quick brown fox jumps over the lazy dog, and then",
                       "def add(a, b):\n    return a + b\n\nfor i in range(10):"],
           "concurrency": 0, "self_draft": True}
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(job))
    built(ENV)
    proc = run_cli(cli_bin, "served", "--config", str(config), "--json", cwd=str(tmp_path),
                   env={ENV_CACHE_VAR: str(REAL_CACHE)})
    assert proc.stdout.strip(), proc.stderr[-2000:]
    pairing = json.loads(proc.stdout)["pairings"][0]
    # nothing leaves classic decode; the target drafting for itself accepts nothing (not engaged: exit 3)
    assert proc.returncode == 3, pairing["findings"]
    arms = {a["name"]: {r["id"]: r for r in a["requests"]} for a in pairing["arms"]}
    assert set(arms) == {"baseline-start", "w4", "w8", "self-draft", "baseline-end"}
    baseline = arms["baseline-start"]["p0"]
    for name, requests in arms.items():
        # the fit prompt: classic decode's first three tokens are whitespace, which its server strips from the
        # answer: the same tokens' text stripped, named so, never a divergence (with the drafter and without)
        for rid in ("p0", "p0-again"):
            r = requests[rid]
            assert r["verdict"] == ("not_engaged" if name == "self-draft" else "match"), (name, r)
            assert "stripped of the whitespace around it" in r["reference"]["detokenized"], r["reference"]
            assert r["reference"]["detokenized_with_drafter_only"] is False
            assert r["sha256"] == baseline["sha256"], (name, rid)  # drafted or not, the same answer
        prefix = requests["p0-prefix"]
        assert prefix["verdict"] == ("match" if name.startswith("baseline") else "not_engaged"), (name, prefix)
    lines = {name: arms[name]["p0"]["evidence"]["lines"] for name in ("w4", "w8", "self-draft", "baseline-start")}
    assert lines["w4"] == ["timings: draft_kind dflash, 14 of 51 drafts accepted over 18 rounds"], lines
    assert lines["w8"] == ["timings: draft_kind dflash, 14 of 55 drafts accepted over 18 rounds"], lines
    # the target as its own drafter: its server takes the MTP head whatever --draft-kind says, nothing accepted
    assert lines["self-draft"] == ["timings: draft_kind mtp, 0 of 196 drafts accepted over 31 rounds"], lines
    assert lines["baseline-start"] == ["timings: no draft counts (draft_kind None): it did not draft"], lines
