"""Classic decode computed in process for a served request: the reference every served arm is judged by.

For one request (endpoint + JSON body, as sent to an OpenAI-style server)
:class:`ClassicReference` computes what a fresh, drafter-less ``mlx_lm.server``
of mlx-lm 0.32 returns for it, on the same weights, in this process:

Each part below is :mod:`specparity.mlx_server`'s rebuild of the server (the one
the sequence replay and ``specparity serve`` use too); this module adds the
request cache, the checks against what the server reported, and the answer's record.

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

from specparity.completions import Side, first_index, other_texts
from specparity.errors import InfrastructureError, UsageError, first_line
from specparity.mlx_server import (
    PATH_BATCHED, PATH_SEQUENTIAL, RequestParams, ServerPrompt, ServerSettings, ServingLoop, batchable,
    decode_classic, server_prompt,
)

log = logging.getLogger(__name__)

# body fields that never change what the server generates (how it is delivered, which
# drafter, which model name): left out of the canonical request key
_DELIVERY_FIELDS = ("stream", "stream_options", "logprobs", "top_logprobs", "num_draft_tokens",
                    "draft_model", "model", "user", "n")
_CONTEXT_TOKENS = 6


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
    texts: its token ids turned into text the other known ways, by how
      (:func:`specparity.completions.other_texts`): a server that gives text only and wrote one of
      these emitted classic decode's ids, detokenized otherwise.
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
    texts: dict[str, str] = field(default_factory=dict)

    def side(self, name: str = "classic decode") -> Side:
        """This completion as one side of :func:`specparity.completions.first_difference`."""
        return Side(name, self.text, list(self.token_ids), list(self.logprobs),
                    [list(t) for t in self.top], dict(self.texts))

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
             loop: Callable[[Any, Any, ServerSettings, Any], Any] = ServingLoop) -> ColdAnswer:
        """What ``mlx_lm.server``'s own loop answers ``body`` on a fresh prompt cache, with the drafter
        ``draft_model`` (a checkpoint directory, loaded once) where the arm had one.

        The arm's own cold answer for a request the server answered on a warm cache: ``loop``
        (model, tokenizer, settings, drafter; :class:`specparity.mlx_server.ServingLoop`, the
        rebuilt server's loop) run with one entry. A difference
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
            settings=settings.to_dict(), reasoning=dec.reasoning, tool_calls=dec.tool_calls, seconds=seconds,
            # a plain completion's text is its ids' text: the other ways of writing them tell a server's
            # detokenizer from a token divergence (a chat message's text went through the server's parser)
            texts=other_texts(self.tokenizer, dec.token_ids) if endpoint == "completions" and not dec.reasoning
            and not dec.tool_calls else {})


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
