"""The engine adapter interface: what the probe, replay and bisect need from an engine.

An engine verifies blocks its own way (its own forward over the target, its
own caches, its own rollback); the toolkit compares what it computes with
classic decode on the same weights. An adapter exposes exactly that, and
nothing of the engine's drafting:

- :meth:`Engine.session`: a fresh target state for one request, the engine's
  own cache types;
- :meth:`TargetSession.prefill`: the prompt, fed as the engine feeds it;
- :meth:`TargetSession.verify`: one verify block, through the engine's own
  verify forward, returning its logits;
- :meth:`TargetSession.rollback`: keep the block's first ``accepted + 1`` rows,
  the engine's own way (trim, snapshot, tape replay...);
- :meth:`TargetSession.state`: every layer's state, as
  :func:`specparity.decode.snapshot` lays it out, so it compares with classic
  decode's cache byte for byte;
- :meth:`Engine.generate`: the engine's own speculative loop on one prompt,
  recorded round by round (:class:`EngineRun`).

Classic decode is mlx-lm's own path (:class:`specparity.decode.Decoder`) on
the same weights; :meth:`Engine.classic` is the context it must run in (an
engine that patches mlx-lm's classes takes its patches out there).

One module per engine: ``mlx_lm.py``, ``dflash_mlx.py``; the engine registry
(:mod:`specparity.engines`) says which an engine loads, and how.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Self

from specparity.decode import LayerState
from specparity.errors import InfrastructureError


# Names a known defect an adapter injects into the engine's own calls, to show a detector
# fires (tests, and anyone checking the toolkit): ``stale-row`` (a rollback keeps one rejected
# row: the KV cache one row long, the recurrent state replayed one step too far) or
# ``verify-row`` (the verify block's rows past the first scaled by 1 + 2**-6).
FAULT_ENV = "SPECPARITY_ENGINE_FAULT"
FAULTS = ("stale-row", "verify-row")

# The optional parts of the checks an adapter may support (:attr:`Engine.features`), beyond what every
# adapter does (verify, rollback, state, its own prefill and loop). A command given an option of a part its
# engine's adapter lacks says the option is not applied; nothing asks an engine's name.
FEATURES = {
    "cache-options": "the classic reference and the engine run the cache a server runs (--kv-bits,"
                     " --kv-group-size, --quantized-kv-start, --max-kv-size)",
    "walk": "probe --walk: consecutive full-accept blocks from the prefilled state",
    "prefill-parity": "probe --prefill: one-shot, chunked and token-by-token classic prefill compared",
    "aim": "probe --aim: blocks and walks placed to straddle every cache boundary",
    "classic-prefill": "the engine's prefill is classic decode's own: its own-prefill check would compare"
                       " classic decode with itself (prefill parity covers it)",
    "control-arms": "bisect --control: the same cell rerun under other settings, in subprocesses"
                    " (`bisect dump` of the classic arms)",
    "anchor-prefill": "replay of a served accept vector: the session prefills all but the last prompt token"
                      " and round 0's block starts with it, as a server's speculative loop does"
                      " (TargetSession.prefill_anchor)",
    "layer-offsets": "replay: every layer's cache offset after each rewind (TargetSession.offsets), so a"
                     " rewind that silently did nothing or left a stale row is named by its round",
    "rewind-modes": "replay: the session says how it rewinds, trim or snapshot-and-recompute, fixed for the"
                    " request (TargetSession.rewind), and a rollback returns the rows it reports dropped",
}


class EngineUnavailable(InfrastructureError):
    """The engine is not installed in this interpreter, or will not load the checkpoint."""


class EngineCannotRun(Exception):
    """The engine raised while running this shape: reported as not run, with the engine's error.

    shape: what was asked (``width 16 after 12 positions``...). error: the engine's
    own error, ``Type: message``.
    """

    def __init__(self, shape: str, error: BaseException):
        self.shape = shape
        self.error = f"{type(error).__name__}: {error}"
        super().__init__(f"the engine cannot run {shape}: {self.error}")


@dataclass
class EngineInfo:
    """What was loaded.

    name / version: the engine and its package version. target / draft: checkpoint paths.
    block_size: rows of the engine's verify block (None: the engine has no fixed block).
    widths: the verify widths the probe checks by default: the engine's block and the
      reduced block its own policy switches to (dflash-mlx: 4). A block the engine
      shortens because fewer tokens remain (any width below its block) is not listed:
      the engine's own run, replayed round by round, meets those; ``--widths`` probes them.
    family: the engine's name for the target's family (``hybrid_gdn``...).
    notes: how the engine runs here (backend, fallbacks), one line each.
    packages: versions of the engine and of mlx / mlx-lm in this interpreter.
    fault: an injected fault (:data:`FAULT_ENV`), None on a clean run.
    """

    name: str
    version: str
    target: str
    draft: str | None
    block_size: int | None
    widths: list[int]
    family: str = ""
    notes: list[str] = field(default_factory=list)
    packages: dict[str, str | None] = field(default_factory=dict)
    fault: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class TargetSession(ABC):
    """One request's target state inside an engine."""

    @abstractmethod
    def prefill(self, prompt: list[int]) -> Any:
        """Feed the whole prompt as the engine does; return the last row's logits (1, vocab)."""

    @abstractmethod
    def verify(self, tokens: list[int]) -> Any:
        """One verify block over ``tokens`` through the engine's verify forward: logits (rows, vocab)."""

    @abstractmethod
    def rollback(self, accepted: int) -> int | None:
        """After :meth:`verify`, keep its first ``accepted + 1`` rows, as the engine rolls back; the rows it
        reports dropped (None: it reports nothing; ``rewind-modes`` adapters report)."""

    @abstractmethod
    def state(self) -> list[LayerState]:
        """Every layer's state (:func:`specparity.decode.snapshot` layout)."""

    def state_unevaluated(self) -> list[LayerState]:
        """:meth:`state`, its arrays possibly not evaluated yet: the caller evaluates them together with its
        own (:func:`specparity.decode.state_arrays`) before the session runs again. The default is
        :meth:`state` itself."""
        return self.state()

    @abstractmethod
    def adopt(self, cache: list[Any]) -> None:
        """Start from classic decode's cache (copied into the engine's own cache types)."""

    @abstractmethod
    def position(self) -> int:
        """Positions the target state holds."""

    def prefill_anchor(self, prompt: list[int]) -> int:
        """Feed all of ``prompt`` but its last token; return that token, round 0's first input
        (feature ``anchor-prefill``)."""
        raise NotImplementedError("anchor-prefill")

    def offsets(self) -> list[int | None]:
        """Every layer's cache offset (None: a layer without one) (feature ``layer-offsets``)."""
        raise NotImplementedError("layer-offsets")

    def rewind(self) -> tuple[str, str]:
        """How this session rewinds from here on: ``trim`` or ``snapshot-and-recompute``, and why
        (feature ``rewind-modes``)."""
        raise NotImplementedError("rewind-modes")

    def extend(self, tokens: list[int]) -> Any:
        """A verify block every row of which is accepted (a full-accept round): its logits (rows, vocab).

        The default is :meth:`verify` then :meth:`rollback` to every row; an engine whose full accept
        needs no rollback may do it in one call.
        """
        logits = self.verify(tokens)
        self.rollback(len(tokens) - 1)
        return logits


class RoundRecorder:
    """The rounds an engine's own loop ran, as a recording wrapper of its target sees them: each verify
    block's tokens and logits (``on_verify``), then, once the engine rolled back, the round with its
    accepted count, the logits rows it kept and (``record_states``) the state after the rollback."""

    def __init__(self, start: int, record_states: bool):
        self.rounds: list[EngineRound] = []
        self.logits: list[Any] = []
        self.states: list[list[LayerState]] = []
        self.start = start  # the position of the next round's anchor
        self.record_states = record_states
        self._pending: tuple[list[int], Any] | None = None

    def on_verify(self, tokens: list[int], logits: Any) -> None:
        self._pending = (tokens, logits)

    def take(self) -> tuple[list[int], Any] | None:
        """The verify block waiting for its rollback (None: a rollback with no block, e.g. the prefill's)."""
        pending, self._pending = self._pending, None
        return pending

    def record(self, tokens: list[int], logits: Any, accepted: int, source: str, cache: list[Any]) -> None:
        import mlx.core as mx

        from specparity.decode import snapshot, state_arrays

        kept = logits[0, : accepted + 1]
        state = snapshot(cache, evaluate=False) if self.record_states else []
        mx.eval(kept, state_arrays(state))  # the kept rows and the state, in one evaluation
        self.logits.append(kept)
        self.rounds.append(EngineRound(len(self.rounds), len(tokens), accepted, source, tokens, self.start))
        self.start += accepted + 1
        if self.record_states:
            self.states.append(state)


class CacheListSession(TargetSession):
    """A session whose state is a list of mlx-lm cache objects (``self.cache``) and the position its
    prefill or adopted cache reached (``self.start``): state, adopt, position and fork for every adapter
    whose engine keeps mlx-lm's own caches (mlx-dspark, dspark-mlx, dflash-mlx and dfly-mlx)."""

    cache: list[Any]
    start: int

    def state(self) -> list[LayerState]:
        from specparity.decode import snapshot

        return snapshot(self.cache)

    def state_unevaluated(self) -> list[LayerState]:
        from specparity.decode import snapshot

        if type(self).state is not CacheListSession.state:  # a subclass's own state() has the word
            return self.state()
        return snapshot(self.cache, evaluate=False)

    def adopt(self, cache: list[Any]) -> None:
        from specparity.decode import cache_offset, copy_cache

        # the engine's caches are mlx-lm's own (make_prompt_cache): a copy of classic decode's is one
        self.cache = copy_cache(cache)
        self.start = max([o for o in (cache_offset(c) for c in self.cache) if o is not None], default=0)

    def position(self) -> int:
        return self.start

    def fork(self) -> Self:
        import copy

        from specparity.decode import copy_cache

        other = copy.copy(self)
        other.cache = copy_cache(self.cache)
        return other

@dataclass
class EngineRound:
    """One round of the engine's own speculative loop.

    index: 0-based. width: verify rows. accepted: proposals accepted.
    source: who proposed (``dflash`` drafter, ``copyspec`` copy-from-history, ``none``).
    tokens: the verify block's tokens. start: positions the target held before it.
    """

    index: int
    width: int
    accepted: int
    source: str
    tokens: list[int]
    start: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class EngineRun:
    """The engine's own run on one prompt.

    prompt: token ids. tokens: what it emitted. rounds: its verify rounds, in order.
    first_from_prefill: the first token came from the prefill's logits (no round).
    logits: per round, the kept rows' logits (accepted + 1 rows), when recorded.
    states: per round, every layer's state after its rollback, when recorded.
    seconds: wall time of the engine's loop.
    error: the engine's own error when its loop stopped on one (the rounds before it are kept).
    max_tokens: the tokens its loop was asked for, when the adapter says (a token past it is a finding).
    """

    prompt: list[int]
    tokens: list[int]
    rounds: list[EngineRound]
    first_from_prefill: bool
    logits: list[Any] = field(default_factory=list)
    states: list[list[LayerState]] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None
    max_tokens: int | None = None

    @property
    def accepts(self) -> list[int]:
        return [r.accepted for r in self.rounds]

    @property
    def widths(self) -> list[int]:
        return [r.width for r in self.rounds]


class Engine(ABC):
    """An engine loaded on one target (and drafter).

    features: the optional parts of the checks this adapter supports (:data:`FEATURES`).
    rollback_default: whether ``probe`` rolls back to every accept k unless told (``--rollback``).
    """

    info: EngineInfo
    features: frozenset[str] = frozenset()
    rollback_default: bool = True

    def supports(self, feature: str) -> bool:
        """The adapter supports ``feature`` (one of :data:`FEATURES`)."""
        return feature in self.features

    def cache_options(self) -> Any:
        """The cache options classic decode runs with against this engine
        (:class:`specparity.decode.CacheOptions`; the defaults unless the adapter supports ``cache-options``)."""
        from specparity.decode import CacheOptions

        return CacheOptions()

    def checkpoint(self) -> Any | None:
        """The target as the toolkit's loader loaded it (:class:`specparity.checkpoint.Loaded`: its path,
        tokenizer and fingerprint), or None where the engine loaded it its own way."""
        return None

    @abstractmethod
    def session(self) -> TargetSession:
        """A fresh target state (empty caches of the engine's own types)."""

    @abstractmethod
    def classic_model(self) -> Any:
        """The target as an mlx-lm model for classic decode (same weights)."""

    @contextlib.contextmanager
    def classic(self) -> Iterator[None]:
        """The context classic decode runs in (mlx-lm's own classes, as mlx-lm ships them)."""
        yield

    @abstractmethod
    def generate(self, prompt: list[int], max_tokens: int, record_states: bool = True) -> EngineRun:
        """The engine's own speculative loop over ``prompt``, recorded."""

    def loop(self, prompt: list[int], max_tokens: int) -> None:
        """The engine's own loop over ``prompt`` as :meth:`generate` calls it, nothing recorded: what a check
        that records it costs over the engine alone (``scripts/bench_engines.py``'s bare arm)."""
        raise NotImplementedError(f"{type(self).__name__}: no bare loop")

    def engine_model(self) -> Any:
        """The model object the engine's verify forward runs through (bisect captures its layers)."""
        return self.classic_model()
