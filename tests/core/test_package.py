"""Packaging: the root bisect/ never shadows the stdlib; --help is instant."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import run_cli


def test_stdlib_bisect_not_shadowed_from_repo_root(repo_root):
    out = subprocess.run(
        [sys.executable, "-P", "-c",
         "import tempfile, random, bisect, specparity.bisect;"
         "print(bisect.__file__); print(specparity.bisect.__file__)"],
        cwd=repo_root, capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    stdlib, ours = out.stdout.split()
    assert Path(stdlib).parent != repo_root / "bisect"
    assert Path(ours).parent == repo_root / "bisect"


def test_a_bare_import_bisect_in_the_repo_root_is_the_standard_library(repo_root):
    """``python -c`` in the root puts the root first on sys.path (no -P, no PYTHONSAFEPATH, as a user
    runs it), where the bisect/ folder is found before the standard library's bisect.py."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}
    code = ("import sys, bisect, random, tempfile; assert sys.path[0] == '';"
            "print(bisect.__file__); print(bisect.bisect_left([1, 2, 3], 3), random.Random(0).choice('ab'));"
            "import specparity.bisect.capture; print(specparity.bisect.__file__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=repo_root, env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    stdlib, calls, ours = out.stdout.splitlines()
    assert Path(stdlib).parent != repo_root / "bisect" and Path(stdlib).name == "bisect.py", stdlib
    assert calls == "2 b"
    assert Path(ours) == repo_root / "bisect" / "__init__.py"


def test_help_does_not_import_mlx(repo_root):
    code = (
        "import sys\n"
        "from specparity.cli import cli\n"
        "try:\n    cli.main(['--help'], standalone_mode=False)\n"
        "except SystemExit:\n    pass\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('mlx', 'mlx_lm', 'numpy', 'scipy')]\n"
        "assert not bad, bad\n"
    )
    out = subprocess.run([sys.executable, "-P", "-c", code], cwd=repo_root,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr + out.stdout


def test_help_lists_commands(cli_bin):
    out = run_cli(cli_bin, "--help")
    assert out.returncode == 0
    for name in ("probe", "gate", "fixtures"):
        assert name in out.stdout


def test_unknown_command_is_a_usage_error(cli_bin):
    out = run_cli(cli_bin, "frobnicate")
    assert out.returncode == 2
    assert "No such command" in out.stderr
    assert "Traceback" not in out.stderr


def test_readme_install_and_test_line_is_what_ci_runs(repo_root):
    ci = (repo_root / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert "scripts/check" in ci and ".[dev,test]" in ci

    def shown(page: str) -> list[str]:
        # the page's indented command lines, a trailing shell comment (the docs tier's mark) left out
        return [ln[4:].split("   # ")[0] for ln in (repo_root / page).read_text().splitlines() if ln.startswith("    ")]
    assert ci in shown("README.md")
    assert ci in shown("docs/install.md")  # the docs' install page says it too
    assert "    python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/specparity probe\n" in (
        repo_root / "README.md").read_text()


def test_every_folder_package_is_installed(repo_root):
    """A sub-package missing from [tool.setuptools] packages would import here but not when installed."""
    import tomllib

    setup = tomllib.loads((repo_root / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {
        ".".join((package, *init.parent.relative_to(repo_root / folder).parts))
        for package, folder in setup["package-dir"].items()
        for init in (repo_root / folder).rglob("__init__.py")
    }
    assert found == set(setup["packages"])


def _imported_top_level(repo_root: Path, setup: dict) -> dict[str, set[str]]:
    """Every top-level module the installed packages' source imports (absolute imports, at any depth
    of a file: inside functions too), with the files that import it."""
    import ast

    found: dict[str, set[str]] = {}
    for folder in setup["package-dir"].values():
        for path in (repo_root / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                         else [])
                for name in names:
                    found.setdefault(name.split(".")[0], set()).add(str(path.relative_to(repo_root)))
    return found


def test_every_third_party_import_is_a_declared_dependency_and_every_dependency_is_imported(repo_root):
    """A module the toolkit imports that only arrives through another package (``packaging`` through
    transformers, say) breaks an install the day that package drops it; a declared dependency nothing
    imports is a download for nothing. The engines' own modules (the registry's ``module``) are not
    dependencies: they live in the engines' pinned environments."""
    import importlib.metadata as md
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = tomllib.loads((repo_root / "pyproject.toml").read_text())
    setup = project["tool"]["setuptools"]
    own = {p.split(".")[0] for p in setup["packages"]}
    from specparity.engines import registry

    engines = {s.module.split(".")[0] for s in registry().values() if s.module}
    imported = {m: files for m, files in _imported_top_level(repo_root, setup).items()
                if m not in sys.stdlib_module_names and m not in own}
    declared = {canonicalize_name(Requirement(r).name) for r in project["project"]["dependencies"]}
    dists = md.packages_distributions()
    undeclared = {m: sorted(files)[:2] for m, files in imported.items()
                  if m not in engines and not {canonicalize_name(d) for d in dists.get(m, [m])} & declared}
    assert undeclared == {}, f"imported but not in [project] dependencies: {undeclared}"
    provided = {canonicalize_name(d) for m in imported for d in dists.get(m, [m])}
    assert declared - provided == set(), "declared dependencies that nothing imports"
