"""Sequence replay: a served request sequence replayed through one prompt cache, as the server's loop ran it.

A finding that depends on serving-loop state (a repeated request answered from
the prompt cache, a second turn extending the first) is not reproduced by
replaying one request on a fresh cache. :func:`replay_sequence` rebuilds that
state in process: every request of the sequence goes, in order, through
:class:`specparity.mlx_server.ServingLoop` (the one rebuild of the server, the
classic reference's too), which runs ``mlx_lm.server`` 0.32's own generation loop
without HTTP, with mlx-lm's own parts:

- one ``LRUPromptCache`` for the whole sequence: ``fetch_nearest_cache`` (an
  exact, shorter or longer entry, trimmed to the common prefix), then
  ``insert_cache`` of what the request left, as the server does;
- the **sequential path** (a drafter, a ``seed`` in the request, or
  ``--kv-bits``): ``stream_generate`` over the uncached suffix only, on the
  fetched cache, with the drafter where there is one; its logits processors see
  what that path feeds them (the suffix and the emitted tokens; with a drafter
  only the last prompt token and the emitted tokens); the key stored is the
  prompt plus every emitted token;
- the **batched path** (otherwise): mlx-lm's ``BatchGenerator`` with the
  server's segments (what the cache already holds is dropped from them), the
  cached tokens handed over as the processors' history, the caches stored at
  segment ends and at the end, as the server does.

Each request's in-process answer is compared with classic decode on a fresh
cache (:class:`specparity.reference.ClassicReference`) and with the
answer the server gave (from the sequence file), through the one completion
comparison (:func:`specparity.completions.first_difference`). The report names
the first request and token where the replay leaves classic decode, says
whether that is where the served answer left it (the finding reproduced), and
why, where the loop's own record shows it: a cache entry that held fewer
positions than the server counted as cached, processors that saw less than the
whole history.

The sequence file (JSONL, written by :func:`write_sequence`, read by
:func:`read_sequence`)::

    {"format": "specparity.sequence/1",          # first line: the header
     "engine": "mlx-lm", "engine_version": "0.32.2",
     "model": "/path/target", "draft_model": "/path/draft" | null,
     "trust_remote_code": false,
     "server": {...ServerSettings fields...},    # the flags the server ran with
     "arm": "w4", "finding": {"request": "p0-again", "token_index": 0} | null,
     "concurrent": false}                         # requests were sent concurrently
    {"id": "p0", "kind": "fresh", "endpoint": "completions",
     "body": {...the JSON body sent, num_draft_tokens included...},
     "prompt_ids": null | [...],                  # decode from these ids (no tokenize step)
     "served": {"token_ids": [...] | null, "text": "...", "finish_reason": "length",
                "usage": {"prompt_tokens": 17, "completion_tokens": 12,
                          "prompt_tokens_details": {"cached_tokens": 16}}}}
    ... one line per request, in the order the server received them

``specparity replay --sequence FILE`` replays it; exit 1 when a request's
in-process answer leaves classic decode (the first request and token are
printed), 3 when the served answers left classic decode but the replay does
not (the finding is not reproduced in process: the report says why), 0 when
everything equals classic decode.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specparity.completions import CompletionDifference, Side, first_difference
from specparity.errors import InputError, UsageError
from specparity.mlx_server import PATH_SEQUENTIAL, RequestParams, Served, ServerSettings, ServingLoop
from specparity.reference import ClassicReference
from specparity.progress import NULL, Observer
from specparity.store import write_new
from specparity.verdicts import ReportMixin, Verdict

log = logging.getLogger(__name__)

SEQUENCE_FORMAT = "specparity.sequence/1"
ENGINE = "mlx-lm"
# the serving loop ServingLoop rebuilds (a profile's ``loop`` key names the loop its server runs)
LOOP = "mlx_lm.server"


@dataclass
class SequenceHeader:
    """What the served arm ran: the checkpoints, the server's settings, the finding to reproduce.

    model / draft_model: checkpoint directories the server loaded (the originals, not
      witness wrappers). trust_remote_code: the consent the server had.
    server: ``ServerSettings`` fields. engine / engine_version: whose server it was.
    arm: the served arm's name. finding: ``{"request": id, "token_index": i}`` where the
      served answer left classic decode (None: none). concurrent: the requests were
      sent concurrently (a batch the replay cannot rebuild request by request).
    loop: the serving loop the server ran (its profile's ``loop``; None: read from the engine,
      ``mlx_lm.server`` for mlx-lm, as files written before the key have it).
    """

    model: str
    draft_model: str | None = None
    trust_remote_code: bool = False
    server: dict[str, Any] = field(default_factory=dict)
    engine: str = ENGINE
    engine_version: str | None = None
    arm: str | None = None
    finding: dict[str, Any] | None = None
    concurrent: bool = False
    loop: str | None = None

    @property
    def serving_loop(self) -> str:
        return self.loop or (LOOP if self.engine == ENGINE else self.engine)

    def settings(self) -> ServerSettings:
        return ServerSettings.from_dict(self.server)

    def to_dict(self) -> dict[str, Any]:
        return {"format": SEQUENCE_FORMAT, **asdict(self)}


@dataclass
class SequenceEntry:
    """One request of the sequence, and what the server answered.

    id / kind: its name and what it exercises (fresh, repeat, shared-prefix...).
    endpoint / body: as sent. prompt_ids: decode from these ids instead of tokenizing the body.
    served: ``{"token_ids", "text", "finish_reason", "usage"}`` of the server's answer
      (token_ids None: the server gave none, e.g. streamed).
    """

    id: str
    endpoint: str
    body: dict[str, Any]
    kind: str = "fresh"
    prompt_ids: list[int] | None = None
    served: dict[str, Any] | None = None

    def served_side(self) -> Side | None:
        if not self.served:
            return None
        ids = self.served.get("token_ids")
        return Side("served", str(self.served.get("text") or ""), list(ids) if ids is not None else None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def write_sequence(path: str | os.PathLike[str], header: SequenceHeader, entries: list[SequenceEntry],
                   overwrite: bool = False) -> Path:
    """Write the sequence file (an existing file only with ``overwrite``)."""
    p = Path(path)
    text = json.dumps(header.to_dict()) + "\n" + "".join(json.dumps(e.to_dict()) + "\n" for e in entries)
    return write_new(p, text, force=overwrite, flag="sequence file")


def _server_schema(vocab: int | None = None) -> Any:
    """The header's ``server``: ServerSettings' fields, each in the range mlx-lm's loop takes
    (``top_k``, the default of a request without one, below ``vocab``)."""
    from specparity.schema import Bool, Fields, Int, Json, MapOf, Nullable, Number, Str

    return Fields({
        "prefill_step_size": Int(1), "kv_bits": Nullable(Int(1, 8)), "kv_group_size": Int(1),
        "quantized_kv_start": Int(0), "max_tokens": Int(1, limit="max_positions"),
        "temp": Number(ge=0), "top_p": Number(ge=0, le=1),
        "top_k": Int(0, None if vocab is None else vocab - 1), "min_p": Number(ge=0, le=1),
        "chat_template": Str(), "use_default_chat_template": Bool(),
        "chat_template_args": MapOf(Json(limit="max_items"), key=Str()),
        "num_draft_tokens": Int(0, limit="max_width"), "prompt_cache_size": Int(0),
        "prompt_cache_bytes": Nullable(Int(0)), "decode_concurrency": Int(1), "prompt_concurrency": Int(1),
    }, open=True, what="a mapping of server settings")


def _header_schema(vocab: int | None = None) -> Any:
    from specparity.schema import Bool, Fields, Int, Nullable, Str

    name = Str("a checkpoint path or hub id (a string)", nonempty=True)
    return Fields({
        "format": Str(), "model": name, "draft_model": Nullable(name), "trust_remote_code": Bool(),
        "server": _server_schema(vocab), "engine": Str("an engine name", nonempty=True),
        "engine_version": Nullable(Str()), "arm": Nullable(Str()),
        "finding": Nullable(Fields({"request": Str(), "token_index": Nullable(Int(0))}, open=True)),
        "concurrent": Bool(), "loop": Nullable(Str("a serving loop's name", nonempty=True)),
    }, required=("model",), open=True, what="a JSON object (the header)")


def _entry_schema(vocab: int | None, prompt_ids: bool, endpoint: Any) -> Any:
    """A request line; without ``prompt_ids`` the body holds what the endpoint tokenizes."""
    from specparity.schema import Enum, Fields, Int, Json, ListOf, MapOf, Nullable, Str

    token = Int(0, None if vocab is None else vocab - 1)
    body: dict[str, Any] = {}
    if not prompt_ids and endpoint == "completions":
        body["prompt"] = Str("a string (the prompt)")
    if not prompt_ids and endpoint == "chat":
        body["messages"] = ListOf(Fields({"role": Str(), "content": Json(limit="max_items")},
                                         required=("role",), open=True, what="a message (a mapping)"),
                                  min_len=1, limit="max_items")
    required = tuple(body)
    return Fields({
        "id": Str("a request name (a string)", nonempty=True), "kind": Str(),
        "endpoint": Enum(("completions", "chat")),
        "body": Fields(body, required=required, open=True, what="a JSON object (the request body)"),
        "prompt_ids": Nullable(ListOf(token, min_len=1, limit="max_positions",
                                      what="a list (not empty) of token ids")),
        "served": Nullable(Fields({
            "token_ids": Nullable(ListOf(token, limit="max_positions", what="a list of token ids")),
            "text": Nullable(Str()), "finish_reason": Nullable(Str()),
            "usage": Nullable(MapOf(Json(limit="max_items"), key=Str()))}, open=True)),
    }, required=("id", "endpoint", "body"), open=True, what="a JSON object (a request)")


def read_sequence(path: str | os.PathLike[str],
                  model: str | None = None) -> tuple[SequenceHeader, list[SequenceEntry]]:
    """Read a sequence file whole and check it before anything loads: a bad line is one
    UsageError naming FILE:LINE and the field.

    The file is bounded (specparity.schema's MAX_FILE_BYTES, UTF-8, each line's JSON nesting),
    its requests by ``--max-items``, each request's fields by the rules the served request
    obeys (:func:`specparity.inputs.check_request`), its token ids (``prompt_ids``,
    ``logit_bias``, served ``token_ids``) by the vocabulary the checkpoint's config states
    (``model``, else the header's; where it states none, by the loaded model's later).
    """
    from specparity.inputs import check_request, config_vocab_size, limits, raise_it
    from specparity.schema import Invalid, key_path, load_json, read_bytes

    p = Path(path)
    data = read_bytes(p, str(p))
    rows = [(n, ln) for n, ln in enumerate(data.split(b"\n"), 1) if ln.strip()]
    if not rows:
        raise InputError("sequence", f"{p}: empty")
    cap = limits().max_items
    if len(rows) - 1 > cap:  # before any line is parsed
        raise UsageError(f"{p}:{rows[cap + 1][0]}: {len(rows) - 1} requests, above the maximum {cap}"
                         f" {raise_it('max_items')}")

    def fits(value: Any, checker: Any, where: str) -> None:
        try:
            checker.check(value, ())
        except Invalid as bad:
            at = key_path(bad.path)
            raise UsageError(f"{where}: {at + ': ' if at else ''}{bad.message}") from None

    objs = []
    for n, ln in rows:
        obj = load_json(ln, f"{p}:{n}")
        if not isinstance(obj, dict):
            raise UsageError(f"{p}:{n}: not a JSON object")
        objs.append((n, obj))
    n0, head = objs[0]
    if head.get("format") != SEQUENCE_FORMAT:
        raise UsageError(f"{p}:{n0}: not a sequence file (format {head.get('format')!r},"
                         f" expected {SEQUENCE_FORMAT!r})")
    fits(head, _header_schema(), f"{p}:{n0}")
    header = SequenceHeader(**{k: v for k, v in head.items() if k in SequenceHeader.__dataclass_fields__})
    vocab = config_vocab_size(model or header.model)
    fits(head, _header_schema(vocab), f"{p}:{n0}")
    entries = []
    for n, obj in objs[1:]:
        fits(obj, _entry_schema(vocab, obj.get("prompt_ids") is not None, obj.get("endpoint")), f"{p}:{n}")
        check_request(obj["body"], vocab, f"{p}:{n}: body")
        entries.append(SequenceEntry(**{k: v for k, v in obj.items() if k in SequenceEntry.__dataclass_fields__}))
    if not entries:
        raise InputError("sequence", f"{p}: no requests")
    return header, entries


def replay_command(*options: tuple[str, Any]) -> str:
    """``specparity replay`` with ``options`` in order, as one shell-quoted line: every printed
    reproduction command is built here.

    Each option is (flag, value): True is the bare flag, None or False leaves it out, a list is
    comma-joined (token ids, an accept vector), anything else is its text; a flag given twice
    (``--stop``) is repeated.
    """
    argv = ["specparity", "replay"]
    for flag, value in options:
        if value is None or value is False:
            continue
        argv.append(flag)
        if value is not True:
            argv.append(",".join(str(v) for v in value) if isinstance(value, (list, tuple)) else str(value))
    return shlex.join(argv)


def sequence_command(path: str | os.PathLike[str], trust_remote_code: bool = False) -> str:
    """The command line that replays a sequence file."""
    return replay_command(("--sequence", path), ("--trust-remote-code", trust_remote_code))


def not_reproducible(header: SequenceHeader, entries: list[SequenceEntry]) -> str | None:
    """Why a sequence cannot be replayed in process, in one line (None: it can)."""
    if header.serving_loop != LOOP:
        return (f"engine {header.engine} runs the serving loop {header.serving_loop}: the sequence replay"
                f" rebuilds {LOOP}'s loop only, and this one runs out of process")
    if header.concurrent:
        return ("concurrent requests: the server batched them together, and a batch's arithmetic"
                " and order are serving-loop state the replay does not rebuild")
    for e in entries:
        try:
            params = RequestParams.from_body(e.body, header.settings())
        except UsageError as err:
            return f"request {e.id}: {err}"
        if not params.deterministic:
            return (f"request {e.id}: sampled at temperature {params.temperature:g} without a seed:"
                    " no process can reproduce the server's draws")
    return None


# --- the serving loop, in process ------------------------------------------------------


# --- the replay ------------------------------------------------------------------------

@dataclass
class RequestReplay:
    """One request of the sequence: the replay, classic decode and the served answer.

    id / kind / endpoint: the request. served: how the in-process loop served it.
    replay_vs_classic: where the replay leaves classic decode (None: equal).
    served_vs_classic: where the served answer leaves it (None: equal or not given).
    reproduced: the replay's answer equals the served one (None: no served answer).
    cause: why the replay left classic decode, where the loop's record says so.
    """

    id: str
    kind: str
    endpoint: str
    served: Served
    replay_vs_classic: CompletionDifference | None = None
    served_vs_classic: CompletionDifference | None = None
    reproduced: bool | None = None
    cause: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["served"] = self.served.to_dict()
        for k in ("replay_vs_classic", "served_vs_classic"):
            v = getattr(self, k)
            d[k] = v.to_dict() if v is not None else None
        return d


@dataclass
class SequenceReport(ReportMixin):
    """A sequence replayed through one prompt cache, each answer against classic decode.

    header: the sequence file's header. requests: one RequestReplay per request.
    first: (request id, token index) where the replay first leaves classic decode.
    served_first: the same for the served answers. reason: why the served finding is not
      reproduced in process (None when it is, or when there is none). seconds: wall time.
    """

    header: SequenceHeader
    requests: list[RequestReplay] = field(default_factory=list)
    reason: str | None = None
    seconds: float = 0.0

    @property
    def first(self) -> tuple[str, int] | None:
        for r in self.requests:
            if r.replay_vs_classic is not None:
                return r.id, r.replay_vs_classic.index
        return None

    @property
    def finding(self) -> tuple[str, int | None] | None:
        """(request id, token index) where the replay of the header's finding request leaves classic
        decode (index None: it does not); None when the header names no finding or the request is absent."""
        want = (self.header.finding or {}).get("request")
        for r in self.requests:
            if want is not None and r.id == want:
                return r.id, (r.replay_vs_classic.index if r.replay_vs_classic is not None else None)
        return None

    @property
    def served_first(self) -> tuple[str, int] | None:
        for r in self.requests:
            if r.served_vs_classic is not None:
                return r.id, r.served_vs_classic.index
        return None

    @property
    def verdict(self) -> Verdict:
        if not self.requests:
            return Verdict.NOT_RUN
        if self.first is not None:
            return Verdict.DIVERGENT
        if self.served_first is not None or self.reason is not None:
            return Verdict.INCONCLUSIVE
        return Verdict.EQUAL

    def lines(self) -> list[str]:
        h = self.header
        version = f" {h.engine_version}" if h.engine_version else ""
        who = h.engine_version if (h.engine_version or "").startswith(f"{h.engine} ") else f"{h.engine}{version}"
        out = [f"sequence of {len(self.requests)} requests replayed through one prompt cache as {who}'s"
               f" server loop: model {h.model}"
               + (f", drafter {h.draft_model}" if h.draft_model else "")]
        first = self.first
        if first is not None:
            rid, idx = first
            served = self.served_first
            same = served is not None and served == first
            out.append(f"request {rid} differs from classic decode at token {idx}"
                       + (" (the served finding, reproduced in process)" if same else
                          f" (the served answers first differ at request {served[0]} token {served[1]})"
                          if served else ""))
        elif self.served_first is not None:
            rid, idx = self.served_first
            out.append(f"not reproduced in process: the served request {rid} differs from classic decode at"
                       f" token {idx}, the replay does not" + (f" ({self.reason})" if self.reason else ""))
        elif self.reason:
            out.append(f"not replayed: {self.reason}")
        else:
            out.append("every request equals classic decode, in the replay and as served")
        found, want = self.finding, self.header.finding or {}
        if found is not None and found != first:
            out.append(f"the served finding, request {found[0]} at token {want.get('token_index')}: "
                       + ("the replay differs there too, at token " + str(found[1]) if found[1] is not None
                          else "the replay equals classic decode there"))
        for r in self.requests:
            s = r.served
            where = (f"{s.path} path" + (f" ({s.why_sequential})" if s.path == PATH_SEQUENTIAL else "")
                     + f", {s.cached} of {s.prompt_len} prompt tokens from the prompt cache")
            if s.error:
                out.append(f"  {r.id} ({r.kind}): {where}; the loop failed: {s.error}")
                continue
            verdict = ("equals classic decode" if r.replay_vs_classic is None
                       else r.replay_vs_classic.line())
            out.append(f"  {r.id} ({r.kind}): {where}; {verdict}"
                       + ("" if r.reproduced is None else
                          "; as served" if r.reproduced else "; the served answer differs from the replay's"))
            if r.cause:
                out.append(f"    cause: {r.cause}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "exit_code": self.exit_code, "header": self.header.to_dict(),
                "first": self.first, "served_first": self.served_first, "finding": self.finding,
                "reason": self.reason,
                "requests": [r.to_dict() for r in self.requests], "seconds": self.seconds}


def cause_of(s: Served, prompt_ids: list[int], has_draft: bool) -> str | None:
    """Why a request served this way left classic decode, from what the loop recorded (None: unknown)."""
    if s.held is not None and s.held != s.cached:
        return (f"serving-loop state: the cache entry reused held {s.held} positions where the loop counted"
                f" {s.cached} of {s.prompt_len} prompt tokens as cached, so the uncached suffix was fed at the"
                " wrong positions")
    if s.history is not None and s.history != list(prompt_ids):
        seen = s.history
        what = ("the drafter path's" if has_draft and s.path == PATH_SEQUENTIAL else
                f"the {s.path} path's ({s.why_sequential})" if s.why_sequential else f"the {s.path} path's")
        return (f"{what} logits processors saw {len(seen)} of the prompt's {len(prompt_ids)} tokens"
                f" ({seen[:8]}{'...' if len(seen) > 8 else ''}) before the first emitted token, where classic"
                " decode's see the whole prompt"
                + (f" (a prompt-cache hit of {s.cached} tokens: only the uncached suffix reached them)"
                   if s.cached else ""))
    return None


def replay_sequence(header: SequenceHeader, entries: list[SequenceEntry], reference: ClassicReference,
                    draft_model: Any = None, observer: Observer = NULL) -> SequenceReport:
    """Replay ``entries`` through one in-process serving loop; judge each against classic decode.

    ``reference``: classic decode on the header's model with the header's settings (its
    model is the loop's model). ``draft_model``: the loaded drafter (None: none).
    """
    t0 = time.perf_counter()
    report = SequenceReport(header)
    report.reason = not_reproducible(header, entries)
    if report.reason is not None:
        return report
    settings = header.settings()
    loop = ServingLoop(reference.model, reference.tokenizer, settings, draft_model)
    tok = reference.tokenizer
    try:
        with observer.part("requests", total=len(entries)):
            for e in entries:
                classic = reference.complete(e.endpoint, e.body, prompt_ids=e.prompt_ids, settings=settings)
                served = loop.serve(e.endpoint, e.body, e.prompt_ids)
                rr = RequestReplay(e.id, e.kind, e.endpoint, served)
                if served.error is None:
                    rr.replay_vs_classic = first_difference(classic.side(), served.side(), tok)
                    if rr.replay_vs_classic is not None:
                        rr.cause = cause_of(served, classic.prompt_ids, draft_model is not None)
                side = e.served_side()
                if side is not None:
                    rr.served_vs_classic = d = first_difference(classic.side(), side, tok)
                    if d is not None and d.token_index is None:
                        # a streamed answer has no ids: its token index comes from classic decode's pieces
                        d.token_index = classic.token_index_at(d.char_offset)
                    if served.decoded is not None:
                        rr.reproduced = first_difference(served.side(), side) is None
                report.requests.append(rr)
                observer.item("requests")
    finally:
        loop.close()
    if report.first is None and report.served_first is not None:
        report.reason = ("the in-process loop answers every request as classic decode does: the served"
                         " difference comes from serving-loop state this replay does not rebuild")
    report.seconds = time.perf_counter() - t0
    return report



# --- the commands a served finding prints -----------------------------------------------

@dataclass
class Reproduction:
    """How to reproduce a served finding in process: a command, or why there is none.

    command: the command line (None when the finding cannot be replayed in process).
    reason: one line saying why not (None when there is a command).
    """

    command: str | None = None
    reason: str | None = None

    def line(self) -> str:
        if self.command is not None:
            return f"reproduce in process: {self.command}"
        return f"not reproducible in process: {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _number(x: float) -> str:
    """A value as the shortest text that reads back to the same float."""
    return repr(float(x))


def request_command(model: str, body: dict[str, Any], prompt_ids: list[int], *,
                    draft_model: str | None = None, settings: ServerSettings | None = None,
                    trust_remote_code: bool = False, accepts: list[int] | None = None,
                    width: int | None = None) -> Reproduction:
    """The ``specparity replay`` command that reproduces one request's finding on a fresh cache.

    Every request parameter is carried: the prompt as the server tokenized it
    (``--prompt-ids``), the processors (penalties with their context sizes,
    ``logit_bias``), the stop words, ``max_tokens``, the server's cache flags.
    With ``draft_model`` (an mlx-lm arm) the command reruns mlx-lm's own
    speculative path with the request's processors (``--draft-model``), so a
    difference of that path (its processors see the last prompt token and the
    emitted tokens only) reproduces at the same token; otherwise it replays the
    served ``accepts`` at ``width`` against classic decode. A finding that
    depends on earlier requests needs :func:`sequence_command` instead.
    """
    s = settings or ServerSettings()
    try:
        params = RequestParams.from_body(body, s)
    except UsageError as err:
        return Reproduction(reason=str(err))
    if params.temperature != 0:
        return Reproduction(reason=f"sampled at temperature {params.temperature:g}: the replay decodes greedily")
    options: list[tuple[str, Any]] = [("--model", model), ("--trust-remote-code", trust_remote_code)]
    if draft_model is not None:
        k = params.num_draft_tokens if params.num_draft_tokens is not None else s.num_draft_tokens
        if k < 1:
            return Reproduction(reason=f"num_draft_tokens {k}: the server did not draft")
        options += [("--draft-model", draft_model), ("--num-draft-tokens", k), ("--max-tokens", params.max_tokens),
                    ("--stop-at-eos", True)]
        options += [("--stop", w) for w in params.stop]
    elif accepts:
        if width is None:
            return Reproduction(reason="an accept vector without a width")
        options += [("--accepts", accepts), ("--width", width)]
    else:
        return Reproduction(reason="no drafter to rerun and no accept vector to replay")
    options.append(("--prompt-ids", prompt_ids))
    procs = params.processor_options()
    for name in ("repetition", "presence", "frequency"):
        v = getattr(procs, f"{name}_penalty")
        if v not in (None, 0):
            options += [(f"--{name}-penalty", _number(v)),
                        (f"--{name}-context-size", getattr(procs, f"{name}_context_size"))]
    if procs.logit_bias:
        options.append(("--logit-bias", [f"{k}:{_number(v)}" for k, v in procs.logit_bias.items()]))
    d = ServerSettings()
    for flag, value, default in (("--prefill-step-size", s.prefill_step_size, d.prefill_step_size),
                                 ("--kv-bits", s.kv_bits, d.kv_bits),
                                 ("--kv-group-size", s.kv_group_size, d.kv_group_size),
                                 ("--quantized-kv-start", s.quantized_kv_start, d.quantized_kv_start)):
        if value != default:
            options.append((flag, value))
    return Reproduction(command=replay_command(*options))


def sequence_reproduction(path: str | os.PathLike[str], header: SequenceHeader,
                          entries: list[SequenceEntry], overwrite: bool = False) -> Reproduction:
    """Write the sequence file and return the command that replays it (or why it cannot be replayed)."""
    reason = not_reproducible(header, entries)
    if reason is not None:
        return Reproduction(reason=reason)
    p = write_sequence(path, header, entries, overwrite=overwrite)
    return Reproduction(command=sequence_command(p, header.trust_remote_code))
