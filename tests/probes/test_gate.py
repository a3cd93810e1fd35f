"""The memoized gate: memo, override, decline on not_run, concurrency, corruption."""

from __future__ import annotations

import json
import multiprocessing as mp
import time
from pathlib import Path

import pytest
from conftest import build, run_cli
from specparity.fixtures import FixtureInfo
from specparity.probes.gate import GateStore, gate_check, gate_key, store_path


def _refuse(*_a, **_k):
    raise AssertionError("a store hit must not probe or load the model")


@pytest.mark.model
def test_miss_probes_the_real_model_then_hit_answers_from_the_store(fixture_root, caplog):
    info = build(fixture_root, "llama-float32", arch="llama")
    caplog.set_level("INFO", logger="specparity.gate")
    first = gate_check(info.target, 4, depths=(0,), walk=16)
    assert first.allow and not first.hit and first.verdict == "equal"
    assert first.line.startswith("specparity-gate: ALLOW width=4 key=")
    second = gate_check(info.target, 4, depths=(0,), walk=16, probe=_refuse)
    assert second.hit and second.allow and second.key == first.key
    assert any("specparity-gate: ALLOW" in r.message for r in caplog.records)


@pytest.mark.model
def test_key_changes_with_width_env_and_cache_options(fixture_root, monkeypatch):
    from specparity.decode import CacheOptions

    info = build(fixture_root, "llama-float32", arch="llama")
    k4, _ = gate_key(info.target, 4)
    assert gate_key(info.target, 4)[0] == k4
    assert gate_key(info.target, 8)[0] != k4
    assert gate_key(info.target, 4, CacheOptions(kv_bits=8))[0] != k4
    monkeypatch.setenv("MLX_SOME_KERNEL_SWITCH", "1")
    assert gate_key(info.target, 4)[0] != k4
    assert gate_key(info.target, 4, env_prefixes=("NOT_MLX_",))[0] == k4  # the list is configurable


@pytest.mark.model
def test_divergent_declines_and_allow_inexact_forfeits(rows4_pair: FixtureInfo, monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    info = rows4_pair
    d = gate_check(info.target, 4, trust_remote_code=True, depths=(0,), walk=0)
    assert not d.allow and d.verdict == "divergent" and not d.forfeit
    assert d.line.startswith("specparity-gate: DECLINE width=4")
    assert "row 0" in d.reason
    monkeypatch.setenv("SPECPARITY_ALLOW_INEXACT", "1")
    caplog.set_level("WARNING", logger="specparity.gate")
    f = gate_check(info.target, 4, trust_remote_code=True, depths=(0,), walk=0, probe=_refuse)
    assert f.allow and f.forfeit and f.hit
    assert any(r.message.startswith("specparity-gate: FORFEIT width=4") for r in caplog.records)


@pytest.mark.model
def test_not_run_declines(fixture_root):
    info = build(fixture_root, "llama-float32", arch="llama")
    d = gate_check(info.target, 1, depths=(0,), walk=0)
    assert d.verdict == "not_run" and not d.allow and "W < 2" in d.reason


def _writer(args):
    home, i = args
    import os

    os.environ["SPECPARITY_HOME"] = home
    store = GateStore()
    for j in range(10):
        store.put(f"key-{i}-{j}", {"verdict": "equal", "reason": "test", "fields": {}})
    return i


def test_concurrent_writers_lose_nothing(isolated_home):
    with mp.get_context("spawn").Pool(4) as pool:
        done = pool.map(_writer, [(str(isolated_home), i) for i in range(8)])
    assert sorted(done) == list(range(8))
    entries = GateStore().entries()
    assert len(entries) == 80
    assert all(f"key-{i}-{j}" in entries for i in range(8) for j in range(10))


@pytest.mark.model
def test_corrupt_store_is_reported_and_rebuilt(fixture_root, caplog):
    info = build(fixture_root, "llama-float32", arch="llama")
    path = store_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"version": 1, "entries": {"trunc')
    caplog.set_level("WARNING", logger="specparity.gate")
    d = gate_check(info.target, 2, depths=(0,), walk=0)
    assert d.allow and not d.hit
    assert any("STORE-CORRUPT" in r.message for r in caplog.records)
    assert list(path.parent.glob("store.json.corrupt-*"))  # kept aside, not lost
    assert json.loads(path.read_text())["entries"]


@pytest.mark.model
def test_cli_gate_exit_codes_and_lines(cli_bin: str, rows4_pair: FixtureInfo, llama_pair: FixtureInfo,
                                       isolated_home: Path) -> None:
    info, clean = rows4_pair, llama_pair
    env = {"SPECPARITY_HOME": str(isolated_home)}
    ok = run_cli(cli_bin, "gate", "check", "--model", clean.target, "--width", "2", env=env)
    assert ok.returncode == 0, ok.stderr
    assert "specparity-gate: ALLOW width=2" in ok.stderr
    bad = run_cli(cli_bin, "gate", "check", "--model", info.target, "--trust-remote-code",
                  "--width", "4", env=env)
    assert bad.returncode == 1 and "specparity-gate: DECLINE width=4" in bad.stderr
    t0 = time.perf_counter()
    hit = run_cli(cli_bin, "gate", "check", "--model", info.target, "--width", "4", "--json",
                  env=env)  # no --trust-remote-code needed: a hit never loads the model
    assert hit.returncode == 1 and json.loads(hit.stdout)["hit"] is True
    assert time.perf_counter() - t0 < 30
    missing = run_cli(cli_bin, "gate", "check", "--model", "/nope", "--width", "4", env=env)
    assert missing.returncode == 2 and "no such file" in missing.stderr


@pytest.mark.model
def test_width_and_prompt_cache_are_two_decisions_with_two_keys(fixture_root, monkeypatch, caplog):
    """The width decision holds no prefill parity (a drafter-less server prefills in chunks as
    much as a drafting one); prefill parity is the prompt-cache policy, keyed apart; both probe
    a model the caller already loaded, never a second copy."""
    import specparity.checkpoint as checkpoint
    from specparity.probes.gate import policy_key, prompt_cache_policy

    info = build(fixture_root, "llama-rows5", arch="llama",
                 faults=[{"kind": "rows", "layer": 2, "subop": "mlp", "min_rows": 5}])
    loaded = checkpoint.load_checkpoint(info.target, trust_remote_code=True)

    def no_second_copy(*_a, **_k):
        raise AssertionError("the gate loaded a second copy")

    monkeypatch.setattr(checkpoint, "load_checkpoint", no_second_copy)
    caplog.set_level("INFO", logger="specparity.gate")
    got = {w: gate_check(info.target, w, depths=(0,), walk=16, loaded=loaded) for w in (2, 4, 5)}
    assert got[2].allow and got[4].allow and not got[5].allow
    assert "prefill parity" not in got[4].reason and "width 5" in got[5].reason
    policy = prompt_cache_policy(info.target, loaded=loaded)
    assert policy.policy == "re-prefill" and policy.verdict == "divergent"
    assert policy.reason.startswith("prefill parity, prompt ")
    assert policy.line.startswith("specparity-gate: PROMPT-CACHE policy=re-prefill key=")
    key, fields = policy_key(info.target)
    assert key == policy.key and fields["decision"] == "prompt-cache" and "width" not in fields
    assert gate_key(info.target, 4)[1]["decision"] == "width"
    again = prompt_cache_policy(info.target, probe=_refuse)  # a hit: no probe, no load
    assert again.hit and again.policy == "re-prefill"
    clean = build(fixture_root, "llama-float32", arch="llama")
    assert prompt_cache_policy(clean.target, probe=lambda *a: ("equal", "x")).reuse
