"""The layers of the package, lowest first: a module imports only from its own layer or a lower one.

This tuple is the one place the order is written down; ``tests/core/test_layout.py``
reads it and fails on an import that points up (lazy imports inside functions
and ``TYPE_CHECKING`` imports included: a type is a dependency too) and on any
import cycle between modules.

    core       specparity's own top-level modules: errors, verdicts, checkpoint
               loading, classic decode (decode.py) and the served reference
               (reference.py), comparison, fixtures, environments, file names
               (paths.slugify), progress; and the engine registry's own package
               (specparity/engines/__init__.py), which everything above may ask
               for an engine and which reaches an engine's module by name only
    probes     block vs chain, prefill, replay, gate, e2e, sampling
               (specparity.probes, the root probes/ folder)
    bisect     per-layer capture of a probe's two arms (specparity.bisect)
    harness    the served job: profiles, lifecycle, runner, judge
               (specparity.harness)
    engines    one package per engine (specparity/engines/<name>/): its in-process
               adapter and served hooks, built on probes and harness
    records    record layouts, readers, compare, merge, JUnit (specparity.records)
    diagnose   a served record's findings taken through probes and bisect to a
               located cause (specparity.diagnose)
    commands   the click commands, and the CLI group that holds them

A prefix names a module and every module under it (``specparity.probes``); one
ending in ``.*`` names only the modules under it (``specparity.engines.*``: the
engines, not their registry). A module belongs to the layer of the longest
prefix that names it (``specparity.cli`` is in commands, ``specparity.errors``
in core).
"""

from __future__ import annotations

# (layer, the module prefixes it holds), lowest first
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("core", ("specparity",)),
    ("probes", ("specparity.probes",)),
    ("bisect", ("specparity.bisect",)),
    ("harness", ("specparity.harness",)),
    ("engines", ("specparity.engines.*",)),
    ("records", ("specparity.records",)),
    ("diagnose", ("specparity.diagnose",)),
    ("commands", ("specparity.commands", "specparity.cli")),
)


def layer_of(module: str, layers: tuple[tuple[str, tuple[str, ...]], ...] = LAYERS) -> int | None:
    """The index in ``layers`` of ``module``'s layer (None: no layer names it, not ours)."""
    best: tuple[int, int] | None = None  # (prefix length, layer index)
    for i, (_, prefixes) in enumerate(layers):
        for p in prefixes:
            under = p.endswith(".*")
            base = p[:-2] if under else p
            if ((module == base and not under) or module.startswith(base + ".")) and (best is None or len(p) > best[0]):
                best = (len(p), i)
    return best[1] if best is not None else None
