"""``--shard i/n``: a deterministic split of a served job's arms across runners.

The job's non-baseline arms (widths, self-draft, concurrent, controls,
repeats), taken in the order the unsharded job runs them across all its
pairings, go round-robin to shards 1..n: the k-th such arm (from 0) goes to
shard ``k % n + 1``. Every shard that runs any arm of a pairing also runs that
pairing's two baselines (``baseline-start`` is the reference every arm is
compared with, ``baseline-end`` the noise floor), so each shard's verdicts
are the ones the unsharded job would give. A shard with no arm of a pairing
skips that pairing; a pairing with baselines only is run by shard 1.
``specparity records merge`` joins the shards' records.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from specparity.errors import InputError
from specparity.harness.plan import ArmKind


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count`` (1-based, as the flag spells it)."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str) -> Shard:
    """``"2/4"`` -> Shard(2, 4); anything else is an InputError naming ``shard`` and the value."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if not m:
        raise InputError("shard", f"{text!r}: expected i/n, e.g. 1/2")
    i, n = int(m.group(1)), int(m.group(2))
    if n < 1 or not 1 <= i <= n:
        raise InputError("shard", f"{text}: need 1 <= i <= n")
    return Shard(i, n)


def split(plans: list[tuple[str, list[tuple[str, ArmKind]]]], shard: Shard) -> dict[str, list[str]]:
    """Which arms ``shard`` runs, per pairing.

    plans: (pairing name, [(arm name, arm kind), ...] in run order) for every pairing of the job.
    Returns pairing name -> arm names this shard runs (run order kept); a
    pairing this shard runs no arm of is absent.
    """
    out: dict[str, list[str]] = {}
    k = 0
    for pairing, arms in plans:
        mine = set()
        if all(kind == ArmKind.BASELINE for _, kind in arms) and shard.index == 1:
            out[pairing] = [name for name, _ in arms]  # baselines only: shard 1 runs them
            continue
        for name, kind in arms:
            if kind == ArmKind.BASELINE:
                continue
            if k % shard.count == shard.index - 1:
                mine.add(name)
            k += 1
        if mine:
            out[pairing] = [name for name, kind in arms if kind == ArmKind.BASELINE or name in mine]
    return out
