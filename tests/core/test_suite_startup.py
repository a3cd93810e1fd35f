"""How the suite's processes start: each reads transformers' import table from disk
(tests/startup/sitecustomize.py), the same table transformers builds, and any other sitecustomize
still runs; the test modules' rewritten asserts are kept, not rewritten by every worker of every run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

STARTUP = Path(__file__).resolve().parents[1] / "startup"

# the table transformers' `models` package imports from, and whether this process built it from source
PROBE = """
import pickle, sys
import transformers.utils.import_utils as iu
table = iu.define_import_structure(sys.argv[1], prefix="models")
built = iu.create_import_structure_from_path.cache_info().misses > 0
sys.stdout.buffer.write(pickle.dumps((table, built)))
"""


def _run(tables: str, extra_path: str | None = None) -> tuple[dict, bool]:
    import pickle

    import transformers

    models = str(Path(transformers.__file__).parent / "models")
    env = {**os.environ, "SPECPARITY_TEST_IMPORT_TABLES": tables,
           "PYTHONPATH": os.pathsep.join(p for p in (str(STARTUP), extra_path) if p)}
    out = subprocess.run([sys.executable, "-P", "-c", PROBE, models], env=env, capture_output=True,
                         timeout=120, check=True)
    return pickle.loads(out.stdout)


@pytest.mark.slow  # the suite's own start-up, not a command: three processes, two of them building the table
def test_a_process_reads_the_table_transformers_builds_and_builds_it_once(tmp_path):
    own, built = _run("")  # off: transformers builds its own
    assert built and len(own) > 0
    first, built_first = _run(str(tmp_path / "tables"))
    assert built_first and first == own  # built once, and kept
    assert len(list((tmp_path / "tables").glob("*.pickle"))) == 1
    second, built_second = _run(str(tmp_path / "tables"))
    assert not built_second and second == own  # read from disk: no source file scanned


def test_another_sitecustomize_later_on_the_path_still_runs(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').write('yes')\n")
    table, _ = _run(str(tmp_path / "tables"), extra_path=str(other))
    assert table and (tmp_path / "ran").read_text() == "yes"


def test_pytest_keeps_this_modules_rewritten_asserts():
    """Even where PYTHONDONTWRITEBYTECODE is set (conftest lets pytest write its own .pyc)."""
    cache = Path(__file__).parent / "__pycache__"
    kept = [p.name for p in cache.glob(Path(__file__).stem + ".*-pytest-*.pyc")]
    assert kept, f"no rewritten .pyc of {Path(__file__).name} in {cache}"


HTTPCORE = ("import sys, httpcore2._synchronization as s;"
            " print(s.trio is None, sys.modules.get('trio') is not None)")


def test_trio_which_only_the_test_extras_install_is_absent_from_the_suites_processes(tmp_path):
    """httpcore2 (under huggingface_hub, in every mlx-lm process) imports trio where it is installed; the
    suite's processes run without it, as a user's install does, and without the start-up module it is
    imported (a mutation that drops the hiding fails here)."""
    from importlib import metadata

    try:  # installed by the test extras (selenium): what is hidden (and hidden in this worker too)
        metadata.distribution("trio")
    except metadata.PackageNotFoundError:
        pytest.skip("trio is not installed here: nothing to hide")
    env = {k: v for k, v in os.environ.items() if k not in ("SPECPARITY_TEST_IMPORT_TABLES", "PYTHONPATH")}
    plain = subprocess.run([sys.executable, "-P", "-c", HTTPCORE], env=env, capture_output=True, text=True,
                           timeout=120, check=True)
    assert plain.stdout.split() == ["False", "True"]
    env.update(SPECPARITY_TEST_IMPORT_TABLES=str(tmp_path / "tables"), PYTHONPATH=str(STARTUP))
    hidden = subprocess.run([sys.executable, "-P", "-c", HTTPCORE], env=env, capture_output=True, text=True,
                            timeout=120, check=True)
    assert hidden.stdout.split() == ["True", "False"]
    # hypothesis, which loads trio's plugin at import, imports there (a pytest worker imports it)
    subprocess.run([sys.executable, "-P", "-c", "import hypothesis"], env=env, timeout=120, check=True)
