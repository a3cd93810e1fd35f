"""Classic decode computed in process for a served request: the reference every served arm is judged by.

For one request (endpoint + JSON body, as sent to an OpenAI-style server)
:class:`ClassicReference` computes what a fresh, drafter-less ``mlx_lm.server``
of mlx-lm 0.32 returns for it, on the same weights, in this process:

- **prompt tokens** as the server forms them (``mlx_lm.server``'s own tokenize
  step: completions ``tokenizer.encode(prompt)`` with the tokenizer's special
  tokens; chat ``apply_chat_template(messages, add_generation_prompt=True,
  tools=..., **chat_template_args)`` where the tokenizer has a template, else
  the server's plain ``USER:/ASSISTANT:`` rendering, encoded with special
  tokens). Where the server said how many prompt tokens it used (``usage``) or
  which (an engine that returns them), the reference checks its own ids
  against that (:class:`PromptCheck`).
- **decode**: mlx-lm's ``stream_generate`` without a drafter, i.e.
  ``generate_step`` on a fresh cache: prefill in ``--prefill-step-size``
  chunks, the server's ``--kv-bits`` quantization, the request's sampler
  (``make_sampler``: temperature 0 is the greedy argmax of logprobs in the
  model's dtype) and logits processors (``make_logits_processors``:
  ``logit_bias``, repetition / presence / frequency penalties with their
  context sizes) seeing the whole prompt plus every emitted token. A request
  the server would batch (no ``seed``, no ``--kv-bits``) with a chat template
  that splits it into segments (system prompt, thinking tail) is prefilled at
  the same segment boundaries the batched path stops at.
- **stop and text**: the server's stop matcher over token ids (EOS and each
  stop word's tokens) and its text state machine (a stop word is cut from the
  text, reasoning and tool-call spans are set apart), ``max_tokens`` /
  ``max_completion_tokens``; the completion's token ids include the final EOS
  or stop token, as the server counts them.

Each distinct request (a canonical key over the endpoint, the fields that
change generation and the server settings) is computed once per
:class:`ClassicReference`; :meth:`ClassicReference.cost` reports what it took.

Reading of mlx-lm 0.32.2's server that this module relies on (and that the
tests check on real servers): a non-streamed response lists the emitted ids
and logprobs under ``choices[0].logprobs.content`` when ``logprobs`` is true
(with ``top_logprobs`` > 0 it lists only each token's top-k, unordered, not
the emitted id); a streamed response carries no ids and no logprobs at all
(only text deltas, and ``usage`` with ``stream_options.include_usage``), so a
streamed completion gets its token index from the reference
(:meth:`ReferenceCompletion.token_index_at`).

:func:`near_tie` classifies a difference between engines whose arithmetic
differs from MLX's (llama.cpp) by both sides' top-2 margins.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from specparity.completions import Side, first_index
from specparity.decode import DEFAULT_PREFILL_STEP, DEFAULT_QUANTIZED_KV_START, CacheOptions
from specparity.errors import InfrastructureError, UsageError, first_line
from specparity.mlx_compat import server_031
from specparity.processors import DEFAULT_CONTEXT, ProcessorOptions

log = logging.getLogger(__name__)

COMPLETIONS, CHAT = "completions", "chat"
ENDPOINTS = (COMPLETIONS, CHAT)
PATH_BATCHED, PATH_SEQUENTIAL = "batched", "sequential"
# body fields that never change what the server generates (how it is delivered, which
# drafter, which model name): left out of the canonical request key
_DELIVERY_FIELDS = ("stream", "stream_options", "logprobs", "top_logprobs", "num_draft_tokens",
                    "draft_model", "model", "user", "n")
_CONTEXT_TOKENS = 6
# logprob rows held before their top-2 is taken in one batch (memory: this many rows of the vocabulary)
_SETTLE_EVERY = 64


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
            from specparity.mlx_compat import parse_size

            cache_bytes = int(parse_size(ns.prompt_cache_bytes))
        return cls(prefill_step_size=ns.prefill_step_size, kv_bits=ns.kv_bits, kv_group_size=ns.kv_group_size,
                   quantized_kv_start=ns.quantized_kv_start, max_tokens=ns.max_tokens, temp=ns.temp,
                   top_p=ns.top_p, top_k=ns.top_k, min_p=ns.min_p, chat_template=ns.chat_template,
                   use_default_chat_template=ns.use_default_chat_template,
                   chat_template_args=dict(template_args), num_draft_tokens=ns.num_draft_tokens,
                   prompt_cache_size=ns.prompt_cache_size, prompt_cache_bytes=cache_bytes,
                   decode_concurrency=ns.decode_concurrency, prompt_concurrency=ns.prompt_concurrency)

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

    from specparity.mlx_compat import has_image_parts, server_tokenize

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
        from specparity.mlx_compat import state_machine_031

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


@dataclass
class PromptCheck:
    """The reference's prompt tokens against what the server reported about its own.

    server_count: the server's ``usage.prompt_tokens`` (None: not reported).
    server_ids_given: the server returned its prompt ids (an engine that does).
    equal: every reported fact agrees (None: the server reported nothing to check).
    first_mismatch: the first prompt position whose id differs (ids given), else None.
    reference_ids / server_ids: a few ids of each from there.
    """

    reference_count: int
    server_count: int | None = None
    server_ids_given: bool = False
    equal: bool | None = None
    first_mismatch: int | None = None
    reference_ids: list[int] = field(default_factory=list)
    server_ids: list[int] = field(default_factory=list)

    def line(self) -> str:
        if self.equal is None:
            return "prompt tokens: the server reported none to check"
        if self.equal:
            what = "ids" if self.server_ids_given else "count"
            return f"prompt tokens: {self.reference_count}, equal to the server's ({what})"
        if self.first_mismatch is not None:
            return (f"prompt tokens differ from the server's at position {self.first_mismatch}:"
                    f" reference {self.reference_ids} vs server {self.server_ids}"
                    f" ({self.reference_count} vs {self.server_count} tokens)")
        return f"prompt tokens: reference {self.reference_count}, server {self.server_count}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_prompt(reference: list[int], server_ids: list[int] | None = None,
                 server_count: int | None = None) -> PromptCheck:
    """Compare the reference's prompt ids with the server's ids and/or its prompt token count."""
    chk = PromptCheck(reference_count=len(reference))
    if server_ids is not None:
        chk.server_ids_given = True
        chk.server_count = len(server_ids) if server_count is None else server_count
        i = None if list(reference) == list(server_ids) else first_index(reference, server_ids)
        chk.first_mismatch = i
        if i is not None:
            chk.reference_ids = list(reference[i:i + _CONTEXT_TOKENS])
            chk.server_ids = list(server_ids[i:i + _CONTEXT_TOKENS])
        chk.equal = i is None and chk.server_count == len(reference)
        return chk
    if server_count is not None:
        chk.server_count = int(server_count)
        chk.equal = chk.server_count == len(reference)
    return chk


@dataclass
class ReferenceCompletion:
    """Classic decode's answer to one request, as a fresh drafter-less server gives it.

    key: the canonical request key (sha256) it was cached under.
    endpoint: completions or chat.
    prompt_ids: the prompt tokens decoded from; prompt_check: those against what the server
      said of its prompt (a mismatch: another prompt than the server's, not compared).
    own_prompt: where it decoded from the server's own ids (an engine that tokenizes on its own),
      the harness's own tokenization (mlx_lm.server's tokenize step) against those ids: a mismatch
      is a finding, the comparison stands (classic decode decoded what the server decoded);
      own_prompt_error: why the harness could not tokenize the request itself.
    token_ids: every emitted token, the final EOS / stop token included (the server's count).
    text: the completion text (chat: the message content) after stop words and the
      server's state machine; reasoning / tool_calls: what that machine set apart.
    pieces: per token, the text the server appends (or streams) at that token.
    logprobs: the emitted token's logprob, as the server reports it (model dtype, to float).
    top: per token, the two best (id, logprob), best first, ties toward the lower id.
    finish_reason: stop, length or tool_calls.
    path: the path a fresh drafter-less server takes (``batched`` or ``sequential``).
    prefill_segments: segment lengths the prompt was prefilled in (one: the whole prompt).
    deterministic: greedy or seeded (False: sampling that no process can reproduce).
    params: the request's parameters as the server read them. settings: the server settings.
    seconds: time this computation took (a cache hit reports the first computation's).
    """

    key: str
    endpoint: str
    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    pieces: list[str]
    logprobs: list[float]
    top: list[list[tuple[int, float]]]
    finish_reason: str
    path: str
    prefill_segments: list[int]
    deterministic: bool
    params: dict[str, Any]
    settings: dict[str, Any]
    prompt_check: PromptCheck | None = None
    own_prompt: PromptCheck | None = None
    own_prompt_error: str | None = None
    reasoning: str = ""
    tool_calls: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def side(self, name: str = "classic decode") -> Side:
        """This completion as one side of :func:`specparity.completions.first_difference`."""
        return Side(name, self.text, list(self.token_ids), list(self.logprobs),
                    [list(t) for t in self.top])

    def margin(self, i: int) -> float | None:
        """Top-1 minus top-2 logprob at token ``i`` (nats)."""
        if not 0 <= i < len(self.top) or len(self.top[i]) < 2:
            return None
        return float(self.top[i][0][1]) - float(self.top[i][1][1])

    def offsets(self) -> list[int]:
        """Per token, the character offset in ``text`` where its piece starts."""
        out, at = [], 0
        for p in self.pieces:
            out.append(at)
            at += len(p)
        return out

    def token_index_at(self, char_offset: int | None) -> int | None:
        """The token a first differing character falls in (a streamed completion's token index).

        A streamed answer carries text only; where it first differs from ``text`` at
        ``char_offset``, the first token whose emitted text reaches past that character
        is the first token that can differ, moved back over tokens that emitted no text
        of their own (the bytes of a character split across tokens). None for None;
        past the end: the token after the last piece with text.
        """
        if char_offset is None:
            return None
        ends, at = [], 0
        for p in self.pieces:
            at += len(p)
            ends.append(at)
        i = next((k for k, e in enumerate(ends) if e > char_offset), None)
        if i is None:  # at or past the end of this text: the token after the last one with text
            spoke = [k for k, p in enumerate(self.pieces) if p]
            return spoke[-1] + 1 if spoke else 0
        while i > 0 and self.pieces[i - 1] == "":
            i -= 1
        return i

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("prompt_check", "own_prompt"):
            check = getattr(self, k)
            d[k] = check.to_dict() if check else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ReferenceCompletion:
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        kw["top"] = [[(int(a), float(b)) for a, b in t] for t in kw.get("top") or []]
        for k in ("prompt_check", "own_prompt"):
            if kw.get(k):
                kw[k] = PromptCheck(**kw[k])
        return cls(**kw)


@dataclass
class ReferenceStats:
    """What the reference cost in a job.

    computed: distinct requests decoded. hits: answers served from the cache.
    seconds: time spent decoding them (model load apart). load_seconds: loading the model.
    tokens: tokens generated. prompt_tokens: prompt tokens prefilled.
    cold: cold answers computed (:meth:`ClassicReference.cold`, only for requests that left
      classic decode); cold_seconds / cold_tokens: their time (drafter loads included) and tokens.
    """

    computed: int = 0
    hits: int = 0
    seconds: float = 0.0
    load_seconds: float = 0.0
    tokens: int = 0
    prompt_tokens: int = 0
    cold: int = 0
    cold_seconds: float = 0.0
    cold_tokens: int = 0

    def line(self) -> str:
        return (f"classic reference: {self.computed} distinct requests decoded in process"
                f" ({self.tokens} tokens, {self.prompt_tokens} prompt tokens, {self.seconds:.2f} s;"
                f" model load {self.load_seconds:.2f} s), {self.hits} answered from its cache"
                + (f"; {self.cold} cold answers through mlx_lm.server's loop ({self.cold_tokens} tokens,"
                   f" {self.cold_seconds:.2f} s)" if self.cold else ""))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ColdAnswer:
    """A request answered by mlx_lm.server's own loop on a fresh prompt cache, in process.

    text / token_ids / finish_reason: the answer as the server's response handler builds it.
    path: the loop's path (``batched`` or ``sequential``). draft_model: the drafter it ran
    with (None: none). seconds: what it took (a cache hit reports the first computation's).
    """

    text: str
    token_ids: list[int]
    finish_reason: str
    path: str
    draft_model: str | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def request_key(endpoint: str, body: dict[str, Any], settings: ServerSettings,
                prompt_ids: list[int] | None = None) -> str:
    """The canonical key of a request: sha256 over what changes the answer.

    Delivery fields (``stream``, ``logprobs``, ``top_logprobs``, the drafter's
    ``num_draft_tokens``...) are left out: a streamed and a non-streamed request of
    the same body get one reference.
    """
    kept = {k: v for k, v in body.items() if k not in _DELIVERY_FIELDS}
    s = settings.to_dict()
    for k in ("num_draft_tokens", "prompt_cache_size", "prompt_cache_bytes", "decode_concurrency",
              "prompt_concurrency"):
        s.pop(k, None)
    blob = json.dumps({"endpoint": endpoint, "body": kept, "settings": s, "prompt_ids": prompt_ids},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _prefixed(prefix: list[int], processors: list[Any]) -> list[Any]:
    """Processors that see ``prefix`` before the history they are given (a pre-filled cache's tokens)."""
    import mlx.core as mx

    if not processors or not prefix:
        return processors
    head = mx.array(prefix)

    def wrap(p: Any) -> Any:
        def call(tokens: Any, logits: Any) -> Any:
            return p(mx.concatenate([head.astype(tokens.dtype), tokens]), logits)

        return call

    return [wrap(p) for p in processors]


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


def top2(logprobs: Any) -> list[tuple[int, float]]:
    """The two best (id, logprob) of a logprob row, best first, an exact tie toward the lower id."""
    ids, vals = _top2_lazy(logprobs)
    return _top2_pairs(ids.tolist(), vals.tolist())


def _top2_lazy(logprobs: Any) -> tuple[Any, Any]:
    """The two best ids of a row and their logprobs, as arrays not yet evaluated."""
    import mlx.core as mx

    idx = mx.argpartition(-logprobs, kth=1)[:2]
    return idx, logprobs[idx]


def _top2_pairs(ids: Any, vals: Any) -> list[tuple[int, float]]:
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


@dataclass
class Step:
    """One generated token as the server's response loop receives it (``stream_generate``'s fields)."""

    token: int
    text: str
    logprobs: Any
    finish_reason: str | None = None


def stream_steps(tokenizer: Any, steps: Any, max_tokens: int, finalize: bool = True) -> Any:
    """``generate_step``'s (token, logprobs) as ``stream_generate`` turns them into responses.

    The same rules without its timing and memory readings: an EOS token ends the stream
    (finish ``stop``, not detokenized), the ``max_tokens``-th token ends it (``length``),
    each text segment is the detokenizer's ``last_segment``. ``finalize=False``: the last
    token's segment without the detokenizer's held bytes, as mlx-lm 0.31's batched path
    sends it (it never finalizes: a trailing partial character is dropped).
    """
    detok = tokenizer.detokenizer
    eos = tokenizer.eos_token_ids
    for n, (token, logprobs) in enumerate(steps):
        if token in eos:
            detok.finalize()
            yield Step(token, detok.last_segment, logprobs, "stop")
            return
        detok.add_token(token)
        if n + 1 == max_tokens:
            if finalize:
                detok.finalize()
            yield Step(token, detok.last_segment, logprobs, "length")
            return
        yield Step(token, detok.last_segment, logprobs)


def decode_classic(model: Any, tokenizer: Any, prompt: ServerPrompt, params: RequestParams,
                   settings: ServerSettings, path: str) -> Decoded:
    """Classic decode of ``prompt`` with the request's sampler and processors (no drafter, fresh cache).

    mlx-lm's ``generate_step`` (what ``stream_generate`` runs without a drafter), read as
    ``stream_generate`` reads it (:func:`stream_steps`).
    """
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    if params.seed is not None:
        mx.random.seed(params.seed)
    segments = prompt.segments if path == PATH_BATCHED and len(prompt.segments) > 1 else [prompt.ids]
    processors = params.make_processors()
    cache = None
    last = segments[-1]
    if len(segments) > 1:
        cache = prefill_segments(model, segments, settings)
        done = [t for seg in segments[:-1] for t in seg]
        processors = _prefixed(done, processors)
    steps = generate_step(mx.array(last), model, max_tokens=params.max_tokens,
                          sampler=params.make_sampler(tokenizer), logits_processors=processors or None,
                          prompt_cache=cache, prefill_step_size=settings.prefill_step_size,
                          kv_bits=settings.kv_bits, kv_group_size=settings.kv_group_size,
                          quantized_kv_start=settings.quantized_kv_start)
    finalize = not (path == PATH_BATCHED and server_031())
    return collect(tokenizer, stream_steps(tokenizer, steps, params.max_tokens, finalize), params.stop,
                   prompt.initial_state)


class ClassicReference:
    """Classic decode in process for served requests, on one checkpoint, loaded once.

    ``checkpoint``: the mlx-lm checkpoint the server loaded (or the one a GGUF was
    exported from). ``trust_remote_code``: consent to run its ``model_file`` (as the
    server's ``--trust-remote-code``). ``settings``: the server's flags
    (:meth:`ServerSettings.from_argv`). ``batches``: the server batches what it can, as
    mlx_lm.server does (False: it serves every request on its sequential path, as dflash
    serve's target-only path, mlx_lm.server's ``_serve_single``, does).
    """

    def __init__(self, checkpoint: str | os.PathLike[str], trust_remote_code: bool = False,
                 settings: ServerSettings | None = None, batches: bool = True):
        from specparity.checkpoint import load_checkpoint

        self.batches = batches
        self.settings = settings or ServerSettings()
        t0 = time.perf_counter()
        tok_cfg: dict[str, Any] = {}
        if self.settings.chat_template:
            tok_cfg["chat_template"] = self.settings.chat_template
        self.loaded = load_checkpoint(checkpoint, trust_remote_code=trust_remote_code, flag="checkpoint",
                                      tokenizer_config=tok_cfg)
        tokenizer = self.loaded.tokenizer
        if self.settings.use_default_chat_template and tokenizer.chat_template is None:
            tokenizer.chat_template = tokenizer.default_chat_template
        self.checkpoint = Path(checkpoint)
        self.trust_remote_code = trust_remote_code
        self._cache: dict[str, ReferenceCompletion] = {}
        self._cold: dict[str, ColdAnswer] = {}
        self._drafts: dict[str, Any] = {}
        self._stats = ReferenceStats(load_seconds=time.perf_counter() - t0)

    @property
    def model(self) -> Any:
        return self.loaded.model

    @property
    def tokenizer(self) -> Any:
        return self.loaded.tokenizer

    def prompt(self, endpoint: str, body: dict[str, Any], settings: ServerSettings | None = None) -> ServerPrompt:
        """The request's prompt tokens as the server forms them."""
        return server_prompt(self.tokenizer, endpoint, body, self._settings(settings))

    def complete(self, endpoint: str, body: dict[str, Any], server_prompt_ids: list[int] | None = None,
                 server_prompt_tokens: int | None = None, prompt_ids: list[int] | None = None,
                 settings: ServerSettings | None = None) -> ReferenceCompletion:
        """Classic decode's answer to ``body`` sent to ``endpoint`` (computed once per distinct request).

        server_prompt_ids / server_prompt_tokens: what the server said about its prompt
          (its ids, its ``usage.prompt_tokens``): checked against the reference's, never used.
        prompt_ids: decode from exactly these ids (an engine that tokenizes on its own,
          e.g. llama-server returning its tokens) instead of the server's tokenize step; the
          count is then checked against ``server_prompt_tokens``, and the harness's own
          tokenization against ``server_prompt_ids`` (``own_prompt``: a finding, not a bar).
        settings: the server's flags for this request (default: the constructor's;
          the chat template must be the constructor's, the tokenizer is loaded once).
        """
        s = self._settings(settings)
        key = request_key(endpoint, body, s, prompt_ids)
        hit = self._cache.get(key)
        if hit is not None:
            self._stats.hits += 1
            out = copy.copy(hit)
        else:
            out = self._compute(key, endpoint, body, s, prompt_ids)
            self._cache[key] = out
            out = copy.copy(out)
        if prompt_ids is None:
            if server_prompt_ids is not None or server_prompt_tokens is not None:
                out.prompt_check = check_prompt(out.prompt_ids, server_prompt_ids, server_prompt_tokens)
            return out
        # decoded from the server's own ids: checking them against themselves proves nothing, so the
        # count is checked against its usage and the harness's own tokenization against its ids
        if server_prompt_tokens is not None:
            out.prompt_check = check_prompt(out.prompt_ids, None, server_prompt_tokens)
        if server_prompt_ids is not None:
            try:
                own = server_prompt(self.tokenizer, endpoint, body, s).ids
            except (UsageError, InfrastructureError) as err:
                out.own_prompt_error = first_line(str(err))
            else:
                out.own_prompt = check_prompt(own, server_prompt_ids)
        return out

    def cold(self, endpoint: str, body: dict[str, Any], settings: ServerSettings | None = None,
             draft_model: str | None = None, prompt_ids: list[int] | None = None, *,
             loop: Callable[[Any, Any, ServerSettings, Any], Any]) -> ColdAnswer:
        """What ``mlx_lm.server``'s own loop answers ``body`` on a fresh prompt cache, with the drafter
        ``draft_model`` (a checkpoint directory, loaded once) where the arm had one.

        The arm's own cold answer for a request the server answered on a warm cache: ``loop`` is
        :class:`specparity.probes.replay.sequence.ServingLoop` (model, tokenizer, settings, drafter;
        given, not imported: the replay builds on this module), run with one entry. A difference
        that is there cold too is not state-dependent. Computed once per distinct request and
        drafter; its cost is counted apart from classic decode's (``ReferenceStats.cold``).
        """
        s = self._settings(settings)
        key = request_key(endpoint, body, s, prompt_ids) + f"|cold|{draft_model}|{body.get('num_draft_tokens')}"
        hit = self._cold.get(key)
        if hit is not None:
            return copy.copy(hit)
        t0 = time.perf_counter()
        draft = None
        if draft_model is not None:
            if draft_model not in self._drafts:
                from specparity.checkpoint import load_checkpoint

                self._drafts[draft_model] = load_checkpoint(draft_model, trust_remote_code=self.trust_remote_code,
                                                            flag="draft").model
            draft = self._drafts[draft_model]
        running = loop(self.model, self.tokenizer, s, draft)
        try:
            served = running.serve(endpoint, body, prompt_ids)
        finally:
            running.close()
        if served.error is not None or served.decoded is None:
            raise UsageError(f"{endpoint} request: mlx_lm.server's loop fails it ({served.error})")
        dec = served.decoded
        out = ColdAnswer(dec.text, list(dec.token_ids), dec.finish_reason, served.path, draft_model,
                         time.perf_counter() - t0)
        self._stats.cold += 1
        self._stats.cold_seconds += out.seconds
        self._stats.cold_tokens += len(out.token_ids)
        self._cold[key] = out
        return copy.copy(out)

    def cost(self) -> ReferenceStats:
        """What the reference has cost so far."""
        return copy.copy(self._stats)

    def forget(self) -> None:
        """Drop every cached answer (a new job on the same loaded model); the cost stays."""
        self._cache.clear()
        self._cold.clear()

    def _settings(self, settings: ServerSettings | None) -> ServerSettings:
        s = settings or self.settings
        if s.tokenizer_key() != self.settings.tokenizer_key():
            raise UsageError("the classic reference was loaded with another chat template: one reference per"
                             " --chat-template / --use-default-chat-template")
        return s

    def _compute(self, key: str, endpoint: str, body: dict[str, Any], settings: ServerSettings,
                 prompt_ids: list[int] | None) -> ReferenceCompletion:
        from specparity.inputs import check_token_ids, vocab_size

        t0 = time.perf_counter()
        vocab = vocab_size(self.loaded)
        params = RequestParams.from_body(body, settings, vocab)
        if prompt_ids is not None:
            ids = [int(t) for t in prompt_ids]
            if not ids:
                raise UsageError("prompt ids: empty")
            prompt = ServerPrompt(ids, [ids], ["assistant"])
        else:
            prompt = server_prompt(self.tokenizer, endpoint, body, settings)
        check_token_ids(prompt.ids, vocab, "the prompt")
        path = PATH_BATCHED if self.batches and batchable(params, settings, self.model) else PATH_SEQUENTIAL
        try:
            dec = decode_classic(self.model, self.tokenizer, prompt, params, settings, path)
        except ValueError as err:  # mlx / mlx-lm refuse the settings (a group size the head does not divide)
            raise UsageError(f"{endpoint} request: classic decode refused it ({first_line(str(err))})") from None
        seconds = time.perf_counter() - t0
        self._stats.computed += 1
        self._stats.seconds += seconds
        self._stats.tokens += len(dec.token_ids)
        self._stats.prompt_tokens += len(prompt.ids)
        segs = [len(s) for s in prompt.segments] if path == PATH_BATCHED else [len(prompt.ids)]
        return ReferenceCompletion(
            key=key, endpoint=endpoint, prompt_ids=list(prompt.ids), token_ids=dec.token_ids, text=dec.text,
            pieces=dec.pieces, logprobs=dec.logprobs, top=dec.top, finish_reason=dec.finish_reason, path=path,
            prefill_segments=segs, deterministic=params.deterministic, params=params.to_dict(),
            settings=settings.to_dict(), reasoning=dec.reasoning, tool_calls=dec.tool_calls, seconds=seconds)


# --- near ties between engines whose arithmetic differs --------------------------------

NEAR_TIE, CONFIDENT, UNKNOWN = "near_tie", "confident", "unknown"
# The noise floor of two engines computing the same network in different orders, per dtype
# of the logits, in nats of top-2 logprob margin (see near_tie).
NOISE_FLOOR = {"float32": 1e-3, "float16": 1e-2, "bfloat16": 6e-2, "quantized": 1e-1}
TIE_ULPS = 8
_MANTISSA = {"float32": 23, "float16": 10, "bfloat16": 7}


def ulp(dtype: str, magnitude: float) -> float:
    """The spacing of ``dtype`` values at ``magnitude`` (float32 for an unknown dtype)."""
    bits = _MANTISSA.get(dtype, 23)
    m = abs(magnitude)
    if m == 0 or not math.isfinite(m):
        return 2.0 ** (-bits)
    return 2.0 ** (math.floor(math.log2(m)) - bits)


@dataclass
class TieCall:
    """How confident a difference between two engines was where their greedy tokens part.

    kind: ``near_tie`` (a side's top-2 margin is inside the arithmetic-noise band: the
      engines' different arithmetic alone can flip it), ``confident`` (both known margins
      are outside it: arithmetic noise cannot explain the flip), ``unknown`` (no margin).
    threshold: the band's width in nats. margin_a / margin_b: each side's top-2 margin.
    dtype: the dtype the band was sized for.
    """

    kind: str
    threshold: float
    margin_a: float | None
    margin_b: float | None
    dtype: str

    def line(self) -> str:
        def fmt(x: float | None) -> str:
            return "n/a" if x is None else f"{x:.4g}"

        if self.kind == UNKNOWN:
            return "no top-2 margin on either side: cannot tell a near tie from a confident difference"
        words = ("a near tie: arithmetic differences between the engines can flip it"
                 if self.kind == NEAR_TIE else "a confident difference: arithmetic noise cannot explain it")
        return (f"{words} (top-2 margins {fmt(self.margin_a)} / {fmt(self.margin_b)} nats,"
                f" near-tie band {self.threshold:.3g} nats for {self.dtype})")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def near_tie(margin_a: float | None, margin_b: float | None, *, dtype: str = "float32",
             logprob: float | None = None, threshold: float | None = None) -> TieCall:
    """Is a greedy difference between two engines a near tie or a confident one?

    The rule: two engines that compute the same network with different kernels
    (reduction order, fused ops, accumulation width) differ in every logprob by a
    few units in the last place of the logits' dtype plus an error accumulated over
    the layers. A flip is explainable by arithmetic alone when a side's top-2 margin
    is inside that band. The band is ``threshold`` when given, else
    ``max(NOISE_FLOOR[dtype], TIE_ULPS * ulp(dtype, logprob))``: NOISE_FLOOR is the
    accumulated error two engines show on the same weights (float32 1e-3, float16
    1e-2, bfloat16 6e-2, quantized weights 0.1 nats), and TIE_ULPS = 8 units in the
    last place at the emitted token's logprob covers the rounding of the logits
    themselves. ``near_tie`` when the smaller known margin is <= the band,
    ``confident`` when every known margin is above it, ``unknown`` without margins.
    Neither kind is a pass: the caller reports both, apart.
    """
    known = [m for m in (margin_a, margin_b) if m is not None]
    band = threshold if threshold is not None else max(
        NOISE_FLOOR.get(dtype, NOISE_FLOOR["float32"]),
        TIE_ULPS * ulp(dtype, logprob if logprob is not None else 1.0))
    if not known:
        return TieCall(UNKNOWN, band, margin_a, margin_b, dtype)
    kind = NEAR_TIE if min(abs(m) for m in known) <= band else CONFIDENT
    return TieCall(kind, band, margin_a, margin_b, dtype)


# --- a worker process: the reference in the interpreter the servers run in ----------------
