"""nunspark's documented lossy mode, run and reported as lossy by design (never a pass, never a defect).

    python -P -m specparity.engines.nunspark.lossy --target T --draft D --prompt-ids 1,2,3 --accept-top-k 4

(in nunspark's environment: ``specparity env path --python nunspark``). ``e2e``'s verdicts have no word for a
mode its authors document as lossy (a difference there reads ``diverged``, the same tokens ``match``), so the
mode is not one of its e2e entry points: it is reported here, with what it changed.
"""

from __future__ import annotations

from typing import Any

from specparity.engines.nunspark.loops import load_pair, run_entry
from specparity.probes.engine_e2e import Classic, load_once


def lossy(target: str, draft: str, prompt: list[int], n: int, top_k: int, ref: Classic | None = None) -> dict[str, Any]:
    """``speculative_generate`` in its documented lossy mode (``accept_top_k`` > 1: a draft is accepted when it
    lies in the target's top k, "trading exactness for a higher acceptance multiplier"): what it changed
    against classic decode, reported as lossy by design, never as a pass or a defect.

    Returns: ``label`` ("lossy by design"), ``mode``, ``tokens`` and ``classic``, ``first_difference`` (the
    index, both tokens, the round and row that emitted it; None: the same tokens), and the loop's own
    ``accepted_offpath`` / ``accepted_total`` / ``deviation_rate`` (its measure of the loss).
    """
    ref = ref or Classic(target, n)
    classic, eos = ref.tokens(prompt), ref.eos
    pair = load_once(lambda: load_pair(target, draft))
    f, stats = run_entry("speculative_generate", pair, list(prompt), n, classic, eos, draft,
                         {"accept_top_k": top_k})
    out: dict[str, Any] = {"engine": "nunspark", "entry": "speculative_generate", "label": "lossy by design",
                           "mode": f"accept_top_k={top_k}", "tokens": f.tokens, "classic": classic[:len(f.tokens)],
                           "rounds": f.rounds, "failure": f.failure, "first_difference": None}
    if stats is not None:
        out.update(accepted_offpath=int(stats.accepted_offpath), accepted_total=int(stats.accepted_total),
                   deviation_rate=float(stats.deviation_rate))
    if f.index is not None:
        out["first_difference"] = {"index": f.index, "engine_token": f.engine_token,
                                   "classic_token": f.classic_token, "round": f.round, "row": f.row}
    changed = (f"its tokens leave classic decode's at token {f.index} (round {f.round}, row {f.row})"
               if f.index is not None else "its tokens equal classic decode's on this prompt")
    out["reason"] = (f"lossy by design (accept_top_k={top_k}, its documented fast mode): {changed};"
                     f" {out.get('accepted_offpath')} of {out.get('accepted_total')} accepted drafts were not the"
                     " target's argmax (its own deviation count): not a pass, not a defect")
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -P -m specparity.engines.nunspark.lossy --target T --draft D --prompt-ids 1,2 --accept-top-k K``:
    the lossy mode's report as one JSON line (run in nunspark's environment)."""
    import argparse
    import json

    ap = argparse.ArgumentParser(prog="python -P -m specparity.engines.nunspark.lossy", description=main.__doc__)
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--prompt-ids", required=True)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--accept-top-k", type=int, required=True)
    a = ap.parse_args(argv)
    prompt = [int(x) for x in a.prompt_ids.split(",") if x.strip()]
    print(json.dumps(lossy(a.target, a.draft, prompt, a.max_tokens, a.accept_top_k)), flush=True)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
