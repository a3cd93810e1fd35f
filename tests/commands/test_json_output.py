"""The published JSON Schemas (specparity/schemas): valid, installed, one per command's ``--json``.

The outputs themselves are validated where the suite already produces them: conftest's ``run_cli``
(and the in-process ``run_main`` of the bisect tests) checks every ``--json`` it prints and every
record it writes against these schemas, so each command's existing tests are its schema's tests.
"""

from __future__ import annotations

import json

import click
import jsonschema
import pytest
from conftest import check_records, run_cli, validate

from specparity import schemas
from specparity.cli import cli


def _json_commands() -> list[list[str]]:
    """Every command path whose command takes ``--json`` (``["records", "show"]``, ``["probe"]``, ...)."""
    ctx = click.Context(cli)
    out: list[list[str]] = []

    def walk(cmd: click.Command, path: list[str]) -> None:
        if any("--json" in p.opts for p in cmd.params):
            out.append(path)
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                assert sub is not None
                walk(sub, [*path, name])

    for name in cli.list_commands(ctx):
        command = cli.get_command(ctx, name)
        assert command is not None
        walk(command, [name])
    return out


def test_every_published_schema_is_valid_and_installed_with_the_package() -> None:
    names = schemas.names()
    assert {"served", "record-report", "record-identity", "record-served-arm", "record-served-request"} <= set(names)
    for name in names:
        s = schemas.load(name)
        jsonschema.Draft202012Validator.check_schema(s)
        assert s["$id"].endswith(f"/{name}.schema.json") and s["title"]
    with pytest.raises(KeyError, match="no schema 'nope'"):
        schemas.load("nope")


def test_every_command_with_json_output_has_its_schema() -> None:
    paths = _json_commands()
    # every command that prints a result (the servers and builders print paths or serve)
    assert {tuple(p) for p in paths} >= {
        ("probe",), ("gate", "check"), ("gate", "list"), ("bisect",), ("bisect", "dump"), ("bisect", "diff"),
        ("replay",), ("dist",), ("accept",), ("e2e",), ("served",), ("records", "show"), ("records", "list"),
        ("records", "compare"), ("records", "merge"), ("records", "junit"), ("env", "list"), ("env", "show"),
        ("fixtures", "make"), ("fixtures", "gguf")}
    for p in paths:
        name = schemas.for_argv([*p, "--json"])
        assert name is not None and name in schemas.names(), p
    # global options with their values are skipped; --locate prints its own list
    assert schemas.for_argv(["--max-width", "8", "replay", "--log", "x", "--locate", "3", "--json"]) == "replay-locate"
    assert schemas.for_argv(["records", "merge", "a", "--out", "b", "--json"]) == "served"


def test_the_validator_fires_on_a_wrong_output_and_passes_a_real_one(tmp_path, cli_bin) -> None:
    """The check every run goes through: a real ``records list --json`` passes; a verdict outside the
    vocabulary, a missing exit_code, a request without its first difference's type are each named."""
    r = run_cli(cli_bin, "records", "list", str(tmp_path), "--json")
    assert r.returncode == 0 and json.loads(r.stdout) == []
    with pytest.raises(AssertionError, match=r"probe.schema.json at verdict: 'green' is not one of"):
        validate({"verdict": "green", "exit_code": 0, "cells": [], "prefill": [], "bracket": None, "prompts": [],
                  "seconds": 0.0}, "probe")
    with pytest.raises(AssertionError, match="'exit_code' is a required property"):
        validate({"verdict": "equal"}, "probe")
    line = {"id": "p0", "kind": "fresh", "verdict": "diverged", "classic": {"token_index": "3"}}
    with pytest.raises(AssertionError, match="record-served-request.schema.json at (classic|.*)"):
        validate(line, "record-served-request")
    # a record directory: a report.json of the wrong shape is named with its file
    data = tmp_path / "rec" / "data" / "x"
    data.mkdir(parents=True)
    (data / "report.json").write_text(json.dumps({"kind": "probe", "title": "t", "argv": [], "status": "done"}))
    with pytest.raises(AssertionError, match=r"report.json does not follow record-report.schema.json at status"):
        check_records(tmp_path / "rec")
