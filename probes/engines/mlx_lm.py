"""mlx-lm as an engine: the verify forward and rewind the probes have always run.

The target state is a :class:`specparity.decode.Decoder`; a verify block is
one model call; a rollback trims the rejected rows with mlx-lm's
``trim_prompt_cache``, or, for caches it cannot trim (linear attention's
``ArraysCache``), restores a copy taken before the block and feeds the kept
rows again (what mlx-lm's own speculative decoding refuses to do). The
engine's own loop is ``mlx_lm.generate.speculative_generate_step`` with a
drafter checkpoint (:mod:`specparity.probes.replay.recorder`).
"""

from __future__ import annotations

import time
from typing import Any

from specparity.decode import CacheOptions, Decoder, LayerState, copy_cache, snapshot, trimmable
from specparity.probes.engines.base import FEATURES, Engine, EngineInfo, EngineRound, EngineRun, TargetSession


MODE_TRIM = "trim"
MODE_SNAPSHOT = "snapshot-and-recompute"


class MlxLmSession(TargetSession):
    """A :class:`Decoder`'s cache. A rollback trims (``trim_prompt_cache``) or, where the cache cannot be
    trimmed, restores the copy taken before the block and feeds the kept rows: chosen per block, or fixed
    for the request once :meth:`rewind` is asked (the replay reports one mode per request)."""

    def __init__(self, model: Any, opts: CacheOptions):
        self.dec = Decoder(model, opts)
        self._saved: Decoder | None = None
        self._block: list[int] = []
        self._mode: str | None = None

    def prefill(self, prompt: list[int]) -> Any:
        last = self.dec.prefill(prompt)
        return self.dec.forward([last])[-1:]

    def prefill_anchor(self, prompt: list[int]) -> int:
        return self.dec.prefill(prompt)

    def rewind(self) -> tuple[str, str]:
        if trimmable(self.dec.cache):
            self._mode, reason = MODE_TRIM, "mlx-lm trim_prompt_cache"
        else:
            kinds = sorted({type(c).__name__ for c in self.dec.cache if not c.is_trimmable()})
            self._mode, reason = MODE_SNAPSHOT, f"{', '.join(kinds)} cannot be trimmed"
        return self._mode, reason

    def offsets(self) -> list[int | None]:
        return self.dec.offsets()

    def verify(self, tokens: list[int]) -> Any:
        snap = self._mode == MODE_SNAPSHOT if self._mode is not None else not trimmable(self.dec.cache)
        self._saved = self.dec.fork() if snap else None
        self._block = list(tokens)
        return self.dec.forward(tokens)

    def rollback(self, accepted: int) -> int | None:
        from mlx_lm.models.cache import trim_prompt_cache

        rejected = len(self._block) - 1 - accepted
        if rejected <= 0:
            return 0
        if self._saved is None:
            # mlx-lm annotates trim_prompt_cache -> List but returns the count it trimmed
            trimmed = int(trim_prompt_cache(self.dec.cache, rejected))  # type: ignore[call-overload]
        else:
            self.dec = self._saved
            self.dec.forward(self._block[: accepted + 1])
            trimmed = rejected
        self._saved = None
        return trimmed

    def state(self) -> list[LayerState]:
        return snapshot(self.dec.cache)

    def state_unevaluated(self) -> list[LayerState]:
        return snapshot(self.dec.cache, evaluate=False)

    def adopt(self, cache: list[Any]) -> None:
        self.dec.cache = copy_cache(cache)

    def position(self) -> int:
        offsets = [o for o in self.dec.offsets() if o is not None]
        return max(offsets) if offsets else 0

    def extend(self, tokens: list[int]) -> Any:
        # a full accept trims nothing: the block is the round (no copy kept for a rollback)
        self._saved, self._block = None, list(tokens)
        return self.dec.forward(tokens)


class MlxLmEngine(Engine):
    """mlx-lm's verify forward and trim; its speculative loop with an mlx-lm drafter.

    loaded: the target (:class:`specparity.checkpoint.Loaded`). draft: the drafter, a ``Loaded`` or
    its directory (loaded when the loop first needs it). opts: the cache options both classic decode
    and the engine run. trust_remote_code: the user's consent, for a drafter loaded later. It
    supports every optional check (:data:`FEATURES`); its caches are classic decode's own, so its
    prefill is classic decode's.
    """

    features = frozenset(FEATURES)

    def __init__(self, loaded: Any, draft: Any = None, num_draft_tokens: int = 3,
                 opts: CacheOptions | None = None, trust_remote_code: bool = False):
        from importlib.metadata import version

        self.trust_remote_code = trust_remote_code
        self.loaded = loaded
        self.model = loaded.model
        self._draft = draft
        self.num_draft_tokens = num_draft_tokens
        self.opts = opts or CacheOptions()
        width = num_draft_tokens + 1
        draft_path = getattr(draft, "path", draft)
        # no widths of its own: the probe's default widths apply
        self.info = EngineInfo("mlx-lm", version("mlx-lm"), str(getattr(loaded, "path", "")),
                               str(draft_path) if draft_path is not None else None, width, [],
                               packages={"mlx": version("mlx"), "mlx-lm": version("mlx-lm")})

    @classmethod
    def of_model(cls, model: Any, opts: CacheOptions | None = None) -> MlxLmEngine:
        """mlx-lm's adapter over a bare model object (the library's probe and bisect calls on a model)."""
        from types import SimpleNamespace

        return cls(SimpleNamespace(model=model, path=""), opts=opts)

    @property
    def draft(self) -> Any:
        """The drafter (``Loaded``), loaded on first use when a directory was given."""
        if self._draft is not None and not hasattr(self._draft, "model"):
            from specparity.checkpoint import load_checkpoint

            self._draft = load_checkpoint(self._draft, trust_remote_code=self.trust_remote_code,
                                          flag="--draft-model")
        return self._draft

    def session(self) -> MlxLmSession:
        return MlxLmSession(self.model, self.opts)

    def classic_model(self) -> Any:
        return self.model

    def cache_options(self) -> CacheOptions:
        return self.opts

    def checkpoint(self) -> Any | None:
        return self.loaded if hasattr(self.loaded, "fingerprint") else None

    def generate(self, prompt: list[int], max_tokens: int, record_states: bool = True) -> EngineRun:
        from specparity.errors import UsageError
        from specparity.probes.replay.recorder import record_speculative

        if self.draft is None:
            raise UsageError("mlx-lm's speculative loop needs a drafter checkpoint")
        t0 = time.perf_counter()
        rec = record_speculative(self.model, self.draft.model, prompt, self.num_draft_tokens, max_tokens,
                                 self.opts)
        widths = rec.widths or [self.num_draft_tokens + 1] * len(rec.accepts)
        rounds, emitted, start = [], 0, len(prompt) - 1
        toks = rec.tokens or []
        for i, (a, w) in enumerate(zip(rec.accepts, widths)):
            block = ([prompt[-1]] if i == 0 else [toks[emitted - 1]]) + toks[emitted: emitted + a]
            rounds.append(EngineRound(i, w, a, "draft-model", block, start))
            emitted += a + 1
            start += a + 1
        return EngineRun(list(prompt), list(toks), rounds, first_from_prefill=False,
                         seconds=time.perf_counter() - t0)
