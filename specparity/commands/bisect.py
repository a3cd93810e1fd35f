"""``specparity bisect``: the first divergent layer and sub-op, in process or across dumps."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import click

from specparity.commands._common import (
    CommandRun,
    cache_options,
    cache_options_from,
    emit_json,
    json_option,
    model_options,
    record_option,
    resolve_model,
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


def _prompt(loaded: Any, prompt: str | None, prompt_ids: str | None) -> list[int]:
    from specparity.prompts import DEFAULT_PROMPTS, encode_prompts, parse_prompt_ids

    if prompt_ids:
        from specparity.inputs import check_prompts

        ids = parse_prompt_ids([prompt_ids])[0]
        check_prompts([ids], loaded)
        return ids
    text = prompt if prompt is not None else DEFAULT_PROMPTS[0]
    return encode_prompts(loaded.tokenizer, [text])[0]


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
@click.option("--accepted", type=click.IntRange(min=0), default=None, metavar="K",
              help="--engine: roll the engine's block back to K accepted proposals and compare its state"
                   " with classic decode's over the K + 1 kept tokens, layer by layer.")
@json_option
@record_option
@click.pass_context
def bisect(ctx: click.Context, width: int | None, depth: int, prompt: str | None,
           prompt_ids: str | None, model: str | None, trust_remote_code: bool,
           controls: tuple[str, ...], engine: str, verify_mode: str | None, environment: str | None,
           accepted: int | None,
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
        specparity bisect --model ./ckpt --width 4 --depth 32
        specparity bisect --model ./ckpt --width 4 --control MLX_X=1 --record-dir results
        specparity bisect --engine dflash-mlx --model ./fx/target --width 8 --accepted 3
        specparity bisect dump --model ./ckpt --width 4 --arm block --out cpu.safetensors
        specparity bisect diff cpu.safetensors metal.safetensors
    """
    if ctx.invoked_subcommand is not None:
        return None
    from specparity.engines import get

    if not get(engine).classic_paths:
        return _engine_bisect(engine, width, depth, prompt, prompt_ids, model, trust_remote_code, controls,
                              verify_mode, environment, accepted, as_json, record_dir, quiet, kwargs)
    if accepted is not None:
        raise UsageError("--accepted rolls back an engine's block: give --engine")
    from specparity.bisect.controls import parse_control
    from specparity.bisect.run import run_bisect

    w = _need_width(width, depth)
    parsed = [parse_control(c) for c in controls]
    opts = cache_options_from(kwargs)
    from specparity.commands._engine import rerun_in_environment

    code = rerun_in_environment(engine, environment, model, None, trust_remote_code)
    if code is not None:
        return code
    loaded = resolve_model(model, trust_remote_code)
    ids = _prompt(loaded, prompt, prompt_ids)
    click.echo(f"bisect: width {w}, depth {depth}, {len(ids)} prompt tokens", err=True)
    fp = loaded.fingerprint
    run = CommandRun("bisect", f"bisect: {fp.model_type} {fp.short} width {w} depth {depth}",
                     {"model": fp.to_dict(), "width": w, "depth": depth}, record_dir, as_json, quiet)
    with run:
        return _emit(run, run_bisect(loaded, ids, w, depth, opts, parsed, trust_remote_code,
                                     observer=run.observer))


def _engine_bisect(engine: str, width: int | None, depth: int, prompt: str | None, prompt_ids: str | None,
                   model: str | None, trust_remote_code: bool, controls: tuple[str, ...], verify_mode: str | None,
                   environment: str | None, accepted: int | None,
                   as_json: bool, record_dir: str | None, quiet: bool, kwargs: dict[str, Any]) -> int:
    from specparity.bisect.run import bisect_engine
    from specparity.commands._engine import engine_prompts, load_adapter, rerun_elsewhere
    from specparity.prompts import parse_prompt_ids

    w = _need_width(width, depth)
    if controls:
        raise UsageError(f"--engine {engine}: --control reruns mlx-lm's arms; not with an engine")
    if accepted is not None and accepted > w - 1:
        raise UsageError(f"--accepted {accepted}: a {w}-row block holds at most {w - 1} proposals")
    code = rerun_elsewhere(engine, model, None, trust_remote_code, environment)
    if code is not None:
        return code
    eng = load_adapter(engine, model, None, need_draft=False, verify_mode=verify_mode,
                       trust_remote_code=trust_remote_code, prefill_step_size=kwargs["prefill_step_size"])
    ids = engine_prompts(eng, [prompt] if prompt else None, parse_prompt_ids([prompt_ids]) if prompt_ids else None)[0]
    click.echo(f"bisect --engine {engine}: width {w}, depth {depth}, {len(ids)} prompt tokens"
               + (f", rollback to {accepted}" if accepted is not None else ""), err=True)
    run = CommandRun("bisect", f"bisect --engine {engine}: width {w} depth {depth}",
                     {"engine": eng.info.to_dict(), "width": w, "depth": depth}, record_dir, as_json, quiet,
                     slug=f"bisect-{engine}")
    from specparity.errors import Inconclusive
    from specparity.probes.engines.base import EngineCannotRun

    with run:
        try:
            found = bisect_engine(eng, ids, w, depth, accepted, observer=run.observer)
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
        specparity bisect dump --model ./ckpt --width 4 --arm block --out a.safetensors
    """
    from specparity.bisect.arms import run_arms
    from specparity.bisect.dump import manifest_path, write_dump
    from specparity.bisect.run import model_meta
    from specparity.identity import identity, kernel_env

    w = _need_width(width, depth)
    check_new_file(out, "--out", force, also=(manifest_path(out),))
    opts = cache_options_from(kwargs)
    loaded = resolve_model(model, trust_remote_code)
    ids = _prompt(loaded, prompt, prompt_ids)
    arms = ("chain", "block") if arm == "both" else (arm,)
    bc = run_arms(loaded.model, ids, w, depth, opts, arms=arms)
    manifest = write_dump(out, bc, arms, {
        "model": model_meta(loaded), "env": kernel_env(), "cache_options": opts.to_dict(),
        "identity": identity(model=loaded.fingerprint.to_dict()),
    })
    summary = {"out": out, "manifest": str(manifest_path(out)), "arms": list(arms),
               "width": w, "depth": depth, "logits_sha256": manifest["logits_sha256"],
               "capture_bytes": manifest["capture_bytes"]}
    if as_json:
        emit_json(summary)
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
        specparity bisect diff cpu.safetensors metal.safetensors
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
