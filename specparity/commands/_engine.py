"""What probe, replay, bisect and e2e share to run through an engine other than mlx-lm."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any
from collections.abc import Callable

import click

from specparity.dflash_fixtures import DEFAULT_PAIR_NOTE
from specparity.errors import UsageError

ENGINE_CHOICES = ("mlx-lm", "dflash-mlx")
VERIFY_MODES = ("adaptive", "dflash")


def engine_option(f: Callable) -> Callable:
    f = click.option("--verify-mode", type=click.Choice(VERIFY_MODES), default=None,
                     help="dflash-mlx: its verify policy (default: the engine's, adaptive; dflash keeps the"
                          " drafter's block size every round).")(f)
    return click.option(
        "--engine", type=click.Choice(ENGINE_CHOICES), default="mlx-lm", show_default=True,
        help="Whose verify forward and rollback to check against classic decode. dflash-mlx runs in"
             " process where it imports, else in its own environment ($SPECPARITY_DFLASH_MLX_PYTHON, else"
             f" the dflash-mlx one); without --model it runs on the default DFlash fixture ({DEFAULT_PAIR_NOTE};"
             " built once).")(f)


def rerun_elsewhere(engine: str) -> int | None:
    """None to run here; else the exit code of this command re-run in the engine's environment."""
    from specparity.engine_env import rerun_here_or_there

    root = click.get_current_context().find_root()
    argv = (root.obj or {}).get("argv") if isinstance(root.obj, dict) else None
    return rerun_here_or_there(engine, list(argv) if argv is not None else sys.argv[1:])


def dflash_paths(model: str | None, draft_model: str | None) -> tuple[Path, Path | None]:
    """The target and DFlash drafter directories: given, the fixture's sibling drafter, or the default fixture."""
    from specparity.checkpoint import resolve_model_dir

    if model is None:
        from specparity.dflash_fixtures import dflash_pair

        click.echo(f"using the default DFlash fixture ({DEFAULT_PAIR_NOTE}), built once", err=True)
        info = dflash_pair()
        return Path(info.target), Path(draft_model) if draft_model else Path(info.draft)
    target = resolve_model_dir(model, "--model")
    draft = resolve_model_dir(draft_model, "--draft-model") if draft_model else None
    if draft is None:
        from specparity.dflash_fixtures import fixture_draft

        draft = fixture_draft(target)
    return target, draft


def load_dflash(model: str | None, draft_model: str | None, need_draft: bool, verify_mode: str | None,
                prefill_step_size: int | None = None) -> Any:
    """dflash-mlx loaded on ``--model`` (and its drafter), by its own loader."""
    from specparity.probes.engines import load_engine

    target, draft = dflash_paths(model, draft_model)
    if need_draft and draft is None:
        raise UsageError("--engine dflash-mlx: give --draft-model (the DFlash drafter) for the engine's own loop")
    return load_engine("dflash-mlx", target, draft, verify_mode=verify_mode, prefill_step_size=prefill_step_size)


def engine_prompts(engine: Any, texts: list[str] | None, ids: list[list[int]] | None) -> list[list[int]]:
    """Prompt ids for an engine run: --prompt-ids, --prompt, else the built-in probe prompts."""
    from specparity.inputs import check_prompts
    from specparity.prompts import encode_prompts

    if ids:
        check_prompts(ids, engine.classic_model())
        return ids
    from mlx_lm.utils import load_tokenizer

    return encode_prompts(load_tokenizer(Path(engine.info.target)), texts or None, None)


def explicit(ctx: click.Context, *names: str) -> list[str]:
    """The options among ``names`` the user set (not left at their default)."""
    from click.core import ParameterSource

    return [n for n in names if ctx.get_parameter_source(n) not in (ParameterSource.DEFAULT, None)]
