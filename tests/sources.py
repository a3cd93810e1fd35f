"""The package's source, parsed once per process for the suite's source scans (layout, mlx-lm's private
names, verdict literals): each scan walks every module's tree, and parsing ~150 modules costs about a
CPU second each time. A tree is shared by every scan that asks for the same text: never change one."""

from __future__ import annotations

import ast
import functools
from pathlib import Path


@functools.cache
def parse(source: str) -> ast.Module:
    """``ast.parse(source)``, once per distinct text in this process."""
    return ast.parse(source)


@functools.cache
def _read(path: Path, mtime_ns: int, size: int) -> str:
    return path.read_text()


def read(path: Path) -> str:
    """The text of ``path``, read again only when the file changed (size or modification time)."""
    st = path.stat()
    return _read(path, st.st_mtime_ns, st.st_size)


def tree(path: Path) -> ast.Module:
    """The parsed module at ``path``."""
    return parse(read(path))


@functools.cache
def nodes(module: ast.AST) -> tuple[ast.AST, ...]:
    """Every node of ``module`` in ``ast.walk``'s order, walked once per tree (a scan walks each tree
    several times; ``ast.walk`` itself is most of a scan's time)."""
    return tuple(ast.walk(module))


@functools.cache
def class_sources(path: str) -> dict[str, str]:
    """qualified name -> source text of every class defined in the module file ``path`` (one parse per
    file; what ``inspect.getsource`` gives a class, without its parse of the whole file per class)."""
    text = Path(path).read_text()
    lines = text.splitlines(keepends=True)
    out: dict[str, str] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                name = prefix + child.name
                first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                out.setdefault(name, "".join(lines[first - 1:child.end_lineno]))
                visit(child, name + ".")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, f"{prefix}{child.name}.<locals>.")
            else:
                visit(child, prefix)

    visit(parse(text), "")
    return out
