"""nunspark's own loops against classic decode (``e2e --engine nunspark``, the findings table).

Each loop runs on the target packed by nunspark's own packer (``nunspark.packer.pack``, what ``nunspark
pack`` runs) and loaded as its CLI loads it (``StreamingEngine`` with the ``auto`` budget), its drafter
loaded by ``mlx_lm.load`` as its CLI loads a ``--draft-model``; only the prompt's ids, ``max_tokens`` and
the tokenizer's eos (what its CLI and server pass) are given, everything else is the library's default.

Its acceptance record, round by round: each target pass after the prefill's token is one round (a verify
sweep of [b, drafts] through ``verify_forward`` or ``forward``, or a single greedy step where the n-gram
drafter found nothing), its drafts accepted that round read off the loop's own ``SpecStats``
(``accepted_total``; the adaptive loop keeps none there, so its ``acceptance_history`` times the round's
drafts), its tokens counted as the loop yields them.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from specparity.probes.engine_e2e import Classic, Finding, failed, judge, load_once

# accept_top_k above 1 is lossy by nunspark's own documentation; its entry point runs it at this k
LOSSY_TOP_K = 4
# (entry point, how it drafts): the library's loops, then its CLI as a user types it, then its lossy mode
ENTRY_POINTS = (
    ("speculative_generate", "draft model"),
    ("ngram_speculative_generate", "n-gram lookup"),
    ("adaptive_speculative_generate", "draft model, adaptive K"),
    ("eagle_speculative_generate", "EAGLE drafter"),
    ("gemma4_mtp_speculative_generate", "Gemma 4 assistant"),
    ("nunspark generate --draft-model", "draft model"),
    ("nunspark generate --ngram-draft", "n-gram lookup"),
    (f"speculative_generate accept_top_k={LOSSY_TOP_K}", "draft model, its documented lossy mode"),
)
ENTRY_NAMES = tuple(entry for entry, _ in ENTRY_POINTS)
# its documented lossy fast mode as an entry point: the library loop it runs, its options and what the mode is
LOSSY = {f"speculative_generate accept_top_k={LOSSY_TOP_K}": (
    "speculative_generate", {"accept_top_k": LOSSY_TOP_K},
    f"accept_top_k={LOSSY_TOP_K}, nunspark's documented fast mode: a draft in the target's top {LOSSY_TOP_K} is"
    " accepted, trading exactness for acceptance")}
# the loops each CLI entry point runs (cli.main imports it from nunspark.generate at call time)
_CLI_LOOP = {"nunspark generate --draft-model": "speculative_generate",
             "nunspark generate --ngram-draft": "ngram_speculative_generate"}


class RoundRecorder:
    """The loop's acceptance record: one round per target pass after its first token (the prefill's).

    ``stats``: the ``SpecStats`` the loop keeps (its ``accepted_total``, or an ``AdaptiveSpecStats``'s
    ``acceptance_history``), read as each round closes.
    """

    def __init__(self, source: str):
        self.source = source
        self.rounds: list[dict[str, Any]] = []
        self.tokens: list[int] = []
        self.stats: Any = None
        self.armed = False
        self._seen = 0

    def target_pass(self, width: int) -> None:
        if not self.armed:
            return  # the prefill's passes
        self.close()
        source = self.source if width > 1 else "greedy step (nothing drafted)"
        self.rounds.append({"drafted": width - 1, "accepted": 0, "committed": 0, "source": source})

    def close(self) -> None:
        """The last round's accepted drafts, from the loop's own stats."""
        if not self.rounds or self.stats is None:
            return
        last = self.rounds[-1]
        history = getattr(self.stats, "acceptance_history", None)
        if history is not None:
            i = len(self.rounds) - 1
            last["accepted"] = round(history[i] * last["drafted"]) if i < len(history) else 0
        else:
            total = int(self.stats.accepted_total)
            last["accepted"], self._seen = total - self._seen, total

    def wrap(self, gen: Iterator[int]) -> Iterator[int]:
        for token in gen:
            self.tokens.append(int(token))
            if self.rounds:
                self.rounds[-1]["committed"] += 1
            self.armed = True
            yield token
        self.close()


@contextlib.contextmanager
def recording(recorder: RoundRecorder) -> Iterator[None]:
    """``StreamingEngine.forward`` / ``verify_forward`` counted as rounds while the loop runs (class-level:
    its CLI builds its own engine)."""
    from nunspark.engine import StreamingEngine

    forward, verify = StreamingEngine.forward, StreamingEngine.verify_forward

    def rec_forward(self: Any, tokens: Any, *args: Any, **kw: Any) -> Any:
        recorder.target_pass(int(tokens.size))
        return forward(self, tokens, *args, **kw)

    def rec_verify(self: Any, tokens: Any, kv: Any) -> Any:
        recorder.target_pass(int(tokens.size))
        return verify(self, tokens, kv)

    StreamingEngine.forward, StreamingEngine.verify_forward = rec_forward, rec_verify
    try:
        yield
    finally:
        StreamingEngine.forward, StreamingEngine.verify_forward = forward, verify


@contextlib.contextmanager
def observed_cli_loop(name: str, recorder: RoundRecorder) -> Iterator[None]:
    """nunspark's CLI runs ``nunspark.generate.<name>``: the same loop, its tokens and its stats observed."""
    import nunspark.generate as gen_mod

    loop = getattr(gen_mod, name)

    def observed(*args: Any, **kw: Any) -> Iterator[int]:
        recorder.stats = kw.get("stats")
        return recorder.wrap(loop(*args, **kw))

    setattr(gen_mod, name, observed)
    try:
        yield
    finally:
        setattr(gen_mod, name, loop)


def pack_target(target: str) -> Path:
    """The target packed by nunspark's own packer into a fresh folder (removed when the process ends)."""
    import atexit
    import shutil

    from nunspark.packer import pack

    root = Path(tempfile.mkdtemp(prefix="specparity-nunspark-"))
    atexit.register(shutil.rmtree, root, True)
    out = root / "packed"
    with contextlib.redirect_stdout(io.StringIO()):
        pack(target, str(out))
    return out


def load_pair(target: str, draft: str | None) -> dict[str, Any]:
    """nunspark's own loaders, as its CLI runs them: the packed target, its tokenizer, the drafter."""
    from mlx_lm import load as load_mlxlm
    from mlx_lm.tokenizer_utils import load as load_tokenizer
    from nunspark.engine import StreamingEngine
    from nunspark.manifest import Manifest
    from nunspark.sysmem import resolve_budget

    packed = pack_target(target)
    manifest = Manifest.load(packed / "manifest.json")
    engine = StreamingEngine(str(packed), manifest, budget_bytes=resolve_budget("auto"))
    tokenizer = load_tokenizer(packed)
    drafter = load_mlxlm(draft)[0] if draft else None
    return {"packed": packed, "manifest": manifest, "engine": engine, "tokenizer": tokenizer, "draft": drafter}


EAGLE_SEED = 0  # the untrained EAGLE drafter's initialization: the same weights every run


def eagle_drafter(manifest: Any) -> Any:
    """An EAGLE drafter as its CLI builds one from a drafter folder without config or weights (the config from
    the target's, the weights its own initialization): no trained drafter in its format is built here. Its
    initialization draws from MLX's global generator, seeded here first: unseeded, a random draft was now and then
    accepted, and the same run read not_engaged one time and match the next."""
    import mlx.core as mx
    from nunspark.eagle_drafter import EagleConfig, EagleDrafter, EagleDrafterModel

    mx.random.seed(EAGLE_SEED)
    return EagleDrafter(EagleDrafterModel(EagleConfig(**EagleConfig.from_target_config(manifest.config).__dict__)))


def library_loop(entry: str, pair: dict[str, Any], prompt: list[int], n: int, eos: int | None,
                 recorder: RoundRecorder, options: dict[str, Any] | None = None) -> Iterator[int]:
    """One of nunspark's library loops on the loaded pair, with its own stats (a fresh request); ``options``:
    keyword arguments of the loop beyond its defaults (the lossy mode's ``accept_top_k``, a control's
    ``adjustment_interval``)."""
    from nunspark import generate as g
    from nunspark.ngram_drafter import NGramDrafter

    engine, draft = pair["engine"], pair["draft"]
    stats = g.AdaptiveSpecStats() if entry == "adaptive_speculative_generate" else g.SpecStats()
    recorder.stats = stats
    kw: dict[str, Any] = {"max_tokens": n, "eos_id": eos, "stats": stats, **(options or {})}
    if entry in ("speculative_generate", "adaptive_speculative_generate") and draft is None:
        raise RuntimeError(f"{entry} drafts with a draft model: give --draft-model")
    if entry == "speculative_generate":
        return recorder.wrap(g.speculative_generate(engine, draft, prompt, **kw))
    if entry == "ngram_speculative_generate":
        return recorder.wrap(g.ngram_speculative_generate(engine, NGramDrafter(), prompt, **kw))
    if entry == "adaptive_speculative_generate":
        return recorder.wrap(g.adaptive_speculative_generate(engine, draft, prompt, **kw))
    if entry == "eagle_speculative_generate":
        return recorder.wrap(g.eagle_speculative_generate(engine, eagle_drafter(pair["manifest"]), prompt, **kw))
    raise ValueError(entry)


def cli_argv(entry: str, packed: Path, draft: str | None, prompt: list[int], n: int) -> list[str]:
    """``nunspark generate`` as a user types it for this entry point."""
    argv = ["generate", str(packed), "--prompt-ids", ",".join(map(str, prompt)), "--max-tokens", str(n)]
    if entry.endswith("--draft-model"):
        if not draft:
            raise RuntimeError(f"{entry}: give --draft-model")
        return [*argv, "--draft-model", draft]
    return [*argv, "--ngram-draft"]


def run_cli(entry: str, packed: Path, draft: str | None, prompt: list[int], n: int,
            recorder: RoundRecorder) -> None:
    """``nunspark.cli.main`` in this process (its stdout, the text, kept apart), its loop observed."""
    from nunspark.cli import main

    out, err = io.StringIO(), io.StringIO()
    with observed_cli_loop(_CLI_LOOP[entry], recorder), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        code = main(cli_argv(entry, packed, draft, prompt, n))
    if code != 0:
        raise RuntimeError(f"nunspark generate exited {code}: {err.getvalue().strip()[-300:]}")


def run_entry(entry: str, pair: Callable[[], dict[str, Any]], prompt: list[int], n: int, classic: list[int],
              eos: set[int], draft: str | None, options: dict[str, Any] | None = None) -> tuple[Finding, Any]:
    """One entry point judged against classic decode, and the ``SpecStats`` its loop kept (``options``: a
    library loop's arguments beyond its defaults)."""
    f = Finding("nunspark", entry)
    source = dict(ENTRY_POINTS).get(entry, "draft model")
    loop = entry
    if entry in LOSSY:  # its documented lossy mode: judged lossy_by_design with what it changed
        loop, mode_options, f.lossy = LOSSY[entry]
        options = {**mode_options, **(options or {})}
    recorder = RoundRecorder(source)
    t0 = time.perf_counter()
    try:
        loaded = pair()
        eos_id = getattr(loaded["tokenizer"], "eos_token_id", None)
        if entry == "gemma4_mtp_speculative_generate":
            if loaded["manifest"].model_type not in ("gemma4", "gemma4_text"):
                raise RuntimeError(f"it drafts with a gemma4_assistant drafter for a Gemma 4 target; this target is"
                                   f" {loaded['manifest'].model_type} and no fixture in that format is built here")
        with recording(recorder):
            if entry in _CLI_LOOP:
                run_cli(entry, loaded["packed"], draft, prompt, n, recorder)
            else:
                for _ in library_loop(loop, loaded, prompt, n, eos_id, recorder, options):
                    pass
        f.tokens, f.rounds = list(recorder.tokens), recorder.rounds
        f.drafted = sum(r["drafted"] for r in f.rounds)
        f.accepted = sum(r["accepted"] for r in f.rounds)
        judge(f, classic, eos, 1)  # the prefill's token comes before round 1
        stats = recorder.stats
        if f.lossy and stats is not None and hasattr(stats, "accepted_offpath"):
            f.reason += (f"; {int(stats.accepted_offpath)} of {int(stats.accepted_total)} accepted drafts were not"
                         " the target's argmax (its own count)")
    except Exception as err:  # noqa: BLE001  (the engine's own error is the finding)
        failed(f, err)
        if entry == "gemma4_mtp_speculative_generate" and "no fixture" in str(err):
            f.reason = "no Gemma 4 target with its assistant drafter here: not run, not a pass"
    f.seconds = time.perf_counter() - t0
    return f, recorder.stats


def loops(target: str, draft: str | None, prompt: list[int], n: int, ref: Classic,
          entries: tuple[str, ...] = ()) -> list[Finding]:
    """Each nunspark entry point (``entries``; all when empty) on one packed target and loaded drafter."""
    classic, eos = ref.tokens(prompt), ref.eos
    pair = load_once(lambda: load_pair(target, draft))
    return [run_entry(entry, pair, list(prompt), n, classic, eos, draft)[0]
            for entry in ENTRY_NAMES if not entries or entry in entries]

