"""mtplx 2.12.2: native MTP speculative decoding (heads inside the target, ``mtp.safetensors``).

It declares mlx, mlx-lm and transformers for macOS on Apple silicon only
(``sys_platform == "darwin" and platform_machine == "arm64"``); its environment
here takes them from the toolkit's pins. On Linux ``mtplx.runtime``, its CLI
and its server import, and ``mtplx.generation`` (``generate_ar`` /
``generate_mtp1`` / ``generate_mtpk``) does not: a module it imports opens
``/usr/lib/libSystem.B.dylib`` (a macOS system library) at import. Each entry
point says so (``cannot_run``, its own error), never a pass; an entry point that
imports but that no MTP fixture drives is an error ("not a pass").

Its fixture: ``specparity fixtures make DIR --dflash qwen3_5 --drafter-format mtp``
(:func:`specparity.engines.mtplx.fixtures.build_mtp_target`), a ``qwen3_5`` target with MTP
heads in its format (``mtp.safetensors``, ``mtp_num_hidden_layers``), which its own
strict coverage check and ``runtime.load`` accept on Linux
(:func:`specparity.probes.engine_e2e.check_mtp_fixture`); the e2e's ``runtime.load``
row says so, and its generation still cannot run here.
"""

from __future__ import annotations

from pathlib import Path

from specparity.engines import DrafterFormat, EngineSpec, PinnedEnv
from specparity.engines.mtplx.loops import MTPLX_ENTRY_POINTS


def default_checkpoints() -> tuple[Path, Path | None]:
    """The default MTP fixture (a qwen3_5 target with its MTP heads, float32), built once; no drafter."""
    from specparity.engines.mtplx.fixtures import build_mtp_target
    from specparity.fixtures import fixtures_home

    info = build_mtp_target(fixtures_home() / "mtp-qwen3_5-float32-untied")
    return Path(info.target), None


ENGINE = EngineSpec(
    name="mtplx",
    description="mtplx 2.12.2: MTP heads inside the target (its generation imports on Apple silicon only)",
    module="mtplx",
    environments=(
        # `import mtplx.generation` fails on Linux: the build checks mlx-lm only (the cause is per entry point)
        PinnedEnv("mtplx", ("mtplx==2.12.2", "mlx-lm==0.31.3"),
                  "mtplx 2.12.2 (declares macOS-only dependencies; generation imports on Apple silicon only)"
                  " on mlx-lm 0.31.3", imports=("mlx_lm",)),
    ),
    # its loops only: no verify block or rollback a probe could drive from outside (probe, replay, bisect)
    e2e_entry_points=tuple(entry for entry, _, _ in MTPLX_ENTRY_POINTS),
    loops="specparity.engines.mtplx.loops:loops",
    default_checkpoints=default_checkpoints,
    drafter_checkpoint=False,
    drafter_format=DrafterFormat("mtp", "specparity.engines.mtplx.fixtures:mtp_format",
                                 "MTP heads inside a qwen3_5 target (mtplx's mtp.safetensors; no drafter)"),
)
