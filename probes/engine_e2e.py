"""Issue 27's engines' own generate loops against classic decode, each located to its round.

Run in the engine's environment (``python -P -m specparity.probes.engine_e2e
--engine NAME --target DIR --draft DIR``); prints one JSON finding per entry
point. Each engine is driven through its own loader and its own generate loop
with its library defaults (only ``max_new_tokens`` and the prompt's token ids
passed), and its own acceptance record is the evidence that it drafted. The pair
is loaded once by the engine's loaders for all its entry points (:func:`load_once`:
a load error is each entry point's finding), each loop a fresh request on it:

    mlx-dspark  ``load_target`` + ``load_drafter`` (4-bit drafter by default) +
                ``speculative_generate`` (cap 2, n-gram lookup drafts on), and the
                same with the whole block verified and lookup off; rounds from its
                ``on_round`` callback (drafted, accepted, committed, source)
    dspark-mlx  ``load_draft`` + ``load_host`` + ``generate_eager`` (one verify of
                [anchor, drafts] per round) and the legacy ``generate``, each after
                the host's and the drafter's ``reset`` (as its CLI starts a run);
                rounds from each ``TokenEvent.n_accepted``
    dfly-mlx    ``load_runtime`` + ``generate`` (its no-thinking chat prompt) and
                the loop it drives, dflash-mlx's ``stream_dflash_generate`` with the
                DFly draft backend, on the prompt's ids; rounds from the summary's
                ``acceptance_history``
    mtplx       each entry point imported (``runtime.load``, ``generate_ar`` /
                ``generate_mtp1`` / ``generate_mtpk``, the CLI, the server): on
                Linux each fails with its own cause, reported as ``cannot_run``

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
import time
import traceback
from dataclasses import asdict, dataclass, field
from collections.abc import Callable
from typing import Any

from specparity.completions import first_index
from specparity.verdicts import Verdict

# set to N: mlx-dspark's N-th verify of each generation flips its first row (the detector's own test)
FAULT_VAR = "SPECPARITY_ENGINE_FAULT_ROUND"
ENGINE_PACKAGES = ("mlx_dspark", "dspark_mlx", "dfly_mlx", "dflash_mlx", "mtplx")
ENGINES = ("mlx-dspark", "dspark-mlx", "dfly-mlx", "mtplx")
ENTRY_POINTS = {"mlx-dspark": ("speculative_generate", "speculative_generate-full-block"),
                "dspark-mlx": ("generate_eager", "generate"), "dfly-mlx": ("generate", "dfly-stream")}
MTPLX_ENTRY_POINTS = (("runtime.load", "mtplx.runtime", "load"), ("generate_ar", "mtplx.generation", "generate_ar"),
                      ("generate_mtp1", "mtplx.generation", "generate_mtp1"),
                      ("generate_mtpk", "mtplx.generation", "generate_mtpk"), ("mtplx CLI", "mtplx.cli", "main"),
                      ("mtplx server", "mtplx.server.openai", None))


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


def _failed(f: Finding, err: BaseException) -> Finding:
    f.verdict = Verdict.ERROR
    frames = traceback.extract_tb(err.__traceback__) if err.__traceback__ else []
    # the engine's own frame that raised (mlx's __getattr__ or a stdlib helper says less)
    own = [fr for fr in frames if any(f"/{m}/" in fr.filename for m in ENGINE_PACKAGES)]
    picked = own or list(frames)
    at = f" (at {picked[-1].filename.rsplit('site-packages/', 1)[-1]}:{picked[-1].lineno})" if picked else ""
    f.failure = f"{type(err).__name__}: {err}"[:400] + at
    f.reason = "the engine raised"
    return f


def inject_verify_fault(round_no: int) -> None:
    """A fault in mlx-dspark's own verify (for the detector's tests): the ``round_no``-th ``Target.verify``
    of each generation returns row 0 with its second-best token raised above its best, so the engine emits
    a token classic decode does not there."""
    import mlx.core as mx
    from mlx_dspark.target import Target

    orig = Target.verify
    calls = {"n": 0}

    def verify(self: Any, ids: Any, cache: Any, tap: Any) -> Any:
        logits, fused = orig(self, ids, cache, tap)
        calls["n"] += 1
        if calls["n"] == round_no:
            row = logits[0, 0]
            second = int(mx.argsort(row)[-2])
            logits = logits.at[0, 0, second].add(mx.abs(row).max() * 4 + 1)
        return logits, fused

    Target.verify = verify
    orig_reset = Target.reset_spec

    def reset_spec(self: Any) -> None:
        calls["n"] = 0
        orig_reset(self)

    Target.reset_spec = reset_spec


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


def run_mlx_dspark(target: str, draft: str, prompt: list[int], n: int, ref: Classic,
                   entries: tuple[str, ...] = ()) -> list[Finding]:
    import os

    from mlx_dspark.generate import speculative_generate
    from mlx_dspark.load import load_drafter, load_target

    classic, eos = ref.tokens(prompt), ref.eos
    if os.environ.get(FAULT_VAR):
        inject_verify_fault(int(os.environ[FAULT_VAR]))
    pair = load_once(lambda: (*load_target(target, require_tap=True), load_drafter(draft)[0]))
    out = []
    for entry, kw in (("speculative_generate", {}),
                      ("speculative_generate-full-block", {"max_draft_tokens": None, "lookup_drafts": False})):
        if entries and entry not in entries:
            continue
        f = Finding("mlx-dspark", entry)
        t0 = time.perf_counter()
        try:
            tgt, tok, drafter = pair()

            def on_round(**r: Any) -> None:
                f.rounds.append({"drafted": int(r.get("drafted", 0)), "accepted": int(r.get("accepted", 0)),
                                 "committed": int(r.get("committed", 0)), "source": str(r.get("source", ""))})

            res = speculative_generate(tgt, tok, drafter, prompt_ids=list(prompt), max_new_tokens=n,
                                       on_round=on_round, **kw)
            f.tokens = [int(t) for t in res.token_ids]
            f.drafted = sum(r["drafted"] for r in f.rounds)
            f.accepted = sum(r["accepted"] for r in f.rounds)
            judge(f, classic, eos | {int(e) for e in getattr(tok, "eos_token_ids", []) or []}, 1)
        except Exception as err:  # noqa: BLE001  (the engine's own error is the finding)
            _failed(f, err)
        f.seconds = time.perf_counter() - t0
        out.append(f)
    return out


def run_dspark_mlx(target: str, draft: str, prompt: list[int], n: int, ref: Classic,
                   entries: tuple[str, ...] = ()) -> list[Finding]:
    from dspark_mlx import generate, generate_eager, load_draft, load_host
    from dspark_mlx.events import TokenEvent

    classic, eos = ref.tokens(prompt), ref.eos
    eos_id = min(eos) if eos else None

    def load() -> tuple[Any, Any]:
        drafter, cfg = load_draft(draft)
        return drafter, load_host(target, cfg)[2]
    pair = load_once(load)
    out = []
    for entry, loop in (("generate_eager", generate_eager), ("generate", generate)):
        if entries and entry not in entries:
            continue
        f = Finding("dspark-mlx", entry)
        t0 = time.perf_counter()
        try:
            drafter, adapter = pair()
            adapter.reset()  # a fresh request on the loaded pair, as its own CLI starts each run
            drafter.reset()
            drafted_per_round = int(drafter.block_size)
            for ev in loop(adapter, drafter, [list(prompt)], max_new_tokens=n, eos_id=eos_id):
                if isinstance(ev, TokenEvent):
                    # a round's tokens all carry its n_accepted: a new round starts when the last one is full
                    if not f.rounds or f.rounds[-1]["committed"] == f.rounds[-1]["accepted"] + 1:
                        f.rounds.append({"drafted": drafted_per_round, "accepted": int(ev.n_accepted),
                                         "committed": 0, "source": "dspark"})
                    f.rounds[-1]["committed"] += 1
                    f.tokens.append(int(ev.token))
                else:
                    f.drafted, f.accepted = int(ev.n_drafted), int(ev.n_accepted)
            judge(f, classic, eos, 0)
        except Exception as err:  # noqa: BLE001
            _failed(f, err)
        f.seconds = time.perf_counter() - t0
        out.append(f)
    return out


def run_dfly_mlx(target: str, draft: str, prompt: list[int], n: int, ref: Classic,
                 entries: tuple[str, ...] = ()) -> list[Finding]:
    from dflash_mlx.engine.events import SummaryEvent, TokenEvent
    from dflash_mlx.runtime import get_stop_token_ids, stream_dflash_generate
    from dflash_mlx.runtime.context import build_offline_runtime_context
    from dfly_mlx.generate import generate, no_thinking_prompt_tokens
    from dfly_mlx.loading import load_runtime

    classic, eos = ref.tokens(prompt), ref.eos

    def rounds_of(hist: list[int], block: int) -> list[dict[str, Any]]:
        return [{"drafted": block - 1, "accepted": int(a), "committed": int(a) + 1, "source": "dfly"} for a in hist]

    runtime = load_once(lambda: load_runtime(target, draft))

    def own_generate(f: Finding) -> None:
        bundle = runtime()
        text = bundle.tokenizer.decode(list(prompt))
        # generate() prompts with its no-thinking chat template: classic decode of those ids is its reference
        ids = no_thinking_prompt_tokens(bundle.tokenizer, text)
        f.prompt = list(ids)
        res = generate(bundle, text, max_tokens=n)
        f.tokens = list(res.token_ids)
        f.rounds = rounds_of(list(res.summary.get("acceptance_history") or []), int(bundle.draft_model.block_size))
        judge_rounds(f)
        judge(f, ref.tokens(list(ids)), eos, 0)

    def stream(f: Finding) -> None:
        bundle = runtime()
        events = stream_dflash_generate(
            target_model=bundle.target_model, target_ops=bundle.target_ops, tokenizer=bundle.tokenizer,
            draft_model=bundle.draft_model, draft_backend=bundle.draft_backend, prompt="",
            prompt_tokens_override=list(prompt), max_new_tokens=n, use_chat_template=False,
            block_tokens=int(bundle.draft_model.block_size), stop_token_ids=get_stop_token_ids(bundle.tokenizer),
            runtime_context=build_offline_runtime_context(verify_mode="dflash"))
        for ev in events:
            if isinstance(ev, TokenEvent):
                f.tokens.append(int(ev.token_id))
            elif isinstance(ev, SummaryEvent):
                f.rounds = rounds_of(list(ev.acceptance_history or []), int(bundle.draft_model.block_size))
        judge_rounds(f)
        judge(f, classic, eos, 0)

    out = []
    for entry, fn in (("generate", own_generate), ("dfly-stream", stream)):
        if entries and entry not in entries:
            continue
        f = Finding("dfly-mlx", entry)
        t0 = time.perf_counter()
        try:
            fn(f)
        except Exception as err:  # noqa: BLE001  (the engine's own error is the finding)
            _failed(f, err)
        f.seconds = time.perf_counter() - t0
        out.append(f)
    return out


def judge_rounds(f: Finding) -> None:
    """Proposals made and accepted in all, from the engine's round record."""
    f.drafted = sum(r["drafted"] for r in f.rounds)
    f.accepted = sum(r["accepted"] for r in f.rounds)


def check_mtp_fixture(target: str) -> dict[str, Any]:
    """An MTP target checked by mtplx's own loaders (those that import on Linux): its strict coverage check
    of the ``qwen3_5`` head (``qwen3_5_mtp_patch._validate_load_coverage`` of the module tree it builds,
    ``_make_qwen3_5_mtp_module``, against the weights its reader ``mtp_patch._load_mtp_weights`` takes from
    ``expected_mtp_file``), then ``runtime.load`` (the head attached: ``mtp_enabled``, ``validate_mtp_support``).
    Each step's own error, where it raises."""
    from pathlib import Path

    out: dict[str, Any] = {"target": target}
    try:
        from mlx_lm.models.qwen3_5 import TextModelArgs
        from mtplx.artifacts import expected_mtp_file, load_config, text_config
        from mtplx.mtp_patch import _load_mtp_weights, _num_mtp_layers
        from mtplx.qwen3_5_mtp_patch import _make_qwen3_5_mtp_module, _validate_load_coverage

        config = load_config(Path(target))
        out["mtp_file"] = str(expected_mtp_file(Path(target), config))
        out["mtp_layers"] = _num_mtp_layers(config)
        weights = _load_mtp_weights(Path(out["mtp_file"]), config)
        out["tensors"] = len(weights)
        _validate_load_coverage(_make_qwen3_5_mtp_module(TextModelArgs.from_dict(text_config(config))), weights)
        out["coverage"] = "exact"
    except Exception as err:  # noqa: BLE001  (mtplx's own words are the finding)
        out["coverage"] = f"{type(err).__name__}: {err}"
    try:
        from mtplx import runtime
        from mtplx.mtp_patch import validate_mtp_support

        rt = runtime.load(target)
        out["mtp_enabled"] = bool(rt.mtp_enabled)
        out["validated"] = bool(validate_mtp_support(rt.model))
    except Exception as err:  # noqa: BLE001
        out["load_error"] = f"{type(err).__name__}: {err}"
    return out


def run_mtplx(entries: tuple[str, ...] = (), target: str = "") -> list[Finding]:
    """Each mtplx entry point imported: what does not import here is ``cannot_run`` with its own cause.
    ``target``: an MTP fixture (``fixtures make --drafter-format mtp``): ``runtime.load`` loads it."""
    import importlib

    out = []
    for entry, module, attr in MTPLX_ENTRY_POINTS:
        if entries and entry not in entries:
            continue
        f = Finding("mtplx", entry)
        try:
            mod = importlib.import_module(module)
            if attr is not None:
                getattr(mod, attr)
            f.verdict, f.reason = Verdict.ERROR, "imports here, but no MTP fixture drives it yet: not a pass"
            if entry == "runtime.load" and target:
                got = check_mtp_fixture(target)
                f.failure = got.get("load_error") or ""
                f.reason = (f"loads the MTP target (MTP heads attached: {got.get('mtp_enabled')}, validated:"
                            f" {got.get('validated')}; coverage: {got.get('coverage')}), but its generation"
                            " cannot run here: nothing to compare, not a pass")
        except BaseException as err:  # noqa: BLE001  (an import may raise anything, SystemExit included)
            _failed(f, err)
            f.verdict, f.reason = "cannot_run", f"{module} does not import on {sys.platform}"
        out.append(f)
    return out


def run(engine: str, target: str, draft: str, prompt: list[int], n: int,
        entries: tuple[str, ...] = (), classic: Classic | None = None) -> list[Finding]:
    """``engine``'s entry points (``entries``; all when empty) against classic decode (``classic``: its
    reference, kept for the caller; None: one here, the target loaded by mlx-lm)."""
    runs = {"mlx-dspark": run_mlx_dspark, "dspark-mlx": run_dspark_mlx, "dfly-mlx": run_dfly_mlx}
    if engine == "mtplx":
        return run_mtplx(entries, target)
    if engine in runs:
        ref = classic if classic is not None else Classic(target, n)
        found = runs[engine](target, draft, prompt, n, ref, entries)
        for f in found:
            label_tie(f, ref, prompt)
        return found
    raise SystemExit(f"Error: unknown engine {engine!r}: choose from {', '.join(ENGINES)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -P -m specparity.probes.engine_e2e", description=__doc__.split("\n")[0])
    ap.add_argument("--engine", required=True, choices=ENGINES)
    ap.add_argument("--target", default="")
    ap.add_argument("--draft", default="")
    ap.add_argument("--prompt-ids", default="", help="comma-separated token ids")
    ap.add_argument("--max-tokens", type=int, default=32)
    a = ap.parse_args(argv)
    prompt = [int(x) for x in a.prompt_ids.split(",") if x.strip()]
    if a.engine != "mtplx" and not (a.target and a.draft and prompt):
        ap.error("--target, --draft and --prompt-ids are required")
    for f in run(a.engine, a.target, a.draft, prompt, a.max_tokens):
        print(json.dumps(f.to_dict()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
