"""Memory: what a job's processes hold, their peaks, and the budget a job states before it starts.

A served job holds one copy of the target at a time: its servers run one after
another, and the classic reference's worker (harness.oracle) holds the target
only while no server is (harness.run): beside the first server it only imports
mlx-lm (``IMPORTING_BYTES``, no weights), unless the job asks for the reference
beside the servers (``reference_beside``), whose cost is a second copy of the target.

Measured (Linux: ``/proc``; macOS: ``ps``), never estimated:

- :func:`peak_rss`: a process tree's peak resident memory, the sum of its
  processes' high-water marks (``VmHWM``; on macOS the highest sample seen);
- :class:`Sampler`: the whole job's memory over time, every process under the
  harness (the harness itself included) summed at each sample (Linux: their
  proportional set sizes, so shared pages count once), and its peak. A sample
  is not free (the kernel walks each process's page tables for its proportional
  set size: a few milliseconds for a small mlx-lm server, more for a large
  model), so the sampler waits at least :data:`SAMPLE_OVERHEAD`'s inverse times
  as long as its last sample took: it takes at most 2% of one core from the
  processes it measures, and the record states the longest wait it used.

Expected, before anything starts (:func:`served_budget`, :func:`probe_budget`):
the checkpoints' weight files, the KV cache at the job's lengths and each
process's runtime, against what the machine has (``MemAvailable`` from
``/proc/meminfo``; ``hw.memsize`` on macOS), or against ``--memory-limit`` /
``SPECPARITY_MEMORY_LIMIT``. A job that cannot fit is refused with one line
(exit 4) instead of swapping or being killed halfway.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from specparity.errors import InfrastructureError, UsageError

LIMIT_ENV = "SPECPARITY_MEMORY_LIMIT"
LIMIT_FLAG = "--memory-limit"
# what one Python process with mlx and mlx-lm imported holds before any weights (measured on Linux,
# mlx-lm 0.31: 150-250 MB); a process's estimate is its checkpoints, its KV cache and this
RUNTIME_BYTES = 250 * 2**20
# the harness's own process (httpx, click, the record): it never imports mlx
HARNESS_BYTES = 80 * 2**20
# the classic reference's worker beside a server, holding no weights: importing mlx-lm beside the first
# (harness.oracle's ``spawn(load=False)``; measured on Linux, mlx 0.32 and mlx-lm 0.31/0.32: 75-90 MB), or
# waiting to load again after giving its weights back (65-90 MB; a worker that would hold more ends instead)
IMPORTING_BYTES = 100 * 2**20
WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".npz")
_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "m": 2**20, "mb": 2**20, "g": 2**30, "gb": 2**30,
          "t": 2**40, "tb": 2**40, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
# the largest limit taken: what a 64-bit machine addresses; anything above is a typo, not a limit
MAX_SIZE = 2**63


def parse_size(text: str, what: str = LIMIT_FLAG) -> int:
    """``512MB``, ``16G``, ``1.5GiB``, ``2000000`` (bytes) -> bytes (binary units: 1 GB = 2**30); above
    :data:`MAX_SIZE` is a UsageError naming ``what`` and the text."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if m is None or m.group(2).lower() not in _UNITS:
        raise UsageError(f"{what}: {text!r} is not a size (e.g. 512MB, 16GB)")
    # exact arithmetic: a float overflows to inf on 309 digits (int(inf) raised OverflowError)
    size = Fraction(m.group(1)) * _UNITS[m.group(2).lower()]
    if size > MAX_SIZE:
        raise UsageError(f"{what}: {text!r} is above 8 EiB (2**63 bytes), more than a machine addresses")
    return int(size)


def fmt(n: int | float | None) -> str:
    """Bytes as a reader reads them (``1.23 GB``, binary units)."""
    if n is None:
        return "unknown"
    for unit, size in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


# -- measured ----------------------------------------------------------------------------------------
def _proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of ``pid`` in bytes ({} where it is gone or /proc is not there)."""
    out: dict[str, int] = {}
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def _proc_table() -> dict[int, int]:
    """pid -> parent pid of every process we can see (Linux /proc, else ``ps``)."""
    table: dict[int, int] = {}
    if Path("/proc/self/stat").exists():
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            # the command name may hold spaces and parentheses: the fields follow its last ')'
            fields = stat[stat.rfind(")") + 2:].split()
            table[int(d)] = int(fields[1])
        return table
    for pid, ppid, _ in _ps():
        table[pid] = ppid
    return table


def _ps() -> list[tuple[int, int, int]]:
    """(pid, ppid, rss bytes) of every process, from ``ps`` (macOS)."""
    try:
        out = subprocess.run(["ps", "-axo", "pid=,ppid=,rss="], capture_output=True, text=True, timeout=10,
                             check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    rows = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and all(p.isdigit() for p in parts):
            rows.append((int(parts[0]), int(parts[1]), int(parts[2]) * 1024))
    return rows


def _children(pid: int) -> list[int] | None:
    """``pid``'s children from /proc/PID/task/*/children (None: this kernel does not say)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None if not Path("/proc/self/task").exists() else []
    out: list[int] = []
    for t in tasks:
        try:
            out += [int(c) for c in Path(f"/proc/{pid}/task/{t}/children").read_text().split()]
        except FileNotFoundError:
            return None
        except OSError:
            continue
    return out


def _name(pid: int) -> str:
    """A short name of ``pid``: its command's first words that are not an interpreter's flags."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return ""
    words = [a.decode(errors="replace") for a in argv if a and not a.startswith(b"-")]
    return " ".join(Path(w).name if i == 0 else w for i, w in enumerate(words[:3]))[:80]


def tree(pid: int, table: dict[int, int] | None = None) -> list[int]:
    """``pid`` and every process below it."""
    if table is None and _children(pid) is not None:
        out, todo = [], [pid]
        while todo:
            p = todo.pop()
            out.append(p)
            todo += _children(p) or []
        return out
    table = _proc_table() if table is None else table
    kids: dict[int, list[int]] = {}
    for p, pp in table.items():
        kids.setdefault(pp, []).append(p)
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def _pss(pid: int) -> int | None:
    """``pid``'s proportional set size in bytes (Linux smaps_rollup; None: not there)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def rss(pids: list[int]) -> dict[int, int]:
    """The resident bytes of each of ``pids`` now (those still there). On Linux the proportional set
    size: a page two processes share counts half in each, so a fork's child between fork and exec (a
    copy of its parent's pages, shared) does not count its parent's memory twice."""
    if Path("/proc/self/status").exists():
        out = {}
        for p in pids:
            v = _pss(p)
            if v is None:
                v = _proc_status(p).get("VmRSS")
            if v is not None:
                out[p] = v
        return out
    want = set(pids)
    return {p: r for p, _, r in _ps() if p in want}


def peak_rss(pid: int | None, sampler: Sampler | None = None) -> int | None:
    """The peak resident bytes of ``pid``'s process tree: the sum of each process's high-water mark
    (Linux VmHWM), or the highest sample ``sampler`` saw of each (elsewhere); None: unknown."""
    if pid is None:
        return None
    pids = tree(pid)
    total, seen = 0, False
    for p in pids:
        hwm = _proc_status(p).get("VmHWM")
        sampled = sampler.peak_of(p) if sampler is not None else None
        best = max([v for v in (hwm, sampled) if v is not None], default=None)
        if best is not None:
            total, seen = total + best, True
    return total if seen else None


def own_peak_rss() -> int:
    """This process's peak resident bytes since it started or since :func:`reset_peak_rss` (Linux: ``VmHWM``;
    elsewhere ``ru_maxrss``, KB on Linux and bytes on macOS, which no reset moves)."""
    import resource

    hwm = _proc_status(os.getpid()).get("VmHWM")
    if hwm is not None:
        return hwm
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def reset_peak_rss() -> bool:
    """Start this process's peak resident memory anew from what it holds now (Linux's ``clear_refs`` 5:
    ``VmHWM`` back to ``VmRSS``); False where that cannot be done (macOS: the peak stays the lifetime's)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


SAMPLE_OVERHEAD = 0.02  # the share of one core a Sampler may take: it waits 50 times as long as a sample took


class Sampler:
    """Samples the resident memory of ``root``'s whole process tree (the harness and everything it
    started) every ``interval`` seconds on a daemon thread, or less often where a sample costs more than
    :data:`SAMPLE_OVERHEAD` of that (``longest_wait``: the longest wait it used): the peak of the sum, and
    each process's peak.

        with Sampler() as s: ...
        s.peak_total, s.peak_of(pid)
    """

    def __init__(self, root: int | None = None, interval: float = 0.2):
        self.root = root if root is not None else os.getpid()
        self.interval = interval if Path("/proc/self/stat").exists() else max(interval, 0.5)
        self.longest_wait = self.interval
        self.peak_total = 0
        self.peak_children = 0  # the same, less the root process itself
        self.at_peak: dict[str, int] = {}  # "pid name" -> resident bytes, at the sample of the peak
        self.peaks: dict[int, int] = {}
        self.samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> int:
        now = rss(tree(self.root))
        total = sum(now.values())
        for p, v in now.items():
            if v > self.peaks.get(p, 0):
                self.peaks[p] = v
        if total > self.peak_total:
            self.peak_total = total
            self.at_peak = {f"{p} {_name(p)}": v for p, v in sorted(now.items(), key=lambda kv: -kv[1])}
        self.peak_children = max(self.peak_children, total - now.get(self.root, 0))
        self.samples += 1
        return total

    def reset(self) -> None:
        """Start the peaks again (a new pairing)."""
        self.peak_total = self.peak_children = 0
        self.at_peak = {}

    def peak_of(self, pid: int) -> int | None:
        return self.peaks.get(pid)

    def _loop(self) -> None:
        wait = self.interval
        while not self._stop.wait(wait):
            started = time.thread_time()  # this thread's CPU, the kernel's work for it included
            self.sample()
            wait = max(self.interval, (time.thread_time() - started) / SAMPLE_OVERHEAD)
            self.longest_wait = max(self.longest_wait, wait)

    def start(self) -> Sampler:
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="specparity-memory", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        self.sample()

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- expected --------------------------------------------------------------------------------------
def checkpoint_bytes(path: str | os.PathLike[str] | None) -> int | None:
    """The bytes of a checkpoint's weight files (None: not a local folder, nothing to read)."""
    if path is None:
        return None
    p = Path(path)
    if p.is_file() and p.suffix in WEIGHT_SUFFIXES:
        return p.stat().st_size
    if not p.is_dir():
        return None
    return sum(f.stat().st_size for f in p.iterdir() if f.suffix in WEIGHT_SUFFIXES and f.is_file())


def kv_bytes(path: str | os.PathLike[str] | None, tokens: int, sequences: int = 1) -> int:
    """The KV cache of ``tokens`` positions for ``sequences`` sequences at once, from the checkpoint's
    config (keys and values of every attention layer, in its dtype; 0 where the config says nothing)."""
    if path is None:
        return 0
    try:
        cfg = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return 0
    cfg = {**(cfg.get("text_config") or {}), **cfg} if isinstance(cfg, dict) else {}
    layers = int(cfg.get("num_hidden_layers") or 0)
    heads = int(cfg.get("num_attention_heads") or 0)
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or (int(cfg.get("hidden_size") or 0) // heads if heads else 0))
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "float16")
    width = 4 if "32" in dtype else 2
    return 2 * layers * kv_heads * head_dim * width * tokens * max(1, sequences)


@dataclass
class Budget:
    """What a job expects to need, and what it may use.

    parts: what each process needs at once, ``{"name": bytes}`` (its weights, KV and runtime).
    expected: the peak the job expects: the largest process plus the harness, or their sum where
      they run side by side. limit: the memory it may use; limit_source: where that came from
      (``--memory-limit``, ``SPECPARITY_MEMORY_LIMIT``, ``MemAvailable``, ``hw.memsize``), None: unknown.
    unknown: checkpoints whose size could not be read (a hub id not downloaded yet): not counted.
    side_by_side: the processes run at once (the reference beside the servers).
    """

    what: str
    parts: dict[str, int] = field(default_factory=dict)
    expected: int = 0
    limit: int | None = None
    limit_source: str | None = None
    unknown: list[str] = field(default_factory=list)
    side_by_side: bool = False

    @property
    def fits(self) -> bool:
        return self.limit is None or self.expected <= self.limit

    def line(self) -> str:
        how = "side by side" if self.side_by_side else "one at a time"
        biggest = max(self.parts.items(), key=lambda kv: kv[1], default=None)
        detail = (f"the largest process {biggest[0]} {fmt(biggest[1])}, processes {how}" if biggest else how)
        out = f"{self.what} expects about {fmt(self.expected)} of memory ({detail})"
        if self.unknown:
            out += f"; not counted: {', '.join(self.unknown)}"
        if self.limit is not None:
            out += f"; {fmt(self.limit)} available ({self.limit_source})"
        return out

    def refusal(self) -> str:
        return (f"{self.what} expects about {fmt(self.expected)} of memory and {fmt(self.limit)} is available"
                f" ({self.limit_source}): not started (largest process: "
                f"{', '.join(f'{k} {fmt(v)}' for k, v in self.parts.items())}); {LIMIT_FLAG} or"
                f" {LIMIT_ENV} sets another limit")

    def check(self) -> Budget:
        """Raises InfrastructureError (exit 4, one line) when the job cannot fit."""
        if not self.fits:
            raise InfrastructureError(self.refusal())
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def available() -> tuple[int | None, str | None]:
    """The memory this machine has for a job now: MemAvailable (Linux), hw.memsize (macOS)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo"
    except OSError:
        pass
    if sys.platform == "darwin":
        try:
            out = subprocess.run(["sysctl", "-n", "hw.memsize"], capture_output=True, text=True, timeout=10,
                                 check=False).stdout.strip()
            return int(out), "hw.memsize (sysctl)"
        except (OSError, subprocess.SubprocessError, ValueError):
            pass
    return None, None


def limit(flag: str | None = None) -> tuple[int | None, str | None]:
    """The limit a job runs under: ``flag`` (--memory-limit), else $SPECPARITY_MEMORY_LIMIT, else what
    the machine has. ``none``/``off`` turns the check off."""
    given = given_limit(flag)
    return available() if given is None else given


def given_limit(flag: str | None = None) -> tuple[int | None, str | None] | None:
    """The limit the user gave: ``flag`` (--memory-limit), else $SPECPARITY_MEMORY_LIMIT; (None, None) for
    ``none``/``off``; None when neither is given. A bad size, or an empty flag, is a UsageError naming it.

    An empty variable is no variable (click's rule for every other one); an empty flag is a mistake
    (``--memory-limit "$UNSET"``): taken as none, the machine's memory silently became the limit."""
    if flag is not None and not str(flag).strip():
        raise UsageError(f"{LIMIT_FLAG}: {flag!r} is empty: give a size (e.g. 16GB), or 'off' for no check")
    for given, source in ((flag, LIMIT_FLAG), (os.environ.get(LIMIT_ENV), LIMIT_ENV)):
        if given is None or not str(given).strip():
            continue
        if str(given).strip().lower() in ("none", "off"):
            return None, None
        return parse_size(given, source), source
    return None


def _process(name: str, checkpoints: list[str | None], tokens: int, sequences: int,
             unknown: list[str]) -> tuple[str, int]:
    total = RUNTIME_BYTES
    for i, c in enumerate(checkpoints):
        if c is None:
            continue
        size = checkpoint_bytes(c)
        if size is None:
            if str(c) not in unknown:
                unknown.append(str(c))
            continue
        total += size + (kv_bytes(c, tokens, sequences) if i == 0 or size else 0)
    return name, total


def served_budget(job: Any, flag: str | None = None) -> Budget:
    """A served job's expected memory: per pairing its largest server (target, drafter, KV at the job's
    lengths and concurrency; the self-draft arm's holds the target twice) and its classic reference
    (target, drafter for cold answers, KV), one at a time unless ``job.reference_beside`` (one at a time:
    the reference's worker, importing mlx-lm with no weights, beside a server); the harness's own on top."""
    b = Budget("this served job")
    beside = bool(getattr(job, "reference_beside", False))
    b.side_by_side = beside and bool(job.reference)
    prompt_tokens = max((len(str(p)) for p in job.prompts), default=64) + 64  # a byte-level bound of the prompt
    tokens = prompt_tokens * 2 + 2 * job.max_tokens  # the multi-turn request carries the first answer
    peak = 0
    for p in job.pairings:
        seqs = max(1, int(job.concurrency or 1))
        servers = dict([_process(f"{p.name} server", [p.target, p.draft], tokens, seqs, b.unknown)])
        if _self_drafts(job, p):  # its self-draft arm's server loads the target twice: as the target and its drafter
            servers.update([_process(f"{p.name} self-draft server", [p.target, p.target], tokens, 1, b.unknown)])
        b.parts.update(servers)
        largest = max(servers.values())  # the servers run one at a time
        reference = 0
        if job.reference:
            name, reference = _process(f"{p.name} classic reference", [p.target, p.draft], tokens, 1, b.unknown)
            b.parts[name] = reference
        if b.side_by_side:
            peak = max(peak, largest + reference)
        else:  # one copy at a time; the reference's worker imports (no weights) beside the first server
            importing = IMPORTING_BYTES if job.reference else 0
            if importing:
                b.parts[f"{p.name} classic reference importing beside a server"] = importing
            peak = max(peak, largest + importing, reference)
    b.expected = peak + HARNESS_BYTES
    b.limit, b.limit_source = limit(flag)
    return b


def _self_drafts(job: Any, pairing: Any) -> bool:
    """Whether the job plans ``pairing``'s self-draft arm (harness.plan.self_draft_refusal)."""
    if not (getattr(job, "self_draft", False) and getattr(job, "widths", None)):
        return False
    from specparity.errors import SpecparityError
    from specparity.harness.profiles import load_profile
    from specparity.harness.plan import self_draft_refusal

    try:
        return self_draft_refusal(load_profile(pairing.profile), pairing.target) is None
    except (SpecparityError, OSError):
        return False  # a profile that does not load is said when the pairing runs


def probe_budget(model: str | None, tokens: int, draft: str | None = None, flag: str | None = None) -> Budget:
    """A probe's expected memory: the checkpoint (and drafter) in this process, the chain's and the
    block's KV caches (and the bracket's repeat) at ``tokens`` positions."""
    b = Budget("this probe")
    name, total = _process("probe", [model, draft], tokens, 3, b.unknown)
    b.parts[name] = total
    b.expected = total
    b.limit, b.limit_source = limit(flag)
    return b
