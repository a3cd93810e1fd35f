"""mlx-lm-broomva's own loops against classic decode (``e2e --engine mlx-lm-broomva``, the findings table).

Each entry point runs on the pair loaded by the fork's own ``mlx_lm.load`` (a Gemma 4 target, a
``gemma4_assistant`` drafter) with its library defaults: only the prompt's ids (its CLI: the prompt's text) and
``max_tokens`` are given; ``num_draft_tokens`` is the loop's default, 2 (its CLI's own default, 3). Classic
decode is the fork's own
``generate_step`` (mlx-lm 0.31.3's, unchanged by the fork), what its ``stream_generate`` runs without a drafter.

Its acceptance record, round by round, is the loop's own: ``mtp_speculative_generate_step`` yields each token
with ``from_draft`` (True for an accepted draft, False for the prefill's token and each round's bonus token), so
a round is its accepted drafts and the bonus that closes it; and every rollback it makes goes through
``cache.trim_prompt_cache(model_cache, rejected)``, whose return value (the rows it trimmed) and the caches'
state are recorded beside each round: a rollback that trimmed fewer rows than it asked left rejected rows in the
target's cache.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from specparity.probes.engine_e2e import Classic, Finding, failed, judge, load_once

DISTRIBUTION = "mlx-lm-broomva"
DEFAULT_DRAFTS = 2  # mtp_speculative_generate_step's num_draft_tokens
DRAFT_SOURCE = "gemma4_assistant"
# (entry point, what it is): its library generator, the stream_generate that dispatches to it, its CLI
ENTRY_POINTS = (
    ("mtp_speculative_generate_step", "the MTP loop (library generator)"),
    ("stream_generate", "stream_generate(draft_model=<gemma4_assistant>)"),
    ("mlx_lm generate --draft-model", "its CLI, in process"),
)
ENTRY_NAMES = tuple(entry for entry, _ in ENTRY_POINTS)


def generate_module() -> Any:
    """``mlx_lm.generate`` the module (``mlx_lm``'s ``__init__`` binds the name to the function)."""
    return importlib.import_module("mlx_lm.generate")


def check_fork() -> str:
    """The fork's version; RuntimeError where this ``mlx_lm`` is not mlx-lm-broomva's (mlx-lm's own has no MTP
    loop: the built-in ``mlx-lm`` engine checks that one)."""
    from importlib import metadata

    try:
        version = metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise RuntimeError(f"{DISTRIBUTION} is not installed in this Python ({sys.prefix}): run it in its environment"
                           f" (--environment {DISTRIBUTION}; built by scripts/build-env {DISTRIBUTION})") from None
    if not hasattr(generate_module(), "mtp_speculative_generate_step"):
        raise RuntimeError(f"{DISTRIBUTION} {version} is installed, but this mlx_lm.generate has no"
                           " mtp_speculative_generate_step: another mlx-lm's files replaced the fork's")
    return version


class Recorder:
    """The loop's own record: each yielded token with its ``from_draft`` flag, and each rollback's trim (asked,
    trimmed, the caches' offsets and which were not trimmable)."""

    def __init__(self, num_draft_tokens: int, max_tokens: int):
        self.k, self.max_tokens = num_draft_tokens, max_tokens
        self.tokens: list[int] = []
        self.flags: list[bool] = []
        self.trims: list[dict[str, Any]] = []
        self.prompt: list[int] | None = None

    def wrap(self, gen: Iterator[Any]) -> Iterator[Any]:
        for item in gen:
            token, _, from_draft = item
            self.tokens.append(int(token))
            self.flags.append(bool(from_draft))
            yield item

    def rounds(self) -> list[dict[str, Any]]:
        """One round per target verify after the prefill's token: its accepted drafts and the bonus token."""
        out: list[dict[str, Any]] = []
        emitted, i = 1, 1  # the prefill's token comes first
        while i < len(self.flags):
            drafted = min(self.k, max(self.max_tokens - emitted, 0))
            accepted = 0
            while i < len(self.flags) and self.flags[i]:
                accepted, i = accepted + 1, i + 1
            committed = accepted
            if i < len(self.flags):  # the bonus token (absent where max_tokens cut the round)
                committed, i = committed + 1, i + 1
            out.append({"drafted": drafted, "accepted": accepted, "committed": committed, "source": DRAFT_SOURCE})
            emitted += committed
        for r, trim in zip(out, self.trims):
            r["trim"] = trim
        return out


@contextlib.contextmanager
def recording(recorder: Recorder) -> Iterator[None]:
    """``mtp_speculative_generate_step`` observed (``stream_generate`` and the CLI look it up at call time) and
    every ``cache.trim_prompt_cache`` it makes recorded with what it returned."""
    g = generate_module()
    loop, trim = g.mtp_speculative_generate_step, g.cache.trim_prompt_cache

    def observed(prompt: Any, *args: Any, **kw: Any) -> Iterator[Any]:
        recorder.prompt = [int(x) for x in prompt.tolist()]
        recorder.k = int(kw.get("num_draft_tokens", DEFAULT_DRAFTS))  # its CLI passes its own (3)
        return recorder.wrap(loop(prompt, *args, **kw))

    def recorded_trim(cache: list[Any], num_tokens: int) -> Any:
        stuck = sorted({type(c).__name__ for c in cache if not c.is_trimmable()})
        offsets = sorted({int(c.offset) for c in cache})
        trimmed = trim(cache, num_tokens)
        recorder.trims.append({"asked": int(num_tokens), "trimmed": int(trimmed or 0), "not_trimmable": stuck,
                               "offsets": offsets})
        return trimmed

    g.mtp_speculative_generate_step, g.cache.trim_prompt_cache = observed, recorded_trim
    try:
        yield
    finally:
        g.mtp_speculative_generate_step, g.cache.trim_prompt_cache = loop, trim


def load_pair(target: str, draft: str | None) -> dict[str, Any]:
    """The fork's own loader on both checkpoints; the drafter must be an MTP drafter (``is_mtp_drafter``)."""
    check_fork()
    from mlx_lm import load

    if not draft:
        raise RuntimeError("its MTP loop drafts with a gemma4_assistant drafter: give --draft-model")
    model, tokenizer = load(target)[:2]
    drafter = load(draft)[0]
    if not generate_module().is_mtp_drafter(drafter):
        kind = getattr(drafter, "model_type", type(drafter).__name__)
        raise RuntimeError(f"the drafter {draft} is a {kind} model, not an MTP drafter (gemma4_assistant): its"
                           " stream_generate would take mlx-lm's classic speculative loop (build a pair with"
                           " specparity fixtures make DIR --dflash gemma4-e2b --drafter-format gemma4-assistant)")
    return {"model": model, "tokenizer": tokenizer, "draft": drafter}


def run_cli(target: str, draft: str, prompt_text: str, n: int) -> str:
    """``mlx_lm generate --model T --draft-model D --prompt TEXT --max-tokens N`` in this process (its main, as its
    console script runs it): its stdout, the text."""
    g = generate_module()
    argv = ["mlx_lm.generate", "--model", target, "--draft-model", draft, "--prompt", prompt_text,
            "--max-tokens", str(n)]
    out, err = io.StringIO(), io.StringIO()
    old = sys.argv
    sys.argv = argv
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            g.main()
    except SystemExit as exit_:
        if exit_.code not in (0, None):
            raise RuntimeError(f"mlx_lm generate exited {exit_.code}: {err.getvalue().strip()[-300:]}") from None
    finally:
        sys.argv = old
    return out.getvalue()


def run_entry(entry: str, pair: Callable[[], dict[str, Any]], target: str, draft: str | None, prompt: list[int],
              n: int, ref: Classic) -> Finding:
    """One entry point judged against classic decode, its rounds and rollbacks from its own record."""
    import mlx.core as mx

    f = Finding(DISTRIBUTION, entry)
    t0 = time.perf_counter()
    recorder = Recorder(DEFAULT_DRAFTS, n)
    try:
        loaded = pair()
        g = generate_module()
        with recording(recorder):
            if entry == "mtp_speculative_generate_step":
                # a step generator runs on past eos (as mlx-lm's generate_step does): its callers stop at the
                # tokenizer's eos, so the loop here stops there as they do, and classic decode stops there too
                for token, *_ in g.mtp_speculative_generate_step(mx.array(prompt), loaded["model"], loaded["draft"],
                                                                 max_tokens=n):
                    if int(token) in ref.eos:
                        break
            elif entry == "stream_generate":
                for _ in g.stream_generate(loaded["model"], loaded["tokenizer"], mx.array(prompt), max_tokens=n,
                                           draft_model=loaded["draft"]):
                    pass
            else:
                run_cli(target, str(draft), loaded["tokenizer"].decode(prompt), n)
        if recorder.prompt is None:
            raise RuntimeError(f"{entry} never ran mtp_speculative_generate_step (it took another loop)")
        if recorder.prompt != list(prompt):  # its CLI encodes the prompt's text again
            f.prompt = recorder.prompt
        f.tokens, f.rounds = list(recorder.tokens), recorder.rounds()
        f.drafted = sum(r["drafted"] for r in f.rounds)
        f.accepted = sum(r["accepted"] for r in f.rounds)
        classic = ref.tokens(f.prompt if f.prompt is not None else list(prompt))
        judge(f, classic, ref.eos, 1)  # the prefill's token comes before round 1
        stuck = [(r, rec["trim"]) for r, rec in enumerate(f.rounds, start=1)
                 if rec.get("trim") and rec["trim"]["trimmed"] < rec["trim"]["asked"]]
        if stuck:
            r, trim = stuck[0]
            f.reason += (f"; after round {r} its rollback asked cache.trim_prompt_cache for {trim['asked']} rejected"
                         f" rows and it trimmed {trim['trimmed']} (cache offsets {trim['offsets']}; not trimmable:"
                         f" {', '.join(trim['not_trimmable']) or 'none'}): {len(stuck)} of {len(f.rounds)} rollbacks"
                         " kept rejected rows in the target's cache")
    except Exception as err:  # noqa: BLE001  (the engine's own error is the finding)
        failed(f, err)
    f.seconds = time.perf_counter() - t0
    return f


def loops(target: str, draft: str | None, prompt: list[int], n: int, ref: Classic,
          entries: tuple[str, ...] = ()) -> list[Finding]:
    """Each mlx-lm-broomva entry point (``entries``; all when empty) on one loaded pair."""
    pair = load_once(lambda: load_pair(target, draft))
    return [run_entry(entry, pair, target, draft, list(prompt), n, ref)
            for entry in ENTRY_NAMES if not entries or entry in entries]
