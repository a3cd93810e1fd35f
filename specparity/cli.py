"""The ``specparity`` command line: one thin click group.

Subcommands live in ``specparity.commands.<name>`` and are imported only when
invoked, so ``specparity --help`` never imports mlx or mlx-lm.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys

import click

from specparity import __version__, inputs
from specparity.errors import (
    EXIT_BUG, EXIT_INFRA, EXIT_INTERRUPTED, EXIT_USAGE, SpecparityError, Terminated, first_line,
)

# name -> (module, attribute, one-line help shown by --help without importing it)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "fixtures": ("specparity.commands.fixtures", "fixtures", "Build the embedded test checkpoints."),
    "probe": ("specparity.commands.probe", "probe", "Block-vs-chain, long-walk and prefill parity probes."),
    "gate": ("specparity.commands.gate", "gate", "Memoized allow/decline verdict for a width."),
    "bisect": ("specparity.commands.bisect", "bisect", "Locate the first divergent layer and sub-op."),
    "replay": ("specparity.commands.replay", "replay", "Replay a served run's accept lengths in process."),
    "dist": ("specparity.commands.dist", "dist", "Test an acceptance rule for distributional exactness."),
    "accept": ("specparity.commands.accept", "accept", "Measured acceptance against its closed forms."),
    "e2e": ("specparity.commands.e2e", "e2e", "mlx-lm's own entry points with vs without the drafter."),
    "records": ("specparity.commands.records", "records", "Show and list records any command wrote."),
    "serve": ("specparity.commands.serve", "serve", "mlx-lm's server with the exactness gate and counts."),
    "served": ("specparity.commands.served", "served", "Served greedy parity: servers with and without a drafter."),
    "env": ("specparity.commands.env", "env", "Engines' pinned environments: build once, list, path."),
    "diagnose": ("specparity.commands.diagnose", "diagnose", "Take a served record's findings to their located cause."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(n for n, (mod, _, _) in COMMANDS.items() if _module_exists(mod))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None or not _module_exists(entry[0]):
            return None
        module = importlib.import_module(entry[0])
        return getattr(module, entry[1])

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(n, COMMANDS[n][2]) for n in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _module_exists(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="specparity")
@click.option("--debug", is_flag=True, envvar="SPECPARITY_DEBUG", help="Show tracebacks.")
@click.option("-v", "--verbose", is_flag=True, help="Progress logging on stderr.")
@click.option("--max-width", type=click.IntRange(min=1), default=inputs.DEFAULT_MAX_WIDTH, show_default=True,
              envvar="SPECPARITY_MAX_WIDTH", help="Largest verify block (rows) any input may ask for.")
@click.option("--max-positions", type=click.IntRange(min=1), default=inputs.DEFAULT_MAX_POSITIONS, show_default=True,
              envvar="SPECPARITY_MAX_POSITIONS",
              help="Most tokens decoded past the prompt (depth, walk, replayed or generated tokens).")
@click.option("--max-samples", type=click.IntRange(min=1), default=inputs.DEFAULT_MAX_SAMPLES, show_default=True,
              envvar="SPECPARITY_MAX_SAMPLES", help="Most Monte-Carlo draws (dist, accept).")
@click.option("--max-items", type=click.IntRange(min=1), default=inputs.DEFAULT_MAX_ITEMS, show_default=True,
              envvar="SPECPARITY_MAX_ITEMS",
              help="Most entries of one list in a served job file (pairings, controls, prompts, sequence, stop).")
@click.pass_context
def cli(ctx: click.Context, debug: bool, verbose: bool, max_width: int, max_positions: int,
        max_samples: int, max_items: int) -> None:
    """Prove or disprove that a speculative-decoding path is exactly classic decode.

    \b
    Exit codes: 0 all pass, 1 divergence found, 2 usage or configuration
    error, 3 inconclusive, 4 infrastructure error, 70 unexpected error (a bug),
    129 SIGHUP (the terminal closed), 130 Ctrl-C, 143 SIGTERM. With --json,
    stdout is one JSON object whatever happens: the process's verdict and
    exit_code first; on an error, with the error's line as "error".

    \b
    Example:
        specparity probe --widths 2,4,8 --depths 0,32
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    inputs.set_limits(inputs.Limits(max_width, max_positions, max_samples, max_items))
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(name)s: %(message)s",
        stream=sys.stderr,
    )


def _debug_requested(argv: list[str]) -> bool:
    # the same words click's envvar accepts for a flag: 1/true/yes/on
    env = os.environ.get("SPECPARITY_DEBUG", "").strip().lower()
    return "--debug" in argv or env in ("1", "true", "t", "yes", "y", "on")


def main(argv: list[str] | None = None) -> None:
    """Run the CLI. ``--debug`` adds tracebacks on stderr and changes no exit code."""
    args = list(argv if argv is not None else sys.argv[1:])
    debug = _debug_requested(args)
    from specparity.engine_env import claim_rerun_result, report_rerun

    result_to = claim_rerun_result()
    try:
        code = _run(args, debug)
    except BaseException as err:  # noqa: BLE001  (a handler below failed: the last line, never a verdict's code)
        sys.stderr.write(f"Error: unexpected {type(err).__name__} while reporting an error:"
                         f" {first_line(str(err))}\n")
        code = EXIT_INTERRUPTED if isinstance(err, KeyboardInterrupt) else EXIT_BUG
    report_rerun(result_to, args, code)  # a re-run in an engine's environment: its parent believes only this
    sys.exit(code)


def command_worker() -> int:
    """Step 8's worker in a pinned environment (specparity.diagnose.command_worker, which starts it): one JSON line
    ``{"argv": [...]}`` per command on stdin, each run as ``specparity ARGV`` runs (:func:`_run`), one line back
    ``{"exit_code": n, "said": "last stderr line"}`` on a descriptor of its own (whatever a command writes to
    descriptor 1 lands on /dev/null, never inside the answers). End of input: it exits."""
    import contextlib
    import gc
    import io
    import json

    out = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            argv = [str(a) for a in json.loads(line)["argv"]]
        except (ValueError, KeyError, TypeError):
            out.write(json.dumps({"exit_code": None, "said": "not a command line"}) + "\n")
            continue
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            code = _run(argv, False)
        said = next((x.strip() for x in reversed(err.getvalue().splitlines()) if x.strip()), "")
        gc.collect()  # the command's checkpoints let go before the next loads its own
        with contextlib.suppress(ImportError, AttributeError):
            import mlx.core as mx

            mx.clear_cache()
        out.write(json.dumps({"exit_code": int(code), "said": said}) + "\n")
    return 0


def _run(args: list[str], debug: bool) -> int:
    """Run the command line ``args``; its exit code, each known error reported on one line (on stderr,
    and as the ``--json`` object on stdout where the command line asked for --json)."""
    code = EXIT_BUG
    error: str | None = None  # the one line an error is reported with
    # the argv rides along: a command that re-runs in an engine's environment passes it on
    obj: dict[str, object] = {"argv": args}
    try:
        rv = cli.main(args=args, prog_name="specparity", standalone_mode=False, obj=obj)
        code = rv if isinstance(rv, int) and not isinstance(rv, bool) else 0
    except SpecparityError as err:
        _traceback(debug)
        # a library names a bad input in its own terms; on the command line it is the flag
        error = _say(f"Error: {first_line(err.as_flag())}")
        code = err.exit_code
    except click.exceptions.Abort as err:
        # click turns KeyboardInterrupt (and so Terminated) into Abort
        error, code = _interrupted(err.__cause__)
    except click.ClickException as err:
        # click's own usage errors (a bad option value, a missing argument): one line, exit 2,
        # not click's Usage / Try / blank / Error block
        _traceback(debug)
        if isinstance(err, getattr(click.exceptions, "NoArgsIsHelpError", ())):
            err.show()  # a group named without a command: its help, as the user asked
        else:
            error = _say(f"Error: {first_line(err.format_message())}")
        code = EXIT_USAGE
    except Terminated as err:
        _traceback(debug)
        error = _say(err.line)
        code = err.exit_code
    except KeyboardInterrupt:
        _traceback(debug)
        error = _say("Interrupted.")
        code = EXIT_INTERRUPTED
    except click.exceptions.Exit as err:
        code = err.exit_code
    except ModuleNotFoundError as err:
        # a package missing from this interpreter (a damaged engine environment): infrastructure, unless
        # specparity lacks one of its own modules, which is a bug
        _traceback(debug)
        if err.name and err.name.split(".")[0] != "specparity":
            error = _say(f"Error: {_missing_module_message(err.name)}")
            code = EXIT_INFRA
        else:
            error = _say(f"Error: unexpected ModuleNotFoundError: {first_line(str(err))}"
                         f"{'' if debug else ' (rerun with --debug for the traceback)'}")
            code = EXIT_BUG
    except (Exception, SystemExit) as err:  # noqa: BLE001  (a bug: one line, exit 70)
        # A stdout its reader closed (`| head`): click turns the EPIPE into SystemExit(1); no bug, no verdict
        # (the output is cut short): one line, exit 4, never the "unexpected SystemExit" of a bug.
        # An unknown error is a bug: one line, exit 70, traceback behind --debug. A
        # SystemExit escaping a command was raised by code specparity ran (a checkpoint's
        # model_file, a user rule): its code is not a verdict.
        _traceback(debug)
        if _stdout_closed(err):
            _quiet_stdout()
            error = _say("Error: stdout was closed before the output was all written (its reader ended: `| head`?);"
                         " the output is cut short")
            code = EXIT_INFRA
        elif isinstance(err, OSError) and isinstance(err.__context__, KeyboardInterrupt):
            # click's own newline before its Abort failed on a terminal that hung up (SIGHUP): the interruption
            error, code = _interrupted(err.__context__)
        else:
            what = (f"SystemExit({err.code!r}) raised by code specparity ran (a model_file or a rule?)"
                    if isinstance(err, SystemExit) else f"{type(err).__name__}: {first_line(str(err))}")
            hint = "" if debug else " (rerun with --debug for the traceback)"
            error = _say(f"Error: unexpected {what}{hint}")
            code = EXIT_BUG
    if error is not None and _json_requested(args):
        # stdout is one JSON object, whatever ended the run (imported here: --help stays instant)
        from specparity.commands._common import JSON_PRINTED, emit_json, error_json

        # a result already printed (a signal while the servers stop after it) is not followed by a second object
        if not obj.get(JSON_PRINTED):
            try:
                emit_json(error_json(code, error))
            except OSError:
                pass  # a stdout that is gone (a closed terminal or pipe) takes nothing; the exit code says it
    return code


def _stdout_closed(err: BaseException) -> bool:
    """``err`` is a write to a stdout whose reader went away: BrokenPipeError, or the SystemExit(1) click raises
    for one (click has then wrapped stdout in its ``PacifyFlushWrapper``, which it does for nothing else)."""
    import errno

    if isinstance(err, SystemExit) and type(sys.stdout).__name__.endswith("PacifyFlushWrapper"):
        return True
    return any(isinstance(e, OSError) and e.errno == errno.EPIPE for e in (err, err.__context__))


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's flush at exit does not fail on the closed pipe again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def _interrupted(cause: BaseException | None) -> tuple[str, int]:
    """The line and exit code of a run Ctrl-C (click's Abort: ``Aborted.``, 130), SIGTERM or SIGHUP stopped."""
    if isinstance(cause, Terminated):
        return _say(cause.line), cause.exit_code
    return _say("Aborted."), EXIT_INTERRUPTED


def _say(line: str) -> str:
    """Print an error's one line on stderr; the line without its ``Error: `` (the --json ``error``)."""
    try:
        click.echo(line, err=True)
    except OSError:
        pass  # a terminal that hung up (SIGHUP) takes no line; the exit code and the record still say it
    return line.removeprefix("Error: ")


def _json_requested(args: list[str]) -> bool:
    # read from the argv, not the parsed options: a usage error can end the parse before --json is read
    return "--json" in (args[:args.index("--")] if "--" in args else args)


def _missing_module_message(module: str) -> str:
    """The line for a module this Python lacks; the handler that prints it must not fail itself (the
    environment it asks about may be what is broken), so a failure here falls back to the plain line."""
    try:
        from specparity.environments import missing_module_message

        return missing_module_message(module)
    except Exception:  # noqa: BLE001
        return f"this Python ({sys.prefix}) lacks the module {module}"


def _traceback(debug: bool) -> None:
    if debug:
        import traceback

        traceback.print_exc(file=sys.stderr)


if __name__ == "__main__":
    main()
