"""The served job planned once: arm names, the count the observer shows, the shard plan, the arms
that run, and the engine's widest block applied to every drafted arm (the distribution's too).

Real parts: ServedRun against tests/fakeserver.py (a real server process on 127.0.0.1, real
HTTP), the packaged dflash-mlx profile and its real engine module. No model is loaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from specparity.harness.config import DistSpec, Job, Pairing
from specparity.harness.plan import (
    BASELINE_END,
    BASELINE_START,
    BUILTIN_ARM_NAMES,
    ArmKind,
    Drafter,
    is_builtin_arm_name,
    plan_arms,
)
from specparity.harness.profiles import Profile, load_profile
from specparity.harness.results import CLASSIC, format_groups
from specparity.harness.shard import Shard
from specparity.progress import Observer
from specparity.verdicts import Verdict

FAKE = str(Path(__file__).resolve().parents[1] / "fakeserver.py")


class Recording(Observer):
    """Every call the run makes on its observer, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def begin(self, part: str, total: int | None = None) -> None:
        self.calls.append(("begin", (part, total)))

    def item(self, part: str, n: int = 1) -> None:
        self.calls.append(("item", (part, n)))

    def end(self, part: str) -> None:
        self.calls.append(("end", part))

    def note(self, message: str) -> None:
        self.calls.append(("note", message))


def _checkpoint(path: Path, **config: Any) -> str:
    """A folder the harness takes for a checkpoint (the fake server loads nothing)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def _fake_profile(tmp_path: Path) -> str:
    prof = tmp_path / "fake.yaml"
    prof.write_text(yaml.safe_dump({
        "name": "fake", "argv": ["{python}", "-I", FAKE, "--model", "{model}", "--host", "{host}", "--port", "{port}"],
        "draft_argv": ["--draft-model", "{draft_model}", "--num-draft-tokens", "{num_draft}"]}))
    return str(prof)


def test_format_groups_counts_the_two_baselines_and_names_every_other_arm():
    # a control whose name starts with "baseline" is a drafted arm, never counted as a baseline
    g = [CLASSIC, BASELINE_START, "baseline-nocompile", BASELINE_END, "w2"]
    assert format_groups([g, ["w4"]]) == ("2 groups: {classic decode, baseline x2, baseline-nocompile, w2} {w4}")


def test_every_planned_arm_name_is_a_builtin_name_but_a_controls():
    from specparity.harness.config import Control

    job = Job([Pairing("p", "t", "d")], widths=[2, 4], concurrency=2, self_draft=True, repeats=2,
              controls=[Control("nocompile", {"MLX_DISABLE_COMPILE": "1"}, 4)], distribution=DistSpec(width=3))
    arms, _ = plan_arms(job, Profile("any", ["x"], draft_argv=["--d"]), drafts=True, self_drafts=True)
    names = [a.name for a in arms]
    assert names == [BASELINE_START, "w2", "w4", "self-draft", "concurrent", "nocompile", BASELINE_END, "repeat1",
                     "repeat2", "dist-baseline", "dist-w3"]
    assert [a.name for a in arms if not is_builtin_arm_name(a.name)] == ["nocompile"]
    assert all(is_builtin_arm_name(n) for n in BUILTIN_ARM_NAMES) and not is_builtin_arm_name("w2x")
    # the plan names which checkpoint drafts, the runner maps it to what it prepared
    assert {a.name: a.draft for a in arms if a.drafts} == {
        "w2": Drafter.DRAFT, "w4": Drafter.DRAFT, "self-draft": Drafter.TARGET, "nocompile": Drafter.DRAFT,
        "dist-w3": Drafter.DRAFT}
    assert [a.kind for a in arms[-2:]] == [ArmKind.DISTRIBUTION, ArmKind.DISTRIBUTION]


@pytest.mark.server
def test_progress_counts_the_arms_that_run_and_the_shard_plan_is_the_run(tmp_path):
    """A target that ships its own model_file on a profile that loads drafters unwrapped has no
    self-draft arm: the count the observer shows, the shard plan and the arms run all say so."""
    from specparity.harness.run import ARMS_PART, ServedRun

    target = _checkpoint(tmp_path / "own", model_type="llama", model_file="mine.py")
    draft = _checkpoint(tmp_path / "draft", model_type="llama")
    job = Job([Pairing("p", target, draft, _fake_profile(tmp_path))], widths=[2], max_tokens=2,
              sequence=["fresh"], self_draft=True, reference=False, start_timeout=60, request_timeout=30)
    obs = Recording()
    report = ServedRun(job, tmp_path / "work", observer=obs).run()
    ran = [a.name for a in report.pairings[0].arms]
    assert ran == [BASELINE_START, "w2", BASELINE_END]
    progress = [c for c in obs.calls if c[0] != "note"]
    assert progress == [("begin", (ARMS_PART, 3)), *[("item", (ARMS_PART, 1))] * 3, ("end", ARMS_PART)]
    notes = [c[1] for c in obs.calls if c[0] == "note"]
    assert [n for n in notes if n.startswith("arm ")] == [f"arm {i} of 3: p {a}" for i, a in enumerate(ran, 1)]
    assert any("no self-draft arm" in f for f in report.pairings[0].findings)

    sharded = ServedRun(job, tmp_path / "work2", shard=Shard(2, 2)).run()
    assert sharded.shard is not None and sharded.shard["plan"] == {"p": ran}
    assert sharded.shard["arms"] == {} and sharded.pairings == []  # w2, the one non-baseline arm, is shard 1's


def test_distribution_arms_wider_than_the_engine_takes_are_not_run(tmp_path):
    """dflash-mlx verifies at most its drafter's block_size: a drafter without one cannot draft, and
    the distribution arms say so (never clamped), as every drafted arm does; no server starts."""
    from specparity.harness.distribution import run_distribution
    from specparity.harness.run import PairingRun, ServedRun

    target = _checkpoint(tmp_path / "t", model_type="qwen3")
    draft = _checkpoint(tmp_path / "d", model_type="qwen3")  # no block_size: not a DFlash drafter
    job = Job([Pairing("p", target, draft, "dflash-mlx")], widths=[4], distribution=DistSpec(requests=50),
              reference=False)
    pr = PairingRun(ServedRun(job, tmp_path / "work"), job.pairings[0], load_profile("dflash-mlx"))
    dist = [a for a in pr.arms if a.kind == ArmKind.DISTRIBUTION]
    assert [a.name for a in dist] == ["dist-baseline", "dist-w4"]

    def no_server(session: object) -> None:
        raise AssertionError("a server was started for an arm the engine cannot run")

    pr.start = no_server  # type: ignore[method-assign]
    base, drafted = run_distribution(pr, dist)
    assert drafted.verdict == Verdict.NOT_RUN and "cannot draft with" in drafted.reason, drafted.reason
    assert base.verdict == Verdict.NOT_RUN and "dist-w4 is not run" in base.reason
    assert pr.too_wide(next(a for a in pr.arms if a.name == "w4")) == drafted.reason  # the greedy arm's reason


def test_a_server_argv_is_built_without_touching_its_files(tmp_path):
    from specparity.harness.run import PairingRun, ServedRun

    target = _checkpoint(tmp_path / "t", model_type="llama")
    job = Job([Pairing("p", target, target, _fake_profile(tmp_path))], widths=[2], reference=False)
    pr = PairingRun(ServedRun(job, tmp_path / "work"), job.pairings[0], load_profile(job.pairings[0].profile))
    plan = pr.arms[0]
    pr.work.mkdir(parents=True)
    witness = pr.work / f"witness-{plan.server_key}.log"
    witness.write_text("an earlier server's forwards\n")
    argv = pr.server_argv(plan)
    assert target in argv and witness.exists()  # the reference reads the argv; the file stays
    pr.new_session(plan)
    assert not witness.exists()  # a session starts with its own witness file


def test_a_missing_engine_is_a_usage_error_and_its_missing_dependency_a_bug(monkeypatch):
    import importlib

    from specparity.errors import UsageError
    from specparity.engines import served_hooks as load_engine

    with pytest.raises(UsageError, match="engine 'no_such_engine': no module"):
        load_engine("no_such_engine")

    def broken(name: str) -> None:
        raise ModuleNotFoundError("No module named 'a_dependency'", name="a_dependency")

    monkeypatch.setattr(importlib, "import_module", broken)
    with pytest.raises(ModuleNotFoundError, match="a_dependency"):  # not "no module ...engines.llama_cpp"
        load_engine("llama_cpp")
