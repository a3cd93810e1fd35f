"""Probe overhead, gate-hit latency and --help latency, measured in one run.

probe/bare: probe wall time for one (W, D) cell divided by the time of the bare
forward passes it must run (prefill + D steps + W chain steps + one W-row
block) on the same model in the same process. Goal <= 1.2.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def bare_forwards(model, prompt, depth, width):
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    model(mx.array(prompt[:-1])[None], cache=cache)
    mx.eval([c.state for c in cache])
    y = prompt[-1]
    toks = []
    for _ in range(depth + width):
        logits = model(mx.array([[y]]), cache=cache)
        y = int(mx.argmax(logits[0, -1]))
        toks.append(y)
    for c in cache:
        c.trim(width)
    out = model(mx.array(toks[-width:])[None], cache=cache)
    mx.eval(out)


def main() -> None:
    os.environ.setdefault("SPECPARITY_HOME", tempfile.mkdtemp(prefix="specparity-bench-"))
    from specparity.checkpoint import load_checkpoint
    from specparity.fixtures import build_pair
    from specparity.probes.forward.blockchain import probe_block_vs_chain
    from specparity.probes.gate import gate_check

    home = Path(os.environ["SPECPARITY_HOME"])
    info = build_pair(home / "bench-llama", arch="llama", with_draft=False)
    model = load_checkpoint(info.target).model
    prompt = list(range(20, 52))
    W, D, reps = 8, 32, 7
    probe_t, bare_t = [], []
    bare_forwards(model, prompt, D, W)  # warm up
    for _ in range(reps):
        t = time.perf_counter()
        bare_forwards(model, prompt, D, W)
        bare_t.append(time.perf_counter() - t)
        t = time.perf_counter()
        probe_block_vs_chain(model, [W], [D], [prompt])
        probe_t.append(time.perf_counter() - t)
    p, b = statistics.median(probe_t), statistics.median(bare_t)
    print(f"probe wall time (W={W}, D={D}, 6-layer llama fixture): {p * 1e3:.1f} ms")
    print(f"bare forwards it needs: {b * 1e3:.1f} ms")
    print(f"probe/bare ratio: {p / b:.2f} (goal <= 1.2)")

    gate_check(info.target, W, depths=(0,), walk=0)  # fill the store
    hits = []
    for _ in range(50):
        t = time.perf_counter()
        d = gate_check(info.target, W, depths=(0,), walk=0)
        hits.append(time.perf_counter() - t)
        assert d.hit
    print(f"gate hit wall time in process: {statistics.median(hits) * 1e3:.2f} ms median"
          f" (goal < 5 ms)")

    exe = str(Path(sys.executable).parent / "specparity")
    helps = []
    for _ in range(5):
        t = time.perf_counter()
        subprocess.run([exe, "--help"], capture_output=True, check=True)
        helps.append(time.perf_counter() - t)
    print(f"specparity --help wall time: {statistics.median(helps) * 1e3:.0f} ms median")


if __name__ == "__main__":
    main()
