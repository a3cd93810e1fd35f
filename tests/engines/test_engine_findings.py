"""The findings table's own choices (specparity.engine_findings): which target shapes each drafter format is built
in, and a shape its builder refuses. The table's runs on real engines are pinned in each engine's test module."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from specparity import engine_findings
from specparity.engine_findings import SHAPES, format_shapes, shape_name
from specparity.engines import drafter_formats, registry
from specparity.errors import UsageError


def test_each_format_is_built_in_the_shapes_it_declares_else_the_dflash_shapes() -> None:
    formats = drafter_formats()
    declared = {k: f.shapes for k, f in formats.items() if f.shapes}
    assert declared, "no format declares its own shapes"
    for kind, fmt in formats.items():
        got = format_shapes(kind)
        if fmt.shapes:
            assert got == [(s, t) for s in fmt.shapes for t in (True, False)], kind
        else:
            assert got == list(SHAPES), kind
    # --shape keeps only the names it gives, whatever the format
    kind, shapes = next(iter(declared.items()))
    assert format_shapes(kind, {shape_name(shapes[0], True)}) == [(shapes[0], True)]
    assert format_shapes(kind, {"qwen3-untied"}) == ([("qwen3", False)] if "qwen3" in shapes else [])


def test_every_declared_shape_is_one_its_builder_takes() -> None:
    """A declared shape the builder refuses would be a row of errors in the table: each format's builder is asked
    for its config (no weights) where it exposes one."""
    import importlib

    for kind, fmt in drafter_formats().items():
        module = importlib.import_module(str(fmt.build).split(":")[0])
        config: Any = getattr(module, "target_config", None)
        for shape in fmt.shapes if config is not None else ():
            assert config(shape, "float32", True)["tie_word_embeddings"] is True, (kind, shape)
        if config is not None and fmt.shapes:
            with pytest.raises(UsageError):
                config("no-such-shape", "float32", True)


def test_a_shape_the_builder_refuses_is_a_not_run_row_and_the_table_goes_on(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    engine = next(n for n, s in registry().items() if s.loops is not None and s.fixture_kind)
    ran: list[str] = []

    def refuse(kind: str, shape: str, dtype: str, tied: bool, root: Path) -> dict:
        raise UsageError(f"--dflash {shape!r}: not built in this format")

    monkeypatch.setattr(engine_findings, "fixture", refuse)
    def run(*a: Any, **k: Any) -> list[dict]:
        ran.append("x")
        return []

    monkeypatch.setattr(engine_findings, "run_engine", run)
    rows = engine_findings.findings([engine], None, ["float32"], 8, tmp_path)
    kind = engine_findings.engine_formats()[engine]
    assert len(rows) == len(format_shapes(kind)) and not ran
    assert {r["verdict"] for r in rows} == {"not_run"}
    assert all(r["failure"].startswith(f"no {kind} fixture of this shape: --dflash ") for r in rows), rows


def test_a_cell_says_a_length_finding_a_tie_and_a_refusal_in_a_few_words() -> None:
    from specparity.engine_findings import _cell

    past = {"verdict": "diverged", "index": 32, "round": 20, "row": 1, "tokens": list(range(33)),
            "classic": list(range(32)), "tie": None,
            "reason": "token 32: engine 392, classic stopped at max_tokens=32 (the engine emitted 33), at round 20"}
    assert _cell(past) == "33 tokens where max_tokens is 32 (round 20, row 1)"
    tie = {"verdict": "diverged", "index": 19, "round": 7, "row": 4, "tie": {"logprob_tie": True},
           "reason": "token 19: engine 80, classic 14"}
    assert _cell(tie) == "diverged at token 19 (round 7, row 4; an exact logprob tie)"
    assert _cell({**tie, "tie": {"logprob_tie": False}}) == "diverged at token 19 (round 7, row 4; not a tie)"
    near = {**tie, "tie": {"logprob_tie": False, "near_tie": True, "ulps": 1}}
    assert _cell(near) == "diverged at token 19 (round 7, row 4; a near tie, 1 ULP)"
    refused = {"verdict": "error", "failure": "ValueError: unsupported model_type 'qwen3_5'; it streams: a, b"
               " (at nunspark/engine.py:12)"}
    assert _cell(refused) == "error: ValueError: unsupported model_type 'qwen3_5'"
    assert _cell({"verdict": "match", "accepted": 3, "drafted": 9}) == "match, 3/9 accepted"


def test_from_json_that_cannot_be_read_is_one_line_and_exit_2(tmp_path: Path) -> None:
    import subprocess
    import sys

    bad, odd = tmp_path / "rows.json", tmp_path / "odd.json"
    bad.write_text("{not json")
    odd.write_text('{"engine": "x"}')  # JSON, not a list of rows
    for f, said in ((tmp_path / "gone.json", "No such file or directory"), (bad, "not JSON rows"),
                    (odd, "not JSON rows")):
        proc = subprocess.run([sys.executable, "-P", "-m", "specparity.engine_findings", "--grid", "--from-json",
                               str(f)], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and proc.stderr == f"Error: --from-json {f}: {said}\n", proc.stderr
