"""mtplx's entry points, each imported (``runtime.load``, ``generate_ar`` / ``generate_mtp1`` /
``generate_mtpk``, the CLI, the server): on Linux each that does not import is ``cannot_run`` with its own
cause; ``runtime.load`` loads the MTP fixture through mtplx's own coverage check."""

from __future__ import annotations

import sys
from typing import Any

from specparity.probes.engine_e2e import Classic, Finding, failed
from specparity.verdicts import Verdict


MTPLX_ENTRY_POINTS = (("runtime.load", "mtplx.runtime", "load"), ("generate_ar", "mtplx.generation", "generate_ar"),
                      ("generate_mtp1", "mtplx.generation", "generate_mtp1"),
                      ("generate_mtpk", "mtplx.generation", "generate_mtpk"), ("mtplx CLI", "mtplx.cli", "main"),
                      ("mtplx server", "mtplx.server.openai", None))


def check_mtp_fixture(target: str) -> dict[str, Any]:
    """An MTP target checked by mtplx's own loaders (those that import on Linux): its strict coverage check
    of the ``qwen3_5`` head (``qwen3_5_mtp_patch._validate_load_coverage`` of the module tree it builds,
    ``_make_qwen3_5_mtp_module``, against the weights its reader ``mtp_patch._load_mtp_weights`` takes from
    ``expected_mtp_file``), then ``runtime.load`` (the head attached: ``mtp_enabled``, ``validate_mtp_support``).
    Each step's own error, where it raises."""
    from pathlib import Path

    out: dict[str, Any] = {"target": target}
    try:
        from mlx_lm.models.qwen3_5 import TextModelArgs
        from mtplx.artifacts import expected_mtp_file, load_config, text_config
        from mtplx.mtp_patch import _load_mtp_weights, _num_mtp_layers
        from mtplx.qwen3_5_mtp_patch import _make_qwen3_5_mtp_module, _validate_load_coverage

        config = load_config(Path(target))
        out["mtp_file"] = str(expected_mtp_file(Path(target), config))
        out["mtp_layers"] = _num_mtp_layers(config)
        weights = _load_mtp_weights(Path(out["mtp_file"]), config)
        out["tensors"] = len(weights)
        _validate_load_coverage(_make_qwen3_5_mtp_module(TextModelArgs.from_dict(text_config(config))), weights)
        out["coverage"] = "exact"
    except Exception as err:  # noqa: BLE001  (mtplx's own words are the finding)
        out["coverage"] = f"{type(err).__name__}: {err}"
    try:
        from mtplx import runtime
        from mtplx.mtp_patch import validate_mtp_support

        rt = runtime.load(target)
        out["mtp_enabled"] = bool(rt.mtp_enabled)
        out["validated"] = bool(validate_mtp_support(rt.model))
    except Exception as err:  # noqa: BLE001
        out["load_error"] = f"{type(err).__name__}: {err}"
    return out



def loops(target: str, draft: str | None, prompt: list[int], n: int, ref: Classic,
          entries: tuple[str, ...] = ()) -> list[Finding]:
    """Each mtplx entry point imported: what does not import here is ``cannot_run`` with its own cause.
    ``target``: an MTP fixture (``fixtures make --drafter-format mtp``): ``runtime.load`` loads it."""
    import importlib

    out = []
    for entry, module, attr in MTPLX_ENTRY_POINTS:
        if entries and entry not in entries:
            continue
        f = Finding("mtplx", entry)
        try:
            mod = importlib.import_module(module)
            if attr is not None:
                getattr(mod, attr)
            f.verdict, f.reason = Verdict.ERROR, "imports here, but no MTP fixture drives it yet: not a pass"
            if entry == "runtime.load" and target:
                got = check_mtp_fixture(target)
                f.failure = got.get("load_error") or ""
                f.reason = (f"loads the MTP target (MTP heads attached: {got.get('mtp_enabled')}, validated:"
                            f" {got.get('validated')}; coverage: {got.get('coverage')}), but its generation"
                            " cannot run here: nothing to compare, not a pass")
        except BaseException as err:  # noqa: BLE001  (an import may raise anything, SystemExit included)
            failed(f, err)
            f.verdict, f.reason = Verdict.CANNOT_RUN, f"{module} does not import on {sys.platform}"
        out.append(f)
    return out

