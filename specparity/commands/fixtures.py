"""``specparity fixtures``: build the embedded checkpoints."""

from __future__ import annotations

import click
from click.core import ParameterSource

from specparity.commands._common import emit_json, json_option, top_json
from specparity.commands._engine import DrafterFormatChoice
from specparity.engines import DEFAULT_DRAFTER_FORMAT
from specparity.errors import EXIT_OK
from specparity.outputs import force_option


@click.group()
def fixtures() -> None:
    """Build real mlx-lm checkpoints deterministically from a seed (no hub needed)."""


@fixtures.command("make")
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--arch", default="llama", show_default=True,
              help="llama | qwen3_5 | gemma3_text | qwen3_moe")
@click.option("--dtype", default="float32", show_default=True, help="float32 | bfloat16 | float16")
@click.option("--bits", type=click.Choice(["4", "8"]), default=None, help="Quantize weights (mlx-lm).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--fault", "faults", multiple=True,
              help='Inject a fault (JSON), e.g. \'{"kind":"rows","layer":2,"subop":"mlp","min_rows":4}\'.')
@click.option("--no-draft", is_flag=True, help="Build the target only.")
@click.option("--overwrite", is_flag=True,
              help="Replace an existing fixture at OUT_DIR (--dflash: one built with other arguments is"
                   " refused without it).")
@click.option("--dflash", "dflash_shape", default=None, metavar="SHAPE",
              help="Build a DFlash pair instead: a target in this shape (qwen3_5 | qwen3_5-27b |"
                   " qwen3_5-equal-heads | qwen3) and a drafter in --drafter-format.")
@click.option("--block-size", type=click.Choice(["8", "16"]), default="16", show_default=True,
              help="--dflash: the drafter's block (verify rows).")
@click.option("--tied-head", is_flag=True, help="--dflash: the target's output head is its embedding.")
@click.option("--drafter-format", type=DrafterFormatChoice(), default=DEFAULT_DRAFTER_FORMAT, show_default=True,
              help="--dflash: the drafter's format, one an engine in the registry reads (`specparity fixtures"
                   " formats` lists them with their engines).")
@click.option("--size", default=None, metavar="SHAPE",
              help="Random weights in the dimensions of a real small model: llama-0.5b, llama-1.5b, qwen3-0.6b,"
                   " qwen3-1.7b (or llama-wide-vocab); quantized as mlx-lm does with --bits (group size 64).")
@json_option
@click.pass_context
def make(ctx: click.Context, out_dir: str, arch: str, dtype: str, bits: str | None, seed: int,
         faults: tuple[str, ...], no_draft: bool, overwrite: bool, dflash_shape: str | None, block_size: str,
         tied_head: bool, drafter_format: str, size: str | None, as_json: bool) -> int:
    """Build OUT_DIR/target and OUT_DIR/draft.

    With --dflash, the target has the shape of a real DFlash target family and
    the drafter is a DFlash block drafter fitted to it (its config names the
    target layers it reads, its block size and the mask token, which the
    tokenizer holds); the measured accept mix (full, partial and zero-accept
    blocks on the fit prompts) is printed, with a warning on stderr when the
    three kinds never all occurred. An OUT_DIR already holding a DFlash fixture
    built with the same arguments is kept as it is; one built with other
    arguments is refused, naming them (exit 2), unless --overwrite.

    \b
    Examples:
        specparity fixtures make ./fx/llama
        specparity fixtures make ./fx/hybrid --arch qwen3_5 --dtype bfloat16
        specparity fixtures make ./fx/bad --fault '{"kind":"rows","layer":3,"min_rows":4}'
        specparity fixtures make ./fx/dflash --dflash qwen3 --block-size 8
        specparity fixtures make ./fx/dspark --dflash qwen3 --drafter-format dspark --dtype bfloat16
        specparity fixtures make ./fx/mtp --dflash qwen3_5 --drafter-format mtp --tied-head

    With --size, the target has the published dimensions of that model (its
    real vocabulary: rows past the fixture tokenizer's are zero, so greedy
    decode stays in it) and the drafter is two layers of the same shape, both
    random (they measure cost against size, not acceptance), built offline.
    """
    from specparity.errors import UsageError

    if dflash_shape is None:
        stray = [flag for name, flag in (("block_size", "--block-size"), ("tied_head", "--tied-head"),
                                                  ("drafter_format", "--drafter-format"))
                 if ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None)]
        if stray:
            raise UsageError(f"{' and '.join(stray)} apply to a DFlash pair only: add --dflash SHAPE, or leave"
                             f" {'them' if len(stray) > 1 else 'it'} out")
    out_dir = _check_out_dir(out_dir, overwrite)
    if dflash_shape is not None:
        from specparity.engines import drafter_formats

        if arch != "llama" or bits or faults or no_draft:
            raise UsageError(f"--dflash builds its own pair (--drafter-format {drafter_format}): --arch, --bits,"
                             " --fault and --no-draft do not apply")
        made = drafter_formats()[drafter_format].make(out_dir, shape=dflash_shape, dtype=dtype, tied=tied_head,
                                                      block_size=int(block_size), seed=seed, overwrite=overwrite,
                                                      note=lambda message: click.echo(message, err=True))
        if as_json:
            emit_json(top_json(EXIT_OK, made.record))
        else:
            for line in made.lines:
                click.echo(line)
        if made.warning:
            click.echo(made.warning, err=True)
        return EXIT_OK
    if size is not None:
        if dflash_shape is not None or faults or arch != "llama":
            raise UsageError("--size: the shape names its architecture; not with --dflash, --fault or --arch")
        from specparity.fixtures import build_sized

        info = build_sized(out_dir, size, dtype=dtype, bits=int(bits) if bits else None, seed=seed,
                           with_draft=not no_draft, overwrite=overwrite)
        if as_json:
            emit_json(top_json(EXIT_OK, info.to_dict()))
        else:
            click.echo(f"target: {info.target} ({size}, {dtype}, {f'{bits}-bit' if bits else 'not quantized'})")
            if info.draft:
                click.echo(f"draft:  {info.draft} (two layers of the same shape, random)")
        return EXIT_OK
    import json

    from specparity.fixtures import ARCH_CONFIGS, build_pair
    from specparity.inputs import parse_fault

    layers = ARCH_CONFIGS.get(arch, {}).get("num_hidden_layers")
    parsed = [parse_fault(f, layers) for f in faults]
    info = build_pair(out_dir, arch=arch, dtype=dtype, bits=int(bits) if bits else None,
                      seed=seed, faults=parsed, with_draft=not no_draft, overwrite=overwrite)
    if as_json:
        emit_json(top_json(EXIT_OK, info.to_dict()))
    else:
        click.echo(f"target: {info.target}")
        if info.draft:
            agree = "not measurable here" if info.agreement is None else f"{info.agreement:.2f}"
            click.echo(f"draft:  {info.draft} (per-position greedy agreement {agree})")
        if info.faults:
            click.echo(f"faults: {json.dumps(info.faults)} (load with --trust-remote-code)")
    return EXIT_OK


def _check_out_dir(out_dir: str, overwrite: bool) -> str:
    """OUT_DIR is one a build may write, checked before any work: its parent is writable (the build happens
    in a temporary sibling, renamed into place), and what is there now is a fixture (kept, or replaced with
    --overwrite) or nothing. Returns OUT_DIR with ``~`` expanded."""
    from specparity.fixtures import check_out_dir
    from specparity.inputs import expand_user
    from specparity.outputs import check_record_dir

    out = expand_user(out_dir, "OUT_DIR")
    check_out_dir(out, overwrite)
    check_record_dir(out.absolute().parent, "OUT_DIR's parent")
    return str(out)


@fixtures.command("formats")
@json_option
def formats(as_json: bool) -> int:
    """List the drafter formats `fixtures make --drafter-format` builds, and the engines that read each.

    The list is the engine registry's: an engine module declaring a new
    drafter format (``drafter_format=DrafterFormat(...)``) adds it here.
    """
    from specparity.engines import drafter_formats, registry

    rows = [{"name": name, "help": fmt.help,
             "read_by": [spec.name for spec in registry().values() if spec.fixture_kind == name]}
            for name, fmt in drafter_formats().items()]
    if as_json:
        emit_json(top_json(EXIT_OK, {"formats": rows}))
        return EXIT_OK
    width = max((len(r["name"]) for r in rows), default=0)
    for r in rows:
        click.echo(f"{r['name']:<{width}}  {r['help']} (read by {', '.join(r['read_by'])})")
    return EXIT_OK


@fixtures.command("gguf")
@click.argument("src_dir", type=click.Path(file_okay=False))
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--outtype", type=click.Choice(["f32", "f16"]), default="f32", show_default=True,
              help="f16 stores the matrices as float16 (norms stay float32).")
@force_option
@json_option
def gguf(src_dir: str, out: str, outtype: str, force: bool, as_json: bool) -> int:
    """Export an mlx-lm llama checkpoint (a fixture's target or draft) to GGUF for llama.cpp.

    OUT is never overwritten (nor a link's target written through) without
    --force; with --force the file OUT is replaced.

    \b
    Examples:
        specparity fixtures make ./fx/llama
        specparity fixtures gguf ./fx/llama/target ./fx/target.gguf
        specparity fixtures gguf ./fx/llama/draft ./fx/draft.gguf
        $(scripts/build-llama-server) -m ./fx/target.gguf -md ./fx/draft.gguf --spec-type draft-simple   # until Ctrl-C
    """
    from specparity.checkpoint import resolve_model_dir
    from specparity.gguf_export import export_gguf
    from specparity.outputs import check_new_file

    resolve_model_dir(src_dir, "SRC_DIR")
    check_new_file(out, "OUT", force, make_parents=True)
    info = export_gguf(src_dir, out, outtype=outtype, force=force)
    if as_json:
        emit_json(top_json(EXIT_OK, info.to_dict()))
    else:
        click.echo(f"wrote {info.path} ({info.outtype}, {info.n_tensors} tensors, {info.bytes} bytes,"
                   f" vocabulary {info.vocab_size} tokens, eos id {info.eos_id})")
    return EXIT_OK
