"""Per-layer bisection of a block-vs-chain divergence (``specparity bisect``).

    capture.py   wrap the model's layers and sub-ops; record every output
    arms.py      the probe's two arms (chain, block), each run once with capture on
    report.py    compare two arms' captures: first divergent layer, component, sub-op
    run.py       the in-process bisect (arms + report)
    dump.py      captures to safetensors + manifest and back (``bisect dump`` / ``diff``)
    controls.py  rerun in a fresh process per environment; group arms by logits sha256
    chart.py     terminal bars and the record's SVG chart
    render.py    the report as a terminal table and as record markdown

Nothing here imports mlx at import time.

This folder is ``specparity.bisect`` (pyproject.toml maps it). Where the
repository root is on ``sys.path`` (``python -c`` or ``python -m`` run there),
a bare ``import bisect``, as ``random`` and ``tempfile`` do, finds this folder
before the standard library's ``bisect.py``; imported under that name, this
file hands the importer the standard library's module instead (the import
system returns what ``sys.modules`` holds once this body has run).
"""

from __future__ import annotations

from types import ModuleType


def _standard_library() -> ModuleType:
    """The standard library's ``bisect``, found on ``sys.path`` without the folder holding this package."""
    import importlib.machinery
    import importlib.util
    import os
    import sys

    root = os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = [p for p in sys.path if os.path.realpath(p or os.curdir) != root]
    spec = importlib.machinery.PathFinder.find_spec("bisect", path)
    if spec is None or spec.loader is None:
        raise ImportError("the standard library's bisect is not on sys.path", name="bisect")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bisect"] = module
    spec.loader.exec_module(module)
    return module


if __name__ == "bisect":
    _standard_library()
