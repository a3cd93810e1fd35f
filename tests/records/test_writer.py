"""The record writer claims fresh names and never overwrites."""

from __future__ import annotations

import json

import pytest

from specparity.errors import UsageError
from specparity.records.writer import RecordWriter


def test_names_never_collide_and_nothing_is_overwritten(tmp_path):
    a = RecordWriter(tmp_path, "probe-llama", {"host": "x"})
    a.append("cells", {"width": 2})
    a.finish("# first\n")
    b = RecordWriter(tmp_path, "probe-llama", {"host": "x"})
    assert b.name == a.name + "-2"
    assert a.md_path.read_text() == "# first\n"
    # a stray data dir with the next name is skipped, not reused
    (tmp_path / "data" / (a.name + "-3")).mkdir()
    c = RecordWriter(tmp_path, "probe-llama", {})
    assert c.name == a.name + "-4"
    with pytest.raises(FileExistsError):
        a.write_json("identity.json", {})
    assert json.loads((a.data_dir / "identity.json").read_text()) == {"host": "x"}
    assert (a.data_dir / "cells.jsonl").read_text() == '{"width": 2}\n'


def test_record_dir_that_is_a_file_is_a_usage_error(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(UsageError, match="^record-dir .*exists and is not a directory"):
        RecordWriter(f, "probe", {})
