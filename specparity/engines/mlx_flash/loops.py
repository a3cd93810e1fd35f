"""mlx-flash's own loops against classic decode (``e2e --engine mlx-flash``, the findings table).

The target is loaded as its server loads it (``mlx_lm.load``); each loop is built with its library defaults
and given only the prompt's ids and ``max_tokens`` (its server passes the same). Entry points:

- ``LayerSkipEngine.generate``: self-speculative, no drafter (the first half of the target's layers drafts
  K = 5 tokens); what ``mlx-flash --speculative layerskip`` builds.
- ``DFlashRunner.generate``: the z-lab DFlash drafter beside the target (``--draft-model``, the project's
  DFlash fixture), loaded by its ``DFlashDraftModel.from_pretrained``; it takes a prompt's text: its tokenizer
  is handed the prompt's ids for that text, and its decode of the completion gives its tokens.
  ``DFlashRunner.generate accept_top_k=4`` is its documented quality-for-speed mode (lossy by design).
- ``DFlashEngine.generate``: without a drafter, as its server builds it for ``--speculative dflash`` (plain
  decoding: nothing drafts); ``DFlashEngine.generate BlockDiffusionDrafter``: with its own block-diffusion
  drafter, which has no loader and no trained weights anywhere (its initialization).
- ``EAGLE3Engine.generate``: its EAGLE head (``EAGLEDraftHead``) from the fixture's ``eagle/`` folder, loaded by
  its ``EAGLE3Trainer.load``; ``EAGLE3Engine.generate untrained head``: the head it makes itself when given none,
  as its server builds it for ``--speculative eagle3``.
- ``mlx-flash --speculative layerskip|eagle3|dflash``: its server's start (``InferenceState``), run in process:
  on Linux it stops at the macOS tool it calls (``cannot_run`` with that cause).

Its acceptance record, round by round: one round per verify, its drafts and accepted drafts read off the
loop's own verify step (LayerSkip's ``acceptance_counts``, DFlashRunner's ``_verify_with_threshold``, the
other two's ``verify`` result), its committed tokens those the round appended.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specparity.engines.mlx_flash.fixtures import EAGLE_CONFIG, EAGLE_DIR, EAGLE_WEIGHTS
from specparity.probes.engine_e2e import Classic, Finding, failed, judge, judge_rounds, load_once
from specparity.verdicts import Verdict

ENGINE = "mlx-flash"
# its DFlashRunner's documented quality-for-speed mode ("Higher values trade quality for speed") at this k
LOSSY_TOP_K = 4
SERVER_ENTRIES = tuple(f"mlx-flash --speculative {mode}" for mode in ("layerskip", "eagle3", "dflash"))
ENTRY_NAMES = (
    "LayerSkipEngine.generate",
    "DFlashRunner.generate",
    f"DFlashRunner.generate accept_top_k={LOSSY_TOP_K}",
    "DFlashEngine.generate",
    "DFlashEngine.generate BlockDiffusionDrafter",
    "EAGLE3Engine.generate",
    "EAGLE3Engine.generate untrained head",
    *SERVER_ENTRIES,
)
LOSSY = {f"DFlashRunner.generate accept_top_k={LOSSY_TOP_K}": (
    {"accept_top_k": LOSSY_TOP_K},
    f"accept_top_k={LOSSY_TOP_K}, mlx-flash's documented DFlash mode (\"Higher values trade quality for speed\"):"
    f" a draft in the target's top {LOSSY_TOP_K} is accepted")}


def load_target(target: str) -> dict[str, Any]:
    """The target as its server loads it (``mlx_lm.load``), once for every entry point."""
    from mlx_lm import load

    model, tokenizer = load(target)[:2]
    return {"model": model, "tokenizer": tokenizer}


def eagle_dir(target: str) -> Path:
    return Path(target).resolve().parent / EAGLE_DIR


class IdsTokenizer:
    """Its tokenizer, except that ``encode`` of the prompt's text gives the prompt's ids (DFlashRunner takes
    text) and ``decode`` keeps the ids it is given (DFlashRunner returns text: the last decode is its
    completion's tokens). Everything else is the tokenizer's own."""

    def __init__(self, tokenizer: Any, prompt: list[int]):
        self._tokenizer, self._prompt = tokenizer, list(prompt)
        self.decoded: list[int] | None = None

    def encode(self, text: str, *args: Any, **kw: Any) -> list[int]:
        return list(self._prompt)

    def decode(self, ids: Any, *args: Any, **kw: Any) -> str:
        self.decoded = [int(i) for i in ids]
        return str(self._tokenizer.decode(self.decoded))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)


def layerskip(pair: dict[str, Any], prompt: list[int], n: int, f: Finding) -> int:
    """``LayerSkipEngine(model, tokenizer).generate``: its defaults (K = 5, exit at half the layers)."""
    import mlx.core as mx
    from mlx_flash_compress.layerskip import LayerSkipEngine

    engine = LayerSkipEngine(pair["model"], pair["tokenizer"])
    committed: list[int] = []
    out = engine.generate(mx.array(prompt), max_tokens=n, callback=lambda new: committed.append(len(new)))
    f.tokens = [int(t) for t in out.tolist()[len(prompt):]]
    k, source = engine.config.num_speculative_tokens, f"its layers 0..{engine.drafter.get_exit_layer() - 1}"
    f.rounds = [{"drafted": k, "accepted": int(a), "committed": c, "source": source}
                for a, c in zip(engine.stats["acceptance_counts"], committed)]
    return 1  # the prefill's token comes before round 1


def dflash_runner(pair: dict[str, Any], draft: str | None, prompt: list[int], n: int, f: Finding,
                  options: dict[str, Any]) -> int:
    """``DFlashRunner(model, tokenizer, drafter, config).generate(text, max_tokens)``: its defaults (cached, its
    config's block), the drafter from ``DFlashDraftModel.from_pretrained``."""
    from mlx_flash_compress.dflash_model import DFlashDraftModel, DFlashRunner

    if not draft:
        raise RuntimeError("DFlashRunner drafts with a z-lab DFlash drafter: give --draft-model (a DFlash fixture's)")
    drafter, config = DFlashDraftModel.from_pretrained(draft)
    tokenizer = IdsTokenizer(pair["tokenizer"], prompt)
    runner = DFlashRunner(pair["model"], tokenizer, drafter, config)
    own = runner._verify_with_threshold

    def observed(predictions: Any, draft_np: list[int], *args: Any, **kw: Any) -> int:
        accepted = int(own(predictions, draft_np, *args, **kw))
        f.rounds.append({"drafted": len(draft_np), "accepted": accepted, "committed": 0, "source": "DFlash drafter"})
        return accepted

    runner._verify_with_threshold = observed
    _, summary = runner.generate(pair["tokenizer"].decode(prompt), max_tokens=n, **options)
    f.tokens = list(tokenizer.decoded or [])
    # each round appends its accepted drafts and one target token, save where every draft was accepted and the
    # uncached loop adds none
    cached = bool(summary.get("cached"))
    for rec in f.rounds:
        rec["committed"] = rec["accepted"] + (1 if cached or rec["accepted"] < rec["drafted"] else 0)
    if not cached:
        f.reason = "its cached loop raised and generate fell back to its uncached loop (it says cached: false)"
    return 0


def dflash_engine(pair: dict[str, Any], prompt: list[int], n: int, f: Finding, with_drafter: bool) -> int:
    """``DFlashEngine(model, drafter, DFlashConfig(), tokenizer).generate``: without a drafter as its server builds
    it, or with its own ``BlockDiffusionDrafter`` (its initialization, sized to the layers it reads)."""
    import mlx.core as mx
    from mlx_flash_compress.dflash import BlockDiffusionDrafter, DFlashConfig, DFlashEngine

    model, tokenizer = pair["model"], pair["tokenizer"]
    engine = DFlashEngine(model, None, DFlashConfig(), tokenizer=tokenizer)
    if with_drafter:
        mx.random.seed(0)  # its drafts start from mx.random.normal noise
        layers = engine._get_model_num_layers()
        read = len({i for i in engine.config.checkpoint_layers if i < layers})
        hidden = int(model.model.embed_tokens.weight.shape[-1])
        vocab = int(model.model.embed_tokens.weight.shape[0])
        engine.drafter = BlockDiffusionDrafter(vocab, hidden, num_draft_positions=engine.config.num_spec_tokens,
                                               num_checkpoint_layers=read)
    source = "BlockDiffusionDrafter" if with_drafter else "no drafter: one target step"
    own = engine.verify_tokens

    def observed(input_ids: Any, draft_tokens: Any) -> Any:
        accepted, count = own(input_ids, draft_tokens)
        drafts, kept = [int(t) for t in draft_tokens.tolist()], [int(t) for t in accepted.tolist()]
        k = next((i for i, (a, b) in enumerate(zip(drafts, kept)) if a != b), min(len(drafts), len(kept)))
        f.rounds.append({"drafted": len(drafts), "accepted": k, "committed": len(kept), "source": source})
        return accepted, count

    engine.verify_tokens = observed
    steps: list[int] = []
    out = engine.generate(mx.array(prompt), max_tokens=n, callback=lambda new, stats: steps.append(len(new)))
    f.tokens = [int(t) for t in out.tolist()[len(prompt):]]
    if not with_drafter:  # its fallback: one target step per token, nothing drafted
        f.rounds = [{"drafted": 0, "accepted": 0, "committed": c, "source": source} for c in steps]
    return 0


def load_eagle_head(target: str) -> Any:
    """The fixture's EAGLE head through its own ``EAGLE3Trainer.load`` (the shape from the head's record)."""
    from mlx_flash_compress.eagle3 import EAGLE3Trainer

    folder = eagle_dir(target)
    if not (folder / EAGLE_CONFIG).is_file():
        raise RuntimeError(f"no EAGLE head beside the target ({folder}): build the fixture with"
                           " --drafter-format mlx-flash")
    shape = json.loads((folder / EAGLE_CONFIG).read_text())
    return EAGLE3Trainer.load(str(folder / EAGLE_WEIGHTS), hidden_dim=int(shape["hidden_dim"]),
                              num_heads=int(shape["num_heads"]), num_layers=int(shape["num_layers"]))


def eagle(pair: dict[str, Any], target: str, prompt: list[int], n: int, f: Finding, trained: bool) -> int:
    """``EAGLE3Engine(model, tokenizer, draft_head=...).generate``: its defaults (6 drafts a round)."""
    import mlx.core as mx
    from mlx_flash_compress.eagle3 import EAGLE3Engine

    if not trained:
        mx.random.seed(0)  # the head it initializes itself
    engine = EAGLE3Engine(pair["model"], pair["tokenizer"], draft_head=load_eagle_head(target) if trained else None)
    committed: list[int] = []
    out = engine.generate(mx.array(prompt), max_tokens=n, callback=lambda new: committed.append(len(new)))
    f.tokens = [int(t) for t in out.tolist()[len(prompt):]]
    k = engine.config.num_draft_tokens
    f.rounds = [{"drafted": k, "accepted": int(a), "committed": c,
                 "source": "EAGLE head" if trained else "EAGLE head, untrained"}
                for a, c in zip(engine.stats["acceptance_counts"], committed)]
    return 0


def server_start(target: str, entry: str, f: Finding) -> None:
    """Its server's start as ``mlx-flash --model TARGET --speculative MODE`` runs it (``InferenceState``, then the
    load that builds its speculative engine): where a macOS tool it calls is missing, ``cannot_run``."""
    from mlx_flash_compress.serve import InferenceState

    mode = entry.rsplit(" ", 1)[-1]
    try:
        state = InferenceState(target, speculative=mode)
        state.load_model()
    except FileNotFoundError as err:
        tool = err.filename or str(err)
        f.verdict = Verdict.CANNOT_RUN
        f.reason = (f"its server's start calls the macOS tool {tool!r} (mlx_flash_compress.hardware.detect_hardware),"
                    f" which {sys.platform} lacks: FileNotFoundError, uncaught, so the server never listens")
        f.failure = f"FileNotFoundError: {err}"
        return
    f.verdict, f.reason = Verdict.ERROR, "its server started here: run its loop served (not done by this version)"


def run_entry(entry: str, pair: Callable[[], dict[str, Any]], target: str, draft: str | None, prompt: list[int],
              n: int, classic: list[int], eos: set[int]) -> Finding:
    f = Finding(ENGINE, entry)
    t0 = time.perf_counter()
    if entry in SERVER_ENTRIES:
        try:
            server_start(target, entry, f)
        except Exception as err:  # noqa: BLE001  (the engine's own error is the finding)
            failed(f, err)
        f.seconds = time.perf_counter() - t0
        return f
    options: dict[str, Any] = {}
    if entry in LOSSY:
        options, f.lossy = LOSSY[entry]
    try:
        loaded = pair()
        if entry == "LayerSkipEngine.generate":
            offset = layerskip(loaded, prompt, n, f)
        elif entry.startswith("DFlashRunner.generate"):
            offset = dflash_runner(loaded, draft, prompt, n, f, options)
        elif entry.startswith("DFlashEngine.generate"):
            offset = dflash_engine(loaded, prompt, n, f, with_drafter=entry.endswith("BlockDiffusionDrafter"))
        elif entry.startswith("EAGLE3Engine.generate"):
            offset = eagle(loaded, target, prompt, n, f, trained=not entry.endswith("untrained head"))
        else:
            raise ValueError(entry)
        said = f.reason
        judge_rounds(f)
        judge(f, classic, eos, offset)
        if said:
            f.reason = f"{f.reason}; {said}"
    except Exception as err:  # noqa: BLE001  (the engine's own error is the finding)
        failed(f, err)
    f.seconds = time.perf_counter() - t0
    return f


def loops(target: str, draft: str | None, prompt: list[int], n: int, ref: Classic,
          entries: tuple[str, ...] = ()) -> list[Finding]:
    """Each mlx-flash entry point (``entries``; all when empty) on one loaded target."""
    classic, eos = ref.tokens(prompt), ref.eos
    pair = load_once(lambda: load_target(target))
    return [run_entry(entry, pair, target, draft, list(prompt), n, classic, eos)
            for entry in ENTRY_NAMES if not entries or entry in entries]
