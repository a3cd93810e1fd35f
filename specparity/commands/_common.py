"""Options and output helpers every command shares."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any
from collections.abc import Callable, Mapping

import click

from specparity.errors import SpecparityError
from specparity.inputs import parse_int_list  # noqa: F401  (moved; kept for importers)
from specparity.outputs import record_dir_callback

if TYPE_CHECKING:
    from specparity.checkpoint import Loaded
    from specparity.decode import CacheOptions
    from specparity.processors import ProcessorOptions


# set in the root context's obj once a --json object is on stdout (specparity.cli reads it)
JSON_PRINTED = "json_printed"


def json_option(f: Callable) -> Callable:
    return click.option("--json", "as_json", is_flag=True,
                        help="Print the whole result as one JSON object on stdout, the process's verdict and"
                             " exit_code first; on an error {verdict, exit_code, error} (its JSON Schema ships"
                             " in specparity/schemas/).")(f)


def memory_limit_callback(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """click callback for ``--memory-limit``: it and $SPECPARITY_MEMORY_LIMIT are checked while the options
    are parsed, so a bad size is refused before a checkpoint is built or loaded."""
    from specparity.harness.memory import given_limit

    given_limit(value)
    return value


def record_option(f: Callable) -> Callable:
    f = click.option("-q", "--quiet", is_flag=True,
                     help="No progress on stderr (progress shows only on a terminal anyway).")(f)
    return click.option(
        "--record-dir",
        type=click.Path(file_okay=False),
        default=None,
        callback=record_dir_callback,
        help="Write a record (markdown + data/) into this directory, part by part as the run goes.",
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


def processor_options(f: Callable) -> Callable:
    """Logits processors as mlx-lm's make_logits_processors takes them (specparity.processors)."""
    f = click.option("--logit-bias", default=None, metavar="ID:BIAS,...",
                     help="Additive logit bias per token id, e.g. 5:2.5,17:-100.")(f)
    for name in ("frequency", "presence", "repetition"):
        f = click.option(f"--{name}-context-size", type=click.IntRange(min=0), default=20, show_default=True,
                         help=f"History tokens the {name} penalty sees.")(f)
        f = click.option(f"--{name}-penalty", type=float, default=None,
                         help=f"mlx-lm's {name} penalty (a logits processor; off by default).")(f)
    return f


def processor_options_from(kwargs: dict[str, Any]) -> ProcessorOptions:
    from specparity.processors import ProcessorOptions, parse_logit_bias

    return ProcessorOptions(
        repetition_penalty=kwargs.pop("repetition_penalty"),
        repetition_context_size=kwargs.pop("repetition_context_size"),
        presence_penalty=kwargs.pop("presence_penalty"),
        presence_context_size=kwargs.pop("presence_context_size"),
        frequency_penalty=kwargs.pop("frequency_penalty"),
        frequency_context_size=kwargs.pop("frequency_context_size"),
        logit_bias=parse_logit_bias(kwargs.pop("logit_bias")),
    )


def cache_options_from(kwargs: dict[str, Any]) -> CacheOptions:
    from specparity.decode import CacheOptions

    bits = kwargs.pop("kv_bits")
    return CacheOptions(
        kv_bits=int(bits) if bits is not None else None,
        kv_group_size=int(kwargs.pop("kv_group_size")),
        quantized_kv_start=kwargs.pop("quantized_kv_start"),
        max_kv_size=kwargs.pop("max_kv_size"),
        prefill_step_size=kwargs.pop("prefill_step_size"),
    )


def resolve_path(spec: str | None, role: str = "target") -> Path:
    """``--model`` / ``--draft-model`` as a local directory: a path, a hub id, or the embedded default."""
    from specparity.resolve import resolve_checkpoint

    flag = "--model" if role == "target" else "--draft-model"
    try:
        return resolve_checkpoint(spec, role=role)
    except SpecparityError as err:
        raise err.flagged({"checkpoint": flag}) from err


def resolve_model(model: str | None, trust_remote_code: bool, role: str = "target") -> Loaded:
    """Load ``--model`` (or ``--draft-model``): a directory, a hub id, or the embedded default pair."""
    from specparity.checkpoint import load_checkpoint

    path = resolve_path(model, role)
    if model is None:
        click.echo(f"using the embedded default {role} checkpoint {path}", err=True)
    flag = "--model" if role == "target" else "--draft-model"
    return load_checkpoint(path, trust_remote_code=trust_remote_code, flag=flag)


class CommandRun:
    """One command's run: its record sink, its progress observer, its output.

    Every command finishes through :meth:`finish`, so each writes its record
    the same way (report.json always, the shared markdown frame), prints
    ``verdict: WORD`` last in text mode, and carries ``verdict`` and
    ``exit_code`` at the top of its ``--json``. Use as a context manager around
    the work: Ctrl-C, SIGTERM or an error inside leaves an interrupted record of
    the parts that finished.
    """

    def __init__(self, kind: str, title: str, identity_extra: dict[str, Any], record_dir: str | None,
                 as_json: bool, quiet: bool, slug: str | None = None):
        from specparity.harness.lifecycle import catch_sigterm
        from specparity.identity import identity
        from specparity.progress import CliObserver
        from specparity.records.record import RecordSink

        # SIGTERM unwinds like Ctrl-C from here on (not in `serve`, which writes no record and
        # whose mlx-lm server thread must not be unwound under it)
        catch_sigterm()
        self.as_json = as_json
        from specparity.engine_env import running_environment

        # a command re-run in an engine's pinned environment lists that environment's packages
        envs = running_environment()
        extra = {"environments": envs, **identity_extra} if envs else identity_extra
        self.sink = RecordSink(record_dir, kind, title, identity(**extra), slug=slug)
        self.observer = CliObserver(self.sink, show=not (quiet or as_json) and sys.stderr.isatty())

    def __enter__(self) -> CommandRun:
        self.sink.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.sink.__exit__(*exc)

    def finish(self, report: Any, text: list[str] | None = None, markdown: list[str] | None = None,
               extra: dict[str, Any] | None = None,
               after: Callable[[Path | None], tuple[list[str], dict[str, Any]]] | None = None) -> int:
        """Close the record with ``report``, print it, return its exit code.

        text: the human lines (default ``report.lines()``); markdown: the
        record's body (default: the text in a code block); extra: more keys
        for ``--json`` (the record path is added when there is one); after: work
        on the closed record (``served --diagnose``): given its path, it returns
        more lines to print and more ``--json`` keys; the exit code stays the report's.
        """
        lines = list(report.lines()) if text is None else text
        path = self.sink.finish(report, markdown if markdown is not None else ["```", *lines, "```"])
        if after is not None:
            more, keys = after(path)
            lines, extra = [*lines, *more], {**(extra or {}), **keys}
        if self.as_json:
            emit_json(result_json(report, extra, path))
        else:
            for line in lines:
                click.echo(line)
            click.echo(f"verdict: {report.verdict}")
        if path is not None:
            click.echo(f"record written: {path}", err=True)
        return int(report.exit_code)


def top_json(exit_code: int, body: Mapping[str, Any], verdict: str | None = None) -> dict[str, Any]:
    """What every ``--json`` prints: the process's ``verdict`` and ``exit_code`` first, then ``body``.

    verdict: the word of the report the command judged; None: the word of ``exit_code``
    (:func:`specparity.verdicts.of_exit`: ``pass`` for a command that judges nothing and did its job,
    ``error`` for an error). A verdict or exit code in ``body`` never shows at the top: a consumer reads
    the process's there, never a record's.
    """
    from specparity.verdicts import of_exit

    word = str(verdict) if verdict is not None else str(of_exit(exit_code))
    payload = {"verdict": word, "exit_code": exit_code, **body}
    payload["verdict"], payload["exit_code"] = word, exit_code
    # what json.dumps(default=str) would print: the schemas and the tests see exactly the output
    out: dict[str, Any] = json.loads(json.dumps(payload, default=str))
    return out


def result_json(report: Any, extra: dict[str, Any] | None = None, path: Path | None = None) -> dict[str, Any]:
    """What ``--json`` prints for ``report``: its ``verdict`` and ``exit_code`` first, then the whole result.

    The same object renders the text (``report.lines()``), so the two say the same things. A report
    whose text says more than its record's summary (``served``: every request) gives the whole of it
    as ``result_dict()``; others' ``to_dict()`` is the whole. extra: more keys (the model, the
    engine); path: the record written, as ``record``.
    """
    whole = getattr(report, "result_dict", None)
    body = {**(whole() if callable(whole) else report.to_dict()), **(extra or {})}
    if path is not None:
        body["record"] = str(path)
    return top_json(int(report.exit_code), body, str(report.verdict))


def error_json(exit_code: int, line: str) -> dict[str, Any]:
    """What ``--json`` prints when the command ends in an error (usage, infrastructure, a bug, a signal):
    ``{"verdict": "error", "exit_code": N, "error": "<the one line>"}`` (``inconclusive`` for exit 3)."""
    return top_json(exit_code, {"error": line})


def emit_json(obj: dict[str, Any]) -> None:
    """Print one ``--json`` object (:func:`top_json`'s) on stdout; the run's error handler then prints
    no second one."""
    json.dump(obj, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
    ctx = click.get_current_context(silent=True)
    if ctx is not None and isinstance(ctx.find_root().obj, dict):
        ctx.find_root().obj[JSON_PRINTED] = True
