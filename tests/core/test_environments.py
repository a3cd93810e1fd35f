"""Engines' environments (specparity.environments, ``specparity env``, scripts/build-env).

The mechanism is exercised on a tiny environment built offline from a wheel
made here (one module, no dependencies): atomic, locked, idempotent, offline
once built, one clear error for a missing package index. The packaged engine
environments are never built by a test: the ``build`` tests use them when
``scripts/build-env NAME`` has built them, skip otherwise, and fail under CI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from builds import built, wheel

from specparity import environments as envs
from specparity.errors import InfrastructureError, UsageError
from conftest import run_cli

# read before the autouse fixture isolates SPECPARITY_HOME: where scripts/build-env put the real ones
TINY = "specparity-tiny"
Tiny = tuple[envs.Environment, list[str]]  # the tiny environment and its build's progress notes


def _wheel(out: Path, version: str = "1.0") -> Path:
    """A pure-Python wheel holding one module, ``specparity_tiny``, made without any build tool."""
    return wheel(out, TINY, version, {"specparity_tiny.py": f"VERSION = {version!r}\n"})


def _offline(mp: pytest.MonkeyPatch, root: Path) -> None:
    """pip sees only a folder holding the tiny wheel (no configured index, no network); the cache is ``root``."""
    wheels = root / "wheels"
    _wheel(wheels)
    mp.setenv("PIP_CONFIG_FILE", os.devnull)
    mp.setenv("PIP_NO_INDEX", "1")
    mp.setenv("PIP_FIND_LINKS", str(wheels))
    mp.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    mp.delenv("PIP_INDEX_URL", raising=False)
    mp.setenv(envs.ENV_CACHE_VAR, str(root / "envs"))


@pytest.fixture
def offline_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _offline(monkeypatch, tmp_path)


@pytest.fixture(scope="module")
def tiny_env(tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    """The tiny environment, built once for the module (its build's progress notes kept beside it)."""
    notes: list[str] = []
    # the offline pip settings hold for the build only, not for the tests using it
    with pytest.MonkeyPatch.context() as mp:
        _offline(mp, tmp_path_factory.mktemp("tiny"))
        env = envs.ensure_environment(tiny_spec(), progress=notes.append)
    return env, notes


def tiny_spec() -> envs.EnvSpec:
    return envs.EnvSpec("tiny", (f"{TINY}==1.0",), "a test environment", imports=("specparity_tiny",),
                        with_specparity=False)


# --- specs (no build) ---------------------------------------------------------------------------


def test_an_unpinned_package_is_refused_by_name() -> None:
    with pytest.raises(UsageError, match=r"package 'mlx-lm>=0.31' is not pinned"):
        envs.EnvSpec("x", ("mlx-lm>=0.31",))
    with pytest.raises(UsageError, match="packages is empty"):
        envs.EnvSpec("x", ())
    with pytest.raises(UsageError, match="a name is letters"):
        envs.EnvSpec("a b", ("mlx-lm==0.31.3",))
    # extras and markers are fine, and so is ===
    envs.EnvSpec("x", ("mlx[cpu]==0.32.4; sys_platform == 'linux'", "foo===1.0"))


def test_the_digest_names_the_pins_and_the_directory_lives_in_the_cache(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    a = envs.EnvSpec("x", ("a==1", "b==2"))
    assert a.digest == envs.EnvSpec("x", ("b==2", "a==1")).digest  # pip ignores the order
    assert a.digest != envs.EnvSpec("x", ("a==1", "b==3")).digest
    assert len(a.digest) == envs.DIGEST_CHARS and a.dirname == f"x-{a.digest}"
    monkeypatch.delenv(envs.ENV_CACHE_VAR, raising=False)
    monkeypatch.setenv("SPECPARITY_HOME", str(tmp_path / "home"))
    assert envs.env_dir(a) == tmp_path / "home" / "envs" / a.dirname
    monkeypatch.setenv(envs.ENV_CACHE_VAR, str(tmp_path / "elsewhere"))
    assert envs.env_dir(a) == tmp_path / "elsewhere" / a.dirname


def test_packaged_specs_pin_the_engines_and_specparity_comes_along() -> None:
    specs = envs.PACKAGED
    assert {"mlx-lm-0.31.3", "mlx-lm-0.32.2", "dflash-mlx"} <= set(specs)
    assert "mlx-lm==0.31.3" in specs["mlx-lm-0.31.3"].packages
    assert "mlx-lm==0.32.2" in specs["mlx-lm-0.32.2"].packages
    assert {"dflash-mlx==0.1.8", "mlx-lm==0.31.3"} <= set(specs["dflash-mlx"].packages)
    # dflash-mlx in process on the other mlx-lm: only mlx-lm differs, and its server is not asked to import
    a, b = (set(specs[n].packages) for n in ("dflash-mlx", "dflash-mlx-mlx-lm-0.32.2"))
    assert a ^ b == {"mlx-lm==0.31.3", "mlx-lm==0.32.2"}
    assert "dflash_mlx.serve" not in specs["dflash-mlx-mlx-lm-0.32.2"].imports
    reqs = specs["dflash-mlx"].requirements()
    assert "httpx" in reqs and not any("pytest" in r for r in reqs)  # runtime deps only, no extras
    # what differs between the two mlx-lm environments is mlx-lm alone
    a, b = (set(specs[n].packages) for n in ("mlx-lm-0.31.3", "mlx-lm-0.32.2"))
    assert a ^ b == {"mlx-lm==0.31.3", "mlx-lm==0.32.2"}


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """The CLI run in this process (its own error handling and exit code): (code, stdout, stderr)."""
    from specparity.cli import main

    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    out = capsys.readouterr()
    assert isinstance(exc.value.code, int)
    return exc.value.code, out.out, out.err


@pytest.fixture
def local_index() -> Iterator[tuple[str, list[str]]]:
    """A real package index on 127.0.0.1 (every path answers 404): its URL and the paths it was asked for."""
    import http.server
    import threading

    asked: list[str] = []

    class Index(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple", asked
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_a_spec_smuggling_a_pip_option_is_refused_before_pip_and_the_index_hears_nothing(
        local_index: tuple[str, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli_bin: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    """issue 30.4: a CR or LF in a spec split the requirements file and pip used the index it named. Each
    such spec, a URL, a shell-looking one and a bad name is refused at load (exit 2, one line, no build
    begun): the local index named in them receives no request, while the same file as the build used to
    write it does make pip ask that index (the detector fires)."""
    url, asked = local_index
    injected = f'six==1.17.0; python_version > "0"\r--index-url {url}'
    req = tmp_path / "requirements.txt"
    req.write_text(injected + "\n")  # what the build wrote before: pip reads the CR as a line break
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-input", "--disable-pip-version-check",
                    "-d", str(tmp_path / "dl"), "-r", str(req)], capture_output=True, timeout=120,
                   env=dict(os.environ, PIP_CONFIG_FILE=os.devnull), cwd=tmp_path)
    assert asked == ["/simple/six/"], asked
    asked.clear()

    monkeypatch.setenv(envs.ENV_CACHE_VAR, str(tmp_path / "envs"))
    bad_packages = [injected, f"six==1.17.0\n--index-url {url}", f"six[x\r--index-url {url}]==1.17.0",
                    f"six==1.17.0 --index-url {url}", f"--index-url {url}", f"six @ {url}/six.whl",
                    f"six==1.17.0; python_version > '0\u2028--index-url {url}'", f"six==1.17.0 && curl {url}",
                    f"$(curl {url})==1", "six==1.*", "six==1.0,==1.1"]
    for i, package in enumerate(bad_packages):
        with pytest.raises(UsageError, match=r"package .*(control character|not a requirement|URL|not pinned)"):
            envs.load_spec({"name": "x", "packages": [package]})
        f = tmp_path / f"bad{i}.yaml"
        f.write_text(json.dumps({"name": f"bad{i}", "packages": [package]}))  # JSON is YAML
        code, out, err = run_main(capsys, "env", "build", str(f))
        assert code == 2 and out == "", (package, err)
        assert len(err.strip().splitlines()) == 1 and err.startswith("Error: environment"), err
    for name in ("two\nlines", "x" * 300, "a/b", ".hidden"):
        f = tmp_path / "named.yaml"
        f.write_text(json.dumps({"name": name, "packages": ["six==1.17.0"]}))
        code, out, err = run_main(capsys, "env", "build", str(f))
        assert code == 2 and len(err.strip().splitlines()) == 1 and "a name is" in err, err
    # served takes the same file the same way, before any server or model
    (tmp_path / "t").mkdir()
    (tmp_path / "job.yaml").write_text("pairings:\n  - target: t\n")
    r = run_cli(cli_bin, "served", "--config", str(tmp_path / "job.yaml"), "--environment", str(tmp_path / "bad0.yaml"))
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"Error: --environment: environment 'bad0' ({tmp_path / 'bad0.yaml'}): package {injected!r} has a control"
        " character (a newline or carriage return) or one outside ASCII: write one requirement per entry"], r.stderr
    assert asked == [] and not (tmp_path / "envs").exists()


def test_a_spec_comes_from_a_name_a_yaml_file_or_a_mapping(tmp_path: Path) -> None:
    assert envs.load_spec("dflash-mlx") is envs.PACKAGED["dflash-mlx"]
    f = tmp_path / "mine.yaml"
    f.write_text("packages: ['mlx-lm==0.31.3']\nimports: [mlx_lm]\n")
    spec = envs.load_spec(str(f))
    assert spec.name == "mine" and spec.packages == ("mlx-lm==0.31.3",) and spec.source == str(f)
    inline = envs.load_spec({"name": "inline", "packages": ["a==1"], "with_specparity": False})
    assert inline.name == "inline" and not inline.with_specparity
    with pytest.raises(UsageError, match="neither a packaged environment"):
        envs.load_spec("no-such-env")
    with pytest.raises(UsageError, match="unknown keys pins"):
        envs.load_spec({"name": "x", "pins": ["a==1"]})
    f.write_text("packages: mlx-lm==0.31.3\n")
    with pytest.raises(UsageError, match="packages must be a list"):
        envs.load_spec(str(f))


def test_pip_failures_read_as_one_line() -> None:
    offline = ["WARNING: Retrying (Retry(total=0)) after connection broken by 'NewConnectionError("
               "'<urllib3.connection.HTTPSConnection>: Failed to establish a new connection: [Errno 111]"
               " Connection refused')': /simple/mlx-lm/",
               "ERROR: Could not find a version that satisfies the requirement mlx-lm==0.31.3 (from versions: none)",
               "ERROR: No matching distribution found for mlx-lm==0.31.3"]
    assert envs.pip_failure(offline) == ("pip could not reach a package index for mlx-lm==0.31.3"
                                         " (offline, or the index is down?)")
    assert "offers mlx-lm==9.9" in envs.pip_failure(["ERROR: No matching distribution found for mlx-lm==9.9"])
    assert "in conflict" in envs.pip_failure(["ERROR: ResolutionImpossible: for help visit ..."])
    assert envs.pip_failure(["ERROR: something else"]) == "pip failed: something else"


def test_an_environment_not_built_names_the_command_that_builds_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   cli_bin: str) -> None:
    monkeypatch.setenv(envs.ENV_CACHE_VAR, str(tmp_path / "envs"))
    assert envs.find_environment("dflash-mlx") is None
    with pytest.raises(InfrastructureError, match="run scripts/build-env dflash-mlx"):
        envs.require_environment("dflash-mlx")
    r = run_cli(cli_bin, "env", "path", "--python", "dflash-mlx")
    assert r.returncode == 4 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        "Error: environment dflash-mlx is not built: run scripts/build-env dflash-mlx"
        " (or specparity env build dflash-mlx)"]
    r = run_cli(cli_bin, "env", "list", "--json")
    assert r.returncode == 0
    rows = {e["name"]: e for e in json.loads(r.stdout)["environments"]}
    assert not rows["dflash-mlx"]["built"] and rows["dflash-mlx"]["pins"]


# --- the mechanism, on a tiny environment built offline ------------------------------------------


def test_build_once_then_found_at_once_offline(tiny_env: Tiny, monkeypatch: pytest.MonkeyPatch) -> None:
    env, notes = tiny_env
    spec = env.spec
    monkeypatch.setenv(envs.ENV_CACHE_VAR, str(env.path.parent))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    assert env.path == envs.env_dir(spec) and env.python.exists()
    assert env.packages()[TINY] == "1.0"
    assert env.manifest["build_seconds"] > 0 and env.manifest["size_bytes"] > 0
    assert any("creating a virtual environment" in n for n in notes) and "built in" in notes[-1]
    assert not list(env.path.parent.glob(".build-*")), "the temporary build directory is renamed away"
    # nothing of the temporary directory's name is left in the scripts
    for f in (env.path / "bin").iterdir():
        if f.is_file() and not f.is_symlink():
            assert b".build-" not in f.read_bytes(), f
    out = subprocess.run([str(env.python), "-c", "import specparity_tiny; print(specparity_tiny.VERSION)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1.0"
    # a second call builds nothing and runs nothing, even with every index gone
    monkeypatch.setenv("PIP_FIND_LINKS", "/nonexistent")
    again_notes: list[str] = []
    t0 = time.perf_counter()
    again = envs.ensure_environment(spec, progress=again_notes.append)
    assert again == env and again_notes == [] and time.perf_counter() - t0 < 1.0


def test_env_show_json_is_what_the_text_shows(tiny_env: Tiny, tmp_path: Path, cli_bin: str) -> None:
    """``env show --json`` (validated against env-show.schema.json by run_cli): the path, interpreter,
    pins, build time, size and every installed package the text lists."""
    env, _ = tiny_env
    spec = tmp_path / "tiny.yaml"
    spec.write_text(f"packages: ['{TINY}==1.0']\ndescription: a test environment\nimports: [specparity_tiny]\n"
                    "with_specparity: false\n")
    cache = {envs.ENV_CACHE_VAR: str(env.path.parent)}
    j = run_cli(cli_bin, "env", "show", str(spec), "--json", env=cache)
    t = run_cli(cli_bin, "env", "show", str(spec), env=cache)
    assert j.returncode == t.returncode == 0, j.stderr + t.stderr
    out = json.loads(j.stdout)
    assert out["path"] == str(env.path) and out["packages"][TINY] == "1.0" and out["pins"] == [f"{TINY}==1.0"]
    assert f"  path:    {out['path']}" in t.stdout and f"    {TINY}==1.0" in t.stdout
    assert f"  pins:    {', '.join(out['pins'])}" in t.stdout and f" in {out['build_seconds']} s," in t.stdout


@pytest.mark.slow
def test_a_missing_package_index_is_one_error_line_exit_4(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          cli_bin: str) -> None:
    spec_file = tmp_path / "tiny.yaml"
    spec_file.write_text(f"packages: ['{TINY}==1.0']\nwith_specparity: false\n")
    cache = tmp_path / "envs"
    env = {"PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_RETRIES": "0",
           "PIP_TIMEOUT": "2", "PIP_FIND_LINKS": "", envs.ENV_CACHE_VAR: str(cache)}
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    monkeypatch.delenv("PIP_NO_INDEX", raising=False)
    r = run_cli(cli_bin, "env", "build", str(spec_file), env=env)
    assert r.returncode == 4, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("Error:")]
    assert len(errors) == 1 and "Traceback" not in r.stderr
    assert f"pip could not reach a package index for {TINY}==1.0" in errors[0]
    # nothing that looks built, no temporary directory; the log of the failed build is kept
    left = sorted(p.name for p in cache.iterdir() if not p.name.startswith(".lock-"))
    assert len(left) == 1 and left[0].endswith(".failed.log"), left
    assert str(cache / left[0]) in errors[0]


@pytest.mark.slow
def test_concurrent_builds_serialize_and_build_once(offline_index: None, tmp_path: Path) -> None:
    """Two processes asking for one environment at once: one builds, the other waits and finds it."""
    code = ("import sys, json\nfrom specparity import environments as e\n"
            f"spec = e.EnvSpec('tiny', ('{TINY}==1.0',), imports=('specparity_tiny',), with_specparity=False)\n"
            "notes = []\nenv = e.ensure_environment(spec, progress=notes.append)\n"
            "print(json.dumps({'path': str(env.path), 'built': any('built in' in n for n in notes)}))\n")
    procs = [subprocess.Popen([sys.executable, "-P", "-c", code], stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ)) for _ in range(2)]
    outs = [json.loads(p.communicate(timeout=300)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert outs[0]["path"] == outs[1]["path"]
    assert sorted(o["built"] for o in outs) == [False, True], outs


@pytest.mark.slow
def test_an_interrupted_build_leaves_nothing_that_looks_built(offline_index: None,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    spec = tiny_spec()

    def boom(*args: object, **kwargs: object) -> dict[str, str]:
        raise KeyboardInterrupt

    monkeypatch.setattr(envs, "_installed", boom)  # after pip and the import check, before the manifest
    with pytest.raises(KeyboardInterrupt):
        envs.ensure_environment(spec)
    assert envs.find_environment(spec) is None
    root = envs.cache_root()
    assert not envs.env_dir(spec).exists() and not list(root.glob(".build-*"))


def test_specparity_runs_in_an_environment_from_the_running_checkout(tiny_env: Tiny, repo_root: Path) -> None:
    """The hook imports this checkout's specparity there (its dependencies are the spec's business)."""
    env, _ = tiny_env
    # tiny has with_specparity=False, so no hook: write it as a with_specparity build does (importing
    # specparity.paths and the harness package needs only the standard library)
    envs.write_source_hook(env.path)
    code = "import specparity.paths, specparity.harness, sys; print(specparity.paths.__file__); print(sys.prefix)"
    out = subprocess.run([str(env.python), "-P", "-c", code], env=env.environ(), capture_output=True, text=True,
                         cwd=str(repo_root.parent), timeout=120)
    assert out.returncode == 0, out.stderr
    paths_file, prefix = out.stdout.split()
    assert Path(paths_file) == repo_root / "specparity" / "paths.py"
    assert Path(prefix) == env.path
    # without $SPECPARITY_SOURCE specparity is not importable there: no stale copy hides in it
    bare = {k: v for k, v in os.environ.items() if k != envs.SOURCE_VAR}
    out = subprocess.run([str(env.python), "-P", "-c", "import specparity"], env=bare, capture_output=True,
                         text=True, timeout=120, cwd=str(repo_root.parent))
    assert out.returncode != 0 and "No module named 'specparity'" in out.stderr


def test_a_pinned_environments_process_drops_the_callers_pythonpath_and_keeps_the_one_it_is_given(
        tiny_env: Tiny, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller's PYTHONPATH never reaches a process in a pinned environment (its packages would leak in);
    $SPECPARITY_ENV_PYTHONPATH does (the test suite's start-up module runs there, as everywhere)."""
    env, _ = tiny_env
    leak, startup = tmp_path / "leak", tmp_path / "startup"
    leak.mkdir()
    startup.mkdir()
    (leak / "callers_package.py").write_text("")
    (startup / "sitecustomize.py").write_text("import os\nos.environ['STARTED_HERE'] = '1'\n")
    code = ("import importlib.util, os; print(importlib.util.find_spec('callers_package') is not None,"
            " os.environ.get('STARTED_HERE'))")
    monkeypatch.setenv("PYTHONPATH", str(leak))
    monkeypatch.delenv(envs.PYTHONPATH_VAR, raising=False)

    def run() -> list[str]:
        out = subprocess.run([str(env.python), "-P", "-c", code], env=env.environ(), capture_output=True,
                             text=True, timeout=120, cwd=str(tmp_path))
        assert out.returncode == 0, out.stderr
        return out.stdout.split()

    assert run() == ["False", "None"]
    monkeypatch.setenv(envs.PYTHONPATH_VAR, str(startup))
    assert run() == ["False", "1"]
    assert env.environ()["PYTHONPATH"] == str(startup)


def _copy_env(env: envs.Environment, root: Path) -> Path:
    """A copy of the built environment ``env`` in the cache ``root`` (its directory name kept)."""
    import shutil

    dest = root / env.path.name
    shutil.copytree(env.path, dest, symlinks=True, ignore=shutil.ignore_patterns("pip", "pip-*"))  # not needed
    return dest


def _spec_file(env: envs.Environment, where: Path) -> Path:
    """``env``'s spec as a YAML file (JSON is YAML), for the commands that take NAME."""
    f = where / f"{env.name}.yaml"
    f.write_text(json.dumps({k: v for k, v in env.spec.to_dict().items()
                             if k in ("name", "packages", "description", "imports", "with_specparity")}))
    return f


def test_a_corrupted_cache_is_one_line_naming_the_directory_and_the_rebuild(
        tiny_env: Tiny, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """issue 30.8: a manifest that is a list or holds wrong types made env list / show exit 70. Now show and
    path say which directory is broken and how to rebuild it (exit 4); list lists the rest and warns."""
    env, _ = tiny_env
    root = tmp_path / "cache"
    copy = _copy_env(env, root)
    spec_file = _spec_file(env, tmp_path)
    monkeypatch.setenv(envs.ENV_CACHE_VAR, str(root))
    code, out, err = run_main(capsys, "env", "show", str(spec_file))
    assert code == 0 and f"{TINY}==1.0" in out, err  # the intact copy reads
    manifest = copy / envs.MANIFEST
    good = json.loads(manifest.read_text())
    for bad, said in [("[]", "is a JSON list"), (json.dumps({**good, "packages": ["x"]}), "no packages mapping"),
                      (json.dumps({**good, "size_bytes": "big"}), "size_bytes of the wrong type"),
                      (json.dumps({**good, "spec": 3}), "holds no spec"), ("\xff{", "cannot be read")]:
        manifest.write_bytes(bad.encode("latin-1"))
        for args in (("env", "show", str(spec_file)), ("env", "path", str(spec_file))):
            code, out, err = run_main(capsys, *args)
            line = err.strip().splitlines()
            if said == "holds no spec":  # a spec given by name needs none from the manifest: it reads
                assert code == 0, err
                continue
            assert code == 4 and out == "" and len(line) == 1, (bad, args, err)
            assert line[0].startswith(f"Error: environment tiny at {copy} is broken: its {envs.MANIFEST} ")
            assert said in line[0] and line[0].endswith(
                f"; rebuild it (specparity env remove {copy.name}, then specparity env build tiny)"), line
        code, out, err = run_main(capsys, "env", "list")
        warnings = [ln for ln in err.splitlines() if ln.strip()]
        assert code == 0 and "dflash-mlx" in out, err
        assert len(warnings) == 1 and warnings[0].startswith(f"warning: environment {copy.name} at {copy}")
        assert said in warnings[0] and f"specparity env remove {copy.name}" in warnings[0], warnings
    # `env remove` takes the broken directory by the name the warning gives
    code, out, err = run_main(capsys, "env", "remove", copy.name)
    assert code == 0 and not copy.exists(), err


def test_a_home_that_is_a_file_is_one_line_exit_2(tmp_path: Path, cli_bin: str, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """issue 30.8: SPECPARITY_HOME a file made env build and replay exit 70 at their first write."""
    home = tmp_path / "home"
    home.write_text("not a directory\n")
    for value, said in [(str(home), f"SPECPARITY_HOME {home} is not a directory"),
                        (str(home / "sub"), f"SPECPARITY_HOME {home / 'sub'} cannot be created: {home} is not")]:
        monkeypatch.setenv("SPECPARITY_HOME", value)
        for args in (("env", "build", "dflash-mlx"), ("replay", "--accepts", "1,2"), ("env", "list")):
            code, out, err = run_main(capsys, *args)
            lines = err.strip().splitlines()
            assert code == 2 and len(lines) == 1 and lines[0].startswith(f"Error: {said}"), (args, err)
    r = run_cli(cli_bin, "replay", "--accepts", "1,2", env={"SPECPARITY_HOME": str(home)})  # the real process
    assert r.returncode == 2 and r.stderr.startswith(f"Error: SPECPARITY_HOME {home} is not a directory"), r.stderr
    assert home.read_text() == "not a directory\n"
    if os.geteuid() != 0:  # root reads and writes any directory: the unreadable case needs a user
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o000)
        try:
            r = run_cli(cli_bin, "env", "list", env={"SPECPARITY_HOME": str(locked)})
            assert r.returncode == 2 and "not readable and writable" in r.stderr, r.stderr
        finally:
            locked.chmod(0o700)


def test_an_environment_missing_a_package_is_exit_4_naming_it(tiny_env: Tiny, tmp_path: Path) -> None:
    """issue 30.8: specparity run in a built environment that lacks a package it imports exited 70; now one
    line names the environment, the module and the rebuild (exit 4). The same environment with the package
    there runs the command (the message fires on the missing package alone)."""
    env, _ = tiny_env
    root = tmp_path / "cache"
    copy = _copy_env(env, root)
    envs.write_source_hook(copy)
    site = envs._site_packages(copy)
    ours = Path(envs._site_packages(Path(sys.prefix)))
    for entry in ours.iterdir():  # specparity's dependencies, as a build installs them, but PyYAML
        if not (site / entry.name).exists() and entry.name not in ("yaml", "_yaml") and not entry.name.startswith(
                "pyyaml-"):
            (site / entry.name).symlink_to(entry)
    spec_file = _spec_file(env, tmp_path)
    environ = envs.Environment(env.spec, copy, env.manifest).environ({**os.environ, envs.ENV_CACHE_VAR: str(root)})
    argv = [str(envs.interpreter(copy)), "-P", "-m", "specparity.cli", "env", "show", str(spec_file)]
    r = subprocess.run(argv, capture_output=True, text=True, env=environ, timeout=120, cwd=tmp_path)
    assert r.returncode == 4 and r.stdout == "", r.stderr
    assert r.stderr.strip().splitlines() == [
        f"Error: environment tiny at {copy} lacks the module yaml (a package missing from it): rebuild it"
        f" (specparity env remove {copy.name}, then specparity env build tiny)"]
    for name in ("yaml", "_yaml"):
        (site / name).symlink_to(ours / name)
    r = subprocess.run(argv, capture_output=True, text=True, env=environ, timeout=120, cwd=tmp_path)
    assert r.returncode == 0 and f"{TINY}==1.0" in r.stdout, r.stderr


def test_remove_renames_then_deletes(tiny_env: Tiny, monkeypatch: pytest.MonkeyPatch) -> None:
    env, _ = tiny_env
    monkeypatch.setenv(envs.ENV_CACHE_VAR, str(env.path.parent))
    assert envs.remove_environment("dflash-mlx") is None  # packaged, not built here: nothing to remove
    assert envs.remove_environment(env.spec.dirname) == env.path
    assert not env.path.exists() and envs.find_environment(env.spec) is None
    assert not list(env.path.parent.glob(".remove-*"))
    with pytest.raises(UsageError, match="neither a packaged environment"):
        envs.remove_environment(env.spec.dirname)  # gone: the name means nothing now


# --- the packaged environments, when built (scripts/build-env NAME) --------------------------------




@pytest.mark.build
@pytest.mark.parametrize("name, mlx_lm", [("mlx-lm-0.31.3", "0.31.3"), ("mlx-lm-0.32.2", "0.32.2"),
                                          ("dflash-mlx", "0.31.3"), ("dflash-mlx-mlx-lm-0.32.2", "0.32.2")])
def test_a_built_environment_lists_its_packages_and_imports_its_engine(name: str, mlx_lm: str) -> None:
    env = built(name)
    packages = env.packages()
    assert packages["mlx-lm"] == mlx_lm and packages["mlx"] == envs.MLX_PIN
    ident = env.identity()
    assert ident["name"] == name and ident["digest"] == env.spec.digest and ident["packages"] == packages
    for module in env.spec.imports:
        assert env.has_module(module), module


@pytest.mark.build
@pytest.mark.slow
def test_dflash_mlx_on_mlx_lm_0_32_2_imports_its_engine_and_generate_but_not_its_server() -> None:
    """Why the in-process column of mlx-lm 0.32.2 has an environment of its own: dflash-mlx 0.1.8's
    generate and engine import there; its server needs a name 0.32 removed."""
    env = built("dflash-mlx-mlx-lm-0.32.2")
    code = ("import importlib, sys\nfor m in sys.argv[1:]:\n    try:\n        importlib.import_module(m)\n"
            "        print(m, 'ok')\n    except ImportError as e:\n        print(m, 'ImportError', e)\n")
    out = subprocess.run([str(env.python), "-P", "-c", code, "dflash_mlx.generate", "dflash_mlx.runtime.bundle",
                          "dflash_mlx.serve"], env=env.environ(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[:2] == ["dflash_mlx.generate ok", "dflash_mlx.runtime.bundle ok"]
    assert lines[2].startswith("dflash_mlx.serve ImportError") and "SequenceStateMachine" in lines[2], lines


@pytest.mark.build
@pytest.mark.server
@pytest.mark.model
@pytest.mark.slow
def test_mlx_lm_server_runs_from_its_environment_on_the_fixture_pair(tmp_path: Path) -> None:
    """The mlx-lm profile with {python} as the environment's interpreter: mlx-lm 0.31.3's own server
    starts on the default fixture pair and drafts; its version command and fingerprint name 0.31.3."""
    import httpx

    from specparity.fixtures import default_pair
    from specparity.harness.lifecycle import Server
    from specparity.harness.profiles import load_profile

    env = built("mlx-lm-0.31.3")
    pair = default_pair()
    profile = load_profile("mlx-lm")
    argv = profile.render(profile.argv + profile.draft_argv, python=env.python, model=pair.target,
                          draft_model=pair.draft, num_draft=3, host="127.0.0.1", port="{port}")
    assert argv[0] == str(env.python)
    version = subprocess.run(profile.render(profile.version_command or [], python=env.python),
                             capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    assert version.stdout.strip() == "mlx-lm 0.31.3"
    with Server(argv, log_path=tmp_path / "server.log", ready_path=profile.ready_path,
                fail_regex=profile.fail_regex) as srv:
        r = httpx.post(srv.url + "/v1/completions", timeout=120,
                       json={"prompt": "The quick brown fox", "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["completion_tokens"] == 8
    assert body["system_fingerprint"].startswith(f"0.31.3-{envs.MLX_PIN}-")


# --- what a pinned environment may declare beyond its pins (issue 47's engines) -----------------------------

def test_a_pin_whose_dependency_has_no_build_here_installs_without_it_and_says_what_it_left_out(
        offline_index: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli_bin: str) -> None:
    """A package declaring a dependency that cannot install here (mlx-openai-server's image extra): with it among
    the pins pip fails; as ``no_deps`` it installs without it, and ``env show`` says what was left out and why."""
    wheel(tmp_path / "wheels", "specparity-needy", "1.0", {"specparity_needy.py": "OK = True\n"},
          requires=("specparity-nowhere==1.0",))
    plain = envs.EnvSpec("needy", (f"{TINY}==1.0", "specparity-needy==1.0"), with_specparity=False)
    with pytest.raises(InfrastructureError, match="environment needy: .*offers specparity-nowhere==1.0"):
        envs.ensure_environment(plain)
    spec = envs.EnvSpec("needy", (f"{TINY}==1.0",), "needy without its dependency", imports=("specparity_needy",),
                        with_specparity=False, no_deps=("specparity-needy==1.0",),
                        left_out=("specparity-nowhere: no build for this platform",))
    assert spec.digest != envs.EnvSpec("needy", (f"{TINY}==1.0",), with_specparity=False).digest
    notes: list[str] = []
    env = envs.ensure_environment(spec, progress=notes.append)
    installed = {k.lower() for k in env.packages()}
    assert "specparity-needy" in installed and "specparity-nowhere" not in installed, installed
    assert any("without its declared dependencies (left out: specparity-nowhere" in n for n in notes), notes
    spec_file = tmp_path / "needy.yaml"
    spec_file.write_text(f"name: needy\ndescription: needy without its dependency\npackages: ['{TINY}==1.0']\n"
                         "imports: [specparity_needy]\nwith_specparity: false\nno_deps: ['specparity-needy==1.0']\n"
                         "left_out: ['specparity-nowhere: no build for this platform']\n")
    assert envs.load_spec(str(spec_file)) == spec
    shown = run_cli(cli_bin, "env", "show", str(spec_file))
    assert shown.returncode == 0, shown.stderr
    assert "  without its dependencies: specparity-needy==1.0\n" in shown.stdout
    assert "  left out: specparity-nowhere: no build for this platform\n" in shown.stdout
    as_json = json.loads(run_cli(cli_bin, "env", "show", str(spec_file), "--json").stdout)
    assert as_json["left_out"] == ["specparity-nowhere: no build for this platform"]


def test_an_environment_built_with_another_python_and_one_this_machine_lacks(
        offline_index: None, tmp_path: Path) -> None:
    """``python: "3.N"`` builds with that interpreter (found on PATH or under pyenv), recorded in its manifest and
    its digest; a version no interpreter here runs is exit 4 naming it, before anything is built."""
    lacking = envs.EnvSpec("far-future", (f"{TINY}==1.0",), with_specparity=False, python="3.99")
    with pytest.raises(InfrastructureError, match=r"environment far-future: needs Python 3\.99, and no python3\.99"
                                                  r" runs here"):
        envs.ensure_environment(lacking)
    assert not list((tmp_path / "envs").glob("far-future*"))
    with pytest.raises(UsageError, match="python '3' is not a version"):
        envs.EnvSpec("bad", (f"{TINY}==1.0",), with_specparity=False, python="3")
    mine = ".".join(map(str, sys.version_info[:2]))
    others = [v for v in ("3.12", "3.13", "3.10") if v != mine]
    for version in others:
        spec = envs.EnvSpec("other-python", (f"{TINY}==1.0",), imports=("specparity_tiny",), with_specparity=False,
                            python=version)
        try:
            envs.base_interpreter(spec)
        except InfrastructureError:
            continue
        env = envs.ensure_environment(spec)
        assert env.manifest["python"].startswith(version + "."), env.manifest["python"]
        ran = subprocess.run([str(env.python), "-c", "import sys, specparity_tiny; print(sys.version_info[:2])"],
                             capture_output=True, text=True, check=True)
        assert ran.stdout.strip() == str(tuple(map(int, version.split(".")))), ran.stdout
        assert spec.digest != envs.EnvSpec("other-python", (f"{TINY}==1.0",), imports=("specparity_tiny",),
                                           with_specparity=False).digest
        return
    pytest.skip(f"no Python {' or '.join(others)} on this machine besides this one ({mine})")


@pytest.mark.build
def test_build_all_builds_every_registered_engines_environments_and_names_one_it_cannot(
        tmp_path: Path, cli_bin: str) -> None:
    """``env build --all`` (README's and CI's install line): every packaged environment of every registered engine
    (here all already built: each returns at once), and an engine's environment needing a Python this machine
    lacks is one ``skipped:`` line, not a failure; no name and no --all is a usage error."""
    from builds import REAL_CACHE

    for name in envs.packaged():
        built(name)
    (tmp_path / "far_engine.py").write_text(
        "from specparity.engines import EngineSpec, PinnedEnv\n"
        "ENGINE = EngineSpec(name='far-engine', environments=(PinnedEnv('far-engine', ('six==1.16.0',),"
        " 'needs a Python from the future', python='3.99'),))\n")
    env = {envs.ENV_CACHE_VAR: str(REAL_CACHE), "SPECPARITY_ENGINES": "far_engine", "PYTHONPATH": str(tmp_path)}
    proc = run_cli(cli_bin, "env", "build", "--all", env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(proc.stdout.splitlines()) == len(envs.packaged()), proc.stdout
    assert "skipped: environment far-engine: needs Python 3.99" in proc.stderr, proc.stderr
    bare = run_cli(cli_bin, "env", "build")
    assert bare.returncode == 2 and "give --all" in bare.stderr, bare.stderr
