"""The in-process bisect: both arms captured once each, the per-layer report, the control arms."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specparity.bisect.arms import BisectCapture, run_arms
from specparity.bisect.report import BisectReport, compare_arms
from specparity.decode import CacheOptions
from specparity.progress import NULL, Observer
from specparity.verdicts import ReportMixin, Verdict


def model_meta(loaded: Any) -> dict[str, Any]:
    """What a report and a dump say about the model: type, fingerprint, dtype, path."""
    from specparity.checkpoint import model_dtype

    fp = loaded.fingerprint
    return {"model_type": fp.model_type, "fingerprint": fp.digest,
            "dtype": model_dtype(loaded.model), "path": str(loaded.path)}


def _engine_of(model: Any, opts: CacheOptions | None) -> Any:
    """An engine adapter is itself; a checkpoint (``Loaded``) goes through mlx-lm's own adapter with ``opts``."""
    from specparity.probes.engines.base import Engine
    from specparity.probes.engines.mlx_lm import MlxLmEngine

    return model if isinstance(model, Engine) else MlxLmEngine(model, opts=opts)


def bisect_model(model: Any, prompt: list[int], width: int, depth: int, opts: CacheOptions | None = None,
                 accepted: int | None = None) -> tuple[BisectCapture, BisectReport]:
    """Run chain and block once each with capture on; compare chain against block.

    model: an engine adapter, or a checkpoint (``Loaded``) bisected through mlx-lm's own adapter with
    ``opts``. accepted: also roll the engine back to ``accepted`` proposals (its state against classic
    decode's over the kept tokens).
    """
    engine = _engine_of(model, opts)
    bc = run_arms(engine, prompt, width, depth, accepted=accepted)
    loaded = engine.checkpoint()
    info = engine.info
    labels: tuple[str | None, str | None] = (None, None)
    if loaded is not None:
        meta = model_meta(loaded)
        meta.update(prompt_tokens=len(prompt), cache_options=engine.cache_options().describe(),
                    capture_bytes=bc.capture_bytes)
    else:
        from specparity.checkpoint import fingerprint, model_dtype

        fp = fingerprint(info.target)
        meta = {"model_type": fp.model_type, "fingerprint": fp.digest,
                "dtype": model_dtype(engine.classic_model()), "path": info.target, "engine": info.to_dict(),
                "prompt_tokens": len(prompt), "capture_bytes": bc.capture_bytes}
        labels = ("classic chain", f"{info.name} block")
    if accepted is not None:
        meta["rollback"] = (f"block arm's cache: the engine's state after its rollback to {accepted} of"
                            f" {width - 1} proposals; chain arm's: classic decode's after {accepted + 1} tokens")
    report = compare_arms(bc.arms["chain"], bc.arms["block"], width, depth, bc.layer_kinds, *labels, meta=meta)
    return bc, report


@dataclass
class BisectRun(ReportMixin):
    """One ``specparity bisect``: the per-layer report, plus the control arms when asked.

    report: chain vs block (BisectReport). controls: ControlsReport, or None.
    bracket: the chain arm repeated from the same state; a repeat that differs
      makes the bisect inconclusive (noise is not blamed on a layer).
    """

    report: BisectReport
    controls: Any = None
    bracket: Any = None

    @property
    def verdict(self) -> Verdict:
        if self.bracket is not None and not self.bracket.reproducible:
            return Verdict.INCONCLUSIVE
        return Verdict(self.report.verdict)

    def lines(self) -> list[str]:
        from specparity.bisect.chart import terminal_bars
        from specparity.bisect.render import render_text

        if self.bracket is not None and not self.bracket.reproducible:
            return [f"inconclusive: {self.bracket.line()}"]
        out = render_text(self.report).rstrip("\n").splitlines()
        if self.bracket is not None:
            out.append(self.bracket.line())
        out += ["", "differing output bytes per row:"] + ["  " + b for b in terminal_bars(self.report)]
        if self.controls is not None:
            out += ["", *self.controls.lines()]
        return out

    def markdown(self, chart_path: str | None) -> list[str]:
        from specparity.bisect.render import render_markdown

        extra = [f"    {x}" for x in self.controls.lines()] if self.controls is not None else []
        if self.bracket is not None:
            extra.insert(0, f"    {self.bracket.line()}")
        return render_markdown(self.report, chart_path, extra).splitlines()[2:]

    def to_dict(self) -> dict[str, Any]:
        d = {**self.report.to_dict(), "verdict": self.verdict, "exit_code": self.exit_code,
             "bracket": self.bracket.to_dict() if self.bracket is not None else None}
        if self.controls is not None:
            d["controls"] = self.controls.to_dict()
        return d


def dump_args(path: str, trust_remote_code: bool, width: int, depth: int, prompt: list[int],
              opts: CacheOptions) -> list[str]:
    """The ``bisect dump`` arguments that rerun exactly these arms in another process."""
    args = ["--model", path, "--width", str(width), "--depth", str(depth),
            "--prompt-ids", ",".join(map(str, prompt)), *opts.to_argv()]
    return args + (["--trust-remote-code"] if trust_remote_code else [])


def run_bisect(model: Any, prompt: list[int], width: int, depth: int, opts: CacheOptions | None = None,
               controls: list[tuple[str, str]] | None = None, trust_remote_code: bool = False,
               observer: Observer = NULL, accepted: int | None = None) -> BisectRun:
    """Bisect in process through an engine (or a checkpoint, through mlx-lm's adapter with ``opts``);
    with ``controls`` (NAME, VALUE), rerun both arms per environment (an adapter that supports
    ``control-arms``, on its checkpoint)."""
    engine = _engine_of(model, opts)
    with observer.part("arms", total=2):
        bc, report = bisect_model(engine, prompt, width, depth, accepted=accepted)
        observer.item("arms", 2)
    bracket = bc.bracket
    assert bracket is not None  # run_arms always repeats the chain
    observer.result("bracket", bracket.to_dict())
    if not bracket.reproducible:
        return BisectRun(report, None, bracket)
    for row in report.to_dict()["rows"]:
        observer.result("layers", row)
    ctrl = None
    loaded = engine.checkpoint()
    if controls and loaded is not None:
        from specparity.bisect.controls import run_controls

        observer.note(f"bisect: running {len(controls) + 1} control processes")
        with tempfile.TemporaryDirectory(prefix="specparity-controls-") as tmp:
            ctrl = run_controls(controls, dump_args(str(loaded.path), trust_remote_code, width, depth,
                                                    prompt, engine.cache_options()), Path(tmp), width)
    return BisectRun(report, ctrl, bracket)
