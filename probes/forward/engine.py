"""The probe through an engine adapter, as the engine probe has always run: block vs chain, every rollback
and the engine's own prefill, against classic decode (one implementation: :mod:`.blockchain`)."""

from __future__ import annotations

from specparity.probes.engines.base import Engine
from specparity.probes.forward.blockchain import ProbeReport, probe_block_vs_chain
from specparity.progress import NULL, Observer


def probe_engine(engine: Engine, widths: list[int], depths: list[int], prompts: list[list[int]],
                 rollback: bool = True, wrong_id: int = 0, observer: Observer = NULL) -> ProbeReport:
    """Block vs chain, rollback (``rollback``) and the engine's own prefill through ``engine``."""
    return probe_block_vs_chain(engine, widths, depths, prompts, rollback=rollback, engine_prefill=True,
                                wrong_id=wrong_id, observer=observer)
