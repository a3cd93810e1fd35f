"""``specparity e2e``: mlx-lm's own entry points, with and without the drafter."""

from __future__ import annotations

from typing import Any

import click

from specparity.engines import EngineSpec

from specparity.commands._common import (
    CommandRun,
    json_option,
    model_options,
    processor_options,
    processor_options_from,
    record_option,
    resolve_model,
)
from specparity.commands._engine import engine_choice_option


@click.command("e2e")
@model_options
@click.option("--draft-model", default=None, metavar="DIR",
              help="The drafter (default: the embedded fixture drafter).")
@click.option("--entry-points", default=None, metavar="LIST",
              help="Comma-separated: stream_generate, generate, cli (default: all three).")
@click.option("--prompt", "prompt_text", default=None, help="Prompt text (default: a built-in prompt).")
@click.option("--prompt-ids", default=None,
              help="Prompt as token ids, e.g. 1,2,3 (the CLI gets their text; where that text encodes to"
                   " other ids the CLI entry is not_run).")
@click.option("--chat-template", "chat_template", is_flag=True,
              help="Put --prompt through the tokenizer's chat template in every arm (default: the raw"
                   " prompt everywhere; the CLI is given --ignore-chat-template).")
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
@engine_choice_option
@json_option
@record_option
@click.pass_context
def e2e(ctx: click.Context, model: str | None, trust_remote_code: bool, draft_model: str | None,
        entry_points: str | None, prompt_text: str | None, prompt_ids: str | None, chat_template: bool,
        max_tokens: int | None, num_draft_tokens: int | None, max_kv_size: int | None,
        prefill_step_size: int | None, kv_bits: str | None, kv_group_size: str | None,
        quantized_kv_start: int | None, engine: EngineSpec, environment: str | None, as_json: bool,
        record_dir: str | None, quiet: bool,
        **proc_kwargs: Any) -> int:
    """Run mlx-lm's public entry points with and without the drafter; compare what they emit.

    Each entry point (mlx_lm.stream_generate, mlx_lm.generate, and the
    mlx_lm.generate command line as a subprocess) runs once without and once
    with the drafter, given only the options you pass: everything else is the
    entry point's own default, as a user gets it. Greedy (the entry points'
    default sampler). Every arm decodes the same prompt tokens: the raw prompt
    (the CLI is given --ignore-chat-template), or the chat template in every
    arm with --chat-template; the CLI reads the prompt from stdin, and where
    it decoded other tokens than the other arms its entry is not_run with the
    reason (the others are kept). Reports, per entry point: token ids and
    text compared, with the first differing index and its context, and the
    cause where the spy saw it (the processors' history with the drafter);
    every option you passed that the drafter path dropped or changed on its
    way to mlx-lm's step function; defaults that differ with the drafter
    where they can matter (prefill_step_size on a prompt longer than the
    smaller step); a drafter arm that drafted nothing (not engaged).

    \b
    Exit codes: 0 every entry point matches, 1 an output differs or an option
    was dropped, 2 usage, 3 not engaged or an arm could not run, 4 load failure.

    \b
    Examples:
        specparity fixtures make ./fx                  # a pair to try: ./fx/target, ./fx/draft
        specparity e2e --model ./fx/target --draft-model ./fx/draft --max-tokens 128
        specparity e2e --max-kv-size 64 --entry-points stream_generate,cli   # exit 1: the drafter drops it
        specparity e2e --repetition-penalty 1.3 --json                       # exit 1: processors' history
        specparity e2e --model ./chat-model --prompt "Hi" --chat-template    # not tested: no chat template here
        specparity e2e --engine dflash-mlx --max-tokens 64                   # the default DFlash pair
    """
    from specparity.commands._common import resolve_path
    from specparity.commands._engine import checked_prompts, engine_paths, explicit, load_adapter, rerun_elsewhere
    from specparity.engines import get
    from specparity.errors import UsageError
    from specparity.inputs import check_limit, check_positions
    from specparity.probes.e2e import E2EOptions, parse_entry_points
    from specparity.prompts import DEFAULT_PROMPTS, parse_prompt_ids

    spec = get(engine)
    if spec.e2e is None or not spec.e2e_entry_points:
        raise UsageError(f"--engine {engine}: the engine declares no e2e entry points")
    run_entry = spec.code("e2e")
    # declared by the engine (data, never read off its code): its entry points take the generation options
    # (mlx-lm's), the prompt as text or ids and the chat template; any other runs them with their own defaults
    takes_options = spec.e2e_options
    entries = parse_entry_points(entry_points, spec.e2e_entry_points)
    if max_tokens is not None:
        check_positions(max_tokens, "--max-tokens")
    if not takes_options:
        ignored = explicit(ctx, "num_draft_tokens", "max_kv_size", "prefill_step_size", "kv_bits", "kv_group_size",
                           "quantized_kv_start", "repetition_penalty", "presence_penalty", "frequency_penalty",
                           "logit_bias", "chat_template")
        if ignored:
            raise UsageError(f"--engine {engine}: {', '.join('--' + n.replace('_', '-') for n in ignored)}"
                             f" are mlx-lm options ({engine}'s entry points run with their own defaults)")
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
    code = rerun_elsewhere(engine, model, draft_model, trust_remote_code, environment)
    if code is not None:
        return code
    target, draft = engine_paths(engine, model, draft_model)
    if draft is None and takes_options:
        draft = resolve_path(None, "draft")  # mlx-lm's entry points: the embedded drafter by default
    from specparity.probes.engine_e2e import OwnLoopEngine

    if spec.loops is not None:
        # each own loop loads the pair with the engine's own loaders and reports its own load error, per entry
        # point: the engine's in-process adapter is not loaded for it
        if draft is None and spec.drafter_checkpoint:
            raise UsageError(f"--engine {engine}: give --draft-model (the engine's drafter) for the engine's own loop")
        eng: Any = OwnLoopEngine(engine.name, target, draft)
    else:
        eng = load_adapter(engine, str(target), draft_model, need_draft=True, verify_mode=None,
                           trust_remote_code=trust_remote_code, paths=(target, draft))
    # classic decode's checkpoint: the adapter's own where it loaded one with the toolkit's loader
    loaded = (eng.checkpoint() if not isinstance(eng, OwnLoopEngine) else None) \
        or resolve_model(str(target), trust_remote_code)
    if takes_options:
        vocab = getattr(getattr(loaded.model, "args", None), "vocab_size", None)
        if isinstance(vocab, int):
            from specparity.processors import check_vocab

            check_vocab(procs, vocab)
        prompt: str | list[int] = (parse_prompt_ids([prompt_ids])[0] if prompt_ids is not None
                                   else prompt_text if prompt_text is not None else DEFAULT_PROMPTS[0])
        if not isinstance(prompt, str):
            from specparity.inputs import check_token_ids, vocab_size

            check_token_ids(prompt, vocab_size(loaded), "--prompt-ids")
        fp = loaded.fingerprint
        run = CommandRun("e2e", f"e2e: {fp.model_type} {fp.short}",
                         {"model": fp.to_dict(), "draft_model": eng.draft.fingerprint.to_dict(),
                          "options": options.passed(True)},
                         record_dir, as_json, quiet, slug=f"e2e-{fp.model_type}")
        extra: dict[str, Any] = {"options": options, "chat_template": chat_template,
                                 "trust_remote_code": trust_remote_code}
    else:
        # classic decode's tokenizer and vocabulary: the engine's loops consume the ids classic decode reads
        prompt = checked_prompts(loaded, [prompt_text] if prompt_text else None,
                                 parse_prompt_ids([prompt_ids]) if prompt_ids else None)[0]
        run = CommandRun("e2e", f"e2e --engine {engine}: {target.parent.name}/{target.name}",
                         {"engine": eng.info.to_dict()}, record_dir, as_json, quiet, slug=f"e2e-{engine}")
        extra = {}
        max_tokens = max_tokens or 64
    with run:
        result = run_entry(eng, loaded, prompt, max_tokens, entries, observer=run.observer, **extra)
        return run.finish(result)
