"""The decision tree for a finding whose reproduction is another engine's own loop (``replay --engine NAME``).

mlx-lm's path is rerun in this process (:mod:`specparity.diagnose.tree`); an engine of the registry runs in its
own pinned environment, so each step here is a ``specparity`` command run as the user would run it (the command
goes to the engine's environment by itself), its ``--json`` read:

1. reproduce: the record's own command: the engine's loop walked against classic decode (its emitted tokens,
   kept rows and whole state after every rollback), then its accept vector replayed through the engine's
   verify and rollback alone (the target side); reproduced where the first differing token is the served one;
2. prefill: the engine's own prefill of the prompt against classic decode's (its last row and every layer's
   state), read from step 3's probe, which checks it;
3. verify block: ``probe --engine NAME --no-rollback`` at the engine's width and the depth of the round where
   the walk first differs: the engine's verify forward against the chain;
4. rollbacks: the same probe with every rollback of that block (to each accept k, the engine's state against
   classic decode's over the k + 1 kept tokens), and the walk's own state after each of its rollbacks;
5. bisect: ``bisect --engine NAME`` of that block (``--accepted K`` where a rollback's state differs): the first
   layer, sub-op or cache tensor that differs;
6. control arms: step 5's command rerun with mlx's compiled kernels off (``MLX_DISABLE_COMPILE=1``);
7. first difference: classic decode's pick where the walk's first token differs (an exact tie, a near tie);
8. across releases: step 1's command in each built pinned environment of the engine.
"""

from __future__ import annotations

import shlex
from typing import Any

from specparity.diagnose.findings import Finding
from specparity.diagnose.steps import (
    PREFILL, RAN, ROLLBACK, SERVER, SKIPPED, TIE, UNDETERMINED, VERIFY, Diagnosis, Step, first_difference, releases,
    run_command, verdict_of)
from specparity.verdicts import Verdict

# the reproduction's flags every later command of the engine takes as they are
_CARRIED = ("--engine", "--model", "--draft-model", "--verify-mode", "--prompt-ids")
_FLAGS = ("--trust-remote-code",)


def engine_named(argv: list[str]) -> str | None:
    """The engine a replay's arguments name other than mlx-lm (None: mlx-lm's own path)."""
    from specparity.engines import DEFAULT

    for i, word in enumerate(argv):
        name = argv[i + 1] if word == "--engine" and i + 1 < len(argv) else \
            word.split("=", 1)[1] if word.startswith("--engine=") else None
        if name is not None and name != DEFAULT:
            return name
    return None


def engine_of(f: Finding) -> str | None:
    """The engine whose own loop the finding's reproduction runs (None: mlx-lm's path, or not a replay)."""
    return engine_named(f.replay_argv() or [])


def _carried(argv: list[str]) -> list[str]:
    out: list[str] = []
    for i, w in enumerate(argv):
        if w in _CARRIED and i + 1 < len(argv):
            out += [w, argv[i + 1]]
        elif w in _FLAGS:
            out.append(w)
    return out


def _round_depth(run: dict[str, Any], found: dict[str, Any] | None, rnd: int) -> int:
    """Tokens decoded past the prompt before round ``rnd``'s block (the probe's and bisect's depth): from the
    finding's own position where it has one (a state after the round: its positions held less the rows kept; a
    row: its position less its row), else from the accept vector (the engine's prefill emits the first token, and
    each round before ``rnd`` its accepted proposals and one more; the last of them is the block's first row)."""
    prompt = int(run.get("prompt_len") or 0)
    if found is not None and "accepted" in found and found.get("position") is not None:
        return max(0, int(found["position"]) - (int(found["accepted"]) + 1) - prompt)
    if found is not None and found.get("position") is not None:
        return max(0, int(found["position"]) - int(found.get("row") or 0) - prompt)
    accepts = list(run.get("accepts") or [])
    return max(0, sum(a + 1 for a in accepts[:max(rnd, 0)]))


def own_loop_tree(f: Finding, engine: str) -> Diagnosis:
    """Run the tree on a finding whose reproduction is ``engine``'s own loop (:func:`engine_of`)."""
    d = Diagnosis(f)
    argv = shlex.split(f.reproduction or "")
    carried = _carried(argv[2:])
    code, out, said = run_command(argv, f"diagnose step 1 ({engine})")
    runs = [r for r in out.get("requests") or [] if isinstance(r, dict)]
    run = runs[0] if runs else {}
    tok, state, row = run.get("token"), run.get("state"), run.get("row")
    one = Step(1, RAN, verdict_of(code, out), [], f.reproduction,
               {"exit_code": code, "token": tok, "state": state, "row": row, "accepts": run.get("accepts"),
                "widths": run.get("widths")})
    d.steps.append(one)
    if not run:
        one.status, one.verdict = Verdict.NOT_RUN.value, Verdict.NOT_RUN
        one.evidence.append(f"the record's reproduction runs {engine}'s own loop; it gave no result (exit {code}:"
                            f" {said[:300]})")
        return _stop(d, f"step 1 could not run {engine}'s loop: {said[:300]}", UNDETERMINED)
    one.evidence.append(f"{engine}'s own loop rerun and walked against classic decode: {run.get('mix')}; "
                        + (tok["words"] if tok else "its tokens equal classic decode's")
                        + f"; the server's answer first differed at token {f.token_index}")
    replay = run.get("replay") or {}
    if replay:
        rt = replay.get("token")
        one.evidence.append("its accept vector replayed through the engine's verify and rollback alone (the"
                            " target side): " + (rt["words"] if rt else "its tokens equal classic decode's")
                            + ("; so the difference is the target side's" if rt and tok and rt.get("emitted_index")
                               == tok.get("emitted_index") else "; so it needs the engine's drafting side too"
                               if tok else ""))
    if tok is None or tok.get("emitted_index") != f.token_index:
        at = "classic decode" if tok is None else f"a first difference at token {tok.get('emitted_index')}"
        return _stop(d, f"does not reproduce in process: {engine}'s own loop on a fresh cache gives {at}, so the"
                        " finding lives in the server (its prefix cache, batching, or its loop's work between"
                        " forwards)", SERVER)
    one.evidence.append(f"reproduced: the same token index, emitted by round {tok['round']}, row {tok['row']}")
    token_round = int(tok["round"])
    widths = list(run.get("widths") or [])
    width = int(widths[max(token_round, 0)] if 0 <= token_round < len(widths) else f.width or 2)
    # where the walk first differs: a state after a rollback, a kept row, or the token itself
    early_state = state if state is not None and state["round"] < token_round else None
    first = min((x for x in (early_state, row) if x is not None), key=lambda x: x["round"], default=None)
    depth = _round_depth(run, first, first["round"] if first is not None else token_round)
    d.location = {"width": width, "depth": depth, "round": token_round, "row": tok["row"], "token_index":
                  tok["emitted_index"]}
    probe = ["specparity", "probe", *carried, "--widths", str(width), "--depths", str(depth)]
    pcode, pout, psaid = run_command(probe + ["--no-rollback"], f"diagnose step 3 ({engine})")
    _prefill_step(d, pout, engine)
    block = _block_step(d, pcode, pout, psaid, shlex.join(probe + ["--no-rollback"]), width, depth)
    rcode, rout, rsaid = run_command(probe, f"diagnose step 4 ({engine})")
    rolled = _rollback_step(d, rcode, rout, rsaid, shlex.join(probe), early_state, row)
    accepted = rolled["accepted"] if rolled else None
    bis = ["specparity", "bisect", *[w for w in carried if w != "--widths"], "--width", str(width), "--depth",
           str(depth)] + (["--accepted", str(accepted)] if accepted is not None else [])
    if block or rolled:
        _bisect_step(d, bis, engine)
    else:
        d.steps.append(Step(5, SKIPPED, evidence=["settled by steps 3 and 4: the engine's block and every rollback"
                                                  " of it equal classic decode's there, nothing to bisect"]))
        d.steps.append(Step(6, SKIPPED, evidence=["settled by steps 3 and 4: nothing differs for a toggle to"
                                                  " remove"]))
    dtype = (tok.get("logits") or {}).get("dtype") or "float32"
    tie = first_difference(d, f, {"served_pick": tok.get("pick"), "dtype": dtype,
                                   "served_token": tok.get("engine_token")})
    seven = d.step(7)
    seven.command = f.reproduction
    d.steps.append(releases(f.reproduction, engine))
    d.steps.sort(key=lambda s: s.number)
    _decide(d, engine, tie, block, rolled, early_state, row, tok)
    return d


def _stop(d: Diagnosis, summary: str, phase: str) -> Diagnosis:
    why = "settled by step 1: " + ("not reproducible in process" if phase == SERVER else "its loop gave no result")
    d.steps += [Step(n, SKIPPED, evidence=[why]) for n in range(2, 9)]
    d.phase, d.summary = phase, summary
    d.open = (["which part of the server: the arm comparison (cold vs warm, concurrent vs alone) says what it can"]
              if phase == SERVER else ["step 1's command, run by hand with --debug, says why it could not run"])
    return d


def _prefill_step(d: Diagnosis, out: dict[str, Any], engine: str) -> None:
    pre = [p for p in out.get("prefill") or [] if isinstance(p, dict)]
    if not pre:
        d.steps.append(Step(2, Verdict.NOT_RUN.value, Verdict.NOT_RUN, [
            f"{engine}'s probe checked no prefill of its own (its adapter prefills as classic decode does)"]))
        return
    p = pre[0]
    verdict = Verdict(p.get("verdict") or Verdict.NOT_RUN.value)
    words = (f"{engine}'s own prefill of the prompt ({p.get('prompt_len')} tokens) against classic decode's: its"
             f" last row and every layer's state: {verdict}")
    if p.get("first"):
        words += f"; first layer {p['first'].get('layer')} {p['first'].get('name')} ({p['first'].get('kind')})"
    d.steps.append(Step(2, RAN, verdict, [words, "read from step 3's probe, which checks the engine's prefill"
                                                  " before its block (its command repeats both)"],
                        None, {"prefill": p}))


def _block_step(d: Diagnosis, code: int | None, out: dict[str, Any], said: str, cmd: str, width: int,
                depth: int) -> dict[str, Any] | None:
    cells = [c for c in out.get("cells") or [] if isinstance(c, dict)]
    verdict = verdict_of(code, out)
    if not cells:
        d.steps.append(Step(3, Verdict.NOT_RUN.value, Verdict.NOT_RUN, [f"the probe gave no cell (exit {code}:"
                                                                        f" {said[:300]})"], cmd))
        return None
    c = cells[0]
    diff = c.get("diff") or {}
    ev = [f"the engine's {width}-row verify block at depth {depth} against {width} single steps of classic decode:"
          f" {c.get('verdict')}" + (f", {diff.get('differing_bytes')} of {diff.get('total_bytes')} logit bytes"
                                    f" differ from row {c.get('first_row')}" if diff else "")]
    d.steps.append(Step(3, RAN, verdict, ev, cmd, {"cell": c}))
    return c if c.get("verdict") == Verdict.DIVERGENT.value else None


def _rollback_step(d: Diagnosis, code: int | None, out: dict[str, Any], said: str, cmd: str,
                   early_state: dict[str, Any] | None, row: dict[str, Any] | None) -> dict[str, Any] | None:
    """Step 4: the probe's rollbacks of that block, and the walk's own state after each of its rollbacks.
    Returns the rollback defect (None: none)."""
    cells = [c for c in out.get("rollbacks") or [] if isinstance(c, dict)]
    ev: list[str] = []
    bad = [c for c in cells if c.get("verdict") == Verdict.DIVERGENT.value]
    if cells:
        ks = [c["accepted"] for c in bad]
        ev.append(f"the block rolled back to every accept 0..{len(cells) - 1}, the engine's state against classic"
                  " decode's over the kept tokens: " + (f"differs at accepted {', '.join(map(str, ks))}" if ks
                                                        else "equal at every one"))
    else:
        ev.append(f"the probe rolled nothing back (exit {code}: {said[:200]})")
    if early_state is not None:
        ev.append(f"the walk of step 1: {early_state['words']}")
    defect: dict[str, Any] | None = None
    partial = early_state is not None and early_state["accepted"] < early_state["width"] - 1
    rows_first = row is not None and early_state is not None and row["round"] <= early_state["round"]
    if early_state is not None and partial and not rows_first:
        first = early_state.get("first") or {}
        defect = {"rollback_round": early_state["round"], "accepted": early_state["accepted"],
                  "rollback_position": early_state["position"], "layer": first.get("layer"),
                  "tensor": first.get("name"), "layers": early_state.get("layers")}
        ev.append(f"the first state that differs follows round {early_state['round']}'s rollback to"
                  f" {early_state['accepted']} of {early_state['width'] - 1} proposals, whose kept rows equal"
                  " classic decode's: the rollback restored another state")
    elif bad and not rows_first:
        c = bad[0]
        first = c.get("first") or {}
        defect = {"accepted": c["accepted"], "rollback_position": c.get("position"), "layer": first.get("layer"),
                  "tensor": first.get("name"), "layers": c.get("layers")}
    cell = next((c for c in out.get("cells") or [] if isinstance(c, dict)), {})
    if not bad and cell.get("verdict") == Verdict.DIVERGENT.value:
        ev.append("the command's verdict also counts step 3's block, which differs")
    d.steps.append(Step(4, RAN, verdict_of(code, out), ev, cmd, {"rollbacks": cells, "defect": defect}))
    return defect


def _bisect_step(d: Diagnosis, words: list[str], engine: str) -> None:
    code, out, said = run_command(words, f"diagnose step 5 ({engine})")
    cmd = shlex.join(words)
    drill = out.get("drill") or {}
    first = out.get("first_divergent")
    comps = list(out.get("first_components") or [])
    ev = [str(out.get("headline") or f"no bisect (exit {code}: {said[:300]})")]
    if drill.get("sentence"):
        ev.append(str(drill["sentence"]))
    d.location.update({"layer": int(first) if isinstance(first, str) and first.isdigit() else first,
                       "subop": drill.get("subop"), "components": comps or None})
    d.steps.append(Step(5, RAN if out else Verdict.NOT_RUN.value, verdict_of(code, out) if out else Verdict.NOT_RUN,
                        ev, cmd, {"first_divergent": first, "components": comps, "drill": drill}))
    ccode, cout, _ = run_command(words, f"diagnose step 6 ({engine})", env={"MLX_DISABLE_COMPILE": "1"})
    verdict = verdict_of(ccode, cout)
    effect = {Verdict.EQUAL: "removes the difference", Verdict.DIVERGENT: "does not remove it"}.get(
        verdict, f"gives {verdict}")
    control = {"name": "compile off", "toggle": "MLX_DISABLE_COMPILE=1", "verdict": verdict, "effect": effect,
               "command": "MLX_DISABLE_COMPILE=1 " + cmd}
    d.steps.append(Step(6, RAN, verdict, [f"step 5's bisect with mlx's compiled kernels off (MLX_DISABLE_COMPILE=1,"
                                          f" read when the engine's process starts): {verdict}: {effect}"],
                        None, {"controls": [control], "removed_by": ["compile off"] if verdict == Verdict.EQUAL
                               else []}))


def _decide(d: Diagnosis, engine: str, tie: str, block: dict[str, Any] | None, rolled: dict[str, Any] | None,
            early_state: dict[str, Any] | None, row: dict[str, Any] | None, tok: dict[str, Any]) -> None:
    loc = d.location
    pre = d.step(2)
    if pre.verdict == Verdict.DIVERGENT or (early_state is not None and early_state["round"] < 0):
        d.phase = PREFILL
        d.summary = f"{engine}'s own prefill of the prompt leaves another state or last row than classic decode's"
    elif rolled is not None:
        d.phase = ROLLBACK
        loc.update({k: v for k, v in rolled.items() if k != "layers" and v is not None})
        from specparity.probes.forward.blockchain import STATE_NAMES

        tensor = str(rolled.get("tensor"))
        what = f"{tensor} ({STATE_NAMES[tensor]})" if tensor in STATE_NAMES else tensor
        at = (f"after round {rolled['rollback_round']}'s rollback to {rolled['accepted']} accepted"
              if "rollback_round" in rolled else f"after a rollback to {rolled['accepted']} accepted")
        d.summary = (f"{engine}'s rollback leaves another state than classic decode's {at}: layer"
                     f" {rolled.get('layer')} {what} first ({len(rolled.get('layers') or [])} layers); the first"
                     f" differing token follows at round {tok['round']}")
        d.open = [f"which line of {engine}'s rollback restores that state (its snapshot, its re-run of the kept"
                  " rows, or what it keeps of the rejected ones)"]
        return
    elif block is not None or (row is not None and row["round"] <= tok["round"]):
        d.phase = TIE if tie == "exact_tie" else VERIFY
        d.summary = (f"{engine}'s verify block differs from classic decode's chain (width {loc['width']}, depth"
                     f" {loc['depth']}); the flip is {tie.replace('_', ' ')}")
    elif tie == "exact_tie":
        d.phase = TIE
        d.summary = (f"the rows {engine} kept equal classic decode's, and the token is an exact tie in the model's"
                     " dtype that the engine breaks the other way (its pick, not its forward)")
        d.open = [f"{engine}'s pick: an argmax over raw logits breaks the tie classic decode's logprobs make toward"
                  " the other id; its own sampler's code names which"]
        return
    else:
        d.summary = f"{engine}'s block and rollbacks equal classic decode's there; the tree does not place it"
    d.open = [f"which kernel or pick of {engine} the width or depth selects is the engine's to name"]
