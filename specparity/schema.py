"""Typed checks for the files users hand us: one declarative table per file kind.

A job file (harness.config), a server profile (harness.profiles) and a record's
JSON (records.record, records.served) are each described by a table of small
checkers, and checked whole before any value is used::

    JOB = Fields({"widths": ListOf(Int(1, limit="max_width"), scalar=True, min_len=1),
                  "env": MapOf(EnvValue(), key=EnvName()), ...})
    check(raw, JOB, "--config job.yaml")

A value that does not fit is one :class:`~specparity.errors.UsageError` naming
the file, the key path and what was expected::

    --config job.yaml: pairings[0].target: expected a path or hub id (a string), got 5 (an integer)

Files are read through :func:`read_text` (a regular file, bounded size, UTF-8),
YAML through :func:`load_yaml` (``yaml.SafeLoader`` with the document's
expanded size, in values and in characters, and its nesting bounded: an alias
bomb is refused before anything walks it), and JSON (a JSONL line, an HTTP
request body) through :func:`load_json` (UTF-8, nesting bounded by the same
MAX_YAML_DEPTH).
"""

from __future__ import annotations

import math
import os
import re
import reprlib
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from specparity.errors import UsageError

# bounds on a user's file: far above any real job, profile or record, far below what stalls a machine
MAX_FILE_BYTES = 4 << 20
MAX_YAML_NODES = 200_000   # scalars, lists and mappings, every alias expanded
MAX_YAML_CHARS = MAX_FILE_BYTES  # every scalar's characters, every alias expanded: what the file could hold
MAX_YAML_DEPTH = 64
MAX_REQUEST_BYTES = 4 * MAX_FILE_BYTES  # an HTTP request body (a long chat with inline images)
MAX_JSON_DEPTH = MAX_YAML_DEPTH  # a JSON document's lists and mappings, nested

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_repr = reprlib.Repr()
_repr.maxstring = 48
_repr.maxother = 48
_repr.maxlist = _repr.maxdict = _repr.maxset = 4
_repr.maxlevel = 2


class Invalid(Exception):
    """A value that does not fit its checker: ``path`` (keys and indices from the top), ``message``."""

    def __init__(self, path: tuple[Any, ...], message: str):
        super().__init__(message)
        self.path = path
        self.message = message


def kind(value: Any) -> str:
    """A value's type as a YAML or JSON reader says it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, (bytes, bytearray)):
        return "binary data"
    if isinstance(value, (set, frozenset)):
        return "a set"
    return f"a {type(value).__name__}"


def describe(value: Any) -> str:
    """``5 (an integer)``: the value, cut short, and its type."""
    return f"{_repr.repr(value)} ({kind(value)})"


def key_path(path: Iterable[Any]) -> str:
    """``pairings[0].target``, ``env['A=B']``."""
    out = ""
    for part in path:
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
        elif isinstance(part, str) and _IDENT.match(part):
            out += f".{part}" if out else part
        else:
            out += f"[{_repr.repr(part)}]"
    return out


def check(value: Any, checker: Check, where: str) -> None:
    """``value`` fits ``checker``, or a UsageError naming ``where`` (the file), the key path and the problem."""
    try:
        checker.check(value, ())
    except Invalid as bad:
        at = key_path(bad.path)
        raise UsageError(f"{where}: {at + ': ' if at else ''}{bad.message}") from None


class Check:
    """A checker: ``what`` says what fits (``an integer >= 1``); :meth:`check` raises Invalid."""

    what = "a value"

    def check(self, value: Any, path: tuple[Any, ...]) -> None:
        raise NotImplementedError

    def fail(self, value: Any, path: tuple[Any, ...], what: str | None = None) -> Invalid:
        return Invalid(path, f"expected {what or self.what}, got {describe(value)}")


class Anything(Check):
    what = "any value"

    def check(self, value: Any, path: tuple[Any, ...]) -> None:
        return None


class Str(Check):
    """A string (no NUL byte: it could not reach a file name, argv or environment).

    nonempty: refuse ''. pattern: a regex it must match (``what`` says what that means).
    """

    def __init__(self, what: str = "a string", nonempty: bool = False, pattern: re.Pattern[str] | None = None):
        self.what, self.nonempty, self.pattern = what, nonempty, pattern

    def check(self, value: Any, path: tuple[Any, ...]) -> None:
        if not isinstance(value, str) or "\0" in value or (self.nonempty and not value.strip()) \
                or (self.pattern is not None and not self.pattern.match(value)):
            raise self.fail(value, path)


class Scalar(Check):
    """A string or a number, read as its text (an argv item: ``-c: 4096``); never true/false or null."""

    what = "a string or a number"

    def check(self, value: Any, path: tuple[Any, ...]) -> None:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)) or \
                (isinstance(value, str) and "\0" in value):
            raise self.fail(value, path)


class Bool(Check):
    what = "true or false"

    def check(self, value: Any, path: tuple[Any, ...]) -> None:
        if not isinstance(value, bool):
            raise self.fail(value, path)


class Int(Check):
    """An integer (never true/false) in [lo, hi]; ``limit``: hi is that limit of specparity.limits
    (``max_width``, ``max_positions``), raisable as its message says."""

    def __init__(self, lo: int | None = None, hi: int | None = None, limit: str | None = None):
        self.lo, self.hi, self.limit = lo, hi, limit
        self.what = (f"an integer in [{lo}, {hi}]" if lo is not None and hi is not None
                     else f"an integer >= {lo}" if lo is not None else "an integer")

    def check(self, value: Any, path: tuple[Any, ...]) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(value, path)
        if self.lo is not None and value < self.lo:
            raise self.fail(value, path)
        if self.hi is not None and value > self.hi:
            raise self.fail(value, path)
        if self.limit is not None:
            _within(value, self.limit, path, f"{value} is")


def _within(n: int, limit: str, path: tuple[Any, ...], what: str) -> None:
    """``n`` within ``limit`` of specparity.limits (``max_width``, ``max_items``...), else Invalid
    saying ``what`` (``5000 is``, ``2000 items are``) and how to raise it."""
    from specparity.limits import limits, raise_it

    cap = getattr(limits(), limit)
    if n > cap:
        raise Invalid(path, f"{what} above the maximum {cap} {raise_it(limit)}")


class Number(Check):
    """A finite number (never true/false) with optional bounds: ``gt`` / ``ge`` below, ``lt`` / ``le`` above.
    ``integers``: an integer is a number (False: only a float, as mlx-lm's server reads xtc_*)."""

    def __init__(self, gt: float | None = None, ge: float | None = None, lt: float | None = None,
                 le: float | None = None, what: str | None = None, integers: bool = True):
        self.gt, self.ge, self.lt, self.le, self.integers = gt, ge, lt, le, integers
        bounds = [f"> {gt:g}" if gt is not None else "", f">= {ge:g}" if ge is not None else "",
                  f"< {lt:g}" if lt is not None else "", f"<= {le:g}" if le is not None else ""]
        self.what = what or " ".join(["a finite number" if integers else "a finite float (with a '.')",
                                      *[b for b in bounds if b]])

    def check(self, value: Any, path: tuple[Any, ...]) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float) if self.integers else float):
            raise self.fail(value, path)
        try:
            finite = math.isfinite(value)
        except OverflowError:  # an integer too large for a float
            finite = False
        if not finite:
            raise self.fail(value, path)
        if (self.gt is not None and not value > self.gt) or (self.ge is not None and not value >= self.ge) or \
                (self.lt is not None and not value < self.lt) or (self.le is not None and not value <= self.le):
            raise self.fail(value, path)


# a timeout: finite, > 0, and at most a week (socket timeouts overflow far above that)
MAX_SECONDS = 7 * 24 * 3600.0


def seconds_problem(value: Any) -> str | None:
    """Why ``value`` is not a timeout in seconds (None: it is one). Shared by job keys and flags."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{describe(value)} is not a number of seconds"
    if not math.isfinite(value) or not 0 < value <= MAX_SECONDS:
        return f"{value!r} is not a number of seconds in (0, {MAX_SECONDS:g}]"
    return None


class Seconds(Check):
    what = f"a number of seconds in (0, {MAX_SECONDS:g}]"

    def check(self, value: Any, path: tuple[Any, ...]) -> None:
        if seconds_problem(value) is not None:
            raise self.fail(value, path)


class Enum(Check):
    def __init__(self, values: Iterable[str]):
        self.values = tuple(values)
        self.what = "one of " + ", ".join(self.values)

    def check(self, value: Any, path: tuple[Any, ...]) -> None:
        if not isinstance(value, str) or value not in self.values:
            raise self.fail(value, path)


class Regex(Check):
    what = "a regular expression (a string)"

    def check(self, value: Any, path: tuple[Any, ...]) -> None:
        Str(self.what).check(value, path)
        try:
            re.compile(value)
        except re.error as err:
            raise Invalid(path, f"{_repr.repr(value)} is not a regular expression ({err})") from None


def Module() -> Str:  # noqa: N802 (reads as the other checkers do)
    """A dotted module name (``dflash_mlx``, ``mlx_lm.server``)."""
    return Str("a module name (dotted identifiers)", pattern=_MODULE)


def EnvName() -> Str:  # noqa: N802
    """An environment variable's name."""
    return Str("an environment variable name (letters, digits, _)", pattern=_ENV_NAME)


class Nullable(Check):
    """``inner``, or null."""

    def __init__(self, inner: Check):
        self.inner = inner
        self.what = f"{inner.what} or null"

    def check(self, value: Any, path: tuple[Any, ...]) -> None:
        if value is not None:
            self.inner.check(value, path)


class AnyOf(Check):
    """The first of ``options`` that fits."""

    def __init__(self, *options: Check, what: str | None = None):
        self.options = options
        self.what = what or " or ".join(o.what for o in options)

    def check(self, value: Any, path: tuple[Any, ...]) -> None:
        for o in self.options:
            try:
                o.check(value, path)
                return
            except Invalid:
                continue
        raise self.fail(value, path)


class ListOf(Check):
    """A list of ``item``; ``scalar``: one bare item stands for a list of it. ``limit``: its length
    is within that limit of specparity.limits (``max_items``), checked before any item."""

    def __init__(self, item: Check, min_len: int = 0, max_len: int | None = None, scalar: bool = False,
                 what: str | None = None, limit: str | None = None):
        self.item, self.min_len, self.max_len, self.scalar, self.limit = item, min_len, max_len, scalar, limit
        self.what = what or f"a list{' (not empty)' if min_len else ''}, each item {item.what}"

    def check(self, value: Any, path: tuple[Any, ...]) -> None:
        if self.scalar and not isinstance(value, list):
            value = [value]
        if not isinstance(value, list):
            raise self.fail(value, path)
        if len(value) < self.min_len or (self.max_len is not None and len(value) > self.max_len):
            raise self.fail(value, path)
        if self.limit is not None:
            _within(len(value), self.limit, path, f"{len(value)} items are")
        for i, v in enumerate(value):
            self.item.check(v, (*path, i))


class MapOf(Check):
    """A mapping of ``key`` (default: a string or a number, read as its text) to ``value``."""

    def __init__(self, value: Check, key: Check | None = None, what: str | None = None):
        self.value, self.key = value, key or Scalar()
        self.what = what or f"a mapping, each value {value.what}"

    def check(self, value: Any, path: tuple[Any, ...]) -> None:
        if not isinstance(value, dict):
            raise self.fail(value, path)
        for k, v in value.items():
            try:
                self.key.check(k, path)
            except Invalid:
                raise Invalid(path, f"key {_repr.repr(k)}: expected {self.key.what}") from None
            self.value.check(v, (*path, k))


class Fields(Check):
    """A mapping with these keys (``required`` ones must be there); any other key is refused, named
    with the known ones, unless ``open`` (a record written by a newer version may carry more)."""

    def __init__(self, fields: Mapping[str, Check], required: Iterable[str] = (), open: bool = False,  # noqa: A002
                 what: str = "a mapping"):
        self.fields, self.required, self.open, self.what = dict(fields), tuple(required), open, what

    def check(self, value: Any, path: tuple[Any, ...]) -> None:
        if not isinstance(value, dict):
            raise self.fail(value, path)
        if not self.open:
            unknown = [k for k in value if k not in self.fields]
            if unknown:
                raise Invalid(path, f"unknown key {_repr.repr(unknown[0])}"
                                    f" (known: {', '.join(sorted(self.fields))})")
        for k in self.required:
            if k not in value:
                raise Invalid((*path, k), f"missing (expected {self.fields[k].what})")
        for k, checker in self.fields.items():
            if k in value:
                checker.check(value[k], (*path, k))


class Json(Check):
    """A JSON value: strings, finite numbers, true/false, null, lists, mappings with string keys.
    ``limit``: every list in it is within that limit of specparity.limits (``max_items``)."""

    what = "a JSON value (string, number, true/false, null, list, mapping)"

    def __init__(self, limit: str | None = None):
        self.limit = limit

    def check(self, value: Any, path: tuple[Any, ...]) -> None:
        if value is None or isinstance(value, (str, bool, int)):
            return
        if isinstance(value, float):
            if not math.isfinite(value):
                raise self.fail(value, path)
            return
        if isinstance(value, list):
            if self.limit is not None:
                _within(len(value), self.limit, path, f"{len(value)} items are")
            for i, v in enumerate(value):
                self.check(v, (*path, i))
            return
        if isinstance(value, dict):
            for k, v in value.items():
                if not isinstance(k, str):
                    raise Invalid(path, f"key {describe(k)}: a JSON key is a string")
                self.check(v, (*path, k))
            return
        raise self.fail(value, path)


# -- files ------------------------------------------------------------------------------------------
def read_bytes(path: str | os.PathLike[str], where: str, max_bytes: int = MAX_FILE_BYTES) -> bytes:
    """A regular file's bytes, at most ``max_bytes``; else a UsageError naming ``where``."""
    p = Path(path)
    try:
        st = p.stat()
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{where}: not a regular file")
        if st.st_size > max_bytes:
            raise UsageError(f"{where}: {st.st_size} bytes, more than the {max_bytes} bytes a file may hold here")
        with open(p, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as err:
        raise UsageError(f"{where}: {err.strerror or err}") from None
    if len(data) > max_bytes:
        raise UsageError(f"{where}: more than the {max_bytes} bytes a file may hold here")
    return data


def read_text(path: str | os.PathLike[str], where: str, max_bytes: int = MAX_FILE_BYTES) -> str:
    """A regular file's text: UTF-8, at most ``max_bytes``; else a UsageError naming ``where``."""
    data = read_bytes(path, where, max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UsageError(f"{where}: not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start})") from None


def load_json(data: str | bytes, where: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """One JSON document (text, or bytes that must be UTF-8) with at most ``max_depth`` levels of
    lists and mappings; anything else is a UsageError naming ``where``. Python's reader accepts
    NaN and Infinity: the checkers that read numbers refuse them, naming the key."""
    import json

    if isinstance(data, (bytes, bytearray)):
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as err:
            raise UsageError(f"{where}: not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start})") from None
    else:
        text = data
    try:
        value = json.loads(text)
    except RecursionError:
        raise UsageError(f"{where}: nested deeper than {max_depth} levels") from None
    except ValueError as err:  # JSONDecodeError, or an integer of more digits than Python converts
        raise UsageError(f"{where}: not JSON ({str(err).splitlines()[0]})") from None
    _json_depth(value, where, max_depth)
    return value


def _json_depth(root: Any, where: str, max_depth: int) -> None:
    """Refuse a value nested deeper than ``max_depth`` (walked without recursion: what follows it
    may recurse, a chat template or ``json.dumps``)."""
    stack: list[tuple[Any, int]] = [(root, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (list, dict)):
            if depth >= max_depth:
                raise UsageError(f"{where}: nested deeper than {max_depth} levels")
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))


def load_yaml(text: str, where: str) -> Any:
    """One YAML document, read by ``yaml.SafeLoader`` once its node graph is known to be small:
    at most MAX_YAML_NODES nodes and MAX_YAML_CHARS characters of scalars with every alias
    expanded, MAX_YAML_DEPTH levels, no alias inside itself. Anything else is a UsageError
    naming ``where``."""
    import yaml

    class BoundedLoader(yaml.SafeLoader):
        def compose_document(self) -> Any:
            node = super().compose_document()
            _bound(node, where)
            return node

    try:
        return yaml.load(text, Loader=BoundedLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as err:
        raise UsageError(f"{where}: not valid YAML ({str(err).splitlines()[0]})") from None
    except RecursionError:
        raise UsageError(f"{where}: nested too deeply") from None
    except (ValueError, TypeError, OverflowError) as err:  # a tagged scalar that does not construct
        raise UsageError(f"{where}: not valid YAML ({str(err).splitlines()[0] if str(err) else err!r})") from None


def load_yaml_file(path: str | os.PathLike[str], where: str) -> Any:
    """:func:`read_text` then :func:`load_yaml`."""
    return load_yaml(read_text(path, where), where)


def _bound(root: Any, where: str) -> None:
    """Measure ``root`` as a reader that walks it sees it (every alias expanded), without expanding
    anything: each node's expanded count of nodes and of scalar characters once, memoized; a node
    reached from inside itself is a recursive alias. One long string aliased many times is as
    large as that many copies (``stop: [&s '<3 MiB>', *s, *s, ...]``: gigabytes once serialized)."""
    import yaml

    size: dict[int, tuple[int, int]] = {}  # id(node) -> (nodes, scalar characters), both capped
    on_path: set[int] = set()
    stack: list[tuple[Any, int]] = [(root, 0)]
    while stack:
        node, depth = stack.pop()
        key = id(node)
        if key in size:
            continue
        children: list[Any] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        elif isinstance(node, yaml.ScalarNode):
            size[key] = (1, len(node.value))
            if size[key][1] > MAX_YAML_CHARS:
                raise UsageError(f"{where}: more than {MAX_YAML_CHARS} characters once its aliases are expanded")
            continue
        if key in on_path:  # every child is measured: this node's size is known now
            on_path.discard(key)
            nodes = min(MAX_YAML_NODES + 1, 1 + sum(size[id(c)][0] for c in children))
            chars = min(MAX_YAML_CHARS + 1, sum(size[id(c)][1] for c in children))
            size[key] = (nodes, chars)
            if nodes > MAX_YAML_NODES:
                raise UsageError(f"{where}: more than {MAX_YAML_NODES} values once its aliases are expanded")
            if chars > MAX_YAML_CHARS:
                raise UsageError(f"{where}: more than {MAX_YAML_CHARS} characters once its aliases are expanded")
            continue
        if depth > MAX_YAML_DEPTH:
            raise UsageError(f"{where}: nested deeper than {MAX_YAML_DEPTH} levels")
        on_path.add(key)
        stack.append((node, depth))
        for c in children:
            if id(c) in on_path:
                raise UsageError(f"{where}: an alias refers to a value that holds it (a recursive alias)")
            if id(c) not in size:
                stack.append((c, depth + 1))
