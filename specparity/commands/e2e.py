"""``specparity e2e``: mlx-lm's own entry points, with and without the drafter."""

from __future__ import annotations

from typing import Any

import click

from specparity.commands._common import (
    CommandRun,
    json_option,
    model_options,
    processor_options,
    processor_options_from,
    record_option,
    resolve_model,
)


@click.command("e2e")
@model_options
@click.option("--draft-model", default=None, metavar="DIR",
              help="The drafter (default: the embedded fixture drafter).")
@click.option("--entry-points", default=None, metavar="LIST",
              help="Comma-separated: stream_generate, generate, cli (default: all three).")
@click.option("--prompt", "prompt_text", default=None, help="Prompt text (default: a built-in prompt).")
@click.option("--prompt-ids", default=None, help="Prompt as token ids, e.g. 1,2,3 (the CLI gets their text).")
@click.option("--max-tokens", type=click.IntRange(min=1), default=None,
              help="Tokens to generate (default: each entry point's own).")
@click.option("--num-draft-tokens", type=click.IntRange(min=1), default=None,
              help="Proposals per round, drafter arms only (default: each entry point's own).")
@click.option("--max-kv-size", type=click.IntRange(min=1), default=None, help="Passed as max_kv_size.")
@click.option("--prefill-step-size", type=click.IntRange(min=1), default=None,
              help="Passed as prefill_step_size.")
@click.option("--kv-bits", type=click.Choice(["2", "3", "4", "5", "6", "8"]), default=None,
              help="Passed as kv_bits (quantized KV cache).")
@click.option("--kv-group-size", type=click.Choice(["32", "64", "128"]), default=None,
              help="Passed as kv_group_size.")
@click.option("--quantized-kv-start", type=click.IntRange(min=0), default=None,
              help="Passed as quantized_kv_start.")
@processor_options
@json_option
@record_option
def e2e(model: str | None, trust_remote_code: bool, draft_model: str | None, entry_points: str | None,
        prompt_text: str | None, prompt_ids: str | None, max_tokens: int | None, num_draft_tokens: int | None,
        max_kv_size: int | None, prefill_step_size: int | None, kv_bits: str | None, kv_group_size: str | None,
        quantized_kv_start: int | None, as_json: bool, record_dir: str | None, quiet: bool,
        **proc_kwargs: Any) -> int:
    """Run mlx-lm's public entry points with and without the drafter; compare what they emit.

    Each entry point (mlx_lm.stream_generate, mlx_lm.generate, and the
    mlx_lm.generate command line as a subprocess) runs once without and once
    with the drafter, given only the options you pass: everything else is the
    entry point's own default, as a user gets it. Greedy (the entry points'
    default sampler). Reports, per entry point: token ids and text compared,
    with the first differing index and its context; every option you passed
    that the drafter path dropped or changed on its way to mlx-lm's step
    function; defaults that differ with the drafter; a drafter arm that
    drafted nothing (not engaged).

    \b
    Exit codes: 0 every entry point matches, 1 an output differs or an option
    was dropped, 2 usage, 3 not engaged or an arm could not run, 4 load failure.

    \b
    Examples:
        specparity e2e --model ./target --draft-model ./draft --max-tokens 128
        specparity e2e --max-kv-size 64 --entry-points stream_generate,cli
        specparity e2e --repetition-penalty 1.3 --json
    """
    from specparity.errors import UsageError
    from specparity.probes.e2e import E2EOptions, parse_entry_points, run_e2e
    from specparity.prompts import DEFAULT_PROMPTS, parse_prompt_ids

    from specparity.inputs import check_limit, check_positions

    entries = parse_entry_points(entry_points)
    if max_tokens is not None:
        check_positions(max_tokens, "--max-tokens")
    if num_draft_tokens is not None:  # a round verifies num_draft_tokens + 1 rows
        check_limit(num_draft_tokens + 1, "--num-draft-tokens", "max_width", num_draft_tokens)
    if prompt_text is not None and prompt_ids is not None:
        raise UsageError("give --prompt or --prompt-ids, not both")
    procs = processor_options_from(proc_kwargs)
    options = E2EOptions(
        max_tokens=max_tokens, num_draft_tokens=num_draft_tokens, max_kv_size=max_kv_size,
        prefill_step_size=prefill_step_size, kv_bits=int(kv_bits) if kv_bits else None,
        kv_group_size=int(kv_group_size) if kv_group_size else None,
        quantized_kv_start=quantized_kv_start, processors=procs)
    loaded = resolve_model(model, trust_remote_code)
    draft = resolve_model(draft_model, trust_remote_code, role="draft")
    vocab = getattr(getattr(loaded.model, "args", None), "vocab_size", None)
    if isinstance(vocab, int):
        from specparity.processors import check_vocab

        check_vocab(procs, vocab)
    prompt: str | list[int] = (parse_prompt_ids([prompt_ids])[0] if prompt_ids is not None
                               else prompt_text if prompt_text is not None else DEFAULT_PROMPTS[0])
    fp = loaded.fingerprint
    run = CommandRun("e2e", f"e2e: {fp.model_type} {fp.short}",
                     {"model": fp.to_dict(), "draft_model": draft.fingerprint.to_dict(),
                      "options": options.passed(True)},
                     record_dir, as_json, quiet, slug=f"e2e-{fp.model_type}")
    with run:
        result = run_e2e(loaded, draft, prompt, options, entries, trust_remote_code, observer=run.observer)
        return run.finish(result)
