"""dfly-mlx's own loops against classic decode (``e2e --engine dfly-mlx``): ``load_runtime`` +
``generate`` and the dflash-mlx loop it drives."""

from __future__ import annotations

import time
from typing import Any

from specparity.probes.engine_e2e import Classic, Finding, failed, judge, judge_rounds, load_once



def loops(target: str, draft: str | None, prompt: list[int], n: int, ref: Classic,
          entries: tuple[str, ...] = ()) -> list[Finding]:
    """dfly-mlx's ``generate`` (its no-thinking chat prompt) and the loop it drives, dflash-mlx's
    ``stream_dflash_generate`` with the DFly draft backend, on the prompt's ids; rounds from the summary's
    ``acceptance_history``."""
    from dflash_mlx.engine.events import SummaryEvent, TokenEvent
    from dflash_mlx.runtime import get_stop_token_ids, stream_dflash_generate
    from dflash_mlx.runtime.context import build_offline_runtime_context
    from dfly_mlx.generate import generate, no_thinking_prompt_tokens
    from dfly_mlx.loading import load_runtime

    classic, eos = ref.tokens(prompt), ref.eos

    def rounds_of(hist: list[int], block: int) -> list[dict[str, Any]]:
        return [{"drafted": block - 1, "accepted": int(a), "committed": int(a) + 1, "source": "dfly"} for a in hist]

    runtime = load_once(lambda: load_runtime(target, draft))

    def own_generate(f: Finding) -> None:
        bundle = runtime()
        text = bundle.tokenizer.decode(list(prompt))
        # generate() prompts with its no-thinking chat template: classic decode of those ids is its reference
        ids = no_thinking_prompt_tokens(bundle.tokenizer, text)
        f.prompt = list(ids)
        res = generate(bundle, text, max_tokens=n)
        f.tokens = list(res.token_ids)
        f.rounds = rounds_of(list(res.summary.get("acceptance_history") or []), int(bundle.draft_model.block_size))
        judge_rounds(f)
        judge(f, ref.tokens(list(ids)), eos, 0)

    def stream(f: Finding) -> None:
        bundle = runtime()
        events = stream_dflash_generate(
            target_model=bundle.target_model, target_ops=bundle.target_ops, tokenizer=bundle.tokenizer,
            draft_model=bundle.draft_model, draft_backend=bundle.draft_backend, prompt="",
            prompt_tokens_override=list(prompt), max_new_tokens=n, use_chat_template=False,
            block_tokens=int(bundle.draft_model.block_size), stop_token_ids=get_stop_token_ids(bundle.tokenizer),
            runtime_context=build_offline_runtime_context(verify_mode="dflash"))
        for ev in events:
            if isinstance(ev, TokenEvent):
                f.tokens.append(int(ev.token_id))
            elif isinstance(ev, SummaryEvent):
                f.rounds = rounds_of(list(ev.acceptance_history or []), int(bundle.draft_model.block_size))
        judge_rounds(f)
        judge(f, classic, eos, 0)

    out = []
    for entry, fn in (("generate", own_generate), ("dfly-stream", stream)):
        if entries and entry not in entries:
            continue
        f = Finding("dfly-mlx", entry)
        t0 = time.perf_counter()
        try:
            fn(f)
        except Exception as err:  # noqa: BLE001  (the engine's own error is the finding)
            failed(f, err)
        f.seconds = time.perf_counter() - t0
        out.append(f)
    return out

