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

    probe: the block-vs-chain cells, walks, aimed blocks, rollbacks and the engine's own prefill
      (blockchain.ProbeReport).
    prefill: prefill-parity results, one per prompt (empty when not asked).
    meta: model path, type, dtype, fingerprint, cache description, prompt lengths (empty for an engine
      that loaded its target its own way: the engine line says what ran).
    """

    probe: Any
    prefill: list[Any] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def verdict(self) -> Verdict:
        if not self.probe.reproducible:  # noise is never blamed on block vs chain or on prefill
            return Verdict.INCONCLUSIVE
        return combine([self.probe.verdict, *(r.verdict for r in self.prefill)])

    def header(self) -> str:
        m = self.meta
        if not m:
            e = self.probe.engine or {}
            return f"engine {e.get('name')} {e.get('version')} ({e.get('family')}); " + "; ".join(e.get("notes", []))
        return (f"model {m.get('model')} ({m.get('model_type')}, {m.get('dtype')}, fingerprint"
                f" {m.get('fingerprint')})\ncache: {m.get('cache')}; prompts: {m.get('prompts')}")

    def lines(self) -> list[str]:
        from specparity.probes.forward.render import probe_text

        return probe_text(self.probe, self.header(), self.prefill).splitlines()

    def markdown(self) -> list[str]:
        from specparity.probes.forward.render import probe_markdown

        meta = self.meta or {"engine": self.header()}
        body = probe_markdown(self.probe, "body", meta, self.prefill).splitlines()
        return body[2:]  # the record's frame carries the title

    def to_dict(self) -> dict[str, Any]:
        return {**self.probe.to_dict(), "verdict": self.verdict, "exit_code": self.exit_code,
                "prefill": [r.to_dict() for r in self.prefill] + [p.to_dict() for p in self.probe.prefill],
                "meta": self.meta}


def run_probe(model: Any, widths: list[int], depths: list[int], prompts: list[list[int]],
              opts: CacheOptions | None = None, walk_positions: int = 0, walk_widths: list[int] | None = None,
              prefill: bool = True, observer: Observer = NULL, aim: bool = True,
              aim_limit: int | None = None, rollback: bool = False, engine_prefill: bool = False,
              wrong_id: int = 0) -> ProbeRun:
    """Probe at every (width, depth), walk, aimed blocks, rollbacks, prefill parity, through an engine.

    model: an engine adapter (probes.engines.base.Engine), or a checkpoint (checkpoint.Loaded) probed
    through mlx-lm's adapter with ``opts``. What the adapter does not support (``walk``, ``aim``,
    ``prefill-parity``: its ``features``) is not run. ``aim``: also blocks, walks and a prefill-parity
    prompt aimed at every cache boundary (probes.forward.boundaries). A failed reproducibility bracket
    skips prefill parity: the run is inconclusive. ``rollback`` / ``engine_prefill``: every rollback to
    k accepted, and the engine's own prefill, against classic decode.
    """
    from specparity.checkpoint import model_dtype
    from specparity.probes.engines.base import Engine
    from specparity.probes.engines.mlx_lm import MlxLmEngine
    from specparity.probes.forward.blockchain import DEFAULT_AIM_LIMIT, probe_block_vs_chain

    limit = DEFAULT_AIM_LIMIT if aim_limit is None else aim_limit
    engine = model if isinstance(model, Engine) else MlxLmEngine(model, opts=opts)
    loaded = engine.checkpoint()
    opts = engine.cache_options()
    aim = aim and engine.supports("aim")
    if not engine.supports("walk"):
        walk_positions = 0
    report = probe_block_vs_chain(engine, widths, depths, prompts,
                                  walk_positions=walk_positions, walk_widths=walk_widths, observer=observer,
                                  aim=aim, aim_limit=limit, rollback=rollback, engine_prefill=engine_prefill,
                                  wrong_id=wrong_id)
    pre = []
    if prefill and engine.supports("prefill-parity") and report.reproducible:
        with observer.part("prefill", total=len(prompts) + 1):
            pre = run_prefill_parity(engine.classic_model(), prompts, opts,
                                     aim=aim and opts.prefill_step_size + 2 <= limit, observer=observer)
    meta: dict[str, Any] = {}
    if loaded is not None:
        from specparity.probes.forward.boundaries import describe_cache

        fp = loaded.fingerprint
        meta = {"model": fp.path, "model_type": fp.model_type, "dtype": model_dtype(loaded.model),
                "fingerprint": fp.short, "cache": describe_cache(loaded.model, opts),
                "prompts": ", ".join(f"{len(p)} tokens" for p in prompts)}
    return ProbeRun(report, pre, meta)


def run_prefill_parity(model: Any, prompts: list[list[int]], opts: CacheOptions, aim: bool = True,
                       observer: Observer = NULL) -> list[Any]:
    """Prefill parity over ``prompts``, plus (``aim``) a prompt of prefill_step_size + 2 tokens.

    The aimed prompt makes classic prefill run two chunks whatever the prompts'
    lengths; it compares one-shot with chunked only (token by token over
    thousands of tokens would cost more than it adds).
    """
    from specparity.probes.forward.boundaries import aimed_prompt
    from specparity.probes.forward.prefill import prefill_parity

    out = []
    for i, prompt in enumerate(prompts):
        r = prefill_parity(model, [prompt], opts)[0]
        r.prompt_index = i
        out.append(r)
        observer.item("prefill")
        observer.result("prefill", r.to_dict())
    if aim and prompts:
        n = opts.prefill_step_size + 2
        r = prefill_parity(model, [aimed_prompt(prompts[0], n)], opts, chunk=opts.prefill_step_size,
                           token_by_token=False)[0]
        r.prompt_index = len(prompts)
        out.append(r)
        observer.item("prefill")
        observer.result("prefill", r.to_dict())
    return out
