"""A module is found without importing it or the packages above it (specparity.modfind).

``importlib.util.find_spec("mlx_vlm.server")`` imports mlx-vlm's package (1.3 s in every served job whose
profile names it as ``requires_module``); modfind finds the same answer importing nothing, and falls back to
find_spec's own answer where a package's submodules are not on its search path until it runs.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from specparity import modfind

FOUND = ("import sys; from specparity.modfind import found;"
         " print(found(sys.argv[1]), {m for m in sys.modules if m.split('.')[0] in ('mlx_lm', 'mlx', 'pkg', 'alt')})")


def _ask(module: str, path: Path | None = None) -> str:
    env_path = [str(path)] if path is not None else []
    code = f"import sys; sys.path[:0] = {env_path!r}; " + FOUND
    return subprocess.run([sys.executable, "-P", "-c", code, module], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_a_submodule_is_found_and_its_package_is_not_imported() -> None:
    assert _ask("mlx_lm.server") == "True set()"
    assert _ask("mlx_lm.models.llama") == "True set()"
    # not on its path: find_spec's answer, which imports the package, as before
    assert _ask("mlx_lm.no_such_module").startswith("False {") and "'mlx_lm'" in _ask("mlx_lm.no_such_module")


@pytest.mark.parametrize(("module", "found"), [("json", True), ("json.decoder", True), ("os.path", True),
                                               ("os.no_such", False), ("json.decoder.no_such", False),
                                               ("no_such_package", False), ("no_such_package.sub", False)])
def test_its_answers_are_find_specs(module: str, found: bool) -> None:
    assert modfind.found(module) is found


def test_a_package_that_builds_its_path_as_it_imports_is_asked_as_find_spec_asks(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "alt").mkdir()
    (tmp_path / "alt" / "sub.py").write_text("")
    (tmp_path / "pkg" / "__init__.py").write_text(f"__path__.append({str(tmp_path / 'alt')!r})\n")
    assert _ask("pkg.sub", tmp_path) == "True {'pkg'}"
    assert _ask("pkg.other", tmp_path) == "False {'pkg'}"


def test_an_environments_interpreter_runs_it_as_a_script() -> None:
    run = [sys.executable, "-P", modfind.__file__]
    assert subprocess.run([*run, "json.decoder"], check=False).returncode == 0
    assert subprocess.run([*run, "json.no_such"], check=False).returncode == 1
