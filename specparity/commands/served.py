"""``specparity served``: served greedy parity across widths, by completion sha256."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from specparity.commands._common import CommandRun, json_option, memory_limit_callback, record_option
from specparity.errors import SpecparityError
from specparity.harness.profiles import packaged_profiles
from specparity.inputs import parse_int_list

if TYPE_CHECKING:
    from specparity.harness.config import Job
    from specparity.harness.results import ArmResult, PairingResult, ServedReport
    from specparity.harness.shard import Shard

# The library's names of inputs (Overrides fields) -> the flag that sets each: library errors name
# the field, this command the flag.
FLAGS = {"model": "--model", "draft_model": "--draft-model", "profile": "--profile", "widths": "--widths",
         "environment": "--environment", "max_tokens": "--max-tokens", "concurrency": "--concurrency",
         "repeats": "--repeats", "start_timeout": "--start-timeout", "request_timeout": "--request-timeout",
         "width_mode": "--width-mode", "temperature": "--temperature / --dist-requests / --dist-prefix",
         "shard": "--shard"}


@click.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Job YAML (default: the built-in job on the embedded fixture pair).")
@click.option("--model", default=None, metavar="DIR|REPO",
              help="Target checkpoint, a directory or a hub id (one pairing instead of the job's).")
@click.option("--draft-model", default=None, metavar="DIR|REPO", help="Drafter checkpoint for --model.")
@click.option("--profile", default=None, metavar="NAME|FILE",
              help=f"Server profile for every pairing: {', '.join(packaged_profiles())}, or a YAML file.")
@click.option("--trust-remote-code", is_flag=True, help="Let the servers run --model's model_file.")
@click.option("--environment", default=None, metavar="NAME|FILE",
              help="Run every pairing's servers in this pinned environment (specparity env list),"
                   " e.g. mlx-lm-0.31.3.")
@click.option("--widths", default=None, help="Verify rows, e.g. 2,3,4 or 2-8 (mlx-lm: num_draft_tokens + 1).")
@click.option("--width-mode", type=click.Choice(["process", "request"]), default=None,
              help="A server per width, or one drafter server with the width per request.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=None, help="Tokens per completion.")
@click.option("--concurrency", type=click.IntRange(min=0), default=None,
              help="Also send the sequence N requests at once (0: off).")
@click.option("--repeats", type=click.IntRange(min=0), default=None, help="Extra baseline processes.")
@click.option("--start-timeout", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Seconds a server may take to become ready.")
@click.option("--request-timeout", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Seconds every request may take (default: each request's limit derived from what the job"
                   " measured: its time alone on a drafter-less server, x the arm's concurrency and verify rows, x4,"
                   " at least 120 s).")
@click.option("--shard", "shard_spec", default=None, metavar="I/N",
              help="Run shard I of N: every N-th non-baseline arm, with the baselines it needs"
                   " (join the records with `specparity records merge`).")
@click.option("--temperature", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Also run the distribution arms at this temperature (seeded draws with and without the drafter).")
@click.option("--dist-requests", type=click.IntRange(min=50), default=None,
              help="Draws per distribution arm (default 600; implies the distribution arms).")
@click.option("--dist-prefix", type=click.IntRange(min=1, max=4), default=None,
              help="Tokens per draw: the histogram is over the emitted k-prefix (default 1).")
@click.option("--no-reference", "no_reference", is_flag=True,
              help="Judge against the drafter-less server only, not against classic decode computed in process.")
@click.option("--reference-beside", is_flag=True,
              help="Keep the classic reference loaded beside the servers (faster judging, a second copy of"
                   " the target in memory). Default: it runs only while no server is resident.")
@click.option("--memory-limit", default=None, metavar="SIZE", callback=memory_limit_callback,
              help="The memory the job may use, e.g. 16GB (default: $SPECPARITY_MEMORY_LIMIT, else what the"
                   " machine has available; 'off': no check). A job expected to need more is refused.")
@click.option("--diagnose", "diagnose", is_flag=True,
              help="After the job, its servers gone, diagnose each finding in process (specparity diagnose) and"
                   " write each diagnosis into the record beside it; one an earlier record in --record-dir"
                   " diagnosed is copied, not re-run. Needs --record-dir.")
@click.option("--diagnoses-from", "diagnoses_from", multiple=True, metavar="RECORD",
              help="With --diagnose: a served record elsewhere (last night's) whose diagnoses are copied, not"
                   " re-run, for the same findings, as an earlier record in --record-dir's are. Repeatable.")
@json_option
@record_option
def served(config_path: str | None, model: str | None, draft_model: str | None, profile: str | None,
           trust_remote_code: bool, environment: str | None, widths: str | None, width_mode: str | None,
           max_tokens: int | None,
           concurrency: int | None, repeats: int | None, start_timeout: float | None,
           request_timeout: float | None, shard_spec: str | None, temperature: float | None,
           dist_requests: int | None, dist_prefix: int | None, no_reference: bool, reference_beside: bool,
           memory_limit: str | None, diagnose: bool, diagnoses_from: tuple[str, ...], quiet: bool, as_json: bool,
           record_dir: str | None) -> int:
    """Spawn servers with and without a drafter across widths; judge every completion against classic decode.

    Each arm (baseline at the start, one per width, the target drafting for
    itself, the sequence sent concurrently, env controls, baseline at the end)
    is its own server on 127.0.0.1, sent the same request sequence: a fresh
    request, the same again, a shared prefix, a streamed one, a multi-turn chat.
    Every completion, baselines' included, is compared with classic decode
    computed in process for that request (the server's own tokenization,
    sampler and logits processors over the whole history), with the first
    baseline's, and a repeated request with its own first answer. Verdicts per
    arm and request: match (classic decode's text, and the drafter is
    witnessed), diverged (first differing token and character, snippets,
    logprobs and top-2 margins, and a command that reproduces it in process),
    declined, not_engaged (no evidence the drafter ran: never a pass), error.
    Findings say whom a difference concerns: every server of the engine, only
    with the drafter, only on a warm cache. Baselines that disagree make the
    pairing inconclusive.

    With --temperature (or the job's distribution key) two more servers per
    pairing take many seeded draws at that temperature, without and with the
    drafter: their first-token (or --dist-prefix) histograms are compared by a
    chi-square homogeneity test, and against the exact law when the target is a
    constant-logits fixture. Known-wrong controls (the same server at half the
    temperature, simulated near misses and wrong acceptance rules) must be
    rejected, or the arm is inconclusive; a pass states the smallest TV it
    detects with 99% power.

    Memory: servers run one at a time, and the classic reference's worker is
    loaded only while no server is (each arm is judged once its server has
    stopped), so a job needs about its largest server plus the harness; the
    record states each server's and each reference worker's peak RSS and the
    job's peak over all its processes. --reference-beside keeps the worker
    loaded beside the servers (faster, a second copy of the target). Before
    anything starts, the job states the memory it expects (weights, drafter,
    reference, KV at its lengths) and is refused (exit 4) when the machine has
    less available (--memory-limit or SPECPARITY_MEMORY_LIMIT sets the limit).

    Time: classic decode answers every request whose text does not depend on
    a server's answer before the first server starts. A request's time limit
    follows what the job measured (that request's time alone on a drafter-less
    server, or classic decode's, times the arm's concurrency and, where it
    drafts, its verify rows, times 4, at least 120 s); --request-timeout sets
    one limit for every request. The record states each arm's limits and where
    the job's time went (server start-up, generation, the reference's load and
    decode, the rest).

    \b
    Exit codes: 0 all match, 1 diverged, 2 usage, 3 inconclusive / not engaged /
    declined, 4 a server would not start, a request failed, or the job would not fit in memory.

    \b
    Examples:
        specparity served                                   # exit 1: the built-in job (mlx_lm.server)
        specparity fixtures make ./fx                       # a pair to try: ./fx/target, ./fx/draft
        specparity served --model ./fx/target --draft-model ./fx/draft --widths 2,4,8     # exit 1
        specparity served --model mlx-community/Qwen3-0.6B-4bit --draft-model ./fx/draft  # not tested: hub
        specparity served --config examples/nightly.yaml --record-dir results --json --quiet   # exit 1
        specparity served --environment mlx-lm-0.31.3       # exit 1: every server in a pinned environment
    """
    from specparity.harness.config import Overrides, apply_overrides, load_job
    from specparity.harness.memory import served_budget

    if profile is not None and environment is not None and profile not in packaged_profiles() \
            and not profile.endswith((".yaml", ".yml")):
        # a profile of an engine installed in that environment only: the whole job runs there, with its hooks
        from specparity.commands._engine import follow_into_environment

        return follow_into_environment(profile, "profile", environment)
    from specparity.harness.shard import parse_shard
    from specparity.records.served import served_identity

    try:
        if diagnose and record_dir is None:
            from specparity.errors import UsageError

            raise UsageError("--diagnose writes each diagnosis into the job's record: give --record-dir")
        _check_diagnoses_from(diagnoses_from, diagnose)
        shard = parse_shard(shard_spec) if shard_spec is not None else None
        overrides = Overrides(
            model=model, draft_model=draft_model, profile=profile, trust_remote_code=trust_remote_code,
            environment=environment,
            widths=parse_int_list(widths, "--widths", minimum=2, limit="max_width") if widths is not None else None,
            width_mode=width_mode, max_tokens=max_tokens, concurrency=concurrency, repeats=repeats,
            start_timeout=start_timeout, request_timeout=request_timeout, temperature=temperature,
            dist_requests=dist_requests, dist_prefix=dist_prefix, reference=False if no_reference else None,
            reference_beside=True if reference_beside else None)
        job = apply_overrides(load_job(config_path) if config_path else None, overrides)
        # consent before anything starts: no server, reference or export runs a checkpoint's code unasked
        from specparity.engines import require_consent

        for p in job.pairings:
            where = "--model" if config_path is None else f"pairing {p.name}: target"
            require_consent([(where, p.target),
                             ("--draft-model" if config_path is None else f"pairing {p.name}: draft", p.draft)],
                            p.trust_remote_code, toolkit_code_ok=True)
        budget = served_budget(job, memory_limit).check()  # refused before the record opens and any server starts
    except SpecparityError as err:
        raise err.flagged(FLAGS) from err
    if config_path is None and model is None and not quiet and not as_json:
        from specparity.harness.config import EMBEDDED_PAIRING

        first = job.pairings[0]
        on = ("the embedded pair" if first.name == EMBEDDED_PAIRING
              else f"the default fixture of {first.profile}'s engine")
        click.echo(f"using the built-in job on {on} {first.target}", err=True)
    if not quiet and not as_json:
        from specparity.harness.limits import plan_line

        click.echo(budget.line(), err=True)
        click.echo(plan_line(job.request_timeout), err=True)
    title = f"served: {', '.join(p.name for p in job.pairings)} ({job.source} job)"
    slug = "served" if shard is None else f"served-shard{shard.index}of{shard.count}"
    cmd = CommandRun("served", title, served_identity(job), record_dir, as_json, quiet, slug=slug)
    with cmd:
        return cmd.finish(*_run(cmd, job, shard, memory_limit),
                          after=(lambda path: _diagnose(cmd, path, diagnoses_from)) if diagnose else None)


def _check_diagnoses_from(records: tuple[str, ...], diagnose: bool) -> None:
    """``--diagnoses-from``: each a served record whose diagnoses can be read, and only with --diagnose; checked
    before the job starts."""
    from specparity.errors import UsageError
    from specparity.records.served import KIND, read_diagnoses

    if records and not diagnose:
        raise UsageError("--diagnoses-from: only with --diagnose (it says which diagnoses to copy)")
    for md in records:
        try:
            rec, _ = read_diagnoses(md)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            import os

            what = "not a record" if os.path.exists(md) else "no such record"
            raise UsageError(f"--diagnoses-from {md}: {what}") from None
        except (OSError, UsageError) as err:
            raise UsageError(f"--diagnoses-from {md}: {err}") from None
        if rec.kind != KIND:
            raise UsageError(f"--diagnoses-from {md}: a {rec.kind} record, not a served one")


def _diagnose(cmd: CommandRun, path: object, also: tuple[str, ...] = ()) -> tuple[list[str], dict[str, object]]:
    """``--diagnose``: the record just closed, diagnosed into itself (specparity.diagnose.record)."""
    from specparity.commands.diagnose import read_command, read_reproduction
    from specparity.diagnose.record import diagnose_record

    if path is None:
        return [], {}
    done = diagnose_record(str(path), read_reproduction, note=cmd.observer.note, read=read_command, also=also)
    return done.lines(), {"diagnoses": done.to_dict()}


def _run(cmd: CommandRun, job: Job, shard: Shard | None,
         memory_limit: str | None = None) -> tuple[ServedReport, None, list[str]]:
    """The one library call: run the job into the record; (report, text lines, record body)."""
    from specparity.harness.run import ServedRun
    from specparity.records.served import SERVERS_DIR, served_markdown, write_arm

    sink = cmd.sink
    workdir = sink.writer.data_dir / SERVERS_DIR if sink.writer is not None else None

    def on_arm(pairing: PairingResult, arm: ArmResult) -> None:
        write_arm(cmd.observer.result, pairing.name, arm)
        sink.timing(f"{pairing.name}/{arm.name}", arm.seconds)

    report = ServedRun(job, workdir=workdir, on_arm=on_arm, observer=cmd.observer, shard=shard,
                       memory_limit=memory_limit).run()
    return report, None, served_markdown(report, sink)
