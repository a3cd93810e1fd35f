"""The docs tier (conftest.py): every documented command line, run as typed.

A package, so its conftest imports as ``docs.conftest``: a second top-level ``conftest`` module would take the
name the suite's modules import ``run_cli`` and the fixture builders from (``from conftest import ...``)."""
