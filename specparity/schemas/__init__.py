"""JSON Schemas (draft 2020-12) of what specparity prints and writes, published with the package.

One ``<command>.schema.json`` per command's ``--json`` output (``served``,
``records-show``, ``gate-check``, ...): the process's ``verdict`` and ``exit_code`` at the
top, and on an error the object its ``$defs/error`` describes instead (``{"verdict":
"error", "exit_code": 2, "error": "<the line>"}``); ``error-object`` is that object alone,
the schema of an argv whose command has no ``--json`` output of its own. One per record data file
(``record-report``: report.json, ``record-identity``: identity.json,
``record-served-arm`` / ``record-served-request`` / ``record-served-diagnosis``: a
served record's JSONL lines, ``record-part``: any other command's JSONL line). A CI step reads
them with any JSON Schema validator; the test suite validates every output
it produces against them. (``specparity.schema`` is something else: the
readers' own type checks of a record they open.)

Nothing here imports a validator: :func:`load` gives the schema as a dict.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

# the global options that take a value (cli.py): skipped with it when an argv is read
_GLOBAL_VALUED = ("--max-width", "--max-positions", "--max-samples", "--max-items")
# the error object alone (what a usage error prints): the schema of an argv without --json output of its own
ERROR_OBJECT = "error-object"
# record kinds (report.json's ``kind``) -> the schema of their summary (the command's to_dict)
_SUMMARY = {"probe": "probe", "gate": "gate-check", "bisect": "bisect", "replay": "replay", "dist": "dist",
            "accept": "accept", "e2e": "e2e", "diagnose": "diagnose"}


def names() -> list[str]:
    """Every published schema, by name (``served``, ``record-report``, ...)."""
    return sorted(p.name.removesuffix(".schema.json") for p in _root().iterdir()
                  if p.name.endswith(".schema.json"))


def path(name: str) -> Path:
    """The file of schema ``name``."""
    return Path(str(_root() / f"{name}.schema.json"))


def load(name: str) -> dict[str, Any]:
    """Schema ``name`` as a dict (a KeyError naming it when there is none)."""
    p = path(name)
    if not p.is_file():
        raise KeyError(f"no schema {name!r} (published: {', '.join(names())})")
    data: dict[str, Any] = json.loads(p.read_text())
    return data


def for_argv(argv: list[str]) -> str:
    """The schema of what ``specparity ARGV --json`` prints: the command's, or ``error-object`` where it has no
    ``--json`` output (no command, an unknown one, ``serve``, ``env build``: a usage error's object)."""
    name = _command_schema(argv)
    return name if name is not None and path(name).is_file() else ERROR_OBJECT


def _command_schema(argv: list[str]) -> str | None:
    words: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a in _GLOBAL_VALUED:
            skip = True
        elif not a.startswith("-"):
            words.append(a)
        if len(words) == 2:
            break
    if not words:
        return None
    cmd, sub = words[0], (words[1] if len(words) > 1 else "")
    if cmd in ("probe", "dist", "accept", "e2e", "served", "diagnose"):
        return cmd
    if cmd == "replay":
        return "replay-locate" if any(a == "--locate" or a.startswith("--locate=") for a in argv) else "replay"
    if cmd == "bisect":
        return "bisect-dump" if sub == "dump" else "bisect"
    if cmd == "records":
        return "served" if sub == "merge" else f"records-{sub}"
    if cmd in ("gate", "env", "fixtures"):
        return f"{cmd}-{sub}"
    return None


def for_record_file(file: Path, kind: str) -> str:
    """The schema of one of a record's data files (``kind``: report.json's, e.g. ``served``)."""
    if file.name == "report.json":
        return "record-report"
    if file.name == "identity.json":
        return "record-identity"
    if kind == "served" and file.suffix == ".jsonl":
        return {"arms": "record-served-arm", "diagnoses": "record-served-diagnosis"}.get(file.stem,
                                                                                        "record-served-request")
    return "record-part"


def for_summary(kind: str) -> str | None:
    """The schema of a complete record's ``summary`` (the command's result), by its kind (None: its own)."""
    return _SUMMARY.get(kind)


def _root() -> Any:
    return resources.files(__name__)
