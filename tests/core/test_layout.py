"""The package's shape: layers that only point down, no import cycle, no reach into another module's private names.

Every check reads the modules' source with ``ast`` (nothing is imported). The
layers and their order are declared once, in :mod:`specparity.layers`. The
layer and cycle checks count every import: inside functions (a cycle hidden by
a lazy import is still a cycle) and under ``if TYPE_CHECKING:`` (a type named
in a signature is a dependency of the reader too). The private-name check
leaves ``TYPE_CHECKING`` blocks alone: an annotation reaches no one's state.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import sources

from specparity.layers import LAYERS, layer_of

ROOT = Path(__file__).resolve().parents[2]


def _modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package under ``root``: dotted name -> source file (the package-dir mapping applied)."""
    cfg = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    out: dict[str, Path] = {}
    for package in cfg["packages"]:
        top = next(p for p in sorted(cfg["package-dir"], key=len, reverse=True)
                   if package == p or package.startswith(p + "."))
        folder = root / cfg["package-dir"][top] / Path(*package[len(top):].strip(".").split(".")) \
            if package != top else root / cfg["package-dir"][top]
        for f in sorted(folder.glob("*.py")):
            out[package if f.stem == "__init__" else f"{package}.{f.stem}"] = f
    return out


MODULES = _modules()


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
        (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, here: str, package: bool = False,
             types: bool = False) -> list[tuple[str, list[str], int]]:
    """(module, names imported from it, line) for every import (under ``if TYPE_CHECKING:`` only with ``types``).

    here: the importing module's name; package: it is a package's ``__init__`` (its relative
    imports start from the package itself, not from its parent).
    """
    out: list[tuple[str, list[str], int]] = []
    base_parts = here.split(".") if package else here.split(".")[:-1]

    def visit(node: ast.AST) -> None:
        if not types and isinstance(node, ast.If) and _is_type_checking(node):
            for n in node.orelse:
                visit(n)
            return
        if isinstance(node, ast.Import):
            out.extend((a.name, [], node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = base_parts[:len(base_parts) - node.level + 1]
                base = ".".join([*parts, base]) if base else ".".join(parts)
            out.append((base, [a.name for a in node.names], node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _defined_private(tree: ast.AST) -> set[str]:
    """The private names a module defines: module-level and class-level names, methods, and
    attributes its methods set on ``self`` / ``cls``."""
    out: set[str] = set()
    for node in sources.nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            out.add(node.attr)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.add(node.target.id)
    return {n for n in out if _private(n)}


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` as a string (None for anything but names and attributes)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner is not None else None
    return None


def private_uses(modules: dict[str, tuple[str, str]], project: str = "specparity") -> list[str]:
    """Every place a module reaches another project module's private name.

    modules: dotted name -> (file name as reported, source); ``__init__`` files name their package.
    Found: an import of a private name from a project module; ``M._x`` or ``pkg.mod._x`` where the
    expression is a project module other than this one; ``obj._x`` where ``obj`` is not self / cls /
    super() and ``_x`` is private to another project module and not defined in this one (the
    original offence: ``run._start`` on another module's object). Names reached through a
    third-party module (``mlx_lm.x._y``) are that library's business.
    """
    trees = {name: sources.parse(src) for name, (_, src) in modules.items()}
    own = {name: _defined_private(tree) for name, tree in trees.items()}
    bad: list[str] = []
    for name, tree in trees.items():
        where = modules[name][0]
        package = where.endswith("__init__.py")
        others = set().union(*(own[m] for m in own if m != name)) if len(own) > 1 else set()
        bound: dict[str, str] = {}  # local name -> the module (project or not) it is bound to
        for node in sources.nodes(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    bound[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        for mod, names, line in _imports(tree, name, package):
            for n in names:
                if mod.startswith(project) and _private(n):
                    bad.append(f"{where}:{line}: imports {n} from {mod}")
        for node in sources.nodes(tree):
            if isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                if node.level:
                    parts = (name.split(".") if package else name.split(".")[:-1])
                    parts = parts[:len(parts) - node.level + 1]
                    mod = ".".join([*parts, mod]) if mod else ".".join(parts)
                for a in node.names:
                    bound[a.asname or a.name] = f"{mod}.{a.name}"
        for node in sources.nodes(tree):
            if not (isinstance(node, ast.Attribute) and _private(node.attr)):
                continue
            value = node.value
            if isinstance(value, ast.Name) and value.id in ("self", "cls"):
                continue
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super":
                continue
            dotted = _dotted(value)
            root = dotted.split(".")[0] if dotted else None
            target = None
            if dotted is not None and root in bound:
                target = bound[root] + dotted[len(root):]
            if target is not None and not target.startswith(project):
                continue  # a third-party module's (or its object's) own business
            if target is not None and target in modules and target != name:
                bad.append(f"{where}:{node.lineno}: uses {target}.{node.attr}")
            elif node.attr in others and node.attr not in own[name]:
                bad.append(f"{where}:{node.lineno}: reaches {node.attr}, private to another module,"
                           f" through {ast.unparse(value)}")
    return sorted(bad, key=lambda b: (b.split(":")[0], int(b.split(":")[1])))


def test_the_module_list_is_the_package():
    assert "specparity.harness.run" in MODULES and "specparity.records.served" in MODULES
    assert all(p.is_file() for p in MODULES.values())


def test_no_module_reaches_a_private_name_of_another():
    bad = private_uses(_sources(MODULES))
    assert not bad, "\n".join(bad)


def test_the_private_name_check_fires():
    a = ("class Run:\n    def _start(self):\n        self._port = 1\n"
         "_TABLE = {}\ndef _helper():\n    pass\n")
    mods = {"specparity.a": ("a.py", a),
            "specparity.pkg": ("pkg/__init__.py", "from . import mod\nfrom .mod import _hidden\n"),
            "specparity.pkg.mod": ("pkg/mod.py", "_hidden = 1\n"),
            "specparity.b": ("b.py", "\n".join([
                "import specparity.a",
                "import mlx_lm",
                "from specparity import a as alias",
                "from specparity.a import _helper",
                "def go(run, tokenizer):",
                "    run._start()",          # another module's private method on its object
                "    specparity.a._TABLE",   # dotted access to a module's private name
                "    alias._helper()",       # through a module alias
                "    mlx_lm.models._x",      # third party: allowed
                "    tokenizer._tokenizer",  # no project module defines it: allowed
                "    self._port",            # self: allowed
                "    super()._start()",      # the base class's: allowed
            ]))}
    bad = private_uses(mods)
    assert bad == ["b.py:4: imports _helper from specparity.a",
                   "b.py:6: reaches _start, private to another module, through run",
                   "b.py:7: uses specparity.a._TABLE",
                   "b.py:8: uses specparity.a._helper",
                   "pkg/__init__.py:2: imports _hidden from specparity.pkg.mod"], bad
    # a module's own private names are its own, also on another object of its class
    mods["specparity.b"] = ("b.py", "class Run:\n    def _start(self):\n        pass\n"
                                    "def go(run):\n    run._start()\n")
    assert private_uses(mods) == ["pkg/__init__.py:2: imports _hidden from specparity.pkg.mod"]
    # a package's relative import names the package itself
    assert _imports(ast.parse("from . import mod\nfrom .mod import x\nfrom .. import y"), "specparity.pkg",
                    package=True) == [("specparity.pkg", ["mod"], 1), ("specparity.pkg.mod", ["x"], 2),
                                      ("specparity", ["y"], 3)]
    assert _imports(ast.parse("from . import sib"), "specparity.pkg.mod") == [("specparity.pkg", ["sib"], 1)]


def _sources(modules: dict[str, Path], root: Path = ROOT) -> dict[str, tuple[str, str]]:
    return {name: (str(path.relative_to(root)), sources.read(path)) for name, path in modules.items()}


def _edges(modules: dict[str, tuple[str, str]], project: str = "specparity") -> list[tuple[str, str, str]]:
    """(importer, imported module, where) for every import of a project module, type-only and lazy ones included.

    ``from pkg import mod`` names the module ``pkg.mod`` where there is one, else ``pkg``; an import of a
    project module that is not in ``modules`` (not written yet) still names it.
    """
    out: list[tuple[str, str, str]] = []
    for name, (where, src) in modules.items():
        for mod, names, line in _imports(sources.parse(src), name, where.endswith("__init__.py"), types=True):
            if not (mod == project or mod.startswith(project + ".")):
                continue
            targets = [f"{mod}.{n}" for n in names if f"{mod}.{n}" in modules]
            if len(targets) < len(names or [None]):
                targets.append(mod)
            out.extend((name, t, f"{where}:{line}") for t in targets if t != name)
    return out


def _graph(modules: dict[str, tuple[str, str]]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for a, b, _ in _edges(modules):
        if b in modules:
            graph[a].add(b)
    return graph


def upward_imports(modules: dict[str, tuple[str, str]], layers=LAYERS) -> list[str]:
    """Every import of a module in a higher layer than the importer's (specparity.layers)."""
    bad = []
    for a, b, where in _edges(modules):
        la, lb = layer_of(a, layers), layer_of(b, layers)
        if la is not None and lb is not None and lb > la:
            bad.append(f"{where}: {a} ({layers[la][0]}) imports {b} ({layers[lb][0]})")
    return sorted(set(bad))


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    import sys

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def test_every_module_has_a_layer():
    assert all(layer_of(m) is not None for m in MODULES)
    assert [layer_of(m) for m in ("specparity.errors", "specparity.probes.replay.core", "specparity.cli",
                                  "specparity.harness.gated.server", "specparity.records",
                                  "specparity.diagnose.tree")] == [0, 1, 7, 3, 5, 6]
    # the engine registry's package is core (everything asks it for an engine); each engine's module is above
    assert [layer_of(m) for m in ("specparity.engines", "specparity.engines.mlx_lm")] == [0, 4]


def test_no_import_points_up_a_layer():
    bad = upward_imports(_sources(MODULES))
    assert not bad, "imports from a higher layer (specparity/layers.py):\n" + "\n".join(bad)


def test_no_import_cycle_even_through_lazy_or_type_only_imports():
    cycles = _cycles(_graph(_sources(MODULES)))
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_check_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def _tree(root: Path, files: dict[str, str]) -> dict[str, tuple[str, str]]:
    """A package laid out as this one is (folders mapped into specparity.* by pyproject.toml), read back."""
    root.mkdir()
    (root / "pyproject.toml").write_text(
        '[tool.setuptools]\npackages = ["specparity", "specparity.probes", "specparity.harness"]\n'
        '[tool.setuptools.package-dir]\n"specparity" = "specparity"\n"specparity.probes" = "probes"\n'
        '"specparity.harness" = "harness"\n')
    for rel, src in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(src)
    return _sources(_modules(root), root)


def test_the_layer_and_cycle_checks_fire_on_a_tree(tmp_path):
    clean = {
        "specparity/__init__.py": "",
        "specparity/errors.py": "class E(Exception):\n    pass\n",
        # probes/ without __init__.py, as bisect/ is: read all the same
        "probes/walk.py": "from specparity.errors import E\n",
        "harness/__init__.py": "",
        "harness/run.py": "from specparity.probes import walk\nfrom . import plan\n",
        "harness/plan.py": "from typing import TYPE_CHECKING\n",
    }
    mods = _tree(tmp_path / "clean", clean)
    assert set(mods) >= {"specparity.errors", "specparity.probes.walk", "specparity.harness.plan"}
    assert upward_imports(mods) == [] and _cycles(_graph(mods)) == []

    # an upward import, even lazy inside a function, and one of a layer not written yet (the registry)
    up = {**clean, "probes/walk.py": "from specparity.errors import E\n\ndef go():\n"
                                     "    from specparity.harness.run import x\n    import specparity.engines.mlx_lm\n"}
    assert upward_imports(_tree(tmp_path / "up", up)) == [
        "probes/walk.py:4: specparity.probes.walk (probes) imports specparity.harness.run (harness)",
        "probes/walk.py:5: specparity.probes.walk (probes) imports specparity.engines.mlx_lm (engines)"]

    # a cycle through a type-only import, which a run never executes (the private-name check skips it)
    typed = {**clean, "harness/plan.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                                         "    from specparity.harness.run import Run\n"}
    mods = _tree(tmp_path / "typed", typed)
    assert upward_imports(mods) == []
    assert _cycles(_graph(mods)) == [["specparity.harness.plan", "specparity.harness.run"]]
    plan = ast.parse(typed["harness/plan.py"])
    assert _imports(plan, "specparity.harness.plan") == [("typing", ["TYPE_CHECKING"], 1)]


def test_the_harness_map_names_every_module_and_folder():
    """harness/__init__.py is the map a newcomer reads: each file and sub-folder of harness/ is on it."""
    import specparity.harness as harness

    doc = harness.__doc__ or ""
    folder = ROOT / "harness"
    entries = [f.name for f in folder.glob("*.py") if f.name != "__init__.py"]
    entries += [f"{d.name}/" for d in folder.iterdir() if d.is_dir() and not d.name.startswith(("_", "."))]
    missing = [e for e in sorted(entries) if f"    {e}" not in doc]
    assert not missing, f"harness/__init__.py's map lacks {missing}"
