"""An unreadable gate store is moved aside, reported once and rebuilt;
``gate list`` reads it without moving anything."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli
from specparity.probes.gate import GateStore, gate_check, gate_key, gate_probe_spec, store_path

GOOD = {"verdict": "equal", "reason": "r", "fields": {}}

BROKEN = {
    "not-utf8": b'\xff\xfe{"version": 1',
    "string-entry": None,  # filled per key below
    "no-verdict": None,
    "unknown-verdict": None,
    "entries-not-object": json.dumps({"version": 1, "entries": []}).encode(),
    "deep": b"[" * 100000,
}


def _store_bytes(kind: str, key: str) -> bytes:
    raw = BROKEN[kind]
    if raw is not None:
        return raw
    entry = {"string-entry": "not an entry", "no-verdict": {"reason": "x"},
             "unknown-verdict": {"verdict": "maybe", "reason": "x"}}[kind]
    return json.dumps({"version": 1, "entries": {key: entry, "other": GOOD}}).encode()


def _fake_probe(*_a, **_k):
    return "equal", "probed"


@pytest.mark.model
@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_a_broken_store_is_set_aside_reported_once_and_rebuilt(llama_pair, caplog, kind):
    key, _ = gate_key(llama_pair.target, 2, probe_spec=gate_probe_spec((0,), 0))
    path = store_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    original = _store_bytes(kind, key)
    path.write_bytes(original)
    caplog.set_level("WARNING", logger="specparity.gate")
    d = gate_check(llama_pair.target, 2, depths=(0,), walk=0, probe=_fake_probe)
    assert d.allow and d.reason == "probed" and not d.hit
    reports = [r.message for r in caplog.records if "STORE-CORRUPT" in r.message]
    assert len(reports) == 1, reports
    aside = list(path.parent.glob("store.json.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == original  # kept, byte for byte
    entries = json.loads(path.read_text())["entries"]
    assert entries[key]["reason"] == "probed"
    if kind in ("string-entry", "no-verdict", "unknown-verdict"):
        assert entries["other"] == GOOD  # the readable entries survive the rebuild
    again = gate_check(llama_pair.target, 2, depths=(0,), walk=0, probe=_fake_probe)
    assert again.hit
    assert len([r for r in caplog.records if "STORE-CORRUPT" in r.message]) == 1


def test_set_aside_copies_from_the_same_second_are_all_kept(monkeypatch):
    import time as real_time

    monkeypatch.setattr("specparity.probes.gate.time.time", lambda: 1_700_000_000.0)
    store = GateStore()
    store.path.parent.mkdir(parents=True, exist_ok=True)
    for i in range(3):
        store.path.write_text(f"broken {i}")
        assert store.entries() == {}
    kept = sorted(p.read_text() for p in store.path.parent.glob("store.json.corrupt-*"))
    assert kept == ["broken 0", "broken 1", "broken 2"]
    assert real_time.time() > 0


def test_gate_list_reads_without_moving(cli_bin, isolated_home):
    path = store_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = json.dumps({"version": 1, "entries": {"a" * 64: GOOD, "b" * 64: "junk"}})
    path.write_text(raw)
    r = run_cli(cli_bin, "gate", "list", env={"SPECPARITY_HOME": str(isolated_home)})
    assert r.returncode == 0, r.stderr
    assert "STORE-CORRUPT" in r.stderr and r.stderr.count("\n") == 1
    assert "aaaaaaaaaaaa  width=None  equal" in r.stdout
    assert path.read_text() == raw and not list(path.parent.glob("store.json.corrupt-*"))
    path.write_bytes(b"\xff\xfe")
    r = run_cli(cli_bin, "gate", "list", "--json", env={"SPECPARITY_HOME": str(isolated_home)})
    assert r.returncode == 0 and json.loads(r.stdout)["entries"] == {} and "not UTF-8" in r.stderr
    clean = GateStore()
    path.unlink()
    clean.put("k", GOOD)
    r = run_cli(cli_bin, "gate", "list", env={"SPECPARITY_HOME": str(isolated_home)})
    assert r.returncode == 0 and r.stderr == ""


@pytest.mark.model
def test_gate_list_names_each_entrys_decision(llama_pair, cli_bin, isolated_home):
    """One entry of each decision: ``width=N`` for a width's verdict, ``prompt-cache`` for the policy."""
    from specparity.probes.gate import prompt_cache_policy

    width = gate_check(llama_pair.target, 3, depths=(0,), walk=0, probe=_fake_probe)
    policy = prompt_cache_policy(llama_pair.target, probe=lambda *_a: ("divergent", "chunked differs"))
    assert policy.policy == "re-prefill"
    r = run_cli(cli_bin, "gate", "list", env={"SPECPARITY_HOME": str(isolated_home)})
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert sorted(r.stdout.splitlines()) == sorted([
        f"{width.key[:12]}  width=3  equal     probed",
        f"{policy.key[:12]}  prompt-cache  divergent chunked differs"])
