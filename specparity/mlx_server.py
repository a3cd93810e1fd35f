"""``mlx_lm.server`` rebuilt once, in process: what it computes for a request, without HTTP.

One place for everything the toolkit knows about mlx-lm's server, used by the
classic reference (:mod:`specparity.reference`), the sequence replay
(:mod:`specparity.probes.replay.sequence`) and ``specparity serve``
(:mod:`specparity.harness.gated.server`) alike:

- **settings**: the server flags that decide what it computes (:class:`ServerSettings`,
  read from its argv or its parsed flags);
- **request to sampler and processors**: a request body read as the server reads it,
  and the server's own ``make_sampler`` / ``make_logits_processors`` calls
  (:class:`RequestParams`);
- **tokenization**: the server's own tokenize step (:func:`server_prompt`: the prompt
  ids, the batched path's prefill segments, the text machine's start state);
- **the text machine**: its stop matcher over ids and its text state machine, 0.32's
  and 0.31's (:func:`response_stream`), turning a token stream into the server's
  answer (:func:`collect`);
- **classic decode**: ``generate_step`` on a fresh cache, read as ``stream_generate``
  reads it, prefilled at the segment boundaries the batched path stops at
  (:func:`decode_classic`);
- **the serving loop**: one prompt cache over a sequence of requests, the sequential
  path (``stream_generate`` with a drafter where there is one) and the batched path
  (``BatchGenerator``), as the server runs them (:class:`ServingLoop`).

Whatever of mlx-lm's internals this needs is reached through
:mod:`specparity.mlx_compat`, which says which mlx-lm versions it was read in.
"""

from __future__ import annotations

import argparse
import copy
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from specparity.completions import Side
from specparity.decode import (
    DEFAULT_PREFILL_STEP, DEFAULT_QUANTIZED_KV_START, CacheOptions, cache_offset, classic_steps, stream_steps,
)
from specparity.errors import UsageError
from specparity.mlx_compat import has_image_parts, parse_size, server_031, server_tokenize, state_machine_031
from specparity.processors import DEFAULT_CONTEXT, ProcessorOptions

COMPLETIONS, CHAT = "completions", "chat"
ENDPOINTS = (COMPLETIONS, CHAT)
PATH_BATCHED, PATH_SEQUENTIAL = "batched", "sequential"
# logprob rows held before their top-2 is taken in one batch (memory: this many rows of the vocabulary)
_SETTLE_EVERY = 64


# --- settings, and a request as the server reads it --------------------------------------

@dataclass
class ServerSettings:
    """The ``mlx_lm.server`` flags that decide what it computes for a request (its defaults).

    prefill_step_size / kv_bits / kv_group_size / quantized_kv_start: the cache and
      prefill flags (``--kv-bits`` also sends every request down the sequential path).
    max_tokens / temp / top_p / top_k / min_p: the defaults a request without the field gets.
    chat_template / use_default_chat_template / chat_template_args: how chat prompts are rendered.
    num_draft_tokens: the drafter's proposals per round (replays only; the reference has no drafter).
    prompt_cache_size / prompt_cache_bytes: the prompt cache's bounds (sequence replays).
    decode_concurrency / prompt_concurrency: the batched path's batch sizes (sequence replays).
    """

    prefill_step_size: int = DEFAULT_PREFILL_STEP
    kv_bits: int | None = None
    kv_group_size: int = 64
    quantized_kv_start: int = DEFAULT_QUANTIZED_KV_START
    max_tokens: int = 512
    temp: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    chat_template: str = ""
    use_default_chat_template: bool = False
    chat_template_args: dict[str, Any] = field(default_factory=dict)
    num_draft_tokens: int = 3
    prompt_cache_size: int = 10
    prompt_cache_bytes: int | None = None
    decode_concurrency: int = 32
    prompt_concurrency: int = 8

    @classmethod
    def from_argv(cls, argv: list[str]) -> ServerSettings:
        """The settings an ``mlx_lm.server`` command line gives (unknown flags ignored)."""
        p = argparse.ArgumentParser(add_help=False)
        d = cls()
        p.add_argument("--prefill-step-size", type=int, default=d.prefill_step_size)
        p.add_argument("--kv-bits", type=int, default=None)
        p.add_argument("--kv-group-size", type=int, default=d.kv_group_size)
        p.add_argument("--quantized-kv-start", type=int, default=d.quantized_kv_start)
        p.add_argument("--max-tokens", type=int, default=d.max_tokens)
        p.add_argument("--temp", type=float, default=d.temp)
        p.add_argument("--top-p", type=float, default=d.top_p)
        p.add_argument("--top-k", type=int, default=d.top_k)
        p.add_argument("--min-p", type=float, default=d.min_p)
        p.add_argument("--chat-template", type=str, default="")
        p.add_argument("--use-default-chat-template", action="store_true")
        p.add_argument("--chat-template-args", type=str, default="{}")
        p.add_argument("--num-draft-tokens", type=int, default=d.num_draft_tokens)
        p.add_argument("--prompt-cache-size", type=int, default=d.prompt_cache_size)
        p.add_argument("--prompt-cache-bytes", type=str, default=None)
        p.add_argument("--decode-concurrency", type=int, default=d.decode_concurrency)
        p.add_argument("--prompt-concurrency", type=int, default=d.prompt_concurrency)
        try:
            ns, _ = p.parse_known_args([str(a) for a in argv])
            template_args = json.loads(ns.chat_template_args)
        except (SystemExit, ValueError) as err:
            raise UsageError(f"server argv {argv!r}: unreadable ({err})") from None
        cache_bytes = None
        if ns.prompt_cache_bytes is not None:
            cache_bytes = int(parse_size(ns.prompt_cache_bytes))
        return cls(prefill_step_size=ns.prefill_step_size, kv_bits=ns.kv_bits, kv_group_size=ns.kv_group_size,
                   quantized_kv_start=ns.quantized_kv_start, max_tokens=ns.max_tokens, temp=ns.temp,
                   top_p=ns.top_p, top_k=ns.top_k, min_p=ns.min_p, chat_template=ns.chat_template,
                   use_default_chat_template=ns.use_default_chat_template,
                   chat_template_args=dict(template_args), num_draft_tokens=ns.num_draft_tokens,
                   prompt_cache_size=ns.prompt_cache_size, prompt_cache_bytes=cache_bytes,
                   decode_concurrency=ns.decode_concurrency, prompt_concurrency=ns.prompt_concurrency)

    @classmethod
    def from_namespace(cls, ns: Any) -> ServerSettings:
        """The settings of ``mlx_lm.server``'s own parsed flags (its argparse namespace, as
        ``specparity serve`` runs it); a flag the namespace lacks keeps its default."""
        d = cls()
        kw = {f.name: getattr(ns, f.name, getattr(d, f.name)) for f in fields(cls)}
        kw["chat_template"] = kw["chat_template"] or ""
        kw["chat_template_args"] = dict(kw["chat_template_args"] or {})
        return cls(**kw)

    def to_argv(self) -> list[str]:
        """The server flags that differ from mlx_lm.server's defaults (``from_argv`` reads them back)."""
        d = ServerSettings()
        out: list[str] = []
        for f in fields(self):
            v = getattr(self, f.name)
            if v == getattr(d, f.name):
                continue
            flag = "--" + f.name.replace("_", "-")
            if isinstance(v, bool):
                out.append(flag)
            elif isinstance(v, dict):
                out += [flag, json.dumps(v, sort_keys=True)]
            else:
                out += [flag, str(v)]
        return out

    def cache_options(self) -> CacheOptions:
        """The cache configuration in the probes' terms."""
        return CacheOptions(kv_bits=self.kv_bits, kv_group_size=self.kv_group_size,
                            quantized_kv_start=self.quantized_kv_start,
                            prefill_step_size=self.prefill_step_size)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ServerSettings:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def tokenizer_key(self) -> tuple[str, bool]:
        """What decides the loaded tokenizer (one reference loads one)."""
        return self.chat_template, self.use_default_chat_template


@dataclass
class RequestParams:
    """One request's generation parameters as ``mlx_lm.server`` reads them from the body.

    Every field has the server's default (``ServerSettings`` for max_tokens and the
    sampler, 0 / 20 for the processors). ``stop``: the stop words (a string becomes
    a list of one). ``seed``: the server seeds mx.random with it and serves the request
    on its sequential path.
    """

    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    repetition_penalty: float = 0.0
    repetition_context_size: int = DEFAULT_CONTEXT
    presence_penalty: float = 0.0
    presence_context_size: int = DEFAULT_CONTEXT
    frequency_penalty: float = 0.0
    frequency_context_size: int = DEFAULT_CONTEXT
    logit_bias: dict[int, float] | None = None
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    num_draft_tokens: int | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @classmethod
    def from_body(cls, body: dict[str, Any], settings: ServerSettings | None = None,
                  vocab: int | None = None) -> RequestParams:
        """Read ``body`` as the server does; a field the server would refuse (HTTP 400), or one that
        would fail or crash in mlx-lm's sampler (:func:`specparity.inputs.check_request`: NaN, an id
        outside ``vocab``), is a UsageError naming the field."""
        from specparity.inputs import check_request

        s = settings or ServerSettings()
        check_request(body, vocab)
        max_tokens = body.get("max_completion_tokens")
        if max_tokens is None:
            max_tokens = body.get("max_tokens", s.max_tokens)
        p = cls(
            max_tokens=max_tokens,
            temperature=body.get("temperature", s.temp),
            top_p=body.get("top_p", s.top_p),
            top_k=body.get("top_k", s.top_k),
            min_p=body.get("min_p", s.min_p),
            xtc_probability=body.get("xtc_probability", 0.0),
            xtc_threshold=body.get("xtc_threshold", 0.1),
            repetition_penalty=body.get("repetition_penalty", 0.0),
            repetition_context_size=body.get("repetition_context_size", DEFAULT_CONTEXT),
            presence_penalty=body.get("presence_penalty", 0.0),
            presence_context_size=body.get("presence_context_size", DEFAULT_CONTEXT),
            frequency_penalty=body.get("frequency_penalty", 0.0),
            frequency_context_size=body.get("frequency_context_size", DEFAULT_CONTEXT),
            seed=body.get("seed"),
            num_draft_tokens=body.get("num_draft_tokens"),
            chat_template_kwargs=body.get("chat_template_kwargs"),
        )
        bias = body.get("logit_bias")
        if bias is not None:
            p.logit_bias = {int(k): float(v) for k, v in bias.items()}
        stop = body.get("stop") or []
        p.stop = [stop] if isinstance(stop, str) else list(stop)
        return p

    @property
    def deterministic(self) -> bool:
        """Greedy, or sampled from a seeded generator: one answer, reproducible in process."""
        return self.temperature == 0 or self.seed is not None

    def processor_options(self) -> ProcessorOptions:
        """The same processors in the probes' terms (``specparity replay`` flags)."""
        return ProcessorOptions(
            repetition_penalty=self.repetition_penalty or None,
            repetition_context_size=self.repetition_context_size,
            presence_penalty=self.presence_penalty or None,
            presence_context_size=self.presence_context_size,
            frequency_penalty=self.frequency_penalty or None,
            frequency_context_size=self.frequency_context_size,
            logit_bias=dict(self.logit_bias or {}),
        )

    def make_processors(self) -> list[Any]:
        """``mlx_lm.server``'s own call: ``make_logits_processors`` with the request's values."""
        from mlx_lm.sample_utils import make_logits_processors

        return make_logits_processors(self.logit_bias, self.repetition_penalty, self.repetition_context_size,
                                      self.presence_penalty, self.presence_context_size,
                                      self.frequency_penalty, self.frequency_context_size)

    def make_sampler(self, tokenizer: Any) -> Any:
        """``mlx_lm.server``'s own call: ``make_sampler`` with the request's values."""
        from mlx_lm.sample_utils import make_sampler

        return make_sampler(self.temperature, top_p=self.top_p, top_k=self.top_k, min_p=self.min_p,
                            xtc_probability=self.xtc_probability, xtc_threshold=self.xtc_threshold,
                            xtc_special_tokens=tokenizer.encode("\n") + list(tokenizer.eos_token_ids))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.logit_bias is not None:
            d["logit_bias"] = {str(k): v for k, v in self.logit_bias.items()}
        return d




# --- the server's tokenize step and its text machine ---------------------------------

@dataclass
class ServerPrompt:
    """A request's prompt as ``mlx_lm.server`` tokenizes it.

    ids: the prompt tokens. segments: the batched path's prefill segments (system
    prompt, user context, thinking tail; one segment when there is nothing to split),
    concatenating to ``ids``. segment_types: each segment's prompt-cache type.
    initial_state: the text state machine's start (``normal`` or ``reasoning``).
    """

    ids: list[int]
    segments: list[list[int]]
    segment_types: list[str]
    initial_state: str = "normal"


def server_prompt(tokenizer: Any, endpoint: str, body: dict[str, Any],
                  settings: ServerSettings | None = None) -> ServerPrompt:
    """``body``'s prompt tokenized by ``mlx_lm.server``'s own tokenize step (its code, not a copy).

    Image content parts are refused (the reference is text only).
    """
    from mlx_lm import server as mlx_server

    s = settings or ServerSettings()
    body = copy.deepcopy(body)
    if endpoint == CHAT:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise UsageError("chat request: no messages")
        if has_image_parts(messages):
            raise UsageError("chat request with images: the classic reference is text only")
        request = mlx_server.CompletionRequest("chat", "", messages, body.get("tools") or None,
                                               body.get("role_mapping"))
    elif endpoint == COMPLETIONS:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise UsageError("completions request: prompt must be a string")
        request = mlx_server.CompletionRequest("text", prompt, [], None, None)
    else:
        raise UsageError(f"endpoint {endpoint!r}: choose from {', '.join(ENDPOINTS)}")
    try:
        # (prompt, segments, segment types, initial state) and, from mlx-lm 0.32, the prompt's images
        ids, segments, types_, initial = server_tokenize(tokenizer, request, s.chat_template_args,
                                                         body.get("chat_template_kwargs"))[:4]
    except (ValueError, KeyError, TypeError) as err:
        raise UsageError(f"{endpoint} request: the server would refuse it ({type(err).__name__}: {err})") from None
    ids = [int(t) for t in ids]
    if not ids:
        raise UsageError(f"{endpoint} request: the prompt encodes to no tokens")
    return ServerPrompt(ids, [[int(t) for t in seg] for seg in segments], list(types_), initial)


def batchable(params: RequestParams, settings: ServerSettings, model: Any, draft: bool = False) -> bool:
    """Whether ``mlx_lm.server`` serves this request on its batched path.

    The server batches a request when it has no drafter, the request no ``seed``,
    the server no ``--kv-bits``, and every cache layer can be merged into a batch.
    """
    if draft or params.seed is not None or settings.kv_bits is not None:
        return False
    from mlx_lm.models.cache import make_prompt_cache

    return all(hasattr(c, "merge") for c in make_prompt_cache(model))


class ResponseText:
    """The text ``mlx_lm.server``'s response handler builds from its token stream (its state machine).

    ``add(text, finish_reason)`` takes one generated token's text segment and returns
    the clean text the server appends to the completion (or streams) at that token.
    ``text`` / ``reasoning`` / ``tool_text`` accumulate the three kinds.
    """

    def __init__(self, tokenizer: Any, stop_words: list[str], initial_state: str = "normal"):
        from mlx_lm.generate import make_text_state_machine

        self._sm_cls = _text_state_machine_class()
        self._state = make_text_state_machine(tokenizer, stop_words).make_state(initial_state)
        self._prev = initial_state
        self.text = ""
        self.reasoning = ""
        self.tool_text = ""
        self.tool_calls: list[str] = []

    def add(self, segment: str, finish_reason: str | None) -> str:
        sm = self._sm_cls
        if finish_reason == "stop":
            self._state, current = sm.discard(self._state)
            segments = [(current, "")]
        elif finish_reason == "length":
            self._state, segments = sm.split(self._state, segment)
            self._state, flushed, current = sm.flush(self._state)
            segments.append((current, flushed))
        else:
            self._state, segments = sm.split(self._state, segment)
        added = ""
        for state, clean in segments:
            if state == "reasoning":
                self.reasoning += clean
            elif state == "tool":
                self.tool_text += clean
            elif state == "normal":
                if self._prev == "tool":
                    self.tool_calls.append(self.tool_text)
                    self.tool_text = ""
                self.text += clean
                added += clean
            self._prev = state
        return added

    def finish(self, finish_reason: str) -> str:
        """The finish reason the server reports (``tool_calls`` after a tool call)."""
        if self._prev == "tool" and self.tool_text:
            self.tool_calls.append(self.tool_text)
        return "tool_calls" if finish_reason == "stop" and self.tool_calls else finish_reason


def _text_state_machine_class() -> Any:
    from mlx_lm.generate import TextStateMachine

    return TextStateMachine


class ResponseStream:
    """The server's stop matcher and text machine over one generation, token by token.

    ``step(token, segment, finish_reason)`` -> the finish reason (``stop`` where a stop sequence
    ended it); ``finish(reason)`` -> the reason the server reports; then ``pieces`` (per token, the
    text the server appends or streams there), ``text`` / ``reasoning`` / ``tool_calls`` as its
    response carries them. mlx-lm 0.32's server: its stop sequences (``make_stop_sequences``) and
    text machine (:class:`ResponseText`).
    """

    def __init__(self, tokenizer: Any, stop_words: list[str], initial_state: str = "normal"):
        from mlx_lm.generate import make_stop_sequences

        self._matcher = make_stop_sequences(tokenizer, stop_words).matcher()
        self._text = ResponseText(tokenizer, stop_words, initial_state)
        self._pieces: list[str] = []

    def step(self, token: int, segment: str, finish_reason: str | None) -> str | None:
        reason = "stop" if self._matcher.advance(token) else finish_reason
        self._pieces.append(self._text.add(segment, reason))
        return reason

    @property
    def pieces(self) -> list[str]:
        return list(self._pieces)

    def finish(self, finish_reason: str) -> str:
        return self._text.finish(finish_reason)

    @property
    def text(self) -> str:
        return self._text.text

    @property
    def reasoning(self) -> str:
        return self._text.reasoning

    @property
    def tool_calls(self) -> list[str]:
        return list(self._text.tool_calls)


class ResponseStream031(ResponseStream):
    """The same for mlx-lm 0.31's server (a pinned environment's: dflash-mlx's, the version matrix's).

    Its ``SequenceStateMachine`` (the server's own ``_make_state_machine``: EOS and each stop word's
    tokens end it; think and tool-call tokens switch state) gives each token a state; a token's text
    goes where that state says (normal text, reasoning, a tool call) and nowhere where it is the end;
    a matched sequence's tokens lose their text (its ``_process_control_tokens``); the response
    collects them as its ``handle_completion`` does.
    """

    def __init__(self, tokenizer: Any, stop_words: list[str], initial_state: str = "normal"):
        sm = state_machine_031(tokenizer, stop_words, initial_state)
        self._sm, self._state = sm, sm.make_state()
        self._tokens: list[tuple[str, str | None]] = []  # (text, state after the token)

    def step(self, token: int, segment: str, finish_reason: str | None) -> str | None:
        self._state, matched, current = self._sm.match(self._state, token)
        self._tokens.append((segment, current))
        if matched is not None:  # the matched sequence's tokens carry no text
            n = len(self._tokens)
            self._tokens[n - len(matched):] = [("", st) for _, st in self._tokens[n - len(matched):]]
        return "stop" if matched is not None and current is None else finish_reason

    def _collect(self) -> tuple[str, str, list[str], bool]:
        text, reasoning, tool_text, tools, made, prev = "", "", "", [], False, None
        for segment, state in self._tokens:
            if state == "reasoning":
                reasoning += segment
            elif state == "tool":
                tool_text += segment
            elif state == "normal":
                if prev == "tool":
                    tools.append(tool_text)
                    tool_text, made = "", True
                text += segment
            prev = state
        if prev == "tool" and tool_text:
            tools.append(tool_text)
            made = True
        return text, reasoning, tools, made

    def finish(self, finish_reason: str) -> str:
        return "tool_calls" if finish_reason == "stop" and self._collect()[3] else finish_reason

    @property
    def pieces(self) -> list[str]:
        return [segment if state == "normal" else "" for segment, state in self._tokens]

    @property
    def text(self) -> str:
        return self._collect()[0]

    @property
    def reasoning(self) -> str:
        return self._collect()[1]

    @property
    def tool_calls(self) -> list[str]:
        return self._collect()[2]


def response_stream(tokenizer: Any, stop_words: list[str], initial_state: str = "normal") -> ResponseStream:
    """The stop matcher and text machine of the installed mlx-lm's server (0.32's, else 0.31's)."""
    cls = ResponseStream031 if server_031() else ResponseStream
    return cls(tokenizer, stop_words, initial_state)




# --- classic decode ------------------------------------------------------------------

Processor = Callable[[Any, Any], Any]


def missing_prefix(prompt: Sequence[int], fed: Sequence[int], speculative: bool) -> list[int]:
    """The prompt tokens a path of the server leaves out of its logits processors' history.

    Classic decode (``generate_step`` on the whole prompt, empty cache) hands each processor
    the full history: every prompt token, then every token emitted so far. mlx-lm 0.32's
    server hands them less: speculative decoding (``speculative_generate_step``) starts the
    history at the last token it was fed; classic decode after a prompt-cache hit starts it at
    the uncached suffix. Both then append what classic decode appends, so the missing part is a
    fixed prefix of the prompt. ``prompt``: the whole prompt; ``fed``: what the server passed to
    ``stream_generate`` (the prompt past its cached prefix). Raises ValueError when ``fed`` is not
    the end of ``prompt``.
    """
    n, k = len(prompt), len(fed)
    if k == 0 or k > n or list(prompt[n - k:]) != list(fed):
        raise ValueError(f"the {k} tokens fed are not the end of the {n}-token prompt")
    return list(prompt[: n - 1]) if speculative else list(prompt[: n - k])


def with_history(processors: list[Processor] | None, prefix: Sequence[int]) -> list[Processor] | None:
    """``processors``, each called with ``prefix`` in front of the history it is given (a pre-filled
    cache's tokens, or what a server path left out: :func:`missing_prefix`). Nothing else changes:
    the same processors, the same rows, the same order. mlx-lm's logit bias, which never reads its
    tokens (:func:`specparity.mlx_compat.ignores_history`), is left as it is: no array is built for it
    on every token."""
    from specparity.mlx_compat import ignores_history

    if not processors or not prefix:
        return processors
    reads = [not ignores_history(p) for p in processors]
    if not any(reads):
        return processors
    import mlx.core as mx

    head = mx.array(list(prefix), dtype=mx.uint32)
    uint32, concatenate = mx.uint32, mx.concatenate

    def wrap(processor: Processor) -> Processor:
        def call(tokens: Any, logits: Any) -> Any:
            if tokens is None:
                return processor(head, logits)
            return processor(concatenate([head, tokens if tokens.dtype == uint32 else tokens.astype(uint32)]),
                             logits)

        return call

    return [wrap(p) if r else p for p, r in zip(processors, reads)]


def fresh_cache(model: Any, draft_model: Any = None) -> list[Any]:
    """A fresh prompt cache as the server makes one: the target's layers, then the drafter's."""
    from mlx_lm.models.cache import make_prompt_cache

    cache: list[Any] = make_prompt_cache(model)
    return cache + make_prompt_cache(draft_model) if draft_model is not None else cache


def prefill_segments(model: Any, segments: list[list[int]], settings: ServerSettings) -> Any:
    """A fresh cache holding ``segments`` (all but the last), each prefilled in chunks as the batched path does."""
    import mlx.core as mx
    from mlx_lm.generate import maybe_quantize_kv_cache
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    step = max(1, int(settings.prefill_step_size))
    for seg in segments[:-1]:
        rest = list(seg)
        while rest:
            n = min(step, len(rest))
            model(mx.array(rest[:n])[None], cache=cache)
            maybe_quantize_kv_cache(cache, settings.quantized_kv_start, settings.kv_group_size, settings.kv_bits)
            mx.eval([c.state for c in cache])
            rest = rest[n:]
    return cache


@dataclass
class Decoded:
    """One generation as the server's response handler sees it (see :class:`ReferenceCompletion`)."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)
    text: str = ""
    reasoning: str = ""
    tool_calls: list[str] = field(default_factory=list)
    finish_reason: str = "length"


def _top2_pairs(ids: Any, vals: Any) -> list[tuple[int, float]]:
    """The two best (id, logprob) of a row, best first, an exact tie toward the lower id."""
    return sorted(((int(a), float(b)) for a, b in zip(ids, vals)), key=lambda t: (-t[1], t[0]))


def collect(tokenizer: Any, responses: Any, stop_words: list[str], initial_state: str = "normal") -> Decoded:
    """Turn ``stream_generate``-style responses into the server's answer.

    Each response has ``token``, ``text``, ``logprobs`` (the row) and ``finish_reason``;
    the server's stop matcher (EOS + stop words, over ids) may end it early. The
    logprobs and top-2 are taken from the rows in batches, without waiting on any
    token, so the generation keeps its own pace.
    """
    import mlx.core as mx

    machine = response_stream(tokenizer, stop_words, initial_state)
    out = Decoded()
    finish = "stop"
    rows: list[Any] = []
    lazy: list[tuple[Any, Any]] = []

    def settle() -> None:
        # the rows held so far, their top-2 and the emitted token's logprob, as one lazy batch
        block = mx.stack(rows)
        idx = mx.argpartition(-block, kth=1, axis=-1)[:, :2]
        picked = mx.take_along_axis(block, idx, axis=-1)
        emitted = mx.take_along_axis(block, mx.array(out.token_ids[-len(rows):])[:, None], axis=-1)[:, 0]
        mx.async_eval(idx, picked, emitted)
        lazy.append(((idx, picked), emitted))
        rows.clear()

    for gen in responses:
        reason = machine.step(int(gen.token), gen.text, gen.finish_reason)
        out.token_ids.append(int(gen.token))
        rows.append(gen.logprobs)
        if len(rows) == _SETTLE_EVERY:
            settle()
        if reason is not None:
            finish = reason
            break
    if rows:
        settle()
    for (idx, picked), emitted in lazy:
        out.top.extend(_top2_pairs(a, b) for a, b in zip(idx.tolist(), picked.tolist()))
        out.logprobs.extend(float(x) for x in emitted.tolist())
    out.finish_reason = machine.finish(finish)
    out.pieces = list(machine.pieces)
    out.text, out.reasoning, out.tool_calls = machine.text, machine.reasoning, list(machine.tool_calls)
    return out


def decode_classic(model: Any, tokenizer: Any, prompt: ServerPrompt, params: RequestParams,
                   settings: ServerSettings, path: str) -> Decoded:
    """Classic decode of ``prompt`` with the request's sampler and processors (no drafter, fresh cache).

    Classic decode's one computation (:func:`specparity.decode.classic_steps`: mlx-lm's ``generate_step``,
    what ``stream_generate`` runs without a drafter), read as ``stream_generate`` reads it
    (:func:`~specparity.decode.stream_steps`), with the server's prompt segments, stop words and text.
    """
    import mlx.core as mx

    if params.seed is not None:
        mx.random.seed(params.seed)
    segments = prompt.segments if path == PATH_BATCHED and len(prompt.segments) > 1 else [prompt.ids]
    processors = params.make_processors()
    cache = None
    last = segments[-1]
    if len(segments) > 1:
        cache = prefill_segments(model, segments, settings)
        done = [t for seg in segments[:-1] for t in seg]
        processors = with_history(processors, done) or []
    steps = classic_steps(model, last, params.max_tokens, sampler=params.make_sampler(tokenizer),
                          logits_processors=processors or None, prompt_cache=cache,
                          prefill_step_size=settings.prefill_step_size, kv_bits=settings.kv_bits,
                          kv_group_size=settings.kv_group_size, quantized_kv_start=settings.quantized_kv_start)
    finalize = not (path == PATH_BATCHED and server_031())
    return collect(tokenizer, stream_steps(tokenizer, steps, params.max_tokens, finalize), params.stop,
                   prompt.initial_state)




# --- the serving loop, with its prompt cache ---------------------------------------------

@dataclass
class Served:
    """One request as the in-process loop served it.

    path: ``batched`` or ``sequential``; why_sequential: what sent it there.
    prompt_len: prompt tokens. cached: tokens the loop counted as taken from the prompt cache.
    held: positions the fetched cache entry really held (target layers; None: no entry).
    draft_held: the same for the drafter's layers. history: what the logits processors
      saw before the first emitted token (None: no processors), as token ids.
    decoded: the answer (ids, logprobs, text, finish reason). error: why there is none.
    """

    path: str
    prompt_len: int
    cached: int = 0
    held: int | None = None
    draft_held: int | None = None
    why_sequential: str = ""
    history: list[int] | None = None
    decoded: Decoded | None = None
    error: str | None = None

    def side(self) -> Side:
        d = self.decoded or Decoded()
        return Side("replay", d.text, list(d.token_ids), list(d.logprobs), [list(t) for t in d.top])

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _offset(caches: list[Any]) -> int | None:
    """The positions a prompt cache holds: the least offset of its layers that keep one (a hybrid's
    linear-attention layers keep none); None where no layer does."""
    return min((o for o in map(cache_offset, caches) if o is not None), default=None)


class _Recording:
    """Wraps a logits processor to keep the first history it is given."""

    def __init__(self, inner: Any, sink: list[list[int]]):
        self.inner, self.sink = inner, sink

    def __call__(self, tokens: Any, logits: Any) -> Any:
        if not self.sink:
            self.sink.append([int(t) for t in tokens.tolist()])
        return self.inner(tokens, logits)


class ServingLoop:
    """``mlx_lm.server`` 0.32's generation loop over one model (and drafter), without HTTP.

    One ``LRUPromptCache`` lives as long as the loop; :meth:`serve` runs one request
    the way the server's ``_serve_single`` (sequential) or its batch branch does.
    """

    def __init__(self, model: Any, tokenizer: Any, settings: ServerSettings, draft_model: Any = None):
        from mlx_lm.models.cache import LRUPromptCache

        self.model, self.tokenizer, self.settings, self.draft_model = model, tokenizer, settings, draft_model
        self.lru = LRUPromptCache(settings.prompt_cache_size)
        self.model_key = ("model", None, "draft" if draft_model is not None else None)
        self._batch: Any = None

    def close(self) -> None:
        if self._batch is not None:
            self._batch.close()
            self._batch = None

    def serve(self, endpoint: str, body: dict[str, Any], prompt_ids: list[int] | None = None) -> Served:
        params = RequestParams.from_body(body, self.settings)
        if prompt_ids is not None:
            prompt = ServerPrompt(list(prompt_ids), [list(prompt_ids)], ["assistant"])
        else:
            prompt = server_prompt(self.tokenizer, endpoint, body, self.settings)
        if batchable(params, self.settings, self.model, self.draft_model is not None):
            return self._batched(prompt, params)
        self.close()  # the server drains its batch before a request it cannot batch
        return self._sequential(prompt, params)

    def _sequential(self, prompt: ServerPrompt, params: RequestParams) -> Served:
        import mlx.core as mx
        from mlx_lm.generate import stream_generate

        why = ("a drafter" if self.draft_model is not None else
               "seed in the request" if params.seed is not None else "--kv-bits")
        out = Served(PATH_SEQUENTIAL, len(prompt.ids), why_sequential=why)
        if params.seed is not None:
            mx.random.seed(params.seed)
        sampler = params.make_sampler(self.tokenizer)
        seen: list[list[int]] = []
        processors = [_Recording(p, seen) for p in params.make_processors()]
        cache_key = list(prompt.ids)
        cache, rest = self.lru.fetch_nearest_cache(self.model_key, cache_key)
        out.cached = len(prompt.ids) - len(rest)
        rest = prompt.ids[out.cached:]
        n_target = len(self.model.layers)
        if cache is None:
            cache = fresh_cache(self.model, self.draft_model)
        else:
            out.held = _offset(cache[:n_target])
            out.draft_held = _offset(cache[n_target:]) if self.draft_model is not None else None
        num_draft = params.num_draft_tokens if params.num_draft_tokens is not None else self.settings.num_draft_tokens
        gens = stream_generate(model=self.model, tokenizer=self.tokenizer, prompt=rest,
                               max_tokens=params.max_tokens, sampler=sampler, logits_processors=processors,
                               prompt_cache=cache, draft_model=self.draft_model, num_draft_tokens=num_draft,
                               prefill_step_size=self.settings.prefill_step_size, kv_bits=self.settings.kv_bits,
                               kv_group_size=self.settings.kv_group_size,
                               quantized_kv_start=self.settings.quantized_kv_start)
        try:
            out.decoded = collect(self.tokenizer, gens, params.stop, prompt.initial_state)
        except ValueError as err:  # the server answers this request with an error
            out.error = f"{type(err).__name__}: {err}"
            return out
        finally:
            # the server's loop drops its generator when it breaks: the drafter path rewinds then
            gens.close()
            del gens
        out.history = seen[0] if seen else None
        cache_key.extend(out.decoded.token_ids)
        self.lru.insert_cache(self.model_key, cache_key, cache)
        return out

    def _batched(self, prompt: ServerPrompt, params: RequestParams) -> Served:
        import mlx.core as mx
        from mlx_lm.generate import BatchGenerator, make_stop_sequences

        out = Served(PATH_BATCHED, len(prompt.ids))
        if self._batch is None:
            self._batch = BatchGenerator(self.model, completion_batch_size=self.settings.decode_concurrency,
                                         prefill_batch_size=self.settings.prompt_concurrency,
                                         prefill_step_size=self.settings.prefill_step_size,
                                         stream=mx.default_stream(mx.default_device()))
        bg = self._batch
        segments = [list(s) for s in prompt.segments]
        segment_types = list(prompt.segment_types)
        cache, rest = self.lru.fetch_nearest_cache(self.model_key, list(prompt.ids))
        out.cached = n = len(prompt.ids) - len(rest)
        if cache is not None:
            out.held = _offset(cache)
        while n > 0:
            if n >= len(segments[0]):
                n -= len(segments.pop(0))
                segment_types.pop(0)
            else:
                segments[0] = segments[0][n:]
                break
        seen: list[list[int]] = []
        processors = [_Recording(p, seen) for p in params.make_processors()]
        (uid,) = bg.insert_segments(segments=[segments], max_tokens=[params.max_tokens], caches=[cache],
                                    all_tokens=[list(prompt.ids[:out.cached])],
                                    samplers=[params.make_sampler(self.tokenizer)],
                                    logits_processors=[processors],
                                    stop_sequences=[make_stop_sequences(self.tokenizer, params.stop)])
        types_left = segment_types[::-1]
        detok = self.tokenizer.detokenizer
        model_key, lru, settings = self.model_key, self.lru, self.settings

        class _Gen:
            def __init__(self, token: int, text: str, logprobs: Any, finish_reason: str | None):
                self.token, self.text, self.logprobs, self.finish_reason = token, text, logprobs, finish_reason

        def responses() -> Any:
            while True:
                prompt_responses, gen_responses = bg.next()
                if not prompt_responses and not gen_responses:
                    return
                ends = [r.uid for r in prompt_responses if r.end_of_segment and not r.end_of_prompt and types_left]
                for _, (c, key) in bg.extract_cache(ends).items():
                    lru.insert_cache(model_key, key[:], c, cache_type=types_left.pop())
                for r in gen_responses:
                    if r.uid != uid:
                        continue
                    if r.finish_reason == "stop":
                        detok.finalize()
                    elif r.finish_reason == "length":
                        detok.add_token(r.token)
                        detok.finalize()
                    else:
                        detok.add_token(r.token)
                    text = detok.last_segment
                    if r.finish_reason is not None:
                        lru.insert_cache(model_key, r.all_tokens[:], r.prompt_cache, cache_type="assistant")
                        if settings.prompt_cache_bytes is not None:
                            lru.trim_to(n_bytes=settings.prompt_cache_bytes - bg.prompt_cache_nbytes)
                    yield _Gen(r.token, text, r.logprobs, r.finish_reason)
                    if r.finish_reason is not None:
                        return

        out.decoded = collect(self.tokenizer, responses(), params.stop, prompt.initial_state)
        out.history = seen[0] if seen else None
        return out
