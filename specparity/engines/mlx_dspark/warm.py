"""mlx-dspark's first start on a machine, done once before the tests (``scripts/warm-engines``).

mlx-dspark 0.20.3 calibrates its kernels when it loads a checkpoint on a machine it has not met
(small-M matmul, split SDPA, multi-row attention, prefill wide-GEMM and CPU co-prefill, memory
bandwidth): about a minute on 2 cores (46-53 s here; 150 s inside a test), filed in
~/.cache/mlx_dspark/calibration.json under keys made of the machine, the mlx version, the
checkpoints' folder names and their attention shapes. Without this step the first test that starts
``mlx-dspark serve`` pays it (150 s instead of 16 s on a 2-core machine). :func:`warm` starts the
server once in each mode the tests start it in, as the ``mlx-dspark`` profile starts it (its baseline
arm; a drafted arm), on the project's DSpark fixture (folders ``target`` and ``draft``, as every DSpark
fixture the tests build), and files which keys it saw in the mlx-dspark environment's folder: a later
run that finds every one of them in the calibration file returns at once (:func:`is_warm`).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def calibration_file() -> Path:
    """mlx-dspark's calibration file (its calibrate.CACHE_DIR: under the home directory)."""
    return Path.home() / ".cache" / "mlx_dspark" / "calibration.json"


def calibrated() -> set[str]:
    """The keys mlx-dspark's calibration file holds (none when it is missing or unreadable)."""
    try:
        return set(json.loads(calibration_file().read_text()))
    except (OSError, ValueError):
        return set()


def stamp(env: Any) -> Path:
    """Where the keys a warm run of ``env`` (the built mlx-dspark environment) saw are filed: in the
    environment's own folder, so a rebuilt environment is warmed again."""
    return env.path / "specparity-warm.json"


def is_warm(env: Any) -> bool:
    """Whether a warm run of ``env`` filed its keys and the calibration file still holds each."""
    try:
        wanted = set(json.loads(stamp(env).read_text()))
    except (OSError, ValueError):
        return False
    return bool(wanted) and wanted <= calibrated()


def warm(env: Any) -> int:
    """Start ``mlx-dspark serve`` once per arm its profile starts (baseline; drafted) on a DSpark fixture, so it
    calibrates; file the keys it saw in ``env``'s folder. 0 when done (or already warm), 4 when it filed nothing."""
    import httpx

    from specparity.fixtures.dspark import build_dspark_pair
    from specparity.harness.lifecycle import Server
    from specparity.harness.profiles import load_profile

    profile = load_profile("mlx-dspark")
    if is_warm(env):
        return 0
    print(f"warm-engines: mlx-dspark: calibrating its kernels on this machine ({calibration_file()}; once)",
          file=sys.stderr)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="warm-mlx-dspark-") as tmp:
        pair = build_dspark_pair(Path(tmp) / "pair")
        baseline = profile.render(profile.argv, model=pair.target, python=env.python)
        w = profile.width(3)
        drafted = baseline + profile.render(profile.draft_argv, draft_model=pair.draft, num_draft=w.setting,
                                            width=w.rows, python=env.python)
        for argv in (baseline, drafted):
            with Server(argv, env=dict(env.environ()), ready_path=profile.ready_path, start_timeout=900,
                        name="mlx-dspark") as srv:
                r = httpx.post(f"{srv.url}/v1/completions", timeout=300,
                               json={"prompt": "def add(a, b):", "max_tokens": 4, "temperature": 0})
                r.raise_for_status()
    seen = calibrated()
    if not seen:
        print(f"warm-engines: mlx-dspark: started, but {calibration_file()} holds no calibration", file=sys.stderr)
        return 4
    filed = stamp(env)
    filed.parent.mkdir(parents=True, exist_ok=True)
    filed.write_text(json.dumps(sorted(seen)) + "\n")
    print(f"warm-engines: mlx-dspark: calibrated in {time.monotonic() - t0:.0f} s ({len(seen)} entries)",
          file=sys.stderr)
    return 0


