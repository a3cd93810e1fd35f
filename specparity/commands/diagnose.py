"""``specparity diagnose``: each finding of a served record, taken to its located cause in process."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from specparity.commands._common import CommandRun, json_option, record_option

if TYPE_CHECKING:
    from specparity.diagnose.findings import Finding
    from specparity.diagnose.tree import ReplayRequest


@click.command()
@click.argument("record", metavar="RECORD|DIR")
@click.option("--finding", "finding", default=None, metavar="ID",
              help="Diagnose only this finding: its request id, arm, ARM/REQUEST or PAIRING/ARM/REQUEST.")
# the findings a diagnosis hands to the pinned environment their servers ran in (specparity.diagnose.elsewhere)
@click.option("--only", "only", multiple=True, hidden=True, metavar="ID")
@json_option
@record_option
def diagnose(record: str, finding: str | None, only: tuple[str, ...], as_json: bool, record_dir: str | None,
             quiet: bool) -> int:
    """Take each finding of a served record to its located cause, in process.

    RECORD is a served record (its .md, data directory or report.json); a
    directory of records gives its newest complete served record. For each
    request judged diverged, the decision tree runs in this process, each
    checkpoint loaded once: (1) the record's reproduction (mlx-lm's
    speculative path rerun and its rounds replayed against classic decode:
    a finding that does not come back lives in the server); (2) prefill
    parity of the prompt; (3) the verify block at the served width and the
    depth where the first difference landed, then the smallest width and
    depth at which it differs; (5) that block bisected to its layer and
    sub-op; (6) that block rerun with each control arm that applies
    (compiled kernels off, KV quantization off, rotating cache off, the
    prompt prefilled in one call) and whether each removes the difference;
    (7) the first difference: an exact tie in the model's dtype, a near tie
    (its margin in ULPs), or neither. Steps 4 (each rollback's state) and 8
    (across releases) are not done in this version, and each says so. A
    length finding (tokens past max_tokens) is
    settled by the record. Every step prints the command that repeats it.

    \b
    Exit codes: 0 nothing to diagnose, 1 findings diagnosed, 2 usage
    (not a served record, no such finding), 4 a checkpoint would not load.

    \b
    Examples:
        specparity diagnose results/served-host-2026-01-01.md   # not tested: a served job's record (docs/diagnose.md)
        specparity diagnose results --finding w4/p0 --json      # not tested: the same (docs/diagnose.md)
    """
    from specparity.diagnose.command_worker import command_workers
    from specparity.diagnose.elsewhere import as_diagnosis, diagnose_elsewhere
    from specparity.diagnose.findings import read_findings
    from specparity.diagnose.tree import DiagnoseReport, Models, diagnose_finding

    where, found = read_findings(record, finding)
    if only:
        found = [f for f in found if f.id in only]
    run = CommandRun("diagnose", f"diagnose: {where.name}", {"record": str(where)}, record_dir, as_json, quiet,
                     slug="diagnose")
    with run:
        report = DiagnoseReport(str(where), finding=finding)
        models = Models()
        away = diagnose_elsewhere(str(where), found)  # those whose servers ran another mlx-lm: there
        with command_workers():  # step 8's reruns: one interpreter per environment for all the findings
            for f in found:
                run.observer.note(f"diagnosing {f.id}")
                d = (as_diagnosis(f, away[f.id]) if f.id in away else
                     diagnose_finding(f, read_reproduction(f), models, read_command))
                report.diagnoses.append(d)
                run.observer.result("diagnoses", d.to_dict())
        return run.finish(report)


def read_reproduction(f: Finding) -> ReplayRequest | None:
    """The finding's reproduction read as ``specparity replay`` reads it (None: not a request replay with a
    drafter, the one kind the tree reruns request by request; a sequence replay is run by the tree itself):
    the command's own options, so the tree reruns what it would."""
    return read_command(f.reproduction) if f.replay_argv() is not None else None


def read_command(command: str | None) -> ReplayRequest | None:
    """A ``specparity replay`` command line read as the request it reruns (None: not a request replay with a
    drafter)."""
    import shlex

    from specparity.diagnose.tree import ReplayRequest
    from specparity.commands._common import cache_options_from, processor_options_from
    from specparity.commands.replay import replay
    from specparity.prompts import parse_prompt_ids

    words = shlex.split(command or "")
    if words[:2] != ["specparity", "replay"]:
        return None
    argv = words[2:]
    from specparity.diagnose.own_loop import engine_named

    if engine_named(argv) is not None:  # another engine's own loop: its own tree (diagnose.own_loop)
        return None
    ctx = replay.make_context("replay", list(argv), resilient_parsing=True)
    p = dict(ctx.params)
    if p.get("draft_model") is None or not p.get("prompt_ids") or p.get("model") is None:
        return None
    stops = list(p["stop_words"]) if (p.get("stop_words") or p.get("stop_at_eos")) else None
    return ReplayRequest(model=p["model"], draft=p["draft_model"], trust_remote_code=bool(p["trust_remote_code"]),
                         num_draft_tokens=int(p["num_draft_tokens"]), max_tokens=int(p["max_tokens"]),
                         stop_words=stops, prompt_ids=parse_prompt_ids(list(p["prompt_ids"]))[0],
                         opts=cache_options_from(p), processors=processor_options_from(p))
