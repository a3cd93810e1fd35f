"""``specparity replay``: a served run's accept lengths, replayed in process."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from specparity.engines import EngineRef, EngineSpec

from specparity.commands._common import (
    CommandRun,
    cache_options,
    cache_options_from,
    emit_json,
    json_option,
    model_options,
    processor_options,
    processor_options_from,
    record_option,
    resolve_model,
    resolve_path,
    top_json,
)
from specparity.commands._engine import engine_option
from specparity.errors import EXIT_OK
from specparity.outputs import force_option
from specparity.probes.replay.logs import FORMATS
from specparity.probes.replay.modes import POLICIES

if TYPE_CHECKING:
    from pathlib import Path

    from specparity.checkpoint import Loaded
    from specparity.decode import CacheOptions
    from specparity.processors import ProcessorOptions


@click.command()
@model_options
@click.option("--accepts", "accepts_text", metavar="LIST",
              help="Accept vector: accepted proposals per round, e.g. 2,2,3,1.")
@click.option("--log", "log_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="A log or record holding accept vectors (see --format).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="auto", show_default=True,
              help="How to read --log.")
@click.option("--regex", default=None, metavar="PATTERN",
              help="Read --log with this pattern (group 'accepts' or 1: an int per round,"
                   " or a list per request).")
@click.option("--request", "request_index", type=click.IntRange(min=0), default=None,
              help="Replay only this request (0-based) of --log.")
@click.option("--draft-model", default=None, metavar="DIR",
              help="Record an accept vector with mlx-lm's speculative decoding, then replay it.")
@click.option("--num-draft-tokens", type=click.IntRange(min=1), default=3, show_default=True,
              help="With --draft-model: proposals per round (width = this + 1).")
@click.option("--max-tokens", type=click.IntRange(min=1), default=64, show_default=True,
              help="With --draft-model: tokens to generate.")
@click.option("--save-log", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="With --draft-model: also write the recorded vector here (specparity JSONL).")
@click.option("--stop", "stop_words", multiple=True, metavar="TEXT",
              help="With --draft-model: end the recording where mlx_lm.server ends a completion:"
                   " at EOS or at this stop word's tokens (repeatable; implies --stop-at-eos).")
@click.option("--stop-at-eos", is_flag=True,
              help="With --draft-model: end the recording at the tokenizer's EOS, as a server does.")
@click.option("--sequence", "sequence_path", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Replay a served request sequence through one prompt cache as mlx_lm.server's loop"
                   " did (a sequence file the served job writes), each answer against classic decode.")
@click.option("--prompt", "prompt_text", default=None, help="Prompt text.")
@click.option("--prompt-ids", multiple=True,
              help="Prompt as token ids, e.g. 1,2,3 (repeatable for an engine's own run: one request per"
                   " prompt, the engine loaded once).")
@click.option("--width", type=click.IntRange(min=1), default=None,
              help="Verify rows per round (when the log does not say).")
@click.option("--policy", type=click.Choice(POLICIES), default="wrong-id", show_default=True,
              help="What rejected rows carry: a fixed wrong id, or the correct token.")
@click.option("--wrong-id", type=click.IntRange(min=0), default=0, show_default=True,
              help="The wrong id rejected rows carry (the next id where it is the right token).")
@click.option("--prefill-emits/--no-prefill-emits", default=None,
              help="Whether the server emitted its first token from the prefill, before round 0"
                   " (default: from the log; mlxcel presets yes, mlx-lm no).")
@click.option("--state", is_flag=True,
              help="Also compare every layer's whole cache (its offset and every row it holds) with classic"
                   " decode's after every round: the first round whose state differs is a finding (exit 1)."
                   " An engine's own replay (--engine) always does.")
@click.option("--algebra-only", is_flag=True,
              help="Check a transcript's round algebra without a model.")
@click.option("--locate", type=click.IntRange(min=0), default=None, metavar="E",
              help="Print the round and row that emitted token index E, then exit.")
@engine_option
@cache_options
@processor_options
@json_option
@record_option
@force_option
def replay(model: str | None, trust_remote_code: bool, accepts_text: str | None,
           log_path: str | None, fmt: str, regex: str | None, request_index: int | None,
           draft_model: str | None, num_draft_tokens: int, max_tokens: int, save_log: str | None,
           stop_words: tuple[str, ...], stop_at_eos: bool, sequence_path: str | None,
           prompt_text: str | None, prompt_ids: tuple[str, ...], width: int | None, policy: str,
           wrong_id: int, prefill_emits: bool | None, state: bool, algebra_only: bool, locate: int | None,
           engine: EngineSpec, verify_mode: str | None, environment: str | None, as_json: bool, record_dir: str | None,
           quiet: bool, force: bool, **cache_kwargs: Any) -> int:
    """Replay logged accept lengths as verify blocks and rewinds; compare with classic decode.

    Prefill as classic decode does, then for each round run the target over
    the verify block [last emitted token, accepted proposals, rejected rows],
    rewind the rejected rows with mlx-lm's trim, and compare every emitted
    token and kept row's logit bytes with the classic greedy chain. A rewind
    that leaves a layer at the wrong offset is reported with its round.
    Caches that cannot be trimmed are replayed by snapshot-and-recompute.
    Transcripts (mlxcel-transcript) also get the offline round-algebra checks.
    Logits processors (--repetition-penalty, --presence-penalty,
    --frequency-penalty, --logit-bias) are applied to the classic reference
    and every verify row as classic decode applies them (history = prompt +
    emitted tokens), and handed to mlx-lm's speculative path by --draft-model;
    the tokens it emitted are compared with the reference even after a rewind
    finding. With --stop / --stop-at-eos the recording ends where
    mlx_lm.server ends the completion (EOS or a stop word), so its tokens are
    the served ones.

    --sequence FILE replays a served request sequence (repeats, shared
    prefixes, turns) through one prompt cache as mlx_lm.server's loop served
    it (its prompt cache, its sequential or batched path, the drafter) and
    compares every answer with classic decode on a fresh cache: exit 1 names
    the first request and token that differ and why (a cache entry holding
    fewer positions than counted, processors that saw part of the history);
    exit 3 when the served answers differ and the replay does not.

    \b
    Exit codes: 0 agrees, 1 disagreement or finding, 2 usage,
    3 inconclusive (empty vector), 4 load failure.

    With --engine dflash-mlx (mlx-dspark: its Target.verify / rollback and its
    speculative_generate; dspark-mlx: its host adapter and generate_eager),
    every round goes through the engine's own
    verify forward and rollback, and after every round the engine's whole
    state is compared with classic decode's. --draft-model (the DFlash
    drafter) runs the engine's own loop on the prompt instead: its emitted
    tokens, kept rows and state after every rollback are walked against
    classic decode (the first differing token, round, row and state), then
    its acceptance history is replayed round by round from the accept vector
    alone (target side vs drafting side).

    \b
    Examples:
        specparity replay --accepts 2,2,3,1,0,3 --width 4
        printf 'DFlash accept lengths accept_lens=[2, 2, 3, 1, 0, 3]\\n' > server.log
        specparity replay --log server.log --format mlxcel-accept-lens --width 4
        printf 'round 1 accepted=2\\nround 2 accepted=0\\n' > run.log
        specparity replay --log run.log --regex 'accepted=(\\d+)' --width 5
        specparity fixtures make ./fx                  # a pair to try: ./fx/target, ./fx/draft
        specparity replay --model ./fx/target --draft-model ./fx/draft --num-draft-tokens 3 --save-log run.jsonl
        specparity replay --model ./fx/target --log run.jsonl      # the rounds just recorded
        specparity replay --model ./fx/target --draft-model ./fx/draft --repetition-penalty 1.5   # exit 1
        specparity replay --engine dflash-mlx --max-tokens 64 --verify-mode dflash   # exit 1: the default DFlash pair
    """
    from specparity.probes.replay.modes import ReplayOptions
    from specparity.probes.replay.modes import replay as run_replay

    return run_replay(ReplayOptions(
        model=model, trust_remote_code=trust_remote_code, accepts_text=accepts_text, log_path=log_path, fmt=fmt,
        regex=regex, request_index=request_index, draft_model=draft_model, num_draft_tokens=num_draft_tokens,
        max_tokens=max_tokens, save_log=save_log, stop_words=stop_words, stop_at_eos=stop_at_eos,
        sequence_path=sequence_path, prompt_text=prompt_text, prompt_ids=prompt_ids, width=width, policy=policy,
        wrong_id=wrong_id, prefill_emits=prefill_emits, algebra_only=algebra_only, locate=locate, state=state,
        engine=engine,
        verify_mode=verify_mode, environment=environment, force=force, cache_kwargs=cache_kwargs),
        _Cli(record_dir, as_json, quiet))


class _Cli:
    """The command line's side of a replay (:class:`specparity.probes.replay.modes.Frontend`)."""

    def __init__(self, record_dir: str | None, as_json: bool, quiet: bool):
        self.record_dir, self.as_json, self.quiet = record_dir, as_json, quiet

    def open_run(self, title: str, identity_extra: dict[str, Any], slug: str) -> CommandRun:
        return CommandRun("replay", title, identity_extra, self.record_dir, self.as_json, self.quiet, slug=slug)

    def rerun(self, engine: EngineRef, environment: str | None, model: str | None, draft_model: str | None,
              trust_remote_code: bool, classic: bool) -> int | None:
        from specparity.commands._engine import rerun_elsewhere, rerun_in_environment

        if classic:
            return rerun_in_environment(engine, environment, model, draft_model, trust_remote_code)
        return rerun_elsewhere(engine, model, draft_model, trust_remote_code, environment)

    def load(self, model: str | None, trust_remote_code: bool, role: str = "target") -> Loaded:
        return resolve_model(model, trust_remote_code, role=role)

    def resolve_path(self, spec: str | None) -> Path:
        return resolve_path(spec)

    def load_adapter(self, engine: EngineRef, model: str | None, draft_model: str | None, need_draft: bool,
                     verify_mode: str | None, trust_remote_code: bool, prefill_step_size: int | None) -> Any:
        from specparity.commands._engine import load_adapter

        return load_adapter(engine, model, draft_model, need_draft=need_draft, verify_mode=verify_mode,
                            trust_remote_code=trust_remote_code, prefill_step_size=prefill_step_size)

    def engine_prompts(self, engine: Any, texts: list[str] | None, ids: list[list[int]] | None) -> list[list[int]]:
        from specparity.commands._engine import engine_prompts

        return engine_prompts(engine, texts, ids)

    def cache_options(self, kwargs: dict[str, Any]) -> CacheOptions:
        return cache_options_from(kwargs)

    def processor_options(self, kwargs: dict[str, Any]) -> ProcessorOptions:
        return processor_options_from(kwargs)

    def note(self, message: str) -> None:
        click.echo(message, err=True)

    def show_located(self, rows: list[dict[str, Any]], index: int) -> int:
        if self.as_json:
            emit_json(top_json(EXIT_OK, {"located": rows}))
        else:
            for o in rows:
                where = (f"round {o['round']}, row {o['row']}" if o["round"] >= 0
                         else "the prefill step (round 0's bonus)")
                click.echo(f"{o['source']}: emitted index {index} is {where}")
        return EXIT_OK
