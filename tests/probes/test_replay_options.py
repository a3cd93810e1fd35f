"""The one replay loop's declared options (core.RoundOptions): both after-rollback checks at once, no forward more."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conftest import build
from specparity.checkpoint import load_checkpoint
from specparity.identity import device
from specparity.probes.engines.mlx_lm import MlxLmEngine
from specparity.probes.replay.core import (
    CHECK_OFFSETS,
    CHECK_STATE,
    FILL_ONE,
    START_PREFILL,
    RoundOptions,
    replay_accepts,
)

PROMPT = list(range(20, 36))  # 16 tokens
cpu_only = pytest.mark.skipif(device() != "cpu",
                              reason="pins the CPU backend's measured block/chain exactness")
pytestmark = pytest.mark.model


def _steps(trace: list) -> tuple[int, int]:
    """Classic single steps and verify blocks a traced replay ran."""
    return (sum(op[2] for op in trace if op[0] == "chain"),
            sum(1 for op in trace if op[0] in ("block", "restore")))


@cpu_only
def test_both_checks_on_a_clean_path_are_silent_and_add_no_forward(fixture_root: Path) -> None:
    """The served options with the whole state compared too: the chain runs ahead of each round's end (rejected
    rows' right tokens, the bracket), the state is still compared where the round ended, with no forward more."""
    eng = MlxLmEngine(load_checkpoint(build(fixture_root, "llama-float32", arch="llama").target))
    accepts, widths = [3, 0, 2, 1, 3, 0], [4] * 6
    served = RoundOptions.served()
    assert RoundOptions.for_adapter(eng) == served  # mlx-lm's adapter has anchor-prefill, layer-offsets, rewind-modes
    both = RoundOptions(served.start, served.fill, (CHECK_OFFSETS, CHECK_STATE), served.bracket)
    runs: dict[str, Any] = {}
    for name, opts in (("offsets", served), ("both", both)):
        trace: list = []
        runs[name] = (replay_accepts(eng, PROMPT, accepts, widths, opts, wrong_id=5, trace=trace), _steps(trace))
    res, steps = runs["both"]
    assert res.rounds == 6 and res.positions == sum(a + 1 for a in accepts) and res.disagreements == 0
    assert res.rewind_finding is None and res.findings.state is None and res.findings.token is None
    assert steps == runs["offsets"][1]  # the same classic steps and verify blocks
    assert res.target_tokens == runs["offsets"][0].target_tokens


@cpu_only
def test_both_checks_name_the_same_round_on_a_stale_trim(fixture_root: Path) -> None:
    """A trim that keeps one stale row: the offsets check and the state check both name round 2 (the first
    rollback), and the offsets finding stops the replay there."""
    info = build(fixture_root, "llama-stale-trim", arch="llama", faults=[{"kind": "stale_trim"}], with_draft=False)
    eng = MlxLmEngine(load_checkpoint(info.target, trust_remote_code=True))
    # the chain runs ahead of the rounds' ends with per-row wrong ids and the bracket: its state is kept there
    for opts in (RoundOptions("anchor", FILL_ONE, (CHECK_STATE, CHECK_OFFSETS)),
                 RoundOptions(START_PREFILL, FILL_ONE, (CHECK_STATE, CHECK_OFFSETS)),
                 RoundOptions("anchor", "wrong-id", (CHECK_STATE, CHECK_OFFSETS), bracket=True)):
        res = replay_accepts(eng, PROMPT, [3, 3, 1, 2], [4] * 4, opts)
        assert res.rewind_finding is not None and res.rewind_finding.round == 2
        assert res.findings.state is not None and (res.findings.state.round, res.findings.state.accepted) == (2, 1)
        assert res.findings.state.first.name == "offset" and res.rounds == 3
