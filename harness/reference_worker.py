"""The classic reference's worker process: ``python -m specparity.harness.reference_worker``.

harness.oracle starts it with the servers' own interpreter (a pinned environment's mlx-lm
judges that environment's servers); it holds one :class:`ClassicReference` and answers one
JSON line per request line (see :func:`worker`). Cold answers run mlx_lm.server's loop as
:mod:`specparity.mlx_server` rebuilds it (the sequence replay's loop too).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from specparity.errors import SpecparityError, UsageError, first_line
from specparity.harness.memory import own_peak_rss, reset_peak_rss, rss
from specparity.mlx_server import ServerSettings
from specparity.reference import ClassicReference


def worker(argv: list[str] | None = None) -> int:
    """``python -m specparity.harness.reference_worker CHECKPOINT [--trust-remote-code] [--settings JSON]
    [--sequential] [--wait-load]``.

    ``--wait-load``: import mlx-lm and wait, holding no weights, for one line (any) on stdin before
    loading (the harness starts it beside a server, so its imports overlap the server's start-up).
    Loads the checkpoint once, prints ``{"ready": true, "load_seconds": s}``, then answers
    one JSON line per request line on stdin: ``{"endpoint", "body", "settings"?,
    "server_prompt_tokens"?, "server_prompt_ids"?, "prompt_ids"?}`` -> ``{"ok": true,
    "completion": {...}}`` or ``{"ok": false, "message": "...", "kind": "usage" | "infra"}``;
    ``{"cold": true, "endpoint", "body", "settings"?, "draft_model"?, "prompt_ids"?}`` ->
    ``{"ok": true, "cold": {...ColdAnswer}}``; ``{"cost": true}`` -> ``{"ok": true, "cost":
    {...}, "peak_rss_bytes": n}`` (its own peak resident memory since it last loaded);
    ``{"unload": true}`` -> ``{"ok": true, "unloaded": true, "rss_bytes": n}``: the checkpoint dropped and
    its memory given back (what it then holds, imports only, is ``n``), waiting as ``--wait-load`` does
    for ``{"load": true}``. It exits at end of input (its parent's end). The harness
    runs it with the servers' interpreter (harness.oracle), so a server in a pinned
    environment (another mlx-lm) is judged by that environment's classic decode.
    """
    p = argparse.ArgumentParser(prog="specparity.harness.reference_worker")
    p.add_argument("checkpoint")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--settings", default="{}")
    p.add_argument("--sequential", action="store_true")
    p.add_argument("--wait-load", action="store_true")
    args = p.parse_args(argv)
    out = sys.stdout

    def say(obj: dict[str, Any]) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    ref: ClassicReference | None = None

    def load() -> bool:
        nonlocal ref
        try:
            ref = ClassicReference(args.checkpoint, trust_remote_code=args.trust_remote_code,
                                   settings=ServerSettings.from_dict(json.loads(args.settings)),
                                   batches=not args.sequential)
        except SpecparityError as err:
            say({"ready": False, "message": first_line(str(err))})
            return False
        say({"ready": True, "load_seconds": ref.cost().load_seconds})
        return True

    if args.wait_load:
        # started beside a server: import what a load needs (most of a worker's start-up), hold no weights,
        # and load only when told (the server is gone by then); end of input before that: exit
        import mlx_lm.utils  # noqa: F401
    elif not load():
        return 1
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            if ref is None or req.get("load"):  # waiting (--wait-load, or unloaded): any line loads
                if ref is None and not load():
                    return 1
                if req.get("load"):
                    continue
            assert ref is not None
            if req.get("unload"):
                ref = None
                say({"ok": True, "unloaded": True, "rss_bytes": drop_weights()})
                continue
            if req.get("cost"):
                say({"ok": True, "cost": ref.cost().to_dict(), "peak_rss_bytes": own_peak_rss()})
                continue
            settings = ServerSettings.from_dict(req["settings"]) if req.get("settings") else None
            if req.get("cold"):
                cold = ref.cold(req["endpoint"], req["body"], settings, draft_model=req.get("draft_model"),
                                prompt_ids=req.get("prompt_ids"))
                say({"ok": True, "cold": cold.to_dict()})
                continue
            rc = ref.complete(req["endpoint"], req["body"], server_prompt_ids=req.get("server_prompt_ids"),
                              server_prompt_tokens=req.get("server_prompt_tokens"),
                              prompt_ids=req.get("prompt_ids"), settings=settings)
            say({"ok": True, "completion": rc.to_dict()})
        except SpecparityError as err:
            say({"ok": False, "message": first_line(str(err)),
                 "kind": "usage" if isinstance(err, UsageError) else "infra"})
        except (ValueError, KeyError, TypeError, AttributeError, ImportError) as err:
            # AttributeError / ImportError: another mlx-lm (a pinned environment) without a part a loop uses
            say({"ok": False, "message": f"{type(err).__name__}: {first_line(str(err))}", "kind": "usage"})
    return 0


def drop_weights() -> int:
    """Give back what the dropped checkpoint held (MLX's buffer cache, the C heap's free pages) and start
    this process's peak anew; returns its resident bytes now."""
    import ctypes
    import gc

    import mlx.core as mx

    gc.collect()
    (getattr(mx, "clear_cache", None) or mx.metal.clear_cache)()
    try:  # glibc keeps freed heap pages unless asked: 119 MB instead of 87 after a 0.5B float32 target
        ctypes.CDLL(None).malloc_trim(0)
    except (AttributeError, OSError):
        pass  # not glibc (macOS's allocator returns large blocks as they are freed)
    reset_peak_rss()
    return rss([os.getpid()]).get(os.getpid(), 0)


def main() -> None:
    """Run :func:`worker` and exit without the interpreter's teardown: its answers are flushed, and the harness
    waits for this process to be gone before a server loads the target, and the teardown frees the model array by
    array (from the end of input to the process gone: 0.28 s with it, 0.14 s without, on a 0.5B float32 target)."""
    code = worker()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
