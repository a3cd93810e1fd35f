"""``specparity accept``: measured acceptance against its closed forms, on real models."""

from __future__ import annotations

import logging
from typing import Any

import click

from specparity.commands._common import CommandRun, json_option, model_options, record_option, resolve_path

log = logging.getLogger(__name__)


@click.command("accept")
@model_options
@click.option("--draft-model", default=None, metavar="DIR",
              help="Drafter checkpoint (default: the embedded fixture drafter).")
@click.option("--temperature", type=float, default=None,
              help="Sampling temperature of target and drafter (default 0.7).")
@click.option("--positions", type=int, default=None,
              help="Tested positions to collect from mlx-lm's run (default 192).")
@click.option("--num-draft", type=int, default=None,
              help="mlx-lm's num_draft_tokens (default 2).")
@click.option("--rule", "rule_specs", multiple=True, metavar="RULE",
              help="Rule to simulate at the tested positions (repeatable; default"
                   " sampler-match and mrs); built-in, module:function or file.py:function.")
@click.option("--draws", type=int, default=None,
              help="Monte-Carlo draws per tested position for each --rule (default 1000).")
@click.option("--alpha", type=float, default=None,
              help="Two-sided level of the closed-form z tests (default 1e-4).")
@click.option("--seed", type=int, default=0, show_default=True,
              help="mlx and numpy seed (reported).")
@click.option("--prompt-ids", multiple=True, metavar="1,2,3",
              help="Prompt token ids (default: the first built-in prompt).")
@click.option("--end-to-end", is_flag=True,
              help="Instead: test mlx-lm's speculative stream against a known p, using"
                   " constant-logits fixtures (ignores --model/--draft-model).")
@click.option("--tokens", type=int, default=None,
              help="--end-to-end: emitted tokens to test (default 600).")
@json_option
@record_option
def accept(model: str | None, trust_remote_code: bool, draft_model: str | None,
           temperature: float | None, positions: int | None, num_draft: int | None,
           rule_specs: tuple[str, ...], draws: int | None, alpha: float | None, seed: int,
           prompt_ids: tuple[str, ...], end_to_end: bool, tokens: int | None, as_json: bool,
           record_dir: str | None, quiet: bool) -> int:
    """Measured acceptance against its closed forms, on real models.

    Runs mlx-lm's own speculative generation (speculative_generate_step with a
    temperature sampler), recomputes the target's p and the drafter's q at every
    tested position, and reports the closed forms sum min(p, q) and sum p*q
    beside the measured per_position_acceptance, acceptance_rate and
    mean_accepted_len, with the form each measurement sits on. Each --rule is
    also simulated at the same positions. Exit 1 when a measurement sits on
    neither form (or not on the one its rule promises), or sum_min < sum_prod.

    \b
    --end-to-end tests the emitted stream itself: the target's logits ignore
    its input, so every emitted token must be an i.i.d. draw from
    softmax(logits / T); chi-square beside the known-wrong controls (exit 3
    when one is not rejected).

    \b
    Examples:
        specparity accept --temperature 0.7 --positions 256
        specparity fixtures make ./fx                  # a pair to try: ./fx/target, ./fx/draft
        specparity accept --model ./fx/target --draft-model ./fx/draft --rule mrs
        specparity accept --end-to-end --temperature 0.7
    """
    from specparity.errors import UsageError
    from specparity.probes.sampling import accept as am
    from specparity.probes.sampling import accept_e2e
    from specparity.probes.sampling.dist import check_temperature
    from specparity.probes.sampling.rules import resolve_rule

    temperature = check_temperature(
        am.DEFAULT_TEMPERATURE if temperature is None else temperature)
    num_draft = am.DEFAULT_NUM_DRAFT if num_draft is None else num_draft
    alpha = am.DEFAULT_ALPHA if alpha is None else alpha
    am.check_args(temperature, 1 if positions is None else positions, num_draft,
                  1 if draws is None else draws, alpha)
    rep: Any  # an EndToEndReport or an AcceptReport
    if end_to_end:
        rep = accept_e2e.run_end_to_end(temperature=temperature,
                                 tokens=accept_e2e.E2E_TOKENS if tokens is None else tokens,
                                 num_draft=num_draft, alpha=alpha, seed=seed)
        text = accept_e2e.render_end_to_end(rep)
        slug = "accept-end-to-end"
    else:
        rules = [resolve_rule(s) for s in rule_specs] or None
        if model is not None and draft_model is None:
            raise UsageError("--model needs --draft-model (the drafter whose acceptance is"
                             " measured)")
        if model is None:
            click.echo("using the embedded default pair", err=True)
        model = str(resolve_path(model, "target"))
        draft_model = str(resolve_path(draft_model, "draft"))
        prompt = None
        if prompt_ids:
            from specparity.prompts import parse_prompt_ids

            prompt = parse_prompt_ids(prompt_ids)[0]
        assert draft_model is not None  # given with --model, or the default pair's drafter
        rep = am.run_accept(
            model, draft_model, temperature=temperature,
            positions=am.DEFAULT_POSITIONS if positions is None else positions,
            num_draft=num_draft, rules=rules,
            draws=am.DEFAULT_DRAWS if draws is None else draws, alpha=alpha, seed=seed,
            prompt=prompt, trust_remote_code=trust_remote_code,
        )
        text = am.render_accept(rep)
        slug = "accept"
    run = CommandRun("accept", f"accept: {slug}", {"command": "accept", "seed": seed}, record_dir,
                     as_json, quiet, slug=slug)
    with run:
        d = rep.to_dict()
        arm = "measurements" if "measurements" in d else "arms"
        for obj in d.get(arm) or []:
            run.observer.result(arm, obj)
        return run.finish(rep, text=text.splitlines())

