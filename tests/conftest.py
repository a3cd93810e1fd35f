"""Shared test fixtures: an isolated user dir, and the embedded checkpoints built once."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

# fixture_cache reads the real fixture cache's folder when first imported: here, before any test points
# $SPECPARITY_HOME at its own folder (a module that reaches it only through fixture_pairs, run alone, built
# every listed pair anew into that test's folder)
import fixture_cache

if TYPE_CHECKING:
    from specparity.fixtures import FixtureInfo


_STARTED = pytest.StashKey[float]()  # when the session started (pytest_terminal_summary's new pairs)

# A test using one of these fixtures needs what the marker says (pyproject.toml, README): checked
# at collection, so `-m "not model"` / `-m "not build"` never runs a test that needs one.
FIXTURE_MARKERS = {"fixture_root": "model", "llama_server_bin": "build", "chromium": "build"}


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist starts its workers as `python -c ...` in the repository root. The root `bisect/`
    # folder no longer shadows the standard library's `bisect` there (bisect/__init__.py hands a bare
    # `import bisect` the standard library's: test_package), so this is not needed for that; it is
    # kept (harmless) so the workers, and every process a test starts, import specparity as installed,
    # never a root folder that happens to share a name.
    os.environ.setdefault("PYTHONSAFEPATH", "1")
    use_import_tables()
    property_examples(config)
    # A shell without job control starts a background command with SIGINT ignored, and every process
    # a test starts would inherit that: specparity then rightly leaves Ctrl-C alone, as under nohup,
    # and the Ctrl-C tests could not test anything. A handler here (Python's own, as on a terminal) is
    # reset to the default in every child at exec, so children start as they would from a terminal.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # pytest rewrites the asserts of every test module it imports (~200 modules, ~3,000 asserts: about
    # 6 CPU seconds) and keeps the result as a .pyc, unless no .pyc may be written, as where
    # PYTHONDONTWRITEBYTECODE is set (this project's machines): then each worker of each run rewrote
    # them all again. In this process only (children keep the environment's setting).
    sys.dont_write_bytecode = False
    if not hasattr(config, "workerinput"):  # once, in the controller, before any worker starts
        compile_the_package()
    else:
        pin_worker(config.workerinput)


def pin_worker(workerinput: dict[str, Any]) -> None:
    """Where the workers are at least as many as the cores this run may use, each worker (and every process
    it starts: its CLI runs, servers, reference workers, inherit it) runs on one core: worker i on the i-th
    core, round robin. MLX's CPU backend hands each op from the Python thread to its own stream thread and
    waits; on one core that hand-off is cheap, across two a wake-up on the other core each time (the embedded
    probe alone: 2.9-3.0 CPU s pinned, 3.2-4.1 free). A test's processes mostly take turns (a harness waits on
    its server), so one core each loses little, and the suite is CPU-bound. Fewer workers than cores: left
    free. Affinity moves no result: a process computes the same on any core.

    Each is also SCHED_BATCH (inherited the same way): a thread woken on its core no longer preempts the one
    that woke it. Without it, every op MLX's Python thread hands over wakes the stream thread at once, two
    context switches an op; with it the stream thread runs when the Python thread waits, the ops queued by
    then in one go. The embedded probe on one core: 2.4-2.7 s wall, 108k voluntary switches -> 1.9-2.0 s,
    13k; the default served job: 15.5 -> 12.0 CPU s. Same priority, same share of the core: only when a
    woken thread runs changes, never what anything computes."""
    if not hasattr(os, "sched_setaffinity"):  # macOS: no affinity call
        return
    cores = sorted(os.sched_getaffinity(0))
    workers = int(workerinput.get("workercount", 0))
    index = workerinput.get("workerid", "")
    if len(cores) < 2 or workers < len(cores) or not index.startswith("gw"):
        return
    core = {cores[int(index[2:]) % len(cores)]}
    batch = getattr(os, "SCHED_BATCH", None)
    for thread in os.listdir("/proc/self/task"):  # each thread already started too (0 is the calling one only)
        os.sched_setaffinity(int(thread), core)
        if batch is not None:
            os.sched_setscheduler(int(thread), batch, os.sched_param(0))


# How many inputs each property test (tests/core/test_input_properties.py) tries: the whole suite
# (README's test command, CI) 150 per parser; the fast tier, a developer's quick loop, 40 (that
# module alone, quiet: 18.9 s -> 5.0 s).
PROPERTY_EXAMPLES = {"whole": 150, "fast": 40}


def property_examples(config: pytest.Config) -> None:
    """Load the hypothesis profile for this run: ``fast`` where ``-m`` leaves the slow tests out."""
    from hypothesis import settings

    tier = "fast" if "not slow" in (config.getoption("markexpr") or "") else "whole"
    for name, n in PROPERTY_EXAMPLES.items():
        settings.register_profile(name, max_examples=n)
    settings.load_profile(tier)


def use_import_tables() -> None:
    """Every Python process the suite starts reads transformers' import table from disk instead of
    building it from the source of ~3,300 files (tests/startup/sitecustomize.py: 1.2 of the 2.75 CPU
    seconds importing mlx-lm costs, in each of the hundreds of processes), kept in specparity's own
    cache directory. Once per run, in the controller: the workers and everything they start inherit
    the environment, pinned environments' processes included ($SPECPARITY_ENV_PYTHONPATH). Already set: left as it is
    (empty: off, every process builds its own table)."""
    if "SPECPARITY_TEST_IMPORT_TABLES" in os.environ:
        return
    from specparity.environments import PYTHONPATH_VAR
    from specparity.paths import home

    startup = str(Path(__file__).resolve().parent / "startup")
    os.environ["SPECPARITY_TEST_IMPORT_TABLES"] = str(home() / "test-import-tables")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (startup, os.environ.get("PYTHONPATH")) if p)
    # processes in a pinned environment (engine runs, their servers, reference workers: ~170 a run) drop the
    # caller's PYTHONPATH; this one entry they keep (its module imports nothing of theirs)
    os.environ[PYTHONPATH_VAR] = startup


def compile_the_package() -> None:
    """Byte-compile specparity's folders (an editable install: pip compiled none of them). Where
    PYTHONDONTWRITEBYTECODE is set (it is on this project's machines), no process writes a .pyc, so
    every process the suite starts (a CLI run, a server, a worker, an engine's re-run: hundreds)
    compiled the modules it imports from source, up to half a CPU second each; a .pyc is still read."""
    import compileall
    import tomllib

    root = Path(__file__).resolve().parent.parent
    folders = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values())
    for folder in sorted(folders):
        compileall.compile_dir(root / folder, quiet=2)


# The modules that take longest (by their summed test durations in a quiet 3-worker run on 2 cores with the
# fixture pairs cached, longest first), run first:
# pytest-xdist's loadscope hands a worker one whole module at a time (a module-scoped fixture,
# servers or served records, is made once), in collection order; longest first keeps a long
# module from starting last and ending the run alone. The rest keep their order after these.
LONGEST_FIRST = ("test_serve_exact", "test_diagnose", "test_dflash_mlx_served", "test_served_oracle",
                 "test_inprocess_engines",
                 "test_dflash_mlx", "test_serve_served_job", "test_e2e", "test_own_loop_engines",
                 "test_served_dist", "test_served", "test_registry", "test_memory", "test_nightly",
                 "test_serve_as_server", "test_environments", "test_compare_merge_show", "test_served_faults",
                 "test_mlx_dspark_reproduce", "test_reference", "test_serve", "test_cli_errors", "test_block_vs_chain",
                 "test_replay", "test_served_signals", "test_inputs", "test_resolve", "test_witness",
                 "test_replay_sequence", "test_dflash_mlx_reproduce", "test_records_cli", "test_outputs")


def pytest_sessionstart(session: pytest.Session) -> None:
    import time

    session.config.stash[_STARTED] = time.time()


def pytest_sessionfinish(session: pytest.Session) -> None:
    import forkcli

    forkcli.stop()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Name every fixture pair this run built that took long and that scripts/build-test-fixtures does not
    build (tests/fixture_pairs.py): the list keeping up with the tests."""
    import fixture_pairs

    started = config.stash.get(_STARTED, None)
    if started is None or hasattr(config, "workerinput") or not fixture_cache.enabled():
        return
    listed = set(fixture_pairs.PAIRS)
    slow = []
    for manifest in fixture_cache.ROOT.glob("*/*/*.manifest.json"):
        try:
            if manifest.stat().st_mtime < started:
                continue
            seconds = float(json.loads(manifest.read_text()).get("build_seconds", 0))
        except (OSError, ValueError, TypeError, AttributeError):
            continue
        name = manifest.name.removesuffix(".manifest.json").rsplit("-", 1)[0]
        if seconds > fixture_pairs.SLOW_BUILD and name not in listed:
            slow.append(f"{name} ({manifest.parent.parent.name}): built in the run in {seconds:.0f} s")
    if slow:
        terminalreporter.write_sep("=", "fixture pairs to list in tests/fixture_pairs.py", yellow=True)
        for line in sorted(slow):
            terminalreporter.write_line(line)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(Path(str(item.fspath)).stem, len(rank)))
    unmarked = [f"{item.nodeid} uses {fixture}: mark it {marker}"
                for item in items for fixture, marker in FIXTURE_MARKERS.items()
                if fixture in getattr(item, "fixturenames", ()) and item.get_closest_marker(marker) is None]
    if unmarked:
        raise pytest.UsageError("tests without the marker their fixtures need:\n" + "\n".join(unmarked))


@pytest.fixture(autouse=True)
def isolated_home(tmp_path, monkeypatch):
    """Every test gets its own SPECPARITY_HOME (gate store, digests), never the user's."""
    home = tmp_path / "specparity-home"
    monkeypatch.setenv("SPECPARITY_HOME", str(home))
    return home


@pytest.fixture(autouse=True)
def marked_for_what_it_does(request, isolated_home, tmp_path, monkeypatch):
    """What a test did, checked against its markers after it ran (the fixtures' are checked at collection).

    server: it started a server through the one lifecycle (harness.lifecycle.Server.spawn, in this
    process), or a command it ran left server logs in its tmp_path (a record's servers/ folder). A
    command run without a record removes its servers' folder, so that case is the test's to mark.
    model: a model was built into its SPECPARITY_HOME (the embedded default pair a command falls back
    on, a DFlash or constant fixture), which also loads it.
    """
    from specparity.harness import lifecycle

    started: list[str] = []
    spawn = lifecycle.Server.spawn

    def counted(self: lifecycle.Server) -> None:
        started.append(self.name)
        spawn(self)

    monkeypatch.setattr(lifecycle.Server, "spawn", counted)
    yield
    missing = []
    if request.node.get_closest_marker("server") is None:
        logs = [] if started else sorted(tmp_path.rglob("server-*.log"))[:1]
        if started or logs:
            missing.append(f"started {started[0] if started else 'a server (' + logs[0].name + ')'}: mark it server")
    if request.node.get_closest_marker("model") is None and (isolated_home / "fixtures").exists():
        missing.append(f"built a model into {isolated_home / 'fixtures'}: mark it model")
    envs = sorted(p.parent.name for p in (isolated_home / "envs").glob("*/specparity-env.json"))
    if envs:  # a pinned environment built inside a test: 30 s and more each time, and no test builds one
        missing.append(f"built the environment {envs[0]} into its own home: run it from the one scripts/build-env"
                       " built (tests/builds.py: SPECPARITY_ENV_CACHE set to REAL_CACHE)")
    if missing:
        pytest.fail(f"{request.node.nodeid}: " + "; ".join(missing), pytrace=False)


@pytest.fixture(scope="session")
def fixture_root(tmp_path_factory) -> Path:
    """One directory per test session holding every built fixture."""
    return tmp_path_factory.mktemp("fixtures")


_BUILT: dict[tuple[str, str], FixtureInfo] = {}


def build(root: Path, name: str, **kwargs: Any) -> FixtureInfo:
    """Build (once per session) the fixture pair ``name`` with ``kwargs`` under ``root``.

    Keyed on every argument, and each distinct set of arguments gets its own
    directory: build_pair returns whatever fixture already sits in a directory,
    so a name reused with other arguments must not land in the same one.
    """
    from fixture_pairs import built_pair

    made = built_pair(name, **kwargs)
    key = (str(root), made.name)
    if key not in _BUILT:
        _BUILT[key] = made.build(root)
    return _BUILT[key]


# A rows fault in layer 2's MLP that fires on verify blocks of 4+ rows: the probe, gate and CLI
# tests' injected fault. SCALED_ROWS4 (x1.5) is large enough to flip a greedy token, which the
# served, nightly and records tests need.
ROWS4 = {"kind": "rows", "layer": 2, "subop": "mlp", "min_rows": 4}
SCALED_ROWS4 = {**ROWS4, "scale": 1.5}


@pytest.fixture(scope="session")
def llama_pair(fixture_root: Path) -> FixtureInfo:
    """The clean llama pair (target and drafter), float32."""
    return build(fixture_root, "llama-float32", arch="llama")


@pytest.fixture(scope="session")
def rows4_pair(fixture_root: Path) -> FixtureInfo:
    """The llama pair whose target carries ROWS4 (loading it needs trust_remote_code)."""
    return build(fixture_root, "llama-rows4", arch="llama", faults=[ROWS4])


@pytest.fixture(scope="session")
def scaled_rows4_pair(fixture_root: Path) -> FixtureInfo:
    """The llama pair whose target carries SCALED_ROWS4: a greedy token flips at 4+ verify rows."""
    return build(fixture_root, "llama-rows4-scaled", arch="llama", faults=[SCALED_ROWS4])


@pytest.fixture(scope="session")
def llama_server_bin() -> str:
    """The llama-server that scripts/build-llama-server put in its cache (no test builds it).

    Missing: a skip locally, a failure where ``CI`` is set, so CI never goes green by skipping.
    """
    from specparity.engines.llama_cpp.served import find_llama_server

    found = find_llama_server()
    if found:
        return found
    why = "llama-server is not built: run scripts/build-llama-server"
    if os.environ.get("CI"):
        pytest.fail(f"{why} (CI is set: a missing build fails, never skips)")
    pytest.skip(why)


@pytest.fixture(scope="session")
def chromium() -> tuple[str, str]:
    """(chromium, chromedriver): Debian's headless browser, installed once by scripts/install-chromium.

    Missing: a skip locally, a failure where ``CI`` is set, as for llama-server.
    """
    import shutil

    found = (shutil.which("chromium"), shutil.which("chromedriver"))
    if all(found):
        return str(found[0]), str(found[1])
    why = "chromium / chromedriver are not installed: run scripts/install-chromium"
    if os.environ.get("CI"):
        pytest.fail(f"{why} (CI is set: a missing build fails, never skips)")
    pytest.skip(why)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def cli_bin() -> str:
    """The installed console script next to this interpreter."""
    import sys

    exe = Path(sys.executable).parent / "specparity"
    assert exe.exists(), f"{exe} missing: install the package (README)"
    return str(exe)


@pytest.fixture(autouse=True)
def served_results_follow_their_schema(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every served job a test runs in process (``ServedRun(...).run()``) gives what ``served --json``
    would print for it, validated against served.schema.json: the suite's in-process jobs (faults, ties,
    declines, errors, distribution arms) are that schema's coverage too. Only where the test module
    imported the runner: nothing is imported for the others."""
    import sys

    runner = sys.modules.get("specparity.harness.run")
    if runner is None:
        return
    run = runner.ServedRun.run

    def validated(self: Any) -> Any:
        from specparity.commands._common import result_json

        report = run(self)
        validate(result_json(report), "served", "served --json of ServedRun(...).run()")
        return report

    monkeypatch.setattr(runner.ServedRun, "run", validated)


def pid_alive(pid: int) -> bool:
    """A process ``pid`` exists (signal 0)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def own_tmpdir(folder: Path) -> Path:
    """``folder`` made a TMPDIR of a run's own (to see what the run leaves there), its ``mlx`` linked to the
    suite's shared MLX kernel cache: MLX's CPU backend compiles the kernels of compiled functions with a C++
    compiler at their first use and keeps them in TMPDIR/mlx, and a run in an empty TMPDIR compiled every one anew
    (seconds of a compiler each: most of the mlx-openai-server tests' time)."""
    import tempfile

    folder.mkdir(parents=True, exist_ok=True)
    shared = Path(tempfile.gettempdir()) / "mlx"
    shared.mkdir(exist_ok=True)
    (folder / "mlx").symlink_to(shared, target_is_directory=True)
    return folder


def run_cli(cli_bin: str, *args: str, env: dict | None = None, cwd: str | None = None):
    """Run the real CLI in a subprocess; returns CompletedProcess (text). The commands that import
    mlx-lm run forked from a process that imported it once (tests/forkcli.py says when, and why
    that cannot change a run's outcome); the others are exec'd.

    Every ``--json`` output it prints and every record it writes (``--record-dir``, merge's
    ``--out``) is validated against the published schemas (specparity/schemas): the suite's
    own runs are the schemas' coverage.
    """
    import forkcli

    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    r = forkcli.run([cli_bin, *args], full_env, cwd, timeout=600)
    check_outputs(list(args), r.stdout, cwd, r.returncode)
    return r


def validate(obj: Any, name: str, what: str = "") -> None:
    """``obj`` is what schema ``name`` describes; else an AssertionError naming the place and the rule."""
    import jsonschema

    from specparity import schemas

    validator = jsonschema.Draft202012Validator(schemas.load(name))
    errors = sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        where = "/".join(map(str, e.absolute_path)) or "(top)"
        raise AssertionError(f"{what or 'output'} does not follow {name}.schema.json at {where}: {e.message}"
                             f" ({len(errors)} error(s))")


def check_outputs(argv: list[str], stdout: str, cwd: str | None = None, returncode: int | None = None) -> None:
    """The ``--json`` on ``stdout`` of ``specparity ARGV`` and the records it wrote, against their schemas.

    With --json, stdout is one JSON object whatever happened (a usage error included): the process's
    ``verdict`` and ``exit_code`` first, ``exit_code`` the process's own (``returncode``, where given)."""
    from specparity import schemas

    words = argv[:argv.index("--")] if "--" in argv else argv
    if "--json" in words and not {"-h", "--help"} & set(words):
        what = f"specparity {' '.join(argv)}"
        obj = json.loads(stdout)
        assert isinstance(obj, dict) and list(obj)[:2] == ["verdict", "exit_code"], f"{what}: {stdout[:200]}"
        assert returncode is None or obj["exit_code"] == returncode, (what, obj["exit_code"], returncode)
        validate(obj, schemas.for_argv(argv), what)
    for flag in ("--record-dir", "--out"):
        if flag in argv[:-1]:
            d = Path(cwd or ".") / argv[argv.index(flag) + 1]
            if os.path.isdir(d) and os.path.isdir(d / "data"):  # False for a name too long, as for a missing one
                check_records(d)


def check_records(record_dir: Path) -> None:
    """Every record in ``record_dir``: report.json, identity.json, each JSONL line, the summary."""
    from specparity import schemas

    for data in sorted(p for p in (record_dir / "data").iterdir() if (p / "report.json").is_file()):
        report = json.loads((data / "report.json").read_text())
        kind = str(report.get("kind"))
        validate(report, "record-report", str(data / "report.json"))
        summary = schemas.for_summary(kind)
        if summary is not None and report.get("summary") is not None:
            validate(report["summary"], summary, f"{data / 'report.json'} summary")
        if (data / "identity.json").is_file():
            validate(json.loads((data / "identity.json").read_text()), "record-identity", str(data / "identity.json"))
        for f in sorted(data.glob("*.jsonl")):
            for i, line in enumerate(f.read_text().splitlines()):
                if line.strip():
                    validate(json.loads(line), schemas.for_record_file(f, kind), f"{f}, line {i + 1}")


def assert_report(rep) -> dict:
    """``rep`` follows the verdict contract: Report protocol, to_dict carrying verdict and exit_code, and
    every number its text prints held by to_dict (the text and --json render one result)."""
    import json

    from specparity.verdicts import Report, Verdict, exit_code

    assert isinstance(rep, Report), type(rep)
    assert isinstance(rep.verdict, Verdict)
    d = rep.to_dict()
    assert d["verdict"] == rep.verdict and d["exit_code"] == rep.exit_code == exit_code(rep.verdict)
    assert json.loads(json.dumps(d, default=str))["verdict"] == rep.verdict.value
    lines = rep.lines()
    assert lines and all(isinstance(s, str) and "\n" not in s for s in lines)
    # the text and the JSON are one result: every number the text prints is a field of to_dict()
    missing = text_numbers_missing(lines, d)
    assert not missing, f"{type(rep).__name__}: the text prints numbers its to_dict() does not hold: {missing[:3]}"
    return d


# a number the text prints: not inside a name (w4, sha256, float16) nor a word's suffix (top-2)
_NUMBER_RE = r"(?<![\w.-])-?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w.])"


def _scalars(obj: Any) -> list[Any]:
    if isinstance(obj, dict):
        return [v for x in obj.values() for v in _scalars(x)]
    if isinstance(obj, (list, tuple)):
        return [len(obj)] + [v for x in obj for v in _scalars(x)]
    return [obj]


def text_numbers_missing(lines: list[str], d: dict[str, Any]) -> list[tuple[str, str]]:
    """(number, line) for each number the text prints that no field of ``d`` holds (as printed: whole,
    %.2f / %.3f / %.4g / %g, a percentage, or a list's length)."""
    import re

    nums = [v for v in _scalars(d) if isinstance(v, (int, float)) and not isinstance(v, bool)]
    shown: set[str] = set()
    for v in nums:
        shown |= {str(v), *(format(v, spec) for spec in (".1f", ".2f", ".3f", ".4f", ".5f", ".2g", ".3g", ".4g", "g")),
                  f"{v * 100:.1f}", f"{v * 100:.0f}"}
        if float(v).is_integer():
            shown.add(str(int(v)))
    out = []
    for line in lines:
        for token in re.findall(_NUMBER_RE, line):
            if token not in shown:
                out.append((token, line))
    return out


def main_in_process(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """The CLI in this process (its own error handling and exit code): (code, stdout, stderr)."""
    from specparity.cli import main

    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    out = capsys.readouterr()
    assert isinstance(exc.value.code, int)
    return exc.value.code, out.out, out.err


def sleeping_dist(cli_bin: str, tmp_path: Path, *extra: str) -> Any:
    """``dist`` with a user rule that sleeps (no server, nothing to clean up but the process), started and
    waited for until the rule runs: the caller signals it (the process, a Popen with pipes)."""
    import subprocess
    import time

    started = tmp_path / "rule-started"
    rules = tmp_path / "slow.py"
    rules.write_text("import pathlib, time\n"
                     "def rule(p, q, draft, rng):\n"
                     f"    pathlib.Path({str(started)!r}).touch()\n"
                     "    time.sleep(600)\n")
    proc = subprocess.Popen([cli_bin, "dist", "--rule", f"{rules}:rule", "--samples", "200", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not started.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(proc.communicate())
        time.sleep(0.05)
    return proc
