"""``specparity dist``: is an acceptance rule lossless at temperature > 0?"""

from __future__ import annotations

import logging
from dataclasses import asdict

import click

from specparity.commands._common import CommandRun, json_option, record_option

log = logging.getLogger(__name__)


@click.command("dist")
@click.option("--rule", "rule_spec", default="mrs", show_default=True, metavar="RULE",
              help="Built-in (mrs, sampler-match, greedy-delta, greedy, the controls,"
                   " mrs-no-support-guard), module:function, or path/to/file.py:function.")
@click.option("--num-draft", type=int, default=1, show_default=True,
              help="Drafts per round; > 1 tests the joint law of the emitted k-prefix.")
@click.option("--samples", type=int, default=None,
              help="Monte-Carlo draws per arm (default 200000).")
@click.option("--alpha", type=float, default=None,
              help="False-rejection probability of a lossless rule (default 1e-4).")
@click.option("--seed", type=int, default=0, show_default=True, help="numpy seed (reported).")
@click.option("--temperature", type=float, default=None,
              help="Sampling temperature for both logits vectors (default 0.7).")
@click.option("--target-logits", default=None, metavar="L0,L1,...",
              help="Target logits (default: the built-in 8-token problem with --top-k 6).")
@click.option("--draft-logits", default=None, metavar="L0,L1,...", help="Drafter logits.")
@click.option("--top-k", type=int, default=None, help="Target top-k filter (0 = off).")
@click.option("--top-p", type=float, default=0.0, show_default=True, help="Target top-p filter.")
@click.option("--min-p", type=float, default=0.0, show_default=True, help="Target min-p filter.")
@click.option("--detect-tv", type=float, default=None, metavar="TV",
              help="Size the sample so that any law at this total variation from the target is"
                   " rejected with 99% power (instead of --samples); the cost is reported.")
@click.option("--sweep-draws", type=click.IntRange(min=0), default=None,
              help="Draws per forced draft token in the support sweep (default 256).")
@json_option
@record_option
def dist(rule_spec: str, num_draft: int, samples: int | None, alpha: float | None, seed: int,
         temperature: float | None, target_logits: str | None, draft_logits: str | None,
         top_k: int | None, top_p: float, min_p: float, detect_tv: float | None,
         sweep_draws: int | None, as_json: bool, record_dir: str | None, quiet: bool) -> int:
    """Test an acceptance rule for distributional exactness.

    Draws rounds of the rule by Monte Carlo and tests the emitted tokens against
    the target's distribution p (Pearson chi-square at the exact quantile, total
    variation beside its noise floor), next to known-wrong controls run at the
    same sample size: if any control is not rejected the run is inconclusive
    (exit 3), never a pass. A pass states its reach: the smallest total
    variation (and per-bin relative error) this run rejects with 99% power,
    from the chi-square's non-central distribution, checked by a near-miss
    control drawn at exactly that TV. --detect-tv X sizes the sample to reach
    a TV of X and reports the cost. Zero-tolerance checks: no emitted token outside p's
    filtered support (also with every token forced as the draft), no residual
    resample of a token with p <= q.

    \b
    A user rule is a function (p, q, draft, rng) -> token (single position) or
    (p[k+1,V], q[k,V], drafts[k], rng) -> emitted tokens (--num-draft k); see
    specparity/probes/rules.py for the contract and the `vectorized` flag.

    \b
    Examples:
        specparity dist --rule mrs
        specparity dist --rule sampler-match --num-draft 3
        specparity dist --rule tests/sample_rules.py:mrs_vectorized            # yours: FILE.py:FN or MODULE:FN
        specparity dist --rule tests/sample_rules.py:resample_from_p           # exit 1: a biased rule
        specparity dist --rule mrs --detect-tv 0.002
    """
    from specparity.probes.sampling import dist as dm
    from specparity.probes.sampling.rules import resolve_rule

    temperature = dm.check_temperature(
        dm.DEFAULT_TEMPERATURE if temperature is None else temperature)
    rule = resolve_rule(rule_spec)
    if (target_logits is None) != (draft_logits is None):
        from specparity.errors import UsageError

        raise UsageError("--target-logits and --draft-logits go together (same length)")
    prob = dm.make_problem(
        target_logits=dm.parse_logits(target_logits, "--target-logits"),
        draft_logits=dm.parse_logits(draft_logits, "--draft-logits"),
        temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, num_draft=num_draft,
    )
    from specparity.inputs import check_limit

    check_limit(samples or 0, "--samples", "max_samples")
    check_limit(sweep_draws or 0, "--sweep-draws", "max_samples")
    alpha = dm.DEFAULT_ALPHA if alpha is None else alpha
    if detect_tv is not None:
        if samples is not None:
            from specparity.errors import UsageError

            raise UsageError("give --samples or --detect-tv, not both")
        samples = dm.samples_to_detect(prob, detect_tv, alpha)
        click.echo(f"dist: --detect-tv {detect_tv:g} needs {samples} samples per arm", err=True)
    click.echo(f"dist: testing {rule.name} ({rule.description}) beside"
               f" {3 if prob.temperature > 0 else 0} controls", err=True)
    run = CommandRun("dist", f"dist: {rule.name}", {"command": "dist", "rule": rule.name, "seed": seed},
                     record_dir, as_json, quiet, slug=f"dist-{rule.name.split(':')[-1]}")
    with run:
        rep = dm.run_dist(
            rule, prob,
            samples=dm.DEFAULT_SAMPLES if samples is None else samples,
            alpha=alpha,
            seed=seed,
            sweep_draws=dm.DEFAULT_SWEEP_DRAWS if sweep_draws is None else sweep_draws,
            detect_tv=detect_tv,
        )
        for arm in rep.arms:
            run.observer.result(arm.role, asdict(arm))
        return run.finish(rep, text=dm.render_text(rep).splitlines())
