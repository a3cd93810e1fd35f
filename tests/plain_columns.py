"""The findings table's plain-drafter columns (docs/engines.md) for an engine that drafts with a plain mlx-lm
drafter: its own loops on the project's plain pair of one architecture and dtype, 32 tokens of the embedded prompt,
as ``python -P -m specparity.engine_findings`` runs them, checked cell by cell against what the table gives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from builds import built
from fixture_cache import cached
from specparity.fixtures import build_pair


def check_column(engine: str, arch: str, dtype: str, root: Path, cells: dict[str, tuple[Any, ...]]) -> None:
    """Each of ``cells`` (entry point -> what it finds): ("match", accepted, drafted); ("diverged", token index,
    round, row, engine token, classic token): not a tie; ("error", a part of the engine's own error)."""
    from specparity.engine_findings import run_engine, with_fit_prompts

    info = with_fit_prompts(cached(build_pair, root, f"plain-{arch}-{dtype}", arch=arch, dtype=dtype).to_dict())
    got = {r["entry"]: r for r in run_engine(engine, info, 32, env=built(engine))}
    assert set(got) == set(cells), got
    for entry, want in cells.items():
        f = got[entry]
        if want[0] == "match":
            assert (f["verdict"], f["accepted"], f["drafted"]) == want, (entry, f)
        elif want[0] == "diverged":
            assert (f["verdict"], f["index"], f["round"], f["row"], f["engine_token"], f["classic_token"]) == want, (
                entry, f)
            assert "not a tie" in f["reason"], (entry, f["reason"])
        else:
            assert f["verdict"] == "error" and want[1] in (f.get("failure") or f["reason"]), (entry, f)
