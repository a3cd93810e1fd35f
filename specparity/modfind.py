"""Whether a module can be imported, found without importing it or the packages above it.

``importlib.util.find_spec("a.b")`` imports ``a`` first: for a profile's ``requires_module: mlx_vlm.server``
that is mlx-vlm's whole package (mlx, transformers and their kind: 1.3 s of every served job that asks).
Here the top package is only found, and each submodule looked for in its parent's search locations, nothing
run. Where that finds nothing (a package that builds its ``__path__`` as it imports, a finder of its own) the
answer is find_spec's, importing as it does.

Standard library only: an environment's interpreter runs this file as a script
(``python -P modfind.py MODULE``: exit 0 when found, 1 when not).
"""

from __future__ import annotations

import sys
from importlib.machinery import PathFinder
from importlib.util import find_spec


def found(module: str) -> bool:
    """``module`` can be imported in this interpreter (a missing parent package is a missing module)."""
    parts = module.split(".")
    try:
        spec = find_spec(parts[0])
        for i in range(1, len(parts)):
            if spec is None:
                return False  # no such top package
            if spec.submodule_search_locations is None:
                break  # a module, not a package
            spec = PathFinder.find_spec(".".join(parts[:i + 1]), list(spec.submodule_search_locations))
            if spec is None:
                break
        else:
            return spec is not None
        # not found on the parents' paths: a module that sets its submodules as it runs (os.path), a package that
        # builds its __path__ as it imports, or none at all: find_spec's answer, importing the parents
        return find_spec(module) is not None
    except (ImportError, ValueError):
        return False


if __name__ == "__main__":
    sys.exit(0 if found(sys.argv[1]) else 1)
