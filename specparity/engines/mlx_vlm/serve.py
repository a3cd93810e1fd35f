"""``mlx_vlm.server`` as the ``mlx-vlm`` profile starts it: the target named ``specparity-target`` in the server's
working directory (a symbolic link to it), then mlx-vlm's own ``python -m mlx_vlm.server`` with the rest of argv.

Why: its server answers a chat request only for the model its ``model`` field names, compared as the string it was
started with (another string is loaded anew, from the Hugging Face hub where it is no local path), and a profile's
request fields are fixed strings: every request names ``specparity-target``, the name the server was started with.
Nothing else changes: the server is mlx-vlm's, unpatched.

    python -P -m specparity.engines.mlx_vlm.serve TARGET [mlx_vlm.server options...]
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

NAME = "specparity-target"


def main(argv: list[str]) -> None:
    target, rest = Path(argv[0]).resolve(), argv[1:]
    link = Path(NAME)
    if link.is_symlink() or link.exists():
        link.unlink()
    os.symlink(target, link)
    sys.argv = ["mlx_vlm.server", "--model", NAME, *rest]
    runpy.run_module("mlx_vlm.server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
