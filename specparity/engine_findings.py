"""The engines' findings table: each engine x fixture shape, filled by the engines' own loops against classic decode.

    python -P -m specparity.engine_findings [--engine NAME ...] [--shape SHAPE ...] [--dtype DTYPE ...]
                                            [--max-tokens N] [--fixtures DIR] [--json | --grid]
                                            [--from-json FILE ...]

For every engine that declares its own loops (the registry's ``EngineSpec.loops``) and every
target shape it takes a drafter for (dense ``qwen3``; the gated-delta ``qwen3_5`` with tied and
untied heads; float32 and bfloat16), it builds the fixture in the engine's own drafter format
(``EngineSpec.drafter_format``; an engine that drafts with a plain mlx-lm drafter: a plain pair of
each architecture the fixtures build, :data:`PLAIN_ARCHS`), runs :mod:`specparity.probes.engine_e2e` in
the engine's pinned environment (built on first use, cached) on the fixture's first prompt, and prints one row per
entry point: match, the first differing token with its round and row, the engine's error, or why
it cannot run here. An engine without a drafter checkpoint (its draft heads inside the target)
runs without a fixture, as its loops check what they can load. Nothing here names an engine.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from specparity.errors import UsageError
from specparity.fixtures.dflash import DTYPES
from specparity.tied import run_tied_captured
from specparity.verdicts import Verdict

# the gated-delta hybrid in the published linear-attention head ratio (1:2), tied and untied, and in the
# equal-heads control shape dflash-mlx (under dfly-mlx) runs
SHAPES = (("qwen3", False), ("qwen3_5", True), ("qwen3_5", False), ("qwen3_5-equal-heads", True))
RUN_TIMEOUT_S = 600
# the drafter format of an engine whose drafter is a plain mlx-lm checkpoint (EngineSpec.drafter_format None)
PLAIN = "plain"
# its targets: every architecture the plain fixtures build (dense, gated-delta hybrid, sliding window, MoE)
PLAIN_ARCHS = ("llama", "qwen3_5", "gemma3_text", "qwen3_moe")


def engine_formats() -> dict[str, str]:
    """Every engine with its own loops -> the drafter format its fixtures are built in ("": none, its draft
    heads live in the target; :data:`PLAIN`: a plain mlx-lm drafter)."""
    from specparity.engines import registry

    return {name: (spec.fixture_kind or PLAIN) if spec.drafter_checkpoint else ""
            for name, spec in registry().items() if spec.loops is not None}


def shape_name(shape: str, tied: bool) -> str:
    """A target shape as ``--shape`` names it: ``qwen3_5-tied``."""
    return f"{shape}-{'tied' if tied else 'untied'}"


def format_shapes(kind: str, asked: set[str] | None = None) -> list[tuple[str, bool]]:
    """The target shapes, tied and untied, the table builds in drafter format ``kind``: the format's own
    (``DrafterFormat.shapes``), else :data:`SHAPES`; only those ``asked`` names (--shape) where it names any."""
    from specparity.engines import drafter_formats

    own = drafter_formats()[kind].shapes
    every = [(s, t) for s in own for t in (True, False)] if own else list(SHAPES)
    return [x for x in every if asked is None or shape_name(*x) in asked]


def fixture(kind: str, shape: str, dtype: str, tied: bool, root: Path) -> dict[str, Any]:
    """The fixture of drafter format ``kind`` for this target under ``root`` (built on first use), with the
    format's own block size."""
    from specparity.engines import drafter_formats

    name = f"{kind}-{shape}-{dtype}-{'tied' if tied else 'untied'}"
    made = drafter_formats()[kind].make(str(root / name), shape=shape, dtype=dtype, tied=tied, block_size=None,
                                         seed=0, overwrite=False, note=lambda line: None)
    return made.record


def plain_fixture(arch: str, dtype: str, root: Path) -> dict[str, Any]:
    """A plain mlx-lm pair of ``arch`` under ``root`` (built on first use), with the built-in prompts as its
    tokenizer's ids (:func:`with_fit_prompts`)."""
    from specparity.fixtures import build_pair

    return with_fit_prompts(build_pair(root / f"plain-{arch}-{dtype}", arch=arch, dtype=dtype).to_dict())


def with_fit_prompts(info: dict[str, Any]) -> dict[str, Any]:
    """A plain pair's record with the built-in prompts as its target tokenizer's ids (``fit_prompts``, as a drafter
    format's record has them: what :func:`run_engine` prompts with)."""
    from tokenizers import Tokenizer

    from specparity.prompts import DEFAULT_PROMPTS

    tok = Tokenizer.from_file(str(Path(info["target"]) / "tokenizer.json"))
    return {**info, "fit_prompts": [tok.encode(t).ids for t in DEFAULT_PROMPTS]}


def run_engine(engine: str, info: dict[str, Any] | None, max_tokens: int, env: Any = None,
               extra_env: dict[str, str] | None = None, prompt: list[int] | None = None) -> list[dict[str, Any]]:
    """:mod:`specparity.probes.engine_e2e` in ``engine``'s environment (``env``: a built
    :class:`~specparity.environments.Environment`; None: built on first use): its findings (an
    infrastructure failure is one ``error`` row with the process's last line). ``prompt``: token ids (None:
    the fixture's first fit prompt)."""
    from specparity.environments import ensure_environment

    if env is None:
        env = ensure_environment(engine, progress=lambda line: print(f"specparity: {line}", file=sys.stderr))
    argv = [str(env.python), "-P", "-m", "specparity.probes.engine_e2e", "--engine", engine,
            "--max-tokens", str(max_tokens)]
    if info is not None:
        argv += ["--target", info["target"], "--draft", info["draft"] or "",
                 "--prompt-ids", ",".join(map(str, prompt or info["fit_prompts"][0]))]
    try:
        # tied: the engine's run ends with this one, however this one ends
        proc = run_tied_captured(argv, f"{engine}'s e2e run", timeout=RUN_TIMEOUT_S,
                                 env={**env.environ(), **(extra_env or {})})
    except subprocess.TimeoutExpired:
        return [{"engine": engine, "entry": "*", "verdict": Verdict.ERROR,
                 "failure": f"no answer in {RUN_TIMEOUT_S} s"}]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not rows:
        last = (proc.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        rows.append({"engine": engine, "entry": "*", "verdict": Verdict.ERROR,
                     "failure": f"engine_e2e exited {proc.returncode}: {last}"})
    return rows


def findings(engines: list[str], shapes: set[str] | None, dtypes: list[str], max_tokens: int,
             root: Path, archs: tuple[str, ...] = PLAIN_ARCHS) -> list[dict[str, Any]]:
    """Each engine's rows: on every target shape of its drafter format (:func:`format_shapes`; ``shapes``: only
    these names, None: all) x ``dtypes``, on every ``archs`` x ``dtypes`` plain pair where it drafts with a plain
    drafter, or once where its drafter is inside the target."""
    out: list[dict[str, Any]] = []
    for engine in engines:
        kind = engine_formats()[engine]
        if not kind:
            for row in run_engine(engine, None, max_tokens):
                out.append({**row, "shape": "(any)", "dtype": "", "tied": None})
            continue
        if kind == PLAIN:
            for arch in archs:
                for dtype in dtypes:
                    info = plain_fixture(arch, dtype, root)
                    out += [{**row, "shape": arch, "dtype": dtype, "tied": None}
                            for row in run_engine(engine, info, max_tokens)]
            continue
        for shape, tied in format_shapes(kind, shapes):
            for dtype in dtypes:
                try:
                    info = fixture(kind, shape, dtype, tied, root)
                except UsageError as err:  # a shape or dtype its builder does not take: said, never a pass
                    out.append({"engine": engine, "entry": "*", "verdict": Verdict.NOT_RUN, "shape": shape,
                                "dtype": dtype, "tied": tied, "failure": f"no {kind} fixture of this shape: {err}"})
                    continue
                for row in run_engine(engine, info, max_tokens):
                    out.append({**row, "shape": shape, "dtype": dtype, "tied": tied,
                                "fixture_mix": (info.get("accept_mix") or {}).get("summary")})
    return out


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| engine | entry point | target | dtype | head | finding |", "|---|---|---|---|---|---|"]
    for r in rows:
        what = r.get("verdict", Verdict.ERROR)
        detail = r.get("failure") or r.get("reason", "")
        head = _head(r)
        lines.append(f"| {r['engine']} | {r.get('entry', '')} | {r['shape']} | {r['dtype']} | {head} |"
                     f" **{what}**: {detail.replace('|', '/')} |")
    return "\n".join(lines)


def _head(r: dict[str, Any]) -> str:
    """A row's head as a table says it: tied, untied, or "" (a plain pair's, not varied)."""
    return "" if r.get("tied") is None else ("tied" if r["tied"] else "untied")


def _cell(r: dict[str, Any]) -> str:
    """One finding in a few words: the verdict, where it parted (token, round, row, whether an exact tie) or why
    it did not run."""
    what = str(r.get("verdict", Verdict.ERROR))
    if what == Verdict.MATCH:
        return f"{what}, {r['accepted']}/{r['drafted']} accepted" if r.get("drafted") else what
    if what == Verdict.DIVERGED and r.get("index") is not None:
        where = ", ".join(f"{k} {r[k]}" for k in ("round", "row") if r.get(k) is not None)
        limit = re.search(r"classic stopped at max_tokens=(\d+)", str(r.get("reason") or ""))
        if limit:  # a length finding: the engine went on where classic decode stopped
            return (f"{len(r.get('tokens') or [])} tokens where max_tokens is {limit.group(1)}"
                    + (f" ({where})" if where else ""))
        tie: dict[str, Any] = r["tie"] if isinstance(r.get("tie"), dict) else {}
        kind = ("; an exact logprob tie" if tie.get("logprob_tie")
                else f"; a near tie, {tie['ulps']} ULP" + ("s" if tie["ulps"] != 1 else "") if tie.get("near_tie")
                else "; not a tie" if tie else "")
        return f"diverged at token {r['index']}" + (f" ({where}{kind})" if where or kind else "")
    if what == Verdict.NOT_ENGAGED:
        return "not engaged: no draft accepted"
    if what == Verdict.LOSSY:
        return "lossy by design (its documented mode)"
    why = str(r.get("failure") or r.get("reason") or "").split(" (at ")[0].split("; ")[0]
    return f"{what.replace('_', ' ')}: {why[:100] + ('...' if len(why) > 100 else '')}" if why else what


def grid(rows: list[dict[str, Any]]) -> str:
    """The rows as one table: a line per engine and entry point, a column per target (shape, dtype, head)."""
    cols: list[tuple[str, str, str]] = []
    cells: dict[tuple[str, str], dict[tuple[str, str, str], str]] = {}
    for r in rows:
        head = _head(r)
        col = (str(r["shape"]), str(r["dtype"]), head)
        if col not in cols:
            cols.append(col)
        cells.setdefault((r["engine"], str(r.get("entry", ""))), {})[col] = _cell(r).replace("|", "/")
    names = [" ".join(x for x in c if x) for c in cols]
    lines = ["| engine | entry point | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(cols)]
    for (engine, entry), by in cells.items():
        lines.append(f"| {engine} | {entry} | " + " | ".join(by.get(c, "") for c in cols) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -P -m specparity.engine_findings", description=__doc__.split("\n")[0])
    ap.add_argument("--engine", action="append", choices=list(engine_formats()))
    kinds = {k for k in engine_formats().values() if k and k != PLAIN}
    ap.add_argument("--shape", action="append", choices=sorted({shape_name(*x) for k in kinds for x in format_shapes(k)}
                                                               | {shape_name(*x) for x in SHAPES} | set(PLAIN_ARCHS)),
                    help="a drafter format's target shape, or a plain pair's architecture")
    ap.add_argument("--dtype", action="append", choices=list(DTYPES))
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--fixtures", default="", help="fixture root (default: $SPECPARITY_HOME/fixtures)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--grid", action="store_true", help="one line per engine and entry point, one column per target")
    ap.add_argument("--from-json", metavar="FILE", action="append", default=[],
                    help="print the rows a --json run wrote (repeatable), running nothing")
    a = ap.parse_args(argv)
    from specparity.fixtures import fixtures_home

    shapes = set(a.shape) if a.shape else None
    archs = tuple(x for x in PLAIN_ARCHS if not a.shape or x in a.shape)
    if a.from_json:
        rows = []
        for f in a.from_json:
            try:
                got = json.loads(Path(f).read_text())
                if not isinstance(got, list) or not all(isinstance(r, dict) and "engine" in r for r in got):
                    raise ValueError(f)
                rows += got
            except (OSError, ValueError) as err:  # one line, the usage exit code: nothing was run
                print(f"Error: --from-json {f}: {err.strerror if isinstance(err, OSError) else 'not JSON rows'}",
                      file=sys.stderr)
                return 2
    else:
        rows = findings(a.engine or list(engine_formats()), shapes, a.dtype or list(DTYPES), a.max_tokens,
                        Path(a.fixtures) if a.fixtures else fixtures_home(), archs)
    print(json.dumps(rows, indent=1) if a.json else grid(rows) if a.grid else markdown(rows))
    return 1 if any(r.get("verdict") == Verdict.DIVERGED for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
