"""Reproductions: the in-process command that reproduces a served finding, or why there is none.

A request that left classic decode gets one of:

- the first request its server received: ``specparity replay`` of that one
  request on a fresh cache, every request parameter carried (prompt ids as the
  server tokenized them, penalties, logit_bias, stop words, max tokens, the
  server's cache flags) and, for an arm with a drafter, mlx-lm's own
  speculative path rerun (probes.replay.sequence.request_command);
- a later request: the server's whole request sequence up to it written as a
  sequence file and ``specparity replay --sequence FILE``, which rebuilds the
  serving loop's prompt cache in process (sequence_reproduction);
- neither: the reason in one line (another engine's serving loop, concurrent
  requests, sampling without a seed, a run that keeps no files).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specparity.harness.client import Completion, Request
from specparity.harness.plan import ArmPlan


@dataclass
class Sent:
    """One request as a server received it: the request, the fields the arm added, the answer."""

    request: Request
    fields: dict[str, Any]
    completion: Completion

    def body(self) -> dict[str, Any]:
        return {**self.request.body, **self.fields}


@dataclass
class ServerHistory:
    """Everything one server process received, in order (a shared server serves several arms)."""

    argv: list[str]
    sent: list[Sent] = field(default_factory=list)


def reproduce(history: ServerHistory, index: int, plan: ArmPlan, *, model: str, draft: str | None,
              trust_remote_code: bool, engine: str, engine_version: str | None, token_index: int | None,
              prompt_ids: list[int] | None, accepts: list[int], folder: Path | None) -> dict[str, Any]:
    """How to reproduce the finding on ``history.sent[index]`` (``Reproduction.to_dict()``).

    model / draft: the original checkpoints (no witness wrapper). folder: where a sequence
    file may be written (None: the run keeps no files, so a sequence cannot be replayed later).
    """
    from specparity.harness.reference import ServerSettings
    from specparity.probes.replay.sequence import (
        Reproduction, SequenceEntry, SequenceHeader, request_command, sequence_reproduction,
    )

    settings = ServerSettings.from_argv([str(a) for a in history.argv])
    this = history.sent[index]
    if index == 0 and engine == "mlx-lm" and not plan.concurrency:
        if prompt_ids is None:
            return Reproduction(reason="no prompt token ids for this request").to_dict()
        return request_command(model, this.body(), prompt_ids, draft_model=draft if plan.drafts else None,
                               settings=settings, trust_remote_code=trust_remote_code,
                               accepts=accepts or None, width=plan.width.rows if plan.width else None).to_dict()
    header = SequenceHeader(model=model, draft_model=draft if plan.drafts else None,
                            trust_remote_code=trust_remote_code, server=settings.to_dict(), engine=engine,
                            engine_version=engine_version, arm=plan.name,
                            finding={"request": this.request.id, "token_index": token_index},
                            concurrent=bool(plan.concurrency))
    entries = [SequenceEntry(s.request.id, s.request.endpoint, s.body(), kind=s.request.kind,
                             served={"token_ids": s.completion.token_ids, "text": s.completion.text,
                                     "finish_reason": s.completion.finish_reason, "usage": s.completion.usage})
               for s in history.sent[:index + 1]]
    if folder is None:
        from specparity.probes.replay.sequence import not_reproducible

        why = not_reproducible(header, entries)
        return Reproduction(reason=why or "the run keeps no files (pass --record-dir): the sequence file"
                                          " this finding replays would not outlive it").to_dict()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"sequence-{plan.name}-{this.request.id}.jsonl"
    return sequence_reproduction(path, header, entries, overwrite=True).to_dict()
