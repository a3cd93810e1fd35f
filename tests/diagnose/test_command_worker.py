"""Step 8's reruns through one worker per pinned environment (specparity.diagnose.command_worker), on the real
mlx-lm environments scripts/build-env built: the same verdicts and evidence as each command run as its own
process, one worker per environment for every command, none left once the block ends, a worker that dies
replaced by the command's own process, and nothing a command prints reaching the protocol."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from builds import REAL_CACHE, built
from conftest import build, pid_alive

from specparity.environments import ENV_CACHE_VAR

RELEASES = ("mlx-lm-0.31.3", "mlx-lm-0.32.2")
ROWS = {"kind": "rows", "layer": 2, "subop": "mlp", "min_rows": 4, "scale": 1.5}
PROMPT = "Speculative decoding drafts several tokens with a small model and verifies them"


@pytest.fixture
def real_envs(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in RELEASES:
        built(name)
    monkeypatch.setenv(ENV_CACHE_VAR, str(REAL_CACHE))


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.build
def test_step_8_through_workers_says_what_each_command_alone_says_and_leaves_nothing_running(
        fixture_root: Path, real_envs: None) -> None:
    from specparity.diagnose.command_worker import command_workers, run_in_worker
    from specparity.diagnose.steps import releases

    fx = build(fixture_root, "llama-diag-rows", arch="llama", faults=[ROWS])
    base = (f"specparity replay --model {fx.target} --draft-model {fx.draft} --trust-remote-code --max-tokens 16"
            f" --prompt '{PROMPT}'")
    diverges, matches = f"{base} --num-draft-tokens 3", f"{base} --num-draft-tokens 2"  # the fault: 4+ rows
    alone = [releases(c) for c in (diverges, matches)]
    assert [s.verdict.value for s in alone] == ["divergent", "equal"], [s.evidence for s in alone]
    with command_workers() as workers:
        through = [releases(c) for c in (diverges, matches)]
        assert sorted(workers) == list(RELEASES)
        assert [(w.commands, w.failed) for w in workers.values()] == [(2, None), (2, None)]
        pids = [w.proc.pid for w in workers.values() if w.proc is not None]
        assert len(pids) == 2 and all(pid_alive(p) for p in pids)
        # a command printing on stdout (the worker's own descriptor 1) does not reach the answers
        assert run_in_worker(RELEASES[0], "mlx-lm", ["env", "list"], 60) == (0, "")
        assert releases(diverges).verdict.value == "divergent"
    for a, b in zip(alone, through):
        assert (a.verdict, a.evidence, a.command, a.data) == (b.verdict, b.evidence, b.command, b.data)
    assert not any(pid_alive(p) for p in pids)  # ended with the block

    # a worker that dies between commands: that command runs as its own process, the verdict the same
    with command_workers() as workers:
        releases(diverges)
        first = workers[RELEASES[0]]
        assert first.proc is not None
        os.killpg(first.proc.pid, signal.SIGKILL)
        again = releases(diverges)
        assert again.verdict.value == "divergent" and again.evidence == alone[0].evidence
        assert first.failed is not None and first.commands == 1 and workers[RELEASES[1]].commands == 2
