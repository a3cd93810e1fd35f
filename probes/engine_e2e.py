"""Every engine's e2e that is not mlx-lm's own entry points: its loops against classic decode, each
located to its round (``specparity e2e --engine NAME``).

One contract, one classic arm, one comparison (:mod:`specparity.probes.e2e`'s ``EntryArm`` and
``compare_arms``): :func:`run_own_loops_e2e` drives an engine's declared loops (``EngineSpec.loops``, the
e2e of every engine that declares them: the default of ``EngineSpec.e2e``), :func:`run_generate_e2e` an
in-process adapter's own loop (``Engine.generate``), and :class:`Classic` is classic decode's arm for both.

Every engine that declares its loops (``EngineSpec.loops``, its package's ``loops.py``) is driven here:
run in the engine's environment (``python -P -m specparity.probes.engine_e2e --engine NAME --target DIR
--draft DIR``), it prints one JSON finding per entry point. Each engine is driven through its own loader
and its own generate loop with its library defaults (only ``max_new_tokens`` and the prompt's token ids
passed), and its own acceptance record is the evidence that it drafted. An engine loads the pair once for
all its entry points (:func:`load_once`: a load error is each entry point's finding), each loop a fresh
request on it. Nothing here names an engine: the registry gives each one's loops.

A loops function: ``loops(target, draft, prompt, max_tokens, classic, entries) -> list[Finding]``,
each finding judged by :func:`judge` against ``classic`` (its rounds located by the engine's own record).

Classic decode is mlx-lm's own classic path (:class:`Classic`: :func:`specparity.decode.classic_steps`,
``generate_step`` as ``stream_generate`` runs it without a drafter, its default sampler, greedy argmax of
the model's logprobs in its dtype, stopping at ``max_tokens`` or at the tokenizer's eos) on the same
weights, loaded by mlx-lm once in the same process and decoded once per distinct
prompt: ``e2e --engine NAME`` compares its classic arm with the same run
(:func:`run_own_loops_e2e`).

Verdicts: ``match`` (every emitted token equals classic decode's and the
engine's record shows accepted drafts), ``not_engaged`` (equal, but nothing
drafted was accepted: not a pass), ``diverged`` (the first differing token, the
round that emitted it, its row in that round's verify block and whether the
round before rolled back rejected rows), ``error`` (the engine raised: its
error), ``cannot_run`` (the entry point does not import here: its cause).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specparity.completions import first_index
from specparity.errors import UsageError, first_line
from specparity.progress import NULL, Observer
from specparity.verdicts import Verdict

if TYPE_CHECKING:
    from specparity.probes.e2e import E2ERun


@dataclass
class Finding:
    """One entry point of one engine against classic decode.

    engine, entry: who ran. verdict: match | diverged | not_engaged | error | cannot_run.
    tokens: tokens the engine emitted; classic: classic decode's first tokens (as many).
    rounds: the engine's acceptance record, one dict per round (drafted, accepted, committed, source).
    drafted / accepted: proposals made / accepted in all (None: the engine does not say).
    index: the first differing token (0-based, past the prompt); engine_token / classic_token there.
    round: the round that emitted it (1-based; 0: the prefill's token); row: its row in that round's
    verify block (0: the first); after_rollback: the round before rejected rows the engine rolled back.
    reason: one line. failure: the engine's error (type: message). seconds: the engine's wall time.
    prompt: the ids the engine consumed where they are not the prompt given (dfly-mlx's chat template).
    tie: at a diverged token, both tokens' logits and logprobs from classic decode (:func:`label_tie`).
    lossy: the mode run, where its authors document it as lossy (``accept_top_k=4: ...``): the finding is
    ``lossy_by_design`` with what it changed (:func:`judge`), never a pass and never a defect.
    """

    engine: str
    entry: str
    verdict: str = Verdict.ERROR
    tokens: list[int] = field(default_factory=list)
    classic: list[int] = field(default_factory=list)
    rounds: list[dict[str, Any]] = field(default_factory=list)
    drafted: int | None = None
    accepted: int | None = None
    index: int | None = None
    engine_token: int | None = None
    classic_token: int | None = None
    round: int | None = None
    row: int | None = None
    after_rollback: bool | None = None
    reason: str = ""
    failure: str = ""
    seconds: float = 0.0
    prompt: list[int] | None = None
    tie: dict[str, Any] | None = None
    lossy: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Classic:
    """Classic decode's arm for every engine's e2e: :func:`specparity.decode.classic_steps` (mlx-lm's
    ``generate_step`` without a drafter, as ``stream_generate`` runs it: its default sampler, greedy argmax
    of the model's logprobs in its dtype) read as ``stream_generate`` reads it (its eos stop, its text), on
    the target mlx-lm loaded once, run once per distinct prompt and kept (:meth:`arm`). The served reference
    makes the same call (:func:`specparity.mlx_server.decode_classic`).

    target_dir: the target, loaded by ``mlx_lm.load`` on first use; or ``loaded``: the target already
    loaded (``.model``, ``.tokenizer``: the e2e command's). context: what classic decode runs in
    (:meth:`OwnLoopEngine.classic`, an adapter's :meth:`Engine.classic`).
    """

    def __init__(self, target_dir: str = "", max_tokens: int = 32, loaded: Any = None,
                 context: Any = contextlib.nullcontext):
        self.target_dir, self.max_tokens, self._loaded, self._context = target_dir, max_tokens, loaded, context
        self._arms: dict[tuple[int, ...], Any] = {}

    @property
    def loaded(self) -> Any:
        if self._loaded is None:
            from types import SimpleNamespace

            from mlx_lm import load

            model, tok = load(self.target_dir)[:2]
            self._loaded = SimpleNamespace(model=model, tokenizer=tok)
        return self._loaded

    @property
    def eos(self) -> set[int]:
        return {int(e) for e in getattr(self.loaded.tokenizer, "eos_token_ids", None) or []}

    def arm(self, prompt: list[int]) -> Any:
        """Classic decode's arm on ``prompt`` (an :class:`~specparity.probes.e2e.EntryArm`: its tokens end at
        ``max_tokens`` or with the eos token it stopped at; its text as ``stream_generate`` writes it)."""
        key = tuple(prompt)
        if key not in self._arms:
            with self._context():
                self._arms[key] = self._decode(list(prompt))
        return self._arms[key]

    def _decode(self, prompt: list[int]) -> Any:
        from specparity.decode import classic_steps, stream_steps
        from specparity.probes.e2e import EntryArm

        n = self.max_tokens
        arm = EntryArm("stream_generate", False, passed={"max_tokens": n})
        arm.step, arm.received, arm.prompt = "generate_step", {"max_tokens": n}, list(prompt)
        t0 = time.perf_counter()
        try:
            tok = self.loaded.tokenizer
            for step in stream_steps(tok, classic_steps(self.loaded.model, prompt, n), n):
                arm.tokens.append(int(step.token))
                arm.text += step.text
        except (ValueError, TypeError, IndexError) as err:  # mlx-lm refused this prompt
            arm.error = f"{type(err).__name__}: {first_line(str(err))}"
        arm.seconds = time.perf_counter() - t0
        return arm

    def tokens(self, prompt: list[int]) -> list[int]:
        """Classic decode's tokens on ``prompt`` (:meth:`arm`'s); its error (mlx-lm refused) raised."""
        arm = self.arm(prompt)
        if arm.error:
            raise RuntimeError(f"classic decode (mlx-lm's generate_step) did not run: {arm.error}")
        return list(arm.tokens)


def judge(f: Finding, classic: list[int], eos: set[int], first_round_offset: int) -> Finding:
    """Compare ``f.tokens`` with ``classic`` and locate the first difference in ``f.rounds``; a documented
    lossy mode (``f.lossy``) is ``lossy_by_design`` with what it changed.

    ``first_round_offset``: tokens emitted before round 1 (mlx-dspark's prefill token: 1; otherwise 0).
    ``classic`` stops where classic decode stops: at max_tokens, or with the eos token it emitted last.
    """
    _judge(f, classic, eos, first_round_offset)
    if f.lossy and f.verdict in (Verdict.MATCH, Verdict.DIVERGED, Verdict.NOT_ENGAGED):
        changed = (f"it leaves classic decode: {f.reason}" if f.verdict == Verdict.DIVERGED
                   else f"{len(f.tokens)} tokens equal to classic decode on this prompt")
        f.verdict = Verdict.LOSSY
        f.reason = f"lossy by design ({f.lossy}): {changed}; not a pass, not a defect"
    return f


def _judge(f: Finding, classic: list[int], eos: set[int], first_round_offset: int) -> Finding:
    f.classic = classic[:len(f.tokens)]
    # the first differing token; past classic's end (it stopped at max_tokens or its eos) where the
    # engine emitted more
    first = first_index(f.tokens, classic)
    diff = first if first < len(f.tokens) else None
    if diff is None:
        short = len(f.tokens) < len(classic) and not (f.tokens and f.tokens[-1] in eos)
        if short:
            f.verdict, f.reason = Verdict.ERROR, f"stopped after {len(f.tokens)} of {len(classic)} tokens without eos"
        elif not f.accepted:
            f.verdict = Verdict.NOT_ENGAGED
            f.reason = (f"{len(f.tokens)} tokens equal to classic decode, but the engine's record shows"
                        f" {f.accepted} accepted drafts over {len(f.rounds)} rounds: not a pass")
        else:
            f.verdict = Verdict.MATCH
            f.reason = (f"{len(f.tokens)} tokens equal to classic decode over {len(f.rounds)} rounds,"
                        f" {f.accepted} of {f.drafted} drafts accepted")
        return f
    f.verdict, f.index, f.engine_token = Verdict.DIVERGED, diff, f.tokens[diff]
    f.classic_token = classic[diff] if diff < len(classic) else None
    pos, f.round, f.row = first_round_offset, 0, diff
    if diff >= first_round_offset:
        for r, rec in enumerate(f.rounds, start=1):
            if diff < pos + rec["committed"]:
                f.round, f.row = r, diff - pos
                prev = f.rounds[r - 2] if r >= 2 else None
                f.after_rollback = bool(prev and prev.get("drafted", 0) > prev.get("accepted", 0))
                break
            pos += rec["committed"]
    if f.round == 0:
        where = "the prefill's token"
    else:
        rec = f.rounds[f.round - 1]
        kind = "an accepted draft" if f.row < rec["accepted"] else "the correction/bonus row"
        where = (f"round {f.round}, row {f.row} of its verify block ({kind}; {rec['drafted']} drafted,"
                 f" {rec['accepted']} accepted, source {rec.get('source', 'draft')}"
                 f"{', after a rollback of rejected rows' if f.after_rollback else ''})")
    stop = (f"at its eos token {classic[-1]} after {len(classic)} tokens" if classic and classic[-1] in eos
            else f"at max_tokens={len(classic)}")
    said = (f"classic {f.classic_token}" if f.classic_token is not None
            else f"classic stopped {stop} (the engine emitted {len(f.tokens)})")
    f.reason = f"token {diff}: engine {f.engine_token}, {said}, at {where}"
    return f


def label_tie(f: Finding, classic: Classic, prompt: list[int]) -> None:
    """At a diverged token, both tokens' raw logits and logprobs from one classic forward over the prompt and
    classic decode's tokens before it, in the model's dtype: equal logprobs are an exact tie classic decode
    breaks toward the lower id (``logit_tie``: the raw logits are equal too)."""
    if f.verdict != Verdict.DIVERGED or f.index is None or f.classic_token is None:
        return
    import mlx.core as mx

    model = classic.loaded.model
    ids = list(f.prompt if f.prompt is not None else prompt) + f.classic[:f.index]
    logits = model(mx.array(ids)[None])[0, -1]
    logprobs = logits - mx.logsumexp(logits, keepdims=True)
    e, c = int(f.engine_token or 0), int(f.classic_token or 0)
    le, lc, pe, pc = (float(x) for x in (logits[e], logits[c], logprobs[e], logprobs[c]))
    f.tie = tie_fields(le, lc, pe, pc, str(logits.dtype))
    dtype, margin, ulps = f.tie["dtype"].removeprefix("mlx.core."), f.tie["margin"], f.tie["ulps"]
    if pe == pc:
        f.reason += (f"; an exact tie in {logits.dtype} logprobs ({pc:.6g}) that classic decode breaks toward"
                     f" the lower id (raw logits {le:.6g} vs {lc:.6g})")
    elif f.tie["near_tie"]:
        f.reason += (f"; a near tie, not an exact one: classic decode's token leads by {margin:.6g} in its raw"
                     f" {dtype} logits ({ulps} ULP{'s' if ulps != 1 else ''}), inside the {f.tie['band']:.3g} that"
                     f" other kernels' arithmetic alone can move (logprobs {pe:.6g} for the engine's token,"
                     f" {pc:.6g} for classic's)")
    else:
        f.reason += (f"; not a tie: logprobs {pe:.6g} (engine's token) vs {pc:.6g} (classic's), {logits.dtype},"
                     f" a lead of {margin:.6g} ({ulps} ULPs) beyond what arithmetic alone moves"
                     f" ({f.tie['band']:.3g})")


def tie_fields(le: float, lc: float, pe: float, pc: float, dtype: str) -> dict[str, Any]:
    """Finding.tie from both tokens' raw logits (``le`` the engine's token, ``lc`` classic decode's) and logprobs
    in classic decode's forward: exact (equal logprobs), near (classic's lead inside the band other kernels'
    arithmetic moves: :func:`specparity.reference.near_tie`) or neither, with the lead in ULPs of ``dtype``."""
    from specparity.reference import NEAR_TIE, near_tie, ulp

    short = dtype.removeprefix("mlx.core.")
    margin = lc - le  # classic decode's token over the engine's, in classic decode's own raw logits
    call = near_tie(margin, None, dtype=short, logprob=pc)
    return {"engine_logit": le, "classic_logit": lc, "engine_logprob": pe, "classic_logprob": pc,
            "logprob_tie": pe == pc, "logit_tie": le == lc, "dtype": dtype, "margin": margin,
            "ulps": round(margin / ulp(short, lc)) if margin else 0,
            "near_tie": pe != pc and call.kind == NEAR_TIE, "band": call.threshold}


def failed(f: Finding, err: BaseException) -> Finding:
    """``f`` as the engine's own error: its type, message and the engine's own frame that raised."""
    f.verdict = Verdict.ERROR
    frames = traceback.extract_tb(err.__traceback__) if err.__traceback__ else []
    # the engine's own frame that raised (mlx's __getattr__ or a stdlib helper says less)
    packages = _engine_packages()
    own = [fr for fr in frames if any(f"/{m}/" in fr.filename for m in packages)]
    picked = own or list(frames)
    at = f" (at {picked[-1].filename.rsplit('site-packages/', 1)[-1]}:{picked[-1].lineno})" if picked else ""
    f.failure = f"{type(err).__name__}: {err}"[:400] + at
    f.reason = "the engine raised"
    return f


def load_once(load: Callable[[], Any]) -> Callable[[], Any]:
    """The engine's own loaders run once for all its entry points, as a user (and its own CLI) loads once
    and generates again: what they returned, or the error they raised, for each entry point (its own load
    error stays its finding). The first entry point's wall time holds the load."""
    done: list[Any] = []

    def loaded() -> Any:
        if not done:
            try:
                done.append((load(), None))
            except Exception as err:  # noqa: BLE001  (re-raised for every entry point)
                done.append((None, err))
        value, error = done[0]
        if error is not None:
            raise error
        return value
    return loaded


def judge_rounds(f: Finding) -> None:
    """Proposals made and accepted in all, from the engine's round record."""
    f.drafted = sum(r["drafted"] for r in f.rounds)
    f.accepted = sum(r["accepted"] for r in f.rounds)


def _engine_packages() -> list[str]:
    """The top-level packages of every registered engine (its frames are the engine's own)."""
    from specparity.engines import registry

    return sorted({spec.module.split(".")[0] for spec in registry().values() if spec.module})


def run(engine: str, target: str, draft: str | None, prompt: list[int], n: int,
        entries: tuple[str, ...] = (), classic: Classic | None = None) -> list[Finding]:
    """``engine``'s entry points (``entries``; all when empty) against classic decode (``classic``: its
    reference, kept for the caller; None: one here, the target loaded by mlx-lm): its declared loops."""
    from specparity.engines import get, resolve

    spec = get(engine)
    if spec.loops is None:
        raise UsageError(f"engine {engine}: declares no loops of its own")
    ref = classic if classic is not None else Classic(target, n)
    found: list[Finding] = resolve(spec.loops)(target, draft, list(prompt), n, ref, tuple(entries))
    for f in found:
        label_tie(f, ref, prompt)
    return found


# ---------------------------------------------------------------- e2e's faces

NOTE = "checked through its own generate loops, each loading the pair with the engine's own loaders"


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


class OwnLoopEngine:
    """An engine's name and checkpoints, and the context its classic arm runs in: what e2e reports of an engine
    it checks through its own loops (each loop loads the pair with the engine's own loaders)."""

    def __init__(self, name: str, target: Path, draft: Path | None):
        from specparity.probes.engines.base import EngineInfo

        self.info = EngineInfo(name=name, version=_version(name), target=str(target),
                               draft=str(draft) if draft else None, block_size=None, widths=[], notes=[NOTE],
                               packages={p: _version(p) for p in (name, "mlx", "mlx-lm")})

    @contextlib.contextmanager
    def classic(self) -> Iterator[None]:
        yield


def run_own_loops_e2e(engine: OwnLoopEngine, loaded: Any, prompt: list[int], max_tokens: int,
                      entry_points: list[str] | None = None, observer: Observer = NULL) -> E2ERun:
    """Each of the engine's own loops against mlx-lm's classic ``stream_generate`` on the ids it consumed.

    Classic decode runs once per distinct prompt (:class:`Classic`): the same
    arm judges each loop round by round and is this command's classic arm.
    """
    from specparity.decode import stream_text
    from specparity.probes.e2e import OWN_LOOP, E2EOptions, E2ERun, EntryArm, compare_arms

    info = engine.info
    options = E2EOptions(max_tokens=max_tokens)
    drafter = f"drafter {info.draft}" if info.draft else "its draft heads inside the target"
    out = E2ERun(header=(f"{info.name} {info.version} on {info.target} with {drafter}: its own loops;"
                         f" classic: mlx-lm's stream_generate without a drafter; max_tokens={max_tokens}"),
                 options=options.passed(True), model=loaded.fingerprint.to_dict(), prompt_tokens=len(prompt))
    classic = Classic(info.target, max_tokens, loaded=loaded, context=engine.classic)
    findings = run(info.name, info.target, info.draft, list(prompt), max_tokens, tuple(entry_points or ()),
                   classic=classic)
    with observer.part("entry points", total=len(findings)):
        for f in findings:
            ref = classic.arm(list(f.prompt if f.prompt is not None else prompt))
            arm = EntryArm(f.entry, True, passed={"max_tokens": max_tokens})
            arm.step, arm.received = f"{info.name} {f.entry} {OWN_LOOP}", dict(arm.passed)
            arm.tokens, arm.drafted, arm.seconds = list(f.tokens), int(f.accepted or 0), f.seconds
            arm.proposed = f.drafted
            arm.text = stream_text(loaded.tokenizer, arm.tokens)  # its ids as classic decode writes ids
            if f.verdict in (Verdict.ERROR, Verdict.CANNOT_RUN):
                arm.error = f"{f.verdict.replace('_', ' ')}: {f.failure or f.reason}"
            res = compare_arms(f.entry, ref, arm, options, loaded.tokenizer)
            if f.verdict == Verdict.DIVERGED:
                res.reason = f"{res.reason}; {f.reason}" if res.reason else f.reason
            elif f.verdict == Verdict.LOSSY:
                res.lossy, res.reason = f.lossy, f.reason
            out.entries.append(res)
            observer.result(f.entry, res.to_dict())
            observer.item("entry points")
    return out


GENERATE_ENTRY = "generate"


def run_generate_e2e(engine: Any, loaded: Any, prompt: list[int], max_tokens: int,
                     entry_points: list[str] | None = None, observer: Observer = NULL) -> E2ERun:
    """An in-process adapter's own loop (:meth:`Engine.generate`, entry ``generate``) against classic decode's
    arm (:class:`Classic`): the loop's emitted tokens compared token for token; engagement: the proposals its
    rounds accepted. An engine whose adapter runs its own loop gets this e2e without code of its own."""
    from specparity.decode import stream_text
    from specparity.probes.e2e import OWN_LOOP, E2EOptions, E2ERun, EntryArm, compare_arms

    options = E2EOptions(max_tokens=max_tokens)
    info = engine.info
    out = E2ERun(header=(f"{info.name} {info.version} on {info.target}: its own loop; classic: mlx-lm's"
                         f" stream_generate without a drafter; max_tokens={max_tokens}"),
                 options=options.passed(True), model=loaded.fingerprint.to_dict(), prompt_tokens=len(prompt))
    with observer.part("entry points", total=1):
        classic = Classic(max_tokens=max_tokens, loaded=loaded, context=engine.classic).arm(list(prompt))
        arm = EntryArm(GENERATE_ENTRY, True, passed={"max_tokens": max_tokens})
        arm.step, arm.received = f"{info.name} generate {OWN_LOOP}", dict(arm.passed)
        t0 = time.perf_counter()
        own = engine.generate(list(prompt), max_tokens, record_states=False)
        arm.seconds = time.perf_counter() - t0
        arm.tokens = list(own.tokens[:max_tokens])
        arm.drafted = sum(own.accepts)
        arm.proposed = sum(r.width - 1 for r in own.rounds)  # a round verifies its anchor and its drafts
        arm.error = own.error
        arm.text = stream_text(loaded.tokenizer, arm.tokens)  # its ids as classic decode writes ids
        # classic stops at its EOS; the engine's loop is compared over the same tokens
        res = compare_arms(GENERATE_ENTRY, classic, arm, options, loaded.tokenizer)
        out.entries.append(res)
        observer.result(GENERATE_ENTRY, res.to_dict())
        observer.item("entry points")
    return out


def main(argv: list[str] | None = None) -> int:
    from specparity.engines import registry

    ap = argparse.ArgumentParser(prog="python -P -m specparity.probes.engine_e2e", description=__doc__.split("\n")[0])
    ap.add_argument("--engine", required=True, choices=[n for n, s in registry().items() if s.loops is not None])
    ap.add_argument("--target", default="")
    ap.add_argument("--draft", default="")
    ap.add_argument("--prompt-ids", default="", help="comma-separated token ids")
    ap.add_argument("--max-tokens", type=int, default=32)
    a = ap.parse_args(argv)
    prompt = [int(x) for x in a.prompt_ids.split(",") if x.strip()]
    from specparity.engines import get

    if get(a.engine).drafter_checkpoint and not (a.target and prompt):
        ap.error("--target and --prompt-ids are required (this engine's loops draft from a drafter checkpoint)")
    for f in run(a.engine, a.target, a.draft or None, prompt, a.max_tokens):
        print(json.dumps(f.to_dict()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
