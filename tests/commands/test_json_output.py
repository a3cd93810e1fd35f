"""The published JSON Schemas (specparity/schemas): valid, installed, one per command's ``--json``.

The outputs themselves are validated where the suite already produces them: conftest's ``run_cli``
(and the in-process ``run_main`` of the bisect tests) checks every ``--json`` it prints and every
record it writes against these schemas, so each command's existing tests are its schema's tests.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any

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
    assert r.returncode == 0 and json.loads(r.stdout) == {"verdict": "pass", "exit_code": 0, "records": []}
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


# -- the contract: one object, the process's verdict and exit code at the top (README, "Every command") -------
JSON_COMMANDS = [tuple(p) for p in _json_commands()]


def _fake_profile(tmp: Path) -> str:
    """A served profile on tests/fakeserver.py: a real server process, no model in it (answers at once)."""
    import yaml

    fake = str(Path(__file__).resolve().parents[1] / "fakeserver.py")
    prof = tmp / "fake.yaml"
    prof.write_text(yaml.safe_dump({
        "name": "fake", "argv": ["{python}", "-I", fake, "--model", "{model}", "--host", "{host}", "--port", "{port}",
                                 "--mode", "ok"],
        "draft_argv": ["--draft-model", "{draft_model}", "--num-draft-tokens", "{num_draft}"]}))
    return str(prof)


def _diverged_record(tmp: Path) -> str:
    """A complete served record whose own verdict is diverged (exit 1): `records show` and `records html`
    printed that verdict and exit code at the top of a process that exits 0."""
    from served_records import served_record

    md = served_record(tmp / "rec")
    report = md.parent / "data" / md.stem / "report.json"
    data = json.loads(report.read_text())
    data["verdict"] = data["summary"]["verdict"] = "diverged"
    data["exit_code"] = data["summary"]["exit_code"] = 1
    report.write_text(json.dumps(data))
    return str(md)


def _dump(cli_bin: str, tmp: Path, target: str) -> str:
    out = tmp / "d.safetensors"
    r = run_cli(cli_bin, "bisect", "dump", "--model", target, "--width", "2", "--out", str(out))
    assert r.returncode == 0, r.stderr
    return str(out)


Build = Callable[[Any], list[str]]  # (the test's context) -> argv without --json
MODEL, SLOW, SERVER = pytest.mark.model, pytest.mark.slow, pytest.mark.server
# each command's cheapest run: keyed by the paths the click group has (a new command with --json has none here
# and fails below until it gets one). Where a success needs what a test cannot build cheaply, the run is the
# documented error (merge: not a shard; env show: not built), which the contract covers as well.
RUNS: dict[tuple[str, ...], list[tuple[Build, tuple[Any, ...]]]] = {
    ("probe",): [(lambda c: ["probe", "--model", c.target, "--widths", "2", "--depths", "0", "--no-prefill"],
                  (MODEL,))],
    ("gate", "check"): [(lambda c: ["gate", "check", "--model", c.target, "--width", "2"], (MODEL,))],
    ("gate", "list"): [(lambda c: ["gate", "list"], ())],
    ("bisect",): [(lambda c: ["bisect", "--model", c.target, "--width", "2", "--depth", "0"], (MODEL,))],
    ("bisect", "dump"): [(lambda c: ["bisect", "dump", "--model", c.target, "--width", "2", "--out",
                                     str(c.tmp / "out.safetensors")], (MODEL,))],
    ("bisect", "diff"): [(lambda c: ["bisect", "diff", c.dump, c.dump, "--a-arm", "chain", "--b-arm", "block"],
                          (MODEL,))],
    ("replay",): [(lambda c: ["replay", "--model", c.target, "--accepts", "1,1", "--width", "2"], (MODEL,)),
                  (lambda c: ["replay", "--accepts", "1,1", "--width", "2", "--locate", "1"], ())],
    ("dist",): [(lambda c: ["dist", "--samples", "200"], ())],
    ("accept",): [(lambda c: ["accept", "--model", c.target, "--draft-model", c.draft, "--positions", "2",
                              "--draws", "50"], (MODEL,))],
    ("e2e",): [(lambda c: ["e2e", "--model", c.target, "--draft-model", c.draft, "--max-tokens", "2"],
                (MODEL, SLOW))],
    ("served",): [(lambda c: ["served", "--model", c.target, "--draft-model", c.draft, "--profile",
                              _fake_profile(c.tmp), "--widths", "2", "--max-tokens", "4", "-q"],
                   (MODEL, SERVER, SLOW))],
    ("records", "show"): [(lambda c: ["records", "show", c.record], ())],
    ("records", "list"): [(lambda c: ["records", "list", str(Path(c.record).parent)], ())],
    ("records", "compare"): [(lambda c: ["records", "compare", c.record, c.record], ())],
    ("records", "merge"): [(lambda c: ["records", "merge", c.record, "--out", str(c.tmp / "merged")], ())],
    ("records", "junit"): [(lambda c: ["records", "junit", c.record, "--out", str(c.tmp / "p.xml")], ())],
    ("records", "html"): [(lambda c: ["records", "html", c.record, "--out", str(c.tmp / "p.html")], ())],
    ("env", "list"): [(lambda c: ["env", "list"], ())],
    ("env", "show"): [(lambda c: ["env", "show", "mlx-lm-0.32.2"], ())],
    ("fixtures", "make"): [(lambda c: ["fixtures", "make", str(c.tmp / "fx"), "--no-draft"], (MODEL,))],
    ("fixtures", "gguf"): [(lambda c: ["fixtures", "gguf", c.target, str(c.tmp / "t.gguf")], (MODEL,))],
    ("fixtures", "formats"): [(lambda c: ["fixtures", "formats"], ())],
    ("diagnose",): [(lambda c: ["diagnose", c.record], ())],
}


class _Context:
    """What a run needs, made when first asked for: the cached llama pair, a record, a dump."""

    def __init__(self, request: pytest.FixtureRequest, cli_bin: str, tmp: Path):
        self.request, self.cli_bin, self.tmp = request, cli_bin, tmp

    @property
    def target(self) -> str:
        return str(self.request.getfixturevalue("llama_pair").target)

    @property
    def draft(self) -> str:
        return str(self.request.getfixturevalue("llama_pair").draft)

    @cached_property
    def record(self) -> str:
        return _diverged_record(self.tmp)

    @cached_property
    def dump(self) -> str:
        return _dump(self.cli_bin, self.tmp, self.target)


def _runs() -> list[Any]:
    out = []
    for path in JSON_COMMANDS:
        for i, (_, marks) in enumerate(RUNS.get(path, [(None, ())])):
            out.append(pytest.param(path, i, marks=marks, id=f"{'-'.join(path)}-{i}"))
    return out


@pytest.mark.parametrize("path, i", _runs())
def test_every_json_output_is_one_object_with_the_process_verdict_and_exit_code_at_the_top(
        path: tuple[str, ...], i: int, cli_bin: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    from specparity import verdicts

    assert path in RUNS, f"specparity {' '.join(path)} has --json and no run here: add its cheapest one to RUNS"
    argv = [*RUNS[path][i][0](_Context(request, cli_bin, tmp_path)), "--json"]
    r = run_cli(cli_bin, *argv)
    obj = json.loads(r.stdout)
    assert isinstance(obj, dict) and list(obj)[:2] == ["verdict", "exit_code"], r.stdout[:300]
    assert obj["exit_code"] == r.returncode, (argv, obj["verdict"], obj["exit_code"], r.returncode, r.stderr)
    # the word agrees with the code: a verdict's own code (0 1 3 4), error for any other
    assert (verdicts.exit_code(obj["verdict"]) == r.returncode if r.returncode in (0, 1, 3, 4)
            else obj["verdict"] == "error"), (argv, obj["verdict"], r.returncode)
    validate(obj, schemas.for_argv(argv), " ".join(argv))


def test_every_run_above_is_of_a_command_the_click_group_has() -> None:
    assert set(RUNS) == set(JSON_COMMANDS), set(RUNS) ^ set(JSON_COMMANDS)


@pytest.mark.parametrize("path", JSON_COMMANDS, ids="-".join)
def test_a_usage_error_with_json_prints_the_error_object(path: tuple[str, ...], cli_bin: str) -> None:
    """stdout was empty on a usage error: a consumer reading --json had nothing to parse."""
    r = run_cli(cli_bin, *path, "--json", "--no-such-flag")
    assert r.returncode == 2 and r.stderr.startswith("Error: No such option '--no-such-flag'"), r.stderr
    assert json.loads(r.stdout) == {"verdict": "error", "exit_code": 2, "error": r.stderr.strip()[len("Error: "):]}


@pytest.mark.parametrize("argv", [["serve", "--json"], ["--json"], ["no-such-command", "--json"]], ids=" ".join)
def test_a_command_line_without_json_output_still_prints_the_error_object(argv: list[str], cli_bin: str) -> None:
    r = run_cli(cli_bin, *argv)
    assert r.returncode == 2 and json.loads(r.stdout)["error"] == r.stderr.strip()[len("Error: "):]
    assert schemas.for_argv(argv) == schemas.ERROR_OBJECT


def test_ctrl_c_with_json_prints_the_error_object(cli_bin: str, tmp_path: Path) -> None:
    """Ctrl-C (here inside a user rule of dist, no server) left stdout empty; it is the error object, exit 130."""
    from conftest import sleeping_dist

    proc = sleeping_dist(cli_bin, tmp_path, "--json")
    try:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, (proc.returncode, err)
    line = err.strip().splitlines()[-1]
    assert json.loads(out) == {"verdict": "error", "exit_code": 130, "error": line}


def test_each_command_schema_carries_the_one_error_object() -> None:
    """The error object is spelled once (error-object.schema.json); each command's schema holds the same copy."""
    error = {k: v for k, v in schemas.load(schemas.ERROR_OBJECT).items() if k not in ("$schema", "$id", "title")}
    for name in {schemas.for_argv([*p, "--json"]) for p in JSON_COMMANDS} | {"replay-locate"}:
        s = schemas.load(name)
        assert s["$defs"]["error"] == error and s["then"] == {"$ref": "#/$defs/error"}, name
