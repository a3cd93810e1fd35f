"""What one served request did: engaged or declined, and its rounds.

:class:`SpecStats` is filled by ``specparity serve`` as a request runs and
read three ways, all carrying the same facts:

- one greppable log line per request (:meth:`SpecStats.log_line`)::

    specparity-serve: SPEC request=cmpl-1 rule=greedy-argmax decision=ALLOW width=4
      num_draft_tokens=3 rounds=5 proposed=15 positions_tested=12 accepted=9
      per_position_acceptance=0.7500 acceptance_rate=0.6000 mean_accepted_len=1.800
      accepts=[3,1,2,0,3] widths=[4,4,4,4,4] prompt_ids=[...] tokens=[...]
    specparity-serve: DECLINED request=cmpl-2 width=4 key=1a2b3c4d5e6f reason="divergent: ..."

  (one line each; ``specparity replay --log server.log`` reads the SPEC lines);
- the response's ``speculative`` extension field (:meth:`SpecStats.to_response`):
  when engaged, a ``specparity.accepts/1`` object that ``specparity replay``
  reads as it is (``jq -c .speculative``);
- llama.cpp-style ``timings`` (:meth:`SpecStats.timings`): ``draft_n``,
  ``draft_n_accepted``, ``predicted_n``, ``prompt_n``.

Every response's ``speculative``, whichever path served it, also says what the
prompt cache did (``prompt_cache``: the policy, tokens shared, reused and
prefilled, and why fewer were reused), which of mlx-lm's paths served it
(``path``), and what its tokens promise (``draws``).

A round proposes ``width - 1`` tokens and tests them in order: it stops at its
first rejection, so it tests ``accepted + 1`` positions (all of them on a full
accept, and only the accepted ones on a last round cut by the token budget).
``per_position_acceptance`` is accepted / positions tested; ``acceptance_rate``
is accepted / proposed (vLLM's draft acceptance rate); ``mean_accepted_len``
is accepted / rounds, in the accept vector's units.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from specparity.harness.gated.cancel import GONE
from specparity.probes.replay.logs import SPECPARITY_FORMAT
from specparity.probes.replay.recorder import accepts_from_flags

SPEC_MARKER = "specparity-serve: SPEC"
DECLINED_MARKER = "specparity-serve: DECLINED"
NOT_ENGAGED_MARKER = "specparity-serve: NOT-ENGAGED"
CANCELLED_MARKER = "specparity-serve: CANCELLED"

# The acceptance rule mlx-lm's speculative loop runs, by sampling mode.
RULE_GREEDY = "greedy-argmax"
RULE_SAMPLED = "sampler-match"

# Which of mlx-lm's serving paths ran a request: speculative decoding, classic decode one
# request at a time (a seed, --kv-bits, a drafter, or the re-prefill policy), or its batch loop.
PATH_SPECULATIVE = "speculative"
PATH_SEQUENTIAL = "sequential"
PATH_BATCH = "batch"

# What a response's tokens promise: greedy (temperature 0: classic decode's tokens),
# seeded-classic (classic decode's own draws for that seed), distribution (only classic
# decode's distribution: drafted sampling, or no seed).
DRAWS_GREEDY = "greedy"
DRAWS_SEEDED = "seeded-classic"
DRAWS_DISTRIBUTION = "distribution"


def rule_for(temperature: float) -> str:
    """mlx-lm accepts a proposal when it equals the target's own pick: its argmax at
    temperature 0, a fresh draw from the target's distribution above it."""
    return RULE_GREEDY if temperature == 0 else RULE_SAMPLED


def _ints(values: list[int]) -> str:
    return "[" + ",".join(str(int(v)) for v in values) + "]"


def _at_least(counts: list[int], size: int | None = None) -> list[int]:
    """[how many of ``counts`` exceed i, for i in 0..size-1] (size: the largest count)."""
    size = max(counts, default=0) if size is None else size
    hist = [0] * (size + 1)
    for c in counts:
        hist[min(c, size)] += 1
    out = [0] * size
    above = 0
    for i in range(size - 1, -1, -1):
        above += hist[i + 1]
        out[i] = above
    return out


@dataclass
class SpecStats:
    """One request's speculative facts.

    request_id: the response id (``cmpl-...`` / ``chatcmpl-...``).
    engaged: the drafter ran for this request.
    declined: the gate sent it to classic decode. forfeit: engaged only because
      SPECPARITY_ALLOW_INEXACT=1. decision: ALLOW / DECLINE / FORFEIT, None when
      the gate is off or no drafting was asked for.
    reason: why it was not engaged, or the gate's evidence. gate_key: the memo key (12 hex).
    rule: the acceptance rule that ran (``greedy-argmax`` | ``sampler-match``).
    width: verify rows per round (num_draft_tokens + 1). num_draft_tokens: K asked for.
    max_tokens: the request's token budget.
    prompt_ids: the whole prompt as token ids. tokens: the emitted tokens.
    flags: per emitted token, whether it was an accepted proposal (mlx-lm's from_draft).
    seconds: wall time from the first to the last token.
    prompt_cache: what the prompt cache did (cache.CacheLookup.to_dict()), None before lookup.
    cancelled: where the request stopped because its client left or the server stopped
      (queued | prefill | decode), None when it ran to its end.
    path: which of mlx-lm's paths served it (speculative | sequential | batch), None when
      none started. temperature, seed: the request's sampling temperature and seed.
    """

    request_id: str = ""
    engaged: bool = False
    declined: bool = False
    forfeit: bool = False
    decision: str | None = None
    reason: str = ""
    gate_key: str = ""
    rule: str = RULE_GREEDY
    width: int | None = None
    num_draft_tokens: int | None = None
    max_tokens: int | None = None
    prompt_ids: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    flags: list[bool] = field(default_factory=list)
    seconds: float = 0.0
    prompt_cache: dict[str, Any] | None = None
    cancelled: str | None = None
    path: str | None = None
    temperature: float = 0.0
    seed: int | None = None
    single: bool = False  # served by mlx-lm's _serve_single (else its batch loop)
    finished: bool = False
    _t0: float | None = None
    _summary: tuple[tuple[int, bool], dict[str, Any]] | None = field(default=None, repr=False)
    _rounds: tuple[tuple[Any, ...], tuple[list[int], list[int]]] | None = field(default=None, repr=False)
    gone: threading.Event = field(default_factory=threading.Event, repr=False)
    ctx: Any = field(default=None, repr=False)
    cancel_reason: str = GONE

    def cancel(self, reason: str | None = None) -> None:
        """Stop generating for this request (mlx-lm's own stop flag, and ours for prefill):
        its client left, or the server is stopping."""
        if reason is not None:
            self.cancel_reason = reason
        self.gone.set()
        if self.ctx is not None:
            self.ctx.stop()

    def add(self, token: int, from_draft: bool) -> None:
        if self._t0 is None:
            self._t0 = time.perf_counter()
        self.tokens.append(int(token))
        self.flags.append(bool(from_draft))
        self.seconds = time.perf_counter() - self._t0

    # -- the round algebra -----------------------------------------------------------------
    @property
    def rounds_view(self) -> tuple[list[int], list[int]]:
        """(accepts, widths) per round."""
        if not self.engaged or self.num_draft_tokens is None or self.max_tokens is None:
            return [], []
        # computed once per length: a request's end reads it for its summary, response and log line
        key = (len(self.flags), self.num_draft_tokens, self.max_tokens)
        if self._rounds is None or self._rounds[0] != key:
            self._rounds = (key, accepts_from_flags(self.flags, self.num_draft_tokens, self.max_tokens))
        accepts, widths = self._rounds[1]
        return list(accepts), list(widths)

    def summary(self) -> dict[str, Any]:
        """Counts and rates of the rounds (all zero when not engaged); computed once per length."""
        if self._summary is not None and self._summary[0] == (len(self.flags), self.engaged):
            return self._summary[1]
        out = self._summarize()
        self._summary = ((len(self.flags), self.engaged), out)
        return out

    def _summarize(self) -> dict[str, Any]:
        accepts, widths = self.rounds_view
        complete = sum(1 for f in self.flags if not f)  # rounds that ended in the target's token
        # a round cut by the budget tested only what it accepted; otherwise a rejection at
        # position a was tested too (unless every proposal was accepted): a <= tested always
        tested = [min(a + 1, w - 1) if r < complete else a for r, (a, w) in enumerate(zip(accepts, widths))]
        positions = sum(tested)
        # per position i: the rounds that tested it (tested > i), and that accepted it (a > i)
        tested_at = _at_least(tested)
        accepted_at = _at_least(accepts, len(tested_at))
        accepted = sum(accepts)
        proposed = sum(w - 1 for w in widths)
        return {
            "rounds": len(accepts),
            "proposed": proposed,
            "positions_tested": positions,
            "accepted": accepted,
            "per_position_acceptance": accepted / positions if positions else 0.0,
            "acceptance_rate": accepted / proposed if proposed else 0.0,
            "mean_accepted_len": accepted / len(accepts) if accepts else 0.0,
            "tested_per_position": tested_at,
            "accepted_per_position": accepted_at,
        }

    @property
    def draws(self) -> str:
        """What the tokens promise: mlx-lm's speculative sampling (sampler-match) draws other
        tokens than classic decode with the same seed, from the same distribution."""
        if self.temperature == 0:
            return DRAWS_GREEDY
        if self.engaged or self.seed is None:
            return DRAWS_DISTRIBUTION
        return DRAWS_SEEDED

    # -- the three readers -------------------------------------------------------------------
    def to_response(self) -> dict[str, Any]:
        """The ``speculative`` extension field of a response."""
        accepts, widths = self.rounds_view
        out: dict[str, Any] = {}
        if self.engaged:
            # a specparity.accepts/1 object: `specparity replay` reads it as it is
            out.update({"format": SPECPARITY_FORMAT, "widths": widths, "accepts": accepts})
        out.update({
            "prompt_ids": list(self.prompt_ids),
            "tokens": list(self.tokens),
            "width": self.width,
            "engaged": self.engaged,
            "declined": self.declined,
            "forfeit": self.forfeit,
            "decision": self.decision,
            "rule": self.rule if self.engaged else None,
            "path": self.path,
            "draws": self.draws,
            "num_draft_tokens": self.num_draft_tokens,
            "reason": self.reason,
            "gate_key": self.gate_key,
            "source": "specparity serve",
            "request_id": self.request_id,
            "prompt_cache": self.prompt_cache,
        })
        out.update(self.summary())
        return out

    def timings(self) -> dict[str, Any]:
        """llama.cpp's ``timings`` keys (``draft_n``: proposed, ``draft_n_accepted``: accepted)."""
        s = self.summary()
        return {
            "prompt_n": len(self.prompt_ids),
            "predicted_n": len(self.tokens),
            "predicted_ms": self.seconds * 1000.0,
            "predicted_per_second": len(self.tokens) / self.seconds if self.seconds else 0.0,
            "draft_n": s["proposed"],
            "draft_n_accepted": s["accepted"],
        }

    def cancel_line(self) -> str:
        """The line a request its client left logs."""
        return (f"{CANCELLED_MARKER} request={self.request_id} stage={self.cancelled}"
                f" tokens={len(self.tokens)} max_tokens={self.max_tokens}"
                f" prompt_tokens={len(self.prompt_ids)} path={self.path or '-'} ({self.cancel_reason})")

    def log_line(self) -> str:
        """The request's one greppable line."""
        if self.engaged:
            s = self.summary()
            accepts, widths = self.rounds_view
            return (
                f"{SPEC_MARKER} request={self.request_id} rule={self.rule}"
                f" decision={self.decision or 'GATE-OFF'} width={self.width}"
                f" num_draft_tokens={self.num_draft_tokens} rounds={s['rounds']}"
                f" proposed={s['proposed']} positions_tested={s['positions_tested']}"
                f" accepted={s['accepted']}"
                f" per_position_acceptance={s['per_position_acceptance']:.4f}"
                f" acceptance_rate={s['acceptance_rate']:.4f}"
                f" mean_accepted_len={s['mean_accepted_len']:.3f}"
                f" accepts={_ints(accepts)} widths={_ints(widths)}"
                f" prompt_ids={_ints(self.prompt_ids)} tokens={_ints(self.tokens)}"
            )
        reason = self.reason.replace('"', "'")
        marker = DECLINED_MARKER if self.declined else NOT_ENGAGED_MARKER
        return (f"{marker} request={self.request_id} width={self.width}"
                f" key={self.gate_key or '-'} reason=\"{reason}\"")


class ServeMetrics:
    """Prometheus counters, named as vLLM names them (``/metrics``).

    spec_decode_num_drafts: verify rounds. spec_decode_num_draft_tokens: proposals.
    spec_decode_num_accepted_tokens: accepted proposals.
    spec_decode_num_accepted_tokens_per_pos{position}: accepted proposals at each
    draft position (0-based). specparity_gate_decisions{decision,width}: requests
    the gate allowed, declined or forfeited. specparity_engaged_requests /
    specparity_not_engaged_requests: requests the drafter ran for, or did not.
    specparity_prompt_cache_policy{policy}: 1 for the served model's policy.
    specparity_prompt_cache_lookups{policy,outcome}: prompt-cache lookups by what
    they did (miss | hit | partial | re-prefilled). specparity_prompt_cache_reused_tokens /
    specparity_prompt_cache_reprefilled_tokens{policy}: prompt tokens served from the
    cache, and cached tokens the policy prefilled again.
    specparity_cancelled_requests{stage}: requests stopped because their client left.

    Every label takes a bounded set of values: widths and positions are bounded by
    ``max_width`` (the server refuses wider requests before they reach a counter).
    """

    def __init__(self, max_width: int = 1024) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.max_width = max_width
        self.registry = CollectorRegistry()
        r = self.registry
        self.drafts = Counter("spec_decode_num_drafts", "Speculative verify rounds.", registry=r)
        self.draft_tokens = Counter("spec_decode_num_draft_tokens",
                                    "Draft tokens proposed.", registry=r)
        self.accepted = Counter("spec_decode_num_accepted_tokens",
                                "Draft tokens accepted.", registry=r)
        self.accepted_per_pos = Counter("spec_decode_num_accepted_tokens_per_pos",
                                        "Draft tokens accepted, by draft position.",
                                        ["position"], registry=r)
        self.decisions = Counter("specparity_gate_decisions",
                                 "Requests the exactness gate allowed, declined or forfeited.",
                                 ["decision", "width"], registry=r)
        self.engaged = Counter("specparity_engaged_requests",
                               "Requests served with speculative decoding.", registry=r)
        self.not_engaged = Counter("specparity_not_engaged_requests",
                                   "Requests that asked for drafting and ran classic decode.",
                                   registry=r)
        self.policy = Gauge("specparity_prompt_cache_policy",
                            "1 for the prompt-cache policy of the served model.", ["policy"],
                            registry=r)
        self.lookups = Counter("specparity_prompt_cache_lookups",
                               "Prompt-cache lookups, by policy and what they did.",
                               ["policy", "outcome"], registry=r)
        self.reused = Counter("specparity_prompt_cache_reused_tokens",
                              "Prompt tokens served from the prompt cache.", ["policy"], registry=r)
        self.reprefilled = Counter("specparity_prompt_cache_reprefilled_tokens",
                                   "Cached prompt tokens the policy prefilled again.", ["policy"],
                                   registry=r)
        self.cancelled = Counter("specparity_cancelled_requests",
                                 "Requests stopped because their client left.", ["stage"],
                                 registry=r)

    def set_policy(self, policy: str) -> None:
        from specparity.verdicts import CachePolicy

        for p in CachePolicy:
            self.policy.labels(policy=p.value).set(1 if p.value == policy else 0)

    def _width(self, width: int | None) -> str:
        return str(width) if width is not None and 0 < width <= self.max_width else "other"

    def observe(self, stats: SpecStats) -> None:
        if stats.cancelled is not None:
            self.cancelled.labels(stage=stats.cancelled).inc()
        pc = stats.prompt_cache
        if pc is not None:
            self.lookups.labels(policy=pc["policy"], outcome=pc["outcome"]).inc()
            self.reused.labels(policy=pc["policy"]).inc(pc["reused"])
            self.reprefilled.labels(policy=pc["policy"]).inc(pc["shared"] - pc["reused"])
        if stats.decision is not None:
            self.decisions.labels(decision=stats.decision, width=self._width(stats.width)).inc()
        if not stats.engaged:
            if stats.width is not None:
                self.not_engaged.inc()
            return
        s = stats.summary()
        self.engaged.inc()
        self.drafts.inc(s["rounds"])
        self.draft_tokens.inc(s["proposed"])
        self.accepted.inc(s["accepted"])
        for i, n in enumerate(s["accepted_per_position"][: self.max_width]):
            self.accepted_per_pos.labels(position=str(i)).inc(n)

    def exposition(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST
