"""``specparity env``: engines' pinned environments (build once, list, path, show, remove)."""

from __future__ import annotations

from typing import Any

import click

from specparity.commands._common import emit_json, json_option, top_json
from specparity.errors import EXIT_OK, InfrastructureError


def _say(message: str) -> None:
    click.echo(message, err=True)


@click.group()
def env() -> None:
    """Engines' own environments: pinned packages built once into a cache.

    A server profile or a nightly config names an environment (``environment:
    dflash-mlx``); its server and in-process engine work run in that
    interpreter. Each is built once into $SPECPARITY_ENV_CACHE (default
    $SPECPARITY_HOME/envs) and is offline from then on. NAME is a packaged
    environment (see ``env list``) or a YAML file with name, packages (pinned,
    name==version), description, imports.

    \b
    Examples:
        specparity env list
        specparity env build dflash-mlx          # once; prints the interpreter
        specparity fixtures make ./fx                  # a pair to try: ./fx/target, ./fx/draft
        $(specparity env path --python mlx-lm-0.31.3) -m mlx_lm server --model ./fx/target   # until Ctrl-C
        specparity env show mlx-lm-0.32.2 --json
        specparity env remove mlx-lm-0.31.3
    """


@env.command("list")
@json_option
def list_cmd(as_json: bool) -> int:
    """Packaged environments (built or not) and every other one in the cache."""
    from specparity.environments import cache_root, list_environments

    rows = list_environments()
    if as_json:
        emit_json(top_json(EXIT_OK, {"cache": str(cache_root()), "environments": [r.to_dict() for r in rows]}))
        return EXIT_OK
    click.echo(f"cache: {cache_root()}")
    width = max([32, *(len(r.dirname) + 1 for r in rows)])
    for r in rows:
        e = r.environment
        if r.broken:
            state = "broken (see below)"
        elif e is None:
            state = "not built"
        else:
            size = e.manifest.get("size_bytes") or 0
            state = f"built, {size / 2**20:.0f} MiB" + ("" if r.current else ", stale: an older spec")
        desc = r.spec.description if r.spec else ""
        click.echo(f"{r.dirname:{width}} {state:24} {desc}")
    for r in rows:
        if r.broken:
            _say(f"warning: {r.broken}")
    return EXIT_OK


@env.command()
@click.argument("names", nargs=-1, metavar="NAME...")
@click.option("--all", "build_all", is_flag=True,
              help="Every packaged environment of every registered engine (before any NAME given).")
def build(names: tuple[str, ...], build_all: bool) -> int:
    """Build environments once (a built one returns at once); print each interpreter.

    Progress goes to stderr; pip's full output to the environment's build.log.
    No package index reachable: one Error line, exit 4. ``--all`` builds what
    every registered engine declares (CI's and README's install line), so a new
    engine's environments are built without naming them; one that needs a
    Python version this machine lacks is a "skipped:" line naming it.
    """
    from specparity.environments import base_interpreter, ensure_environment, load_spec, packaged
    from specparity.errors import UsageError

    if not names and not build_all:
        raise UsageError("name an environment (see specparity env list), or give --all")
    named = [load_spec(n) for n in names]
    listed = [s for s in packaged().values() if s not in named] if build_all else []
    for spec in listed + named:
        if spec in listed and spec.python:
            try:
                base_interpreter(spec)
            except InfrastructureError as err:  # --all: an interpreter this machine lacks is said, not fatal
                _say(f"skipped: {err}")
                continue
        click.echo(str(ensure_environment(spec, progress=_say).python))
    return EXIT_OK


@env.command()
@click.argument("name")
@click.option("--python", "python", is_flag=True, help="Print the interpreter instead of the directory.")
def path(name: str, python: bool) -> int:
    """The directory (or --python interpreter) of a built environment; exit 4 when not built."""
    from specparity.environments import require_environment

    e = require_environment(name)
    click.echo(str(e.python if python else e.path))
    return EXIT_OK


@env.command()
@click.argument("name")
@json_option
def show(name: str, as_json: bool) -> int:
    """A built environment: pins, installed packages, build time and size; exit 4 when not built."""
    from specparity.environments import find_environment, load_spec

    spec = load_spec(name)
    e = find_environment(spec)
    if e is None:
        raise InfrastructureError(f"environment {spec.name} is not built: run scripts/build-env {spec.name}")
    info: dict[str, Any] = {**e.identity(), "build_seconds": e.manifest.get("build_seconds"),
                            "size_bytes": e.manifest.get("size_bytes"), "built": e.manifest.get("built"),
                            "description": spec.description, "no_deps": list(spec.no_deps),
                            "left_out": list(spec.left_out)}
    if as_json:
        emit_json(top_json(EXIT_OK, info))
        return EXIT_OK
    click.echo(f"{e.name} ({spec.description})")
    click.echo(f"  path:    {e.path}")
    click.echo(f"  python:  {e.python} ({info['python']})")
    click.echo(f"  pins:    {', '.join(spec.packages)}")
    if spec.no_deps:
        click.echo(f"  without its dependencies: {', '.join(spec.no_deps)}")
    for line in spec.left_out:
        click.echo(f"  left out: {line}")
    click.echo(f"  built:   {info['built']} in {info['build_seconds']} s,"
               f" {(info['size_bytes'] or 0) / 2**20:.0f} MiB")
    click.echo("  packages:")
    for k, v in e.packages().items():
        click.echo(f"    {k}=={v}")
    return EXIT_OK


@env.command()
@click.argument("names", nargs=-1, required=True, metavar="NAME...")
def remove(names: tuple[str, ...]) -> int:
    """Delete built environments (NAME, or a directory name from ``env list``)."""
    from specparity.environments import remove_environment

    for n in names:
        if remove_environment(n, progress=_say) is None:
            _say(f"environment {n} is not built: nothing to remove")
    return EXIT_OK
