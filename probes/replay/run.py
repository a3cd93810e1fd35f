"""The replay run: every request of a log (or a recorded vector) replayed, as one report.

``run_replays`` is what ``specparity replay`` calls: it picks each request's
prompt and widths (the user's flags win over the log's, a contradiction is a
usage error), replays it against the classic chain, adds the offline
round-algebra findings, and returns one :class:`ReplayRun` under the verdict
contract.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from specparity.errors import Inconclusive, InputError, Name, UsageError
from specparity.progress import NULL, Observer
from specparity.verdicts import ReportMixin, Verdict, combine

log = logging.getLogger(__name__)


@dataclass
class ReplayRun(ReportMixin):
    """Every replayed request and the round-algebra findings.

    header: model, dtype, fingerprint and cache options, one line.
    results: one dict per request (its replay report's to_dict, or not_run with the reason).
    texts: the human lines per request. findings: round-algebra findings (replay.algebra.AlgebraFinding).
    """

    header: str
    results: list[dict[str, Any]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    findings: list[Any] = field(default_factory=list)
    model: dict[str, Any] = field(default_factory=dict)
    cache: dict[str, Any] = field(default_factory=dict)
    processors: dict[str, Any] = field(default_factory=dict)

    @property
    def verdict(self) -> Verdict:
        parts = [r["verdict"] for r in self.results]
        if self.findings:
            parts.append(Verdict.DIVERGENT)
        return combine(parts)

    def lines(self) -> list[str]:
        return [self.header, *self.texts]

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "exit_code": self.exit_code, "model": self.model,
                "cache": self.cache, "processors": self.processors, "requests": self.results,
                "algebra": [f.to_dict() for f in self.findings]}


def prompt_for(req: Any, tokenizer: Any, cli_ids: list[int] | None, prompt_text: str | None) -> list[int]:
    """--prompt-ids, else --prompt, else the log's prompt ids, else the first default prompt."""
    from specparity.prompts import DEFAULT_PROMPTS, encode_prompts

    if cli_ids is not None:
        if req.prompt_ids is not None and req.prompt_ids != cli_ids:
            log.warning("%s: --prompt-ids replaces the logged prompt", req.source)
        return cli_ids
    if prompt_text is not None:
        if req.prompt_ids is not None:
            log.warning("%s: --prompt replaces the logged prompt", req.source)
        return encode_prompts(tokenizer, [prompt_text])[0]
    if req.prompt_ids is not None:
        return req.prompt_ids
    return encode_prompts(tokenizer, [DEFAULT_PROMPTS[0]])[0]


def widths_for(req: Any, width: int | None) -> tuple[int | None, list[int] | None]:
    """The log's width(s), else ``width``; a ``width`` that contradicts the log is an error."""
    if req.width is None and req.widths is None:
        if width is None:
            raise UsageError(f"{req.source}: the log gives no width; pass ", Name("width"), " (verify rows)")
        return width, None
    if width is not None and width != req.width:
        said = f"width {req.width}" if req.width is not None else "a width per round"
        raise InputError("width", f"{width}: {req.source} says {said}")
    return req.width, req.widths


def run_replays(engine: Any, requests: list[Any], findings: list[Any],
                cli_ids: list[int] | None = None, prompt_text: str | None = None,
                width: int | None = None, policy: str = "wrong-id", wrong_id: int = 0,
                observer: Observer = NULL, processors: Any = None, state: bool = False) -> ReplayRun:
    """Replay each request through ``engine``'s adapter against classic decode; one ReplayRun for them all.

    ``engine``: an adapter (:class:`specparity.probes.engines.base.Engine`) with the replay core's features,
    its target loaded by the toolkit's loader (:meth:`Engine.checkpoint`) and its cache options.
    ``processors``: ``ProcessorOptions`` applied to the classic reference and every
    verify row as classic decode applies them (None: no processors). ``state``: every layer's whole cache
    after every round also compared with classic decode's (``replay --state``).
    """
    from specparity.checkpoint import model_dtype
    from specparity.probes.replay.core import replay_rounds

    from specparity.processors import ProcessorOptions, check_vocab

    loaded, opts = engine.checkpoint(), engine.cache_options()
    procs = processors or ProcessorOptions()
    vocab = getattr(getattr(loaded.model, "args", None), "vocab_size", None)
    if isinstance(vocab, int):
        check_vocab(procs, vocab)
    made = procs.make()
    fp = loaded.fingerprint
    run = ReplayRun(header=(f"model {fp.path} ({fp.model_type}, {model_dtype(loaded.model)},"
                            f" fingerprint {fp.short}); cache: {opts.describe()}"
                            + (f"; logits processors: {procs.describe()}" if procs.active else "")),
                    findings=list(findings), model=fp.to_dict(), cache=opts.to_dict(),
                    processors=procs.to_dict())
    with observer.part("requests", total=len(requests)):
        for i, req in enumerate(requests):
            prompt = prompt_for(req, loaded.tokenizer, cli_ids, prompt_text)
            w, ws = widths_for(req, width)
            observer.note(f"replaying {req.source}: {len(req.accepts)} rounds")
            try:
                report = replay_rounds(engine, prompt, req.accepts, width=w, widths=ws, policy=policy,
                                       wrong_id=wrong_id, served_tokens=req.tokens,
                                       prefill_emits=req.prefill_emits, observer=observer, processors=made,
                                       state=state)
            except Inconclusive as err:
                res = {"request": i, "source": req.source, "verdict": Verdict.NOT_RUN, "reason": str(err)}
                run.texts.append(f"{req.source}: not run: {err}")
            else:
                res = {"request": i, "source": req.source, **report.to_dict()}
                prefix = f"{req.source}: " if len(requests) > 1 else ""
                run.texts.append("\n".join(prefix + line if j == 0 else "  " + line
                                           for j, line in enumerate(report.lines())))
            run.results.append(res)
            observer.item("requests")
            observer.result("replay", res)
    for f in run.findings:
        run.texts.append(f"round algebra: line {f.line} (request {f.request}, round {f.round}):"
                         f" {f.check}: {f.message}")
        observer.result("algebra", f.to_dict())
    return run


@dataclass
class AlgebraRun(ReportMixin):
    """``replay --algebra-only``: the offline round-algebra checks of transcripts, no model.

    requests / rounds: what was checked. findings: replay.algebra.AlgebraFinding, one per broken rule.
    """

    requests: int
    rounds: int
    findings: list[Any] = field(default_factory=list)

    @property
    def verdict(self) -> Verdict:
        return Verdict.DIVERGENT if self.findings else Verdict.EQUAL

    def lines(self) -> list[str]:
        head = (f"{self.requests} requests, {self.rounds} rounds: "
                + (f"{len(self.findings)} round-algebra findings" if self.findings else "round algebra holds"))
        return [head] + [f"  line {f.line} (request {f.request}, round {f.round}): {f.check}: {f.message}"
                         for f in self.findings]

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "exit_code": self.exit_code, "requests": self.requests,
                "rounds": self.rounds, "findings": [f.to_dict() for f in self.findings]}
