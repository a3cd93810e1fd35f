"""What users type for --model: a directory, a Hugging Face repo id (hub cache first), nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import run_cli

pytestmark = pytest.mark.model

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _hub_cache(root, repo_id, checkpoint):
    """The local hub cache layout huggingface_hub writes: refs/main -> snapshots/<commit>/."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / COMMIT
    shutil.copytree(checkpoint, snap)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    return snap


def test_resolver_kinds(tmp_path, monkeypatch, llama_pair):
    from specparity.errors import InfrastructureError
    from specparity.resolve import is_repo_id, resolve_checkpoint

    assert is_repo_id("mlx-community/Qwen3-0.6B-4bit")
    assert not is_repo_id("./models/x") and not is_repo_id("/abs/x") and not is_repo_id("a/b/c")
    assert resolve_checkpoint(llama_pair.target) == type(resolve_checkpoint(llama_pair.target))(llama_pair.target)
    hub = tmp_path / "hub"
    snap = _hub_cache(hub, "specparity/tiny-llama", llama_pair.target)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import importlib

    import huggingface_hub.constants as c

    importlib.reload(c)
    try:
        assert resolve_checkpoint("specparity/tiny-llama").resolve() == snap.resolve()
        with pytest.raises(InfrastructureError, match="specparity/not-there.*hub cache"):
            resolve_checkpoint("specparity/not-there")
    finally:
        monkeypatch.undo()
        importlib.reload(c)


def test_cli_probe_by_hub_id_offline_and_a_clear_error_when_neither_cached_nor_reachable(
        tmp_path, cli_bin, llama_pair):
    hub = tmp_path / "hub"
    _hub_cache(hub, "specparity/tiny-llama", llama_pair.target)
    env = {"HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1"}
    r = run_cli(cli_bin, "probe", "--model", "specparity/tiny-llama", "--widths", "2", "--depths", "0",
                "--walk", "0", "--no-prefill", "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["model"]["path"].endswith(COMMIT)

    r = run_cli(cli_bin, "probe", "--model", "specparity/missing", env=env)
    assert r.returncode == 4
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: --model specparity/missing:"), r.stderr
    assert "hub cache" in lines[0]

    # not offline, but the hub is unreachable: the download is tried, fails fast, and is named
    env = {"HF_HUB_CACHE": str(hub), "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "0",
           "HF_HUB_ETAG_TIMEOUT": "2", "HF_HUB_DOWNLOAD_TIMEOUT": "2"}
    r = run_cli(cli_bin, "gate", "check", "--model", "specparity/missing", "--width", "2", env=env)
    assert r.returncode == 4, r.stderr
    assert "Error: --model specparity/missing:" in r.stderr and "unreachable" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.server
@pytest.mark.slow
def test_served_resolves_hub_ids_like_every_command(tmp_path, cli_bin, llama_pair):
    """served --model / --draft-model and a job file's pairings take hub ids (the one resolver, offline),
    and the servers load what they resolve to."""
    import yaml

    hub = tmp_path / "hub"
    target = _hub_cache(hub, "specparity/tiny-llama", llama_pair.target)
    draft = _hub_cache(hub, "specparity/tiny-draft", llama_pair.draft)
    env = {"HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1"}
    cfg = tmp_path / "job.yaml"
    cfg.write_text(yaml.safe_dump({"pairings": [{"name": "hub", "target": "specparity/tiny-llama",
                                                 "draft": "specparity/tiny-draft"}],
                                   "widths": [2], "max_tokens": 4, "sequence": ["fresh"]}))
    r = run_cli(cli_bin, "served", "--config", str(cfg), "--json", env=env, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)["pairings"][0]
    assert p["target"] == str(target.resolve()) and p["draft"] == str(draft.resolve())
    assert p["verdict"] == "match"
    # the same ids as --model / --draft-model (a job file without pairings: the flags give its one)
    flags = tmp_path / "flags.yaml"
    flags.write_text(yaml.safe_dump({"widths": [2], "max_tokens": 4, "sequence": ["fresh"], "self_draft": False,
                                     "concurrency": 0}))
    r = run_cli(cli_bin, "served", "--config", str(flags), "--model", "specparity/tiny-llama", "--draft-model",
                "specparity/tiny-draft", "--json", "--record-dir", str(tmp_path / "rec"), env=env, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)["pairings"][0]
    assert (p["name"], p["target"], p["draft"]) == ("cli", str(target.resolve()), str(draft.resolve()))
    argv = next(a for a in p["arms"] if a["name"] == "w2")["server"]["argv"]
    # what the server loaded (its files kept by the record): the drafter as resolved, the target
    # through its witness wrapper's links
    assert argv[argv.index("--draft-model") + 1] == str(draft.resolve())
    served_target = Path(argv[argv.index("--model") + 1])
    assert (served_target / "model.safetensors").resolve() == (target / "model.safetensors").resolve()
    r = run_cli(cli_bin, "served", "--model", "specparity/tiny-llama", "--draft-model", "specparity/missing",
                env=env, cwd=str(tmp_path))
    assert r.returncode == 4 and r.stderr.count("\n") == 1
    assert r.stderr.startswith("Error: --draft-model specparity/missing: not a local directory")
