"""records compare / merge / show on real served records (real mlx_lm.server processes, the CLI).

One small job (widths 2 and 4, a fresh request and a two-turn chat, 24
tokens) runs unsharded on the clean embedded pair, as --shard 1/2 and 2/2,
and unsharded on a pair whose MLP misbehaves on blocks of 4+ rows: enough
to prove that the merge equals the unsharded record and that compare finds
the regression with its width and first index, and stays silent on a clean
night.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
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
            "memory",  # what each shard's processes held, measured
            "time", "request_limits", "limit_seconds"}  # where each run's time went; limits follow measured times


def _served(cli_bin, tmp: Path, pair, out: str, *extra: str) -> Path:
    home = {"SPECPARITY_HOME": str(tmp / "home")}
    cfg = tmp / "job.yaml"
    if not cfg.exists():
        cfg.write_text(json.dumps(JOB))
    r = run_cli(cli_bin, "served", "--config", str(cfg), "--model", pair.target, "--draft-model", pair.draft,
                "--record-dir", str(tmp / out), "-q", *extra, env=home)
    assert r.returncode in (0, 1), r.stdout + r.stderr
    if "--json" in extra:  # what it printed (run_cli validated it against served.schema.json)
        (tmp / f"{out}.json").write_text(r.stdout)
    return tmp / out


@pytest.fixture(scope="module")
def served_records(tmp_path_factory: pytest.TempPathFactory, llama_pair: FixtureInfo, scaled_rows4_pair: FixtureInfo,
                   cli_bin: str) -> dict[str, Path]:
    """Records of the clean job unsharded, as two shards, and of the fault pair (its --json kept)."""
    tmp = tmp_path_factory.mktemp("records-tools")
    clean, fault = llama_pair, scaled_rows4_pair
    full = _served(cli_bin, tmp, clean, "full")
    s1 = _served(cli_bin, tmp, clean, "s1", "--shard", "1/2")
    s2 = _served(cli_bin, tmp, clean, "s2", "--shard", "2/2")
    bad = _served(cli_bin, tmp, fault, "fault", "--json")  # the text is in its record: served_markdown
    return {"tmp": tmp, "full": full, "s1": s1, "s2": s2, "fault": bad, "fault_json": tmp / "fault.json"}


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


@pytest.mark.model
@pytest.mark.server
@pytest.mark.slow
def test_merge_keeps_each_shards_diagnoses_beside_their_requests(served_records, cli_bin, tmp_path):
    s1, s2 = served_records["s1"], _copy(served_records["s2"], tmp_path / "s2").parent.parent
    from specparity.diagnose.findings import Finding
    from specparity.diagnose.tree import length_diagnosis

    f = Finding("cli/w4/p0", "cli", "w4", "p0", 4, 3, "t", "d", 4, "classic decode", "a length finding", max_tokens=4,
                completion_tokens=6, length=True)
    line = {"finding": f.id, "key": "k", "diagnosed_in": _only(s2).stem, "diagnosis": length_diagnosis(f).to_dict()}
    (s2 / "data" / _only(s2).stem / "diagnoses.jsonl").write_text(json.dumps(line) + "\n")
    r = run_cli(cli_bin, "records", "merge", str(s2), str(s1), "--out", str(tmp_path / "merged"))
    assert r.returncode == 0, r.stdout + r.stderr
    merged = _only(tmp_path / "merged")
    assert read_record(merged)[2]["diagnoses"] == [line]


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
    (new / "cli-w4.jsonl").unlink()
    # w4's requests gone while report.json counts them: a damaged record, never read as fewer parts (issue 30.11)
    with pytest.raises(UsageError, match=r"cli-w4.jsonl: missing, where report.json counts \d+ finished parts"):
        compare_records(_only(full), new)
    # a record whose w4 sent no request (its counts say so): coverage
    report = json.loads((new / "report.json").read_text())
    report["arms"].pop("cli-w4")
    for a in report["summary"]["pairings"][0]["arms"]:
        if a["name"] == "w4":
            a.update(requests=0, verdicts={})
    (new / "report.json").write_text(json.dumps(report))
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


# -- --json carries the whole result (issue 28) ----------------------------------------------------
# a number the text prints: not inside a name (w4, sha256) nor a word's suffix (top-2)
_NUMBER = re.compile(r"(?<![\w.-])-?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w.])")
_LIST = re.compile(r"\[[^\[\]]*\]")


def _text_block(md: Path) -> list[str]:
    """What ``served`` printed: its record's body is the same report's lines (records.served.served_markdown)."""
    body = md.read_text().split("```")[1]
    return body.strip("\n").splitlines()


def _values(obj) -> list:
    """Every scalar and list inside ``obj``."""
    if isinstance(obj, dict):
        return [v for x in obj.values() for v in _values(x)]
    if isinstance(obj, list):
        return [obj] + [v for x in obj for v in _values(x)]
    return [obj]


def _number_in(token: str, values: list) -> bool:
    nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if re.fullmatch(r"-?\d+", token) and int(token) in nums:
        return True
    x = float(token)
    # printed as %.4g (margins), %.3f (acceptance), %.2f (seconds) or whole
    return any(f"{v:.4g}" == token or f"{v:.3f}" == token or f"{v:.2f}" == token or v == x for v in nums)
# -- records html (issue 28): the page, on the real records above -----------------------------------
class _Page(HTMLParser):
    """Every element as (tag, attributes, text inside it up to the next tag)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def _parse(page: str) -> _Page:
    p = _Page()
    p.feed(page)
    return p


def _arm_verdicts(md: Path) -> dict[str, str]:
    rec, _, _ = read_record(md)
    assert rec.summary is not None
    return {a["name"]: a["verdict"] for a in rec.summary["pairings"][0]["arms"]}


@pytest.mark.model
@pytest.mark.server
@pytest.mark.slow
def test_served_json_carries_every_fact_its_text_prints_for_a_diverged_request(served_records):
    """The fault run's --json (validated against served.schema.json as it ran) against the text the same
    run rendered: for every request the text lists as diverged, its arm line, its reason (first difference
    with token index and character offset, both sides' tokens, pieces and snippets, logprobs, margins, the
    tie label), its reproduction and the finding naming its cause are fields of that request in the JSON."""
    from specparity.harness.results import format_groups

    out = json.loads(served_records["fault_json"].read_text())
    assert list(out)[:2] == ["verdict", "exit_code"] and out["verdict"] == "diverged" and out["exit_code"] == 1
    text = _text_block(_only(served_records["fault"]))
    assert text[-1] == f"verdict: {out['verdict']}"
    (p,) = out["pairings"]
    arms = {a["name"]: a for a in p["arms"]}
    checked = 0
    arm = None
    for i, line in enumerate(text):
        m = re.match(r"^  (\S+)\s+(\w+)\s+(?:width (\d+) \((\w+)=(\d+)\) )?(\d+) requests(?:, acceptance ([\d.]+))?",
                     line)
        if m and m.group(1) in arms:
            arm = arms[m.group(1)]
            assert (m.group(2), len(arm["requests"])) == (arm["verdict"], int(m.group(6)))
            if m.group(3):
                assert (int(m.group(3)), m.group(4), int(m.group(5))) == (arm["width"], arm["setting_name"],
                                                                          arm["setting"])
            if m.group(7):
                assert m.group(7) == f"{arm['acceptance']:.3f}"
            assert line[m.end():] == (f": {arm['reason']}" if arm["reason"] else "")
            continue
        m = re.match(r"^    (\S+) \((\S+)\): (diverged): (.*)$", line)
        if not m:
            continue
        assert arm is not None
        rq = next(r for r in arm["requests"] if r["id"] == m.group(1))
        reason = m.group(4)
        assert (rq["kind"], rq["verdict"], rq["reason"]) == (m.group(2), m.group(3), reason)
        d = rq["classic"]
        assert d is not None and rq["divergence"] == d  # the verdict rests on classic decode
        where = re.search(r"first difference at token (\d+), char (\d+)", reason)
        assert where and (int(where.group(1)), int(where.group(2))) == (d["token_index"], d["char_offset"])
        counts = re.search(r"\(of (\d+) classic decode / (\d+) (\S+) tokens\)", reason)
        assert counts and (int(counts.group(1)), int(counts.group(2)), counts.group(3)) == (
            d["reference_token_count"], d["other_token_count"], d["other"])
        strings = [d["text_before"], d["reference_snippet"], d["other_snippet"]]
        for s in strings:
            assert repr(s) in reason, s
        rest = reason
        for s in strings:
            rest = rest.replace(repr(s), "")
        # every list the text prints (tokens before, each side's tokens, each side's pieces) is a field
        for lst in _LIST.findall(rest):
            value = ast.literal_eval(lst)
            assert value in (d["tokens_before"], d["reference_tokens"], d["other_tokens"], d["reference_pieces"],
                             d["other_pieces"]), lst
        rest = _LIST.sub("", rest)
        margins = re.search(r"top-2 margin there (\S+) \(classic decode\) / (\S+) \(\S+\) nats", reason)
        assert margins and margins.groups() == tuple("n/a" if v is None else f"{v:.4g}"
                                                     for v in (d["margin_reference"], d["margin_other"]))
        if "logprobs bitwise equal before it" in reason:
            assert d["logprobs_equal_before"] is True
        first_lp = re.search(r"logprobs first differ at token (\d+)", reason)
        if first_lp:
            assert d["logprobs_equal_before"] is False and int(first_lp.group(1)) == d["first_logprob_diff"]
        cold = (rq["reference"] or {}).get("cold") or {}
        if reason.endswith("gives this same answer: not state-dependent"):
            assert cold["equals_classic"] is False and f"; {cold['source']} gives this same answer" in reason
        if "exact tie" in reason or rq["tie"] is not None:
            assert rq["tie"] is not None and str(rq["tie"]["classic_token"]) in reason
        # and every other number it prints is one of the request's fields
        for token in _NUMBER.findall(rest.replace("top-2", "")):
            assert _number_in(token, _values(rq)), (token, reason)
        # the next line: the command that reproduces it, or why there is none
        nxt = text[i + 1]
        rep = rq["reproduction"]
        assert rep is not None
        if rep.get("command"):
            assert nxt == f"      reproduce in process: {rep['command']}" and rq["replay"] == rep["command"]
        else:
            assert nxt == f"      not reproducible in process: {rep['reason']}"
        # the finding that names its cause, as fields: the request's cause and the pairing's causes entry
        cause = next(c for c in p["causes"] if c["request"] == rq["id"] and arm["name"] in c["arms"])
        assert f"  finding: {cause['finding']}" in text and rq["cause"] == cause["cause"]
        at = re.search(r"\(first at token (\d+)\)", cause["finding"])
        assert at and int(at.group(1)) == cause["first_token"] <= d["token_index"]
        assert cause["finding"].endswith(f": {cause['cause']}") and cause["cause"].startswith(cause["whom"])
        # the evidence that the drafter ran, per request
        assert rq["evidence"]["engaged"] is True and rq["evidence"]["lines"]
        checked += 1
    assert checked >= 1, "\n".join(text)
    # the pairing's lines: groups per arm and per request, findings, verdict
    assert f"  {format_groups(p['groups'])}" in text
    for rid, gs in p["request_groups"].items():
        if len(gs) > 1:
            assert f"    request {rid}: {format_groups(gs)}" in text
    assert [ln.removeprefix("  finding: ") for ln in text if ln.startswith("  finding: ")] == p["findings"]
    assert f"  pairing verdict: {p['verdict']}" + (f" ({p['reason']})" if p["reason"] else "") in text
    c = p["reference_cost"]
    assert (f"  classic reference: {c['computed']} distinct requests decoded in process ({c['tokens']} tokens,"
            f" {c['seconds']:.2f} s, model load {c['load_seconds']:.2f} s), {c['hits']} answered from its cache"
            in text)


@pytest.mark.model
@pytest.mark.server
@pytest.mark.slow
def test_html_page_of_a_diverged_record_has_its_grid_drilldown_reproduction_and_loads_nothing(served_records):
    from specparity.records.html import load_series, render

    fault = _only(served_records["fault"])
    page = render(load_series([fault]))
    doc = _parse(page)
    cells = {a["data-arm"]: a["data-verdict"] for tag, a in doc.elements if tag == "a" and "data-verdict" in a}
    assert cells == _arm_verdicts(fault) and cells["w4"] == "diverged" and cells["w2"] == "match"
    _, _, rows = read_record(fault)
    p0 = rows["cli-w4"][0]
    d = p0["divergence"]
    text = "".join(doc.text)
    assert f"first difference at token {d['token_index']}" in text
    assert f"{d['token_index']} first difference" in text  # the token table's row
    assert p0["reproduction"]["command"] in text and "copy" in text
    assert f"{d['margin_reference']:.4g} nats (classic decode)" in text
    # self-contained: no URL, no external resource, one script allowed by its hash and nothing else
    assert not re.search(r"(?:src|href)=\"(?!#)", page) and "http://" not in page.replace(
        'xmlns="http://www.w3.org/2000/svg"', "") and "https://" not in page
    csp = next(a["content"] for t, a in doc.elements if t == "meta" and a.get("http-equiv"))
    assert "default-src 'none'" in (csp or "") and "script-src 'sha256-" in (csp or "")
    assert [t for t, _ in doc.elements].count("script") == 1


@pytest.mark.model
@pytest.mark.server
@pytest.mark.slow
def test_merge_and_junit_json_follow_their_schemas(served_records, cli_bin, tmp_path):
    """records merge --json is the whole merged result (served.schema.json, every request with its cause);
    records junit --json its counts (records-junit.schema.json). run_cli validates both, and the merged
    record's files."""
    r = run_cli(cli_bin, "records", "merge", str(served_records["s1"]), str(served_records["s2"]),
                "--out", str(tmp_path / "merged"), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["verdict"] == "match" and out["record"].endswith(".md")
    assert all(isinstance(a["requests"], list) and all("cause" in q for q in a["requests"])
               for a in out["pairings"][0]["arms"])
    j = run_cli(cli_bin, "records", "junit", str(served_records["fault"]), "--out", str(tmp_path / "p.xml"), "--json")
    assert j.returncode == 0, j.stderr
    counts = json.loads(j.stdout)
    assert counts["failures"] >= 1 and counts["tests"] > counts["failures"]


@pytest.mark.model
@pytest.mark.server
@pytest.mark.slow
def test_html_escapes_every_text_a_record_carries_and_bears_missing_optional_fields(served_records, tmp_path):
    from specparity.records.html import load_series, render

    data = _copy(served_records["fault"], tmp_path / "evil")
    evil = '</div><script>alert(1)</script><img src=x onerror="alert(2)">"\'&'
    lines = [json.loads(x) for x in (data / "cli-w4.jsonl").read_text().splitlines()]
    p0 = lines[0]
    p0["text"] = p0["completion"]["text"] = evil
    p0["reason"] = p0["divergence"]["reference_snippet"] = p0["divergence"]["text_before"] = evil
    p0["request"]["body"]["prompt"] = evil
    p0["reproduction"] = {"command": "specparity replay " + evil, "reason": None}
    p0["tie"] = {"kind": evil, "threshold": 0.1, "margin_a": None, "margin_b": 0.2, "dtype": evil}
    # the optional fields an older or newer record may lack: the page shows what is there
    for r in lines[1:]:
        for key in ("divergence", "classic", "baseline", "evidence", "reproduction", "replay", "tie", "reference"):
            r.pop(key, None)
        r.get("completion", {}).pop("top", None)
    (data / "cli-w4.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    page = render(load_series([data]))
    doc = _parse(page)
    assert [t for t, _ in doc.elements].count("script") == 1 and "img" not in [t for t, _ in doc.elements]
    assert not [a for _, a in doc.elements if any(k.startswith("on") for k in a)]
    assert "alert(1)" in "".join(doc.text)  # shown, as text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


@pytest.mark.model
@pytest.mark.server
@pytest.mark.slow
def test_records_html_over_two_nights_shows_when_each_cell_changed(served_records, cli_bin, tmp_path):
    clean, fault = _only(served_records["full"]), _only(served_records["fault"])
    out = tmp_path / "report" / "nights.html"
    r = run_cli(cli_bin, "records", "html", str(fault), str(clean), "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["records"] == [clean.stem, fault.stem] and summary["newest_verdict"] == "diverged"
    assert (summary["verdict"], summary["exit_code"]) == ("pass", 0)  # the process's: the page was written
    doc = _parse(out.read_text())
    changed = [a for t, a in doc.elements if t == "td" and "changed" in (a.get("class") or "")]
    assert [a["data-verdict"] for a in changed] == ["diverged"]  # w4: match, then diverged
    assert f"{fault.stem}: cli / w4 request p0:" in "".join(doc.text)
    again = run_cli(cli_bin, "records", "html", str(clean), "--out", str(out))
    assert again.returncode == 2 and "exists (pass --force" in again.stderr


@pytest.mark.model
@pytest.mark.server
@pytest.mark.slow
def test_records_html_reads_an_earlier_nights_diagnoses(served_records, cli_bin, tmp_path):
    """The history keeps of an earlier night's diagnosis its finding and phase, and each line it keeps is checked
    whole again: the page of a folder whose earlier night was diagnosed is written (it was exit 2, "phase:
    missing", on the nightly job's second night)."""
    from specparity.diagnose.findings import Finding
    from specparity.diagnose.tree import length_diagnosis

    data = _copy(served_records["full"], tmp_path / "earlier")
    f = Finding("cli/w4/p0", "cli", "w4", "p0", 4, 3, "t", "d", 4, "classic decode", "a length finding", max_tokens=4,
                completion_tokens=6, length=True)
    line = {"finding": f.id, "key": "k", "diagnosed_in": data.name, "diagnosis": length_diagnosis(f).to_dict()}
    (data / "diagnoses.jsonl").write_text(json.dumps(line) + "\n")
    out = tmp_path / "nights.html"
    r = run_cli(cli_bin, "records", "html", str(_only(served_records["fault"])), str(_only(tmp_path / "earlier")),
                "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["records"] == [data.name, _only(served_records["fault"]).stem]


@pytest.mark.model
@pytest.mark.server
@pytest.mark.slow
@pytest.mark.build
def test_html_report_in_headless_chromium_grid_drilldown_and_screenshot(served_records, chromium, repo_root,
                                                                         tmp_path):
    """The page of the clean night then the diverged one, in a real browser: no console error, the grid
    shows the record's verdicts, a drill-down opens on the first differing token; the screenshot is kept
    in test-artifacts/ (CI keeps that folder)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    from specparity.records.html import write_html

    fault = _only(served_records["fault"])
    page = write_html([_only(served_records["full"]), fault], tmp_path / "parity.html").path
    browser, driver_bin = chromium
    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for a in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,900"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=opts, service=Service(driver_bin))
    try:
        driver.get(page.resolve().as_uri())
        cells = {c.get_attribute("data-arm"): c.text.split("\n")[0]
                 for c in driver.find_elements(By.CSS_SELECTOR, "#grid a.cell")}
        assert cells == _arm_verdicts(fault)
        driver.find_element(By.CSS_SELECTOR, '#grid a.cell[data-arm="w4"]').click()
        arm = driver.find_element(By.ID, driver.find_element(
            By.CSS_SELECTOR, '#grid a.cell[data-arm="w4"]').get_attribute("data-open"))
        assert arm.get_attribute("open") is not None
        req = arm.find_element(By.CSS_SELECTOR, 'details.req[data-request="p0"]')
        assert req.get_attribute("open") is None
        req.find_element(By.TAG_NAME, "summary").click()
        first = req.find_elements(By.CSS_SELECTOR, "table.tokens td.first")
        _, _, rows = read_record(fault)
        d = rows["cli-w4"][0]["divergence"]
        assert first[0].is_displayed()
        assert [c.text for c in first[:3]] == [f"{d['token_index']} first difference", str(d["reference_tokens"][0]),
                                             str(d["other_tokens"][0])]
        req.find_element(By.CSS_SELECTOR, "button.copy").click()
        driver.execute_script("arguments[0].scrollIntoView()", req)
        logs = driver.get_log("browser")
        assert not logs, logs  # the script ran under its CSP hash, nothing was blocked or thrown
        shots = repo_root / "test-artifacts"
        shots.mkdir(exist_ok=True)
        assert driver.save_screenshot(str(shots / "records-html-drilldown.png"))
        height = int(driver.execute_script("return document.documentElement.scrollHeight"))
        driver.set_window_size(1280, min(height + 200, 8000))  # the whole page in one image
        driver.execute_script("window.scrollTo(0, 0)")
        assert driver.save_screenshot(str(shots / "records-html-page.png"))
    finally:
        driver.quit()


# -- compare across engines (issue 27's nightly-engines.yaml) ----------------------------------------
def _engines_night(root: Path, w3: str, mlx_dspark_version: str) -> Path:
    """A served record of two pairings on two engines' profiles (mlx-dspark, dflash-mlx), written through the
    record writer as served writes one: each pairing's arms and requests, its environment's packages."""
    from specparity.harness.plan import request_stem
    from specparity.records.served import ARMS
    from specparity.records.writer import RecordWriter

    pairings = {"mlx-dspark-qwen3": ("mlx-dspark", {"w3": w3}), "dflash-mlx-qwen3": ("dflash-mlx", {"w3": "match"})}
    identity = {"specparity": "1", "environments": {
        "mlx-dspark-qwen3": {"packages": {"mlx-dspark": mlx_dspark_version, "mlx-lm": "0.31.3"}},
        "dflash-mlx-qwen3": {"packages": {"dflash-mlx": "0.1.8", "mlx-lm": "0.31.3"}}}}
    w = RecordWriter(root, "served", identity)
    summary = []
    for name, (profile, verdicts) in pairings.items():
        arms = []
        for arm, word in {"baseline-start": "match", **verdicts}.items():
            a = {"name": arm, "kind": "baseline" if arm.startswith("baseline") else "width",
                 "width": None if arm.startswith("baseline") else 3, "setting": None, "verdict": word, "requests": 1}
            arms.append(a)
            w.append(ARMS, {"pairing": name, **a})
            div = {"token_index": 9, "char_offset": 31} if word == "diverged" else None
            w.append(request_stem(name, arm), {"id": "p0", "kind": "fresh", "verdict": word, "divergence": div,
                                               "reason": ""})
        top = "diverged" if "diverged" in verdicts.values() else "match"
        summary.append({"name": name, "profile": profile, "verdict": top, "arms": arms})
    verdict = "diverged" if w3 == "diverged" else "match"
    w.write_json("report.json", {"kind": "served", "title": "t", "argv": [], "status": "complete",
                                 "verdict": verdict, "exit_code": int(verdict == "diverged"),
                                 "summary": {"pairings": summary}})
    return w.finish("# served\n")


def test_compare_of_two_engine_nights_lists_what_changed_per_engine(tmp_path, capsys) -> None:
    """Each change is labelled with its pairing's profile's engine (mlx-dspark's w3 request, its pairing, its
    environment's package), grouped under that engine, and an engine whose night did not change says so."""
    from specparity.records.compare import compare_records

    old = _engines_night(tmp_path / "night1", "match", "0.20.3")
    new = _engines_night(tmp_path / "night2", "diverged", "0.20.4")
    rep = compare_records(old, new)
    assert rep.exit_code == 1 and rep.engines == ["mlx-dspark", "dflash-mlx"]
    assert {(c.part, c.engine) for c in rep.of("regressed")} == {
        ("mlx-dspark-qwen3 / * / *", "mlx-dspark"), ("mlx-dspark-qwen3 / w3 / p0", "mlx-dspark")}
    (ident,) = rep.of("identity")
    assert (ident.part, ident.engine) == ("mlx-dspark-qwen3 environment mlx-dspark", "mlx-dspark")
    assert rep.by_engine()["dflash-mlx"] == dict.fromkeys(rep.by_engine()["dflash-mlx"], 0)
    assert rep.to_dict()["engines"]["mlx-dspark"]["regressed"] == 2
    lines = rep.lines()
    at = lines.index("regressed (2):")
    assert lines[at + 1] == "  mlx-dspark (2):"
    assert lines[at + 3] == ("    mlx-dspark-qwen3 / w3 / p0: match -> diverged"
                             " (width 3, first divergence at token 9, char 31)")
    assert lines[-3:] == ["by engine:", "  mlx-dspark: 2 regressed, 1 identity", "  dflash-mlx: no change"]
    # and back: the same request fixed, under the same engine
    back = compare_records(new, old)
    assert back.exit_code == 0 and {c.engine for c in back.of("fixed")} == {"mlx-dspark"}
