"""Start-up of every Python process the test suite starts: transformers' import table, read from disk.

Importing transformers 5 (which every mlx-lm process does: its tokenizers) reads the source of all
its ~3,300 model files to build the table its lazy modules import from
(``transformers.utils.import_utils.define_import_structure``): about 1 CPU second per process, and the
suite starts hundreds (servers, workers, CLI runs). The table depends only on those files, so this
module computes it once and keeps it in ``$SPECPARITY_TEST_IMPORT_TABLES``, keyed by the path asked
for, the prefix, and the size and modification time of every ``.py`` file under it and of
``import_utils.py`` itself (a reinstall or an edit makes a new key). A process gets exactly the table
transformers would have computed; nothing else of transformers or mlx-lm changes.

Active only where the conftest sets ``$SPECPARITY_TEST_IMPORT_TABLES`` and puts this folder on
``PYTHONPATH``; a ``sitecustomize`` later on the path (a distribution's) still runs. There it also hides
``trio``, which only the test extras install (:data:`HIDDEN`).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import os
import sys
from typing import Any

_MODULE = "transformers.utils.import_utils"
_TABLES = os.environ.get("SPECPARITY_TEST_IMPORT_TABLES")


@functools.lru_cache
def _tree_stat(path: str) -> tuple[tuple[str, int, int], ...]:
    """(relative path, size, mtime_ns) of every ``.py`` file under ``path``, sorted."""
    out: list[tuple[str, int, int]] = []
    stack = [""]  # folders relative to ``path`` (joined by hand: os.path.relpath per file was most of the cost)
    while stack:
        top = stack.pop()
        with os.scandir(os.path.join(path, top)) as it:
            for e in it:
                if e.is_dir(follow_symlinks=False):
                    if e.name != "__pycache__":
                        stack.append(os.path.join(top, e.name))
                elif e.name.endswith(".py"):
                    st = e.stat()
                    out.append((os.path.join(top, e.name), st.st_size, st.st_mtime_ns))
    return tuple(sorted(out))


def _cached(original: Any, source: str, tables: str) -> Any:
    import hashlib
    import pickle

    src = os.stat(source)

    @functools.lru_cache
    def define_import_structure(module_path: Any, prefix: str | None = None) -> Any:
        folder = str(module_path)
        if not os.path.isdir(folder):
            folder = os.path.dirname(folder)
        try:
            key = hashlib.sha256(repr((str(module_path), prefix, source, src.st_size, src.st_mtime_ns,
                                       _tree_stat(folder))).encode()).hexdigest()
        except OSError:  # a folder it cannot list: transformers builds the table as it would
            return original(module_path, prefix)
        path = os.path.join(tables, key + ".pickle")
        try:
            with open(path, "rb") as f:
                return pickle.load(f)
        except Exception:  # none yet, or unreadable: build it again
            pass
        table = original(module_path, prefix)
        try:
            os.makedirs(tables, exist_ok=True)
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "wb") as f:
                pickle.dump(table, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, path)  # whole, or not there: processes write it side by side
        except OSError:
            pass
        return table

    return define_import_structure


class _Finder(importlib.abc.MetaPathFinder):
    """Finds transformers' import_utils as usual, and swaps in the cached table once it has run."""

    def __init__(self, tables: str):
        self.tables = tables

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != _MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        loader: Any = spec.loader if spec is not None else None
        origin = spec.origin if spec is not None else None
        if origin is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module
        tables = self.tables

        def run(module: Any) -> None:
            exec_module(module)
            original = getattr(module, "define_import_structure", None)
            if callable(original):
                module.define_import_structure = _cached(original, origin, tables)

        loader.exec_module = run
        return spec


def _chain() -> None:
    """Run the next ``sitecustomize`` on the path, as Python would have without this one."""
    here = os.path.dirname(os.path.abspath(__file__))
    saved = sys.path[:]
    mine = sys.modules.pop(__name__, None)
    try:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
        try:
            import sitecustomize  # noqa: F401  (the next one, if any)
        except ImportError:
            pass
    finally:
        sys.path[:] = saved
        if mine is not None:
            sys.modules[__name__] = mine


# Only the test extras install trio (selenium's dependency: the HTML report's browser test, which does not
# import it); httpcore2, under huggingface_hub, imports it whenever it is installed, in every mlx-lm process
# (about 0.1 CPU second with attrs, more on a loaded machine). A user's install has no trio and no process
# the suite starts uses it: here, as there, it is absent (httpcore2 then runs on asyncio, as it does there).
# Hypothesis loads its plugins at import, and the only one installed is trio's: none is loaded either.
HIDDEN = ("trio",)

if _TABLES:
    sys.meta_path.insert(0, _Finder(_TABLES))
    for _name in HIDDEN:  # None in sys.modules: importing it raises ModuleNotFoundError
        sys.modules.setdefault(_name, None)  # type: ignore[arg-type]
    os.environ.setdefault("HYPOTHESIS_NO_PLUGINS", "1")
_chain()
