"""The docs tier reads every page and every --help, states each line's outcome as its page does, and fails
when a documented outcome changes: the grammar on synthetic pages, the tier on a real page edited."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from docs import conftest as docs
from docs import doclines
import pytest
from docs.doclines import ROOT, DocLine
from sybil import Document


def lines_of(text: str, source: str = "page.md") -> list[DocLine]:
    return [ln for b in doclines.markdown_blocks(text) for _, _, ln in doclines.doc_lines(b, source)]


PAGE = '''# A page

Prose with `specparity inline --code`, which is not a command line.

    specparity fixtures make ./fx      # builds ./fx
    specparity probe --model ./fx/target --widths 2 \\
        --depths 0                     # exit 1: a continuation line and a stated code
    specparity-gate: ALLOW width=4 key=1a2b3c4d5e6f

- a list item whose code block sits 4 spaces past its text:

      specparity served --model mlx-community/x   # not tested: needs the model hub

  and a paragraph of the item, indented 2: not code.

```
$ specparity dist --rule mrs
dist: ...
...
verdict: pass
$ specparity serve --port 8123     # serves until Ctrl-C
```

```yaml
run: specparity probe   # a workflow's YAML: not a shell block
```

```python
import specparity  # not a shell block
```
'''


def test_the_grammar_finds_each_command_line_and_the_outcome_its_page_states() -> None:
    found = lines_of(PAGE)
    assert [ln.command for ln in found] == [
        "specparity fixtures make ./fx", "specparity probe --model ./fx/target --widths 2 --depths 0",
        "specparity served --model mlx-community/x", "specparity dist --rule mrs", "specparity serve --port 8123"]
    make, probe, served, dist, serve = found
    assert (make.line, make.exit_code, make.output, make.untested, make.serves) == (5, 0, None, None, False)
    assert probe.exit_code == 1 and probe.text.count("\n") == 1
    assert served.untested == "needs the model hub" and served.line == 12
    assert dist.output == ("dist: ...", "...", "verdict: pass") and dist.exit_code == 0  # verdict pass: 0
    assert serve.serves and serve.output == ()


def test_a_transcripts_closing_verdict_states_its_exit_code() -> None:
    text = "```\n$ specparity served\n...\nverdict: diverged\n$ specparity probe\nverdict: inconclusive\n```\n"
    assert [ln.exit_code for ln in lines_of(text)] == [1, 3]


def test_a_help_examples_block_is_read_until_its_indentation_ends() -> None:
    text = "Probe it.\n\n\b\nExamples:\n    specparity probe\n    specparity probe --json  # exit 0\n\nMore text.\n"
    found = [ln for b in doclines.help_blocks(text) for _, _, ln in doclines.doc_lines(b, "probe --help")]
    assert [ln.command for ln in found] == ["specparity probe", "specparity probe --json"]


def test_markers_follow_what_a_line_runs() -> None:
    def needs(cmd: str) -> doclines.Needs:
        return doclines.needs(lines_of(f"    {cmd}\n")[0])

    assert needs("specparity records list results/") == doclines.Needs()
    assert needs("specparity dist --rule mrs") == doclines.Needs()
    assert needs("specparity dist --rule tests/sample_rules.py:mrs_chain").slow
    probe = needs("specparity --max-width 8 probe --widths 2")
    assert probe.model and probe.slow and not probe.server and not probe.build
    served = needs("specparity served --profile llama.cpp --model ./fx/target")
    assert served.server and served.llama_server and served.build
    assert needs("specparity e2e --engine dflash-mlx").environments == ("dflash-mlx",)
    assert needs("specparity env show mlx-lm-0.32.2 --json").environments == ("mlx-lm-0.32.2",)
    assert needs("specparity env path --python mlx-lm-0.32.2").environments == ("mlx-lm-0.32.2",)
    assert needs("SPECPARITY_X=$(specparity env path --python mlx-lm-0.31.3) specparity probe").environments == \
        ("mlx-lm-0.31.3",)
    assert needs("scripts/nightly-parity examples/nightly-matrix.yaml --matrix mlx-lm-0.31.3,mlx-lm-0.32.2"
                 " --out n").environments == ("mlx-lm-0.31.3", "mlx-lm-0.32.2")


def test_a_transcript_matches_with_its_wildcards_and_names_the_first_line_that_does_not() -> None:
    expected = ("model .../target (llama)", "...", "verdict: equal")
    assert doclines.output_mismatch(expected, "model /x/y/target (llama)\nrow 1\nrow 2\nverdict: equal\n") is None
    assert doclines.output_mismatch(expected, "model /x/target (llama)\nverdict: equal") is None  # `...`: no line
    assert "line 3" in str(doclines.output_mismatch(expected, "model /x/target (llama)\nverdict: divergent"))
    assert "line 1" in str(doclines.output_mismatch(expected, "model /x/target (gemma)\nverdict: equal"))
    assert doclines.output_mismatch(("a",), "a\nb") is not None  # an extra line is a difference


def test_the_declared_normalizations() -> None:
    printed = ("model /tmp/p/home/fixtures/t (e5d6) in 4.82 s, model load 9.7 s\n"
               "see /tmp/p/checkout/results/data/served-ci-box-2026-12-04-2/x.jsonl")
    out = doclines.normalize(printed, "/tmp/p/checkout", "/tmp/p/home")
    assert out == doclines.normalize("model ~/.cache/specparity/fixtures/t (e5d6) in 94 s, model load 1 s\n"
                                     "see results/data/served-ci-box-2026-12-04-2/x.jsonl")
    assert "served-ci-<host>-<date>" in out  # a host with a dash keeps its first word: both sides alike


def test_every_page_and_every_commands_help_is_read() -> None:
    assert {p.name for p in docs.pages()} == {"README.md", *(p.name for p in (ROOT / "docs").glob("*.md"))}
    names = [name for name, _, _ in docs.help_pages()]
    from specparity.cli import COMMANDS

    assert {n.split()[1] for n in names if n != "specparity"} == set(COMMANDS)
    for sub in ("specparity records html", "specparity bisect dump", "specparity fixtures gguf", "specparity env show"):
        assert sub in names
    # every Examples line of every help is a line the grammar finds: none is dropped
    for name, command, _ in docs.help_pages():
        block = re.search(r"^\s*Examples?:\s*\n((?:[ \t]+\S.*\n?)+)", command.help or "", re.M)
        examples = [ln for ln in (block[1].splitlines() if block else []) if ln.strip()]
        assert len(docs.help_lines(name, command)) == len(examples), (name, examples)


# the --help Examples kept as their docs page's first lines (and install.md as README's first lines): each line
# runs once, with the page; a help edited away from its page runs on its own, and this names the drift
RUN_WITH = {"docs/install.md": "README.md", "specparity/commands/served.py": "docs/served.md",
            "specparity/commands/e2e.py": "docs/e2e.md", "specparity/commands/probe.py": "docs/probe.md",
            "specparity/commands/replay.py": "docs/replay.md", "specparity/commands/dist.py": "docs/sampling.md",
            "specparity/commands/gate.py": "docs/gate.md", "specparity/commands/serve.py": "docs/serve.md"}


def test_helps_and_pages_that_are_another_pages_first_lines_run_with_it() -> None:
    found = {str(path.relative_to(docs.source_root())): page for path, page in docs.same_as_a_page().items()}
    assert found == RUN_WITH
    for name, command, module in docs.help_pages():
        page = found.get(str(module.relative_to(docs.source_root())))
        if page:  # line for line: the command, the stated exit code, output, reason not tested, server
            lines = [docs.outcome(ln) for ln in docs.help_lines(name, command)]
            first = [docs.outcome(ln) for ln in docs.page_lines((ROOT / page).read_text(), page)]
            assert not lines or any(first[i:i + len(lines)] == lines for i in range(len(first))), name


def test_every_documented_line_is_collected_once() -> None:
    """Every line of every page and help is a collected test, or one of the lines of the page it runs with."""
    collected = subprocess.run([str(ROOT / ".venv" / "bin" / "pytest"), "--collect-only", "-q", "-n", "0",
                                "-p", "no:cacheprovider", str(ROOT / "tests" / "docs" / "conftest.py")],
                               cwd=ROOT, capture_output=True, text=True, timeout=300).stdout
    ids = [ln for ln in collected.splitlines() if re.search(r"::([\w-]+:)?line:\d+:", ln)]
    run_with = docs.same_as_a_page()
    expected = sum(len(docs.page_lines(p.read_text(), str(p.relative_to(ROOT)))) for p in docs.pages()
                   if p not in run_with)
    expected += sum(len(docs.help_lines(n, c)) for n, c, m in docs.help_pages() if m not in run_with)
    assert len(ids) == expected > 100
    assert len(set(ids)) == len(ids)


def test_every_expected_failure_names_a_documented_line() -> None:
    documented = {(ln.source, ln.command) for page in docs.pages()
                  for ln in docs.page_lines(page.read_text(), str(page.relative_to(ROOT)))}
    for name, command, _ in docs.help_pages():
        documented |= {(ln.source, ln.command) for ln in docs.help_lines(name, command)}
    stale = [key for key in docs.XFAIL if key not in documented]
    assert not stale, f"XFAIL entries naming no documented line (fixed in the docs? remove them): {stale}"
    assert all(reason.startswith("issue ") for reason in docs.XFAIL.values())


def test_every_after_check_names_a_documented_line_and_a_function() -> None:
    """AFTER's checks run only when their line runs: a page edit that changed the line would drop its check."""
    import importlib

    documented = {(ln.source, ln.command) for page in docs.pages()
                  for ln in docs.page_lines(page.read_text(), str(page.relative_to(ROOT)))}
    stale = [key for key in docs.AFTER if key not in documented]
    assert not stale, f"AFTER entries naming no documented line: {stale}"
    for target in docs.AFTER.values():
        module, func = target.split(":")
        assert callable(getattr(importlib.import_module(module), func)), target


def test_an_after_check_failure_is_the_lines_problem(tmp_path: Path) -> None:
    fails = tmp_path / "after_fails.py"
    fails.write_text("def check(out, stdout, stderr):\n    assert stdout == 'all', f'{out.name}: {stdout}'\n")
    import sys
    sys.path.insert(0, str(tmp_path))
    try:
        proc = subprocess.CompletedProcess(["x"], 0, "some", "")
        assert docs.after_check("after_fails:check", tmp_path, "x --out night", proc) == [
            "after_fails:check: night: some"]
        assert docs.after_check("after_fails:check", tmp_path, "x --out night",
                                subprocess.CompletedProcess(["x"], 0, "all", "")) == []
        # a served line's folder is its --record-dir
        assert docs.after_check("after_fails:check", tmp_path, "specparity served --record-dir runs --quiet",
                                proc) == ["after_fails:check: runs: some"]
    finally:
        sys.path.remove(str(tmp_path))


def test_a_line_in_xfail_is_a_strict_expected_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    line = lines_of("    specparity probe --widths 2   # exit 0\n", "docs/probe.md")[0]
    assert docs.xfail(line) is None
    monkeypatch.setitem(docs.XFAIL, ("docs/probe.md", "specparity probe --widths 2"), "issue 46 item 9: a bug")
    mark = docs.xfail(line)
    assert mark is not None and mark.kwargs == {"strict": True, "reason": "issue 46 item 9: a bug"}
    assert mark.name == "xfail"


def test_readmes_ci_line_is_what_ci_runs() -> None:
    # README's second line is not run by the tier (it is the tier's own command): what it says is checked here
    line = next(ln for ln in lines_of((ROOT / "README.md").read_text(), "README.md") if "scripts/check" in ln.text)
    assert line.untested
    assert line.command in (ROOT / ".ci" / "run").read_text().splitlines()


def evaluate_page(text: str, docs_shell: Path, source: str = "docs/fixtures.md") -> list[tuple[DocLine, str | None]]:
    """Evaluate every line of ``text`` as the tier does (the page's own folder, the same evaluator)."""
    document = Document(text, str(ROOT / source))
    for region in docs._regions(doclines.markdown_blocks(text), source):
        document.add(region)
    document.namespace["docs_shell"] = docs_shell
    return [(example.parsed, docs.evaluate(example)) for example in document.examples()]


FORMATS = "docs/fixtures.md"


def test_a_changed_outcome_fails_the_line(tmp_path: Path) -> None:
    """docs/fixtures.md's `fixtures formats` transcript and a stated exit code, as written, then each edited:
    the line passes as written and fails once its output or exit code in the page changes."""
    page = (ROOT / FORMATS).read_text()
    transcript = re.search(r"```\n\$ specparity fixtures formats\n(.*?)```\n", page, re.S)
    assert transcript, "docs/fixtures.md shows `fixtures formats` as a transcript"
    block = transcript[0]
    first = transcript[1].splitlines()[0]
    as_written = evaluate_page(block, tmp_path)
    assert [(ln.command, problem) for ln, problem in as_written] == [("specparity fixtures formats", None)]

    changed_output = block.replace(first, first.replace("dflash", "dflesh", 1))
    assert changed_output != block
    (_, problem), = evaluate_page(changed_output, tmp_path)
    assert problem and "expected line 1 of the transcript not found" in problem and "dflesh" in problem

    changed_code = block.replace("$ specparity fixtures formats", "$ specparity fixtures formats   # exit 2")
    (line, problem), = evaluate_page(changed_code, tmp_path)
    assert line.exit_code == 2 and problem and "exit 0 where the page says 2" in problem


@pytest.mark.slow
def test_the_tier_fails_on_an_edited_page(tmp_path: Path) -> None:
    """README's test command (pytest, testpaths = tests) on a copy of the checkout whose docs/fixtures.md
    has one output line changed: the tier collects the page and fails that line, naming it."""
    copy = tmp_path / "checkout"
    copy.mkdir()
    doclines.copy_checkout(copy)
    page = copy / FORMATS
    text = page.read_text()
    found = re.search(r"```\n\$ specparity fixtures formats\n(.*)\n", text)
    assert found
    first = found[1]
    page.write_text(text.replace(first, first.replace("dflash", "dflesh", 1), 1))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    proc = subprocess.run([str(ROOT / ".venv" / "bin" / "pytest"), "-n", "0", "-p", "no:cacheprovider", "-q",
                           "-k", "fixtures.md and formats"],
                          cwd=copy, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert re.search(r"FAILED docs/fixtures\.md::line:\d+:specparity-fixtures-formats", out), out[-3000:]
    assert "dflesh" in out and "1 failed" in out
