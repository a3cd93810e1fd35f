#!/usr/bin/env python3
"""Every engine's in-process checks over the forwards they need, and its served job over its servers' own time.

Nothing here names an engine: the engines are the registry's (the default engine, mlx-lm, has
benches of its own: bench_probe, bench_replay, bench_served), each on its default fixture.

(a) In process, in the engine's pinned environment, two checks where the engine has the parts:

- ``e2e`` (an engine with its own loops, ``EngineSpec.loops``): what ``specparity e2e --engine NAME``
  runs (each of the engine's own loops, on the pair its own loaders loaded once, against classic
  decode, judged and tie-labelled; classic decode is mlx-lm's ``stream_generate`` once per distinct
  prompt, which is also the command's classic arm). What it needs: the same loops function run bare
  (``BareClassic``: the target loaded once by mlx-lm and the toolkit's greedy chain, ``advance_to_depth``,
  of as many tokens on each distinct prompt, without ``stream_generate``'s own costs). Everything else
  (the command's checkpoint load and fingerprint, the spy, judging) is the check's overhead.
- ``probe`` (an engine with an in-process adapter): what ``probe --engine NAME`` and ``replay --engine
  NAME`` run (block vs chain and every rollback per width from copies of classic decode's state, the
  engine's prefill, its own loop recorded round by round and walked against classic decode): the
  forwards they need are timed where they happen (the session's prefill, verify and rollback, every
  classic step), plus the engine's own loop run bare (the adapter's ``loop``: nothing recorded) on the
  same prompts. A classic forward counts once per command (``Timers.wrap_forwards(distinct=True)``): one
  that decodes a token history the same command already decoded (``replay --engine``'s accept-vector
  replay walks the classic chain its walk of the engine's run walked) is timed apart and printed
  (``_probe_repeats``), not counted as needed; the reproducibility bracket's repeat is deliberate and
  counts. ``_probe_parts`` splits the median run.

The arms are interleaved (``--repeat`` paired runs after a warm-up, the order alternating); the figure
is the median ratio with its distribution-free 95% confidence interval (scripts/benchstats.py).
Goal: <= 1.2.

(b) A served job per engine whose package holds a served profile (``EngineSpec.profile_files``): that
profile's server from its environment, on the engine's default fixture, the target-only baseline and
two widths, the default request sequence, the built-in prompts: the job's wall time / its servers'
own start-up + generation. Median of ``--served-runs`` and the spread. Goal: <= 1.15.

An engine whose environment is not built prints one ``skipped`` line (``scripts/build-env NAME``
builds it) and the bench goes on; nothing is built here. An engine whose draft heads live in its
target and whose loops cannot run here prints ``not applicable``.

Usage: .venv/bin/python -P scripts/bench_engines.py [--engines NAME,NAME] [--repeat 15] [--max-tokens 32]
       [--prompts 2] [--served-runs 3] [--no-served] [--no-in-process] [--profile DIR]
Prints one figure per line, ``name: value unit``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run with -P: the shared helpers beside it
from benchstats import Timers, interleaved, ratio_line, served_runs  # noqa: E402

GOAL_CHECKS = 1.2
GOAL_SERVED = 1.15
CHILD = "SPECPARITY_BENCH_ENGINES_CHILD"


def engines() -> list[str]:
    """The engines this bench measures: every registered one but the default (its own benches) with its own
    loops, an in-process adapter or a packaged served profile."""
    from specparity.engines import DEFAULT, registry

    return [n for n, s in registry().items()
            if n != DEFAULT and (s.loops is not None or s.in_process or s.profiles)]


def pair(engine: str) -> tuple[str, str] | None:
    """The engine's default (target, drafter): its own default fixture, else the embedded pair (what ``--model``
    defaults to); a target whose heads draft is its own drafter; None where its default has no drafter."""
    from specparity.engines import get

    spec = get(engine)
    found = spec.checkpoints()  # built once (a format's default fixture: its build the first time)
    if found is None:
        from specparity.fixtures import default_pair

        info = default_pair()
        return (info.target, info.draft) if info.draft else None
    drafting = spec.drafting_pair(*found)
    return (str(drafting[0]), str(drafting[1])) if drafting is not None else None


def label(engine: str) -> str:
    return "engines_" + engine.replace("-", "_")


# --- (a) in process, in the engine's environment -------------------------------------------------------------


class BareClassic:
    """Classic decode as the bare arm needs it: the target loaded once by mlx-lm, each distinct prompt's tokens
    by the toolkit's greedy chain (no ``stream_generate``), as a loops function asks its classic reference."""

    def __init__(self, target: str, n: int):
        from types import SimpleNamespace

        import mlx_lm

        self.model, tok = mlx_lm.load(target)[:2]
        self.loaded = SimpleNamespace(model=self.model, tokenizer=tok)  # as Classic.loaded (a loop may read it)
        self.n = n
        self.eos = {int(e) for e in getattr(tok, "eos_token_ids", None) or []}
        self._done: dict[tuple[int, ...], list[int]] = {}

    def tokens(self, prompt: list[int]) -> list[int]:
        from specparity.decode import advance_to_depth

        key = tuple(prompt)
        if key not in self._done:
            self._done[key] = advance_to_depth(self.model, list(prompt), self.n)[2]
        return self._done[key]


def bare_loops(engine: str, target: str, draft: str, prompt: list[int], n: int) -> Callable[[], None]:
    """What ``e2e --engine NAME`` needs, bare: the engine's own loops function (one load, every entry point's
    loop) with :class:`BareClassic` as its classic reference."""
    from specparity.engines import get, resolve

    spec = get(engine)
    loops = resolve(spec.loops)
    entries = tuple(spec.e2e_entry_points)

    def run() -> None:
        loops(target, draft, list(prompt), n, BareClassic(target, n), entries)
    return run


def e2e_check(engine: str, target: str, draft: str, prompt: list[int], n: int) -> Callable[[], Any]:
    """``e2e --engine NAME``'s library call, as the command makes it."""
    from specparity.commands._common import resolve_model
    from specparity.engines import get
    from specparity.probes.engine_e2e import OwnLoopEngine, run_own_loops_e2e

    entries = list(get(engine).e2e_entry_points)

    def run() -> Any:
        eng = OwnLoopEngine(engine, Path(target), Path(draft))
        loaded = resolve_model(target, False)
        return run_own_loops_e2e(eng, loaded, list(prompt), n, entries)
    return run


def adapter(engine: str, target: str, draft: str) -> tuple[Any, type, Callable[[list[int], int], None]]:
    """The engine's in-process adapter, its session class and its own loop run bare (nothing recorded)."""
    from specparity.engines import LoadRequest, get

    eng = get(engine).load(LoadRequest(Path(target), Path(draft)))
    return eng, type(eng.session()), eng.loop


def figure(name: str, ratios: list[float], what: str, prof: Any, folder: str | None) -> None:
    """The ratio line of one check, and its profile (then cleared for the next check) where asked."""
    print(ratio_line(f"{name}_ratio", ratios, GOAL_CHECKS, what))
    if prof is not None and folder:
        path = Path(folder) / f"{name}.prof"
        prof.dump_stats(path)
        print(f"{name}_profile: {path}")
        prof.clear()


def in_process(engine: str, args: argparse.Namespace) -> None:
    """Both figures of one engine, here (its module imports)."""
    from specparity.engines import get

    spec = get(engine)
    checkpoints = pair(engine)
    if checkpoints is None or not spec.drafter_checkpoint:
        print(f"{label(engine)}: not applicable (its default fixture has no drafter checkpoint)")
        return
    target, draft = checkpoints
    n = args.max_tokens
    prof = None
    if args.profile:
        import cProfile

        prof = cProfile.Profile()

    def profiled(fn: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            if prof is not None:
                prof.enable()
            try:
                return fn()
            finally:
                if prof is not None:
                    prof.disable()
        return run

    from mlx_lm.utils import load_tokenizer

    from specparity.prompts import encode_prompts

    prompts = encode_prompts(load_tokenizer(Path(target)), None, None)  # the built-in prompts, as the check takes
    prompt = prompts[0]

    lab = label(engine)
    if get(engine).loops is None:
        print(f"{lab}_e2e_ratio: not applicable ({engine} declares no loops of its own: its e2e runs its entry"
              " points, not measured here)")
    else:
        e2e_figure(engine, target, draft, prompt, n, args, profiled, prof)
    if not get(engine).in_process:
        print(f"{lab}_probe_ratio: not applicable ({engine} exposes its loops only, no verify or rollback to drive)")
        return
    probe_figure(engine, target, draft, prompts, n, args, profiled, prof)


def timed(fn: Callable[[], Any]) -> Callable[[], float]:
    def run() -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    return run


def e2e_figure(engine: str, target: str, draft: str, prompt: list[int], n: int, args: argparse.Namespace,
               profiled: Callable[[Callable[[], Any]], Callable[[], Any]], prof: Any) -> None:
    """The e2e check's wall time over the bare arm's, paired."""
    from specparity.engines import get

    check, bare = profiled(e2e_check(engine, target, draft, prompt, n)), bare_loops(engine, target, draft, prompt, n)
    check()  # warm-up: kernels, imports
    bare()
    runs = interleaved([timed(check), timed(bare)], args.repeat)
    ratios = [c / b for c, b in runs]
    mid = sorted(runs, key=lambda r: r[0] / r[1])[len(runs) // 2]
    lab = label(engine)
    print(f"{lab}_e2e_wall: {mid[0]:.2f} s check, {mid[1]:.2f} s its loads + loops + classic decode bare"
          f" (the median run; 1 prompt of {len(prompt)} ids, {n} tokens, entry points"
          f" {', '.join(get(engine).e2e_entry_points)})")
    figure(f"{lab}_e2e", ratios, "e2e --engine check / what it needs", prof, args.profile)


def probe_figure(engine: str, target: str, draft: str, prompts: list[list[int]], n: int, args: argparse.Namespace,
                 profiled: Callable[[Callable[[], Any]], Callable[[], Any]], prof: Any) -> None:
    """The probe + replay checks' wall time over the forwards they need and the engine's bare loop, paired."""
    from specparity.probes.forward.engine import probe_engine
    from specparity.probes.replay.engine import check_engine_run

    lab = label(engine)
    eng, session_cls, loop = adapter(engine, target, draft)
    probe_prompts = prompts[: args.prompts]
    timers = Timers()

    import specparity.probes.forward.blockchain as blockchain

    recorded = [0.0]  # the engine's own loop as the check runs it (recorded round by round)

    def probe_run() -> tuple[float, float, int, float, int, float]:
        recorded[0] = 0.0
        timers.seconds, timers.calls, timers.repeated, timers.repeats = 0.0, 0, 0.0, 0
        timers.wrap_forwards(session_cls, distinct=True)
        timers.exempt(blockchain, "repeat_chain")  # the reproducibility bracket repeats on purpose
        t0 = time.perf_counter()
        try:
            timers.new_check()
            probe_engine(eng, eng.info.widths, [0, 8], probe_prompts)
            timers.new_check()  # replay --engine: a command of its own, its own classic decode
            for p in probe_prompts:
                t1 = time.perf_counter()
                got = eng.generate(p, n)
                recorded[0] += time.perf_counter() - t1
                check_engine_run(eng, got)
        finally:
            timers.undo()
        return (time.perf_counter() - t0, timers.seconds, timers.calls, timers.repeated, timers.repeats,
                recorded[0])

    def loop_run() -> tuple[float, float, int, float, int, float]:
        t0 = time.perf_counter()
        for p in probe_prompts:
            loop(p, n)
        return time.perf_counter() - t0, 0.0, 0, 0.0, 0, 0.0

    probe_prof = profiled(probe_run)
    probe_prof()  # warm-up
    loop_run()
    runs2 = interleaved([probe_prof, loop_run], args.repeat)
    ratios = [c[0] / (c[1] + b[0]) for c, b in runs2]
    counting_repeats = [c[0] / (c[1] + c[3] + b[0]) for c, b in runs2]
    c, b = sorted(runs2, key=lambda r: r[0][0] / (r[0][1] + r[1][0]))[len(runs2) // 2]
    print(f"{lab}_probe_wall: {c[0]:.2f} s checks, {c[1] + b[0]:.2f} s forwards ({c[2]} engine and classic"
          f" forwards timed in the checks + the engine's own loop bare; the median run; {len(probe_prompts)}"
          f" prompts, {n} tokens, widths {eng.info.widths} depths 0,8 with every rollback)")
    print(f"{lab}_probe_repeats: {c[4]} classic forwards ({c[3]:.2f} s) decoded a token history the same check"
          f" had already decoded (replay --engine's accept-vector replay re-decodes the classic chain its walk of"
          f" the engine's run decoded): timed, not counted as needed; counting them,"
          f" {statistics.median(counting_repeats):.3f} x median")
    rest = c[0] - c[1] - c[3] - c[5]
    print(f"{lab}_probe_parts: of the median run's {c[0]:.2f} s, forwards needed {c[1]:.2f} s, repeated"
          f" {c[3]:.2f} s, the engine's own loop recorded {c[5]:.2f} s (bare {b[0]:.2f} s), the rest {rest:.2f} s"
          f" (copies, snapshots, comparisons, picks, Python)")
    figure(f"{lab}_probe", ratios, "probe + replay checks / the forwards they need", prof, args.profile)


def run_engine(engine: str, args: argparse.Namespace, argv: list[str]) -> None:
    """One engine's in-process figures: here if its module imports, else re-run in its built environment."""
    from specparity.engines import get

    spec = get(engine)
    if spec.loops is None and not spec.in_process:
        return  # served only: its figure is (b)'s
    # here only where this is its environment (the re-run) or it has none: an engine that names no module to
    # import (mlx-lm-broomva: a fork of mlx_lm) "imports" anywhere, and ran here on plain mlx-lm, every entry an error
    if spec.importable() and (os.environ.get(CHILD) or spec.environment is None):
        in_process(engine, args)
        return
    if os.environ.get(CHILD):
        print(f"{label(engine)}: skipped ({spec.module} does not import in its environment)")
        return
    from specparity.environments import find_environment

    pinned = spec.environment
    env = find_environment(pinned.name) if pinned is not None else None
    if env is None:
        name = pinned.name if pinned is not None else engine
        print(f"{label(engine)}: skipped (environment {name} is not built: scripts/build-env {name})", flush=True)
        return
    from specparity.tied import run_tied

    code = run_tied([str(env.python), "-P", __file__, *argv, "--engines", engine, "--no-served"],
                    f"bench_engines in {pinned.name if pinned else engine}'s environment",
                    env={**env.environ(), CHILD: engine})
    if code:
        print(f"{label(engine)}: the run in its environment exited {code}", flush=True)


# --- (b) a served job per engine with a packaged profile ------------------------------------------------------


def served(engine: str, args: argparse.Namespace) -> None:
    from specparity.engines import get
    from specparity.environments import find_environment
    from specparity.harness.config import Job, Pairing
    from specparity.prompts import DEFAULT_PROMPTS

    spec = get(engine)
    lab = f"engines_served_{label(engine).removeprefix('engines_')}"
    profiles = list(spec.profile_files())
    if not profiles:
        return
    pinned = spec.environment
    if pinned is not None and find_environment(pinned.name) is None:
        print(f"{lab}: skipped (environment {pinned.name} is not built: scripts/build-env {pinned.name})")
        return
    checkpoints = pair(engine)
    if checkpoints is None:
        print(f"{lab}: not applicable (its default fixture has no drafter checkpoint)")
        return
    target, draft = checkpoints
    widths = [int(w) for w in args.served_widths.split(",")]
    limit = spec.served_hooks().max_width(draft)  # an engine that verifies fewer rows: its widest, never skipped
    if limit is not None and limit >= 2:
        widths = sorted({min(w, limit) for w in widths})
    job = Job(pairings=[Pairing("bench", target, draft, profiles[0])], widths=widths, max_tokens=args.max_tokens,
              prompts=list(DEFAULT_PROMPTS))
    with tempfile.TemporaryDirectory() as work:
        walls, servers, refs, arms = served_runs(job, args.served_runs, work, lab)
    if not all(servers):  # nothing started and generated: no servers' own time to divide by
        why = sorted({f"{a.name}: {a.reason}" for a in arms if a.verdict == "error"})[:2]
        print(f"{lab}: not measured (its servers did not start and generate: {'; '.join(why) or 'no time'})")
        return
    ratios = [w / o for w, o in zip(walls, servers, strict=True)]
    med = statistics.median(ratios)
    if max(ratios) <= GOAL_SERVED:
        verdict = "met (every run)"
    elif min(ratios) > GOAL_SERVED:
        verdict = "missed (every run)"
    else:
        verdict = f"median {'within' if med <= GOAL_SERVED else 'over'}, the runs on both sides"
    print(f"{lab}_arms: {len(arms)} servers, {sum(len(a.requests) for a in arms)} requests"
          f" per run, {args.served_runs} runs (profile {profiles[0]}, pair {Path(target).parent.name})")
    print(f"{lab}_job_wall: {statistics.median(walls):.2f} s median"
          f" ({min(walls):.2f}-{max(walls):.2f}); servers' own {statistics.median(servers):.2f} s median")
    print(f"{lab}_ratio: {med:.3f} x median, {min(ratios):.3f}-{max(ratios):.3f} over"
          f" {args.served_runs} runs (job wall / servers' start-up + generation); goal <= {GOAL_SERVED}: {verdict}")
    rest = [(w - r) / o for w, r, o in zip(walls, refs, servers, strict=True)]
    print(f"{lab}_reference: {statistics.median(refs):.2f} s median (the classic reference's"
          f" loads and decoding, in its own worker while no server is resident); job wall less it / servers'"
          f" own: {statistics.median(rest):.3f} x median ({min(rest):.3f}-{max(rest):.3f})")


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    known = engines()
    ap.add_argument("--engines", default=",".join(known))
    ap.add_argument("--repeat", type=int, default=15, help="paired runs per check (at least 6)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--prompts", type=int, default=2, help="prompts of the probe check")
    ap.add_argument("--served-runs", type=int, default=3)
    ap.add_argument("--served-widths", default="3,8")
    ap.add_argument("--no-served", dest="served", action="store_false")
    ap.add_argument("--no-in-process", dest="in_process", action="store_false")
    ap.add_argument("--profile", default=None, help="write cProfile stats of each check arm into this folder")
    args = ap.parse_args()
    if args.repeat < 6:
        ap.error("--repeat: at least 6 (a confidence interval of a median needs them)")
    bad = [e for e in args.engines.split(",") if e not in known]
    if bad:
        ap.error(f"--engines: {', '.join(bad)}: choose from {', '.join(known)}")
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
        args.profile = str(Path(args.profile).resolve())
    # the re-run in an engine's environment gets every flag but --engines (set per engine) and --profile
    # (given again, absolute: the re-run may start elsewhere)
    argv: list[str] = []
    skip = False
    for a in sys.argv[1:]:
        if skip:
            skip = False
        elif a in ("--engines", "--profile"):
            skip = True
        elif not a.startswith(("--engines=", "--profile=")):
            argv.append(a)
    if args.profile:
        argv += ["--profile", args.profile]
    if args.in_process:
        for engine in args.engines.split(","):
            run_engine(engine, args, argv)
    if args.served and not os.environ.get(CHILD):
        for engine in args.engines.split(","):
            served(engine, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
