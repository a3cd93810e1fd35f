"""The documented command lines: found in the docs' code blocks and the commands' --help, run as typed.

A *page* (README.md, a docs/*.md page, or one command's ``--help``) is read as a reader follows it: its
command lines run in order, as typed, in one shell working directory of its own (a fresh copy of the
checkout, so ``scripts/...`` and ``examples/...`` are where the page says), each line's outcome checked
against what the page states:

- a line's exit code is 0 unless its trailing comment says ``# exit N`` (``# exit 1 on a regression``);
- a transcript (a block whose lines start with ``$ ``) shows the output: stdout must match it line for line,
  where a line ``...`` stands for any lines and ``...`` inside a line for any text, after the declared
  normalizations (:data:`NORMALIZE`: the page's own folder and $SPECPARITY_HOME, timings, a record's host and
  date); its exit code is the one its closing ``verdict: WORD`` line means (README's exit-code table);
- ``# ... until Ctrl-C`` is a server: it must answer on its port (``--port N``, else 8080), then stop on Ctrl-C
  (``specparity serve`` with exit 130, as serve.md says);
- ``# not tested: REASON`` is a line the docs say this machine cannot run: reported as a skip with the reason,
  never run, never silently dropped.

Only shell lines are commands (:data:`COMMAND`): output samples, log lines and ``python`` / ``yaml`` blocks are
not. Which markers a line carries (model, server, build, slow) follows from what it runs (:func:`needs`).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# a shell line that runs something: optional VAR=value words, then a program the docs use
COMMAND = re.compile(r"""^(?:[A-Z_][A-Z0-9_]*=(?:\$\([^)]*\)|'[^']*'|"[^"]*"|\S*)\s+)*"""
                     r"(?:specparity(?=\s|$)|scripts/[\w.-]|\.venv/bin/|python3?\s|\$\(|jq\s|llama-server\s|curl\s|printf\s|echo\s)")
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
LIST_ITEM = re.compile(r"^(?P<indent>\s*)(?:[-*+]|\d+[.)])\s+")
EXAMPLES = re.compile(r"^(?P<indent>\s*)Examples?:\s*$")
# languages whose blocks hold no shell lines
NOT_SHELL = {"python", "py", "yaml", "yml", "json", "toml"}

# the exit code a closing `verdict: WORD` means (README's table of exit codes)
VERDICT_EXIT = {"equal": 0, "match": 0, "pass": 0, "divergent": 1, "diverged": 1, "fail": 1,
                "inconclusive": 3, "not_run": 3, "not_engaged": 3, "declined": 3, "error": 4}


@dataclasses.dataclass(frozen=True)
class DocLine:
    """One documented command line and the outcome its page states."""

    text: str  # as typed (continuation lines included), without a transcript's "$ "
    source: str  # "README.md", "docs/gate.md", "specparity gate check --help"
    line: int  # 1-based, in the source
    exit_code: int  # what the page says it exits with
    output: tuple[str, ...] | None = None  # a transcript's lines (None: output not shown)
    untested: str | None = None  # "# not tested: REASON"
    serves: bool = False  # "# ... until Ctrl-C"

    @property
    def command(self) -> str:
        """The line without its trailing comments, one physical line."""
        return " ".join(strip_comment(p).rstrip("\\").strip() for p in self.text.splitlines()).strip()

    @property
    def comment(self) -> str:
        return " ".join(c for c in (trailing_comment(p) for p in self.text.splitlines()) if c)


def strip_comment(line: str) -> str:
    i = _comment_at(line)
    return line if i is None else line[:i].rstrip()


def trailing_comment(line: str) -> str:
    i = _comment_at(line)
    return "" if i is None else line[i + 1:].strip()


def _comment_at(line: str) -> int | None:
    """Where bash's comment starts in ``line`` (a ``#`` at a word's start, outside quotes)."""
    quote = None
    for i, c in enumerate(line):
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            return i
    return None


@dataclasses.dataclass
class Block:
    """A code block: where it starts (offset, 1-based line), its info string, and its lines (dedented),
    each with its offset in the text."""

    lang: str
    lines: list[tuple[int, int, str]]  # (offset, line number, text)


def markdown_blocks(text: str) -> Iterator[Block]:
    """Fenced and indented code blocks of a markdown page (Python-Markdown's rules as mkdocs renders them:
    an indented block is 4 spaces past its container, after a blank line)."""
    lines = text.splitlines(keepends=True)
    offsets = [0]
    for ln in lines:
        offsets.append(offsets[-1] + len(ln))
    i, prev_blank, container = 0, True, 0
    while i < len(lines):
        raw = lines[i].rstrip("\n")
        fence = FENCE.match(raw)
        if fence:
            ind, mark = len(fence["indent"]), fence["fence"]
            j = i + 1
            while j < len(lines) and not re.match(rf"^\s*{re.escape(mark[0])}{{{len(mark)},}}\s*$", lines[j]):
                j += 1
            body = [(offsets[k] + min(ind, _indent(lines[k])), k + 1, lines[k].rstrip("\n")[ind:])
                    for k in range(i + 1, min(j, len(lines)))]
            yield Block(fence["info"].strip().split(" ")[0].lower(), body)
            i, prev_blank = j + 1, False
            continue
        if not raw.strip():
            prev_blank = True
            i += 1
            continue
        ind = _indent(raw)
        if prev_blank and ind >= container + 4:
            j, body = i, []
            while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) >= ind):
                body.append((offsets[j] + min(ind, _indent(lines[j])), j + 1, lines[j].rstrip("\n")[ind:]))
                j += 1
            while body and not body[-1][2].strip():
                body.pop()
            yield Block("", body)
            i, prev_blank = j, False
            continue
        item = LIST_ITEM.match(raw)
        container = item.end() if item else ind
        prev_blank = False
        i += 1


def help_blocks(text: str) -> Iterator[Block]:
    """The ``Examples:`` block of a command's help text: the lines indented past the heading."""
    lines = text.splitlines(keepends=True)
    offsets = [0]
    for ln in lines:
        offsets.append(offsets[-1] + len(ln))
    for i, raw in enumerate(lines):
        m = EXAMPLES.match(raw.rstrip("\n"))
        if not m:
            continue
        body, j = [], i + 1
        while j < len(lines) and lines[j].strip() and _indent(lines[j]) > len(m["indent"]):
            ind = _indent(lines[j])
            body.append((offsets[j] + ind, j + 1, lines[j].rstrip("\n")[ind:]))
            j += 1
        yield Block("", body)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def doc_lines(block: Block, source: str) -> Iterator[tuple[int, int, DocLine]]:
    """The command lines of ``block``: (start offset, end offset, line)."""
    if block.lang in NOT_SHELL:
        return
    rows = block.lines
    transcript = any(t.startswith("$ ") for _, _, t in rows)
    k = 0
    while k < len(rows):
        offset, lineno, text = rows[k]
        body = text[2:] if transcript and text.startswith("$ ") else text
        if (transcript and not text.startswith("$ ")) or not COMMAND.match(body):
            k += 1
            continue
        parts = [body]
        while strip_comment(parts[-1]).endswith("\\") and k + 1 < len(rows):
            k += 1
            parts.append(rows[k][2])
        end = rows[k][0] + len(rows[k][2])
        output = None
        if transcript:
            out: list[str] = []
            while k + 1 < len(rows) and not rows[k + 1][2].startswith("$ "):
                k += 1
                out.append(rows[k][2])
                end = rows[k][0] + len(rows[k][2])
            while out and not out[-1].strip():
                out.pop()
            output = tuple(out)
        yield offset, end, _outcome("\n".join(parts), source, lineno, output)
        k += 1


def _outcome(text: str, source: str, lineno: int, output: tuple[str, ...] | None) -> DocLine:
    line = DocLine(text, source, lineno, 0, output)
    comment = line.comment
    untested = re.search(r"not tested: (.+)", comment)
    said = re.search(r"\bexit (\d+)\b", comment)
    code = 0
    if said:
        code = int(said[1])
    elif output:
        verdict = re.fullmatch(r"verdict: (\w+)", output[-1].strip())
        code = VERDICT_EXIT[verdict[1]] if verdict else 0
    return dataclasses.replace(line, exit_code=code, untested=untested[1].strip() if untested else None,
                               serves="until Ctrl-C" in comment)


# --- what a line needs (its markers) --------------------------------------------------------------------

# specparity commands that load no model and start nothing (a fast CLI run: no mlx import at all, or
# only synthetic logits)
NO_MODEL = re.compile(r"^(records|env list|env show|env path|env remove|fixtures formats|dist)\b|--help\b"
                      r"|\breplay\b.*--algebra-only")
# lines that load no model and still take seconds: a user's Python rule drawn a million times, a sample sized
# for a small total variation
SLOW = re.compile(r"--rule \S+\.py:|--detect-tv")


@dataclasses.dataclass(frozen=True)
class Needs:
    model: bool = False
    server: bool = False
    environments: tuple[str, ...] = ()  # pinned environments it runs in (the `build` marker)
    llama_server: bool = False  # scripts/build-llama-server's binary (`build`)
    slow: bool = False

    @property
    def build(self) -> bool:
        return bool(self.environments or self.llama_server)


def specparity_calls(command: str) -> list[list[str]]:
    """Each ``specparity ...`` invocation in a command line (``$(...)`` and ``&&`` chains included), as its
    argument words after ``specparity`` and the root options."""
    calls = []
    for piece in re.split(r"&&|\|\||;|\$\(|\)|\|", command):
        try:
            words = shlex.split(piece)
        except ValueError:
            words = piece.split()
        while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
            words = words[1:]
        if words and (words[0] == "specparity" or words[0].endswith("/bin/specparity")):
            args = words[1:]
            while args and args[0].startswith("--max-") or args[:1] == ["--debug"]:
                args = args[2:] if args[0].startswith("--max-") else args[1:]
            calls.append(args)
    return calls


def needs(line: DocLine) -> Needs:
    """What running ``line`` needs: a model, a server, one-time builds; and whether it is slow. A line its page
    says is refused (exit 2: usage) needs nothing: every command checks its input before it loads or starts
    anything (docs/limits.md)."""
    cmd = line.command
    if line.exit_code == 2:
        return Needs()
    model = server = llama = False
    envs: list[str] = []
    for args in specparity_calls(cmd):
        joined = " ".join(args)
        if not NO_MODEL.search(joined):
            model = True
        if args[:1] in (["served"], ["serve"]):
            server = True
        for flag in ("--engine", "--environment"):
            if flag in args[:-1]:
                envs.extend(_environments_of(args[args.index(flag) + 1], flag))
        if "--profile" in args[:-1]:
            profile = args[args.index("--profile") + 1]
            llama |= profile == "llama.cpp"
            if profile not in ("llama.cpp", "mlx-lm", "specparity-serve", "openai"):
                envs.extend(_environments_of(profile, "--engine"))
        if args[:1] == ["env"] and len(args) > 2 and args[1] in ("show", "path", "remove", "build"):
            envs.extend(a for a in args[2:] if not a.startswith("-"))
    words = cmd.split()
    if re.search(r"(^|\s|\$\()scripts/build-llama-server\b|llama-server\s", cmd):
        llama = True
    if "scripts/build-env" in cmd:
        envs.extend(w for w in words[words.index("scripts/build-env") + 1:] if not w.startswith(("-", "&", "#")))
    if "scripts/nightly-parity" in cmd:
        server = model = True
        llama |= "nightly-llama" in cmd
        envs.extend(["dflash-mlx"] if "nightly-dflash" in cmd else [])
        if "--matrix" in words:
            envs.extend(words[words.index("--matrix") + 1].split(","))
    if re.search(r"-m mlx_lm server|llama-server\s", cmd) or line.serves:
        server = model = True
    envs = sorted(set(envs))
    return Needs(model=model, server=server, environments=tuple(envs), llama_server=llama,
                 slow=model or server or bool(envs) or llama or bool(SLOW.search(cmd)))


def _environments_of(name: str, flag: str) -> list[str]:
    """The pinned environment an ``--engine`` (its first) or ``--environment`` value names."""
    if flag == "--environment":
        return [] if name.endswith((".yaml", ".yml")) else [name]
    from specparity.engines import registry

    spec = registry().get(name)
    env = spec.environment if spec is not None else None
    return [env.name] if env is not None else []


# --- comparing a transcript's lines with what the command printed ---------------------------------------


def normalize(text: str, workdir: str | None = None, home: str | None = None) -> str:
    """The declared wildcards: in what a command printed, the page's folder is where paths are relative to
    and the isolated $SPECPARITY_HOME reads as the default one; on both sides, timings and a record's host and
    date are placeholders."""
    if workdir:
        text = text.replace(workdir.rstrip("/") + "/", "")
    if home:
        text = text.replace(home.rstrip("/"), "~/.cache/specparity")
    for pattern, repl in NORMALIZE:
        text = re.sub(pattern, repl, text)
    return text


NORMALIZE = (
    (r"\b\d+(?:\.\d+)? s\b", "<seconds> s"),  # 4.82 s, 94 s
    (r"-[A-Za-z0-9]+-\d{4}-\d{2}-\d{2}(-\d+)?\b", "-<host>-<date>"),  # served-vm-2026-12-02(-2)
)


def output_mismatch(expected: tuple[str, ...], actual: str) -> str | None:
    """None when ``actual`` (already normalized) matches the transcript's ``expected`` lines, else the
    first expected line that did not match, and where."""
    lines = actual.rstrip("\n").split("\n")
    pattern = _line_patterns(expected)
    if _match(pattern, 0, lines, 0):
        return None
    # the longest matching prefix of expected lines names the first that failed
    for n in range(len(pattern), 0, -1):
        if _match(pattern[:n] + [None], 0, lines, 0):
            if n == len(pattern):
                return "the transcript's lines all matched, and more lines were printed after them"
            return f"expected line {n + 1} of the transcript not found: {expected[n]!r}"
    return f"expected line 1 of the transcript not found: {expected[0]!r}"


def _line_patterns(expected: tuple[str, ...]) -> list[re.Pattern[str] | None]:
    """One regex per expected line; None for a line ``...`` (any lines, none included)."""
    out: list[re.Pattern[str] | None] = []
    for e in expected:
        if e.strip() == "...":
            out.append(None)
        else:
            out.append(re.compile(".*?".join(re.escape(p) for p in e.rstrip().split("..."))))
    return out


def _match(pattern: list[re.Pattern[str] | None], i: int, lines: list[str], j: int) -> bool:
    if i == len(pattern):
        return j == len(lines)
    p = pattern[i]
    if p is None:
        return any(_match(pattern, i + 1, lines, k) for k in range(j, len(lines) + 1))
    return j < len(lines) and p.fullmatch(lines[j].rstrip()) is not None and _match(pattern, i + 1, lines, j + 1)


def copy_checkout(dest: Path, link_venv: bool = True) -> None:
    """The checkout's files (as they are in the working tree) under ``dest``, and its ``.venv`` as a link
    (``link_venv``): the folder a reader who cloned the repository and ran README's install types in."""
    import shutil
    import subprocess

    if (ROOT / ".git").exists():
        # tracked files, and new ones not yet committed (not ignored): the tree the installed package runs from
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                                capture_output=True, check=True).stdout.decode().split("\0")
    else:  # a copy of a checkout (tests/docs/test_doclines.py): its files, as they were copied
        listed = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*")
                  if p.is_file() and not {".venv", "__pycache__"} & set(p.relative_to(ROOT).parts)]
    for name in filter(None, listed):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    if link_venv:
        os.symlink(ROOT / ".venv", dest / ".venv")
