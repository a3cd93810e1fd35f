"""scripts/warm-engines: an engine's first-start work on a machine (mlx-dspark's kernel calibration) is done
before the tests, and a machine where it is done is recognized without starting anything."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from builds import REAL_CACHE, engine_warmth, warmed

from specparity.environments import ENV_CACHE_VAR


def test_warm_only_when_every_key_the_warm_run_saw_is_still_calibrated(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = engine_warmth("mlx-dspark")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    env = SimpleNamespace(path=tmp_path / "envs" / "mlx-dspark-0123456789ab")
    calibration = mod.calibration_file()
    assert calibration == tmp_path / "home" / ".cache" / "mlx_dspark" / "calibration.json"
    assert not mod.is_warm(env)  # no warm run filed
    stamp = mod.stamp(env)
    assert stamp.parent == env.path  # rebuilt (another digest): warmed again
    stamp.parent.mkdir(parents=True)
    stamp.write_text(json.dumps(["v5|cpu|bw", "v5|cpu|smallm|target|draft|ctx512"]))
    assert not mod.is_warm(env)  # filed, but mlx-dspark's file is gone (a cleaned cache)
    calibration.parent.mkdir(parents=True)
    calibration.write_text(json.dumps({"v5|cpu|bw": {}}))
    assert not mod.is_warm(env)  # one of its entries is missing: the server would calibrate again
    calibration.write_text(json.dumps({"v5|cpu|bw": {}, "v5|cpu|smallm|target|draft|ctx512": {}, "other": 1}))
    assert mod.is_warm(env)
    calibration.write_text("{not json")
    assert not mod.is_warm(env)
    stamp.write_text("[]")  # a run that saw nothing proves nothing
    calibration.write_text(json.dumps({"v5|cpu|bw": {}}))
    assert not mod.is_warm(env)


@pytest.mark.build
def test_a_second_run_on_a_warm_machine_starts_nothing(repo_root: Path) -> None:
    warmed("mlx-dspark")  # warm here (under CI: scripts/warm-engines ran before the tests)
    proc = subprocess.run([str(repo_root / "scripts" / "warm-engines")], capture_output=True, text=True,
                          timeout=120, env={**os.environ, ENV_CACHE_VAR: str(REAL_CACHE)})
    assert proc.returncode == 0 and proc.stderr == "" and proc.stdout == "", proc.stderr
