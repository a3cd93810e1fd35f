"""dspark-mlx's own loops against classic decode (``e2e --engine dspark-mlx``): ``load_draft`` +
``load_host`` + ``generate_eager`` (one verify of [anchor, drafts] per round) and the legacy ``generate``."""

from __future__ import annotations

import time
from typing import Any

from specparity.probes.engine_e2e import Classic, Finding, failed, judge, load_once



def loops(target: str, draft: str | None, prompt: list[int], n: int, ref: Classic,
          entries: tuple[str, ...] = ()) -> list[Finding]:
    """dspark-mlx's ``generate_eager`` and legacy ``generate``, each after the host's and the drafter's ``reset``
    (as its CLI starts a run); rounds from each ``TokenEvent.n_accepted``."""
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
            failed(f, err)
        f.seconds = time.perf_counter() - t0
        out.append(f)
    return out

