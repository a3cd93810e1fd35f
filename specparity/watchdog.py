"""What ties a server's life to the harness's, whatever kills the harness (even SIGKILL).

Run by :mod:`specparity.tied` as a script, by path, with the
standard library only (``python -I -S watchdog.py ...``: a few tens of
milliseconds), in two roles:

``exec HARNESS_PID -- ARGV...``
    The server's first program: on Linux it asks for SIGKILL when its parent
    dies (``prctl(PR_SET_PDEATHSIG)``, which survives ``exec``), checks that the
    harness did not die already, then ``exec``\\ s the server, which keeps this
    pid, its own session and process group. The kernel sends the signal when
    the parent *thread* exits, so the lifecycle forks servers from one thread
    that lives as long as the process. It reaches the leader only: the
    server's own children (an engine's workers) are the watcher's job.

``watch HARNESS_PID PGID FD GRACE``
    A watcher process per server, in a session of its own (no terminal signal
    or group kill of the harness reaches it), holding the read end FD of a
    pipe whose write end only the harness holds. When the harness dies the
    kernel closes that end and the read sees EOF: the watcher sends SIGTERM to
    the server's whole process group, waits up to GRACE seconds, then SIGKILL.
    This works on every POSIX system (macOS has no parent-death signal). It
    exits by itself once the group is gone; the harness kills it when it
    stops the server.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from pathlib import Path

# prctl(2) option, from <linux/prctl.h>
PR_SET_PDEATHSIG = 1
# the watcher's poll for a group that ended on its own, in seconds
POLL_SECONDS = 1.0
# exit codes of the exec role when it does not exec (shell conventions)
EXIT_NOT_RUN = 127
EXIT_ORPHANED = 129


def parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel for ``sig`` when this process's parent (thread) dies; False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` still exists (zombies not counted).

    A killed process that nobody reaps (its parent died, and an init that does
    not reap adopted it) stays a zombie in its group for good: only /proc tells
    it apart, where there is one.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    leader = _stat(proc / str(pgid))
    if leader is not None and leader[2] == str(pgid) and leader[0] != "Z":
        return True  # the common case: the leader itself runs
    for d in proc.iterdir():
        if d.name.isdigit():
            rest = _stat(d)
            if rest is not None and rest[2] == str(pgid) and rest[0] != "Z":
                return True
    return False


def _stat(d: Path) -> list[str] | None:
    """Fields after the ")" that closes the command name in /proc/PID/stat: state ppid pgrp ..."""
    try:
        return (d / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def run_exec(harness: int, argv: list[str]) -> None:
    parent_death_signal(signal.SIGKILL)
    if os.getppid() != harness:
        # the harness died before the signal was asked for: it will never come
        sys.stderr.write(f"specparity watchdog: harness {harness} gone before {argv[0]!r} started\n")
        os._exit(EXIT_ORPHANED)
    try:
        os.execvp(argv[0], argv)
    except OSError as err:
        sys.stderr.write(f"specparity watchdog: cannot run {argv[0]!r}: {err.strerror or err}\n")
        os._exit(EXIT_NOT_RUN)


def run_watch(harness: int, pgid: int, fd: int, grace: float) -> None:
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    while True:
        ready, _, _ = select.select([fd], [], [], POLL_SECONDS)
        if ready:
            if os.read(fd, 64) == b"":
                break  # EOF: the harness is gone
            continue
        if not group_alive(pgid):
            return  # the server ended and nothing is left to guard
    sys.stderr.write(f"specparity watchdog: harness {harness} is gone: stopping process group {pgid}\n")
    sys.stderr.flush()
    _kill(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    _kill(pgid, signal.SIGKILL)


def _kill(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def main(args: list[str]) -> None:
    if len(args) >= 4 and args[0] == "exec" and args[2] == "--":
        run_exec(int(args[1]), args[3:])
    elif len(args) == 5 and args[0] == "watch":
        run_watch(int(args[1]), int(args[2]), int(args[3]), float(args[4]))
    else:
        sys.stderr.write("usage: watchdog.py exec HARNESS_PID -- ARGV... | watch HARNESS_PID PGID FD GRACE\n")
        os._exit(2)


if __name__ == "__main__":
    main(sys.argv[1:])
