"""mlx-dspark's own loops against classic decode (``e2e --engine mlx-dspark``): ``load_target`` +
``load_drafter`` (4-bit drafter by default) + ``speculative_generate`` (cap 2, n-gram lookup drafts on),
and the same with the whole block verified and lookup off, each located by its ``on_round`` record."""

from __future__ import annotations

import time
from typing import Any

from specparity.probes.engine_e2e import Classic, Finding, failed, judge, load_once

# set to N: mlx-dspark's N-th verify of each generation flips its first row (the detector's own test)
FAULT_VAR = "SPECPARITY_ENGINE_FAULT_ROUND"


def inject_verify_fault(round_no: int) -> None:
    """A fault in mlx-dspark's own verify (for the detector's tests): the ``round_no``-th ``Target.verify``
    of each generation returns row 0 with its second-best token raised above its best, so the engine emits
    a token classic decode does not there."""
    import mlx.core as mx
    from mlx_dspark.target import Target

    orig = Target.verify
    calls = {"n": 0}

    def verify(self: Any, ids: Any, cache: Any, tap: Any) -> Any:
        logits, fused = orig(self, ids, cache, tap)
        calls["n"] += 1
        if calls["n"] == round_no:
            row = logits[0, 0]
            second = int(mx.argsort(row)[-2])
            logits = logits.at[0, 0, second].add(mx.abs(row).max() * 4 + 1)
        return logits, fused

    Target.verify = verify
    orig_reset = Target.reset_spec

    def reset_spec(self: Any) -> None:
        calls["n"] = 0
        orig_reset(self)

    Target.reset_spec = reset_spec



def loops(target: str, draft: str | None, prompt: list[int], n: int, ref: Classic,
          entries: tuple[str, ...] = ()) -> list[Finding]:
    """mlx-dspark's ``speculative_generate`` as its library defaults run it, and with the whole block verified
    and lookup drafts off; rounds from its ``on_round`` callback (drafted, accepted, committed, source)."""
    import os

    from mlx_dspark.generate import speculative_generate
    from mlx_dspark.load import load_drafter, load_target

    classic, eos = ref.tokens(prompt), ref.eos
    if os.environ.get(FAULT_VAR):
        inject_verify_fault(int(os.environ[FAULT_VAR]))
    pair = load_once(lambda: (*load_target(target, require_tap=True), load_drafter(draft)[0]))
    out = []
    for entry, kw in (("speculative_generate", {}),
                      ("speculative_generate-full-block", {"max_draft_tokens": None, "lookup_drafts": False})):
        if entries and entry not in entries:
            continue
        f = Finding("mlx-dspark", entry)
        t0 = time.perf_counter()
        try:
            tgt, tok, drafter = pair()

            def on_round(**r: Any) -> None:
                f.rounds.append({"drafted": int(r.get("drafted", 0)), "accepted": int(r.get("accepted", 0)),
                                 "committed": int(r.get("committed", 0)), "source": str(r.get("source", ""))})

            res = speculative_generate(tgt, tok, drafter, prompt_ids=list(prompt), max_new_tokens=n,
                                       on_round=on_round, **kw)
            f.tokens = [int(t) for t in res.token_ids]
            f.drafted = sum(r["drafted"] for r in f.rounds)
            f.accepted = sum(r["accepted"] for r in f.rounds)
            judge(f, classic, eos | {int(e) for e in getattr(tok, "eos_token_ids", []) or []}, 1)
        except Exception as err:  # noqa: BLE001  (the engine's own error is the finding)
            failed(f, err)
        f.seconds = time.perf_counter() - t0
        out.append(f)
    return out

