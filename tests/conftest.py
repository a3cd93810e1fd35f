"""Shared test fixtures: an isolated user dir, and the embedded checkpoints built once."""

from __future__ import annotations

import hashlib
import json
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from specparity.fixtures import FixtureInfo


# A test using one of these fixtures needs what the marker says (pyproject.toml, README): checked
# at collection, so `-m "not model"` / `-m "not build"` never runs a test that needs one.
FIXTURE_MARKERS = {"fixture_root": "model", "llama_server_bin": "build"}


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist starts its workers as `python -c ...` in the repository root. The root `bisect/`
    # folder no longer shadows the standard library's `bisect` there (bisect/__init__.py hands a bare
    # `import bisect` the standard library's: test_package), so this is not needed for that; it is
    # kept (harmless) so the workers, and every process a test starts, import specparity as installed,
    # never a root folder that happens to share a name.
    os.environ.setdefault("PYTHONSAFEPATH", "1")
    # A shell without job control starts a background command with SIGINT ignored, and every process
    # a test starts would inherit that: specparity then rightly leaves Ctrl-C alone, as under nohup,
    # and the Ctrl-C tests could not test anything. A handler here (Python's own, as on a terminal) is
    # reset to the default in every child at exec, so children start as they would from a terminal.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# The modules that take longest (by their summed test durations in a quiet 3-worker run on 2 cores,
# longest first), run first:
# pytest-xdist's loadscope hands a worker one whole module at a time (a module-scoped fixture,
# servers or served records, is made once), in collection order; longest first keeps a long
# module from starting last and ending the run alone. The rest keep their order after these.
LONGEST_FIRST = ("test_serve_exact", "test_dflash_serve", "test_served_oracle", "test_serve_served_job",
                 "test_served", "test_dflash", "test_served_dist", "test_nightly", "test_records_tools",
                 "test_e2e", "test_serve", "test_probe", "test_reference", "test_serve_hardening",
                 "test_nightly_matrix", "test_dflash_reproduce", "test_served_signals", "test_environments")


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
    if missing:
        pytest.fail(f"{request.node.nodeid}: " + "; ".join(missing), pytrace=False)


@pytest.fixture(scope="session")
def fixture_root(tmp_path_factory) -> Path:
    """One directory per test session holding every built fixture."""
    return tmp_path_factory.mktemp("fixtures")


_BUILT: dict[tuple[str, str, str], FixtureInfo] = {}


def build(root: Path, name: str, **kwargs: Any) -> FixtureInfo:
    """Build (once per session) the fixture pair ``name`` with ``kwargs`` under ``root``.

    Keyed on every argument, and each distinct set of arguments gets its own
    directory: build_pair returns whatever fixture already sits in a directory,
    so a name reused with other arguments must not land in the same one.
    """
    from specparity.fixtures import build_pair

    spec = json.dumps(kwargs, sort_keys=True, default=str)
    key = (str(root), name, spec)
    if key not in _BUILT:
        digest = hashlib.sha256(spec.encode()).hexdigest()[:8]
        _BUILT[key] = build_pair(root / f"{name}-{digest}", **kwargs)
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
    from specparity.harness.engines.llama_cpp import find_llama_server

    found = find_llama_server()
    if found:
        return found
    why = "llama-server is not built: run scripts/build-llama-server"
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


def run_cli(cli_bin: str, *args: str, env: dict | None = None, cwd: str | None = None):
    """Run the real CLI in a subprocess; returns CompletedProcess (text)."""
    import subprocess

    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    return subprocess.run([cli_bin, *args], capture_output=True, text=True, env=full_env,
                          cwd=cwd, timeout=600)


def assert_report(rep) -> dict:
    """``rep`` follows the verdict contract: Report protocol, to_dict carrying verdict and exit_code."""
    import json

    from specparity.verdicts import Report, Verdict, exit_code

    assert isinstance(rep, Report), type(rep)
    assert isinstance(rep.verdict, Verdict)
    d = rep.to_dict()
    assert d["verdict"] == rep.verdict and d["exit_code"] == rep.exit_code == exit_code(rep.verdict)
    assert json.loads(json.dumps(d, default=str))["verdict"] == rep.verdict.value
    lines = rep.lines()
    assert lines and all(isinstance(s, str) and "\n" not in s for s in lines)
    return d
