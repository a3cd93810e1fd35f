"""``specparity replay``: a served run's accept lengths, replayed in process."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

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
)
from specparity.commands._engine import engine_option
from specparity.errors import EXIT_OK, Inconclusive, UsageError
from specparity.inputs import (
    check_accept_log,
    check_accept_widths,
    check_positions,
    check_token_ids,
    check_width,
    vocab_size,
)
from specparity.outputs import check_new_file, force_option
from specparity.probes.replay.logs import FORMATS

if TYPE_CHECKING:
    from specparity.checkpoint import Loaded
    from specparity.decode import CacheOptions
    from specparity.probes.replay.algebra import AlgebraFinding
    from specparity.probes.replay.logs import AcceptLog
    from specparity.processors import ProcessorOptions

POLICIES = ("wrong-id", "correct-token")


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
           wrong_id: int, prefill_emits: bool | None, algebra_only: bool, locate: int | None,
           engine: str, verify_mode: str | None, environment: str | None, as_json: bool, record_dir: str | None,
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
        specparity replay --log server.log --format mlxcel-accept-lens --width 4
        specparity replay --log server.log --format mlxcel-transcript --algebra-only
        specparity replay --log run.log --regex 'accepted=(\\d+)' --width 5
        specparity replay --draft-model ./draft --num-draft-tokens 3 --save-log run.jsonl
        specparity replay --draft-model ./draft --repetition-penalty 1.3
        specparity replay --sequence served-w4-p0.sequence.jsonl
        specparity replay --engine dflash-mlx --model ./fx/target --draft-model ./fx/draft --max-tokens 64
    """
    from specparity.probes.replay import algebra

    from specparity.engines import get

    classic = get(engine).classic_paths
    if len(prompt_ids) > 1 and (classic or accepts_text is not None or log_path is not None):
        raise UsageError("give one --prompt-ids: several are for an engine's own run"
                         " (--engine without --accepts or --log)")
    if not classic:
        if sequence_path is not None:
            raise UsageError(f"--engine {engine}: --sequence replays mlx_lm.server's loop (the default engine)")
        return _engine_replay(engine, model, trust_remote_code, draft_model, accepts_text, log_path, fmt, regex,
                              request_index,
                              max_tokens, prompt_text, prompt_ids, width, policy, wrong_id, verify_mode,
                              algebra_only, locate, save_log, environment, as_json, record_dir, quiet,
                              cache_kwargs)
    one_prompt_ids = prompt_ids[0] if prompt_ids else None

    sources = [s for s in (accepts_text, log_path, draft_model, sequence_path) if s is not None]
    if len(sources) != 1:
        raise UsageError("give exactly one of --accepts, --log, --draft-model or --sequence")
    from specparity.commands._engine import rerun_in_environment

    code = rerun_in_environment(engine, environment, model, draft_model, trust_remote_code)
    if code is not None:
        return code
    if sequence_path is not None:
        return _sequence(sequence_path, model, trust_remote_code, as_json, record_dir, quiet)
    if (stop_words or stop_at_eos) and draft_model is None:
        raise UsageError("--stop and --stop-at-eos end what --draft-model records")
    if (fmt != "auto" or regex) and log_path is None:
        raise UsageError("--format and --regex read a --log FILE")
    if request_index is not None and log_path is None:
        raise UsageError("--request picks a request of a --log FILE")
    if save_log and draft_model is None:
        raise UsageError("--save-log writes what --draft-model records")
    check_new_file(save_log, "--save-log", force)
    if width is not None:
        check_width(width)
    if draft_model is not None:
        check_width(num_draft_tokens + 1, "--num-draft-tokens + 1 (verify rows)")
        check_positions(max_tokens, "--max-tokens")
    opts = cache_options_from(cache_kwargs)
    procs = processor_options_from(cache_kwargs)
    cli_ids = _prompt_ids(one_prompt_ids)

    requests = _accept_logs(accepts_text, log_path, fmt, regex, request_index)
    if prefill_emits is not None:
        for req in requests:
            req.prefill_emits = prefill_emits
    findings = []
    for i, req in enumerate(requests):
        if req.rounds:
            findings.extend(algebra.check_rounds(req.rounds, request=i))
    if algebra_only:
        return _algebra_only(requests, findings, as_json, record_dir, quiet)
    if locate is not None:
        return _locate(requests, locate, as_json)

    loaded = resolve_model(model, trust_remote_code)
    vocab = vocab_size(loaded)
    check_token_ids([wrong_id], vocab, "--wrong-id")
    if cli_ids is not None:
        check_token_ids(cli_ids, vocab, f"--prompt-ids {one_prompt_ids!r}")
    for req in requests:
        check_accept_log(req, vocab)
    if draft_model is not None:
        requests = [_record(loaded, draft_model, trust_remote_code, cli_ids, prompt_text, procs,
                            num_draft_tokens, max_tokens, opts, save_log, force,
                            list(stop_words) if (stop_words or stop_at_eos) else None)]
    return _replay_all(loaded, requests, findings, cli_ids, prompt_text, width, policy,
                       wrong_id, opts, procs, as_json, record_dir, quiet)


def _accept_logs(accepts_text: str | None, log_path: str | None, fmt: str, regex: str | None,
                 request_index: int | None) -> list[Any]:
    """The accept vectors to replay: ``--accepts``, or the requests of ``--log`` (one with ``--request``),
    each checked against its widths; none from neither."""
    from specparity.probes.replay import logs

    requests: list[logs.AcceptLog] = []
    if accepts_text is not None:
        requests = [logs.AcceptLog(logs.parse_accept_list(accepts_text), source="--accepts")]
    elif log_path is not None:
        requests = logs.read_log(log_path, fmt, regex)
        if not requests:
            raise Inconclusive(f"--log {log_path}: no accept vector found")
        if request_index is not None:
            if request_index >= len(requests):
                raise UsageError(f"--request {request_index}: {log_path} holds {len(requests)} requests")
            requests = [requests[request_index]]
    for req in requests:
        check_accept_widths(req)
    return requests


def _prompt_ids(value: str | None) -> list[int] | None:
    if value is None:
        return None
    from specparity.prompts import parse_prompt_ids

    return parse_prompt_ids([value])[0]


def _record(loaded: Loaded, draft_model: str, trust_remote_code: bool, cli_ids: list[int] | None,
            prompt_text: str | None, procs: ProcessorOptions, num_draft_tokens: int,
            max_tokens: int, opts: CacheOptions, save_log: str | None,
            force: bool = False, stop_words: list[str] | None = None) -> AcceptLog:
    from specparity.probes.replay.logs import AcceptLog, write_requests
    from specparity.probes.replay.recorder import record_speculative
    from specparity.probes.replay.run import prompt_for

    draft = resolve_model(draft_model, trust_remote_code, role="draft")
    prompt = prompt_for(AcceptLog([]), loaded.tokenizer, cli_ids, prompt_text)
    check_token_ids(prompt, vocab_size(draft), "the prompt (--draft-model's vocabulary)")
    click.echo(f"recording: mlx-lm speculative decoding, {num_draft_tokens} proposals per round,"
               f" {max_tokens} tokens", err=True)
    stops = None
    if stop_words is not None:
        from mlx_lm.generate import make_stop_sequences

        stops = make_stop_sequences(loaded.tokenizer, stop_words)
    req = record_speculative(loaded.model, draft.model, prompt, num_draft_tokens, max_tokens, opts,
                             processors=procs, stop_sequences=stops)
    req.meta["model"] = loaded.fingerprint.short
    req.meta["draft_model"] = draft.fingerprint.short
    if save_log:
        path = write_requests(save_log, [req], overwrite=force)
        click.echo(f"accept vector written: {path}", err=True)
    return req


def _sequence(path: str, model: str | None, trust_remote_code: bool, as_json: bool,
              record_dir: str | None, quiet: bool) -> int:
    from specparity.reference import ClassicReference
    from specparity.probes.replay.sequence import read_sequence, replay_sequence

    header, entries = read_sequence(path, model)  # checked whole before anything loads
    if model is not None:
        header.model = model
    if header.trust_remote_code and not trust_remote_code:
        raise UsageError(f"--sequence {path}: the server ran {header.model} with --trust-remote-code;"
                         " pass --trust-remote-code to run its code here")
    resolve_path(header.model)
    reference = ClassicReference(header.model, trust_remote_code=trust_remote_code, settings=header.settings())
    draft = None
    if header.draft_model is not None:
        draft = resolve_model(header.draft_model, trust_remote_code, role="draft").model
    fp = reference.loaded.fingerprint
    run = CommandRun("replay", f"replay: sequence on {fp.model_type} {fp.short}",
                     {"model": fp.to_dict(), "sequence": str(path)}, record_dir, as_json, quiet,
                     slug=f"replay-sequence-{fp.model_type}")
    with run:
        report = replay_sequence(header, entries, reference, draft, observer=run.observer)
        return run.finish(report)


def _algebra_only(requests, findings, as_json, record_dir, quiet) -> int:
    from specparity.probes.replay.run import AlgebraRun

    rounds = sum(len(r.rounds or []) for r in requests)
    if rounds == 0:
        raise UsageError("--algebra-only needs a transcript (--format mlxcel-transcript)")
    run = CommandRun("replay", "replay: round algebra", {}, record_dir, as_json, quiet,
                     slug="replay-algebra")
    with run:
        for f in findings:
            run.observer.result("algebra", f.to_dict())
        return run.finish(AlgebraRun(len(requests), rounds, findings))


def _locate(requests: list[AcceptLog], index: int, as_json: bool) -> int:
    from specparity.probes.replay.algebra import emitted_counts, locate

    out: list[dict[str, Any]] = []
    for i, req in enumerate(requests):
        counts = ([len(r.new_tokens) for r in req.rounds] if req.rounds
                  else emitted_counts(req.accepts))
        if req.prefill_emits and index == 0:
            r, k = -1, 0
        else:
            r, k = locate(counts, index - 1 if req.prefill_emits else index)
        out.append({"request": i, "source": req.source, "emitted_index": index, "round": r,
                    "row": k})
    if as_json:
        emit_json(out)
    else:
        for o in out:
            where = (f"round {o['round']}, row {o['row']}" if o["round"] >= 0
                     else "the prefill step (round 0's bonus)")
            click.echo(f"{o['source']}: emitted index {index} is {where}")
    return EXIT_OK


def _replay_all(loaded: Loaded, requests: list[AcceptLog], findings: list[AlgebraFinding],
                cli_ids: list[int] | None, prompt_text: str | None, width: int | None,
                policy: str, wrong_id: int, opts: CacheOptions, procs: ProcessorOptions,
                as_json: bool, record_dir: str | None, quiet: bool) -> int:
    from specparity.probes.replay.run import run_replays

    fp = loaded.fingerprint
    run = CommandRun("replay", f"replay: {fp.model_type} {fp.short}",
                     {"model": fp.to_dict(), "cache": opts.to_dict(), "processors": procs.to_dict()},
                     record_dir, as_json, quiet, slug=f"replay-{fp.model_type}")
    with run:
        if any(r.source == "mlx_lm.generate.speculative_generate_step" for r in requests):
            from specparity.probes.replay.logs import request_object

            run.sink.write_bytes("accepts.jsonl", "".join(
                json.dumps(request_object(r)) + "\n" for r in requests).encode())
        result = run_replays(loaded, requests, findings, opts, cli_ids, prompt_text, width, policy,
                             wrong_id, observer=run.observer, processors=procs)
        return run.finish(result)


def _engine_replay(engine: str, model: str | None, trust_remote_code: bool, draft_model: str | None,
                   accepts_text: str | None,
                   log_path: str | None, fmt: str, regex: str | None, request_index: int | None, max_tokens: int,
                   prompt_text: str | None, prompt_ids: tuple[str, ...], width: int | None, policy: str, wrong_id: int,
                   verify_mode: str | None, algebra_only: bool, locate: int | None, save_log: str | None,
                   environment: str | None, as_json: bool, record_dir: str | None, quiet: bool,
                   cache_kwargs: dict[str, Any]) -> int:
    """``replay --engine``: rounds through the engine's verify and rollback, or the engine's own run."""
    from pathlib import Path

    from specparity.commands._engine import engine_prompts, load_adapter, rerun_elsewhere
    from specparity.probes.replay.core import round_widths
    from specparity.probes.replay.engine import EngineReplayRun, check_engine_run, replay_engine
    from specparity.probes.replay.run import widths_for

    if algebra_only or locate is not None or save_log:
        raise UsageError(f"--engine {engine}: --algebra-only, --locate and --save-log are mlx-lm replay options")
    if policy != "wrong-id":
        raise UsageError(f"--engine {engine}: rejected rows carry --wrong-id (--policy wrong-id)")
    sources = [s for s in (accepts_text, log_path, draft_model) if s is not None]
    if len(sources) > 1 and not (draft_model is not None and len(sources) == 2):
        raise UsageError("give one of --accepts or --log, or --draft-model alone (the engine's own run)")
    own_run = accepts_text is None and log_path is None
    requests = _accept_logs(accepts_text, log_path, fmt, regex, request_index)
    check_positions(max_tokens, "--max-tokens")
    code = rerun_elsewhere(engine, model, draft_model, trust_remote_code, environment)
    if code is not None:
        return code
    eng = load_adapter(engine, model, draft_model, need_draft=own_run, verify_mode=verify_mode,
                       trust_remote_code=trust_remote_code, prefill_step_size=cache_kwargs["prefill_step_size"])
    from specparity.prompts import parse_prompt_ids

    id_lists = parse_prompt_ids(list(prompt_ids))
    cli_ids = id_lists[0] if id_lists else None
    vocab = vocab_size(eng.classic_model())
    check_token_ids([wrong_id], vocab, "--wrong-id")
    where = Path(eng.info.target)
    run = CommandRun("replay", f"replay --engine {engine}: {where.parent.name}/{where.name}",
                     {"engine": eng.info.to_dict()}, record_dir, as_json, quiet, slug=f"replay-{engine}")
    with run:
        reports = []
        if own_run:
            # every --prompt-ids, one request each; else --prompt, or the first built-in prompt
            prompts = engine_prompts(eng, [prompt_text] if prompt_text else None, id_lists or None)
            for prompt in prompts if id_lists else prompts[:1]:
                click.echo(f"running {engine}'s own loop: {max_tokens} tokens from a {len(prompt)}-token prompt",
                           err=True)
                reports.append(check_engine_run(eng, eng.generate(prompt, max_tokens), wrong_id=wrong_id,
                                                observer=run.observer))
        else:
            for req in requests:
                check_accept_log(req, vocab)
                w, given = widths_for(req, width)
                ws = round_widths(req.accepts, w, given)
                prompt = req.prompt_ids if req.prompt_ids and cli_ids is None and prompt_text is None else \
                    engine_prompts(eng, [prompt_text] if prompt_text else None, [cli_ids] if cli_ids else None)[0]
                reports.append(replay_engine(eng, prompt, req.accepts, ws, wrong_id, observer=run.observer))
        for r in reports:
            run.observer.result("requests", r.to_dict())
        return run.finish(EngineReplayRun(eng.info.to_dict(), reports))
