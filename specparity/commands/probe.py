"""``specparity probe``: block-vs-chain, long walk and prefill parity."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from specparity.engines import EngineSpec

from specparity.commands._common import (
    CommandRun,
    cache_options,
    cache_options_from,
    json_option,
    memory_limit_callback,
    model_options,
    parse_int_list,
    record_option,
)
from specparity.commands._engine import engine_option
from specparity.errors import UsageError


@click.command()
@model_options
@click.option("--widths", default="2,4,8,16", show_default=True,
              help="Verify rows W: list and ranges, e.g. 2,4,8 or 2-16.")
@click.option("--depths", default="0,16,64", show_default=True,
              help="Tokens decoded past the prompt before the block.")
@click.option("--prompt", "prompts", multiple=True, help="Prompt text (repeatable).")
@click.option("--prompt-ids", multiple=True, help="Prompt as token ids, e.g. 1,2,3 (repeatable).")
@click.option("--walk", type=click.IntRange(min=0), default=128, show_default=True,
              help="Long-walk positions (0 disables).")
@click.option("--walk-widths", default=None, help="Widths to walk (default: every width).")
@click.option("--prefill/--no-prefill", default=True, show_default=True,
              help="Also compare one-shot, chunked and token-by-token prefill.")
@click.option("--aim/--no-aim", default=True, show_default=True,
              help="Also run blocks and walks placed to straddle every cache boundary"
                   " (quantized-KV start, rotating size, sliding windows, prefill step).")
@click.option("--aim-limit", type=click.IntRange(min=1), default=1024, show_default=True,
              help="Aim only at boundaries up to this many positions; further ones are named in the report.")
@click.option("--draft-model", default=None, metavar="DIR",
              help="--engine: the engine's drafter (its block size sets the default widths).")
@click.option("--rollback/--no-rollback", default=None,
              help="Also roll back to every accept k of each width and compare the engine's state with"
                   " classic decode's over the k + 1 kept tokens (default: on, except for mlx-lm, whose"
                   " trim `specparity replay` checks round by round).")
@engine_option
@cache_options
@click.option("--memory-limit", default=None, metavar="SIZE", callback=memory_limit_callback,
              help="The memory the probe may use, e.g. 16GB (default: $SPECPARITY_MEMORY_LIMIT, else what the"
                   " machine has available; 'off': no check). A probe expected to need more is refused.")
@json_option
@record_option
@click.pass_context
def probe(ctx: click.Context, model: str | None, trust_remote_code: bool, widths: str, depths: str,
          prompts: tuple[str, ...], prompt_ids: tuple[str, ...], walk: int, walk_widths: str | None,
          prefill: bool, aim: bool, aim_limit: int, draft_model: str | None, rollback: bool | None, engine: EngineSpec,
          verify_mode: str | None, environment: str | None, memory_limit: str | None, as_json: bool,
          record_dir: str | None, quiet: bool,
          **cache_kwargs: Any) -> int:
    """Compare W single-token steps with one W-row block, byte for byte.

    For each width W and depth D: prefill as classic decode does, decode D
    tokens greedily, then from two identical cache states run the chain (W
    single steps) and the block (one W-row forward) and compare the logits as
    raw bytes in the model's dtype. Several prompts per cell; the long walk
    feeds consecutive full-accept blocks and reports the first divergent
    position; prefill parity compares one-shot, chunked and token-by-token.
    Before any of it counts, the chain arm is repeated once from the same
    state (reproducibility bracket): a repeat that differs is inconclusive.
    Every cache boundary (quantized-KV start, rotating size, sliding windows,
    prefill step) gets blocks placed to straddle it, whatever the prompts.

    \b
    Exit codes: 0 all equal, 1 divergent, 2 usage, 3 not run or not
    reproducible, 4 load failure.

    With --engine dflash-mlx the block is the engine's own verify forward
    (its target adapter, from an exact copy of classic decode's state), and at
    each width every rollback to k accepted is checked: the engine's state
    against classic decode's over the k + 1 kept tokens; the engine's own
    prefill is checked too. A shape the engine cannot run is not_run, with
    the engine's error. Default widths: the engine's (the drafter's block and
    its reduced block). --engine mlx-dspark does the same through its own
    Target.verify / Target.rollback (KV trim, gated-delta re-run); its widths:
    its default cap's 3 rows and the drafter's whole block. --engine dspark-mlx:
    its host adapter's verify_forward / kv_rollback, at its block of 8 rows.

    \b
    Examples:
        specparity probe
        specparity fixtures make ./fx                  # a pair to try: ./fx/target, ./fx/draft
        specparity probe --model ./fx/target --widths 2-16 --depths 0,32,128
        specparity probe --kv-bits 8 --kv-group-size 32 --quantized-kv-start 0 --json   # exit 1; 32 divides the head
        specparity probe --max-kv-size 1024 --prefill-step-size 512 --json
        specparity probe --engine dflash-mlx                 # exit 1: the default DFlash pair's rollbacks
    """
    from specparity.commands._engine import engine_paths, engine_prompts, explicit, load_adapter, rerun_elsewhere
    from specparity.inputs import check_positions
    from specparity.probes.forward.probe import run_probe
    from specparity.prompts import parse_prompt_ids

    w_list = parse_int_list(widths, "--widths", minimum=1, limit="max_width")
    d_list = parse_int_list(depths, "--depths", minimum=0, limit="max_positions")
    check_positions(walk, "--walk")
    if not w_list:
        raise UsageError("--widths: give at least one width")
    if not d_list:
        raise UsageError("--depths: give at least one depth")
    ww = (parse_int_list(walk_widths, "--walk-widths", minimum=2, limit="max_width")
          if walk_widths else None)
    ids = parse_prompt_ids(prompt_ids)
    opts = cache_options_from(cache_kwargs)

    code = rerun_elsewhere(engine, model, draft_model, trust_remote_code, environment)
    if code is not None:
        return code
    paths = engine_paths(engine, model, draft_model)
    # the memory it expects, from the checkpoint's files, checked before it loads
    from specparity.harness.memory import probe_budget

    positions = max(max(d_list) + max(w_list), walk, aim_limit if aim else 0) + max(map(len, ids), default=64)
    budget = probe_budget(str(paths[0]), positions, flag=memory_limit)
    budget.check()
    eng = load_adapter(engine, model, draft_model, need_draft=False, verify_mode=verify_mode,
                       trust_remote_code=trust_remote_code, prefill_step_size=opts.prefill_step_size,
                       cache=opts, paths=paths)
    # an option of a check the engine's adapter does not support is said, not silently dropped
    unsupported = {"walk": ("walk", "walk_widths"), "prefill-parity": ("prefill",), "aim": ("aim", "aim_limit"),
                   "cache-options": ("kv_bits", "max_kv_size", "quantized_kv_start", "kv_group_size")}
    ignored = explicit(ctx, *(n for f, names in unsupported.items() if not eng.supports(f) for n in names))
    if ignored:
        click.echo(f"--engine {engine}: not applied: {', '.join('--' + n.replace('_', '-') for n in ignored)}",
                   err=True)
    if "widths" not in explicit(ctx, "widths") and eng.info.widths:
        w_list = list(eng.info.widths)
    prompt_list = engine_prompts(eng, list(prompts) or None, ids or None)
    # stated once the input is known good, before the probe starts: a refused input stays one line
    if not quiet and not as_json:
        click.echo(budget.line(), err=True)
    info = eng.info
    loaded = eng.checkpoint()
    if loaded is not None:
        fp = loaded.fingerprint
        run = CommandRun("probe", f"probe: {fp.model_type} {fp.short}",
                         {"model": fp.to_dict(), "cache": opts.to_dict()}, record_dir, as_json, quiet,
                         slug=f"probe-{fp.model_type}")
        extra = {"model": fp.to_dict(), "engine": info.to_dict()}
    else:
        where = Path(info.target)
        run = CommandRun("probe", f"probe --engine {engine}: {where.parent.name}/{where.name}",
                         {"engine": info.to_dict()}, record_dir, as_json, quiet, slug=f"probe-{engine}")
        extra = {"engine": info.to_dict()}
    with run:
        result = run_probe(eng, w_list, d_list, prompt_list, walk_positions=walk, walk_widths=ww,
                           prefill=prefill, observer=run.observer, aim=aim, aim_limit=aim_limit,
                           rollback=eng.rollback_default if rollback is None else rollback,
                           engine_prefill=not eng.supports("classic-prefill"))
        return run.finish(result, markdown=result.markdown(), extra=extra)
