"""``specparity replay``'s six modes, routed: what the command asks for, checked and run, as one report.

The command parses its options into :class:`ReplayOptions` and calls
:func:`replay`; this module decides the mode (an engine's rounds or its own
run, a served sequence, the round algebra alone, locating a token, a recorded
or logged vector against classic decode) and runs it. What belongs to the
command line (its record and output, a re-run of the command in another
environment, the notes on stderr while a model loads) comes in through a
:class:`Frontend`, so this layer imports nothing above it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from specparity.engines import DEFAULT as DEFAULT_ENGINE
from specparity.engines import EngineRef
from specparity.errors import Inconclusive, UsageError
from specparity.inputs import (
    check_accept_log,
    check_accept_widths,
    check_positions,
    check_token_ids,
    check_width,
    vocab_size,
)
from specparity.outputs import check_new_file

if TYPE_CHECKING:
    from specparity.checkpoint import Loaded
    from specparity.decode import CacheOptions
    from specparity.probes.replay.algebra import AlgebraFinding
    from specparity.probes.replay.logs import AcceptLog
    from specparity.processors import ProcessorOptions
    from specparity.progress import Observer

POLICIES = ("wrong-id", "correct-token")


class Run(Protocol):
    """One command run as the frontend opens it, entered around the work: a record sink, a progress
    observer, and its close with the report (which prints it and returns its exit code)."""

    @property
    def sink(self) -> Any: ...

    @property
    def observer(self) -> Observer: ...

    def __enter__(self) -> Run: ...

    def __exit__(self, *exc: Any) -> None: ...

    def finish(self, report: Any) -> int: ...


class Frontend(Protocol):
    """What the command line gives the replay: its record, its re-runs, its model loading and its notes."""

    def open_run(self, title: str, identity_extra: dict[str, Any], slug: str) -> Run:
        """The run's record and output (``kind`` replay), entered around the work."""
        ...

    def rerun(self, engine: EngineRef, environment: str | None, model: str | None, draft_model: str | None,
              trust_remote_code: bool, classic: bool) -> int | None:
        """None to run here; else the exit code of the command re-run in the engine's (or the named) environment."""
        ...

    def load(self, model: str | None, trust_remote_code: bool, role: str = "target") -> Loaded: ...

    def resolve_path(self, spec: str | None) -> Path: ...

    def load_adapter(self, engine: EngineRef, model: str | None, draft_model: str | None, need_draft: bool,
                     verify_mode: str | None, trust_remote_code: bool, prefill_step_size: int | None) -> Any: ...

    def engine_prompts(self, engine: Any, texts: list[str] | None, ids: list[list[int]] | None) -> list[list[int]]: ...

    def cache_options(self, kwargs: dict[str, Any]) -> CacheOptions:
        """The cache options out of the command's raw keyword arguments (taken out of them)."""
        ...

    def processor_options(self, kwargs: dict[str, Any]) -> ProcessorOptions:
        """The logits processors' options out of the command's raw keyword arguments (taken out of them)."""
        ...

    def note(self, message: str) -> None:
        """A progress line for stderr."""
        ...

    def show_located(self, rows: list[dict[str, Any]], index: int) -> int:
        """Print ``--locate``'s answer (one row per request); its exit code."""
        ...


@dataclass
class ReplayOptions:
    """``specparity replay``'s options as parsed (the command's ``--help`` documents each)."""

    model: str | None = None
    trust_remote_code: bool = False
    accepts_text: str | None = None
    log_path: str | None = None
    fmt: str = "auto"
    regex: str | None = None
    request_index: int | None = None
    draft_model: str | None = None
    num_draft_tokens: int = 3
    max_tokens: int = 64
    save_log: str | None = None
    stop_words: tuple[str, ...] = ()
    stop_at_eos: bool = False
    sequence_path: str | None = None
    prompt_text: str | None = None
    prompt_ids: tuple[str, ...] = ()
    width: int | None = None
    policy: str = "wrong-id"
    wrong_id: int = 0
    prefill_emits: bool | None = None
    algebra_only: bool = False
    locate: int | None = None
    state: bool = False
    engine: EngineRef = DEFAULT_ENGINE  # the registry's default, or the spec the command resolved
    verify_mode: str | None = None
    environment: str | None = None
    force: bool = False
    # the cache and processor options, raw: each path converts them when it needs them (the order of checks
    # is part of the command's behaviour)
    cache_kwargs: dict[str, Any] = field(default_factory=dict)


def replay(o: ReplayOptions, front: Frontend) -> int:
    """Route ``o`` to its mode and run it; the exit code of its report."""
    from specparity.engines import get
    from specparity.probes.replay import algebra
    from specparity.probes.replay.core import REPLAY_FEATURES

    # the replay core with rewind offsets, when the engine's adapter declares what it needs
    classic = set(REPLAY_FEATURES) <= get(o.engine).adapter_features
    if len(o.prompt_ids) > 1 and (classic or o.accepts_text is not None or o.log_path is not None):
        raise UsageError("give one --prompt-ids: several are for an engine's own run"
                         " (--engine without --accepts or --log)")
    if not classic:
        if o.sequence_path is not None:
            raise UsageError(f"--engine {o.engine}: --sequence replays mlx_lm.server's loop (the default engine)")
        return _engine_replay(o, front)
    one_prompt_ids = o.prompt_ids[0] if o.prompt_ids else None

    sources = [s for s in (o.accepts_text, o.log_path, o.draft_model, o.sequence_path) if s is not None]
    if len(sources) != 1:
        raise UsageError("give exactly one of --accepts, --log, --draft-model or --sequence")
    code = front.rerun(o.engine, o.environment, o.model, o.draft_model, o.trust_remote_code, classic=True)
    if code is not None:
        return code
    if o.state and (o.sequence_path is not None or o.algebra_only or o.locate is not None):
        what = "--sequence" if o.sequence_path is not None else "--algebra-only" if o.algebra_only else "--locate"
        raise UsageError(f"--state compares the cache after each replayed round; {what} replays no rounds of its own")
    if o.sequence_path is not None:
        return _sequence(o.sequence_path, o.model, o.trust_remote_code, front)
    if (o.stop_words or o.stop_at_eos) and o.draft_model is None:
        raise UsageError("--stop and --stop-at-eos end what --draft-model records")
    if (o.fmt != "auto" or o.regex) and o.log_path is None:
        raise UsageError("--format and --regex read a --log FILE")
    if o.request_index is not None and o.log_path is None:
        raise UsageError("--request picks a request of a --log FILE")
    if o.save_log and o.draft_model is None:
        raise UsageError("--save-log writes what --draft-model records")
    check_new_file(o.save_log, "--save-log", o.force)
    if o.width is not None:
        check_width(o.width)
    if o.draft_model is not None:
        check_width(o.num_draft_tokens + 1, "--num-draft-tokens + 1 (verify rows)")
        check_positions(o.max_tokens, "--max-tokens")
    opts = front.cache_options(o.cache_kwargs)
    procs = front.processor_options(o.cache_kwargs)
    cli_ids = _prompt_ids(one_prompt_ids)

    requests = accept_logs(o.accepts_text, o.log_path, o.fmt, o.regex, o.request_index)
    if o.prefill_emits is not None:
        for req in requests:
            req.prefill_emits = o.prefill_emits
    findings = []
    for i, req in enumerate(requests):
        if req.rounds:
            findings.extend(algebra.check_rounds(req.rounds, request=i))
    if o.algebra_only:
        return _algebra_only(requests, findings, front)
    if o.locate is not None:
        return front.show_located(locate_rows(requests, o.locate), o.locate)

    loaded = front.load(o.model, o.trust_remote_code)
    vocab = vocab_size(loaded)
    check_token_ids([o.wrong_id], vocab, "--wrong-id")
    if cli_ids is not None:
        check_token_ids(cli_ids, vocab, f"--prompt-ids {one_prompt_ids!r}")
    for req in requests:
        check_accept_log(req, vocab)
    if o.draft_model is not None:
        requests = [_record(loaded, o, cli_ids, procs, opts, front,
                            list(o.stop_words) if (o.stop_words or o.stop_at_eos) else None)]
    return _replay_all(_adapter(o, loaded, opts), requests, findings, cli_ids, o.prompt_text, o.width,
                       o.policy, o.wrong_id, procs, front, o.state)


def _adapter(o: ReplayOptions, loaded: Loaded, opts: CacheOptions) -> Any:
    """The engine's adapter on the target already loaded, with the cache options; it must support what the
    replay core needs (its registry entry declared so before anything loaded)."""
    from specparity.engines import LoadRequest, get
    from specparity.probes.replay.core import REPLAY_FEATURES

    eng = get(o.engine).load(LoadRequest(Path(loaded.path), trust_remote_code=o.trust_remote_code, cache=opts,
                                         loaded=loaded))
    missing = [f for f in REPLAY_FEATURES if not eng.supports(f)]
    if missing:
        raise UsageError(f"--engine {o.engine}: its registry entry declares {', '.join(missing)} but its"
                         " adapter does not support them")
    return eng


def accept_logs(accepts_text: str | None, log_path: str | None, fmt: str, regex: str | None,
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


def locate_rows(requests: list[AcceptLog], index: int) -> list[dict[str, Any]]:
    """``--locate E``: per request, the round and row that emitted token index E (round -1: the prefill)."""
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
    return out


def _prompt_ids(value: str | None) -> list[int] | None:
    if value is None:
        return None
    from specparity.prompts import parse_prompt_ids

    return parse_prompt_ids([value])[0]


def _record(loaded: Loaded, o: ReplayOptions, cli_ids: list[int] | None, procs: ProcessorOptions,
            opts: CacheOptions, front: Frontend, stop_words: list[str] | None = None) -> AcceptLog:
    from specparity.probes.replay.logs import AcceptLog, write_requests
    from specparity.probes.replay.recorder import record_speculative
    from specparity.probes.replay.run import prompt_for

    assert o.draft_model is not None
    draft = front.load(o.draft_model, o.trust_remote_code, role="draft")
    prompt = prompt_for(AcceptLog([]), loaded.tokenizer, cli_ids, o.prompt_text)
    check_token_ids(prompt, vocab_size(draft), "the prompt (--draft-model's vocabulary)")
    front.note(f"recording: mlx-lm speculative decoding, {o.num_draft_tokens} proposals per round,"
               f" {o.max_tokens} tokens")
    stops = None
    if stop_words is not None:
        from specparity.mlx_compat import stop_sequences

        stops = stop_sequences(loaded.tokenizer, stop_words)
    req = record_speculative(loaded.model, draft.model, prompt, o.num_draft_tokens, o.max_tokens, opts,
                             processors=procs, stop_sequences=stops)
    req.meta["model"] = loaded.fingerprint.short
    req.meta["draft_model"] = draft.fingerprint.short
    if o.save_log:
        path = write_requests(o.save_log, [req], overwrite=o.force)
        front.note(f"accept vector written: {path}")
    return req


def _sequence(path: str, model: str | None, trust_remote_code: bool, front: Frontend) -> int:
    from specparity.probes.replay.sequence import read_sequence, replay_sequence
    from specparity.reference import ClassicReference

    header, entries = read_sequence(path, model)  # checked whole before anything loads
    if model is not None:
        header.model = model
    if header.trust_remote_code and not trust_remote_code:
        raise UsageError(f"--sequence {path}: the server ran {header.model} with --trust-remote-code;"
                         " pass --trust-remote-code to run its code here")
    front.resolve_path(header.model)
    reference = ClassicReference(header.model, trust_remote_code=trust_remote_code, settings=header.settings())
    draft = None
    if header.draft_model is not None:
        draft = front.load(header.draft_model, trust_remote_code, role="draft").model
    fp = reference.loaded.fingerprint
    with front.open_run(f"replay: sequence on {fp.model_type} {fp.short}",
                        {"model": fp.to_dict(), "sequence": str(path)},
                        slug=f"replay-sequence-{fp.model_type}") as run:
        report = replay_sequence(header, entries, reference, draft, observer=run.observer)
        return run.finish(report)


def _algebra_only(requests: list[AcceptLog], findings: list[AlgebraFinding], front: Frontend) -> int:
    from specparity.probes.replay.run import AlgebraRun

    rounds = sum(len(r.rounds or []) for r in requests)
    if rounds == 0:
        raise UsageError("--algebra-only needs a transcript (--format mlxcel-transcript)")
    with front.open_run("replay: round algebra", {}, slug="replay-algebra") as run:
        for f in findings:
            run.observer.result("algebra", f.to_dict())
        return run.finish(AlgebraRun(len(requests), rounds, findings))


def _replay_all(engine: Any, requests: list[AcceptLog], findings: list[AlgebraFinding],
                cli_ids: list[int] | None, prompt_text: str | None, width: int | None,
                policy: str, wrong_id: int, procs: ProcessorOptions, front: Frontend, state: bool = False) -> int:
    from specparity.probes.replay.run import run_replays

    loaded, opts = engine.checkpoint(), engine.cache_options()
    fp = loaded.fingerprint
    with front.open_run(f"replay: {fp.model_type} {fp.short}",
                        {"model": fp.to_dict(), "cache": opts.to_dict(), "processors": procs.to_dict()},
                        slug=f"replay-{fp.model_type}") as run:
        if any(r.source == "mlx_lm.generate.speculative_generate_step" for r in requests):
            from specparity.probes.replay.logs import request_object

            run.sink.write_bytes("accepts.jsonl", "".join(
                json.dumps(request_object(r)) + "\n" for r in requests).encode())
        result = run_replays(engine, requests, findings, cli_ids, prompt_text, width, policy,
                             wrong_id, observer=run.observer, processors=procs, state=state)
        return run.finish(result)


def _engine_replay(o: ReplayOptions, front: Frontend) -> int:
    """``replay --engine``: rounds through the engine's verify and rollback, or the engine's own run."""
    from specparity.probes.replay.core import round_widths
    from specparity.probes.replay.engine import EngineReplayRun, check_engine_run, replay_engine
    from specparity.probes.replay.run import widths_for

    engine = o.engine
    if o.algebra_only or o.locate is not None or o.save_log:
        raise UsageError(f"--engine {engine}: --algebra-only, --locate and --save-log are options of the replay"
                         " with rewind offsets (an engine whose registry entry declares anchor-prefill,"
                         " layer-offsets and rewind-modes, as mlx-lm's does)")
    if o.policy != "wrong-id":
        raise UsageError(f"--engine {engine}: rejected rows carry --wrong-id (--policy wrong-id)")
    sources = [s for s in (o.accepts_text, o.log_path, o.draft_model) if s is not None]
    if len(sources) > 1 and not (o.draft_model is not None and len(sources) == 2):
        raise UsageError("give one of --accepts or --log, or --draft-model alone (the engine's own run)")
    own_run = o.accepts_text is None and o.log_path is None
    requests = accept_logs(o.accepts_text, o.log_path, o.fmt, o.regex, o.request_index)
    check_positions(o.max_tokens, "--max-tokens")
    code = front.rerun(engine, o.environment, o.model, o.draft_model, o.trust_remote_code, classic=False)
    if code is not None:
        return code
    eng = front.load_adapter(engine, o.model, o.draft_model, need_draft=own_run, verify_mode=o.verify_mode,
                             trust_remote_code=o.trust_remote_code,
                             prefill_step_size=o.cache_kwargs["prefill_step_size"])
    from specparity.prompts import parse_prompt_ids

    id_lists = parse_prompt_ids(list(o.prompt_ids))
    cli_ids = id_lists[0] if id_lists else None
    vocab = vocab_size(eng.classic_model())
    check_token_ids([o.wrong_id], vocab, "--wrong-id")
    where = Path(eng.info.target)
    texts = [o.prompt_text] if o.prompt_text else None
    with front.open_run(f"replay --engine {engine}: {where.parent.name}/{where.name}",
                        {"engine": eng.info.to_dict()}, slug=f"replay-{engine}") as run:
        reports = []
        if own_run:
            # every --prompt-ids, one request each; else --prompt, or the first built-in prompt
            prompts = front.engine_prompts(eng, texts, id_lists or None)
            for prompt in prompts if id_lists else prompts[:1]:
                front.note(f"running {engine}'s own loop: {o.max_tokens} tokens from a {len(prompt)}-token prompt")
                reports.append(check_engine_run(eng, eng.generate(prompt, o.max_tokens), wrong_id=o.wrong_id,
                                                observer=run.observer, max_tokens=o.max_tokens))
        else:
            for req in requests:
                check_accept_log(req, vocab)
                w, given = widths_for(req, o.width)
                ws = round_widths(req.accepts, w, given)
                prompt = req.prompt_ids if req.prompt_ids and cli_ids is None and o.prompt_text is None else \
                    front.engine_prompts(eng, texts, [cli_ids] if cli_ids else None)[0]
                reports.append(replay_engine(eng, prompt, req.accepts, ws, o.wrong_id, observer=run.observer))
        for r in reports:
            run.observer.result("requests", r.to_dict())
        return run.finish(EngineReplayRun(eng.info.to_dict(), reports))
