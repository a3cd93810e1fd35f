"""The classic reference's worker as a served job starts it: beside the first server, importing only.

A worker started with ``load=False`` imports mlx-lm while a server starts (its start-up, about a
second of imports, overlaps the server's) and holds no weights until its first question, which comes
once no server holds the target. Shown on a real worker process: the checkpoint it is given does not
exist when it starts, and it answers once the checkpoint is there; a release while it waits keeps it
(no copy of the target to give back); a release after it loaded has it drop the weights and stay, imports
done, to load again at the next question, unless what it then holds is more than the job's budget gives a
worker without weights: then it ends.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import pytest
from conftest import pid_alive
from specparity.fixtures import FixtureInfo
from specparity.harness import memory
from specparity.harness import oracle as oracle_module
from specparity.harness.oracle import Oracle
from specparity.reference import ClassicReference

pytestmark = [pytest.mark.model]

BODY = {"prompt": "The cache holds keys and values for every position", "max_tokens": 6}


def _imported_mlx(pid: int) -> bool:
    try:
        return "libmlx" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def test_a_waiting_worker_loads_at_its_first_question_and_a_release_keeps_it_until_then(
        llama_pair: FixtureInfo, tmp_path: Path) -> None:
    later = tmp_path / "target"  # not there yet: a worker that loaded at start would fail
    oracle = Oracle(str(later), False, sys.executable)
    try:
        oracle.spawn(load=False)
        assert oracle.proc is not None and oracle.waiting
        pid = oracle.proc.pid
        deadline = time.monotonic() + 60
        while not _imported_mlx(pid) and time.monotonic() < deadline:  # its imports, under way beside "a server"
            assert oracle.proc.poll() is None, "the waiting worker exited"
            time.sleep(0.05)
        assert _imported_mlx(pid)
        oracle.release()  # a server is about to start: a waiting worker holds no weights, so it stays
        assert oracle.proc is not None and oracle.proc.pid == pid and pid_alive(pid)
        shutil.copytree(llama_pair.target, later)
        answer = oracle.complete("completions", BODY)
        assert answer.completion is not None, answer.error
        want = ClassicReference(llama_pair.target).complete("completions", BODY)
        assert answer.completion.token_ids == want.token_ids
        assert oracle.workers == 1 and not oracle.waiting and oracle.load_seconds is not None
        oracle.release()  # loaded: a copy of the target, dropped before the next server; the process stays
        assert oracle.proc is not None and oracle.proc.pid == pid and oracle.waiting and oracle.load_seconds is None
        kept = oracle.cost_dict()
        # what it holds, as it said and as measured from outside: no more than the job's budget gives a worker
        # importing beside a server
        assert kept is not None and len(kept["kept_bytes"]) == 1 and 0 < kept["kept_bytes"][0] <= memory.IMPORTING_BYTES
        assert memory.rss([pid])[pid] <= memory.IMPORTING_BYTES
        other = {**BODY, "prompt": BODY["prompt"] + " again"}  # not in the oracle's cache: the worker must load
        answer = oracle.complete("completions", other)
        assert answer.completion is not None, answer.error
        want = ClassicReference(llama_pair.target).complete("completions", other)
        assert answer.completion.token_ids == want.token_ids
        assert oracle.proc.pid == pid and not oracle.waiting
        cost = oracle.cost_dict()
        assert cost is not None and (cost["computed"], cost["workers"], cost["loads"]) == (2, 1, 2)
        assert len(cost["worker_peaks"]) == 2 and all(cost["worker_peaks"])
    finally:
        oracle.close()


def test_a_worker_that_holds_more_than_its_share_without_weights_ends_and_the_next_question_starts_another(
        llama_pair: FixtureInfo, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(oracle_module, "IMPORTING_BYTES", 1)  # no worker fits: every release ends its worker
    oracle = Oracle(llama_pair.target, False, sys.executable)
    try:
        assert oracle.complete("completions", BODY).completion is not None
        assert oracle.proc is not None
        pid = oracle.proc.pid
        oracle.release()
        assert oracle.proc is None and not oracle.kept_bytes
        deadline = time.monotonic() + 10
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not pid_alive(pid)
        assert oracle.complete("completions", {**BODY, "max_tokens": 3}).completion is not None
        assert oracle.proc is not None and oracle.proc.pid != pid
        cost = oracle.cost_dict()
        assert cost is not None and (cost["workers"], cost["loads"], cost["kept_bytes"]) == (2, 2, [])
    finally:
        oracle.close()


def test_a_waiting_worker_that_is_never_asked_exits_with_its_input_and_costs_nothing(tmp_path: Path) -> None:
    oracle = Oracle(str(tmp_path / "never"), False, sys.executable)
    oracle.spawn(load=False)
    assert oracle.proc is not None
    proc = oracle.proc
    assert oracle.cost_dict() is None  # asking its cost does not make it load
    oracle.close()
    assert proc.wait(10) == 0 and oracle.failed is None
