"""yunshu 0.1.5 (issue 47): its server's qwen3_5 lane, DFlash drafter and MTP head, against classic decode, live.

yunshu needs Python 3.13 (its environment is built with it) and drafts only in its VLM lane (mlx-vlm's qwen3_5):
its fixture is the project's DFlash pair re-dressed as a Qwen3.5 VLM checkpoint with an MTP head inside
(``fixtures make --dflash qwen3_5 --drafter-format yunshu``). What each lane finds one request at a time (both
lanes, every request of the built-in job) is checked on the records of docs/engines.md's two served lines
(tests/yunshu_served.py, through the docs' AFTER hook: the suite starts those servers once). Here: its evidence
read from a response, and the concurrent arm those lines leave out: two requests at once fail (HTTP 500) on this
float32 checkpoint (a chat request says why: ``ragged_decode_attention: bf16 queries, bf16 or int8 K/V``).
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

ENV = "yunshu"


def test_yunshu_is_one_package_of_its_own() -> None:
    from test_engine_packages import test_each_builtin_engine_is_one_package_of_its_own

    test_each_builtin_engine_is_one_package_of_its_own("yunshu")


def test_the_evidence_fires_on_accepted_drafts_and_stays_silent_without() -> None:
    """An ``x_yunshu.speculative`` block with accepted drafts is engaged; drafts all rejected, no block (the lane
    off) or no ``x_yunshu`` at all are not (None where nothing can be told)."""
    from specparity.engines.yunshu.served import evidence

    def ev(raw: dict) -> Any:
        return evidence(None, SimpleNamespace(raw=raw), None)

    spec = {"mode": "dflash", "drafted": 43, "accepted": 12, "rounds": 20}
    assert ev({"x_yunshu": {"speculative": spec, "cached_tokens": 0}}).engaged is True
    assert ev({"x_yunshu": {"speculative": {**spec, "accepted": 0}}}).engaged is False
    off = ev({"x_yunshu": {"reasons": {"spec": "drafter_unavailable"}, "cached_tokens": 16}})
    assert off.engaged is False and off.cache == "warm"
    assert ev({}).engaged is None


@pytest.fixture(scope="module")
def fixture_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fixture_pairs import pair

    return Path(pair("yunshu-qwen3_5-b8", tmp_path_factory.mktemp("yunshu")).target).parent


def by_id(arm: dict) -> dict[str, dict]:
    return {r["id"]: r for r in arm["requests"]}


@pytest.mark.slow
@pytest.mark.build
@pytest.mark.server
@pytest.mark.model
def test_two_requests_at_once_fail_on_float32_and_a_stream_beside_them_is_answered(fixture_dir: Path, cli_bin: str,
                                                                                   tmp_path: Path) -> None:
    """The concurrent arm (docs/engines.md's served lines leave it out; tests/yunshu_served.py checks what they
    find): its DFlash lane, width 4, the sequence sent two at a time."""
    target, draft = fixture_dir / "target", fixture_dir / "draft"
    job = {"pairings": [{"name": "dflash", "target": str(target), "draft": str(draft), "profile": "yunshu"}],
           "widths": [4], "max_tokens": 32, "sequence": ["fresh", "repeat", "stream"], "concurrency": 2,
           "self_draft": False}
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(job))
    built(ENV)
    proc = run_cli(cli_bin, "served", "--config", str(config), "--json", cwd=str(tmp_path),
                   env={ENV_CACHE_VAR: str(REAL_CACHE)})
    assert proc.stdout.strip(), proc.stderr[-2000:]
    (pairing,) = json.loads(proc.stdout)["pairings"]
    arms = {a["name"]: a for a in pairing["arms"]}
    # two requests at once fail on float32 (errors: exit 4); the stream sent beside them is answered, and where it
    # shares a batch with them it leaves classic decode (diverged: exit 1): which it does is the scheduler's timing
    batch = by_id(arms["concurrent"])
    parted = [r for r in batch.values() if r["verdict"] == "diverged"]
    assert proc.returncode == (1 if parted else 4), [(r["id"], r["verdict"]) for r in batch.values()]
    assert {r["id"] for r in parted} <= {"p1-stream"}, parted
    assert batch["p0"]["verdict"] == "error" and "HTTP 500" in batch["p0"]["reason"], batch["p0"]
    assert batch["p1-stream"]["verdict"] in ("diverged", "match", "not_engaged"), batch["p1-stream"]
    # one request at a time, the same lane equals classic decode
    assert {r["verdict"] for r in arms["baseline-start"]["requests"]} == {"match"}
    assert {r["verdict"] for r in arms["w4"]["requests"]} == {"not_engaged"}
