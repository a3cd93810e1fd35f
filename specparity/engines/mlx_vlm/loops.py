"""mlx-vlm's own speculative loops against classic decode (``e2e --engine mlx-vlm``, the findings table).

Each entry point is ``mlx_vlm.generate.generate_step`` (what its ``stream_generate``, its ``python -m
mlx_vlm.generate --draft-model`` and its server run), or its public ``stream_generate`` around it, with a drafter
loaded by its own ``mlx_vlm.speculative.load_drafter``, the target loaded by its own ``mlx_vlm.utils.load``; only
the prompt's ids (no image), ``max_tokens`` and the drafter with its kind are given, everything else is the
library's default (greedy: temperature 0 when the checkpoint sets none). ``generate_step``'s tokens stop at the
tokenizer's eos, as its ``stream_generate`` stops them; ``stream_generate``'s are the ``token_ids`` of its last
result.

Its acceptance record, round by round: the drafter's own ``accept_lens`` / ``draft_lens`` (its loop's
``_record_speculative_round``, reset when a request's rounds start); each round commits its accepted drafts
and one correction/bonus token (the last round cut at ``max_tokens``). The prefill's token comes before round 1.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from specparity.probes.engine_e2e import Classic, Finding, failed, judge, load_once

# (entry point, the drafter kind it runs, where its drafter comes from)
ENTRY_POINTS = (
    ("generate_step draft_kind=dflash", "dflash", "the DFlash drafter (--draft-model)"),
    ("generate_step draft_kind=mtp", "mtp", "the target's own MTP head (its mtp.* tensors)"),
    ("generate_step draft_kind=eagle3", "eagle3", "an EAGLE-3 drafter (--draft-model)"),
    ("stream_generate draft_kind=dflash", "dflash", "the DFlash drafter (--draft-model)"),
)
ENTRY_NAMES = tuple(entry for entry, _, _ in ENTRY_POINTS)
_KIND = {entry: kind for entry, kind, _ in ENTRY_POINTS}
_SOURCE = {entry: source for entry, _, source in ENTRY_POINTS}


def load_target(target: str) -> dict[str, Any]:
    """The target as mlx-vlm's own loader loads it (its model and processor)."""
    from mlx_vlm.utils import load

    model, processor = load(target)
    return {"model": model, "processor": processor}


def load_kind(entry: str, target: str, draft: str | None) -> Any:
    """The drafter ``entry`` runs, loaded by ``load_drafter`` with its kind (its own check that the kind fits)."""
    from mlx_vlm.speculative import load_drafter

    kind = _KIND[entry]
    if kind == "mtp":
        path = target  # a native checkpoint's embedded head, split out in memory by its own splitter
    elif kind == "eagle3":
        if not draft or "eagle3" not in _model_type(draft):
            raise RuntimeError("it drafts with an EAGLE-3 drafter (model_type eagle3); no fixture in that format is"
                               " built here")
        path = draft
    else:
        if not draft:
            raise RuntimeError(f"{entry} drafts with a DFlash drafter: give --draft-model")
        path = draft
    drafter, resolved = load_drafter(path, kind)
    if resolved != kind:
        raise RuntimeError(f"load_drafter resolved kind {resolved!r} for {path}, not {kind!r}")
    return drafter


def _model_type(path: str) -> str:
    import json
    from pathlib import Path

    try:
        return str(json.loads((Path(path) / "config.json").read_text()).get("model_type", ""))
    except (OSError, ValueError):
        return ""


def rounds_of(drafter: Any, emitted: int) -> list[dict[str, Any]]:
    """The drafter's own record as rounds: ``emitted`` tokens in all, the prefill's first."""
    accepted = [int(round(float(a))) for a in getattr(drafter, "accept_lens", [])]
    drafted = [int(d) for d in getattr(drafter, "draft_lens", [])]
    out, left = [], emitted - 1
    for a, d in zip(accepted, drafted, strict=False):
        committed = max(0, min(a + 1, left))
        left -= committed
        out.append({"drafted": d, "accepted": a, "committed": committed, "source": "draft"})
    return out


def run_entry(entry: str, target: Callable[[], dict[str, Any]], target_dir: str, draft: str | None,
              prompt: list[int], n: int, classic: list[int], eos: set[int]) -> Finding:
    """One entry point judged against classic decode."""
    f = Finding("mlx-vlm", entry)
    t0 = time.perf_counter()
    try:
        import mlx.core as mx
        from mlx_vlm.generate import generate_step, stream_generate

        loaded = target()
        drafter = load_kind(entry, target_dir, draft)
        tokens: list[int] = []
        if entry.startswith("stream_generate"):
            # its public generator, given the prompt's ids (no text, no image): its own stop criteria end it, and
            # its last result (finish_reason set, the last token again) lists every token it generated
            last = None
            for last in stream_generate(loaded["model"], loaded["processor"], "", input_ids=mx.array([prompt]),
                                        max_tokens=n, draft_model=drafter, draft_kind=_KIND[entry]):
                pass
            tokens = [int(t) for t in (getattr(last, "token_ids", None) or [])]
        else:
            gen = generate_step(mx.array([prompt]), loaded["model"], None, None, max_tokens=n,
                                draft_model=drafter, draft_kind=_KIND[entry])
            for token, _ in gen:
                tokens.append(int(token))
                if tokens[-1] in eos or len(tokens) >= n:
                    break
            gen.close()
        f.tokens = tokens
        f.rounds = [{**r, "source": _SOURCE[entry]} for r in rounds_of(drafter, len(tokens))]
        f.drafted = sum(r["drafted"] for r in f.rounds)
        f.accepted = sum(r["accepted"] for r in f.rounds)
        judge(f, classic, eos, 1)  # the prefill's token comes before round 1
    except Exception as err:  # noqa: BLE001  (the engine's own error is the finding)
        failed(f, err)
        if "no fixture" in str(err):
            f.reason = f"{_SOURCE[entry]}: none is built here (no fixture in its format): not run, not a pass"
    f.seconds = time.perf_counter() - t0
    return f


def loops(target: str, draft: str | None, prompt: list[int], n: int, ref: Classic,
          entries: tuple[str, ...] = ()) -> list[Finding]:
    """Each mlx-vlm entry point (``entries``; all when empty) on one target loaded once."""
    classic, eos = ref.tokens(prompt), ref.eos
    loaded = load_once(lambda: load_target(target))
    return [run_entry(entry, loaded, target, draft, list(prompt), n, classic, eos)
            for entry in ENTRY_NAMES if not entries or entry in entries]
