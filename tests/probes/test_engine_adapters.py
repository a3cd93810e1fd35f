"""The engine adapter interface, through mlx-lm's adapter: clean paths equal, injected faults named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conftest import assert_report, build
from specparity.checkpoint import load_checkpoint
from specparity.identity import device
from specparity.probes.engines.mlx_lm import MlxLmEngine
from specparity.probes.forward.engine import probe_engine
from specparity.probes.replay.engine import check_engine_run, replay_engine

PROMPT = list(range(20, 36))  # 16 tokens
cpu_only = pytest.mark.skipif(device() != "cpu",
                              reason="pins the CPU backend's measured block/chain exactness")
pytestmark = pytest.mark.model


def _engine(info: Any, trust: bool = False) -> Any:
    return MlxLmEngine(load_checkpoint(info.target, trust_remote_code=trust))


@cpu_only
def test_mlx_lm_adapter_is_silent_on_a_clean_path(fixture_root: Path) -> None:
    """Block, every rollback and the prefill through mlx-lm's adapter equal classic decode."""
    eng = _engine(build(fixture_root, "llama-float32", arch="llama"))
    rep = probe_engine(eng, [2, 4], [0, 5], [PROMPT])
    assert_report(rep)
    assert rep.verdict == "equal" and rep.exit_code == 0
    assert [c.verdict for c in rep.cells] == ["equal"] * 4
    assert len(rep.rollbacks) == 2 * (2 + 4) and {r.verdict for r in rep.rollbacks} == {"equal"}
    assert [p.verdict for p in rep.prefill] == ["equal"]
    assert rep.bracket is not None and rep.bracket.reproducible
    rr = replay_engine(eng, PROMPT, [3, 0, 2, 1, 3], [4] * 5)
    assert rr.verdict == "equal" and rr.positions == 1 + sum(a + 1 for a in [3, 0, 2, 1, 3])
    assert rr.token is None and rr.row is None and rr.state is None


@cpu_only
def test_a_token_past_max_tokens_is_a_finding_for_any_adapter(fixture_root: Path) -> None:
    """Classic decode stops at max_tokens: an engine run that emits more diverges at the first token past it,
    whichever adapter ran it (mlx-lm's here, its run asked for 9 and judged as asked for 8); the same run
    judged at its own length matches."""
    info = build(fixture_root, "llama-float32", arch="llama")
    eng = MlxLmEngine(load_checkpoint(info.target), load_checkpoint(str(info.draft)), num_draft_tokens=3)
    run = eng.generate(PROMPT, 9)
    assert len(run.tokens) == 9 and run.max_tokens is None  # this adapter does not say its limit
    clean = check_engine_run(eng, run, replay=False, max_tokens=9)
    assert clean.verdict == "equal" and clean.token is None, clean.lines()
    over = check_engine_run(eng, run, replay=False, max_tokens=8)
    assert over.verdict == "divergent" and over.token is not None, over.lines()
    assert (over.token.emitted_index, over.token.past_max_tokens) == (8, 8)


@cpu_only
def test_stale_trim_fires_at_the_first_rollback_and_names_every_layer(fixture_root: Path) -> None:
    """A cache trim that keeps one stale row: the rollback detector names width, accept and layer."""
    info = build(fixture_root, "llama-stale-trim", arch="llama", faults=[{"kind": "stale_trim"}], with_draft=False)
    eng = _engine(info, True)
    rep = probe_engine(eng, [4], [0], [PROMPT])
    assert [c.verdict for c in rep.cells] == ["equal"]  # the verify forward itself is right
    by_k = {r.accepted: r for r in rep.rollbacks}
    assert [by_k[k].verdict for k in range(4)] == ["divergent"] * 3 + ["equal"]  # k = 3: nothing rolled back
    first = by_k[0].first
    assert first is not None and first.name == "offset" and first.layer == 0
    assert first.note == "offset 16 vs 17"  # classic holds 16 positions, the engine one stale row more
    assert by_k[0].layers == list(range(6))
    assert "divergent at accepted 0-2; equal at accepted 3" in "\n".join(rep.lines())
    # replayed: rounds 0 and 1 accept everything, round 2 is the first rollback
    rr = replay_engine(eng, PROMPT, [3, 3, 1, 2], [4] * 4)
    assert rr.state is not None and (rr.state.round, rr.state.accepted) == (2, 1)
    assert rr.state.first.name == "offset" and rr.state.rounds_differing == 2
    assert rr.verdict == "divergent"


def test_engine_errors_are_one_line_with_their_exit_code(cli_bin: str, tmp_path: Path) -> None:
    """--accepted without an engine, or several --prompt-ids for a replayed vector, is usage (2); a missing
    engine interpreter is infrastructure (4)."""
    import importlib.util

    from conftest import run_cli

    proc = run_cli(cli_bin, "bisect", "--width", "4", "--accepted", "2")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "Error: --accepted rolls back an engine's block: give --engine"
    # several prompts are for an engine's own run only (one request each); a replayed vector has one prompt
    several = ("--prompt-ids", "1,2,3", "--prompt-ids", "4,5,6")
    for args in (("--accepts", "1,2"), ("--engine", "dflash-mlx", "--accepts", "1,2")):
        proc = run_cli(cli_bin, "replay", *args, *several)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip() == ("Error: give one --prompt-ids: several are for an engine's own run"
                                       " (--engine without --accepts or --log)")
    if importlib.util.find_spec("dflash_mlx") is not None:
        return  # in process here: no environment is looked for
    proc = run_cli(cli_bin, "probe", "--engine", "dflash-mlx", "--model", str(tmp_path),
                   env={"SPECPARITY_DFLASH_MLX_PYTHON": str(tmp_path / "no-python")})
    assert proc.returncode == 4
    assert proc.stderr.strip().splitlines()[-1] == (
        f"Error: SPECPARITY_DFLASH_MLX_PYTHON={tmp_path / 'no-python'}: no such interpreter")


@cpu_only
@pytest.mark.parametrize("faults", [[], [{"kind": "stale_trim"}]], ids=["clean", "stale-trim"])
def test_the_replay_of_an_engine_run_reuses_its_walks_classic_decode_and_finds_the_same(
        fixture_root: Path, faults: list) -> None:
    """check_engine_run's accept-vector replay takes classic decode's rows, picks and states from the walk of
    the engine's run where the histories agree: on a clean run it decodes almost nothing of its own, and it
    reports exactly what a replay decoding everything again reports (a stale trim: the same round, state and
    layers; where the engine's tokens left classic decode's, the replay decodes its own classic chain)."""
    from specparity.decode import Decoder
    from specparity.probes.replay.engine import check_engine_run

    info = build(fixture_root, f"llama-reuse-{len(faults)}", arch="llama", faults=faults)
    eng = MlxLmEngine(load_checkpoint(info.target, trust_remote_code=True), draft=info.draft)
    run = eng.generate(PROMPT, 24)
    assert run.rounds and run.tokens
    fed: list[tuple[int, ...]] = []
    orig, sessions, make_session = Decoder.forward, [], eng.session

    def session() -> Any:
        sessions.append(make_session())
        return sessions[-1]

    eng.session = session  # type: ignore[method-assign]

    def counted(self: Any, tokens: list[int], **kwargs: Any) -> Any:
        if not any(self is s.dec for s in sessions):  # classic decode's forwards, not the engine's verify
            fed.append(tuple(tokens))
        return orig(self, tokens, **kwargs)

    def forwards(fn: Any) -> tuple[Any, int]:
        fed.clear()
        Decoder.forward = counted  # type: ignore[method-assign,assignment]
        try:
            return fn(), len(fed)
        finally:
            Decoder.forward = orig  # type: ignore[method-assign]

    reused, n_reused = forwards(lambda: check_engine_run(eng, run))
    _, n_walk = forwards(lambda: check_engine_run(eng, run, replay=False))
    again, n_again = forwards(lambda: replay_engine(eng, run.prompt, run.accepts, run.widths))
    assert reused.replay is not None and n_reused <= n_walk + n_again
    if reused.token is None:  # the engine's tokens are classic decode's: the replay decodes little of its own
        assert n_reused <= n_walk + 2 < n_walk + n_again, (n_reused, n_walk, n_again)

    def same(d: dict) -> dict:
        return {k: v for k, v in d.items() if k != "seconds"}

    assert same(reused.replay.to_dict()) == same(again.to_dict())
    if faults:
        assert reused.replay.state is not None and reused.replay.verdict == "divergent"
