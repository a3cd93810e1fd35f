"""Options and output helpers every command shares."""

from __future__ import annotations

import json
import sys
from typing import Any
from collections.abc import Callable

import click

from specparity.inputs import parse_int_list  # noqa: F401  (moved; kept for importers)
from specparity.outputs import record_dir_callback


def json_option(f: Callable) -> Callable:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout.")(f)


def record_option(f: Callable) -> Callable:
    return click.option(
        "--record-dir",
        type=click.Path(file_okay=False),
        default=None,
        callback=record_dir_callback,
        help="Write a record (markdown + data/) into this directory.",
    )(f)


def model_options(f: Callable) -> Callable:
    f = click.option(
        "--trust-remote-code", is_flag=True, help="Allow a checkpoint's model_file to run."
    )(f)
    f = click.option(
        "--model", "model", default=None, metavar="DIR",
        help="mlx-lm checkpoint directory (default: the embedded fixture target).",
    )(f)
    return f


def cache_options(f: Callable) -> Callable:
    """The cache configurations servers run (see specparity.decode.CacheOptions)."""
    f = click.option("--prefill-step-size", type=click.IntRange(min=1), default=2048,
                     show_default=True, help="Prompt chunk size of classic prefill.")(f)
    f = click.option("--max-kv-size", type=click.IntRange(min=1), default=None,
                     help="Rotating KV cache of this many positions.")(f)
    f = click.option("--quantized-kv-start", type=click.IntRange(min=0), default=5000,
                     show_default=True, help="Quantize the KV cache past this many positions.")(f)
    f = click.option("--kv-group-size", type=click.Choice(["32", "64", "128"]), default="64",
                     show_default=True, help="KV cache quantization group size (mx.quantize's).")(f)
    f = click.option("--kv-bits", type=click.Choice(["2", "3", "4", "5", "6", "8"]), default=None,
                     help="Quantize the KV cache to this many bits (mlx-lm's kv_bits).")(f)
    return f


def cache_options_from(kwargs: dict[str, Any]):
    from specparity.decode import CacheOptions

    bits = kwargs.pop("kv_bits")
    return CacheOptions(
        kv_bits=int(bits) if bits is not None else None,
        kv_group_size=int(kwargs.pop("kv_group_size")),
        quantized_kv_start=kwargs.pop("quantized_kv_start"),
        max_kv_size=kwargs.pop("max_kv_size"),
        prefill_step_size=kwargs.pop("prefill_step_size"),
    )


def resolve_model(model: str | None, trust_remote_code: bool):
    """Load ``--model``, or the embedded default target (built on first use)."""
    from specparity.checkpoint import load_checkpoint

    if model is None:
        from specparity.fixtures import default_pair

        model = default_pair().target
        click.echo(f"using the embedded default checkpoint {model}", err=True)
    return load_checkpoint(model, trust_remote_code=trust_remote_code)


def emit_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
