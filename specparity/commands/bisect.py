"""``specparity bisect``: the first divergent layer and sub-op, in process or across dumps."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import click

from specparity.engines import EngineSpec

from specparity.commands._common import (
    CommandRun,
    cache_options,
    cache_options_from,
    emit_json,
    json_option,
    model_options,
    record_option,
    top_json,
)
from specparity.commands._engine import engine_option
from specparity.errors import EXIT_OK, UsageError
from specparity.outputs import check_new_file, force_option

log = logging.getLogger(__name__)


def _prompt_options(f: Any) -> Any:
    f = click.option("--prompt-ids", default=None, metavar="IDS",
                     help="The prompt as comma-separated token ids (wins over --prompt).")(f)
    f = click.option("--prompt", default=None, metavar="TEXT",
                     help="Prompt text (default: the first built-in probe prompt).")(f)
    return f


def _coords_options(f: Any) -> Any:
    f = click.option("--depth", type=click.IntRange(min=0), default=0, show_default=True,
                     help="Tokens decoded past the prompt before the arms.")(f)
    f = click.option("--width", type=click.IntRange(min=1), default=None,
                     help="Verify block rows W (required).")(f)
    return f


def _prompt(engine: Any, prompt: str | None, prompt_ids: str | None) -> list[int]:
    """--prompt-ids, --prompt, else the first built-in probe prompt, for ``engine`` (an adapter)."""
    from specparity.commands._engine import engine_prompts
    from specparity.prompts import DEFAULT_PROMPTS, parse_prompt_ids

    if prompt_ids:
        return engine_prompts(engine, None, parse_prompt_ids([prompt_ids]))[0]
    return engine_prompts(engine, [prompt if prompt is not None else DEFAULT_PROMPTS[0]], None)[0]


def _need_width(width: int | None, depth: int = 0) -> int:
    from specparity.inputs import check_positions, check_width

    if width is None:
        raise UsageError("--width is required (the verify block's row count, e.g. --width 4)")
    check_positions(depth, "--depth")
    return check_width(width)


def _emit(run: CommandRun, result: Any) -> int:
    """Record the layers chart beside the record, print, and return the exit code."""
    from specparity.bisect.chart import svg

    chart = run.sink.write_bytes("layers.svg", svg(result.report).encode())
    rel = f"data/{run.sink.record.name}/{chart.name}" if chart is not None else None
    return run.finish(result, markdown=result.markdown(rel))


@click.group(invoke_without_command=True)
@_coords_options
@_prompt_options
@model_options
@cache_options
@click.option("--control", "controls", multiple=True, metavar="NAME=VALUE",
              help="Rerun both arms in a fresh process with this environment variable"
                   " set (repeatable), plus one process without; group arms by logits sha256.")
@engine_option
@click.option("--draft-model", default=None, metavar="DIR",
              help="--engine: the engine's drafter, for an engine whose adapter loads it with the target"
                   " (default: the one beside a fixture the toolkit built).")
@click.option("--accepted", type=click.IntRange(min=0), default=None, metavar="K",
              help="--engine: roll the engine's block back to K accepted proposals and compare its state"
                   " with classic decode's over the K + 1 kept tokens, layer by layer.")
@json_option
@record_option
@click.pass_context
def bisect(ctx: click.Context, width: int | None, depth: int, prompt: str | None,
           prompt_ids: str | None, model: str | None, trust_remote_code: bool,
           controls: tuple[str, ...], engine: EngineSpec, verify_mode: str | None, environment: str | None,
           draft_model: str | None, accepted: int | None,
           as_json: bool, record_dir: str | None, quiet: bool, **kwargs: Any) -> int | None:
    """Locate the first divergent layer and sub-op between W single steps and one W-row block.

    From the state after prefill and --depth decoded tokens, runs the chain
    (W greedy single-token steps) and the block (the same W tokens in one
    call) once each, capturing the embeddings, every decoder layer's output
    and sub-ops, the final norm, the logits and every layer's cache. Prints
    per layer: type, differing/total bytes, max abs diff, first differing row;
    names the first divergent layer and the first differing sub-op in it.

    Exit codes: 0 no divergent layer, 1 a divergent layer was found,
    2 usage error, 4 the checkpoint would not load or a control arm failed.

    With --engine dflash-mlx the block arm is the engine's own verify forward
    (captured on the engine's model, from an exact copy of classic decode's
    state) and the chain arm is classic decode; --accepted K also rolls the
    engine back to K accepted proposals and compares every layer's state with
    classic decode's over the K + 1 kept tokens.

    \b
    Examples:
        specparity fixtures make ./fx                  # a pair to try: ./fx/target, ./fx/draft
        specparity bisect --model ./fx/target --width 4 --depth 32
        specparity bisect --model ./fx/target --width 4 --control MLX_X=1 --record-dir results
        specparity bisect --engine dflash-mlx --width 8 --accepted 3     # exit 1: the default DFlash pair
        specparity bisect dump --model ./fx/target --width 4 --arm block --out cpu.safetensors
        specparity bisect dump --model ./fx/target --width 4 --arm chain --out chain.safetensors
        specparity bisect diff cpu.safetensors chain.safetensors
    """
    if ctx.invoked_subcommand is not None:
        return None
    from specparity.bisect.controls import parse_control
    from specparity.bisect.run import run_bisect
    from specparity.commands._engine import explicit, load_adapter, rerun_elsewhere

    if accepted is not None and "engine" not in explicit(ctx, "engine"):
        raise UsageError("--accepted rolls back an engine's block: give --engine")
    w = _need_width(width, depth)
    if accepted is not None and accepted > w - 1:
        raise UsageError(f"--accepted {accepted}: a {w}-row block holds at most {w - 1} proposals")
    parsed = [parse_control(c) for c in controls]
    opts = cache_options_from(kwargs)
    code = rerun_elsewhere(engine, model, draft_model, trust_remote_code, environment)
    if code is not None:
        return code
    eng = load_adapter(engine, model, draft_model, need_draft=False, verify_mode=verify_mode,
                       trust_remote_code=trust_remote_code, prefill_step_size=opts.prefill_step_size, cache=opts)
    if controls and not eng.supports("control-arms"):
        raise UsageError(f"--engine {engine}: --control reruns mlx-lm's arms; not with an engine")
    ignored = [] if eng.supports("cache-options") else explicit(
        ctx, "kv_bits", "max_kv_size", "quantized_kv_start", "kv_group_size")
    if ignored:
        click.echo(f"--engine {engine}: not applied: {', '.join('--' + n.replace('_', '-') for n in ignored)}",
                   err=True)
    ids = _prompt(eng, prompt, prompt_ids)
    loaded = eng.checkpoint()
    if loaded is not None:
        click.echo(f"bisect: width {w}, depth {depth}, {len(ids)} prompt tokens"
                   + (f", rollback to {accepted}" if accepted is not None else ""), err=True)
        fp = loaded.fingerprint
        run = CommandRun("bisect", f"bisect: {fp.model_type} {fp.short} width {w} depth {depth}",
                         {"model": fp.to_dict(), "width": w, "depth": depth}, record_dir, as_json, quiet)
    else:
        click.echo(f"bisect --engine {engine}: width {w}, depth {depth}, {len(ids)} prompt tokens"
                   + (f", rollback to {accepted}" if accepted is not None else ""), err=True)
        run = CommandRun("bisect", f"bisect --engine {engine}: width {w} depth {depth}",
                         {"engine": eng.info.to_dict(), "width": w, "depth": depth}, record_dir, as_json, quiet,
                         slug=f"bisect-{engine}")
    from specparity.errors import Inconclusive
    from specparity.probes.engines.base import EngineCannotRun

    with run:
        try:
            found = run_bisect(eng, ids, w, depth, controls=parsed, trust_remote_code=trust_remote_code,
                               observer=run.observer, accepted=accepted)
        except EngineCannotRun as err:  # the engine's own error on this shape: not run, never a pass
            raise Inconclusive(f"bisect --engine {engine}: not run: {err}") from err
        return _emit(run, found)


@bisect.command("dump")
@_coords_options
@_prompt_options
@model_options
@cache_options
@click.option("--arm", type=click.Choice(["chain", "block", "both"]), default="both",
              show_default=True, help="Which arm's captures to write.")
@click.option("--out", required=True, type=click.Path(dir_okay=False), metavar="FILE",
              help="Safetensors file to write (its manifest goes to FILE with .json).")
@force_option
@json_option
def dump(width: int | None, depth: int, prompt: str | None, prompt_ids: str | None,
         model: str | None, trust_remote_code: bool, arm: str, out: str, force: bool,
         as_json: bool, **kwargs: Any) -> int:
    """Write every capture of one arm (or both) to safetensors plus a JSON manifest.

    Run it under each environment, backend or mlx version to compare, then
    `specparity bisect diff` the files anywhere.

    \b
    Example:
        specparity bisect dump --model ./fx/target --width 4 --arm block --out a.safetensors
    """
    from specparity.bisect.arms import run_arms
    from specparity.bisect.dump import manifest_path, write_dump
    from specparity.bisect.run import model_meta
    from specparity.identity import identity, kernel_env

    w = _need_width(width, depth)
    check_new_file(out, "--out", force, also=(manifest_path(out),))
    opts = cache_options_from(kwargs)
    from specparity.commands._engine import load_adapter
    from specparity.engines import DEFAULT

    # the classic arms, through the default engine's adapter (the one `--control` reruns)
    eng = load_adapter(DEFAULT, model, None, need_draft=False, verify_mode=None,
                       trust_remote_code=trust_remote_code, prefill_step_size=opts.prefill_step_size, cache=opts)
    loaded = eng.checkpoint()
    ids = _prompt(eng, prompt, prompt_ids)
    arms = ("chain", "block") if arm == "both" else (arm,)
    bc = run_arms(eng, ids, w, depth, arms=arms)
    manifest = write_dump(out, bc, arms, {
        "model": model_meta(loaded), "env": kernel_env(), "cache_options": opts.to_dict(),
        "identity": identity(model=loaded.fingerprint.to_dict()),
    }, force=force)
    summary = {"out": out, "manifest": str(manifest_path(out)), "arms": list(arms),
               "width": w, "depth": depth, "logits_sha256": manifest["logits_sha256"],
               "capture_bytes": manifest["capture_bytes"]}
    if as_json:
        emit_json(top_json(EXIT_OK, summary))
    else:
        click.echo(f"wrote {', '.join(arms)} captures ({manifest['capture_bytes']} bytes) to {out}")
        for a, h in manifest["logits_sha256"].items():
            click.echo(f"  {a} logits sha256 {h}")
    return EXIT_OK


@bisect.command("diff")
@click.argument("a", type=click.Path(dir_okay=False))
@click.argument("b", type=click.Path(dir_okay=False))
@click.option("--a-arm", type=click.Choice(["chain", "block"]), default=None,
              help="Arm of A to compare (needed when A holds both).")
@click.option("--b-arm", type=click.Choice(["chain", "block"]), default=None,
              help="Arm of B to compare (needed when B holds both).")
@json_option
@record_option
def diff(a: str, b: str, a_arm: str | None, b_arm: str | None, as_json: bool,
         record_dir: str | None, quiet: bool) -> int:
    """Compare two dumps with the same per-layer report as the in-process bisect.

    Both dumps must come from the same model (fingerprint), width, depth and
    prompt; anything else is refused (exit 2) rather than diffed.

    \b
    Example:
        specparity bisect diff cpu.safetensors chain.safetensors
    """
    from specparity.bisect.dump import check_partners, read_dump
    from specparity.bisect.report import compare_arms

    da, db = read_dump(a), read_dump(b)
    check_partners(da, db)
    arm_a, arm_b = da.arm(a_arm, "--a-arm"), db.arm(b_arm, "--b-arm")
    meta = dict(da.manifest["model"])
    meta["a_env"] = da.manifest.get("env", {})
    meta["b_env"] = db.manifest.get("env", {})
    if da.manifest["tokens"] != db.manifest["tokens"]:
        meta["note"] = ("the dumps fed different tokens (their chains' greedy picks differ):"
                        " rows after the first different token differ by construction")
    report = compare_arms(arm_a, arm_b, da.width, da.depth, da.layer_kinds,
                          a_label=f"{Path(a).name}:{arm_a.arm}",
                          b_label=f"{Path(b).name}:{arm_b.arm}", meta=meta)
    if not as_json:
        print(f"diff {a} ({arm_a.arm}) vs {b} ({arm_b.arm})", file=sys.stderr)
    from specparity.bisect.run import BisectRun

    m = da.manifest["model"]
    run = CommandRun("bisect", f"bisect diff: {Path(a).name} vs {Path(b).name}",
                     {"model": m, "width": da.width, "depth": da.depth, "a": str(a), "b": str(b)},
                     record_dir, as_json, quiet, slug="bisect-diff")
    with run:
        for row in report.to_dict()["rows"]:
            run.observer.result("layers", row)
        return _emit(run, BisectRun(report))
