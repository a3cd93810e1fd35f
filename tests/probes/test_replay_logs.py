"""Accept-vector sources and the offline round algebra (no model needed)."""
# ruff: noqa: E501  (sample log lines are as long as the servers write them)

from __future__ import annotations

import json

import pytest

from conftest import run_cli
from specparity.errors import UsageError
from specparity.probes.replay.algebra import check_rounds, emitted_counts, locate
from specparity.probes.replay.logs import (
    SPECPARITY_FORMAT, AcceptLog, detect_format, parse_accept_list, read_log, write_requests,
)
from specparity.probes.replay.recorder import accepts_from_flags

# A served burst, written the way mlxcel logs it: round r's bonus is round r-1's
# last new token; accepted = LCP(draft, target); new = draft[:a] + [target[a]].
GOOD_TRANSCRIPT = """\
2025-01-01 12:00:00 INFO starting server
2025-01-01 12:00:01 DEBUG DFlash round transcript round=0 bs=4 bonus=285 draft_tokens=[11, 12, 13] target_tokens=[11, 40, 41, 42] accepted=1 new_tokens=[11, 40]
2025-01-01 12:00:01 DEBUG unrelated line accepted=9
2025-01-01 12:00:01 DEBUG DFlash round transcript round=1 bs=4 bonus=40 draft_tokens=[7, 8, 9] target_tokens=[7, 8, 9, 10] accepted=3 new_tokens=[7, 8, 9, 10]
2025-01-01 12:00:02 DEBUG DFlash round transcript round=2 bs=4 bonus=10 draft_tokens=[5, 6, 1] target_tokens=[3, 4, 5, 6] accepted=0 new_tokens=[3]
2025-01-01 12:00:02 DEBUG DFlash round transcript round=3 bs=4 bonus=3 draft_tokens=[21, 22, 23] target_tokens=[21, 22, 30, 31] accepted=2 new_tokens=[21]
2025-01-01 12:00:03 DEBUG DFlash round transcript round=0 bs=4 bonus=17 draft_tokens=[1, 2, 3] target_tokens=[9, 2, 3, 4] accepted=0 new_tokens=[9]
2025-01-01 12:00:03 DEBUG DFlash round transcript round=1 bs=4 bonus=9 draft_tokens=[1, 2, 3] target_tokens=[1, 2, 3, 4] accepted=3 new_tokens=[1, 2, 3, 4]
"""


def _write(tmp_path, text, name="server.log"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_plain_list():
    assert parse_accept_list("2,2,3,1") == [2, 2, 3, 1]
    assert parse_accept_list("[0, 1]") == [0, 1]
    assert parse_accept_list("") == []
    with pytest.raises(UsageError, match=r"^accepts '2,x': accept length: 'x' is not an integer") as err:
        parse_accept_list("2,x")
    assert err.value.as_flag().startswith("--accepts '2,x': ")  # as the command line prints it
    with pytest.raises(UsageError, match="negative"):
        parse_accept_list("1,-1")


def test_accept_lens_preset(tmp_path):
    p = _write(tmp_path, "\n".join([
        "[info] model loaded",
        "2025-01-01 DEBUG DFlash accept lengths accept_lens=[1, 1, 2, 0, 1]",
        "other line accept_lens=[9, 9]",
        "DFlash accept lengths accept_lens=[3, 3]  tail text",
        "DFlash accept lengths accept_lens=[]",
    ]))
    reqs = read_log(p, "mlxcel-accept-lens")
    assert [r.accepts for r in reqs] == [[1, 1, 2, 0, 1], [3, 3], []]
    assert [r.line for r in reqs] == [2, 4, 5]
    assert reqs[0].width is None  # the width comes from --width
    assert read_log(p)[1].accepts == [3, 3]  # auto-detected


@pytest.mark.parametrize("bad, why", [
    ("DFlash accept lengths accept_lens=[1, 1, 2", "truncated"),
    ("DFlash accept lengths accept_lens=[1, one, 2]", "'one' is not an integer"),
    ("DFlash accept lengths (cut off)", "truncated"),
])
def test_accept_lens_malformed_names_line(tmp_path, bad, why):
    p = _write(tmp_path, f"ok\nDFlash accept lengths accept_lens=[1]\n{bad}\n")
    with pytest.raises(UsageError, match=rf"server\.log:3: malformed .*{why}"):
        read_log(p, "mlxcel-accept-lens")


def test_transcript_preset_and_algebra_holds(tmp_path):
    reqs = read_log(_write(tmp_path, GOOD_TRANSCRIPT))
    assert len(reqs) == 2  # round=0 starts a new burst
    a, b = reqs
    assert a.accepts == [1, 3, 0, 2] and a.width == 4 and a.line == 2
    assert a.tokens == [285, 11, 40, 7, 8, 9, 10, 3, 21] and a.prefill_emits
    assert b.accepts == [0, 3] and b.source.endswith(":7")
    assert a.rounds is not None and b.rounds is not None  # a transcript carries its rounds
    assert [r.line for r in a.rounds] == [2, 4, 5, 6]
    # round 3 emits 1 of its 3 tokens: budget truncation, allowed on the last round
    assert check_rounds(a.rounds) == []
    assert check_rounds(b.rounds, request=1) == []


def _tamper(old: str, new: str) -> str:
    assert old in GOOD_TRANSCRIPT
    return GOOD_TRANSCRIPT.replace(old, new, 1)


@pytest.mark.parametrize("old, new, check, line", [
    ("round=1 bs=4 bonus=40", "round=1 bs=4 bonus=41", "bonus_chain", 4),
    ("target_tokens=[3, 4, 5, 6] accepted=0", "target_tokens=[3, 4, 5, 6] accepted=1",
     "accepted_lcp", 5),
    ("accepted=3 new_tokens=[7, 8, 9, 10]", "accepted=3 new_tokens=[7, 8, 9, 11]",
     "new_tokens", 4),
    ("accepted=1 new_tokens=[11, 40]", "accepted=1 new_tokens=[11]", "truncation", 2),
])
def test_round_algebra_fires_on_tampered_transcript(tmp_path, old, new, check, line):
    reqs = read_log(_write(tmp_path, _tamper(old, new)))
    found = []
    for i, r in enumerate(reqs):
        assert r.rounds is not None  # a transcript carries its rounds
        found.extend(check_rounds(r.rounds, request=i))
    assert [f.check for f in found][:1] == [check]
    assert found[0].line == line and found[0].request == 0


@pytest.mark.parametrize("text, why", [
    ("DFlash round transcript round=0 bs=4 bonus=1 draft_tokens=[1, 2, 3] target_tokens=[1, 2",
     "no complete target_tokens"),
    ("DFlash round transcript round=0 bs=4 bonus=1 draft_tokens=[1, x] target_tokens=[1]"
     " accepted=0 new_tokens=[1]", "'x' is not an integer"),
    ("DFlash round transcript round=3 bs=4 bonus=1 draft_tokens=[1] target_tokens=[1, 2]"
     " accepted=1 new_tokens=[1, 2]", "round 3 follows round 1"),
])
def test_transcript_malformed_names_line(tmp_path, text, why):
    head = "\n".join(GOOD_TRANSCRIPT.splitlines()[:4])  # rounds 0 and 1 of a burst
    p = _write(tmp_path, head + "\n" + text + "\n")
    with pytest.raises(UsageError, match=rf"server\.log:5: .*{why}"):
        read_log(p, "mlxcel-transcript")


def test_specparity_jsonl_roundtrip(tmp_path):
    reqs = [
        AcceptLog([3, 1, 2], width=4, widths=[4, 4, 3], prompt_ids=[5, 6, 7], tokens=[1, 2],
                  meta={"max_tokens": 8}),
        AcceptLog([0, 0], width=2, prompt_ids=[9]),
    ]
    p = write_requests(tmp_path / "run.jsonl", reqs, model="abc")
    with pytest.raises(UsageError, match="exists"):
        write_requests(p, reqs)
    back = read_log(p)
    assert [r.accepts for r in back] == [[3, 1, 2], [0, 0]]
    assert back[0].widths == [4, 4, 3] and back[0].prompt_ids == [5, 6, 7]
    assert back[0].tokens == [1, 2] and back[0].meta["max_tokens"] == 8
    assert back[1].width == 2 and back[1].widths is None and back[1].meta["model"] == "abc"
    assert json.loads(p.read_text().splitlines()[0])["format"] == SPECPARITY_FORMAT


@pytest.mark.parametrize("line2, why", [
    ('{"format": "specparity.accepts/1", "width": 4, "accepts": [1, 2', "not a JSON object"),
    ('{"format": "specparity.accepts/1", "accepts": [1, 2]}', "needs 'width' or 'widths'"),
    ('{"format": "other/2", "width": 4, "accepts": [1]}', "is not 'specparity.accepts/1'"),
    ('{"format": "specparity.accepts/1", "width": 4, "accepts": [1, -2]}', "'accepts' must be"),
])
def test_specparity_jsonl_malformed_names_line(tmp_path, line2, why):
    good = json.dumps({"format": SPECPARITY_FORMAT, "width": 4, "accepts": [1]})
    p = _write(tmp_path, good + "\n" + line2 + "\n", "run.jsonl")
    with pytest.raises(UsageError, match=rf"run\.jsonl:2: .*{why}"):
        read_log(p, "specparity")


def test_user_regex(tmp_path):
    p = _write(tmp_path, "\n".join([
        "step round=0 accepted=2",
        "noise",
        "step round=1 accepted=0",
        "step round=0 accepted=3",
    ]))
    reqs = read_log(p, "regex", r"round=(?P<round>\d+) accepted=(?P<accepts>\d+)")
    assert [r.accepts for r in reqs] == [[2, 0], [3]]
    q = _write(tmp_path, "req done lens=1,2,0\nreq done lens=[3]\n", "b.log")
    assert [r.accepts for r in read_log(q, regex=r"lens=(\S+)")] == [[1, 2, 0], [3]]
    with pytest.raises(UsageError, match="b.log:1: regex captured 'x'") as err:  # the CLI: --regex
        read_log(_write(tmp_path, "lens=x\n", "b.log"), regex=r"lens=(\S+)")
    assert "b.log:1: --regex captured 'x'" in err.value.as_flag()
    with pytest.raises(UsageError, match="not a valid regular expression"):
        read_log(q, regex="lens=(")
    with pytest.raises(UsageError, match="needs a capture group"):
        read_log(q, regex="lens=")


def test_detect_format():
    assert detect_format(["x", "DFlash round transcript round=0"]) == "mlxcel-transcript"
    assert detect_format(["DFlash accept lengths accept_lens=[1]"]) == "mlxcel-accept-lens"
    assert detect_format(['{"format": 1}']) == "specparity"


def test_locate_maps_index_to_round_and_row():
    counts = emitted_counts([2, 0, 3])  # rounds emit 3, 1, 4 tokens
    assert counts == [3, 1, 4]
    got = [locate(counts, e) for e in range(8)]
    assert got == [(0, 0), (0, 1), (0, 2), (1, 0), (2, 0), (2, 1), (2, 2), (2, 3)]
    with pytest.raises(UsageError, match="past the end: the rounds emit 8 tokens"):
        locate(counts, 8)


def test_accepts_from_flags():
    # rounds: 2 accepted + bonus, 0 + bonus, then a full accept of 3 cut by max_tokens=9
    flags = [True, True, False, False, True, True, True]
    # the last round verified min(3, 9 - 4) + 1 = 4 rows
    assert accepts_from_flags(flags, 3, 9) == ([2, 0, 3], [4, 4, 4])
    # budget 6: last round has min(3, 6 - 4) = 2 proposals: 3 rows, both accepted
    assert accepts_from_flags([True, True, False, False, True, True], 3, 6) == (
        [2, 0, 2], [4, 4, 3])


def test_cli_algebra_only_and_locate(tmp_path, cli_bin):
    good = _write(tmp_path, GOOD_TRANSCRIPT)
    r = run_cli(cli_bin, "replay", "--log", str(good), "--algebra-only")
    assert r.returncode == 0, r.stderr
    assert "2 requests, 6 rounds: round algebra holds" in r.stdout
    bad = _write(tmp_path, _tamper("round=1 bs=4 bonus=40", "round=1 bs=4 bonus=41"), "bad.log")
    r = run_cli(cli_bin, "replay", "--log", str(bad), "--algebra-only", "--json")
    assert r.returncode == 1, r.stderr
    assert json.loads(r.stdout)["findings"][0]["check"] == "bonus_chain"
    r = run_cli(cli_bin, "replay", "--log", str(good), "--request", "0", "--locate", "7")
    assert r.returncode == 0, r.stderr
    assert "emitted index 7 is round 2, row 0" in r.stdout
    r = run_cli(cli_bin, "replay", "--log", str(good), "--request", "0", "--locate", "7", "--json")
    [located] = json.loads(r.stdout)["located"]  # replay-locate.schema.json (run_cli)
    assert r.returncode == 0 and located == {
        "request": 0, "source": located["source"], "emitted_index": 7, "round": 2, "row": 0}


def test_cli_malformed_log_is_usage_error(tmp_path, cli_bin):
    p = _write(tmp_path, "x\nDFlash accept lengths accept_lens=[1, 2\n")
    r = run_cli(cli_bin, "replay", "--log", str(p), "--width", "4", "--locate", "0")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].startswith(f"Error: {p}:2: malformed")
    assert "Traceback" not in r.stderr
    r = run_cli(cli_bin, "replay", "--accepts", "1,2", "--log", str(p))
    assert r.returncode == 2 and "exactly one of --accepts" in r.stderr
