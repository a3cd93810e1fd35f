"""vllm-mlx 0.6.0 (issue 47): its server's MTP against classic decode, live, in its pinned environments.

vllm-mlx drafts with the target's own MTP head (``--enable-mtp``, one draft per 2-row verify, in its batched
engine only). Its fixture is a ``qwen3_5`` target with the head in vllm-mlx's file
(``fixtures make --drafter-format vllm-mlx-mtp``), which its own loader injects and validates. What they pin,
MLX's CPU backend, 16 tokens of the built-in prompts (fresh, repeat, shared prefix):

- mlx-lm 0.31.3 (the only release its pins allow): its scheduler's MTP patch does not install
  (``[MTP] disabled: mlx-lm BatchGenerator lacks the _step hook``): every request of the drafted arm equals
  classic decode and is ``not_engaged`` with that line as its evidence, never a pass; sent three at once (its
  continuous batching, nothing drafted) the fresh prompt and its repeat leave classic decode at token 6;
- mlx-lm 0.30.7 (below its pins, where the patch installs): every drafted request fails in its engine loop
  (``TypeError: Model.__call__() got an unexpected keyword argument 'return_hidden'``: its injection patches the
  inner ``language_model``'s class, its scheduler calls the outer ``qwen3_5.Model``) and never completes: error,
  with the engine's own message;
- its evidence reader: engaged on a response's ``generation_metadata`` with accepted drafts, silent on one
  without, and on a server whose MTP is off.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from builds import REAL_CACHE, built
from conftest import run_cli
from specparity.environments import ENV_CACHE_VAR

ENV = "vllm-mlx"
ENV_0_30 = "vllm-mlx-mlx-lm-0.30.7"
MTP_OFF = "[MTP] disabled: mlx-lm BatchGenerator lacks the _step hook"


def test_vllm_mlx_is_one_package_of_its_own() -> None:
    from test_engine_packages import test_each_builtin_engine_is_one_package_of_its_own

    test_each_builtin_engine_is_one_package_of_its_own("vllm-mlx")


def _status_session(monkeypatch: pytest.MonkeyPatch, status: dict[str, Any] | None, log: Path) -> Any:
    import specparity.engines.vllm_mlx.served as served

    monkeypatch.setattr(served, "read_status", lambda url, timeout=served.STATUS_TIMEOUT: status)
    return SimpleNamespace(server=SimpleNamespace(url="http://127.0.0.1:1", log_path=log))


def test_the_evidence_fires_on_accepted_drafts_and_stays_silent_without(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    """The reader on the shapes vllm-mlx answers: a response's ``generation_metadata`` with accepted drafts is
    engaged; one without the block (no MTP activity) or with none accepted is not; a server whose /v1/status
    says ``mtp.enabled`` false is not engaged whatever the counters, its log's reason as the line."""
    import specparity.engines.vllm_mlx.served as served

    log = tmp_path / "server.log"
    log.write_text(f"INFO: loaded\nWARNING:vllm_mlx.scheduler:{MTP_OFF} required by the MTP monkey-patch\n")
    on = {"enabled": True, "attempted": 10, "accepted": 4, "rejected": 6}
    session = _status_session(monkeypatch, on, log)
    before = served.Mark({"enabled": True, "attempted": 0, "accepted": 0, "rejected": 0}, 0)

    def completion(meta: dict[str, Any] | None) -> Any:
        return SimpleNamespace(raw={"usage": {}} | ({"generation_metadata": meta} if meta is not None else {}))

    fired = served.evidence(session, completion({"mtp_drafts": 10, "mtp_accepted": 4}), before)
    assert fired.engaged is True and "generation_metadata: 10 MTP drafts, 4 accepted" in fired.lines
    none_accepted = served.evidence(session, completion({"mtp_drafts": 10, "mtp_accepted": 0}), before)
    assert none_accepted.engaged is False
    session = _status_session(monkeypatch, {"enabled": False}, log)
    off = served.evidence(session, completion(None), before)
    assert off.engaged is False and MTP_OFF in off.lines[0]
    assert served.max_width(str(tmp_path)) == 2


@pytest.fixture(scope="module")
def mtp_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The vllm-mlx MTP fixture (``fixtures make --dflash qwen3_5 --drafter-format vllm-mlx-mtp``'s builder)."""
    from fixture_cache import cached
    from specparity.engines.vllm_mlx.fixtures import build_vllm_mlx_mtp_target

    info = cached(build_vllm_mlx_mtp_target, tmp_path_factory.mktemp("vllm-mlx"), "vllm-mlx-mtp-qwen3_5")
    return Path(info.target)


@pytest.mark.build
@pytest.mark.model
def test_the_fixture_is_what_vllm_mlx_loads_as_an_mtp_target(mtp_target: Path) -> None:
    """vllm-mlx's own loader (``load_model_with_fallback``: mlx-lm's load, then its MTP injection) finds the
    head in ``mtp/weights.safetensors``, takes its norms as they are (the manifest) and validates the model."""
    import subprocess

    env = built(ENV)
    code = ("import json, logging; logging.basicConfig(level=logging.INFO);"
            " from vllm_mlx.utils.tokenizer import load_model_with_fallback;"
            " from vllm_mlx.patches.qwen3_5_mtp import validate_mtp_support;"
            f" m, t = load_model_with_fallback({str(mtp_target)!r});"
            " print(json.dumps({'mtp': validate_mtp_support(m), 'layers': len(m.language_model.mtp.layers)}))")
    proc = subprocess.run([str(env.python), "-P", "-c", code], capture_output=True, text=True, timeout=300,
                          env=dict(env.environ()))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"mtp": True, "layers": 1}
    assert "Converter manifest declares MLX RMSNorm gamma" in proc.stderr


def served_job(cli_bin: str, tmp_path: Path, target: Path, environment: str, **keys: Any) -> tuple[int, dict]:
    """``served --config JOB --json``: the target drafting with its own head at width 2, no stream request and no
    multi-turn (the fixture's tokenizer has no chat template, which vllm-mlx needs)."""
    job = {"pairings": [{"name": "qwen3_5-mtp", "target": str(target), "draft": str(target),
                         "profile": "vllm-mlx", "environment": environment}],
           "widths": [2], "max_tokens": 16, "sequence": ["fresh", "repeat", "shared-prefix"],
           "concurrency": 0, "self_draft": False, **keys}
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(job))
    built(environment)
    proc = run_cli(cli_bin, "served", "--config", str(config), "--json", cwd=str(tmp_path),
                   env={ENV_CACHE_VAR: str(REAL_CACHE)})
    assert proc.stdout.strip(), proc.stderr[-2000:]
    return proc.returncode, json.loads(proc.stdout)["pairings"][0]


def arms(pairing: dict) -> dict[str, dict]:
    return {a["name"]: a for a in pairing["arms"]}


@pytest.mark.slow
@pytest.mark.build
@pytest.mark.server
@pytest.mark.model
def test_on_its_only_mlx_lm_its_mtp_never_drafts_and_a_batch_leaves_classic_decode(mtp_target: Path, cli_bin: str,
                                                                                  tmp_path: Path) -> None:
    """mlx-lm 0.31.3: the server loads the head (``--enable-mtp``), its scheduler declines to patch mlx-lm's
    BatchGenerator, every drafted request sent alone equals classic decode without drafting: not_engaged, never a
    pass. The same server with the three requests sent at once (its continuous batching, no drafting) leaves
    classic decode at token 6 on the fresh prompt and its repeat where they share a batch: diverged, exit 1."""
    rc, pairing = served_job(cli_bin, tmp_path, mtp_target, ENV, concurrency=3)
    found = arms(pairing)
    batched = found["concurrent"]["requests"]
    # which of the three land in one batch is the scheduler's timing: those that do leave classic decode
    # (diverged, exit 1; token 6 of the fresh prompt and its repeat when they share one); with none batched every
    # answer matches it, and the undrafted w2 arm is the job's verdict (exit 3)
    parted = [r for r in batched if r["verdict"] != "match"]
    assert rc == (1 if parted else 3), pairing
    assert {r["verdict"] for r in parted} <= {"diverged"}, parted
    for base in ("baseline-start", "baseline-end"):
        assert {r["verdict"] for r in found[base]["requests"]} == {"match"}, found[base]
    drafted = found["w2"]["requests"]
    assert [r["verdict"] for r in drafted] == ["not_engaged"] * 3
    for r in drafted:
        assert r["reference"]["compared"] and r["sha256"] == r["reference"]["sha256"]
        assert MTP_OFF in r["evidence"]["lines"][0]
    for r in parted:
        assert "differs from classic decode: first difference at token" in r["reason"], r
    # its profile's stop: kill: every server ended by SIGKILL at once (its graceful shutdown writes nothing read),
    # and its stop is no longer a share of the job's time
    assert {a["server"]["returncode"] for a in pairing["arms"] if a.get("server")} == {-9}, pairing["arms"]
    assert pairing["time"]["server_stop_s"] < 1.0, pairing["time"]


@pytest.mark.slow
@pytest.mark.build
@pytest.mark.server
@pytest.mark.model
def test_below_its_pins_its_mtp_installs_and_every_drafted_request_fails(mtp_target: Path, cli_bin: str,
                                                                        tmp_path: Path) -> None:
    """mlx-lm 0.30.7 (installed over its pin without dependencies): the scheduler patches mlx-lm's
    BatchGenerator, and its first MTP step calls the outer qwen3_5 Model with ``return_hidden`` (only the inner
    language model was patched to take it): the engine loop fails every step, the request never completes, and
    the arm is an error naming the engine's TypeError (exit 4), never a pass. One request, a 15 s limit."""
    rc, pairing = served_job(cli_bin, tmp_path, mtp_target, ENV_0_30, sequence=["fresh"], request_timeout=15)
    found = arms(pairing)
    assert rc == 4, pairing
    assert found["baseline-start"]["verdict"] == "match"
    [drafted] = found["w2"]["requests"]
    assert drafted["verdict"] == "error"
    assert ("vllm-mlx engine loop error: Model.__call__() got an unexpected keyword argument 'return_hidden'"
            in drafted["reason"])
