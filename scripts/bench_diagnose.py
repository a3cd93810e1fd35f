#!/usr/bin/env python3
"""A diagnosis's time over the forwards its steps need, and its peak memory over one copy of the target.

A fault fixture whose verify kernel changes at 4 rows (layer 2's MLP x1.5; at a real model's size, a tie at the
logits that a block breaks the other way), and the finding a served job at width 4 records on it (made from its
reproduction, mlx-lm's speculative path, untimed: no servers); then that finding is diagnosed in this process
(``diagnose_finding``, as ``specparity diagnose`` runs it) with every model call recorded: its model, its rows,
the cache offset it started from. The bare arm loads the same checkpoints and runs exactly those calls as plain
mlx-lm forwards (each from a cache holding that many positions, its logits and cache evaluated), nothing else: no
comparisons, captures, reports. Step 8 (other releases, separate processes) is left out of both: the bench points
the environment cache at an empty folder, so it names the releases as not built.

- diagnose_over_forwards: the diagnosis's wall time / the bare arm's (best of --repeat after a warm-up; goal <= 1.2);
- diagnose_peak_over_target: mlx's peak memory during the diagnosis / the target's weight bytes (goal <= 1.1).
  The finding carries its served rounds and tokens (as a served record's witness gives them), so step 1 replays
  them without the drafter, which is never loaded; ``--no-served-rounds`` drops them (a record without a witness):
  step 1 then reruns the speculative path with the drafter loaded beside the target, and the figure over target
  and drafter is the one that means something.

At ``--size llama-0.5b`` (a 4-bit bfloat16 checkpoint in a real 0.5B model's dimensions, the same fault) the
memory figure means what it says; on the tiny fixture the weights are 1.4 MB and the fixed costs dominate it.

On MLX's CPU backend the 4-bit bfloat16 0.5B takes tens of minutes; ``--dtype float32 --bits none`` is the same
shape unquantized (2 GB of weights), several times faster there.

Usage: .venv/bin/python -P scripts/bench_diagnose.py [--repeat 3] [--warmup 1] [--size tiny|llama-0.5b]
       [--dtype D] [--bits N|none] [--no-served-rounds]
Prints one figure per line, ``name: value unit``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

GOAL, MEMORY_GOAL = 1.2, 1.1
FAULT = {"kind": "rows", "layer": 2, "subop": "mlp", "min_rows": 4, "scale": 1.5}
# a random-weight checkpoint in a real model's dimensions shrugs the x1.5 off; a tie at the logits flips a token
SIZED_FAULT = {"kind": "tie", "min_rows": 2}
PROMPT = list(range(20, 52))


def faulted(home: Path, size: str, dtype: str = "bfloat16", bits: int | None = 4) -> Any:
    """The fault fixture: the tiny llama pair, or a ``build_sized`` checkpoint (``dtype``, ``bits``: 4-bit
    bfloat16 by default) whose target is wrapped in the fault fixture's model_file (its weights linked, its config
    naming the fault)."""
    import json
    import shutil

    from specparity.fixtures import FIXTURE_MODULE, MODELS_DIR, build_pair, build_sized, fixtures_home

    if size == "tiny":
        return build_pair(home / "bench-diagnose", arch="llama", faults=[FAULT])
    info = build_sized(fixtures_home() / "sized" / f"{size}-{dtype}-{bits or 'none'}", size, dtype=dtype, bits=bits)
    target = home / f"{size}-faulted"
    target.mkdir()
    for f in Path(info.target).iterdir():
        if f.name != "config.json":
            (target / f.name).symlink_to(f)
    config = json.loads((Path(info.target) / "config.json").read_text())
    config.update(model_file=FIXTURE_MODULE, specparity={"base": config["model_type"], "faults": [SIZED_FAULT]})
    (target / "config.json").write_text(json.dumps(config))
    shutil.copy(MODELS_DIR / FIXTURE_MODULE, target)
    info.target = str(target)
    return info


def finding_of(info: Any, size: str, home: Path, served_rounds: bool) -> Any:
    """The finding a served job would record at width 4, made from what its reproduction runs: mlx-lm's own
    speculative path on a fresh cache against classic decode (``replay --draft-model``, the command a served
    record prints); the servers' own time is the served benches', not this one's. ``served_rounds``: the
    finding carries that run's rounds and tokens, as a served record's witness and answer give them (step 1
    replays them without the drafter); else none (step 1 reruns the drafter's path)."""
    import json
    import shlex

    from specparity.diagnose.findings import Finding

    command = shlex.join(["specparity", "replay", "--model", info.target, "--trust-remote-code", "--draft-model",
                          info.draft, "--num-draft-tokens", "3", "--max-tokens", "32", "--stop-at-eos",
                          "--prompt-ids", ",".join(map(str, PROMPT))])
    exe = Path(sys.executable).with_name("specparity")
    saved = home / "bench-rounds.jsonl"
    saved.unlink(missing_ok=True)
    proc = subprocess.run([str(exe), *shlex.split(command)[1:], "--save-log", str(saved), "--json", "--quiet"],
                          capture_output=True, text=True)
    at = (json.loads(proc.stdout)["requests"][0] if proc.stdout.strip() else {}).get("served_first_mismatch")
    if at is None:
        raise SystemExit(f"bench_diagnose: the {size} fault fixture's drafted path equals classic decode: nothing to"
                         f" diagnose ({proc.stderr.strip()[-300:]})")
    rounds = json.loads(saved.read_text().splitlines()[0]) if served_rounds else {}
    return Finding(id="bench/w4/p0", pairing="bench", arm="w4", request="p0", width=4, setting=3,
                   target=info.target, draft=info.draft, token_index=int(at), against="classic decode",
                   reason="made by scripts/bench_diagnose.py", reproduction=command,
                   served_accepts=rounds.get("accepts"),
                   served_widths=rounds.get("widths") or ([4] * len(rounds["accepts"]) if rounds else None),
                   served_tokens=rounds.get("tokens"))


class Recorder:
    """Every call of the models it wraps: (model index, rows, the cache offset it started from)."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, int]] = []

    def wrap(self, index: int, model: Any) -> None:
        from specparity.decode import cache_offset

        cls = type(model)
        orig = cls.__call__
        calls = self.calls

        def __call__(self_: Any, inputs: Any, cache: Any = None, **kw: Any) -> Any:
            offsets = [cache_offset(c) for c in cache or []]
            calls.append((index, int(inputs.shape[1]), max([o for o in offsets if o is not None] or [0])))
            return orig(self_, inputs, cache=cache, **kw)

        model.__class__ = type(cls.__name__, (cls,), {"__call__": __call__})


def bare(models: list[Any], calls: list[tuple[int, int, int]]) -> float:
    """The recorded calls as plain forwards, each from a cache holding its offset (built untimed, then trimmed
    to each call's offset: a KV cache's trim is its offset, nothing recomputed); seconds of the forwards."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    total = 0.0
    for index, model in enumerate(models):
        mine = [(rows, off) for i, rows, off in calls if i == index]
        if not mine or model is None:
            continue
        inner = getattr(model, "inner", model)  # a fault fixture's wrapper: its stock model's own cache
        cache = make_prompt_cache(inner)
        top = max(off + rows for rows, off in mine)
        model(mx.array([7] * top, dtype=mx.uint32)[None], cache=cache)
        mx.eval([c.state for c in cache])
        for rows, off in mine:
            for c in cache:
                c.trim(c.offset - off)
            t0 = time.perf_counter()
            logits = model(mx.array([11] * rows, dtype=mx.uint32)[None], cache=cache)
            mx.eval(logits, [c.state for c in cache])
            total += time.perf_counter() - t0
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured runs first (0 at a size where one run is"
                    " minutes and the first run's one-time costs are small beside it)")
    ap.add_argument("--size", default="tiny", help="tiny (the fault fixture) or a build_sized size: llama-0.5b...")
    ap.add_argument("--dtype", default="bfloat16", help="a sized checkpoint's dtype (float32 runs several times"
                    " faster than bfloat16 on MLX's CPU backend)")
    ap.add_argument("--bits", default="4", help="a sized checkpoint's quantization bits, or none")
    ap.add_argument("--no-served-rounds", action="store_true", help="the finding without its served rounds (a"
                    " record without a witness): step 1 reruns the speculative path with the drafter beside the"
                    " target")
    args = ap.parse_args()
    bits = None if args.bits.lower() == "none" else int(args.bits)
    home = Path(os.environ.setdefault("SPECPARITY_HOME", tempfile.mkdtemp(prefix="specparity-bench-")))
    os.environ["SPECPARITY_ENV_CACHE"] = tempfile.mkdtemp(prefix="no-envs-")  # step 8: not built, no processes

    import mlx.core as mx

    from specparity.checkpoint import load_checkpoint
    from specparity.commands.diagnose import read_reproduction
    from specparity.diagnose.tree import Models, diagnose_finding

    class Recorded(Models):
        """Every checkpoint the diagnosis loads itself (the drafter, where step 1 needs it) has its calls recorded as
        the drafter's (model index 1); one preloaded into ``loaded`` is not loaded again."""

        def __init__(self, rec: Recorder) -> None:
            super().__init__()
            self.rec = rec

        def load(self, path: str, trust_remote_code: bool) -> Any:
            new = (path, trust_remote_code) not in self.loaded
            got = super().load(path, trust_remote_code)
            if new:
                self.rec.wrap(1, got.model)
            return got

    info = faulted(home, args.size, args.dtype, bits)
    finding = finding_of(info, args.size, home, not args.no_served_rounds)
    walls, bares, peaks = [], [], []
    diagnosis = None
    drafter_loaded = False
    for i in range(args.warmup + args.repeat):  # the first --warmup are not measured
        rec = Recorder()
        models = Recorded(rec)
        target = load_checkpoint(info.target, trust_remote_code=True)
        models.loaded[(info.target, True)] = target
        rec.wrap(0, target.model)
        if args.no_served_rounds:  # step 1 needs it: loaded beside the target before the clock, as the target is
            draft = load_checkpoint(info.draft, trust_remote_code=True)
            models.loaded[(info.draft, True)] = draft
            rec.wrap(1, draft.model)
        mx.reset_peak_memory()
        t0 = time.perf_counter()
        diagnosis = diagnose_finding(finding, read_reproduction(finding), models)
        wall = time.perf_counter() - t0
        peak = mx.get_peak_memory()
        drafter_loaded = (info.draft, True) in models.loaded
        b = bare([target.model, models.loaded[(info.draft, True)].model if drafter_loaded else None], rec.calls)
        if i >= args.warmup:
            walls.append(wall)
            bares.append(b)
            peaks.append(peak)
    assert diagnosis is not None

    def weights(path: str) -> int:
        return sum(f.stat().st_size for f in Path(path).glob("*.safetensors"))  # stat follows the links

    w, b = min(walls), min(bares)
    print(f"diagnose_phase: {diagnosis.phase} (finding {finding.id}; steps ran:"
          f" {', '.join(str(s.number) for s in diagnosis.steps if s.status == 'ran')})")
    print(f"diagnose_model_calls: {len(rec.calls)} calls ({sum(r for _, r, _ in rec.calls)} rows)")
    print(f"diagnose_wall_time: {w:.3f} s (runs {', '.join(f'{x:.3f}' for x in walls)})")
    print(f"bare_forwards_time: {b:.3f} s (runs {', '.join(f'{x:.3f}' for x in bares)})")
    print(f"diagnose_over_forwards: {w / b:.3f} ratio (goal <= {GOAL}; spread"
          f" {min(walls) / max(bares):.3f}-{max(walls) / min(bares):.3f})")
    tw, dw = weights(info.target), weights(info.draft)
    print(f"target_weights: {tw} bytes; drafter_weights: {dw} bytes")
    print("diagnose_drafter_loaded: " + ("yes (step 1 reran the speculative path with it)" if drafter_loaded else
                                          "no (step 1 replayed the served rounds)")
          + f"; step 1 source: {(diagnosis.step(1).data or {}).get('source')}")
    print(f"diagnose_peak_over_target: {max(peaks) / tw:.3f} ratio (goal <= {MEMORY_GOAL}; "
          + (f"over target and drafter {max(peaks) / (tw + dw):.3f})" if drafter_loaded else
             "the drafter never loaded)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
