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

from specparity import __version__
from specparity.errors import EXIT_BUG, EXIT_INTERRUPTED, EXIT_USAGE, SpecparityError

# name -> (module, attribute, one-line help shown by --help without importing it)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "fixtures": ("specparity.commands.fixtures", "fixtures", "Build the embedded test checkpoints."),
    "probe": ("specparity.commands.probe", "probe", "Block-vs-chain, long-walk and prefill parity probes."),
    "gate": ("specparity.commands.gate", "gate", "Memoized allow/decline verdict for a width."),
    "bisect": ("specparity.commands.bisect", "bisect", "Locate the first divergent layer and sub-op."),
    "replay": ("specparity.commands.replay", "replay", "Replay a served run's accept lengths in process."),
    "dist": ("specparity.commands.dist", "dist", "Test an acceptance rule for distributional exactness."),
    "accept": ("specparity.commands.accept", "accept", "Measured acceptance against its closed forms."),
    "records": ("specparity.commands.records", "records", "Show and list records any command wrote."),
    "served": ("specparity.commands.served", "served", "Served greedy parity: servers with and without a drafter."),
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
@click.pass_context
def cli(ctx: click.Context, debug: bool, verbose: bool) -> None:
    """Prove or disprove that a speculative-decoding path is exactly classic decode.

    \b
    Exit codes: 0 all pass, 1 divergence found, 2 usage or configuration
    error, 3 inconclusive, 4 infrastructure error, 70 unexpected error (a bug).

    \b
    Example:
        specparity probe --widths 2,4,8 --depths 0,32
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(name)s: %(message)s",
        stream=sys.stderr,
    )


def main(argv: list[str] | None = None) -> None:
    debug = "--debug" in (argv if argv is not None else sys.argv[1:]) or bool(
        os.environ.get("SPECPARITY_DEBUG")
    )
    try:
        rv = cli.main(args=argv, prog_name="specparity", standalone_mode=False)
    except SpecparityError as err:
        if debug:
            raise
        click.echo(f"Error: {err}", err=True)
        sys.exit(err.exit_code)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except click.ClickException as err:
        err.show()
        sys.exit(EXIT_USAGE)
    except KeyboardInterrupt:
        click.echo("Interrupted.", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except click.exceptions.Exit as err:
        sys.exit(err.exit_code)
    except Exception as err:  # an unknown error is a bug: one line, traceback behind --debug
        if debug:
            raise
        click.echo(
            f"Error: unexpected {type(err).__name__}: {err} (rerun with --debug for the traceback)",
            err=True,
        )
        sys.exit(EXIT_BUG)
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
