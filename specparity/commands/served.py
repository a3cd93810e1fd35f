"""``specparity served``: served greedy parity across widths, by completion sha256."""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Any

import click

from specparity.commands._common import json_option, parse_int_list, record_option
from specparity.errors import UsageError


@click.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Job YAML (default: the built-in job on the embedded fixture pair).")
@click.option("--model", default=None, metavar="DIR", help="Target checkpoint (one pairing instead of the job's).")
@click.option("--draft-model", default=None, metavar="DIR", help="Drafter checkpoint for --model.")
@click.option("--profile", default=None, metavar="NAME|FILE",
              help="Server profile for every pairing: mlx-lm, specparity-serve, llama.cpp, vllm, sglang, mlxcel,"
                   " openai, or a YAML file.")
@click.option("--trust-remote-code", is_flag=True, help="Let the servers run --model's model_file.")
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
@json_option
@record_option
def served(config_path, model, draft_model, profile, trust_remote_code, widths, width_mode, max_tokens,
           concurrency, repeats, start_timeout, request_timeout, shard_spec, temperature, dist_requests,
           dist_prefix, quiet, as_json, record_dir):
    """Spawn servers with and without a drafter across widths and compare completions by sha256.

    Each arm (baseline at the start, one per width, the target drafting for
    itself, the sequence sent concurrently, env controls, baseline at the end)
    is its own server on 127.0.0.1, sent the same request sequence: a fresh
    request, the same again, a shared prefix, a streamed one, a multi-turn chat.
    Every completion is compared with the first baseline's. Verdicts per arm and
    request: match (identical, and the drafter is witnessed), diverged (first
    differing token and character, snippets, logprobs and top-2 margins),
    declined, not_engaged (no evidence the drafter ran: never a pass), error.
    Baselines that disagree make the pairing inconclusive.

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
        specparity served --config nightly.yaml --record-dir results
        specparity served --config nightly.yaml --shard 2/4 --record-dir shard2
        specparity served --model ./t --draft-model ./d --temperature 0.7 --dist-requests 1000
    """
    from specparity.harness.config import Pairing, builtin_job, load_job
    from specparity.harness.profiles import NOT_EXERCISED, load_profile
    from specparity.harness.served import ServedRun
    from specparity.harness.shard import parse_shard
    from specparity.records.chart import served_markdown

    shard = parse_shard(shard_spec) if shard_spec is not None else None
    w_list = parse_int_list(widths, "--widths", minimum=2) if widths is not None else None
    if widths is not None and not w_list:
        raise UsageError("--widths: give at least one width")
    if profile is not None:
        load_profile(profile)
    if draft_model is not None and model is None:
        raise UsageError("--draft-model needs --model")
    job = load_job(config_path) if config_path else None
    if model is not None:
        pairing = Pairing("cli", model, draft_model, profile or "mlx-lm", trust_remote_code)
        if job is None:
            job = replace(builtin_job(), pairings=[pairing], source="command line")
        else:
            job.pairings = [pairing]
    if job is None:
        job = builtin_job()
        if not quiet and not as_json:
            click.echo(f"using the built-in job on the embedded pair {job.pairings[0].target}", err=True)
    if profile is not None:
        for p in job.pairings:
            p.profile = profile
    if w_list:
        job.widths = w_list
    for key, val in (("width_mode", width_mode), ("max_tokens", max_tokens), ("concurrency", concurrency),
                     ("repeats", repeats)):
        if val is not None:
            setattr(job, key, val)
    if temperature is not None or dist_requests is not None or dist_prefix is not None:
        from specparity.harness.served_dist import DistSpec

        spec = job.distribution or DistSpec()
        job.distribution = replace(spec, **{k: v for k, v in (("temperature", temperature),
                                                              ("requests", dist_requests),
                                                              ("prefix", dist_prefix)) if v is not None})
    if job.distribution is not None and not any(p.draft for p in job.pairings):
        raise UsageError("--temperature / distribution: no pairing has a drafter to compare with")
    if trust_remote_code:
        for p in job.pairings:
            p.trust_remote_code = True
    for p in job.pairings:
        prof = load_profile(p.profile)
        if not prof.exercised:
            click.echo(f"profile {prof.name} {NOT_EXERCISED}", err=True)

    from specparity.commands._common import CommandRun

    title = f"served: {', '.join(p.name for p in job.pairings)} ({job.source} job)"
    slug = "served" if shard is None else f"served-shard{shard.index}of{shard.count}"
    cmd = CommandRun("served", title, {"job": job.to_dict(), "models": _fingerprints(job)}, record_dir, as_json,
                     quiet, slug=slug)
    progress, close = _progress(quiet or as_json)
    with cmd:
        sink = cmd.sink
        workdir = sink.writer.data_dir / "servers" if sink.writer is not None else None

        def on_arm(pairing, arm) -> None:
            cmd.observer.result("arms", {"pairing": pairing.name, **arm.to_dict()})
            for r in arm.requests:
                cmd.observer.result(f"{pairing.name}-{arm.name}", r.to_dict())
            sink.timing(f"{pairing.name}/{arm.name}", arm.seconds)
            progress(f"  {arm.name}: {arm.verdict}" + (f" ({arm.reason})" if arm.reason else ""))

        try:
            run = ServedRun(job, workdir=workdir, on_arm=on_arm, progress=progress,
                            start_timeout=start_timeout, request_timeout=request_timeout, shard=shard)
            report = run.run()
        finally:
            close()
        return cmd.finish(report, markdown=served_markdown(report, sink))



def _fingerprints(job) -> dict[str, dict[str, str | None]]:
    """Each pairing's target and drafter fingerprint digests (what ``records compare`` sets side by side)."""
    from specparity.checkpoint import fingerprint
    from specparity.errors import SpecparityError

    def one(path: str | None) -> str | None:
        if path is None:
            return None
        try:
            return fingerprint(path).digest
        except (SpecparityError, OSError):
            return None  # the run itself names a missing or broken checkpoint
    return {p.name: {"target": one(p.target), "draft": one(p.draft)} for p in job.pairings}


def _progress(quiet: bool) -> tuple[Any, Any]:
    """(report(line), close()) : a tqdm bar on a TTY, plain arm lines otherwise, nothing when quiet."""
    if quiet:
        return (lambda s: None), (lambda: None)
    if sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(total=None, file=sys.stderr, unit="step", leave=False)

        def report(s: str) -> None:
            if s.startswith("arm "):
                bar.write(s, file=sys.stderr)
            bar.set_description(s.strip()[:60])
            bar.update(1)
        return report, bar.close

    def plain(s: str) -> None:
        if not s.startswith("    "):
            click.echo(s, err=True)
    return plain, (lambda: None)
