"""dfly-mlx as an engine: dflash-mlx's target adapter, verify forward and rollback, under DFly's loader and loop.

dfly-mlx 0.1.0 (``pip install dfly-mlx``) adds a drafter, not a target path: its
``load_runtime`` (``dfly_mlx.loading``) loads the target with dflash-mlx's own
``load_target_bundle`` (verify mode ``dflash``), binds its ``DFlyDraftModel``
to the target and returns a ``RuntimeBundle`` whose ``target_ops`` is
dflash-mlx's ``TargetOps``; its ``generate`` runs dflash-mlx's
``stream_dflash_generate`` with that bundle, copy-from-history speculation off
and the drafter's whole block every round. So what verifies and rolls back
is dflash-mlx's own code (``verify_block``, ``arm_rollback``,
``restore_after_acceptance``), reached through dfly-mlx's bundle:

- :class:`DflyEngine` is :class:`~specparity.engines.dflash_mlx.adapter.DflashEngine`
  loaded by ``load_runtime`` (the bundle dfly-mlx's entry points use) and run with
  dfly-mlx's loop policy; its sessions are dflash-mlx's
  (:class:`~specparity.engines.dflash_mlx.adapter.DflashSession`), its verify widths the
  drafter's block only (verify mode ``dflash`` has no adaptive reduced block);
- :meth:`DflyEngine.generate` is dflash-mlx's loop as ``dfly_mlx.generate`` calls it
  (``copyspec_mode="off"``, ``block_tokens`` the drafter's block), on the prompt's ids
  rather than its no-thinking chat template, each round recorded (source ``dfly``).

The target is loaded twice from the same files: by dflash-mlx's loader for the
engine, by ``mlx_lm.load`` for classic decode (dflash-mlx's class patches taken out
while it runs, :meth:`DflashEngine.classic`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from specparity.engines.dflash_mlx.adapter import DflashEngine

NAME = "dfly-mlx"


class DflyEngine(DflashEngine):
    """dfly-mlx loaded on a target and its DFly drafter by ``dfly_mlx.loading.load_runtime``."""

    name = NAME
    source = "dfly"
    reduced_block = None

    def __init__(self, target: str | Path, draft: str | Path | None, prefill_step_size: int | None = None):
        from specparity.errors import UsageError

        if draft is None:
            # load_runtime binds the drafter to the target before anything can verify
            raise UsageError("--engine dfly-mlx: its loader (load_runtime) takes the target with its DFly"
                             " drafter: give --draft-model")
        # dfly_mlx.generate's policy: verify mode dflash (as load_runtime loads the target)
        super().__init__(target, draft, prefill_step_size=prefill_step_size, verify_mode="dflash")
        self.info.notes.insert(1, "loaded by dfly_mlx.loading.load_runtime; verify and rollback: dflash-mlx's"
                                  f" {type(getattr(self.target_ops, '_ops', self.target_ops)).__name__}")
        self.info.notes.insert(2, "its loop: dflash-mlx's stream_dflash_generate as dfly_mlx.generate runs it"
                                  f" (copy-from-history off, the drafter's {self.info.block_size}-row block)")

    def _load(self, target: str | Path, draft: str | Path | None) -> None:
        from dfly_mlx.loading import load_runtime

        self.bundle = load_runtime(str(target), str(draft))
        self.target_model, self.target_ops = self.bundle.target_model, self.bundle.target_ops
        self.draft_model = self.bundle.draft_model
        runtime = self.runtime_context.runtime
        if hasattr(runtime, "copyspec_mode"):  # as dfly_mlx.generate turns it off
            self.runtime_context = replace(self.runtime_context, runtime=replace(runtime, copyspec_mode="off"))

    def loop_options(self) -> dict[str, Any]:
        return {"use_chat_template": False, "block_tokens": int(self.draft_model.block_size)}
