"""Reproductions: the in-process command that reproduces a served finding, or why there is none.

Every request that left its reference (classic decode, or baseline-start where
classic decode does not decide) gets one, decided by the serving loop its
server runs (the profile's ``loop`` key, inherited by ``extends``), never by
the profile's name:

- ``mlx_lm.server`` (the loop specparity.mlx_server.ServingLoop rebuilds):
  the first request a drafter server received replays alone on a fresh cache,
  mlx-lm's own speculative path rerun, ``specparity replay --draft-model ...
  --prompt-ids ...`` with every request parameter carried (prompt ids as the
  server tokenized them, penalties, logit_bias, stop words, max tokens, the
  server's cache flags: probes.replay.sequence.request_command); any other
  request (a later one, a drafter-less server's, one without prompt ids where
  no classic reference ran) replays the server's whole request sequence up to
  it, written as a sequence file, ``specparity replay --sequence FILE``, which
  rebuilds the serving loop and its prompt cache in process
  (sequence_reproduction);
- ``specparity-serve``: mlx_lm.server with its prompt cache and its processors'
  history fixed, so no replay of mlx_lm.server's loop stands for it. Only the
  first request of a drafter arm whose request has no logits processors replays
  (its drafter path on a fresh cache is then mlx-lm's own speculative path);
  anything else says why not;
- another loop: the engine module's ``reproduction`` hook (dflash-mlx: its own
  loop in process for a first request), else the reason in one line.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from specparity.harness.client import Completion, Request
from specparity.engines import ServedHooks
from specparity.harness.plan import ArmPlan

SPECPARITY_SERVE_LOOP = "specparity-serve"


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


@dataclass
class Finding:
    """What a reproduction needs to know of the finding and the server that made it.

    engine / loop / engine_hooks: the profile's name, its serving loop and its engine module.
    engine_version: the server's version line. token_index: where the answer left its reference.
    prompt_ids: the prompt as the server tokenized it (None: unknown). declined: the server
    sent the request to its classic path. other_mlx_lm: why a replay in this interpreter is not
    the server's (it ran another mlx-lm, in a pinned environment), None when it is. environment: that pinned
    environment as ``--environment`` takes it (its name, or its YAML file's absolute path): the replay runs
    there, on the server's own mlx-lm (None: no replay is printed, ``other_mlx_lm`` says why).
    """

    engine: str
    loop: str | None
    engine_hooks: ServedHooks
    engine_version: str | None = None
    token_index: int | None = None
    prompt_ids: list[int] | None = None
    declined: bool = False
    other_mlx_lm: str | None = None
    environment: str | None = None


def reproduce(history: ServerHistory, index: int, plan: ArmPlan, finding: Finding, *, model: str,
              draft: str | None, trust_remote_code: bool, folder: Path | None) -> dict[str, Any]:
    """How to reproduce the finding on ``history.sent[index]`` (``Reproduction.to_dict()``).

    model / draft: the original checkpoints (no witness wrapper). folder: where a sequence
    file may be written (None: the run keeps no files, so a sequence cannot be replayed later).
    """
    from specparity.engine_env import with_environment
    from specparity.mlx_server import ServerSettings
    from specparity.probes.replay.sequence import LOOP, Reproduction, request_command

    settings = ServerSettings.from_argv([str(a) for a in history.argv])
    this = history.sent[index]
    drafter = draft if plan.drafts else None
    width = plan.width.rows if plan.width else None
    first = index == 0 and not plan.concurrency
    if finding.loop in (LOOP, SPECPARITY_SERVE_LOOP) and finding.other_mlx_lm:
        if finding.environment is None:
            return Reproduction(reason=finding.other_mlx_lm).to_dict()
        # the same replay, run in the server's own environment (its mlx-lm rebuilds its own loop there)
        got = reproduce(history, index, plan, replace(finding, other_mlx_lm=None, environment=None), model=model,
                        draft=draft, trust_remote_code=trust_remote_code, folder=folder)
        if got.get("command"):
            got["command"] = with_environment(got["command"], finding.environment)
        return got
    if finding.loop == LOOP:
        if first and drafter is not None and finding.prompt_ids is not None:
            return request_command(model, this.body(), finding.prompt_ids, draft_model=drafter, settings=settings,
                                   trust_remote_code=trust_remote_code).to_dict()
        return _sequence(history, index, plan, finding, model, drafter, trust_remote_code, settings, folder)
    if finding.loop == SPECPARITY_SERVE_LOOP:
        why = _specparity_serve_why_not(this.body(), settings, drafter, first, finding)
        if why is not None:
            return Reproduction(reason=why).to_dict()
        assert finding.prompt_ids is not None
        return request_command(model, this.body(), finding.prompt_ids, draft_model=drafter, settings=settings,
                               trust_remote_code=trust_remote_code, width=width).to_dict()
    found = finding.engine_hooks.reproduction(model=model, draft=drafter, body=this.body(),
                                              prompt_ids=finding.prompt_ids, width=width, first=first)
    if found is not None:
        return found
    return Reproduction(reason=f"{finding.engine} runs the serving loop {finding.loop or '(unknown)'}: no"
                               " in-process replay rebuilds it").to_dict()


def _specparity_serve_why_not(body: dict[str, Any], settings: Any, drafter: str | None, first: bool,
                              finding: Finding) -> str | None:
    """Why no command reproduces this specparity-serve finding (None: mlx-lm's speculative path on a
    fresh cache is this server's path for it)."""
    from specparity.errors import UsageError
    from specparity.mlx_server import RequestParams

    if not first:
        return ("specparity-serve's prompt cache and its processors' history are not mlx_lm.server's (it"
                " fixes their bugs): a replay of mlx_lm.server's loop would not be this server's, and no"
                " replay rebuilds its own")
    if drafter is None:
        return "a request specparity-serve served without a drafter: there is no drafter path to rerun"
    if finding.declined:
        return "specparity-serve's gate sent this request to its classic path: there is no drafter path to rerun"
    if finding.prompt_ids is None:
        return "no prompt token ids for this request (no classic reference ran)"
    try:
        params = RequestParams.from_body(body, settings)
    except UsageError as err:
        return str(err)
    if params.repetition_penalty or params.presence_penalty or params.frequency_penalty or params.logit_bias:
        return ("specparity-serve hands its logits processors the whole history; mlx-lm's speculative path,"
                " which the replay reruns, hands them the last prompt token only: it would not be this"
                " server's path")
    return None


def _sequence(history: ServerHistory, index: int, plan: ArmPlan, finding: Finding, model: str, drafter: str | None,
              trust_remote_code: bool, settings: Any, folder: Path | None) -> dict[str, Any]:
    """The server's sequence up to ``index`` as a sequence file and its replay command (or why not)."""
    from specparity.probes.replay.sequence import (
        Reproduction, SequenceEntry, SequenceHeader, not_reproducible, sequence_reproduction,
    )

    this = history.sent[index]
    header = SequenceHeader(model=model, draft_model=drafter, trust_remote_code=trust_remote_code,
                            server=settings.to_dict(), engine=finding.engine, engine_version=finding.engine_version,
                            arm=plan.name, finding={"request": this.request.id, "token_index": finding.token_index},
                            concurrent=bool(plan.concurrency), loop=finding.loop)
    entries = [SequenceEntry(s.request.id, s.request.endpoint, s.body(), kind=s.request.kind,
                             served={"token_ids": s.completion.token_ids, "text": s.completion.text,
                                     "finish_reason": s.completion.finish_reason, "usage": s.completion.usage})
               for s in history.sent[:index + 1]]
    if folder is None:
        why = not_reproducible(header, entries)
        return Reproduction(reason=why or "the run keeps no files (pass --record-dir): the sequence file"
                                          " this finding replays would not outlive it").to_dict()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"sequence-{plan.name}-{this.request.id}.jsonl"
    return sequence_reproduction(path, header, entries, overwrite=True).to_dict()
