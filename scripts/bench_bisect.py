"""Bisect overhead against the probe, and the memory its captures hold.

bisect/probe: wall time of ``bisect_model`` (both arms captured once each, every
layer and sub-op compared, report built) divided by the probe's wall time for
the same (model, W, D) cell (``probe_block_vs_chain``). Goal <= 1.5: one pass
per arm, not one rerun per layer.

activation capture bytes: every captured output of both arms, W rows each:
O(layers x rows x hidden) (per layer the output and each sub-op's rows, some
of which are wider than hidden: MLP intermediates, q/k/v; plus W logit rows).
cache snapshot bytes: both arms' caches, O(layers x positions x kv width), the
same size as the caches the probe already holds.
peak extra: mlx's peak memory during bisect minus during the probe.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path


def bench(arch: str, width: int, depth: int, reps: int) -> None:
    import mlx.core as mx

    from specparity.bisect.run import bisect_model
    from specparity.checkpoint import load_checkpoint
    from specparity.fixtures import build_pair
    from specparity.probes.forward.blockchain import probe_block_vs_chain

    home = Path(os.environ["SPECPARITY_HOME"])
    info = build_pair(home / f"bench-{arch}", arch=arch, with_draft=False)
    loaded = load_checkpoint(info.target)
    model = loaded.model
    prompt = list(range(20, 52))
    probe_block_vs_chain(model, [width], [depth], [prompt])  # warm up
    bisect_model(loaded, prompt, width, depth)
    probe_t, bisect_t, peaks = [], [], []
    act_bytes = cache_bytes = 0
    for _ in range(reps):
        mx.reset_peak_memory()
        t = time.perf_counter()
        probe_block_vs_chain(model, [width], [depth], [prompt])
        probe_t.append(time.perf_counter() - t)
        probe_peak = mx.get_peak_memory()
        mx.reset_peak_memory()
        t = time.perf_counter()
        bc, _ = bisect_model(loaded, prompt, width, depth)
        bisect_t.append(time.perf_counter() - t)
        peaks.append(mx.get_peak_memory() - probe_peak)
        act_bytes = sum(a.activation_bytes() for a in bc.arms.values())
        cache_bytes = sum(a.cache_bytes() for a in bc.arms.values())
    p, b = statistics.median(probe_t), statistics.median(bisect_t)
    n_layers = len(model.layers)
    hidden = int(loaded.config.get("hidden_size", 0))
    unit = n_layers * width * hidden * 4  # one float32 row per layer per position
    tag = f"{arch} fixture, {n_layers} layers, hidden {hidden}, W={width}, D={depth}"
    print(f"probe wall time ({tag}): {p * 1e3:.1f} ms")
    print(f"bisect wall time ({tag}): {b * 1e3:.1f} ms")
    print(f"bisect/probe ratio ({arch}): {b / p:.2f} (goal <= 1.5)")
    print(f"activation capture bytes ({arch}): {act_bytes} bytes"
          f" ({act_bytes / unit:.1f} x layers*rows*hidden*4 bytes)")
    print(f"cache snapshot bytes ({arch}): {cache_bytes} bytes")
    print(f"peak extra memory over the probe ({arch}): {statistics.median(peaks)} bytes")


def main() -> None:
    if "SPECPARITY_HOME" not in os.environ:
        os.environ["SPECPARITY_HOME"] = tempfile.mkdtemp(prefix="specparity-bench-")
    bench("llama", width=8, depth=32, reps=5)
    bench("qwen3_5", width=8, depth=32, reps=5)


if __name__ == "__main__":
    main()
