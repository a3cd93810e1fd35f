"""The verdict contract: one vocabulary, one exit-code map, one combine()."""

from __future__ import annotations

import pytest
import sources

from specparity.errors import EXIT_BUG, EXIT_DIVERGENT, EXIT_INCONCLUSIVE, EXIT_INFRA, EXIT_OK
from specparity.verdicts import Decision, Verdict, combine, decision_exit_code, exit_code, verdict


def test_every_verdict_has_the_design_exit_code():
    assert {v: exit_code(v) for v in Verdict} == {
        Verdict.EQUAL: EXIT_OK, Verdict.MATCH: EXIT_OK, Verdict.PASS: EXIT_OK,
        Verdict.DIVERGENT: EXIT_DIVERGENT, Verdict.DIVERGED: EXIT_DIVERGENT,
        Verdict.NOT_RUN: EXIT_INCONCLUSIVE, Verdict.INCONCLUSIVE: EXIT_INCONCLUSIVE,
        Verdict.NOT_ENGAGED: EXIT_INCONCLUSIVE, Verdict.DECLINED: EXIT_INCONCLUSIVE,
        Verdict.CANNOT_RUN: EXIT_INCONCLUSIVE, Verdict.LOSSY: EXIT_INCONCLUSIVE, Verdict.ERROR: EXIT_INFRA,
    }
    # an engine entry point that cannot run here is never a pass, and never outranks one that did not run
    assert combine(["match", "cannot_run"]) == Verdict.CANNOT_RUN and combine(["cannot_run", "error"]) == Verdict.ERROR
    assert EXIT_BUG not in {exit_code(v) for v in Verdict}
    assert [decision_exit_code(d) for d in Decision] == [0, 1, 0]


def test_combine_most_serious_wins_and_nothing_run_is_not_a_pass():
    assert combine(["equal", "equal"]) == Verdict.EQUAL
    assert combine(["equal", "not_run"]) == Verdict.NOT_RUN
    assert combine(["not_run", "divergent", "equal"]) == Verdict.DIVERGENT
    assert combine(["match", "declined"]) == Verdict.DECLINED
    assert combine(["match", "error", "not_engaged"]) == Verdict.ERROR
    assert combine(["error", "diverged"]) == Verdict.DIVERGED
    assert combine([]) == Verdict.NOT_RUN
    assert exit_code(combine([])) == EXIT_INCONCLUSIVE


def test_verdicts_are_their_words_in_json_and_unknown_words_are_named():
    import json

    assert json.dumps({"v": Verdict.NOT_ENGAGED}) == '{"v": "not_engaged"}'
    assert Verdict.EQUAL == "equal"
    with pytest.raises(ValueError, match="'same'"):
        verdict("same")


def test_cache_options_round_trip_through_argv():
    import click

    from specparity.commands._common import cache_options, cache_options_from
    from specparity.decode import CacheOptions

    @click.command()
    @cache_options
    def cmd(**kw):
        return cache_options_from(kw)

    for opts in (CacheOptions(), CacheOptions(kv_bits=4, kv_group_size=32, quantized_kv_start=25,
                                              max_kv_size=96, prefill_step_size=7),
                 CacheOptions(kv_bits=8, quantized_kv_start=0)):
        back = cmd.main(args=opts.to_argv(), standalone_mode=False)
        assert back == opts


def _source_files(repo_root):
    for folder in ("specparity", "probes", "bisect", "harness", "records"):
        for path in sorted((repo_root / folder).rglob("*.py")):
            if path.name != "verdicts.py" and "fixture_models" not in path.parts:
                yield path


def test_no_verdict_literal_or_exit_number_outside_the_contract(repo_root):
    """grep, but exact: a verdict word as a whole string constant (not a dict key), or an
    exit code as a bare number in return / sys.exit / exit_code=, appears only in verdicts.py
    and errors.py."""
    import ast

    from specparity.verdicts import CachePolicy, Decision, Verdict

    words = {v.value for v in Verdict} | {d.value for d in Decision} | {p.value for p in CachePolicy}
    found = []
    for path in _source_files(repo_root):
        tree = sources.tree(path)
        keys = {id(k) for node in sources.nodes(tree) if isinstance(node, ast.Dict) for k in node.keys if k}
        for node in sources.nodes(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in words \
                    and id(node) not in keys:
                found.append(f"{path.relative_to(repo_root)}:{node.lineno}: {node.value!r}")
            if path.name == "errors.py":
                continue
            exit_number = (
                (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "exit"
                 and node.args and isinstance(node.args[0], ast.Constant))
                or (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                    and type(node.value.value) is int
                    and any(getattr(t, "id", getattr(t, "attr", "")) == "exit_code" for t in node.targets)))
            if exit_number:
                assert isinstance(node, (ast.Call, ast.Assign))
                found.append(f"{path.relative_to(repo_root)}:{node.lineno}: exit code as a number")
    assert not found, "\n".join(found)


def test_a_documented_lossy_mode_is_lossy_by_design_with_what_it_changed_never_a_pass_or_a_defect() -> None:
    """An engine's entry point that runs a mode its authors document as lossy (``Finding.lossy``): diverged,
    matched or not engaged, its verdict is ``lossy_by_design`` (exit 3) with what it changed on this prompt; the
    same tokens without the mode are judged as ever."""
    from specparity.probes.engine_e2e import Finding, judge

    rounds = [{"drafted": 2, "accepted": 1, "committed": 2, "source": "draft"}] * 3
    classic, eos = [5, 6, 7, 8, 9, 10], {2}
    left = judge(Finding("e", "fast", tokens=[5, 6, 70, 8, 9, 10], rounds=rounds, accepted=3, drafted=6,
                         lossy="k=4, its fast mode"), classic, eos, 0)
    assert left.verdict == Verdict.LOSSY and exit_code(left.verdict) == 3
    assert left.reason.startswith("lossy by design (k=4, its fast mode): it leaves classic decode: token 2: engine 70")
    assert left.reason.endswith("not a pass, not a defect") and (left.round, left.row) == (2, 0)
    same = judge(Finding("e", "fast", tokens=list(classic), rounds=rounds, accepted=3, drafted=6, lossy="k=4"),
                 classic, eos, 0)
    assert same.verdict == Verdict.LOSSY and "6 tokens equal to classic decode on this prompt" in same.reason
    plain = judge(Finding("e", "exact", tokens=[5, 6, 70, 8, 9, 10], rounds=rounds, accepted=3, drafted=6),
                  classic, eos, 0)
    assert plain.verdict == Verdict.DIVERGED
    assert combine([Verdict.MATCH, Verdict.LOSSY]) == Verdict.LOSSY
    assert combine([Verdict.LOSSY, Verdict.DIVERGED]) == Verdict.DIVERGED
