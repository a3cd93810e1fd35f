"""Packaging: the root bisect/ never shadows the stdlib; --help is instant."""

from __future__ import annotations

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
