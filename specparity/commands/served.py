"""``specparity served``: served greedy parity across widths, by completion sha256."""

from __future__ import annotations

from typing import Any

import click

from specparity.commands._common import CommandRun, json_option, record_option, resolve_path
from specparity.errors import SpecparityError, UsageError
from specparity.inputs import parse_int_list

# Overrides field -> the flag that sets it (library errors name the field; this command, the flag)
FLAGS = {"model": "--model", "draft_model": "--draft-model", "profile": "--profile", "widths": "--widths",
         "environment": "--environment", "max_tokens": "--max-tokens", "concurrency": "--concurrency",
         "repeats": "--repeats", "start_timeout": "--start-timeout", "request_timeout": "--request-timeout",
         "width_mode": "--width-mode", "temperature": "--temperature / --dist-requests / --dist-prefix"}


@click.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Job YAML (default: the built-in job on the embedded fixture pair).")
@click.option("--model", default=None, metavar="DIR|REPO",
              help="Target checkpoint, a directory or a hub id (one pairing instead of the job's).")
@click.option("--draft-model", default=None, metavar="DIR|REPO", help="Drafter checkpoint for --model.")
@click.option("--profile", default=None, metavar="NAME|FILE",
              help="Server profile for every pairing: mlx-lm, specparity-serve, llama.cpp, vllm, sglang, mlxcel,"
                   " openai, or a YAML file.")
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
              help="Seconds one request may take.")
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
@json_option
@record_option
def served(config_path: str | None, model: str | None, draft_model: str | None, profile: str | None,
           trust_remote_code: bool, environment: str | None, widths: str | None, width_mode: str | None,
           max_tokens: int | None,
           concurrency: int | None, repeats: int | None, start_timeout: float | None,
           request_timeout: float | None, shard_spec: str | None, temperature: float | None,
           dist_requests: int | None, dist_prefix: int | None, no_reference: bool, quiet: bool, as_json: bool,
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

    \b
    Exit codes: 0 all match, 1 diverged, 2 usage, 3 inconclusive / not engaged /
    declined, 4 a server would not start or a request failed.

    \b
    Examples:
        specparity served
        specparity served --model ./target --draft-model ./draft --widths 2,4,8
        specparity served --model mlx-community/Qwen3-0.6B-4bit --draft-model ./draft
        specparity served --config nightly.yaml --record-dir results
        specparity served --config nightly.yaml --shard 2/4 --record-dir shard2
        specparity served --model ./t --draft-model ./d --temperature 0.7 --dist-requests 1000
    """
    from specparity.harness.config import OverrideError, Overrides, apply_overrides, load_job
    from specparity.harness.shard import parse_shard

    shard = parse_shard(shard_spec) if shard_spec is not None else None
    if draft_model is not None and model is None:
        raise UsageError("--draft-model needs --model")
    overrides = Overrides(
        model=str(resolve_path(model, "target")) if model is not None else None,
        draft_model=str(resolve_path(draft_model, "draft")) if draft_model is not None else None,
        profile=profile, trust_remote_code=trust_remote_code, environment=environment,
        widths=parse_int_list(widths, "--widths", minimum=2, limit="max_width") if widths is not None else None,
        width_mode=width_mode, max_tokens=max_tokens, concurrency=concurrency, repeats=repeats,
        start_timeout=start_timeout, request_timeout=request_timeout, temperature=temperature,
        dist_requests=dist_requests, dist_prefix=dist_prefix, reference=False if no_reference else None)
    try:
        job = apply_overrides(load_job(config_path) if config_path else None, overrides)
    except OverrideError as err:
        raise UsageError(f"{FLAGS.get(err.field, err.field)}: {err.detail}") from None
    if config_path is None and model is None and not quiet and not as_json:
        click.echo(f"using the built-in job on the embedded pair {job.pairings[0].target}", err=True)
    from specparity.harness.profiles import NOT_EXERCISED, load_profile

    for p in job.pairings:
        prof = load_profile(p.profile)
        if not prof.exercised:
            click.echo(f"profile {prof.name} {NOT_EXERCISED}", err=True)
    title = f"served: {', '.join(p.name for p in job.pairings)} ({job.source} job)"
    slug = "served" if shard is None else f"served-shard{shard.index}of{shard.count}"
    ident = {"job": job.to_dict(), "models": _fingerprints(job), "environments": _environments(job)}
    cmd = CommandRun("served", title, ident, record_dir, as_json, quiet, slug=slug)
    with cmd:
        return cmd.finish(*_run(cmd, job, shard))


def _run(cmd: CommandRun, job: Any, shard: Any) -> tuple[Any, None, list[str]]:
    """The one library call: run the job into the record; (report, text lines, record body)."""
    from specparity.harness.run import ServedRun
    from specparity.records.served import SERVERS_DIR, served_markdown, write_arm

    sink = cmd.sink
    workdir = sink.writer.data_dir / SERVERS_DIR if sink.writer is not None else None

    def on_arm(pairing: Any, arm: Any) -> None:
        write_arm(cmd.observer, pairing, arm)
        sink.timing(f"{pairing.name}/{arm.name}", arm.seconds)

    report = ServedRun(job, workdir=workdir, on_arm=on_arm, observer=cmd.observer, shard=shard).run()
    return report, None, served_markdown(report, sink)


def _environments(job: Any) -> dict[str, Any]:
    """Each pairing's environment (its pins and installed packages), where its servers run in one."""
    from specparity.environments import find_environment
    from specparity.harness.profiles import load_profile

    out: dict[str, Any] = {}
    for p in job.pairings:
        ref = p.environment or load_profile(p.profile).environment
        env = find_environment(ref) if ref is not None else None
        if env is not None:
            out[p.name] = env.identity()
    return out


def _fingerprints(job: Any) -> dict[str, dict[str, str | None]]:
    """Each pairing's target and drafter fingerprint digests (what ``records compare`` sets side by side)."""
    from specparity.checkpoint import fingerprint

    def one(path: str | None) -> str | None:
        if path is None:
            return None
        try:
            return fingerprint(path).digest
        except (SpecparityError, OSError):
            return None  # the run itself names a missing or broken checkpoint
    return {p.name: {"target": one(p.target), "draft": one(p.draft)} for p in job.pairings}
