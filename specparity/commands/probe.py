"""``specparity probe``: block-vs-chain, long walk and prefill parity."""

from __future__ import annotations

import click

from specparity.commands._common import (
    cache_options,
    cache_options_from,
    emit_json,
    json_option,
    model_options,
    parse_int_list,
    record_option,
    resolve_model,
)
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
@cache_options
@json_option
@record_option
def probe(model, trust_remote_code, widths, depths, prompts, prompt_ids, walk, walk_widths,
          prefill, as_json, record_dir, **cache_kwargs):
    """Compare W single-token steps with one W-row block, byte for byte.

    For each width W and depth D: prefill as classic decode does, decode D
    tokens greedily, then from two identical cache states run the chain (W
    single steps) and the block (one W-row forward) and compare the logits as
    raw bytes in the model's dtype. Several prompts per cell; the long walk
    feeds consecutive full-accept blocks and reports the first divergent
    position; prefill parity compares one-shot, chunked and token-by-token.

    \b
    Exit codes: 0 all equal, 1 divergent, 2 usage, 3 not run, 4 load failure.

    \b
    Examples:
        specparity probe
        specparity probe --model ./mlx-model --widths 2-16 --depths 0,32,128
        specparity probe --kv-bits 8 --quantized-kv-start 0 --json
    """
    from specparity.checkpoint import model_dtype
    from specparity.inputs import check_positions, check_prompts
    from specparity.probes.forward.blockchain import probe_block_vs_chain
    from specparity.probes.forward.prefill import prefill_parity
    from specparity.probes.forward.render import probe_markdown, probe_text
    from specparity.prompts import encode_prompts, parse_prompt_ids

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

    loaded = resolve_model(model, trust_remote_code)
    check_prompts(ids, loaded)
    prompt_list = encode_prompts(loaded.tokenizer, list(prompts) or None, ids or None)
    report = probe_block_vs_chain(loaded.model, w_list, d_list, prompt_list, opts,
                                  walk_positions=walk, walk_widths=ww)
    pre = prefill_parity(loaded.model, prompt_list, opts) if prefill else []
    verdict = report.verdict
    if verdict == "equal" and any(r.verdict == "divergent" for r in pre):
        verdict = "divergent"
    exit_code = {"equal": 0, "divergent": 1, "not_run": 3}[verdict]

    fp = loaded.fingerprint
    meta = {
        "model": fp.path,
        "model_type": fp.model_type,
        "dtype": model_dtype(loaded.model),
        "fingerprint": fp.short,
        "cache": opts.describe(),
        "prompts": ", ".join(f"{n} tokens" for n in report.prompts),
    }
    header = (f"model {fp.path} ({fp.model_type}, {meta['dtype']}, fingerprint {fp.short})"
              f"\ncache: {opts.describe()}; prompts: {meta['prompts']}")
    result = {**report.to_dict(), "verdict": verdict, "prefill": [r.to_dict() for r in pre],
              "model": fp.to_dict()}

    if record_dir:
        from specparity.identity import identity
        from specparity.records.writer import RecordWriter

        rec = RecordWriter(record_dir, f"probe-{fp.model_type}",
                           identity(model=fp.to_dict(), cache=opts.to_dict()))
        for c in report.cells:
            rec.append("cells", c.to_dict())
        for w in report.walks:
            rec.append("walks", w.to_dict())
        for r in pre:
            rec.append("prefill", r.to_dict())
        md = rec.finish(probe_markdown(report, f"probe: {fp.model_type} {meta['dtype']}", meta, pre))
        click.echo(f"record written: {md}", err=True)

    if as_json:
        emit_json(result)
    else:
        click.echo(probe_text(report, header, pre))
        click.echo(f"verdict: {verdict}")
    return exit_code
