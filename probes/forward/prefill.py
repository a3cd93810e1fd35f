"""Prefill parity: one-shot vs chunked vs token-by-token prefill.

Servers prefill prompts in whatever chunks their scheduler picks; classic
decode uses ``prefill_step_size``. All three ways must leave the same last-row
logits and the same cache state in every layer (KV bytes, conv/recurrent
state, offsets). Each arm is compared with the one-shot arm.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specparity.compare import Diff, StateDiff, compare_arrays, compare_states
from specparity.decode import CacheOptions, Decoder, snapshot
from specparity.probes.forward.render import prefill_line
from specparity.verdicts import ReportMixin, Verdict, combine


@dataclass
class PrefillArm:
    """One prefill arm compared with one-shot.

    name: ``chunked`` or ``token_by_token``. chunk: rows per call.
    verdict: equal | divergent | not_run. logits: last-row logits diff.
    states: cache arrays that differ (first 20), offsets included as notes.
    layers_differing: layer indices with any differing state.
    """

    name: str
    chunk: int
    verdict: Verdict
    logits: Diff | None = None
    states: list[StateDiff] = field(default_factory=list)
    layers_differing: list[int] = field(default_factory=list)
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "chunk": self.chunk, "verdict": self.verdict,
                "logits": self.logits.to_dict() if self.logits else None,
                "states": [s.to_dict() for s in self.states],
                "layers_differing": self.layers_differing, "reason": self.reason}


@dataclass
class PrefillReport(ReportMixin):
    """Prefill parity for one prompt: its length and the non-reference arms."""

    prompt_index: int
    prompt_len: int
    arms: list[PrefillArm]

    @property
    def verdict(self) -> Verdict:
        return combine(a.verdict for a in self.arms)

    def to_dict(self) -> dict[str, Any]:
        return {"prompt_index": self.prompt_index, "prompt_len": self.prompt_len,
                "verdict": self.verdict, "exit_code": self.exit_code,
                "arms": [a.to_dict() for a in self.arms]}

    def lines(self) -> list[str]:
        return [prefill_line(self)]


def _run(model: Any, prompt: list[int], chunk: int, opts: CacheOptions):
    dec = Decoder(model, opts)
    last = None
    for i in range(0, len(prompt), chunk):
        last = dec.forward(prompt[i : i + chunk])[-1]
    return last, snapshot(dec.cache)


def prefill_parity(model: Any, prompts: list[list[int]], opts: CacheOptions | None = None,
                   chunk: int | None = None, token_by_token: bool = True) -> list[PrefillReport]:
    """Compare chunked and token-by-token prefill with one-shot prefill, per prompt.

    ``chunk`` defaults to ``opts.prefill_step_size`` when that splits the
    prompt, else half the prompt (so the chunked arm really has several calls).
    ``token_by_token=False`` skips that arm (a boundary-aimed prompt of
    ``prefill_step_size + 2`` tokens needs only one-shot vs chunked).
    """
    opts = opts or CacheOptions()
    reports = []
    for pi, prompt in enumerate(prompts):
        n = len(prompt)
        c = chunk or (opts.prefill_step_size if opts.prefill_step_size < n else max(1, n // 2))
        ref_logits, ref_state = _run(model, prompt, n, opts)
        arms = []
        for name, size in (("chunked", c), ("token_by_token", 1))[: 2 if token_by_token else 1]:
            try:
                logits, state = _run(model, prompt, size, opts)
            except Exception as err:
                arms.append(PrefillArm(name, size, Verdict.NOT_RUN, reason=f"{type(err).__name__}: {err}"))
                continue
            ld = compare_arrays(ref_logits[None], logits[None], logits=True)
            sd = [d for d in compare_states(ref_state, state, ("one_shot", name)) if d.differs]
            arm = PrefillArm(name, size, Verdict.EQUAL if ld.equal and not sd else Verdict.DIVERGENT, ld,
                             sd[:20], sorted({s.layer for s in sd}))
            arms.append(arm)
        reports.append(PrefillReport(pi, n, arms))
    return reports
