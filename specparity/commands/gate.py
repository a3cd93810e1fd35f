"""``specparity gate``: the memoized allow/decline verdict."""

from __future__ import annotations

from typing import Any

import click

from specparity.commands._common import (
    CommandRun, cache_options, cache_options_from, emit_json, json_option, record_option, resolve_path, top_json,
)
from specparity.errors import EXIT_OK


@click.group()
def gate() -> None:
    """Memoized verdict: may this checkpoint verify W rows at once, here?"""


@gate.command("check")
@click.option("--model", default=None, metavar="DIR",
              help="Checkpoint directory (default: the embedded fixture target).")
@click.option("--trust-remote-code", is_flag=True)
@click.option("--width", type=click.IntRange(min=1), required=True, help="Verify rows W.")
@click.option("--env-prefix", "env_prefixes", multiple=True,
              help="Env var prefixes that change kernels (default: MLX_).")
@cache_options
@json_option
@record_option
def check(model: str | None, trust_remote_code: bool, width: int, env_prefixes: tuple[str, ...], as_json: bool,
          quiet: bool, record_dir: str | None, **cache_kwargs: Any) -> int:
    """Exit 0 (allow) or 1 (decline); a probe that did not run declines.

    The verdict is memoized per checkpoint fingerprint, width, cache options,
    backend and kernel env vars; a hit answers without loading the model.
    SPECPARITY_ALLOW_INEXACT=1 allows anyway and logs a FORFEIT line.

    \b
    Examples:
        specparity fixtures make ./fx                  # a pair to try: ./fx/target, ./fx/draft
        specparity gate check --model ./fx/target --width 4      # exit 0: allow (1: decline)
        specparity gate check --width 4 --kv-bits 4 --kv-group-size 32 --quantized-kv-start 25   # exit 1: declines
    """
    from specparity.identity import DEFAULT_ENV_PREFIXES
    from specparity.inputs import check_width
    from specparity.probes.gate import gate_check

    check_width(width)
    path = str(resolve_path(model, "target"))
    opts = cache_options_from(cache_kwargs)
    cmd = CommandRun("gate", f"gate check: {path} width {width}", {"cache": opts.to_dict()}, record_dir, as_json,
                     quiet, slug="gate-check")
    with cmd:
        decision = gate_check(path, width, opts, env_prefixes=env_prefixes or DEFAULT_ENV_PREFIXES,
                              trust_remote_code=trust_remote_code, log_line=False)
        click.echo(decision.line, err=True)
        return cmd.finish(decision)


@gate.command("list")
@json_option
def list_(as_json: bool) -> int:
    """Show the memoized verdicts."""
    from specparity.probes.gate import PROMPT_CACHE_DECISION, GateStore

    entries, problem = GateStore().read_only()
    if problem is not None:
        click.echo(f"specparity-gate: STORE-CORRUPT path={GateStore().path} ({problem});"
                   " listing the readable entries, moving nothing", err=True)
    if as_json:
        emit_json(top_json(EXIT_OK, {"entries": entries}))
        return EXIT_OK
    for key, e in sorted(entries.items()):
        f = e.get("fields", {})
        decision = f.get("decision")
        what = decision if decision == PROMPT_CACHE_DECISION else f"width={f.get('width')}"
        click.echo(f"{key[:12]}  {what}  {e['verdict']:<9} {e['reason']}")
    return EXIT_OK
