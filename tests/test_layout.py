"""The package's shape: no module reaches into another's private names, and no import cycle.

Both checks read every module's source with ``ast`` (nothing is imported), and
count imports inside functions too: a cycle hidden by a lazy import is still a
cycle. Imports under ``if TYPE_CHECKING:`` are annotations, not dependencies.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _modules() -> dict[str, Path]:
    """Every module of the package: dotted name -> source file (the package-dir mapping applied)."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    out: dict[str, Path] = {}
    for package in cfg["packages"]:
        top = next(p for p in sorted(cfg["package-dir"], key=len, reverse=True)
                   if package == p or package.startswith(p + "."))
        folder = ROOT / cfg["package-dir"][top] / Path(*package[len(top):].strip(".").split(".")) \
            if package != top else ROOT / cfg["package-dir"][top]
        for f in sorted(folder.glob("*.py")):
            out[package if f.stem == "__init__" else f"{package}.{f.stem}"] = f
    return out


MODULES = _modules()


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
        (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, here: str) -> list[tuple[str, list[str], int]]:
    """(module, names imported from it, line) for every import outside TYPE_CHECKING blocks."""
    out: list[tuple[str, list[str], int]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for n in node.orelse:
                visit(n)
            return
        if isinstance(node, ast.Import):
            out.extend((a.name, [], node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = here.split(".")[:-node.level]
                base = ".".join([*parts, base]) if base else ".".join(parts)
            out.append((base, [a.name for a in node.names], node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


def test_the_module_list_is_the_package():
    assert "specparity.harness.run" in MODULES and "specparity.records.served" in MODULES
    assert all(p.is_file() for p in MODULES.values())


def test_no_module_imports_a_private_name_of_another():
    bad = []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text())
        aliases: dict[str, str] = {}  # local name -> specparity module it is bound to
        for mod, names, line in _imports(tree, name):
            if not mod.startswith("specparity"):
                continue
            for n in names:
                if n.startswith("_") and not n.startswith("__"):
                    bad.append(f"{path.relative_to(ROOT)}:{line}: imports {n} from {mod}")
                if f"{mod}.{n}" in MODULES:
                    aliases[n] = f"{mod}.{n}"
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("specparity") and a.asname:
                        aliases[a.asname] = a.name
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("specparity"):
                for a in node.names:
                    if a.asname and f"{node.module}.{a.name}" in MODULES:
                        aliases[a.asname] = f"{node.module}.{a.name}"
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id in aliases and aliases[node.value.id] != name \
                    and node.attr.startswith("_") and not node.attr.startswith("__"):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: uses {aliases[node.value.id]}.{node.attr}")
    assert not bad, "\n".join(bad)


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for name, path in MODULES.items():
        for mod, names, _ in _imports(ast.parse(path.read_text()), name):
            targets = [f"{mod}.{n}" for n in names if f"{mod}.{n}" in MODULES]
            if mod in MODULES and len(targets) < len(names or [None]):
                targets.append(mod)
            graph[name] |= {t for t in targets if t != name}
    return graph


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


def test_no_import_cycle_even_through_lazy_imports():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_check_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
