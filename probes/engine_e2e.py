"""Engines' own generate loops against classic decode, each located to its round.

Every engine that declares its loops (``EngineSpec.loops``, its package's ``loops.py``) is driven here:
run in the engine's environment (``python -P -m specparity.probes.engine_e2e --engine NAME --target DIR
--draft DIR``), it prints one JSON finding per entry point. Each engine is driven through its own loader
and its own generate loop with its library defaults (only ``max_new_tokens`` and the prompt's token ids
passed), and its own acceptance record is the evidence that it drafted. An engine loads the pair once for
all its entry points (:func:`load_once`: a load error is each entry point's finding), each loop a fresh
request on it. Nothing here names an engine: the registry gives each one's loops.

A loops function: ``loops(target, draft, prompt, max_tokens, classic, entries) -> list[Finding]``,
each finding judged by :func:`judge` against ``classic`` (its rounds located by the engine's own record).

Classic decode is mlx-lm's own classic path (:class:`Classic`: ``stream_generate``
without a drafter, its default sampler, greedy argmax of the model's logprobs in
its dtype, stopping at ``max_tokens`` or at the tokenizer's eos) on the same
weights, loaded by mlx-lm once in the same process and decoded once per distinct
prompt: ``e2e --engine NAME`` compares its classic arm with the same run
(:mod:`specparity.probes.engines.own_loop`).

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
import json
import sys
import traceback
from dataclasses import asdict, dataclass, field
from collections.abc import Callable
from typing import Any

from specparity.completions import first_index
from specparity.errors import UsageError
from specparity.verdicts import Verdict



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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Classic:
    """Classic decode's reference for every entry point: mlx-lm's ``stream_generate`` without a drafter (its
    own sampler and eos stop, under :class:`~specparity.probes.e2e.Spy`), on the target mlx-lm loaded once,
    run once per distinct prompt and kept (:meth:`arm`).

    target_dir: the target, loaded by ``mlx_lm.load`` on first use; or ``loaded``: the target already
    loaded (``.model``, ``.tokenizer``: the e2e command's). context: what classic decode runs in
    (:meth:`OwnLoopEngine.classic`).
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
        """mlx-lm's classic ``stream_generate`` arm on ``prompt`` (an :class:`~specparity.probes.e2e.EntryArm`:
        its tokens end at ``max_tokens`` or with the eos token it stopped at)."""
        from specparity.probes.e2e import E2EOptions, run_api_arm

        key = tuple(prompt)
        if key not in self._arms:
            with self._context():
                self._arms[key] = run_api_arm("stream_generate", self.loaded, None, list(prompt),
                                              E2EOptions(max_tokens=self.max_tokens))
        return self._arms[key]

    def tokens(self, prompt: list[int]) -> list[int]:
        """Classic decode's tokens on ``prompt`` (:meth:`arm`'s); its error (mlx-lm refused) raised."""
        arm = self.arm(prompt)
        if arm.error:
            raise RuntimeError(f"classic decode (mlx-lm's stream_generate) did not run: {arm.error}")
        return list(arm.tokens)


def judge(f: Finding, classic: list[int], eos: set[int], first_round_offset: int) -> Finding:
    """Compare ``f.tokens`` with ``classic`` and locate the first difference in ``f.rounds``.

    ``first_round_offset``: tokens emitted before round 1 (mlx-dspark's prefill token: 1; otherwise 0).
    ``classic`` stops where classic decode stops: at max_tokens, or with the eos token it emitted last.
    """
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
    f.tie = {"engine_logit": le, "classic_logit": lc, "engine_logprob": pe, "classic_logprob": pc,
             "logprob_tie": pe == pc, "logit_tie": le == lc, "dtype": str(logits.dtype)}
    if pe == pc:
        f.reason += (f"; an exact tie in {logits.dtype} logprobs ({pc:.6g}) that classic decode breaks toward"
                     f" the lower id (raw logits {le:.6g} vs {lc:.6g})")
    else:
        f.reason += f"; not a tie: logprobs {pe:.6g} (engine's token) vs {pc:.6g} (classic's), {logits.dtype}"


def failed(f: Finding, err: BaseException) -> Finding:
    """``f`` as the engine's own error: its type, message and the engine's own frame that raised."""
    f.verdict = Verdict.ERROR
    frames = traceback.extract_tb(err.__traceback__) if err.__traceback__ else []
    # the engine's own frame that raised (mlx's __getattr__ or a stdlib helper says less)
    own = [fr for fr in frames if any(f"/{m}/" in fr.filename for m in _engine_packages())]
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
