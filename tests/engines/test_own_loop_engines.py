"""Issue 27's engines (mlx-dspark 0.20.3, dspark-mlx 0.1.0, dfly-mlx 0.1.0, mtplx 2.12.2) against classic decode.

Each runs its own generate loop in its pinned environment on a drafter fixture
in its own format (:mod:`specparity.fixtures.dspark`), and its own acceptance
record locates a difference to the round and the verify row. What they pin, on
MLX's CPU backend, mlx-lm 0.31.3:

- float32 qwen3 targets: every loop equals classic decode, with drafts accepted;
- bfloat16: mlx-dspark, dspark-mlx and dfly-mlx take the raw-logit argmax of a
  verify row where classic decode's bfloat16 logprobs tie (it picks the lower id):
  the first differing token is at that tie, in the correction row of its round;
- mlx-dspark on the gated-delta hybrid (qwen3_5, float32): equal, its rollback
  re-running the recurrence over the kept rows;
- dspark-mlx on qwen3_5: its host adapter's error before the first round;
- dfly-mlx: its ``generate`` needs a chat template (its error on the fixtures);
  the loop it drives equals classic decode on qwen3 and, on the published
  linear-attention head ratio, stops with dflash-mlx's broadcast error (in process:
  tests/test_inprocess_engines.py);
- mtplx: its generation does not import on Linux (a macOS system library),
  each entry point ``cannot_run`` with that cause, never a pass.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import run_cli
from fixture_cache import cached
from fixture_pairs import pair
from specparity.fixtures.dspark import build_dspark_pair, simulate
from specparity.engine_findings import run_engine
from specparity.environments import ENV_CACHE_VAR
from specparity.engines.mlx_dspark.loops import FAULT_VAR
from builds import REAL_CACHE, built, warmed
from builds import engine_cli as _dspark_cli

pytestmark = pytest.mark.model
TOKENS = 32


class BuiltOnFirstUse(dict):
    """Fixture pairs by name, each built the first time a test asks for it: the fast tier asks for two of them."""

    def __init__(self, builders: dict[str, Callable[[], dict]]):
        super().__init__()
        self.builders = builders

    def __missing__(self, name: str) -> dict:
        built_now = self[name] = self.builders[name]()
        return built_now


@pytest.fixture(scope="module")
def fx(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """The fixtures every test here shares, each built once, at its first use (DSpark in a few seconds each)."""
    root = tmp_path_factory.mktemp("issue27")
    return BuiltOnFirstUse({
        "dspark-qwen3": lambda: cached(build_dspark_pair, root, "dspark-qwen3").to_dict(),
        "dspark-qwen3-bf16": lambda: cached(build_dspark_pair, root, "dspark-qwen3-bf16", dtype="bfloat16").to_dict(),
        "dspark-qwen3_5": lambda: cached(build_dspark_pair, root, "dspark-qwen3_5", shape="qwen3_5",
                                         tied=True).to_dict(),
        "dspark-none": lambda: cached(build_dspark_pair, root, "dspark-none", holdout=1.0).to_dict(),
    })


@pytest.fixture(scope="module")
def dfly_fx(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("issue27-dfly")
    return {"qwen3": pair("dfly-qwen3", root).to_dict(),
            "qwen3_5": pair("dfly-qwen3_5", root).to_dict()}


def findings(engine: str, info: dict | None, prompt: list[int] | None = None, tokens: int = TOKENS,
             extra: dict[str, str] | None = None) -> dict[str, dict]:
    """The engine's findings by entry point, run in its built environment (skip when not built)."""
    rows = run_engine(engine, info, tokens, env=built(engine), extra_env=extra, prompt=prompt)
    return {r["entry"]: r for r in rows}


def test_a_dspark_fixture_has_full_partial_and_zero_accept_blocks_and_says_so(fx: dict) -> None:
    mix = fx["dspark-qwen3"]["accept_mix"]
    assert mix["spread"] and mix["full"] and mix["partial"] and mix["zero"], mix["summary"]
    assert fx["dspark-qwen3"]["held_out"] > 0 and fx["dspark-qwen3"]["table_rows"] > 0
    # every row written wrong: the fixture says no block is accepted at all
    none = fx["dspark-none"]["accept_mix"]
    assert none["full"] == none["partial"] == 0 and none["zero"] == none["rounds"] > 0 and not none["spread"]


def test_the_accept_simulation_follows_the_table() -> None:
    traj = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    right = list(range(1, 12)) + [0] * 4  # prev -> prev + 1: every draft accepted
    assert simulate([traj], [2], right, 3).histogram == {3: 2}
    wrong = [0] * 16  # every draft rejected
    assert simulate([traj], [2], wrong, 3).histogram == {0: 6}  # anchors 2..7: one token a round


def test_the_dspark_drafter_is_in_deepspec_format(fx: dict) -> None:
    import mlx.core as mx

    cfg = json.loads((Path(fx["dspark-qwen3"]["draft"]) / "config.json").read_text())
    for key in ("model_type", "block_size", "mask_token_id", "target_layer_ids", "num_target_layers", "markov_rank",
                "enable_confidence_head", "confidence_head_with_markov"):
        assert key in cfg, key
    names = set(mx.load(str(Path(fx["dspark-qwen3"]["draft"]) / "model.safetensors")))
    assert {"fc.weight", "hidden_norm.weight", "markov_head.markov_w1.weight", "markov_head.markov_w2.weight",
            "confidence_head.proj.weight", "confidence_head.proj.bias", "lm_head.weight",
            "layers.0.self_attn.q_proj.weight"} <= names


@pytest.mark.build
def test_mlx_dspark_loads_the_fixture_strictly_and_matches_classic_decode_in_float32(fx: dict) -> None:
    got = findings("mlx-dspark", fx["dspark-qwen3"])
    assert set(got) == {"speculative_generate", "speculative_generate-full-block"}
    for f in got.values():
        assert f["verdict"] == "match", f
        assert f["accepted"] > 0 and f["tokens"] == f["classic"]
        assert any(r["accepted"] > 0 for r in f["rounds"]) and any(r["accepted"] == 0 for r in f["rounds"])


@pytest.mark.build
@pytest.mark.slow
def test_a_fault_in_mlx_dspark_verify_is_located_to_its_round_and_row(fx: dict) -> None:
    got = findings("mlx-dspark", fx["dspark-qwen3"], extra={FAULT_VAR: "3"})
    for f in got.values():
        assert f["verdict"] == "diverged" and f["round"] == 3 and f["row"] == 0, f
        assert f["tie"]["logprob_tie"] is False and f["tie"]["near_tie"] is False, f["tie"]  # a fault, not numerics


@pytest.mark.build
@pytest.mark.slow
def test_mlx_dspark_emits_one_token_past_max_tokens_from_its_last_round(fx: dict) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(fx["dspark-qwen3"]["target"]) / "tokenizer.json"))
    ids = tok.encode("def add(a, b):").ids
    f = findings("mlx-dspark", fx["dspark-qwen3"], prompt=ids, tokens=24)["speculative_generate"]
    assert f["verdict"] == "diverged" and f["index"] == 24 and len(f["tokens"]) == 25, f
    assert f["classic_token"] is None and f["row"] >= 1 and "max_tokens=24" in f["reason"]
    assert f["tokens"][:24] == f["classic"]


@pytest.mark.build
@pytest.mark.slow
def test_mlx_dspark_on_the_gated_delta_hybrid_matches(fx: dict) -> None:
    got = findings("mlx-dspark", fx["dspark-qwen3_5"])
    assert all(f["verdict"] == "match" for f in got.values()), got


@pytest.mark.build
@pytest.mark.slow
def test_bfloat16_dspark_engines_break_a_logprob_tie_the_other_way(fx: dict) -> None:
    for engine in ("mlx-dspark", "dspark-mlx"):
        for f in findings(engine, fx["dspark-qwen3-bf16"]).values():
            assert f["verdict"] == "diverged", f
            assert f["round"] >= 1 and f["row"] == 0  # the correction row of its round
            assert f["tie"]["logprob_tie"] and not f["tie"]["logit_tie"], f["tie"]
            assert f["tie"]["engine_logit"] > f["tie"]["classic_logit"] and f["engine_token"] > f["classic_token"]


@pytest.mark.build
@pytest.mark.slow
def test_dspark_mlx_matches_on_qwen3_fails_on_qwen3_5_and_is_not_engaged_without_accepts(fx: dict) -> None:
    got = findings("dspark-mlx", fx["dspark-qwen3"])
    assert all(f["verdict"] == "match" and f["accepted"] > 0 for f in got.values()), got
    for f in findings("dspark-mlx", fx["dspark-qwen3_5"]).values():
        assert f["verdict"] == "error" and "has no attribute 'model'" in f["failure"], f
    for f in findings("dspark-mlx", fx["dspark-none"]).values():
        assert f["verdict"] == "not_engaged" and f["accepted"] == 0 and f["tokens"] == f["classic"], f


@pytest.mark.build
@pytest.mark.slow
def test_dfly_mlx_its_loop_matches_on_qwen3_and_each_error_is_its_own(dfly_fx: dict) -> None:
    got = findings("dfly-mlx", dfly_fx["qwen3"])
    assert got["dfly-stream"]["verdict"] == "match" and got["dfly-stream"]["accepted"] > 0, got["dfly-stream"]
    assert got["generate"]["verdict"] == "error" and "chat_template" in got["generate"]["failure"]
    hybrid = findings("dfly-mlx", dfly_fx["qwen3_5"])["dfly-stream"]
    assert hybrid["verdict"] == "error" and "broadcast" in hybrid["failure"] and "dflash_mlx/" in hybrid["failure"]


@pytest.mark.build
def test_mtplx_generation_cannot_run_on_linux_with_its_own_cause() -> None:
    got = findings("mtplx", None)
    for entry in ("generate_ar", "generate_mtp1", "generate_mtpk"):
        assert got[entry]["verdict"] == "cannot_run" and "libSystem" in got[entry]["failure"], got[entry]
    assert not any(f["verdict"] == "match" for f in got.values())


@pytest.mark.build
@pytest.mark.slow
def test_e2e_engine_mlx_dspark_through_the_cli(fx: dict, cli_bin: str) -> None:
    built("mlx-dspark")
    ids = ",".join(map(str, fx["dspark-qwen3-bf16"]["fit_prompts"][0]))
    proc = run_cli(cli_bin, "e2e", "--engine", "mlx-dspark", "--model", fx["dspark-qwen3-bf16"]["target"],
                   "--prompt-ids", ids, "--max-tokens", str(TOKENS), "--entry-points", "speculative_generate",
                   "--json", env={ENV_CACHE_VAR: str(REAL_CACHE)})
    assert proc.returncode == 1, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["verdict"] == "diverged"
    assert "round" in json.dumps(out) and "exact tie" in json.dumps(out)


def test_fixtures_make_builds_a_dspark_pair_and_refuses_other_arguments(tmp_path, cli_bin: str) -> None:
    out = tmp_path / "dspark"
    made = run_cli(cli_bin, "fixtures", "make", str(out), "--dflash", "qwen3", "--drafter-format", "dspark",
                   "--block-size", "8", "--json")
    assert made.returncode == 0, made.stderr[-2000:]
    info = json.loads(made.stdout)
    assert info["kind"] == "dspark" and info["block_size"] == 7 and info["accept_mix"]["spread"]
    again = run_cli(cli_bin, "fixtures", "make", str(out), "--dflash", "qwen3", "--drafter-format", "dspark",
                    "--block-size", "8", "--dtype", "bfloat16")
    assert again.returncode == 2 and "built with --dtype float32 (asked bfloat16)" in again.stderr, again.stderr


@pytest.mark.build
@pytest.mark.server
@pytest.mark.slow
def test_mlx_dspark_serve_drafts_per_request_and_overruns_max_tokens_by_one(fx: dict) -> None:
    """``mlx-dspark serve`` live on the DSpark fixture: each response's ``x_mlx_dspark`` is the evidence that
    it drafted; its text is classic decode's, but a request for 24 tokens gets 25 (the last round's
    tokens all committed past ``max_tokens``), while one for 8 gets 8."""
    import httpx
    from mlx_lm import load

    from specparity.decode import advance_to_depth
    from specparity.harness.lifecycle import HOST_ARG, PORT_ARG, Server

    env = warmed("mlx-dspark")  # its first start on a machine calibrates (scripts/warm-engines)
    info = fx["dspark-qwen3"]
    model, tok = load(info["target"])[:2]
    prompt = "def add(a, b):"
    classic = advance_to_depth(model, tok.encode(prompt), 26)[2]
    argv = [str(env.python), "-m", "mlx_dspark.cli", "serve", "--mode", "dspark", "--model", info["target"],
            "--drafter", info["draft"], "--host", HOST_ARG, "--port", PORT_ARG, "--max-draft", "2", "--no-warmup"]
    with Server(argv, env=dict(env.environ()), ready_path="/health", start_timeout=300, name="mlx-dspark") as srv:
        got = {}
        for n in (8, 24):
            r = httpx.post(f"{srv.url}/v1/completions", timeout=120,
                           json={"prompt": prompt, "max_tokens": n, "temperature": 0})
            got[n] = r.json()
    for n in (8, 24):
        ev = got[n]["x_mlx_dspark"]
        assert ev["mode"] == "dspark" and ev["accept_len"] > 1, ev  # tokens per round: drafts were accepted
    assert got[8]["usage"]["completion_tokens"] == 8 and got[8]["choices"][0]["text"] == tok.decode(classic[:8])
    assert got[24]["usage"]["completion_tokens"] == 25
    assert got[24]["choices"][0]["text"] == tok.decode(classic[:25]) != tok.decode(classic[:24])


@pytest.mark.build
@pytest.mark.slow
def test_e2e_engine_dspark_mlx_matches_and_counts_its_accepted_drafts(fx: dict, cli_bin: str) -> None:
    built("dspark-mlx")
    ids = ",".join(map(str, fx["dspark-qwen3"]["fit_prompts"][0]))
    proc = run_cli(cli_bin, "e2e", "--engine", "dspark-mlx", "--model", fx["dspark-qwen3"]["target"],
                   "--prompt-ids", ids, "--max-tokens", str(TOKENS), "--json", env={ENV_CACHE_VAR: str(REAL_CACHE)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["verdict"] == "match"


# ------------------------------------------- mlx-dspark's own Target.verify / rollback, in process

@pytest.mark.build
@pytest.mark.slow
def test_probe_engine_mlx_dspark_checks_its_verify_and_every_rollback_and_finds_a_kept_row(
        fx: dict, cli_bin: str) -> None:
    """Block vs chain at its widths (cap 2: 3 rows; the whole block: 8) and every rollback to k, through its own
    ``Target.verify`` / ``Target.rollback``: silent on the float32 fixture; a rollback that keeps one rejected row
    is found at every k < width - 1 (and only there), in the KV cache's length."""
    code, out = _dspark_cli(cli_bin, fx["dspark-qwen3"], "probe", "--depths", "0")
    assert code == 0, out
    assert out["engine"]["name"] == "mlx-dspark" and out["engine"]["version"] == "0.20.3"
    assert out["engine"]["widths"] == [3, 8] and out["engine"]["fault"] is None
    assert [p["verdict"] for p in out["prefill"]] == ["equal"]
    assert {c["width"]: c["verdict"] for c in out["cells"]} == {3: "equal", 8: "equal"}
    rb = {(r["width"], r["accepted"]): r for r in out["rollbacks"]}
    assert set(rb) == {(w, k) for w in (3, 8) for k in range(w)}
    assert all(r["verdict"] == "equal" for r in rb.values())

    code, out = _dspark_cli(cli_bin, fx["dspark-qwen3"], "probe", "--depths", "0", fault="stale-row")
    assert code == 1 and out["engine"]["fault"] == "stale-row"
    assert {c["width"]: c["verdict"] for c in out["cells"]} == {3: "equal", 8: "equal"}  # the verify is right
    rb = {(r["width"], r["accepted"]): r for r in out["rollbacks"]}
    n = len(fx["dspark-qwen3"]["fit_prompts"][0])  # the block's first row is the prompt's last token
    for (w, k), r in rb.items():
        if k == w - 1:
            assert r["verdict"] == "equal"  # a full accept rolls nothing back
        else:
            assert r["verdict"] == "divergent" and r["first"]["name"] == "offset", (w, k, r)
            assert r["first"]["note"] == f"offset {n + k} vs {n + k + 1}", (w, k, r)

    # the gated-delta hybrid: its rollback re-runs the recurrence over the kept rows, and equals classic decode
    code, out = _dspark_cli(cli_bin, fx["dspark-qwen3_5"], "probe", "--depths", "0")
    assert code == 0, out
    assert out["engine"]["family"] == "qwen3_5" and "gated-delta rollback" in out["engine"]["notes"][0]
    assert len(out["rollbacks"]) == 3 + 8 and all(r["verdict"] == "equal" for r in out["rollbacks"])


@pytest.mark.build
@pytest.mark.slow
def test_replay_engine_mlx_dspark_places_its_own_loop_round_by_round_and_a_kept_row_to_its_round(
        fx: dict, cli_bin: str) -> None:
    """``speculative_generate`` on a recording proxy of its Target: equal on the float32 fixture with drafts
    accepted in part; with a rollback that keeps one rejected row, the state differs after the first round
    that rejected anything, and the replay of its accept vector finds the same round."""
    code, out = _dspark_cli(cli_bin, fx["dspark-qwen3"], "replay", "--max-tokens", "24")
    assert code == 0, out
    (req,) = out["requests"]
    assert req["kind"] == "engine-run" and req["verdict"] == "equal" and req["error"] is None
    assert "drafter" in req["sources"] and any(a > 0 for a in req["accepts"])
    assert req["tokens"][:len(req["classic_tokens"])] == req["classic_tokens"]

    code, out = _dspark_cli(cli_bin, fx["dspark-qwen3"], "replay", "--max-tokens", "24", fault="stale-row")
    assert code == 1
    (req,) = out["requests"]
    first_reject = next(i for i, (a, w) in enumerate(zip(req["accepts"], req["widths"])) if a < w - 1)
    state = req["state"]
    assert state["round"] == first_reject and state["accepted"] == req["accepts"][first_reject]
    assert state["first"]["kind"] == "KVCache" and state["first"]["name"] == "offset"
    assert req["replay"]["state"]["round"] == first_reject
    assert req["verdict"] == "divergent"


@pytest.mark.build
@pytest.mark.slow
def test_probe_and_replay_engine_dspark_mlx_through_its_host_adapter(fx: dict, cli_bin: str) -> None:
    """dspark-mlx's ``MlxLmHostAdapter`` (prefill, verify_forward, kv_rollback) and its ``generate_eager``: silent
    on the float32 fixture; a rollback that keeps one rejected row is found at every k < 7 of its 8-row block
    and, in its own loop, after the first round that rejected anything."""
    info = fx["dspark-qwen3"]
    n = len(info["fit_prompts"][0])
    code, out = _dspark_cli(cli_bin, info, "probe", "--depths", "0", engine="dspark-mlx")
    assert code == 0, out
    assert out["engine"]["name"] == "dspark-mlx" and out["engine"]["widths"] == [8]
    assert [p["verdict"] for p in out["prefill"]] == ["equal"] and out["cells"][0]["verdict"] == "equal"
    assert len(out["rollbacks"]) == 8 and all(r["verdict"] == "equal" for r in out["rollbacks"])
    code, out = _dspark_cli(cli_bin, info, "probe", "--depths", "0", fault="stale-row", engine="dspark-mlx")
    assert code == 1 and out["cells"][0]["verdict"] == "equal"
    for r in out["rollbacks"]:
        k = r["accepted"]
        assert (r["verdict"], (r["first"] or {}).get("note")) == (
            ("equal", None) if k == 7 else ("divergent", f"offset {n + k} vs {n + k + 1}")), r

    code, out = _dspark_cli(cli_bin, info, "replay", "--max-tokens", "24", engine="dspark-mlx")
    assert code == 0, out
    (req,) = out["requests"]
    assert req["verdict"] == "equal" and req["error"] is None and any(a > 0 for a in req["accepts"])
    code, out = _dspark_cli(cli_bin, info, "replay", "--max-tokens", "24", fault="stale-row", engine="dspark-mlx")
    (req,) = out["requests"]
    first_reject = next(i for i, (a, w) in enumerate(zip(req["accepts"], req["widths"])) if a < w - 1)
    assert code == 1 and req["state"]["round"] == first_reject and req["replay"]["state"]["round"] == first_reject


# ------------------------------------------------------------------- an MTP fixture in mtplx's format

@pytest.mark.build
@pytest.mark.slow
def test_an_mtp_fixture_loads_through_mtplx_and_its_generation_still_cannot_run(tmp_path, cli_bin: str) -> None:
    """``fixtures make --drafter-format mtp``: a qwen3_5 target whose ``mtp.safetensors`` passes mtplx's own
    strict coverage check and which its ``runtime.load`` attaches and validates; a head missing one tensor
    fails that check by name; the e2e's generation entry points stay ``cannot_run`` with mtplx's own cause."""
    import subprocess

    env = built("mtplx")
    made = run_cli(cli_bin, "fixtures", "make", str(tmp_path / "mtp"), "--dflash", "qwen3_5", "--drafter-format",
                   "mtp", "--tied-head", "--json")
    assert made.returncode == 0, made.stderr[-2000:]
    info = json.loads(made.stdout)
    assert info["kind"] == "mtp" and info["draft"] is None and info["mtp_layers"] == 1
    # the same head less one tensor: mtplx's own check names it
    import mlx.core as mx

    broken = tmp_path / "broken"
    broken.mkdir()
    for f in Path(info["target"]).iterdir():
        (broken / f.name).symlink_to(f)
    (broken / "mtp.safetensors").unlink()
    head = dict(mx.load(str(Path(info["target"]) / "mtp.safetensors")))  # type: ignore[arg-type]
    del head["mtp.layers.0.mlp.up_proj.weight"]
    mx.save_safetensors(str(broken / "mtp.safetensors"), head)

    code = ("import json, sys; from specparity.engines.mtplx.loops import check_mtp_fixture;"
            " print(json.dumps([check_mtp_fixture(t) for t in sys.argv[1:]]))")
    proc = subprocess.run([str(env.python), "-P", "-c", code, info["target"], str(broken)], env=env.environ(),
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    good, bad = json.loads(proc.stdout.strip().splitlines()[-1])
    assert good["coverage"] == "exact" and good["tensors"] == len(info["mtp_tensors"]) and good["mtp_layers"] == 1
    assert good["mtp_enabled"] is True and good["validated"] is True and "load_error" not in good
    assert "does not match runtime module tree" in bad["coverage"] and "layers.0.mlp.up_proj.weight" in bad["coverage"]

    got = findings("mtplx", {**info, "draft": None, "fit_prompts": [[1, 2, 3]]})
    for entry in ("generate_ar", "generate_mtp1", "generate_mtpk"):
        assert got[entry]["verdict"] == "cannot_run" and "libSystem" in got[entry]["failure"], got[entry]
    assert "MTP heads attached: True, validated: True; coverage: exact" in got["runtime.load"]["reason"]
    assert not any(f["verdict"] == "match" for f in got.values())
