"""Memory: a served job holds one copy of the target at a time, and states what it needs.

On real processes: a checkpoint whose weights are most of a process's memory (a
real vocabulary under two narrow layers, float32, built once here by the
project's own builder), one served run through the CLI with one width and a few
tokens. Its peak over every process (the harness included, sampled from /proc)
stays within 1.1x its largest server, every request still judged against
classic decode; the opt-in that keeps the reference beside the servers shows
the second copy the measurement must see. A job whose expected memory exceeds
a configured limit is refused with one line before any server starts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli
import fixture_pairs
from specparity.fixtures import FixtureInfo
from specparity.harness import memory
from specparity.harness.config import Job, Pairing
from specparity.records.record import read_record

BOUND = 1.1
JOB = {"widths": [2], "max_tokens": 4, "sequence": ["fresh", "repeat"], "concurrency": 0, "self_draft": False,
       "prompts": ["The quick brown fox jumps over the lazy dog."]}


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> FixtureInfo:
    """The weight-dominated pair: 458 MB of float32 weights per checkpoint."""
    return fixture_pairs.pair("llama-wide-vocab-float32", tmp_path_factory.mktemp("wide"))


def _served(cli_bin: str, tmp: Path, pair: FixtureInfo, *extra: str) -> tuple[dict, dict[str, list[dict]]]:
    cfg = tmp / "job.yaml"
    cfg.write_text(json.dumps(JOB))
    r = run_cli(cli_bin, "served", "--config", str(cfg), "--model", pair.target, "--draft-model", str(pair.draft),
                "--record-dir", str(tmp / "rec"), "-q", *extra, env={"SPECPARITY_HOME": str(tmp / "home")})
    assert r.returncode in (0, 1), r.stdout + r.stderr
    [md] = (tmp / "rec").glob("*.md")
    record, _, arms = read_record(md)
    assert record.summary is not None
    return record.summary, arms


def _pairing(summary: dict) -> dict:
    return summary["pairings"][0]


@pytest.mark.model
@pytest.mark.server
@pytest.mark.slow
def test_a_served_job_peaks_at_one_server_and_judges_every_request(wide: FixtureInfo, tmp_path: Path,
                                                                   cli_bin: str) -> None:
    report, arms = _served(cli_bin, tmp_path, wide)
    p = _pairing(report)
    mem = p["memory"]
    largest, total = mem["largest_server_bytes"], mem["peak_total_bytes"]
    weights = memory.checkpoint_bytes(wide.target)
    assert weights is not None and largest > weights  # the weights are in the servers' memory
    # one server's copy at a time, plus the harness's own: the reference never sits beside a server
    assert mem["peak_children_bytes"] <= BOUND * largest, mem.get("at_peak", mem)  # which processes, at the peak
    assert total <= BOUND * largest + mem["harness_peak_rss_bytes"], mem
    assert not mem["reference_beside"]
    assert 0.2 <= mem["peak_sampled_every_s"] <= 5  # the sum's resolution, stated (memory.SAMPLE_OVERHEAD)
    # each server's and each reference worker's peak is in the record, the worker's above the weights it holds
    assert set(mem["servers_peak_rss_bytes"]) == {"baseline-start", "w2", "baseline-end"}
    assert all(a["server"]["peak_rss_bytes"] > weights for a in p["arms"])
    workers = mem["reference_workers_peak_rss_bytes"]
    assert workers and all(w > weights for w in workers) and p["reference_cost"]["loads"] == len(workers)
    # after each load, before the next server, the one worker gave its weights back and stayed: what it held
    # then (beside that server, under the bound above) a fraction of them
    cost = p["reference_cost"]
    assert cost["workers"] == 1 and len(cost["kept_bytes"]) >= cost["loads"] >= 1
    assert all(k <= memory.IMPORTING_BYTES < weights / 4 for k in cost["kept_bytes"]), cost
    # the classic reference still judged every request of every arm, each distinct one decoded once
    lines = [r for rs in arms.values() for r in rs if "completion" in r and "request" in r]
    assert len(lines) == 6 and all((r.get("reference") or {}).get("compared") for r in lines), lines
    # decoded once, after the first server and before the next: every judged answer from the reference's cache
    assert (p["reference_cost"]["computed"], p["reference_cost"]["hits"]) == (1, 6)


@pytest.mark.model
@pytest.mark.server
@pytest.mark.slow
def test_the_reference_beside_the_servers_is_an_opt_in_whose_second_copy_is_measured(
        wide: FixtureInfo, tmp_path: Path, cli_bin: str) -> None:
    report, _ = _served(cli_bin, tmp_path, wide, "--reference-beside")
    mem = _pairing(report)["memory"]
    assert mem["reference_beside"]
    # the worker's copy of the target sits beside the largest server: the measurement sees it
    assert mem["peak_total_bytes"] > BOUND * mem["largest_server_bytes"], mem
    weights = memory.checkpoint_bytes(wide.target)
    assert weights is not None and mem["peak_total_bytes"] >= mem["largest_server_bytes"] + 0.8 * weights


@pytest.mark.model
def test_a_job_that_cannot_fit_is_refused_before_any_server_starts(llama_pair: FixtureInfo, tmp_path: Path,
                                                                   cli_bin: str) -> None:
    env = {"SPECPARITY_HOME": str(tmp_path / "home"), memory.LIMIT_ENV: "1MB"}
    r = run_cli(cli_bin, "served", "--model", llama_pair.target, "--draft-model", str(llama_pair.draft),
                "--widths", "2", "--record-dir", str(tmp_path / "rec"), env=env)
    assert r.returncode == 4, r.stdout + r.stderr
    [line] = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert line.startswith("Error: this served job expects about") and "--memory-limit" in line, line
    assert memory.LIMIT_ENV in line and "1.00 MB" in line
    assert not (tmp_path / "rec").exists() and "starting" not in r.stderr  # no record, no server
    # the flag overrides the environment: the same job under a limit it fits is not refused there
    job = Job(pairings=[Pairing("p", llama_pair.target, llama_pair.draft)], widths=[2])
    assert memory.served_budget(job, "64GB").fits and not memory.served_budget(job, "1MB").fits
    # the probe: refused before its checkpoint loads, naming the flag
    r = run_cli(cli_bin, "probe", "--model", llama_pair.target, "--memory-limit", "1MB", "--json",
                env={"SPECPARITY_HOME": str(tmp_path / "home")})
    assert r.returncode == 4, r.stdout + r.stderr
    [line] = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert line.startswith("Error: this probe expects about") and "--memory-limit" in line, line
    assert json.loads(r.stdout) == {"verdict": "error", "exit_code": 4, "error": line.removeprefix("Error: ")}


@pytest.mark.model
def test_the_budget_counts_weights_kv_and_the_reference_side_by_side_only_when_asked(
        llama_pair: FixtureInfo, monkeypatch: pytest.MonkeyPatch) -> None:
    weights = memory.checkpoint_bytes(llama_pair.target)
    assert weights and weights == sum(f.stat().st_size for f in Path(llama_pair.target).glob("*.safetensors"))
    assert memory.kv_bytes(llama_pair.target, 100) == 2 * 6 * 2 * 32 * 4 * 100  # layers, kv heads, head_dim, f32
    job = Job(pairings=[Pairing("p", llama_pair.target, llama_pair.draft)], widths=[2], max_tokens=16)
    one = memory.served_budget(job, "off")
    job.reference_beside = True
    both = memory.served_budget(job, "off")
    assert one.limit is None and one.fits and not one.side_by_side and both.side_by_side
    server, reference = one.parts["p server"], one.parts["p classic reference"]
    importing = one.parts["p classic reference importing beside a server"]
    assert importing == memory.IMPORTING_BYTES < reference <= server
    # one at a time: the largest server with the reference's worker importing beside it (no weights)
    assert one.expected == server + importing + memory.HARNESS_BYTES
    assert both.expected == server + reference + memory.HARNESS_BYTES  # the reference's process on top
    assert memory.parse_size("1.5GB") == int(1.5 * 2**30) and memory.parse_size("2000") == 2000
    with pytest.raises(Exception, match="--memory-limit"):
        memory.parse_size("lots")
    monkeypatch.delenv(memory.LIMIT_ENV, raising=False)
    limit, source = memory.limit()
    assert limit is None or (limit > 0 and source)


def test_the_sampler_takes_at_most_its_share_of_a_core_and_says_how_often_it_sampled(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A sample costing 20 ms of CPU (the kernel's page-table walk for a large model's server): the
    sampler then waits 50 times that, 1 s, and states it; a free one keeps its interval."""
    import time

    costly = memory.Sampler(interval=0.05)

    def sample() -> int:
        end = time.thread_time() + 0.02
        while time.thread_time() < end:
            pass
        costly.samples += 1
        return 0

    monkeypatch.setattr(costly, "sample", sample)
    with costly:
        time.sleep(1.5)
    assert costly.longest_wait == pytest.approx(0.02 / memory.SAMPLE_OVERHEAD, rel=0.3)
    assert costly.samples <= 5  # start, at most 2 in the loop, stop (every 0.05 s: about 20)
    free = memory.Sampler(interval=0.05)
    monkeypatch.setattr(free, "sample", lambda: 0)
    with free:
        time.sleep(0.3)
    assert 0.05 <= free.longest_wait < 0.08  # its interval (a sample of a few microseconds; 1.6 ms would pass it)


HUGE = "9" * 400  # more than a float holds: float() gives inf, int(inf) raised OverflowError (exit 70)


@pytest.mark.parametrize("command", ["probe", "served"])
@pytest.mark.parametrize("flag, env, named", [
    (HUGE, None, "--memory-limit"),
    (None, HUGE, memory.LIMIT_ENV),
    ("", None, "--memory-limit"),  # was silently no flag: the machine's memory became the limit
])
def test_a_size_no_machine_has_or_an_empty_flag_is_one_line_exit_2_before_any_work(
        cli_bin: str, tmp_path: Path, command: str, flag: str | None, env: str | None, named: str) -> None:
    home = tmp_path / "home"
    argv = [command, *(("--memory-limit", flag) if flag is not None else ()), "--json"]
    r = run_cli(cli_bin, *argv, env={"SPECPARITY_HOME": str(home), **({memory.LIMIT_ENV: env} if env else {})})
    assert r.returncode == 2, r.stdout + r.stderr
    [line] = r.stderr.splitlines()
    assert line.startswith(f"Error: {named}: {(flag if flag is not None else env)!r}"), line
    assert not (home / "fixtures").exists()  # refused while the options were read: nothing built or loaded


@pytest.mark.model
def test_the_budget_counts_the_self_draft_arms_server_holding_the_target_twice(llama_pair: FixtureInfo) -> None:
    """The default job's self-draft arm loads the target as its own drafter: at 0.5B its server peaked at 3,935 MB
    where the budget said 2,975 MB for the whole job (it counted the target and the drafter only)."""
    weights = memory.checkpoint_bytes(llama_pair.target)
    assert weights
    job = Job(pairings=[Pairing("p", llama_pair.target, None)], widths=[2], max_tokens=16)  # the target alone
    without = memory.served_budget(job, "off")
    job.self_draft = True
    with_arm = memory.served_budget(job, "off")
    assert "p self-draft server" not in without.parts
    twice = with_arm.parts["p self-draft server"]
    assert twice >= memory.RUNTIME_BYTES + 2 * weights
    assert twice > with_arm.parts["p server"] == without.parts["p server"]
    assert with_arm.expected == twice + memory.IMPORTING_BYTES + memory.HARNESS_BYTES > without.expected
    assert with_arm.line().startswith(f"this served job expects about {memory.fmt(with_arm.expected)}")
    assert "the largest process p self-draft server" in with_arm.line()
    # a profile that cannot draft with the target plans no such arm, and the budget counts none
    job.pairings = [Pairing("p", llama_pair.target, llama_pair.draft, profile="mlx-dspark")]  # DSpark drafters only
    assert "p self-draft server" not in memory.served_budget(job, "off").parts
