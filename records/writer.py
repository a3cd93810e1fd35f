"""The one record writer.

A record is ``<dir>/<slug>-<host>-<YYYY-MM-DD>[-N].md`` plus
``<dir>/data/<same name>/`` holding ``identity.json``, per-arm JSONL and any
other files. The name is claimed atomically (O_EXCL) so two runs never write
the same record, JSONL lines are flushed as they come (a crash loses no
finished arm), and nothing that exists is ever overwritten.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import socket
from pathlib import Path
from typing import Any

from specparity.errors import InputError
from specparity.inputs import expand_user
from specparity.paths import slugify
from specparity.store import write_new


class RecordWriter:
    """Claims a fresh record name in ``record_dir`` and writes into it.

    md_path: the markdown file (written by :meth:`finish`; a placeholder until then).
    data_dir: ``data/<name>/`` beside it.
    """

    def __init__(self, record_dir: str | os.PathLike, slug: str, identity: dict[str, Any]):
        root = expand_user(record_dir, "record-dir")
        if root.exists() and not root.is_dir():
            raise InputError("record-dir", f"{record_dir}: exists and is not a directory")
        try:
            (root / "data").mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise InputError("record-dir", f"{record_dir}: cannot create ({err.strerror})") from err
        host = slugify(socket.gethostname().split(".")[0])
        date = _dt.date.today().isoformat()
        base = f"{slugify(slug)}-{host}-{date}"
        n = 1
        while True:
            name = base if n == 1 else f"{base}-{n}"
            md = root / f"{name}.md"
            data = root / "data" / name
            try:
                fd = os.open(md, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                n += 1
                continue
            if data.exists():
                os.close(fd)
                os.unlink(md)
                n += 1
                continue
            with os.fdopen(fd, "w") as f:
                f.write(f"# {slug}\n\n(in progress)\n")
            data.mkdir(parents=True)
            break
        self.name = name
        self.md_path = md
        self.data_dir = data
        self.write_json("identity.json", identity)

    def append(self, arm: str, obj: dict[str, Any]) -> None:
        """Append one JSON line to ``data/<name>/<arm>.jsonl`` and flush it."""
        path = self.data_dir / f"{slugify(arm)}.jsonl"
        with open(path, "a") as f:
            f.write(json.dumps(obj, sort_keys=True, default=str) + "\n")
            f.flush()

    def write_json(self, filename: str, obj: Any) -> Path:
        return self.write_bytes(filename, json.dumps(obj, indent=2, default=str).encode())

    def write_bytes(self, filename: str, data: bytes) -> Path:
        path = self.data_dir / filename
        with open(path, "xb") as f:  # never overwrite
            f.write(data)
        return path

    def finish(self, markdown: str) -> Path:
        """Write the markdown (this record's own placeholder is the only thing replaced)."""
        # its own placeholder, replaced by rename: nothing beside it is written through
        write_new(self.md_path, markdown, force=True, flag="--record-dir")
        return self.md_path
