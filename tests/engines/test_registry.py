"""The engine registry: engines, consent before anything loads, a re-run believed only on its result, no orphans."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import run_cli

NO_DFLASH = pytest.mark.skipif(__import__("importlib").util.find_spec("dflash_mlx") is not None,
                               reason="dflash-mlx imports here: no re-run in its environment")


def test_the_registry_holds_every_engine_once_and_commands_offer_it(cli_bin: str) -> None:
    from specparity import engines
    from specparity.environments import PACKAGED

    names = engines.names()
    assert names[0] == engines.DEFAULT == "mlx-lm" and {"dflash-mlx", "llama.cpp"} <= set(names)
    assert len(set(names)) == len(names)
    assert "dflash-mlx" in engines.names(in_process=True) and "llama.cpp" not in engines.names(in_process=True)
    assert engines.for_profile("dflash_mlx") is engines.get("dflash-mlx")
    assert [e.name for s in engines.registry().values() for e in s.environments] == list(PACKAGED)
    with pytest.raises(engines.UsageError, match="engine 'nope': not registered"):
        engines.get("nope")
    proc = run_cli(cli_bin, "probe", "--engine", "llama.cpp")  # served only: not an --engine choice
    assert proc.returncode == 2 and proc.stderr == (
        "Error: Invalid value for '--engine': engine llama.cpp: no in-process verify adapter for probe (it is"
        " served only: specparity served --profile llama.cpp)\n"), proc.stderr
    # loops only (issue 46 item 2: exit 70 on a missing `supports`): refused with where it runs instead
    for command in ("probe", "replay", "bisect"):
        proc = run_cli(cli_bin, command, "--engine", "mtplx")
        assert proc.returncode == 2 and proc.stderr == (
            f"Error: Invalid value for '--engine': engine mtplx: no in-process verify adapter for {command} (its own"
            " loops run under specparity e2e --engine mtplx)\n"), proc.stderr
    assert "mtplx" in engines.names(e2e=True) and "llama.cpp" not in engines.names(e2e=True)


def _with_code(src: str, dst: Path, marker: Path) -> Path:
    """``src`` copied to ``dst`` with a model_file that writes ``marker`` the moment it runs."""
    shutil.copytree(src, dst)
    (dst / "own_model.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n")
    cfg = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**cfg, "model_file": "own_model.py"}))
    return dst


@pytest.mark.model
@pytest.mark.parametrize("engine", ["mlx-lm", "dflash-mlx"])
def test_no_engine_path_runs_a_checkpoints_code_without_consent(engine: str, llama_pair, cli_bin: str,
                                                                 tmp_path: Path) -> None:
    """Every command that loads through an engine refuses a target with code before it runs (exit 2, one
    line): the marker its model_file would write is never written."""
    marker = tmp_path / "ran.txt"
    target = _with_code(llama_pair.target, tmp_path / "target", marker)
    runs = [("probe", "--depths", "0", "--widths", "2"), ("replay", "--accepts", "1,2", "--width", "4"),
            ("bisect", "--width", "4"), ("e2e", "--draft-model", llama_pair.draft)]
    for cmd, *args in runs:
        proc = run_cli(cli_bin, cmd, "--engine", engine, "--model", str(target), *args)
        assert proc.returncode == 2, (cmd, proc.stderr)
        assert proc.stderr.strip().splitlines()[-1] == (
            f"Error: --model {target}: config.json names model_file 'own_model.py'; pass --trust-remote-code"
            " to run it"), (cmd, proc.stderr)
        assert not marker.exists(), cmd


@pytest.mark.model
@pytest.mark.parametrize("profile", ["dflash-mlx", "mlx-lm"])
def test_served_refuses_a_targets_code_before_any_server_starts(profile: str, llama_pair, cli_bin: str,
                                                               tmp_path: Path) -> None:
    marker = tmp_path / "ran.txt"
    target = _with_code(llama_pair.target, tmp_path / "target", marker)
    proc = run_cli(cli_bin, "served", "--profile", profile, "--model", str(target), "--draft-model",
                   llama_pair.draft, "--widths", "2")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (f"Error: --model {target}: config.json names model_file 'own_model.py';"
                                   " pass --trust-remote-code to run it")
    assert not marker.exists()


def _fake_python(tmp_path: Path, body: str) -> Path:
    exe = tmp_path / "fake-python"
    exe.write_text("#!/bin/sh\n" + body + "\n")
    exe.chmod(0o755)
    return exe


@NO_DFLASH
@pytest.mark.parametrize("body", ["echo 'all pass'; echo '{\"verdict\": \"equal\"}'; exit 0", "echo oops; exit 1",
                                  "exec {base} \"$@\""])
def test_an_engine_interpreters_answer_is_believed_only_as_a_specparity_result(body: str, cli_bin: str,
                                                                               tmp_path: Path) -> None:
    """Garbage and exit 0, exit 1, a Python without specparity: exit 4 naming the interpreter."""
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    exe = _fake_python(tmp_path, body.replace("{base}", str(base)))
    proc = run_cli(cli_bin, "replay", "--engine", "dflash-mlx", "--accepts", "1,2", "--width", "4",
                   env={"SPECPARITY_DFLASH_MLX_PYTHON": str(exe)})
    assert proc.returncode == 4, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"Error: dflash-mlx's interpreter {exe} gave no specparity result for `specparity"
                           " replay`"), last


@NO_DFLASH
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_rerun_dies_with_its_command(sig: signal.Signals, cli_bin: str, tmp_path: Path) -> None:
    """SIGTERM or SIGKILL of `replay --engine dflash-mlx` while it re-runs in the engine's interpreter: the
    child is gone too (ps)."""
    pid_file = tmp_path / "child.pid"
    exe = _fake_python(tmp_path, f"echo $$ > {pid_file}\nexec sleep 300")
    proc = subprocess.Popen([cli_bin, "replay", "--engine", "dflash-mlx", "--accepts", "1,2", "--width", "4"],
                            env={**os.environ, "SPECPARITY_DFLASH_MLX_PYTHON": str(exe)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.05)
        child = int(pid_file.read_text())
        proc.send_signal(sig)
        proc.wait(30)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            ps = subprocess.run(["ps", "-o", "stat=", "-p", str(child)], capture_output=True, text=True)
            if ps.returncode != 0 or ps.stdout.strip().startswith("Z"):
                break
            time.sleep(0.1)
        assert ps.returncode != 0 or ps.stdout.strip().startswith("Z"), f"child {child} outlived its command"
    finally:
        if proc.poll() is None:
            proc.kill()


TOY_ENV = {"SPECPARITY_ENGINES": "toy_engine", "PYTHONPATH": str(Path(__file__).parents[1])}


@pytest.mark.slow  # 19 s: every command through the toy engine; each command has its own fast test
@pytest.mark.model
def test_a_toy_engine_from_one_module_is_reached_and_its_fault_named(llama_pair, cli_bin: str) -> None:
    """SPECPARITY_ENGINES=toy_engine (tests/toy_engine.py, nothing else changed): probe, replay, bisect and
    e2e reach it and name its stale rollback; its clean path ($TOY_ENGINE_CLEAN) passes."""
    env, model = TOY_ENV, ("--engine", "toy", "--model", llama_pair.target)
    proc = run_cli(cli_bin, "probe", *model, "--widths", "4", "--depths", "0", "--json", env=env)
    assert proc.returncode == 1, proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["engine"]["name"] == "toy"
    bad = sorted(r["accepted"] for r in rep["rollbacks"] if r["verdict"] == "divergent")
    assert bad == [0, 1, 2]  # accepted 3 of a 4-row block rejects nothing: nothing to get wrong
    assert {c["verdict"] for c in rep["cells"]} == {"equal"}  # the verify forward itself is right
    proc = run_cli(cli_bin, "probe", *model, "--widths", "4", "--depths", "0", "--json",
                   env={**env, "TOY_ENGINE_CLEAN": "1"})
    assert proc.returncode == 0, proc.stderr
    proc = run_cli(cli_bin, "replay", *model, "--accepts", "3,3,1,2", "--width", "4", "--json", env=env)
    assert proc.returncode == 1, proc.stderr
    state = json.loads(proc.stdout)["requests"][0]["state"]
    assert (state["round"], state["accepted"]) == (2, 1)  # the first round that rolls back
    proc = run_cli(cli_bin, "bisect", *model, "--width", "4", "--accepted", "1", "--json", env=env)
    assert proc.returncode == 1, proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["first_divergent"] == "0" and rep["first_components"][0] == "cache offset"
    for clean, code, verdict in (("", 1, "diverged"), ("1", 0, "match")):
        proc = run_cli(cli_bin, "e2e", *model, "--max-tokens", "24", "--json", env={**env, "TOY_ENGINE_CLEAN": clean})
        assert proc.returncode == code, proc.stderr
        assert [e["verdict"] for e in json.loads(proc.stdout)["entries"]] == [verdict]


@pytest.mark.model
@pytest.mark.server
@pytest.mark.slow
def test_the_toy_engine_is_served_through_its_profile_and_found(llama_pair, cli_bin: str, tmp_path: Path) -> None:
    """served --profile tests/toy_engine.yaml: the toy's served hook fills its argv, and its server's stale
    rewind differs from classic decode only with the drafter. The same server under a profile that documents
    the mode as lossy (``lossy:``, as vllm-mlx-optimistic does) reads lossy_by_design with what it changed: never
    a divergence, never a pass (exit 3 alone; the lossless pairing's divergence decides the job's exit 1)."""
    toy = Path(__file__).parents[1] / "toy_engine.yaml"
    lossy = tmp_path / "toy-lossy.yaml"
    lossy.write_text(yaml.safe_dump({"name": "toy-lossy", "extends": str(toy),
                                     "lossy": "its rewind keeps a rejected row, documented so"}))
    job = {"pairings": [{"name": name, "target": llama_pair.target, "draft": llama_pair.draft, "profile": str(prof)}
                        for name, prof in (("toy", toy), ("toy-lossy", lossy))],
           "widths": [4], "max_tokens": 32, "sequence": ["fresh", "repeat"], "concurrency": 0, "self_draft": False}
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(job))
    proc = run_cli(cli_bin, "served", "--config", str(config), "--json", env=TOY_ENV)
    assert proc.returncode == 1, proc.stderr
    rep = {p["name"]: p for p in json.loads(proc.stdout)["pairings"]}
    arms = {a["name"]: a for a in rep["toy"]["arms"]}
    assert arms["baseline-start"]["verdict"] == "match" and arms["w4"]["verdict"] == "diverged", arms
    assert rep["toy"]["verdict"] == "diverged" and any("w4" in f for f in rep["toy"]["findings"])
    off = [r for r in arms["w4"]["requests"] if r["verdict"] == "diverged"]
    arms = {a["name"]: a for a in rep["toy-lossy"]["arms"]}
    assert arms["baseline-start"]["verdict"] == "match" and arms["w4"]["verdict"] == "lossy_by_design", arms
    changed = {r["id"]: r for r in arms["w4"]["requests"]}
    for r in off:  # the same requests left classic decode the same way, now said as the lossy mode's change
        got = changed[r["id"]]
        assert got["verdict"] == "lossy_by_design" and got["divergence"] == r["divergence"], got
        assert got["reason"].startswith("lossy by design (its rewind keeps a rejected row, documented so): it"
                                        " changed the answer: ") and got["reason"].endswith("not a pass, not a defect")
    assert rep["toy-lossy"]["verdict"] == "lossy_by_design" and not rep["toy-lossy"]["findings"], rep["toy-lossy"]


@pytest.mark.build
@pytest.mark.model
def test_environment_runs_an_in_process_command_in_that_environment(llama_pair, cli_bin: str, tmp_path: Path) -> None:
    """replay --environment mlx-lm-0.31.3 re-runs there (as served's --environment): its record's identity lists
    that environment and its mlx-lm 0.31.3; an unknown name is a usage error before anything runs."""
    from specparity import environments as envs

    real = Path(os.environ.get("SPECPARITY_ENV_CACHE") or Path.home() / ".cache" / "specparity" / "envs")
    if envs.find_environment("mlx-lm-0.31.3", root=real) is None:
        pytest.skip("environment mlx-lm-0.31.3 is not built: run scripts/build-env mlx-lm-0.31.3")
    proc = run_cli(cli_bin, "replay", "--model", llama_pair.target, "--accepts", "3,0,2", "--width", "4",
                   "--environment", "mlx-lm-0.31.3", "--record-dir", str(tmp_path / "rec"),
                   env={"SPECPARITY_ENV_CACHE": str(real)})
    assert proc.returncode == 0, proc.stderr
    assert "specparity: mlx-lm runs in environment mlx-lm-0.31.3" in proc.stderr
    (ident,) = (tmp_path / "rec").rglob("identity.json")
    listed = json.loads(ident.read_text())["environments"]["mlx-lm"]
    assert listed["name"] == "mlx-lm-0.31.3" and listed["packages"]["mlx-lm"] == "0.31.3"
    proc = run_cli(cli_bin, "probe", "--environment", "nope")
    assert proc.returncode == 2 and proc.stderr.startswith("Error: environment 'nope': neither a packaged")


FORMAT_ENGINE = """# an engine of one module that reads its own drafter format, and builds it
from specparity.engines import DrafterFormat, EngineSpec


def build(out, *, shape, dtype, tied, block_size, seed, overwrite, note):
    from specparity.fixtures import MadeFixture, build_pair

    note(f"building a fmt-toy {shape} pair (block {block_size})")
    info = build_pair(out, arch=shape, dtype=dtype, seed=seed, overwrite=overwrite)
    record = {**info.to_dict(), "kind": "fmt-toy", "block_size": block_size}
    return MadeFixture(record, [f"target: {info.target} (fmt-toy)", f"draft:  {info.draft}"])


ENGINE = EngineSpec(name="fmt-toy", drafter_format=DrafterFormat("fmt-toy", build, "the fmt-toy's pair"))
"""


@pytest.mark.model
def test_an_engines_drafter_format_is_built_by_fixtures_make(cli_bin: str, tmp_path: Path) -> None:
    """A drafter format is declared by its engine module alone: with SPECPARITY_ENGINES naming it,
    ``fixtures formats`` lists it and ``fixtures make --drafter-format`` builds through its builder;
    without it, the name is not a choice (exit 2, the choices named, nothing made)."""
    (tmp_path / "fmt_engine.py").write_text(FORMAT_ENGINE)
    env = {"SPECPARITY_ENGINES": "fmt_engine", "PYTHONPATH": str(tmp_path)}
    listed = run_cli(cli_bin, "fixtures", "formats", env=env)
    row = re.search(r"^fmt-toy +the fmt-toy's pair \(read by fmt-toy\)$", listed.stdout, re.M)
    assert listed.returncode == 0 and row, listed.stderr
    made = run_cli(cli_bin, "fixtures", "make", str(tmp_path / "fx"), "--dflash", "llama", "--drafter-format",
                   "fmt-toy", "--json", env=env)
    assert made.returncode == 0, made.stderr[-2000:]
    info = json.loads(made.stdout)
    assert info["kind"] == "fmt-toy" and Path(info["target"], "config.json").is_file()
    assert "building a fmt-toy llama pair" in made.stderr
    refused = run_cli(cli_bin, "fixtures", "make", str(tmp_path / "fx2"), "--dflash", "llama",
                      "--drafter-format", "fmt-toy")
    assert refused.returncode == 2 and "'fmt-toy' is not one of 'dflash'" in refused.stderr
    assert not (tmp_path / "fx2").exists()
    (tmp_path / "fmt_engine.py").write_text(FORMAT_ENGINE + "ENGINE = (\n")  # a user's module that does not compile
    broken = run_cli(cli_bin, "fixtures", "formats", env=env)
    assert broken.returncode == 2 and broken.stderr.startswith(
        f"Error: SPECPARITY_ENGINES: engine module fmt_engine does not compile: {tmp_path / 'fmt_engine.py'}:"), \
        broken.stderr


@pytest.mark.model
def test_an_engine_without_default_checkpoints_defaults_to_its_formats_default_fixture(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``--model`` left out: an engine that reads a drafter format naming a default fixture runs on that fixture,
    built once into the fixtures home in those arguments (the embedded llama pair is no checkpoint such an engine
    loads); one whose format names none, or that reads no format, still gets None (the embedded pair)."""
    from specparity.engines import DrafterFormat, EngineSpec
    from specparity.fixtures.build_cache import CACHE_VAR

    monkeypatch.setenv("SPECPARITY_HOME", str(tmp_path))
    monkeypatch.setenv(CACHE_VAR, "0")
    namespace: dict = {}
    exec(FORMAT_ENGINE.split("\n\nENGINE = ")[0], namespace)  # the fmt-toy's builder above
    fmt = DrafterFormat("fmt-toy", namespace["build"], default={"shape": "llama", "block_size": 4})
    found = EngineSpec(name="fmt-toy", drafter_format=fmt).checkpoints()
    assert found is not None
    target, draft = found
    assert target == tmp_path / "fixtures" / "fmt-toy-llama-float32-untied-b4" / "target"
    assert draft is not None and (draft / "config.json").is_file()
    assert "building a fmt-toy llama pair (block 4)" in capsys.readouterr().err
    made = (target / "config.json").stat().st_mtime_ns
    assert EngineSpec(name="fmt-toy", drafter_format=fmt).checkpoints() == (target, draft)
    assert (target / "config.json").stat().st_mtime_ns == made  # built once: the same files the second time
    assert EngineSpec(name="plain", drafter_format=DrafterFormat("fmt-toy", namespace["build"])).checkpoints() \
        is None
    assert EngineSpec(name="plain").checkpoints() is None


def test_one_drafter_format_has_one_builder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two engines may read one format, but a second builder under a taken name is refused, naming it."""
    from specparity import engines

    (tmp_path / "other_dspark.py").write_text(
        "from specparity.engines import DrafterFormat, EngineSpec\n"
        "ENGINE = EngineSpec(name='other-dspark', drafter_format=DrafterFormat('dspark', 'x:y'))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(engines.ENGINES_VAR, "other_dspark")
    with pytest.raises(engines.UsageError, match="engine other-dspark: drafter format 'dspark' is declared"):
        engines.drafter_formats()
    monkeypatch.delenv(engines.ENGINES_VAR)
    assert list(engines.drafter_formats())[0] == engines.DEFAULT_DRAFTER_FORMAT
    assert {"dflash", "dspark", "dfly", "mtp"} <= set(engines.drafter_formats())


# -- issue 44, classes 2 and 3: a user engine's broken import is never a "divergence"; names declared once --

MISSING_DEPENDENCY = ("import specparity_test_no_such_dependency  # the user's engine needs a package not installed\n"
                      "from specparity.engines import EngineSpec\n"
                      "ENGINE = EngineSpec(name='dep-toy')\n")


@pytest.mark.parametrize("argv", [("probe", "--help"), ("env", "list"), ("fixtures", "formats"),
                                  ("e2e", "--engine", "dep-toy"), ("--debug", "env", "list")])
def test_a_user_engine_missing_its_dependency_exits_4_naming_it(cli_bin: str, tmp_path: Path,
                                                                argv: tuple[str, ...]) -> None:
    """Through the installed console script: exit 4 (never 1, the divergence code, nor 70), one line naming
    SPECPARITY_ENGINES, the module and the module it lacks; --debug adds the traceback, same code."""
    (tmp_path / "dep_engine.py").write_text(MISSING_DEPENDENCY)
    env = {**os.environ, "SPECPARITY_ENGINES": "dep_engine", "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run([cli_bin, *argv], env=env, capture_output=True, text=True, timeout=120)
    line = ("Error: SPECPARITY_ENGINES: engine module dep_engine cannot be imported: it needs the module"
            " specparity_test_no_such_dependency, which this Python")
    assert proc.returncode == 4, proc.stderr
    if "--debug" in argv:
        assert "Traceback" in proc.stderr and proc.stderr.strip().splitlines()[-1].startswith(line), proc.stderr
    else:
        assert proc.stderr.startswith(line) and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stdout == ""


def test_a_user_engine_failing_at_import_exits_2_naming_its_module(cli_bin: str, tmp_path: Path) -> None:
    (tmp_path / "raising_engine.py").write_text("raise RuntimeError('no GPU found')\n")
    env = {**os.environ, "SPECPARITY_ENGINES": "raising_engine", "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run([cli_bin, "env", "list"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr == (
        "Error: SPECPARITY_ENGINES: engine module raising_engine failed while importing: RuntimeError:"
        " no GPU found\n"), proc.stderr


@pytest.mark.parametrize("name", ["dflash-mlx", "mlx-lm-0.31.3"])
def test_an_environment_name_declared_twice_is_refused_naming_both(cli_bin: str, tmp_path: Path, name: str) -> None:
    """A user engine declaring a pinned environment under a built-in's name would have its pins run under the
    built-in's name: refused (exit 2) on every command that reads the registry, naming both declarers."""
    (tmp_path / "twin_engine.py").write_text(
        "from specparity.engines import EngineSpec, PinnedEnv\n"
        f"ENGINE = EngineSpec(name='twin', environments=(PinnedEnv({name!r}, ('numpy==2.0.0',)),))\n")
    env = {**os.environ, "SPECPARITY_ENGINES": "twin_engine", "PYTHONPATH": str(tmp_path)}
    declarer = {"dflash-mlx": "specparity.engines.dflash_mlx", "mlx-lm-0.31.3": "specparity.engines.mlx_lm"}[name]
    for argv in (("env", "list"), ("env", "show", name)):
        proc = subprocess.run([cli_bin, *argv], env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and proc.stderr == (
            f"Error: engine module twin_engine: environment {name!r} is declared already by {declarer}: an"
            " environment name is declared once (rename it)\n"), proc.stderr


# -- issue 44, class 6: a user engine of the wrong shape is refused at registration, naming the field ------------

WRONG_SHAPES = {
    "environments": "environments='dflash-mlx'",
    "verify_modes": "verify_modes=('a', 3)",
    "drafter_format": "drafter_format='dspark'",
    "adapter": "adapter=42",
    "adapter_features": "adapter_features=['replay']",
    "e2e": "e2e='.relative:run'",
    "hooks": "hooks='pkg:attr'",
    "build": "drafter_format=DrafterFormat('fmt', 42)",
    "name": "drafter_format=DrafterFormat('../fmt\\nx', 'm:f')",
    "shapes": "drafter_format=DrafterFormat('fmt', 'm:f', shapes='qwen3')",
    "default": "drafter_format=DrafterFormat('fmt', 'm:f', default={'tied': 'yes'})",
}


@pytest.mark.parametrize("field", list(WRONG_SHAPES))
def test_a_user_engine_of_the_wrong_shape_exits_2_naming_the_module_and_field(cli_bin: str, tmp_path: Path,
                                                                             field: str) -> None:
    (tmp_path / "shaped_engine.py").write_text(
        "from specparity.engines import DrafterFormat, EngineSpec\n"
        f"ENGINE = EngineSpec(name='shaped', {WRONG_SHAPES[field]})\n")
    env = {**os.environ, "SPECPARITY_ENGINES": "shaped_engine", "PYTHONPATH": str(tmp_path)}
    for argv in (("env", "list"), ("fixtures", "formats")):
        proc = subprocess.run([cli_bin, *argv], env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert proc.stderr.startswith("Error: SPECPARITY_ENGINES: engine module shaped_engine: ") and \
            f" {field} " in proc.stderr, proc.stderr


def test_an_adapter_naming_a_missing_module_names_the_engine_not_specparitys_dependencies(
        cli_bin: str, tmp_path: Path) -> None:
    (tmp_path / "gone_engine.py").write_text(
        "from specparity.engines import EngineSpec\n"
        "ENGINE = EngineSpec(name='gone', adapter='gone_engine_adapter:load')\n")
    env = {**os.environ, "SPECPARITY_ENGINES": "gone_engine", "PYTHONPATH": str(tmp_path)}
    ckpt = tmp_path / "ckpt"  # a checkpoint's folder: the adapter is asked for before anything loads from it
    ckpt.mkdir()
    (ckpt / "config.json").write_text('{"model_type": "llama"}')
    (ckpt / "model.safetensors").write_bytes(b"")
    proc = subprocess.run([cli_bin, "probe", "--engine", "gone", "--model", str(ckpt)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr == (
        "Error: engine gone: its adapter 'gone_engine_adapter:load' names the module gone_engine_adapter, which"
        " does not exist (registered by gone_engine (SPECPARITY_ENGINES))\n"), proc.stderr


def test_a_drafter_builder_that_returns_a_non_result_is_one_line(cli_bin: str, tmp_path: Path) -> None:
    (tmp_path / "odd_engine.py").write_text(
        "from specparity.engines import DrafterFormat, EngineSpec\n"
        "def build(out, **kw):\n    return {'target': out}\n"
        "ENGINE = EngineSpec(name='odd', drafter_format=DrafterFormat('odd', build))\n")
    env = {**os.environ, "SPECPARITY_ENGINES": "odd_engine", "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run([cli_bin, "fixtures", "make", str(tmp_path / "fx"), "--dflash", "qwen3", "--drafter-format",
                           "odd"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "returned a dict, not the MadeFixture" \
        in proc.stderr, proc.stderr


def test_the_entry_point_group_lists_every_builtin_engine() -> None:
    """Found as a plugin is found: specparity's own metadata registers each built-in in the group, named as
    its engine, and the registry's engines are exactly those (no folder listing, no variable)."""
    from importlib import metadata

    from specparity import engines

    points = {ep.name: ep.value for ep in metadata.entry_points(group=engines.GROUP)
              if ep.dist is not None and ep.dist.name == "specparity"}
    assert set(points) == set(engines.registry()) >= {"mlx-lm", "dflash-mlx", "mlx-dspark", "mtplx", "llama.cpp"}
    for name, ref in points.items():
        spec = engines.registry()[name]
        assert ref == f"{spec.source}:ENGINE" and spec.distribution == "specparity" and spec.name == name
    assert [r.entry for r in engines._pyproject_builtins()] == list(points) or \
        sorted(r.entry or "" for r in engines._pyproject_builtins()) == sorted(points)
