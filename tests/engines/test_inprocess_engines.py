"""probe, replay and bisect --engine through issue 27's engines' own verify and rollback, in their environments.

dfly-mlx (dflash-mlx 0.1.8's ``TargetOps`` as dfly-mlx's ``load_runtime`` loads them), and
``bisect --engine`` for mlx-dspark, dspark-mlx and dfly-mlx (mlx-dspark's and dspark-mlx's probe and
replay: tests/test_own_loop_engines.py). What they pin, on MLX's CPU backend, mlx-lm 0.31.3:

- dfly-mlx on float32 qwen3: verify block and every rollback equal to classic decode, its own loop
  equal round by round; the injected faults found where they are (``stale-row``: the KV length at
  every k < 7, and the first round that rejected anything; ``verify-row``: row 1);
- dfly-mlx on the published qwen3_5 linear head ratio: every cell not run with dflash-mlx's own
  broadcast error; with equal linear heads, a rollback to a partial accept leaves layer 0's
  recurrent state wrong (dflash-mlx's), which that fixture's own run never meets;
- ``bisect --engine``: silent on the clean path; ``verify-row`` named in the logits from row 1,
  ``stale-row`` after a partial accept in layer 0's cache, per engine (mlx-dspark's hybrid: its
  conv and recurrent state); an engine's own error is one ``not run`` line, exit 3.
"""

from __future__ import annotations

import json

import pytest

from conftest import run_cli
from fixture_cache import cached
from fixture_pairs import pair
from specparity.fixtures.dspark import build_dspark_pair
from specparity.environments import ENV_CACHE_VAR
from builds import REAL_CACHE, built
from builds import engine_cli as _dspark_cli

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def fx(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("inprocess-dspark")
    return {"dspark-qwen3": cached(build_dspark_pair, root, "dspark-qwen3").to_dict(),
            "dspark-qwen3_5": cached(build_dspark_pair, root, "dspark-qwen3_5", shape="qwen3_5", tied=True).to_dict()}


@pytest.fixture(scope="module")
def dfly_fx(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("inprocess-dfly")
    return {"qwen3": pair("dfly-qwen3", root).to_dict(),
            "qwen3_5": pair("dfly-qwen3_5", root).to_dict(),
            "qwen3_5-equal-heads": pair("dfly-qwen3_5-equal", root).to_dict()}


# ------------------------------- dfly-mlx: dflash-mlx's verify and rollback through dfly-mlx's own loader

@pytest.mark.build
@pytest.mark.slow
def test_probe_engine_dfly_mlx_checks_dflash_mlx_verify_and_every_rollback_through_load_runtime(
        dfly_fx: dict, cli_bin: str) -> None:
    """dfly-mlx's ``load_runtime`` bundle: dflash-mlx's ``TargetOps`` verify block and tape-replay rollback at the
    drafter's 8-row block (verify mode dflash: no reduced block). Silent on the float32 qwen3 fixture; a rollback
    that keeps one rejected row is found at every k < 7 in the KV cache's length, a scaled verify row at row 1;
    on the published linear-attention head ratio (qwen3_5) every cell is not run, with dflash-mlx's own error;
    with equal heads, dflash-mlx's partial-accept rollback of the recurrent state is found at every 0 < k < 7."""
    info = dfly_fx["qwen3"]
    n = len(info["fit_prompts"][0])
    code, out = _dspark_cli(cli_bin, info, "probe", "--depths", "0", engine="dfly-mlx")
    assert code == 0, out
    eng = out["engine"]
    assert eng["name"] == "dfly-mlx" and eng["version"] == "0.1.0" and eng["widths"] == [8]
    assert eng["packages"]["dflash-mlx"] == "0.1.8" and "load_runtime" in " ".join(eng["notes"])
    assert [p["verdict"] for p in out["prefill"]] == ["equal"] and out["cells"][0]["verdict"] == "equal"
    assert [r["accepted"] for r in out["rollbacks"]] == list(range(8))
    assert all(r["verdict"] == "equal" for r in out["rollbacks"])

    code, out = _dspark_cli(cli_bin, info, "probe", "--depths", "0", fault="stale-row", engine="dfly-mlx")
    assert code == 1 and out["engine"]["fault"] == "stale-row" and out["cells"][0]["verdict"] == "equal"
    for r in out["rollbacks"]:
        k = r["accepted"]
        assert (r["verdict"], (r["first"] or {}).get("note")) == (
            ("equal", None) if k == 7 else ("divergent", f"offset {n + k} vs {n + k + 1}")), r

    code, out = _dspark_cli(cli_bin, info, "probe", "--depths", "0", fault="verify-row", engine="dfly-mlx")
    (cell,) = out["cells"]
    assert code == 1 and cell["verdict"] == "divergent" and cell["first_row"] == 1, cell
    assert all(r["verdict"] == "equal" for r in out["rollbacks"])  # the kept rows' state is the chain's

    code, out = _dspark_cli(cli_bin, dfly_fx["qwen3_5"], "probe", "--depths", "0", engine="dfly-mlx")
    assert code == 3 and out["engine"]["family"] == "hybrid_gdn", out
    assert out["cells"][0]["verdict"] == "not_run" and "broadcast" in json.dumps(out["cells"][0])
    assert all(r["verdict"] == "not_run" for r in out["rollbacks"])

    # equal linear key and value heads (dflash-mlx runs them): the verify is right, and a rollback to a partial
    # accept leaves layer 0's gated-delta recurrent state wrong (dflash-mlx's CPU innovation tape), which its
    # own loop on this fixture never meets (no partial round: its e2e and replay are equal)
    code, out = _dspark_cli(cli_bin, dfly_fx["qwen3_5-equal-heads"], "probe", "--depths", "0", engine="dfly-mlx")
    assert code == 1 and out["cells"][0]["verdict"] == "equal", out
    for r in out["rollbacks"]:
        if r["accepted"] in (0, 7):
            assert r["verdict"] == "equal", r
        else:
            assert r["verdict"] == "divergent" and r["rows_equal"], r
            assert (r["first"]["layer"], r["first"]["kind"], r["first"]["name"]) == (0, "ArraysCache", "state.1"), r


@pytest.mark.build
@pytest.mark.slow
def test_replay_engine_dfly_mlx_records_its_loop_round_by_round_and_places_a_kept_row(
        dfly_fx: dict, cli_bin: str) -> None:
    """dflash-mlx's loop as ``dfly_mlx.generate`` runs it (copy-from-history off), its DFly backend's blocks
    recorded as ``dfly`` rounds: equal on float32 qwen3 with drafts accepted; a kept rejected row is placed at the
    first round that rejected anything, by its own run and by the replay of its accept vector; on the hybrid
    its own loop stops before round 0 with dflash-mlx's error (not run, never a pass)."""
    info = dfly_fx["qwen3"]
    code, out = _dspark_cli(cli_bin, info, "replay", "--max-tokens", "24", engine="dfly-mlx")
    assert code == 0, out
    (req,) = out["requests"]
    assert req["verdict"] == "equal" and req["error"] is None and any(a > 0 for a in req["accepts"])
    assert "dfly" in req["sources"] and "copyspec" not in req["sources"]

    code, out = _dspark_cli(cli_bin, info, "replay", "--max-tokens", "24", fault="stale-row", engine="dfly-mlx")
    (req,) = out["requests"]
    first_reject = next(i for i, (a, w) in enumerate(zip(req["accepts"], req["widths"])) if a < w - 1)
    assert code == 1 and req["verdict"] == "divergent"
    assert req["state"]["round"] == first_reject and req["state"]["first"]["name"] == "offset"
    assert req["replay"]["state"]["round"] == first_reject

    code, out = _dspark_cli(cli_bin, dfly_fx["qwen3_5"], "replay", "--max-tokens", "24", engine="dfly-mlx")
    (req,) = out["requests"]
    assert code == 3 and req["verdict"] == "not_run" and "broadcast" in req["error"], req


# --------------------------------------------- bisect --engine: the engine's verify forward, layer by layer

def _bisect(cli_bin: str, info: dict, engine: str, width: int, accepted: int | None = None,
            fault: str | None = None) -> tuple[int, dict | None, str]:
    """``bisect --engine ENGINE`` on ``info``'s target (its drafter found from the fixture's record), re-run in the
    engine's built environment: exit code, its JSON (on an error, the error object) and stderr."""
    from specparity.probes.engines.base import FAULT_ENV

    built(engine)
    env = {ENV_CACHE_VAR: str(REAL_CACHE), **({FAULT_ENV: fault} if fault else {})}
    proc = run_cli(cli_bin, "bisect", "--engine", engine, "--model", info["target"], "--prompt-ids",
                   ",".join(map(str, info["fit_prompts"][0])), "--width", str(width),
                   *(["--accepted", str(accepted)] if accepted is not None else []), "--json", env=env)
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else None, proc.stderr


def _assert_bisect_names_each_fault(cli_bin: str, info: dict, engine: str, width: int, state: list[str]) -> None:
    """Each run rolls back to a partial accept. Clean: silent. ``verify-row``: the logits and nothing before them
    (first differing row 1), every layer's state after the rollback equal. ``stale-row``: layer 0, in its cache
    only (``state``: the cache components that differ)."""
    k = width // 2
    code, out, err = _bisect(cli_bin, info, engine, width, k)
    assert code == 0 and out is not None and out["first_divergent"] is None, err[-2000:]
    assert out["meta"]["engine"]["name"] == engine and out["meta"]["engine"]["fault"] is None
    code, out, err = _bisect(cli_bin, info, engine, width, k, fault="verify-row")
    assert code == 1 and out is not None, err[-2000:]
    assert out["first_divergent"] == "logits" and [r["label"] for r in out["rows"] if r["divergent"]] == ["logits"]
    assert out["logits"]["diff"]["first_row"] == 1
    code, out, err = _bisect(cli_bin, info, engine, width, k, fault="stale-row")
    assert code == 1 and out is not None, err[-2000:]
    assert out["first_divergent"] == "0" and out["first_components"] == state, out["first_components"]
    assert (out["drill"] or {}).get("sentence") == "every sub-op and the output are equal: only the cache differs"
    assert not next(r for r in out["rows"] if r["label"] == "logits")["divergent"]


@pytest.mark.build
@pytest.mark.slow
def test_bisect_engine_mlx_dspark_names_the_layer_its_gated_delta_rollback_got_wrong(fx: dict, cli_bin: str) -> None:
    """Through ``Target.verify`` (captured on its own model object) and ``Target.rollback`` on qwen3_5: the
    gated-delta re-run over the kept rows (its conv and recurrent state: ``cache state.0/1``) reaches every linear
    layer's conv only because the capture wraps each class once, as mlx-dspark patches it (before, a
    partial-accept rollback under bisect raised IndexError, and any verify AttributeError)."""
    _assert_bisect_names_each_fault(cli_bin, fx["dspark-qwen3_5"], "mlx-dspark", 3, ["cache state.0", "cache state.1"])


@pytest.mark.build
@pytest.mark.slow
def test_bisect_engine_names_the_layer_on_dense_targets_and_an_engine_error_is_not_run(
        fx: dict, dfly_fx: dict, cli_bin: str) -> None:
    """mlx-dspark's KV trim, dspark-mlx's host adapter and dfly-mlx's dflash-mlx ops on dense qwen3 (3-row and
    8-row blocks); dfly-mlx on the published qwen3_5 head ratio: one line with dflash-mlx's own error, exit 3
    (not run, never a pass)."""
    kv = ["cache offset", "cache keys", "cache values"]
    _assert_bisect_names_each_fault(cli_bin, fx["dspark-qwen3"], "mlx-dspark", 3, kv)
    _assert_bisect_names_each_fault(cli_bin, fx["dspark-qwen3"], "dspark-mlx", 8, kv)
    _assert_bisect_names_each_fault(cli_bin, dfly_fx["qwen3"], "dfly-mlx", 8, kv)
    code, out, err = _bisect(cli_bin, dfly_fx["qwen3_5"], "dfly-mlx", 8)
    # --json: the error object (the process's verdict and exit code), the same line on stderr
    assert code == 3 and out is not None and (out["verdict"], out["exit_code"]) == ("inconclusive", 3)
    assert "Traceback" not in err and out["error"] in err
    assert "Error: bisect --engine dfly-mlx: not run: the engine cannot run a 8-row verify block" in err
    assert "broadcast" in err.strip().splitlines()[-1]
