"""`specparity diagnose` through the installed command, on served records the fault fixtures make.

One served job on real mlx_lm.server processes (module-scoped: made once) holds two faults: a kernel
that changes at a width (a rows fault on layer 2's MLP from 4 rows on) and one that changes past a
depth (layer 2's MLP, from 2 rows, once the cache holds 28 positions). Each finding's diagnosis must
name the right phase and location, and every command it prints must give its step's verdict when
run. A clean record and a length finding need no model: their records are written as `served` lays
them out.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from builds import REAL_CACHE, built
from conftest import build, run_cli
from served_records import served_record_of

from specparity.environments import ENV_CACHE_VAR

ROWS = {"kind": "rows", "layer": 2, "subop": "mlp", "min_rows": 4, "scale": 1.5}
DEPTH = {"kind": "depth", "layer": 2, "subop": "mlp", "min_offset": 28, "min_rows": 2, "scale": 8.0}
# step 8 reruns step 1 in each pinned mlx-lm release: the real cache, where scripts/build-env built them
RELEASES = ("mlx-lm-0.31.3", "mlx-lm-0.32.2")
REAL = {ENV_CACHE_VAR: str(REAL_CACHE)}
PROMPT = "Speculative decoding drafts several tokens with a small model and verifies them"


@pytest.fixture(scope="module")
def served_faults(fixture_root: Path, cli_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A served record of the two faults at widths 3 and 4 (exit 1: both diverge), each finding diagnosed into
    it after the job (--diagnose)."""
    rows = build(fixture_root, "llama-diag-rows", arch="llama", faults=[ROWS])
    depth = build(fixture_root, "llama-diag-depth", arch="llama", faults=[DEPTH])
    tmp = tmp_path_factory.mktemp("diagnose-served")
    job = {"pairings": [{"name": n, "target": p.target, "draft": p.draft, "profile": "mlx-lm",
                         "trust_remote_code": True} for n, p in (("rows", rows), ("depth", depth))],
           "widths": [3, 4], "sequence": ["fresh"], "max_tokens": 24, "prompts": [PROMPT], "self_draft": False,
           "concurrency": 0}
    cfg = tmp / "job.yaml"
    cfg.write_text(yaml.safe_dump(job))
    for name in RELEASES:
        built(name)
    r = run_cli(cli_bin, "served", "--config", str(cfg), "--record-dir", str(tmp / "rec"), "--quiet", "--diagnose",
                "--json", env=REAL)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]  # served's verdict: --diagnose leaves it
    done = json.loads(r.stdout)["diagnoses"]
    assert done["ran"] and not (done["reused"] or done["held"] or done["failed"]), done
    return tmp / "rec"


def _by_id(out: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["finding"]["id"]: d for d in out["diagnoses"]}


def _step(d: dict[str, Any], n: int) -> dict[str, Any]:
    return next(s for s in d["steps"] if s["number"] == n)


def _check_commands(cli_bin: str, d: dict[str, Any]) -> list[str]:
    """Run every command the diagnosis printed: each exits 1 where its step said divergent, 0 where equal."""
    ran = []
    for s in d["steps"]:
        if s["status"] != "ran" or not s["command"] or s["command"] in ran:
            continue
        argv = shlex.split(s["command"])
        assert argv[0] == "specparity", s
        r = run_cli(cli_bin, *argv[1:], "--json", env=REAL)
        want = {"divergent": 1, "equal": 0, "inconclusive": 3}[s["verdict"]]
        assert r.returncode == want, (s["number"], s["command"], r.stdout[-1500:], r.stderr[-1500:])
        ran.append(s["command"])
    for c in (_step(d, 6)["data"] or {}).get("controls") or []:  # each control's probe: exit 0 where it removes it
        words = shlex.split(c["command"])
        env = dict(w.split("=", 1) for w in words if "=" in w and not w.startswith("-") and words.index(w) < 2)
        argv = words[len(env):]
        assert argv[0] == "specparity", c
        r = run_cli(cli_bin, *argv[1:], "--json", env={**REAL, **env})
        assert r.returncode == {"divergent": 1, "equal": 0}[c["verdict"]], (c, r.stdout[-1500:], r.stderr[-1500:])
        ran.append(c["command"])
    return ran


@pytest.mark.model
@pytest.mark.server
@pytest.mark.slow
def test_a_served_record_of_two_faults_is_diagnosed_to_their_width_depth_layer_and_sub_op(
        served_faults: Path, cli_bin: str) -> None:
    r = run_cli(cli_bin, "diagnose", str(served_faults), "--json", env=REAL)  # the directory: its newest record
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    out = json.loads(r.stdout)
    diags = _by_id(out)
    assert "rows/w4/p0" in diags and "rows/w3/p0" not in diags, list(diags)
    depth = [d for i, d in diags.items() if i.startswith("depth/")]
    assert depth, list(diags)
    # every step is accounted for, in order; 4 says it is not done, never left out
    for d in diags.values():
        assert [s["number"] for s in d["steps"]] == list(range(1, 9))
        assert all(s["status"] in ("ran", "skipped") for s in d["steps"]), d["steps"]
        # 4: the rollbacks before the emitting round restore classic decode's offsets; rows the faulted block
        # wrote are the block's (step 3), never blamed on a rollback
        four = _step(d, 4)
        assert four["status"] == "skipped" or four["data"]["defect"] is None, four
        # 8: step 1's command in each pinned mlx-lm release: the fault is the checkpoint's, so it holds on each
        releases = _step(d, 8)["data"]["releases"]
        assert [r["environment"] for r in releases] == ["mlx-lm-0.31.3", "mlx-lm-0.32.2"], releases
        assert {r["verdict"] for r in releases} == {"divergent"} and _step(d, 8)["data"]["first_failing"] == "0.31.3", (
            releases, _step(d, 8)["evidence"])
        # the control arms: compiled kernels off reruns the block and leaves the fixture's fault; the cache
        # toggles do not apply to a server run without them, and each says why
        controls = _step(d, 6)["data"]["controls"]
        assert [(c["name"], c["verdict"]) for c in controls] == [("compile off", "divergent")], controls
        assert "KV quantization off: not applicable" in " ".join(_step(d, 6)["evidence"])
        assert "no control arm removes it" in d["summary"]
        assert _step(d, 1)["verdict"] == "divergent" and "reproduced" in " ".join(_step(d, 1)["evidence"])
        # step 1 replayed the served run's own rounds (the witness's accept vector): the drafter was not needed
        assert (_step(d, 1)["data"]["source"], _step(d, 1)["data"]["drafter_loaded"]) == ("served rounds", False)
        assert " --accepts " in _step(d, 1)["command"] and "--draft-model" not in _step(d, 1)["command"]

    rows = diags["rows/w4/p0"]
    assert rows["phase"] == "verify", rows["summary"]
    loc = rows["location"]
    # the kernel changes at 4 rows (w3 matched), at every depth; the bisect names the faulted layer and sub-op
    assert (loc["width"], loc["depth"], loc["layer"], loc["subop"]) == (4, 0, 2, "mlp"), loc
    assert _step(rows, 3)["data"]["first_width"] == 4 and _step(rows, 5)["verdict"] == "divergent"
    assert _step(rows, 7)["data"]["call"] == "neither"  # a confident token flipped: no tie

    for d in depth:
        assert d["phase"] == "verify", d["summary"]
        loc = d["location"]
        # from 2 rows, and first past the depth where the cache holds 28 positions
        assert (loc["width"], loc["position"], loc["layer"], loc["subop"]) == (2, 28, 2, "mlp"), loc
        assert loc["depth"] > 0 and "past a depth" in " ".join(_step(d, 3)["evidence"])

    # the text says the same, one finding after the other; every printed command repeats its step's verdict
    text = run_cli(cli_bin, "diagnose", str(served_faults), "--finding", "rows/w4/p0", env=REAL)
    assert text.returncode == 1 and "finding rows/w4/p0 (width 4) at token" in text.stdout
    assert "phase verify" in text.stdout and "step 6 control arms: ran, divergent" in text.stdout
    ran = _check_commands(cli_bin, rows) + _check_commands(cli_bin, depth[0])
    assert {shlex.split(c)[1] for c in ran if c.startswith("specparity")} == {"replay", "probe", "bisect"}
    assert any(c.startswith("MLX_DISABLE_COMPILE=1 specparity probe") for c in ran)

    # served --diagnose wrote the same diagnoses into its record, one line per finding, made by its own run
    (md,) = served_faults.glob("served-*.md")
    written = {x["finding"]: x for x in map(json.loads, (served_faults / "data" / md.stem / "diagnoses.jsonl")
                                            .read_text().splitlines())}
    assert set(written) == set(diags)
    for fid, line in written.items():
        assert line["diagnosed_in"] == md.stem
        assert (line["diagnosis"]["phase"], line["diagnosis"]["location"]) == (diags[fid]["phase"],
                                                                              diags[fid]["location"])
    # where people look: records show under the finding, the page's drill-down (the newest record's)
    show = run_cli(cli_bin, "records", "show", str(md))
    assert "    diagnosis: phase verify at width 4, depth 0, cache position" in show.stdout, show.stdout[-3000:]
    assert "layer 2, sub-op mlp" in show.stdout and "## Diagnoses" in md.read_text()
    page = served_faults.parent / "page.html"
    assert run_cli(cli_bin, "records", "html", str(md), "--out", str(page)).returncode == 0
    html = page.read_text()
    assert html.count('<div class="diag" id=') == len(written) and "phase <b>verify</b> at width 4" in html


@pytest.mark.model
@pytest.mark.server
@pytest.mark.slow
def test_a_finding_with_its_served_rounds_never_loads_the_drafter(
        served_faults: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """In process, the tree as ``diagnose`` runs it, with checkpoint loading watched: the finding's served rounds
    reproduce it with the target alone (one copy of it in memory: the drafter is never loaded); the same finding
    without them loads the drafter for step 1 and comes to the same diagnosis."""
    from specparity.commands.diagnose import read_reproduction
    from specparity.diagnose.findings import read_findings
    from specparity.diagnose.tree import Models, diagnose_finding

    monkeypatch.setenv(ENV_CACHE_VAR, str(tmp_path / "no-envs"))  # step 8: no release built, no processes
    _, found = read_findings(served_faults, "rows/w4/p0")
    (f,) = found
    assert f.served_accepts and f.served_widths and f.served_tokens, f

    class Watched(Models):
        def __init__(self) -> None:
            super().__init__()
            self.paths: list[str] = []

        def load(self, path: str, trust_remote_code: bool) -> Any:
            self.paths.append(path)
            return super().load(path, trust_remote_code)

    models = Watched()
    d = diagnose_finding(f, read_reproduction(f), models)
    assert f.draft not in models.paths and set(models.paths) == {f.target}, models.paths
    assert (d.phase, d.location["width"], d.location["layer"], d.location["subop"]) == ("verify", 4, 2, "mlp")
    assert d.step(1).data["source"] == "served rounds"

    f.served_accepts = None  # a record without a witness: step 1 needs the drafter's own run
    again = Watched()
    d2 = diagnose_finding(f, read_reproduction(f), again)
    assert f.draft in again.paths and d2.step(1).data["source"] == "drafter", again.paths
    assert (d2.phase, d2.location) == (d.phase, d.location)


def test_a_clean_record_has_nothing_to_diagnose_exit_0(cli_bin: str, tmp_path: Path) -> None:
    md = served_record_of(tmp_path, [{"id": "p0", "kind": "fresh", "verdict": "match", "completion": {"seconds": 0.1}}])
    r = run_cli(cli_bin, "diagnose", str(md), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["verdict"] == "pass" and out["diagnoses"] == []
    text = run_cli(cli_bin, "diagnose", str(md))
    assert text.returncode == 0 and "no finding to diagnose" in text.stdout
    # a finding it does not hold is a usage error naming the ones it does
    bad = run_cli(cli_bin, "diagnose", str(md), "--finding", "w9/p0")
    assert bad.returncode == 2 and "--finding w9/p0: no such finding" in bad.stderr


def test_a_length_finding_is_its_own_class_settled_by_the_record(cli_bin: str, tmp_path: Path) -> None:
    reason = ("a length finding: w2 emitted 6 tokens where max_tokens is 4 (2 past it); its text up to there is"
              " classic decode's, which stops at max_tokens; differs from classic decode: first difference at token 4")
    req = {"id": "p0", "kind": "fresh", "verdict": "diverged", "reason": reason,
           "request": {"body": {"prompt": "x", "max_tokens": 4}},
           "completion": {"text": "abcdef", "sha256": "s", "token_ids": [1, 2, 3, 4, 5, 6],
                          "usage": {"completion_tokens": 6}},
           "classic": {"token_index": 4, "reference": "classic decode", "other": "w2"},
           "reproduction": {"command": None, "reason": "not needed"}}
    md = served_record_of(tmp_path, [req], verdict="diverged")
    r = run_cli(cli_bin, "diagnose", str(md), "--json")
    assert r.returncode == 1, r.stderr
    (d,) = json.loads(r.stdout)["diagnoses"]
    assert d["phase"] == "length" and d["location"] == {"max_tokens": 4, "completion_tokens": 6}
    assert all(s["status"] == "skipped" and "length finding" in s["evidence"][0] for s in d["steps"])


@pytest.mark.build
def test_another_engines_own_loop_is_never_rerun_as_mlx_lms_path(cli_bin: str, tmp_path: Path) -> None:
    """A finding whose reproduction runs dflash-mlx's own loop (``replay --engine dflash-mlx``) is not read as
    mlx-lm's speculative path (its drafter is a DFlash block model): the tree runs the command itself, in the
    engine's environment, and says whose loop gave no result here (the record's checkpoint is not there);
    mlx-lm's own replay of the same request is read."""
    from specparity.commands.diagnose import read_command

    own = ("specparity replay --engine dflash-mlx --model ./t --draft-model ./d --prompt-ids 1,2,3"
           " --verify-mode dflash --max-tokens 8")
    assert read_command(own) is None
    mlx_lm = read_command("specparity replay --model ./t --draft-model ./d --prompt-ids 1,2,3 --num-draft-tokens 3")
    assert mlx_lm is not None and (mlx_lm.prompt_ids, mlx_lm.num_draft_tokens) == ([1, 2, 3], 3)
    req = {"id": "p0", "kind": "fresh", "verdict": "diverged", "reason": "differs from classic decode at token 3",
           "request": {"body": {"prompt": "x", "max_tokens": 8}},
           "completion": {"text": "abc", "sha256": "s", "token_ids": [1, 2, 3, 4], "usage": {"completion_tokens": 4}},
           "classic": {"token_index": 3, "reference": "classic decode", "other": "w4"},
           "reproduction": {"command": own, "reason": None}}
    md = served_record_of(tmp_path, [req], verdict="diverged")
    built("dflash-mlx")
    r = run_cli(cli_bin, "diagnose", str(md), "--json", env=REAL)
    assert r.returncode == 1, r.stderr
    (d,) = json.loads(r.stdout)["diagnoses"]
    assert d["phase"] == "undetermined" and _step(d, 1)["status"] == "not_run"
    assert "runs dflash-mlx's own loop; it gave no result (exit 2" in _step(d, 1)["evidence"][0], _step(d, 1)
    assert _step(d, 1)["command"] == own


@pytest.mark.model
@pytest.mark.server
@pytest.mark.slow
def test_a_warm_cache_finding_is_diagnosed_through_its_sequence_to_the_prompt_cache(
        llama_pair: Any, cli_bin: str, tmp_path: Path) -> None:
    """mlx-lm 0.32.2's own server with a drafter: a repeated prompt and a shared prefix leave classic decode on a
    warm cache, and the record's reproduction is a sequence replay. diagnose replays that sequence through one
    prompt cache as the server's loop did (the finding comes back at its token), then the request alone on a fresh
    cache (classic decode): phase "server cache", located at the request, its place in the sequence and the cached
    prefix (the loop counted more cached positions than the entry held). Run from another folder than the job's:
    the record's relative sequence path is found through the record. Both printed commands give their verdicts.
    The same finding whose served answer the replay does not give is said to live in the server."""
    job = {"pairings": [{"name": "llama", "target": llama_pair.target, "draft": llama_pair.draft, "profile": "mlx-lm"}],
           "widths": [2], "sequence": ["fresh", "repeat", "shared-prefix"], "max_tokens": 32, "self_draft": False,
           "concurrency": 0}
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "job.yaml").write_text(yaml.safe_dump(job))
    r = run_cli(cli_bin, "served", "--config", "job.yaml", "--record-dir", "rec", "--quiet", cwd=str(job_dir))
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    for name in RELEASES:
        built(name)
    out = run_cli(cli_bin, "diagnose", str(job_dir / "rec"), "--json", cwd=str(tmp_path), env=REAL)
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    diags = _by_id(json.loads(out.stdout))
    warm = {i: d for i, d in diags.items() if "--sequence" in (d["finding"]["reproduction"] or "")}
    assert warm, list(diags)
    for fid, d in warm.items():
        assert d["phase"] == "server cache", (fid, d["summary"])
        loc, one = d["location"], _step(d, 1)
        assert loc["request"] == d["finding"]["request"] and loc["sequence_index"] > 1, loc
        assert loc["token_index"] == d["finding"]["token_index"] and 0 < loc["cached"] < loc["prompt_tokens"], loc
        assert loc["held"] is not None and loc["held"] < loc["cached"], loc  # the entry short of its count
        assert one["verdict"] == "divergent" and one["data"]["alone_first"] is None
        assert [s["status"] for s in d["steps"][1:7]] == ["skipped"] * 6 and d["steps"][7]["status"] == "ran"
        # the loop's cache entry is short on each pinned mlx-lm release: the state holds from 0.31.3 on
        assert [(r["release"], r["verdict"]) for r in d["steps"][7]["data"]["releases"]] == [
            ("0.31.3", "divergent"), ("0.32.2", "divergent")]
    d = next(iter(warm.values()))
    seq = shlex.split(_step(d, 1)["command"])
    assert Path(seq[seq.index("--sequence") + 1]).is_file()  # rewritten to the path that leads to it
    # exit 1: the replay diverges, here and in the newest release's environment
    newest = _step(d, 1)["command"] + " --environment mlx-lm-0.32.2"
    assert _check_commands(cli_bin, d) == [_step(d, 1)["command"], newest]
    alone = shlex.split(_step(d, 1)["data"]["alone_command"])
    assert run_cli(cli_bin, *alone[1:], "--json").returncode == 0  # the request alone: classic decode

    # the sequence's served answer edited to one the replay does not give: not reproduced, the server's
    path = Path(seq[seq.index("--sequence") + 1])
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    entry = next(x for x in lines if x.get("id") == d["finding"]["request"])
    entry["served"]["token_ids"] = entry["served"]["token_ids"][:1] + entry["served"]["token_ids"][:-1]
    entry["served"]["text"] = "not what the replay answers"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    again = run_cli(cli_bin, "diagnose", str(job_dir / "rec"), "--finding", d["finding"]["id"], "--json")
    assert again.returncode == 1, again.stderr[-2000:]
    (moved,) = json.loads(again.stdout)["diagnoses"]
    assert moved["phase"] == "server" and "does not reproduce in process" in moved["summary"], moved["summary"]


@pytest.mark.model
@pytest.mark.server
@pytest.mark.slow
def test_processors_on_the_drafter_path_and_a_warm_cache_on_top_are_told_apart(
        llama_pair: Any, cli_bin: str, tmp_path: Path) -> None:
    """The same server with a repetition penalty: mlx-lm's drafter path hands its processors the emitted tokens
    only. The fresh request is diagnosed through its own replay to phase "processors" (the verify block equals the
    chain); its repeat, on a warm cache, leaves classic decode earlier (token 0) than the request alone does: phase
    "server cache" at token 0, the request's own later difference left open with its command."""
    job = {"pairings": [{"name": "llama", "target": llama_pair.target, "draft": llama_pair.draft, "profile": "mlx-lm"}],
           "widths": [2], "sequence": ["fresh", "repeat"], "max_tokens": 32, "self_draft": False, "concurrency": 0,
           "params": {"repetition_penalty": 1.5}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    r = run_cli(cli_bin, "served", "--config", "job.yaml", "--record-dir", "rec", "--quiet", cwd=str(tmp_path))
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    out = run_cli(cli_bin, "diagnose", str(tmp_path / "rec"), "--json")
    assert out.returncode == 1, out.stderr[-3000:]
    diags = _by_id(json.loads(out.stdout))
    fresh, warm = diags["llama/w2/p0"], diags["llama/w2/p0-again"]
    assert fresh["phase"] == "processors" and _step(fresh, 3)["verdict"] == "equal", fresh["summary"]
    assert warm["phase"] == "server cache", warm["summary"]
    later = _step(warm, 1)["data"]["alone_first"]
    assert warm["location"]["token_index"] == 0 < later == fresh["finding"]["token_index"], (warm["location"], later)
    assert any(f"own difference at token {later}" in o for o in warm["open"]), warm["open"]


STALE = {"kind": "stale_trim"}
TIE = {"kind": "tie", "min_rows": 2}
NOISE = {"kind": "noise", "layer": 2, "subop": "mlp", "scale": 0.5}
PREFILL_PATH = {"kind": "prefill_path", "layer": 2, "subop": "mlp", "min_rows": 2, "scale": 8.0}


@pytest.fixture(scope="module")
def served_state_faults(fixture_root: Path, cli_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One served job on real mlx_lm.server processes, four pairings: a rollback that keeps a stale row (the
    cache's trim drops one row fewer than it says), an exact tie in bfloat16 that a verify block breaks the other
    way (every top logit tied with the next id's; one ULP above it in calls of 2+ rows), a forward that is not
    reproducible (noise keyed by the call count in layer 2's MLP), a prefill that takes the verify path (layer 2's
    MLP differs in a call of 2+ rows that continues the prefill where it ended: mlx-lm's speculative path runs the
    prompt's last token in its first verify block, classic decode alone). Each diverges at width 4 (exit 1)."""
    pairs = {"stale": build(fixture_root, "llama-diag-stale", arch="llama", faults=[STALE]),
             "prefill": build(fixture_root, "llama-diag-prefill", arch="llama", faults=[PREFILL_PATH]),
             "tie": build(fixture_root, "llama-diag-tie", arch="llama", dtype="bfloat16", faults=[TIE]),
             "noise": build(fixture_root, "llama-diag-noise", arch="llama", faults=[NOISE])}
    tmp = tmp_path_factory.mktemp("diagnose-state")
    job = {"pairings": [{"name": n, "target": p.target, "draft": p.draft, "profile": "mlx-lm",
                         "trust_remote_code": True} for n, p in pairs.items()],
           "widths": [4], "sequence": ["fresh"], "max_tokens": 24, "prompts": [PROMPT], "self_draft": False,
           "concurrency": 0}
    (tmp / "job.yaml").write_text(yaml.safe_dump(job))
    r = run_cli(cli_bin, "served", "--config", str(tmp / "job.yaml"), "--record-dir", str(tmp / "rec"), "--quiet")
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    return tmp / "rec"


@pytest.mark.model
@pytest.mark.server
@pytest.mark.slow
def test_a_stale_rollback_row_an_exact_bf16_tie_an_unreproducible_forward_and_a_verify_path_prefill_are_named(
        served_state_faults: Path, cli_bin: str, llama_pair: Any) -> None:
    r = run_cli(cli_bin, "diagnose", str(served_state_faults), "--json", env=REAL)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    diags = _by_id(json.loads(r.stdout))
    assert set(diags) == {"stale/w4/p0", "tie/w4/p0", "noise/w4/p0", "prefill/w4/p0"}, list(diags)
    for d in diags.values():
        assert [s["number"] for s in d["steps"]] == list(range(1, 9))

    # the stale row: step 1 reproduces, the verify block equals the chain (step 3), and step 4 finds the rollback
    # before the emitting round left every layer one position long; the phase is the rollback, at that round
    stale = diags["stale/w4/p0"]
    assert stale["phase"] == "rollback", stale["summary"]
    four, loc = _step(stale, 4), stale["location"]
    assert four["verdict"] == "divergent" and _step(stale, 3)["verdict"] == "equal", (four, _step(stale, 3))
    defect = four["data"]["defect"]
    assert defect["tensor"] == "offset" and defect["stale_rows"] == 1 and defect["layers"] == list(range(6)), defect
    assert loc["rollback_round"] < loc["round"] and loc["held"] == loc["rollback_position"] + 1, loc
    assert "kept 1 stale row" in stale["summary"]
    # the witness reads the accept vector from cache offsets, which the stale row shifts: the served rounds,
    # replayed, give classic decode's token there, so step 1 says so and reruns the drafter's path
    one = _step(stale, 1)
    assert (one["data"]["source"], one["data"]["drafter_loaded"]) == ("drafter", True), one
    assert "the drafter's own run decides" in one["evidence"][0] and "--draft-model" in one["command"], one

    # the tie: the first difference is an exact tie in bfloat16 broken the other way by a block of 2+ rows,
    # located past the last layer (the logits), at width 2 from depth 0
    tie = diags["tie/w4/p0"]
    assert tie["phase"] == "tie", tie["summary"]
    assert _step(tie, 7)["data"]["call"] == "exact_tie" and "exact tie in bfloat16" in _step(tie, 7)["evidence"][0]
    assert (tie["location"]["width"], tie["location"]["depth"], tie["location"]["layer"]) == (2, 0, "logits"), \
        tie["location"]

    assert _step(tie, 1)["data"]["source"] == "served rounds" == _step(diags["prefill/w4/p0"], 1)["data"]["source"]

    # the noise: classic decode's own forward is not reproducible; the later steps are skipped for it and the
    # bisect's repeat names the layer where it enters
    noise = diags["noise/w4/p0"]
    assert noise["phase"] == "not reproducible", noise["summary"]
    assert _step(noise, 1)["verdict"] == "inconclusive" and noise["location"]["capture"] == "layers.2", noise
    assert [s["status"] for s in noise["steps"]] == ["ran", "skipped", "skipped", "skipped", "ran", "skipped",
                                                      "skipped", "skipped"]

    # the prefill that takes the verify path: the first token differs; the block of the smallest width differs at
    # depth 0, where it carries the prompt's last token on from the prefill, and equals the chain one position
    # on (a kernel that changes at the width would differ there too); bisected to the fault's layer and sub-op
    pre = diags["prefill/w4/p0"]
    assert pre["phase"] == "prefill", pre["summary"]
    three, loc = _step(pre, 3), pre["location"]
    assert three["verdict"] == "divergent" and three["data"]["prefill_handoff"] is True, three
    assert (loc["token_index"], loc["width"], loc["depth"], loc["layer"], loc["subop"]) == (0, 2, 0, 2, "mlp"), loc
    assert "the prefill takes the verify path" in pre["summary"] and "prompt's last token" in pre["summary"]
    # its scan command shows both sides: depth 0 differs (exit 1), depth 1 equal; the position is the prompt's last
    scan = shlex.split(three["data"]["scan_command"])
    assert loc["position"] == len(scan[scan.index("--prompt-ids") + 1].split(",")) - 1, (loc, scan)
    r = run_cli(cli_bin, *scan[1:], "--json", env=REAL)
    assert r.returncode == 1, r.stdout[-1500:] + r.stderr[-1500:]
    cells = {(c["width"], c["depth"]): c["verdict"] for c in json.loads(r.stdout)["cells"]}
    assert cells == {(2, 0): "divergent", (2, 1): "equal"}, cells
    # and the other faults are not taken for it: their step 3 found no hand-off
    assert not (_step(tie, 3)["data"] or {}).get("prefill_handoff"), _step(tie, 3)

    # every printed command gives its step's verdict: step 4's replay --state exits 1, the noise's bisect 3
    ran = _check_commands(cli_bin, stale) + _check_commands(cli_bin, noise) + _check_commands(cli_bin, pre)
    assert any(c.endswith(" --state") and " --accepts " in c for c in ran), ran
    assert any(c.startswith("specparity bisect") for c in ran), ran

    # the clean path: step 4's own command on a target without the fault (the same builder, no model_file):
    # every rollback restores classic decode's state, byte for byte, so the detector stays silent (exit 0)
    clean = shlex.split(_step(stale, 4)["command"])
    clean[clean.index("--model") + 1] = llama_pair.target
    clean.remove("--trust-remote-code")
    r = run_cli(cli_bin, *clean[1:], "--json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    (req,) = json.loads(r.stdout)["requests"]
    assert req["state_checked"] and req["state"] is None and req["rewinds"] >= 1, req


@pytest.mark.model
@pytest.mark.server
@pytest.mark.build
@pytest.mark.slow
def test_dflash_mlx_and_mlx_dspark_findings_are_diagnosed_through_their_own_loops(
        fixture_root: Path, cli_bin: str, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Live, through the engines' own environments: dflash serve on the float32 hybrid with as many linear value
    as key heads (block 8) leaves classic decode at token 26, after a verify round accepted in part; mlx-dspark
    serve on the bfloat16 DSpark pair takes the other id of an exact bfloat16 tie at token 21. diagnose runs each
    engine's own loop (the record's reproduction), its probe of the block and of every rollback, its bisect, and
    names: dflash-mlx's rollback (the gated-delta recurrent state after a partial accept, its kept rows equal to
    classic decode's) and mlx-dspark's pick (its block and rollbacks equal, the token an exact tie). The drafter-less
    arms of mlx-dspark (its baseline mode, no in-process reproduction) are a tie the record settles. Every printed
    command repeats its step's verdict."""
    from dflash_pairs import dflash_info, pair_dirs
    from fixture_cache import cached

    from builds import warmed
    from specparity.fixtures.dspark import build_dspark_pair

    for name in ("dflash-mlx", "dflash-mlx-mlx-lm-0.32.2"):
        built(name)
    warmed("mlx-dspark")
    hybrid = pair_dirs(dflash_info(fixture_root, "qwen3_5-equal-heads", 8))
    dspark = cached(build_dspark_pair, tmp_path_factory.mktemp("dspark-diag"), "bf16", dtype="bfloat16").to_dict()
    prompt = "The quick brown fox jumps over the lazy dog, and then"
    diags: dict[str, dict[str, Any]] = {}
    for name, pair, profile, width, max_tokens in (("hybrid", hybrid, "dflash-mlx", 8, 48),
                                                   ("bf16", dspark, "mlx-dspark", 3, 32)):
        job = {"pairings": [{"name": name, "target": pair["target"], "draft": pair["draft"], "profile": profile}],
               "widths": [width], "max_tokens": max_tokens, "sequence": ["fresh"], "prompts": [prompt],
               "concurrency": 0}
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(job))
        r = run_cli(cli_bin, "served", "--config", f"{name}.yaml", "--record-dir", name, "--quiet",
                    cwd=str(tmp_path), env=REAL)
        assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
        out = run_cli(cli_bin, "diagnose", str(tmp_path / name), "--json", env=REAL)
        assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
        diags.update(_by_id(json.loads(out.stdout)))
    assert {"hybrid/w8/p0", "bf16/w3/p0"} <= set(diags), list(diags)

    hyb = diags["hybrid/w8/p0"]
    assert hyb["phase"] == "rollback", hyb["summary"]
    loc = hyb["location"]
    assert loc["token_index"] == 26 and loc["rollback_round"] < loc["round"], loc
    assert (loc["layer"], loc["tensor"]) == (0, "state.1") and 0 < loc["accepted"] < 7, loc
    assert _step(hyb, 3)["verdict"] == "equal" and _step(hyb, 4)["verdict"] == "divergent"
    assert "cache state.1" in _step(hyb, 5)["evidence"][0], _step(hyb, 5)
    assert [x["label"] for x in _step(hyb, 8)["data"]["releases"]] == [
        "dflash-mlx 0.1.8 on mlx-lm 0.31.3", "dflash-mlx 0.1.8 on mlx-lm 0.32.2"], _step(hyb, 8)

    tie = diags["bf16/w3/p0"]
    assert tie["phase"] == "tie" and _step(tie, 7)["data"]["call"] == "exact_tie", tie["summary"]
    assert [_step(tie, n)["verdict"] for n in (2, 3, 4)] == ["equal"] * 3, tie["steps"]
    assert tie["location"]["token_index"] == 21, tie["location"]
    for arm in ("baseline-start", "baseline-end"):
        base = diags[f"bf16/{arm}/p0"]
        assert base["phase"] == "tie" and _step(base, 1)["status"] == "not_run", base["summary"]

    ran = _check_commands(cli_bin, hyb) + _check_commands(cli_bin, tie)
    assert {shlex.split(c)[1] for c in ran if c.startswith("specparity")} == {"replay", "probe", "bisect"}, ran
