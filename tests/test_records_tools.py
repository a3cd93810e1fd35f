"""records compare / merge / show on real served records (real mlx_lm.server processes, the CLI).

One small job (widths 2 and 4, a fresh request and a two-turn chat, 24
tokens) runs unsharded on the clean embedded pair, as --shard 1/2 and 2/2,
and unsharded on a pair whose MLP misbehaves on blocks of 4+ rows: enough
to prove that the merge equals the unsharded record and that compare finds
the regression with its width and first index, and stays silent on a clean
night.
"""

from __future__ import annotations

import json
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import run_cli
from specparity.fixtures import FixtureInfo
from specparity.harness.shard import Shard, parse_shard, split
from specparity.records.compare import compare_records
from specparity.records.record import RecordSink, read_record
from specparity.errors import InputError, UsageError
from specparity.harness.plan import ArmKind

JOB = {"widths": [2, 4], "max_tokens": 24, "sequence": ["fresh", "multi-turn"], "concurrency": 0,
       "self_draft": False,
       "prompts": ["Speculative decoding drafts several tokens with a small model and verifies them",
                   "The cache holds keys and values for every position.",
                   "def add(a, b):\n    return a + b\n", "The quick brown fox jumps over the lazy dog."]}
# process details and timings: everything else of a merged record must equal the unsharded one
VOLATILE = {"seconds", "wall_seconds", "server_seconds", "generation_seconds", "server", "raw",
            "reference_cost",  # what the classic reference cost: each shard computes its own baselines' answers
            "memory"}  # what each shard's processes held, measured


def _served(cli_bin, tmp: Path, pair, out: str, *extra: str) -> Path:
    home = {"SPECPARITY_HOME": str(tmp / "home")}
    cfg = tmp / "job.yaml"
    if not cfg.exists():
        cfg.write_text(json.dumps(JOB))
    r = run_cli(cli_bin, "served", "--config", str(cfg), "--model", pair.target, "--draft-model", pair.draft,
                "--record-dir", str(tmp / out), "-q", *extra, env=home)
    assert r.returncode in (0, 1), r.stdout + r.stderr
    return tmp / out


@pytest.fixture(scope="module")
def served_records(tmp_path_factory: pytest.TempPathFactory, llama_pair: FixtureInfo, scaled_rows4_pair: FixtureInfo,
                   cli_bin: str) -> dict[str, Path]:
    """Records of the clean job unsharded, as two shards, and of the fault pair."""
    tmp = tmp_path_factory.mktemp("records-tools")
    clean, fault = llama_pair, scaled_rows4_pair
    full = _served(cli_bin, tmp, clean, "full")
    s1 = _served(cli_bin, tmp, clean, "s1", "--shard", "1/2")
    s2 = _served(cli_bin, tmp, clean, "s2", "--shard", "2/2")
    bad = _served(cli_bin, tmp, fault, "fault")
    return {"tmp": tmp, "full": full, "s1": s1, "s2": s2, "fault": bad}


def _only(d: Path) -> Path:
    (md,) = sorted(d.glob("*.md"))
    return md


def _strip(obj):
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k not in VOLATILE}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


# -- the split -------------------------------------------------------------------------------------
def test_shard_split_is_round_robin_keeps_baselines_and_covers_every_arm_once():
    base, width = ArmKind.BASELINE, ArmKind.WIDTH
    plans = [("a", [("baseline-start", base), ("w2", width), ("w3", width), ("w4", width), ("baseline-end", base)]),
             ("b", [("baseline-start", base), ("w2", width), ("baseline-end", base)]),
             ("c", [("baseline-start", base), ("baseline-end", base)])]
    s1, s2 = split(plans, Shard(1, 2)), split(plans, Shard(2, 2))
    # the k-th non-baseline arm across pairings goes to shard k % n + 1; baselines-only pairing c: shard 1
    assert s1 == {"a": ["baseline-start", "w2", "w4", "baseline-end"], "c": ["baseline-start", "baseline-end"]}
    assert s2 == {"a": ["baseline-start", "w3", "baseline-end"], "b": ["baseline-start", "w2", "baseline-end"]}
    assert split(plans, Shard(1, 1)) == {name: [n for n, _ in arms] for name, arms in plans}
    assert split(plans, Shard(2, 2)) == s2  # deterministic
    assert parse_shard("2/3") == Shard(2, 3)
    for bad in ("0/2", "3/2", "1", "a/b", "1/0"):
        with pytest.raises(InputError, match="^shard ") as err:  # the library's word; the command's flag
            parse_shard(bad)
        assert err.value.as_flag().startswith("--shard ")


# -- merge -----------------------------------------------------------------------------------------
@pytest.mark.model
@pytest.mark.server
@pytest.mark.slow
def test_shards_merged_equal_the_unsharded_record_apart_from_timings(served_records, cli_bin, tmp_path):
    full, s1, s2 = (served_records[k] for k in ("full", "s1", "s2"))
    r1, _, _ = read_record(_only(s1))
    r2, _, _ = read_record(_only(s2))
    assert r1.summary is not None and r2.summary is not None
    assert r1.summary["shard"]["arms"] == {"cli": ["baseline-start", "w2", "baseline-end"]}
    assert r2.summary["shard"]["arms"] == {"cli": ["baseline-start", "w4", "baseline-end"]}
    r = run_cli(cli_bin, "records", "merge", str(s2), str(s1), "--out", str(tmp_path / "merged"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.rstrip().endswith("verdict: match")
    f_rec, f_id, f_rows = read_record(_only(full))
    m_rec, m_id, m_rows = read_record(_only(tmp_path / "merged"))
    assert m_rec.summary is not None and f_rec.summary is not None
    assert m_rec.kind == "served" and m_rec.status == "complete" and "shard" not in m_rec.summary
    assert (m_rec.verdict, m_rec.exit_code, m_rec.title) == (f_rec.verdict, f_rec.exit_code, f_rec.title)
    # verdicts, sha256 groups, findings, texts, evidence: the whole summary and every JSONL line, in order
    assert _strip(m_rec.summary) == _strip(f_rec.summary)
    assert m_rec.summary["pairings"][0]["groups"] == [["classic decode", "baseline-start", "w2", "w4", "baseline-end"]]
    assert list(m_rows) == list(f_rows) and _strip(m_rows) == _strip(f_rows)
    assert m_rows["cli-w4"][1]["id"] == "chat-1" and m_rows["cli-w4"][2]["text"]
    assert [s["index"] for s in m_id["shards"]] == [1, 2]
    assert ET.parse(Path(m_rec.path).parent / "data" / m_rec.name / "chart-cli.svg").getroot().tag.endswith("svg")
    assert "chart-cli.svg" in Path(m_rec.path).read_text()


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    (data,) = (dst / "data").iterdir()
    return data


@pytest.mark.model
@pytest.mark.server
@pytest.mark.slow
def test_merge_refuses_mixed_missing_duplicate_and_unsharded_records(served_records, cli_bin, tmp_path):
    s1, s2, full = served_records["s1"], served_records["s2"], served_records["full"]
    other_job = _copy(s2, tmp_path / "other-job")
    rep = json.loads((other_job / "report.json").read_text())
    rep["summary"]["job"]["max_tokens"] = 99
    (other_job / "report.json").write_text(json.dumps(rep))
    other_mlx = _copy(s2, tmp_path / "other-mlx")
    ident = json.loads((other_mlx / "identity.json").read_text())
    ident["mlx"] = "0.0.1"
    (other_mlx / "identity.json").write_text(json.dumps(ident))
    cases = [((s1, other_job), f"{other_job}: a different job config"),
             ((s1, other_mlx), f"{other_mlx}: a different identity .*mlx"),
             ((s1,), "shard 2/2 missing"),
             ((s1, s1), "given twice"),
             ((s1, full), "not a shard")]
    for args, msg in cases:
        r = run_cli(cli_bin, "records", "merge", *map(str, args), "--out", str(tmp_path / "never"))
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert r.stderr.startswith("Error: ") and "Traceback" not in r.stderr
        assert re.search(msg, r.stderr), (msg, r.stderr)
    assert not (tmp_path / "never").exists() or not list((tmp_path / "never").glob("*.md"))


# -- compare ---------------------------------------------------------------------------------------
@pytest.mark.model
@pytest.mark.server
@pytest.mark.slow
def test_compare_a_clean_night_with_itself_and_its_merge_is_no_regression(served_records, cli_bin):
    full = served_records["full"]
    r = run_cli(cli_bin, "records", "compare", str(full), str(full), "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["verdict"] == "match" and d["exit_code"] == 0 and d["parts_compared"] >= 4
    assert all(d[c] == [] for c in ("regressed", "fixed", "changed", "evidence", "identity", "coverage"))


@pytest.mark.model
@pytest.mark.server
@pytest.mark.slow
def test_compare_reports_the_regression_with_width_and_first_index_then_the_fix(served_records, cli_bin):
    full, fault = served_records["full"], served_records["fault"]
    r = run_cli(cli_bin, "records", "compare", str(full), str(fault))
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout.rstrip().endswith("verdict: diverged")
    rep = compare_records(_only(full), _only(fault))
    reg = {c.part: c for c in rep.of("regressed")}
    assert "cli / w4 / p0" in reg and "cli / * / *" in reg
    assert not any("/ w2 /" in p or "baseline" in p for p in reg)  # below the fault's 4 rows: still a match
    _, _, rows = read_record(_only(fault))
    idx = rows["cli-w4"][0]["divergence"]["token_index"]
    assert reg["cli / w4 / p0"].old == "match" and reg["cli / w4 / p0"].new == "diverged"
    assert f"width 4, first divergence at token {idx}," in reg["cli / w4 / p0"].detail
    assert f"cli / w4 / p0: match -> diverged (width 4, first divergence at token {idx}" in r.stdout
    # the fault pair is another checkpoint: the fingerprint change is named
    assert any(c.part == "cli target fingerprint" for c in rep.of("identity"))
    back = compare_records(_only(fault), _only(full))
    assert back.exit_code == 0 and "cli / w4 / p0" in {c.part for c in back.of("fixed")}


@pytest.mark.model
@pytest.mark.server
@pytest.mark.slow
def test_compare_names_evidence_identity_and_coverage_changes_and_refuses_other_kinds(served_records, tmp_path):
    full = served_records["full"]
    new = _copy(full, tmp_path / "new")
    lines = [json.loads(x) for x in (new / "cli-w2.jsonl").read_text().splitlines()]
    # no witnessed call and a decline line: what a server that stopped drafting would leave
    lines[0]["evidence"].update(verify_calls=0, draft_calls=0, sources=[], declined=True,
                                lines=["specparity-gate: DECLINE width=2"])
    (new / "cli-w2.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    ident = json.loads((new / "identity.json").read_text())
    ident["mlx_lm"] = "9.9.9"
    (new / "identity.json").write_text(json.dumps(ident))
    (new / "cli-w4.jsonl").unlink()  # w4's requests gone: coverage
    rep = compare_records(_only(full), new)
    assert rep.exit_code == 0, rep.lines()  # none of these is a regression by itself
    ev = [(c.part, c.old, c.new) for c in rep.of("evidence")]
    assert ("cli / w2 / p0", "engaged", "not engaged") in ev
    assert ("cli / w2 / p0", "no decline line", "decline line") in ev
    assert [(c.part, c.new) for c in rep.of("identity")] == [("mlx_lm", "9.9.9")]
    assert {c.part for c in rep.of("coverage")} >= {"cli / w4 / p0", "cli / w4 / -"}
    # a different kind of record: a usage error naming the file
    with RecordSink(tmp_path / "probe", "probe", "probe: x", {}) as sink:
        from specparity.verdicts import Verdict

        class R:
            verdict, exit_code = Verdict.EQUAL, 0

            def to_dict(self):
                return {"verdict": self.verdict, "exit_code": 0}

            def lines(self):
                return []
        sink.finish(R(), [])
    with pytest.raises(UsageError, match="a probe record, but .* is a served record"):
        compare_records(_only(full), _only(tmp_path / "probe"))


# -- show and the chart ----------------------------------------------------------------------------
@pytest.mark.model
@pytest.mark.server
@pytest.mark.slow
def test_show_prints_arms_by_requests_and_groups_and_the_chart_marks_the_first_divergence(
        served_records, cli_bin):
    fault = served_records["fault"]
    r = run_cli(cli_bin, "records", "show", str(fault))
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    head = next(i for i, ln in enumerate(out) if ln.split()[:2] == ["arm", "width"])
    assert out[head].split() == ["arm", "width", "p0", "chat-1", "chat-2", "arm", "verdict"]
    row = {ln.split()[0]: ln.split()[1:] for ln in out[head + 1:head + 5]}
    assert row["w2"] == ["2", "match", "match", "match", "match"]
    assert row["w4"][0] == "4" and row["w4"][1] == "diverged" and row["w4"][-1] == "diverged"
    assert any(ln.strip().startswith("sha256 2 groups: {classic decode, baseline x2, w2} {w4}") for ln in out)
    assert any(ln.strip().startswith("w4 p0: diverged: differs from classic decode: first difference at token")
               for ln in out)
    rec, _, rows = read_record(_only(fault))
    svg = ET.parse(Path(rec.path).parent / "data" / rec.name / "chart-cli.svg").getroot()
    titles = [t.text or "" for t in svg.iter("{http://www.w3.org/2000/svg}title")]  # an empty one is None
    idx = rows["cli-w4"][0]["divergence"]["token_index"]
    assert f"w4 p0: diverged at token {idx}" in titles
    assert "w2 p0: match" in titles and not any(t.startswith("w2") and "diverged" in t for t in titles)
    # the clean record's chart has no divergence mark at all
    crec, _, _ = read_record(_only(served_records["full"]))
    clean = (Path(crec.path).parent / "data" / crec.name / "chart-cli.svg").read_text()
    assert "diverged at" not in clean and "<circle" not in clean
