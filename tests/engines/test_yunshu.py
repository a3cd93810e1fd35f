"""yunshu 0.1.5 (issue 47): its server's qwen3_5 lane, DFlash drafter and MTP head, against classic decode, live.

yunshu needs Python 3.13 (its environment is built with it) and drafts only in its VLM lane (mlx-vlm's qwen3_5):
its fixture is the project's DFlash pair re-dressed as a Qwen3.5 VLM checkpoint with an MTP head inside
(``fixtures make --dflash qwen3_5 --drafter-format yunshu``). What the served job pins, MLX's CPU backend, the
float32 block-8 fixture, width 4, 32 tokens of the built-in job's requests (both profiles, one job):

- the baseline arms (``YUNSHU_VLM_DRAFT=off``: its lane's plain decode) equal classic decode on the fresh
  prompt and its repeat; the drafted arms (DFlash, MTP head) equal it too, their ``x_yunshu.speculative`` block
  says they drafted (mode, drafted > 0), and with nothing accepted on these prompts they read ``not_engaged``;
- a streamed request is refused (HTTP 400, ``body.model: Field required``: the harness adds no field to one);
- the first chat turn leaves classic decode at token 0 in every arm, the baseline's too (not the drafter);
- two requests at once fail (HTTP 500) on this float32 checkpoint (a chat request says why:
  ``ragged_decode_attention: bf16 queries, bf16 or int8 K/V``).
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
    from specparity.engines.yunshu.fixtures import build_yunshu_fixture

    return Path(build_yunshu_fixture(tmp_path_factory.mktemp("yunshu") / "fx", block_size=8).target).parent


def by_id(arm: dict) -> dict[str, dict]:
    return {r["id"]: r for r in arm["requests"]}


@pytest.mark.slow
@pytest.mark.build
@pytest.mark.server
@pytest.mark.model
def test_served_dflash_and_mtp_lanes_against_classic_decode(fixture_dir: Path, cli_bin: str, tmp_path: Path) -> None:
    target, draft = fixture_dir / "target", fixture_dir / "draft"
    job = {"pairings": [{"name": "dflash", "target": str(target), "draft": str(draft), "profile": "yunshu"},
                        {"name": "mtp", "target": str(target), "draft": str(target), "profile": "yunshu-mtp"}],
           "widths": [4], "max_tokens": 32, "sequence": ["fresh", "repeat", "stream", "multi-turn"],
           "concurrency": 2, "self_draft": False}
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(job))
    built(ENV)
    proc = run_cli(cli_bin, "served", "--config", str(config), "--json", cwd=str(tmp_path),
                   env={ENV_CACHE_VAR: str(REAL_CACHE)})
    assert proc.stdout.strip(), proc.stderr[-2000:]
    pairings = json.loads(proc.stdout)["pairings"]
    # two requests at once fail on float32 (errors: exit 4); the stream sent beside them is answered, and where it
    # shares a batch with them it leaves classic decode (diverged: exit 1): which it does is the scheduler's timing
    batched = [r for p in pairings for a in p["arms"] if a["name"] == "concurrent" for r in a["requests"]]
    parted = [r for r in batched if r["verdict"] == "diverged"]
    assert proc.returncode == (1 if parted else 4), [(r["id"], r["verdict"]) for r in batched]
    assert {r["id"] for r in parted} <= {"p1-stream"}, parted
    for pairing, mode in zip(pairings, ("dflash", "mtp"), strict=True):
        arms = {a["name"]: a for a in pairing["arms"]}
        for name in ("baseline-start", "baseline-end"):
            got = by_id(arms[name])
            assert got["p0"]["verdict"] == got["p0-again"]["verdict"] == "match"
            # its chat content is classic decode's text stripped of the whitespace around it: named, not a divergence
            chat = got["chat-1"]
            assert chat["verdict"] == "match", chat
            assert "stripped of the whitespace around it" in chat["reference"]["detokenized"], chat["reference"]
            assert chat["reference"]["detokenized_with_drafter_only"] is False
        drafted = by_id(arms["w4"])
        for rid in ("p0", "p0-again"):
            assert drafted[rid]["verdict"] == "not_engaged", drafted[rid]
            assert f"mode {mode}, 0 of" in drafted[rid]["evidence"]["lines"][0]
        # a stream names the model as every request does (profile `request`), and is served: its chunks carry no
        # x_yunshu block, so nothing says the lane drafted it
        stream = drafted["p1-stream"]
        assert stream["verdict"] == "not_engaged" and stream["reason"].startswith("equals classic decode"), stream
        assert drafted["chat-1"]["verdict"] in ("match", "not_engaged"), drafted["chat-1"]
        assert "stripped of the whitespace around it" in drafted["chat-1"]["reference"]["detokenized"]
        batch = by_id(arms["concurrent"])
        assert batch["p0"]["verdict"] == "error" and "HTTP 500" in batch["p0"]["reason"]
