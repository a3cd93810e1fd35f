"""The probe run: block vs chain, the long walk and prefill parity, as one report.

``run_probe`` is what ``specparity probe`` calls: one call, one
:class:`ProbeRun` that states its reach (widths, depths, prompts, walk
positions, prefill arms) and its verdict under the one contract
(specparity.verdicts).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specparity.decode import CacheOptions
from specparity.progress import NULL, Observer
from specparity.verdicts import ReportMixin, Verdict, combine


@dataclass
class ProbeRun(ReportMixin):
    """One probe run.

    probe: the block-vs-chain cells and walks (blockchain.ProbeReport).
    prefill: prefill-parity results, one per prompt (empty when not asked).
    meta: model path, type, dtype, fingerprint, cache description, prompt lengths.
    """

    probe: Any
    prefill: list[Any] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def verdict(self) -> Verdict:
        return combine([self.probe.verdict, *(r.verdict for r in self.prefill)])

    def header(self) -> str:
        m = self.meta
        return (f"model {m.get('model')} ({m.get('model_type')}, {m.get('dtype')}, fingerprint"
                f" {m.get('fingerprint')})\ncache: {m.get('cache')}; prompts: {m.get('prompts')}")

    def lines(self) -> list[str]:
        from specparity.probes.forward.render import probe_text

        return probe_text(self.probe, self.header(), self.prefill).splitlines()

    def markdown(self) -> list[str]:
        from specparity.probes.forward.render import probe_markdown

        body = probe_markdown(self.probe, "body", self.meta, self.prefill).splitlines()
        return body[2:]  # the record's frame carries the title

    def to_dict(self) -> dict[str, Any]:
        return {**self.probe.to_dict(), "verdict": self.verdict, "exit_code": self.exit_code,
                "prefill": [r.to_dict() for r in self.prefill], "meta": self.meta}


def run_probe(loaded: Any, widths: list[int], depths: list[int], prompts: list[list[int]],
              opts: CacheOptions, walk_positions: int = 0, walk_widths: list[int] | None = None,
              prefill: bool = True, observer: Observer = NULL) -> ProbeRun:
    """Probe ``loaded`` (checkpoint.Loaded) at every (width, depth), walk, and prefill parity."""
    from specparity.checkpoint import model_dtype
    from specparity.probes.forward.blockchain import probe_block_vs_chain
    from specparity.probes.forward.prefill import prefill_parity

    report = probe_block_vs_chain(loaded.model, widths, depths, prompts, opts,
                                  walk_positions=walk_positions, walk_widths=walk_widths,
                                  observer=observer)
    pre = []
    if prefill:
        with observer.part("prefill", total=len(prompts)):
            pre = prefill_parity(loaded.model, prompts, opts)
            for r in pre:
                observer.item("prefill")
                observer.result("prefill", r.to_dict())
    fp = loaded.fingerprint
    meta = {"model": fp.path, "model_type": fp.model_type, "dtype": model_dtype(loaded.model),
            "fingerprint": fp.short, "cache": opts.describe(),
            "prompts": ", ".join(f"{len(p)} tokens" for p in prompts)}
    return ProbeRun(report, pre, meta)
