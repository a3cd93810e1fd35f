"""The docs tier: every command line of README.md, docs/*.md and every command's ``--help`` Examples, run as
typed, with the outcome the page states (tests/docs/doclines.py says how a page states it).

Collected here, under tests/ (README's test command collects ``testpaths = tests`` only): one sybil document per
page, one test per command line, in the page's order (pytest-xdist's loadscope keeps a page on one worker, and
its lines share the page's shell folder, as a reader's terminal does). A page's lines are marked by what they
run (model, server, build, slow); a line after a slow one in its page is slow too, since it may read what
that one made (the fast tier runs a page's leading fast lines only).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
from docs import doclines
import pytest
from docs.doclines import ROOT, DocLine
import fixture_cache
from specparity.fixtures import build_cache
from sybil import Document, Region, Sybil
from sybil.integration.pytest import SybilFile, SybilItem

# AFTER's checks say what differed
pytest.register_assert_rewrite("matrix_night", "openai_served", "yunshu_served", "builtin_served")

# Documented lines whose stated outcome is right and the product's is not: expected failures until it is
# fixed (strict: a fixed product turns them into failures to remove from here). Keyed by the page and the
# command as typed (comments left out).
XFAIL: dict[tuple[str, str], str] = {}
# A documented line whose outcome a test module checks in depth on what the line itself wrote (its folder, its
# stdout and stderr), so the suite runs it once: (page, command) -> "module:function(folder, stdout, stderr)".
AFTER: dict[tuple[str, str], str] = {
    ("README.md", "specparity served --record-dir results"): "builtin_served:check",
    ("docs/nightly.md", "scripts/nightly-parity examples/nightly-matrix.yaml --matrix mlx-lm-0.31.3,mlx-lm-0.32.2"
     " --out matrix"): "matrix_night:check",
    ("docs/engines.md", "specparity served --profile mlx-openai-server --model ./fx/llama/target --draft-model"
     " ./fx/llama/draft --widths 2,4 --max-tokens 16 --concurrency 0 --record-dir runs"): "openai_served:check",
    ("docs/engines.md", "specparity served --profile yunshu --model ./fx/yunshu/target --draft-model ./fx/yunshu/draft"
     " --widths 4,8 --concurrency 0 --record-dir runs/yunshu"): "yunshu_served:check",
    ("docs/engines.md", "specparity served --profile yunshu-mtp --model ./fx/yunshu/target --draft-model"
     " ./fx/yunshu/target --widths 4 --concurrency 0 --record-dir runs/yunshu-mtp"): "yunshu_served:check",
}

# The pages that take a minute or more, longest first (the tier alone, 3 workers, a quiet machine: nightly 3 min,
# engines, fixtures, served and its help, dflash, README, the fixtures and records helps 1-2 min). pytest-xdist
# hands a page out whole; these start among the suite's longest modules (pytest_collection_modifyitems below), so
# none is left to end a run alone.
PAGE_ORDER = ("docs/nightly.md", "docs/engines.md", "docs/fixtures.md", "docs/served.md", "docs/dflash.md",
              "README.md", "specparity/commands/fixtures.py", "docs/replay.md", "docs/e2e.md", "docs/records.md",
              "specparity/commands/records.py")
# after the items of this many of tests/conftest.py's longest modules
START_AFTER = 4


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def source_root() -> Path:
    """The checkout the installed specparity runs from (ROOT, but for a copy of the checkout whose tests run
    against the installed package: tests/docs/test_doclines.py)."""
    import specparity

    return Path(str(specparity.__file__)).resolve().parents[1]


def help_pages() -> list[tuple[str, click.Command, Path]]:
    """(``specparity ... --help`` name, command, its module's file) for the root group, every command in
    ``specparity.cli.COMMANDS`` and every subcommand, however deep."""
    import importlib

    from specparity.cli import COMMANDS, cli

    out: list[tuple[str, click.Command, Path]] = [("specparity", cli, source_root() / "specparity" / "cli.py")]

    def walk(name: str, cmd: click.Command, module: str) -> None:
        out.append((name, cmd, Path(str(importlib.import_module(module).__file__))))
        if isinstance(cmd, click.Group):
            for sub in sorted(cmd.commands):
                walk(f"{name} {sub}", cmd.commands[sub], cmd.commands[sub].callback.__module__)

    ctx = click.Context(cli)
    for name in sorted(COMMANDS):
        command = cli.get_command(ctx, name)
        assert command is not None, name
        walk(f"specparity {name}", command, COMMANDS[name][0])
    return out


def _regions(blocks: Iterator[doclines.Block], source: str) -> Iterator[Region]:
    for block in blocks:
        for start, end, line in doclines.doc_lines(block, source):
            yield Region(start, end, parsed=line, evaluator=evaluate)


def parse_page(document: Document) -> Iterator[Region]:
    source = str(Path(document.path).relative_to(ROOT))
    return _regions(doclines.markdown_blocks(document.text), source)


class DocsSybil(Sybil):
    def identify(self, example: Any) -> str:
        # readable ids: the line and the command's first words (pytest -k 'records and html'); a --help's lines
        # say which help (a command module's helps are one page: one scope for pytest-xdist's loadscope)
        line: DocLine = example.parsed
        words = "-".join(line.command.split()[:3])
        where = "" if line.source.endswith(".md") else re.sub(r"\W+", "-", line.source.removeprefix("specparity "))
        return f"{where + ':' if where else ''}line:{example.line}:{re.sub(r'[^A-Za-z0-9_.,=-]+', '_', words)[:60]}"


SYBIL = DocsSybil([parse_page], fixtures=["docs_shell"], name="docs")


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    # the docs live outside testpaths: this folder's conftest is the one file under tests/ that stands for them
    if file_path == Path(__file__):
        return DocsTier.from_parent(parent, path=file_path, nodeid="tests/docs/documented")
    return None


def outcome(line: DocLine) -> tuple[Any, ...]:
    """A line as typed and the outcome its page states: two lines alike in this run alike."""
    return line.command, line.exit_code, line.output, line.untested, line.serves


def page_lines(text: str, source: str) -> list[DocLine]:
    return [ln for b in doclines.markdown_blocks(text) for _, _, ln in doclines.doc_lines(b, source)]


def help_lines(name: str, command: click.Command) -> list[DocLine]:
    blocks = doclines.help_blocks(command.help or "")
    return [ln for b in blocks for _, _, ln in doclines.doc_lines(b, f"{name} --help")]


def same_as_a_page() -> dict[Path, str]:
    """The pages whose lines (every line, in order, with the outcomes stated) are the first lines of another docs
    page: docs/install.md's are README's, and a command module's --help Examples (its every help, in order) are
    its docs page's first block. Those lines run once, as that page's, from the same fresh folder and home, so in
    the same state. Their file -> the page they run with."""
    starts = {str(p.relative_to(ROOT)): [outcome(ln) for ln in page_lines(p.read_text(), str(p.relative_to(ROOT)))]
              for p in pages()}
    files: dict[Path, list[tuple[Any, ...]]] = {ROOT / src: seq for src, seq in starts.items()}
    for name, command, module in help_pages():
        files.setdefault(module, []).extend(outcome(ln) for ln in help_lines(name, command))
    out: dict[Path, str] = {}
    for path, lines in files.items():
        page = next((src for src, seq in starts.items() if lines and ROOT / src != path and ROOT / src not in out
                     and seq[:len(lines)] == lines), None)
        if page:
            out[path] = page
    return out


class DocsTier(pytest.File):
    def collect(self) -> Iterator[pytest.Collector]:
        run_with_a_page = same_as_a_page()
        files: list[pytest.Collector] = [DocPage.from_parent(self, path=p, sybils=[SYBIL]) for p in pages()
                                         if p not in run_with_a_page]
        for name, command, module in help_pages():
            if module in run_with_a_page:
                continue
            nodeid = str(module.relative_to(source_root()))
            files.append(HelpPage.from_parent(self, path=module, nodeid=nodeid, sybils=[SYBIL],
                                              help_name=name, help_text=command.help or ""))
        rank = {name: i for i, name in enumerate(PAGE_ORDER)}
        files.sort(key=lambda f: rank.get(f.nodeid.split("::")[0], len(rank)))
        yield from files


class DocPage(SybilFile):
    """One markdown page: its lines in order, marked by what they run."""

    def collect(self) -> Iterator[SybilItem]:
        slow_before = False
        for item in super().collect():
            slow_before = mark(item, slow_before)
            _page_items.setdefault(str(self.path), []).append(item)
            yield item


class HelpPage(DocPage):
    """One command's ``--help``: its Examples block, read from the help click prints."""

    def __init__(self, *, help_name: str, help_text: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.help_name, self.help_text = help_name, help_text

    def collect(self) -> Iterator[SybilItem]:
        document = Document(self.help_text, str(self.path))
        for region in _regions(doclines.help_blocks(self.help_text), f"{self.help_name} --help"):
            document.add(region)
        self.documents.append(document)
        items = _page_items.setdefault(str(self.path), [])
        slow_before = any(i.get_closest_marker("slow") for i in items)  # an earlier --help of this module's
        for example in document.examples():
            item = SybilItem.from_parent(self, sybil=SYBIL, example=example)
            slow_before = mark(item, slow_before)
            items.append(item)
            yield item


def mark(item: SybilItem, slow_before: bool) -> bool:
    """Mark ``item`` by what its line runs; returns whether the page has had a slow line by now."""
    line: DocLine = item.example.parsed
    if line.untested:
        item.add_marker(pytest.mark.skip(reason=f"{line.source}:{line.line}: not tested: {line.untested}"))
        return slow_before
    n = doclines.needs(line)
    for marker, on in (("model", n.model), ("server", n.server), ("build", n.build),
                       ("slow", n.slow or slow_before)):
        if on:
            item.add_marker(marker)
    expected_failure = xfail(line)
    if expected_failure:
        item.add_marker(expected_failure)
    return slow_before or n.slow


def xfail(line: DocLine) -> pytest.MarkDecorator | None:
    """The strict expected-failure mark of a line in XFAIL (its reason naming the issue), else None."""
    reason = XFAIL.get((line.source, line.command))
    return pytest.mark.xfail(strict=True, reason=reason) if reason else None


# --- running a page ----------------------------------------------------------------------------------------


class Page:
    """The terminal a reader follows one page in: a fresh copy of the checkout as the working directory, an
    isolated SPECPARITY_HOME, the installed console script first on PATH, the pinned environments where the
    default home keeps them (a page that removes one gets its own copy of them)."""

    def __init__(self, root: Path, source: str, removes: set[str], makes_venv: bool) -> None:
        from builds import REAL_CACHE

        self.failed = False  # one of its lines did not do what the page says: its folder is kept
        self.dir = Path(tempfile.mkdtemp(prefix=re.sub(r"\W+", "-", source)[:40] + "-", dir=root))
        self.cwd = self.dir / "checkout"
        self.cwd.mkdir()
        # a page that installs (README's first line) makes its own .venv; the others find the installed one
        doclines.copy_checkout(self.cwd, link_venv=not makes_venv)
        self.home = self.dir / "home"
        self.home.mkdir()
        env_cache = REAL_CACHE
        if removes:  # `env remove` must not remove what the rest of the suite runs in: the environments the page
            # removes are hard-linked copies (a second or two each), every other one a link to the real one (a copy
            # of all of them was 18 GB of links: 37 s to make, as long again to delete)
            env_cache = self.dir / "envs"
            env_cache.mkdir()
            for entry in REAL_CACHE.iterdir() if REAL_CACHE.is_dir() else ():
                if not entry.is_dir() or entry.is_symlink():
                    continue
                if any(entry.name == name or re.fullmatch(re.escape(name) + r"-[0-9a-f]{12}", entry.name)
                       for name in removes):
                    subprocess.run(["cp", "-al", str(entry), str(env_cache / entry.name)], check=True)
                else:
                    (env_cache / entry.name).symlink_to(entry)
        self.env = {**os.environ, "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
                    "SPECPARITY_HOME": str(self.home), "SPECPARITY_ENV_CACHE": str(env_cache)}
        if fixture_cache.enabled():  # `fixtures make --dflash`'s fits kept across pages and runs, as a reader's are
            self.env[build_cache.CACHE_VAR] = str(fixture_cache.ROOT.parent / "fixture-builds")
        for var in [v for v in self.env if v.startswith(("PYTEST_", "COV_"))]:
            del self.env[var]


@pytest.fixture(scope="session")
def docs_shell(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Where this worker's pages get their folders. A page's folder holds what its lines built (fixtures up to
    hundreds of MB, records, servers' logs): removed at the end unless one of its lines failed, to look at."""
    root = tmp_path_factory.mktemp("docs")
    yield root
    for (shell, _), page in list(_PAGES.items()):
        if shell == str(root) and not page.failed:
            shutil.rmtree(page.dir, ignore_errors=True)


# a page's shell, by its file: a markdown page, or a command module whose --help pages (a group's and its
# subcommands', in that order) are one page: `records html --help` reads the records `records --help` made
_PAGES: dict[tuple[str, str], Page] = {}


def page_of(example: Any) -> Page:
    key = (str(example.namespace["docs_shell"]), example.path)
    if key not in _PAGES:
        lines = [item.example.parsed for item in _page_items.get(example.path, [])] or \
            [r.parsed for _, r in example.document.regions]
        page = Page(example.namespace["docs_shell"], lines[0].source,
                    removes={name for ln in lines for m in re.finditer(r"\benv remove((?:\s+[\w.-]+)+)", ln.command)
                             for name in m.group(1).split()},
                    makes_venv=any(ln.command.startswith("python3 -m venv .venv") and not ln.untested
                                   for ln in lines))
        if any(re.search(r"--engine dflash-mlx\b", ln.command) and "--model" not in ln.command for ln in lines):
            seed_default_dflash_pair(page.home)
        _PAGES[key] = page
    return _PAGES[key]


# every collected line by its page's file, in order (filled at collection)
_page_items: dict[str, list[SybilItem]] = {}


def seed_default_dflash_pair(home: Path) -> None:
    """The engine commands' default DFlash pair (a fitted drafter: a minute of CPU) where a reader's home holds it
    once an engine command built it: the tests' cached build of it (tests/dflash_pairs.py, as the engine tests
    use it), linked into each page's home that names ``--engine dflash-mlx`` without ``--model``."""
    from dflash_pairs import dflash_info

    from specparity.fixtures.dflash import DEFAULT_PAIR, dflash_fixture_name

    info = dflash_info(home.parent / "dflash-default", **DEFAULT_PAIR)
    (home / "fixtures").mkdir(parents=True, exist_ok=True)
    (home / "fixtures" / dflash_fixture_name(**DEFAULT_PAIR)).symlink_to(Path(info.target).parent)


def evaluate(example: Any) -> str | None:
    """Run the example's line as typed in its page's folder; a message when its outcome is not the page's.
    After the page's last line, its folder goes at once (gigabytes for some pages: the README's venv, the
    engines' fixtures), not in one worker's session teardown at the end of the run (30-40 s of it)."""
    problem = _evaluate(example)
    items = _page_items.get(example.path, [])
    page = page_of(example)
    if items and items[-1].example is example and not page.failed:
        shutil.rmtree(page.dir, ignore_errors=True)
    return problem


def after_check(target: str, cwd: Path, command: str, proc: subprocess.CompletedProcess[str]) -> list[str]:
    """AFTER's check of a line that did what its page says, on its ``--out`` (or ``--record-dir``) folder: its
    failure as a problem."""
    import importlib

    module, func = target.split(":")
    flag = "--out " if "--out " in command else "--record-dir "
    out = cwd / command.split(flag, 1)[1].split()[0]
    try:
        getattr(importlib.import_module(module), func)(out, proc.stdout, proc.stderr)
    except AssertionError as err:
        return [f"{target}: {str(err)[:2000] or 'an assertion failed'}"]
    return []


def _evaluate(example: Any) -> str | None:
    line: DocLine = example.parsed
    require_builds(doclines.needs(line))
    page = page_of(example)
    if line.serves:
        problem = serve_until_ctrl_c(page, line)
        page.failed |= problem is not None
        return problem
    try:
        proc = subprocess.run(["bash", "-c", line.text], cwd=page.cwd, env=page.env, capture_output=True,
                              text=True, errors="replace", stdin=subprocess.DEVNULL, timeout=900)
    except subprocess.TimeoutExpired:
        page.failed = True
        return f"{line.source}:{line.line}: `{line.command}` ran past 900 s"
    problems = []
    if proc.returncode != line.exit_code:
        problems.append(f"exit {proc.returncode} where the page says {line.exit_code}")
    if line.output is not None:
        expected = tuple(doclines.normalize(e) for e in line.output)
        mismatch = doclines.output_mismatch(expected, doclines.normalize(proc.stdout, str(page.cwd), str(page.home)))
        if mismatch:
            problems.append(mismatch)
    if not problems and (line.source, line.command) in AFTER:
        problems += after_check(AFTER[line.source, line.command], page.cwd, line.command, proc)
    if not problems:
        return None
    page.failed = True
    return (f"{line.source}:{line.line}: `{line.command}`: " + "; ".join(problems)
            + f"\n--- stdout (last 3000 chars)\n{proc.stdout[-3000:]}\n--- stderr (last 3000 chars)\n"
            + proc.stderr[-3000:])


def require_builds(n: doclines.Needs) -> None:
    """A line that needs a one-time build runs where it is built; a skip otherwise, a failure under CI (as
    tests/conftest.py's llama_server_bin): no test builds anything, and CI never passes by skipping."""
    from builds import REAL_CACHE

    from specparity.environments import find_environment
    from specparity.engines.llama_cpp.served import find_llama_server

    missing = [f"environment {e} is not built: run scripts/build-env {e}" for e in n.environments
               if find_environment(e, root=REAL_CACHE) is None]
    if n.llama_server and not find_llama_server():
        missing.append("llama-server is not built: run scripts/build-llama-server")
    if missing:
        if os.environ.get("CI"):
            pytest.fail("; ".join(missing) + " (CI is set: a missing build fails, never skips)")
        pytest.skip("; ".join(missing))


@contextlib.contextmanager
def port_lock(port: int) -> Iterator[None]:
    """Pages that serve on one fixed port take turns (the workers are separate processes)."""
    with open(Path(tempfile.gettempdir()) / f"specparity-docs-port-{port}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def serve_until_ctrl_c(page: Page, line: DocLine, start_timeout: float = 300) -> str | None:
    """A server line: it answers ``GET /v1/models`` on its port, then stops on Ctrl-C (specparity serve with
    exit 130, as serve.md says)."""
    m = re.search(r"--port[ =](\d+)", line.command)
    port = int(m[1]) if m else 8080
    where = f"{line.source}:{line.line}: `{line.command}`"
    with port_lock(port):
        log = page.dir / f"server-{line.line}.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(["bash", "-c", "exec " + line.text], cwd=page.cwd, env=page.env, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.monotonic() + start_timeout
            while True:
                if proc.poll() is not None:
                    return f"{where}: exited {proc.returncode} before it answered\n{log.read_text()[-3000:]}"
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as r:
                        if r.status == 200:
                            break
                except (urllib.error.URLError, OSError):
                    pass
                if time.monotonic() > deadline:
                    return f"{where}: no answer on port {port} in {start_timeout:.0f} s\n{log.read_text()[-3000:]}"
                time.sleep(0.5)
            os.killpg(proc.pid, signal.SIGINT)
            try:
                code = proc.wait(60)
            except subprocess.TimeoutExpired:
                return f"{where}: still running 60 s after Ctrl-C"
            if line.command.startswith("specparity serve ") and code != 130:
                return f"{where}: exit {code} after Ctrl-C where serve.md says 130\n{log.read_text()[-3000:]}"
            return None
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()



@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Move the long pages' lines (PAGE_ORDER) to start right after the suite's first START_AFTER longest modules
    (tests/conftest.py has put those first); every other item keeps its place."""
    from conftest import LONGEST_FIRST

    first = {f"{name}.py" for name in LONGEST_FIRST[:START_AFTER]}
    rank = {page: i for i, page in enumerate(PAGE_ORDER)}
    long_pages = [i for i in items if isinstance(i, SybilItem) and i.nodeid.split("::")[0] in rank]
    if not long_pages:
        return
    moved = set(map(id, long_pages))
    rest = [i for i in items if id(i) not in moved]
    at = max((n + 1 for n, i in enumerate(rest) if Path(str(i.fspath)).name in first), default=0)
    long_pages.sort(key=lambda i: rank[i.nodeid.split("::")[0]])  # stable: a page's lines keep their order
    items[:] = rest[:at] + long_pages + rest[at:]
