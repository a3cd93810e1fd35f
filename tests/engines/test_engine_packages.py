"""An engine is one package: no engine's name is code anywhere but in its own package and the tests (issue 45).

Every Python file of the installed tree (specparity/, probes/, bisect/, harness/, records/) and of scripts/
is read with ``ast``: a string constant that is not a docstring, a name, an attribute, a function or class
name, an import names a built-in engine (``dflash_mlx`` / ``dflash-mlx``, ``llama_cpp`` / ``llama-server``
...) only inside ``specparity/engines/<that engine>/``. Docstrings and comments may name anything. The
scanner is shown to fire, and to stay silent, on text written for it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import sources

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("specparity", "probes", "bisect", "harness", "records", "scripts")
# the default engine (mlx-lm) is the toolkit's own base and classic decode's home: its name is everywhere
EXEMPT = ("mlx-lm",)


def engine_tokens() -> dict[str, re.Pattern[str]]:
    """Each built-in engine but the default -> the words that name it as code: its name and its key (``-``,
    ``_`` or ``.`` between the parts, any case), and its module's top-level package."""
    from specparity import engines

    out = {}
    for name, spec in engines.registry().items():
        if name in EXEMPT or spec.distribution != engines.BUILTIN:
            continue
        parts = [re.escape(p) for p in re.split(r"[-_.]", name)]
        words = {r"[-_.]".join(parts)}
        if spec.module:
            words.add(re.escape(spec.module.split(".")[0]))
        if name == "llama.cpp":
            words.add(r"llama[-_]server")  # its binary's name is the engine's too
        out[name] = re.compile(r"(?<![a-z0-9])(?:" + "|".join(sorted(words)) + r")(?![a-z0-9])", re.I)
    return out


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in sources.nodes(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and body \
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            out.add(id(body[0].value))
    return out


def code_words(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, text) of every word of code in ``tree``: strings that are not docstrings, names, attributes,
    function, class and argument names, imported modules and names."""
    skip = _docstrings(tree)
    out: list[tuple[int, str]] = []
    for node in sources.nodes(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            out.append((line, node.value))
        elif isinstance(node, ast.Name):
            out.append((line, node.id))
        elif isinstance(node, ast.Attribute):
            out.append((line, node.attr))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.append((line, node.name))
        elif isinstance(node, ast.arg):
            out.append((line, node.arg))
        elif isinstance(node, ast.alias):
            out.append((line, node.name))
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append((line, node.module))
    return out


def _package(engine: str) -> str:
    return f"specparity/engines/{re.sub(r'[^a-z0-9]', '_', engine.lower())}/"


def offenders(files: list[Path], tokens: dict[str, re.Pattern[str]], root: Path,
              builds_on: dict[str, tuple[str, ...]] | None = None,
              depends_on: dict[str, tuple[str, ...]] | None = None) -> list[str]:
    """``path:line: engine`` for every word of code naming an engine outside its own package (and the packages
    of the engines that declare they build on it, or whose pinned environments name it as a dependency: an
    engine that is also a library, as mlx-vlm is yunshu's)."""
    on = {o: (builds_on or {}).get(o, ()) + (depends_on or {}).get(o, ()) for o in {*(builds_on or {}),
                                                                                   *(depends_on or {})}}
    homes = {e: [_package(e)] + [_package(o) for o, names in on.items() if e in names] for e in tokens}
    out = []
    for path in files:
        rel = path.relative_to(root).as_posix()
        tree = sources.parse(path.read_text())
        for line, text in code_words(tree):
            for engine, pattern in tokens.items():
                if pattern.search(text) and not rel.startswith(tuple(homes[engine])):
                    out.append(f"{rel}:{line}: {engine} ({text[:60]!r})")
    return out


def pinned_dependencies(tokens: dict[str, re.Pattern[str]]) -> dict[str, tuple[str, ...]]:
    """Each engine -> the other engines its own pinned environments name (a pin, an import, a line of what
    they leave out): there the name is a library's, not a reach into that engine's package."""
    from specparity import engines

    out = {}
    for name, spec in engines.registry().items():
        words = [w for env in spec.environments
                 for w in (*env.packages, *env.no_deps, *env.imports, *env.left_out)]
        out[name] = tuple(e for e, pattern in tokens.items() if e != name and any(pattern.search(w) for w in words))
    return out


def _tree_files() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


def test_no_engine_name_is_code_outside_its_own_package() -> None:
    from specparity import engines

    builds_on = {name: spec.builds_on for name, spec in engines.registry().items()}
    bad = offenders(_tree_files(), engine_tokens(), ROOT, builds_on, pinned_dependencies(engine_tokens()))
    assert not bad, "an engine named outside its package (read it from the registry):\n" + "\n".join(bad)


def test_the_scan_fires_on_code_and_not_on_prose(tmp_path: Path) -> None:
    """Self-test: a string, a name, an import and a keyword argument naming an engine are each found, outside
    its package; the same words in a docstring or a comment, or inside the engine's own package, are not."""
    tokens = engine_tokens()
    assert {"dflash-mlx", "mlx-dspark", "dspark-mlx", "dfly-mlx", "mtplx", "llama.cpp"} <= set(tokens)
    code = tmp_path / "specparity" / "commands" / "x.py"
    code.parent.mkdir(parents=True)
    code.write_text('"""dflash-mlx in a docstring is prose."""\n'
                    "# mtplx in a comment too\n"
                    "from specparity.engines.mlx_dspark import adapter\n"
                    "HELP = 'runs dfly-mlx'\n"
                    "def run(dspark_mlx=None):\n    return llama_server_bin\n")
    own = tmp_path / "specparity" / "engines" / "dfly_mlx" / "x.py"
    own.parent.mkdir(parents=True)
    own.write_text("NAME = 'dfly-mlx'\n")
    got = offenders([code, own], tokens, tmp_path)
    assert [g.split(" (")[0] for g in got] == ["specparity/commands/x.py:3: mlx-dspark",
                                                "specparity/commands/x.py:4: dfly-mlx",
                                                "specparity/commands/x.py:5: dspark-mlx",
                                                "specparity/commands/x.py:6: llama.cpp"], got
    # an engine that is also a library: named where another engine's pinned environment names it, nowhere else
    pins = tmp_path / "specparity" / "engines" / "mtplx" / "x.py"
    pins.parent.mkdir(parents=True)
    pins.write_text("PINS = ('dfly-mlx==1.0',)\n")
    assert offenders([pins], tokens, tmp_path, depends_on={"mtplx": ("dfly-mlx",)}) == []
    assert [g.split(" (")[0] for g in offenders([pins], tokens, tmp_path, depends_on={"llama.cpp": ("dfly-mlx",)})] \
        == ["specparity/engines/mtplx/x.py:1: dfly-mlx"]


@pytest.mark.parametrize("engine", ["dflash-mlx", "mlx-dspark", "dspark-mlx", "dfly-mlx", "mtplx", "llama.cpp"])
def test_each_builtin_engine_is_one_package_of_its_own(engine: str) -> None:
    """Its spec is its package's __init__, and every code reference it declares points into the package (or at
    the toolkit's engine-agnostic drivers, or at a format shared with another engine)."""
    from specparity import engines

    spec = engines.get(engine)
    package = f"specparity.engines.{re.sub(r'[^a-z0-9]', '_', engine)}"
    assert spec.source == package
    shared = ("specparity.probes.engine_e2e:", "specparity.fixtures.")
    for field in ("adapter", "e2e", "loops", "hooks", "warm", "default_checkpoints"):
        ref = getattr(spec, field)
        if isinstance(ref, str):
            assert ref.startswith(package) or ref.startswith(shared), (field, ref)
        elif callable(ref):
            assert ref.__module__.startswith(package), (field, ref.__module__)
    if spec.drafter_format is not None and isinstance(spec.drafter_format.build, str):
        assert spec.drafter_format.build.startswith((package, "specparity.fixtures.")), spec.drafter_format.build
    assert set(spec.profile_files()) == set(spec.profiles)
