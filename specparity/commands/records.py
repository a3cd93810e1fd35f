"""``specparity records``: read any record any command wrote (no mlx import: instant)."""

from __future__ import annotations

from typing import Any

import click

from specparity.commands._common import emit_json, json_option, result_json, top_json
from specparity.errors import EXIT_OK, UsageError
from specparity.outputs import force_option
# show_lines: the lines of `records show`, importable from here as before
from specparity.records.show import data_dir, list_rows, open_record, show_lines
from specparity.records.text import printable

__all__ = ["records", "show_lines"]


@click.group()
def records() -> None:
    """Read records written with --record-dir by any command.

    \b
    Examples:
        specparity probe --widths 4 --depths 0 --record-dir results    # every command keeps one
        specparity records list results/
        specparity records show results/probe-*.md
        specparity records show results/ --json      # the newest record in results/
        specparity served --config examples/nightly.yaml --shard 1/2 --record-dir shard1   # exit 1
        specparity served --config examples/nightly.yaml --shard 2/2 --record-dir shard2   # exit 1
        specparity records merge shard1/ shard2/ --out merged/      # exit 1: the job's verdict
        specparity records compare shard1/ merged/      # exit 0; a regression exits 1
        specparity records html merged/ --out merged.html   # a page to look at
    """


@records.command("show")
@click.argument("path", metavar="RECORD|DIR")
@json_option
def show(path: str, as_json: bool) -> int:
    """Print a record's verdict, reach and per-part table.

    A served record prints, per pairing, a table of arms x requests with the
    verdict in each cell, the arms grouped by completion sha256, and the
    reason of every request that did not match.

    RECORD is a record's .md file, its data/<name>/ directory or its
    report.json; a records directory shows its newest record. An incomplete
    record (interrupted, failed, or still running / killed) says so and
    claims no verdict.
    """
    rec, identity, arms = open_record(path)
    if as_json:
        # the record's own verdict and exit code under "report": the top is this process's (exit 0)
        emit_json(top_json(EXIT_OK, {"report": rec.to_dict(), "identity": identity, "results": arms}))
    else:
        click.echo("\n".join(show_lines(rec, identity, arms)))
    return EXIT_OK


@records.command("list")
@click.argument("directory", type=click.Path(file_okay=False), metavar="DIR")
@json_option
def list_(directory: str, as_json: bool) -> int:
    """One line per record in DIR: name, kind, status, verdict, started."""
    rows = list_rows(directory)
    if as_json:
        emit_json(top_json(EXIT_OK, {"records": rows}))
        return EXIT_OK
    if not rows:
        click.echo(f"no records in {directory}")
    for r in rows:
        click.echo(printable(f"{r['name']}  {r.get('kind', '-')}  {r['status']}  {r.get('verdict') or '-'}"
                             f"  {r.get('started') or '-'}  {r.get('title') or ''}"))
    return EXIT_OK


def _report(report: Any, as_json: bool, extra: dict[str, Any] | None = None) -> int:
    """Print a report as every command does: its lines then ``verdict: WORD``, or --json; its exit code."""
    if as_json:
        emit_json(result_json(report, extra))
    else:
        for line in report.lines():
            click.echo(printable(line))  # the lines quote records' text: shown, never terminal control
        click.echo(f"verdict: {report.verdict}")
    return int(report.exit_code)


@records.command("compare")
@click.argument("old", metavar="OLD")
@click.argument("new", metavar="NEW")
@json_option
def compare(old: str, new: str, as_json: bool) -> int:
    """What changed from OLD to NEW, two records of one kind (e.g. last night's and tonight's).

    Served records are matched by pairing, arm and request id: what regressed
    (passed, now does not: match -> diverged / error / not_engaged ...), what
    was fixed, other verdict changes, evidence changes (engaged -> not
    engaged, a decline that appeared), identity changes (model fingerprints,
    mlx / mlx-lm / specparity / Python versions, server version output,
    kernel env, git commit) and arms only one record has. A night across
    engines (pairings on several engines' profiles) lists each category's
    changes under each engine (its pairing's profile's engine:) and ends with
    one line per engine, "no change" included (--json: "engines"). OLD and
    NEW are record .md files, data directories, or records directories (their
    newest record).

    \b
    Exit codes: 0 no regression (verdict match), 1 a regression (verdict
    diverged), 2 the records cannot be compared (different kinds, incomplete).

    \b
    Examples:
        specparity records compare shard1/served-*.md merged/served-*.md
        specparity records compare shard1/ merged/ --json
    """
    from specparity.records.compare import compare_records

    return _report(compare_records(data_dir(old), data_dir(new)), as_json)


@records.command("merge")
@click.argument("shards", nargs=-1, required=True, metavar="SHARD...")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), metavar="DIR",
              help="Records directory for the merged record.")
@json_option
def merge(shards: tuple[str, ...], out_dir: str, as_json: bool) -> int:
    """Join the records of `specparity served --shard i/n` into one served record.

    Each arm comes from the shard that ran it, baselines from the first shard
    that ran the pairing; arms go back into the unsharded run order and each
    pairing is judged again, so verdicts, sha256 groups and texts equal the
    unsharded record's (timings differ). Refuses, naming the file, shards of
    different job configs or identities (versions, git commit, env, server
    versions; hosts may differ), a shard given twice or missing, and records
    that are not complete shards. Exits with the merged record's verdict code.

    \b
    Examples:
        specparity records merge shard1/ shard2/ --out nightly/     # exit 1: the job's verdict
    """
    import sys

    from specparity.records.merge import merge_records

    paths = [data_dir(s) for s in shards]
    report, path = merge_records(paths, out_dir, argv=["specparity", *sys.argv[1:]])
    click.echo(f"record written: {path}", err=True)
    return _report(report, as_json, {"record": str(path)})


# -- records junit (issue 13, the nightly job): a self-contained block ----------------------------
@records.command("junit")
@click.argument("path", metavar="RECORD|DIR")
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False), metavar="FILE",
              help="The JUnit XML file to write (its folder is created; never overwritten without --force).")
@force_option
@json_option
def junit(path: str, out: str, force: bool, as_json: bool) -> int:
    """Write a served record as JUnit XML: one test case per arm and request.

    Classname ``<pairing>.<arm>``, name ``<request id> (<kind>)``: diverged is
    a failure carrying the width and the first divergence, declined and
    not_engaged are skipped with their reason, error is an error. Exits 0
    once the file is written, whatever the record's verdict (the run's own
    exit code says that); 2, writing nothing, for a record that did not
    complete (interrupted, failed, or still running).

    \b
    Examples:
        specparity records junit merged/served-*.md --out parity.xml
        specparity records junit merged/ --out newest.xml      # the newest record
    """
    from specparity.outputs import check_new_file
    from specparity.records.junit import write_junit
    from specparity.records.served import ServedRecord

    check_new_file(out, "--out", force, make_parents=True)
    rec, identity, parts = open_record(path)
    sr = ServedRecord.of(rec.path, rec, identity, parts)
    if not rec.is_complete:  # its finished parts would read as a green suite: refused, as compare does
        raise UsageError(f"{rec.path}: record is {rec.status}, not complete: no JUnit for a run that did not"
                         " finish (its finished parts: specparity records show)")
    summary = write_junit(sr, out, force=force)  # claimed atomically: a link there is replaced, never written through
    if as_json:
        emit_json(top_json(EXIT_OK, {"junit": str(summary.path), "tests": summary.tests, "failures": summary.failures,
                                     "errors": summary.errors, "skipped": summary.skipped, "record": rec.path}))
    else:
        click.echo(summary.line())
    return EXIT_OK


# -- records html (issue 28): a self-contained page to look at -------------------------------------
@records.command("html")
@click.argument("paths", nargs=-1, required=True, metavar="RECORD|DIR...")
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False), metavar="FILE",
              help="The HTML file to write (its folder is created; never overwritten without --force).")
@force_option
@json_option
def html(paths: tuple[str, ...], out: str, force: bool, as_json: bool) -> int:
    """Write served records as one self-contained HTML page (opens offline).

    The newest record gets the engine x pairing x width grid coloured by
    verdict, acceptance and margin charts, and per request a drill-down: the
    two texts aligned at the first difference, the tokens and margins around
    it, the cause where named, and the command that reproduces it. Given
    several records (or a directory of nightly records), the page also shows
    each arm's verdict per night (the newest 30) and when each cell changed. Everything is
    inline: no network, no CDN. An incomplete record is shown as incomplete.
    Exits 0 once the file is written, whatever the records' verdicts.

    \b
    Examples:
        specparity records html merged/served-*.md --out parity.html
        specparity records html shard1/ merged/ --out nights.html      # every served record in both
    """
    from specparity.outputs import check_new_file
    from specparity.records.html import write_html

    check_new_file(out, "--out", force, make_parents=True)
    summary = write_html(paths, out, force=force)  # claimed atomically: a link there is replaced, never written through
    if as_json:
        emit_json(top_json(EXIT_OK, summary.to_dict()))
    else:
        click.echo(summary.line())
    return EXIT_OK
