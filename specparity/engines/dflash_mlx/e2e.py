"""dflash-mlx's own generate entry points against mlx-lm's classic arms (``specparity e2e --engine dflash-mlx``).

dflash-mlx's users call it two ways, and each is compared with what mlx-lm's
classic decode gives for the same prompt, each side with its own defaults:

    dflash-stream  ``dflash_mlx.runtime.stream_dflash_generate`` on the prompt's
                   token ids (the engine's loop as ``dflash generate`` and
                   ``dflash serve`` drive it), loaded by dflash-mlx's own loader,
                   stop ids from the tokenizer
                   vs ``mlx_lm.stream_generate`` on the same ids, no drafter
    dflash-cli     the ``dflash generate`` console script (a subprocess in a fresh
                   directory, ``--no-chat-template``: the fixtures have no template)
                   vs the ``mlx_lm.generate`` console script, no drafter

Engagement: the stream arm counts the proposals the engine accepted (its
summary); the CLI arm reads the acceptance line ``dflash generate`` prints.
dflash-mlx is not spied on: the options reported as received are the ones
passed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from specparity.decode import stream_text
from specparity.probes.e2e import CLI_TIMEOUT_S, OWN_LOOP, E2EOptions, E2ERun, EntryArm, compare_arms, run_cli_arm
from specparity.probes.engine_e2e import Classic
from specparity.progress import NULL, Observer
from specparity.tied import run_tied_captured

# the engine's entry points as its registry entry names them (specparity/engines/dflash_mlx.py)
ENTRY_POINTS = ("dflash-stream", "dflash-cli")
# dflash generate's last stderr line: "\n64 tokens | 12.3 tok/s | 45.6% acceptance"
_ACCEPT_RE = re.compile(r"(\d+) tokens \| [\d.]+ tok/s \| ([\d.]+)% acceptance")


def run_dflash_stream(engine: Any, prompt: list[int], max_tokens: int) -> EntryArm:
    """stream_dflash_generate with the engine's defaults (stop ids from the tokenizer)."""
    from dflash_mlx.engine.events import SummaryEvent, TokenEvent
    from dflash_mlx.runtime import get_stop_token_ids, stream_dflash_generate

    b = engine.bundle
    arm = EntryArm("dflash-stream", True, passed={"max_tokens": max_tokens})
    arm.step, arm.received = f"stream_dflash_generate {OWN_LOOP}", dict(arm.passed)
    t0 = time.perf_counter()
    stream = stream_dflash_generate(
        target_model=b.target_model, target_ops=b.target_ops, tokenizer=b.tokenizer, draft_model=b.draft_model,
        draft_backend=b.draft_backend, prompt="", prompt_tokens_override=list(prompt), max_new_tokens=max_tokens,
        stop_token_ids=get_stop_token_ids(b.tokenizer), runtime_context=engine.runtime_context)
    try:
        for event in stream:
            if isinstance(event, TokenEvent):
                arm.tokens.append(int(event.token_id))
            elif isinstance(event, SummaryEvent):
                arm.drafted = int(event.accepted_from_draft)
    except Exception as err:  # noqa: BLE001  (the engine's own error: the arm did not run)
        arm.error = f"{type(err).__name__}: {err}"
    finally:
        stream.close()
    arm.text = stream_text(b.tokenizer, arm.tokens)  # its ids as classic decode writes ids
    arm.seconds = time.perf_counter() - t0
    return arm


def dflash_cli_argv(target: str, draft: str, prompt_text: str, max_tokens: int) -> list[str]:
    script = Path(sys.executable).parent / "dflash"
    argv = [str(script)] if script.exists() else [sys.executable, "-m", "dflash_mlx.cli"]
    return argv + ["generate", "--model", target, "--draft", draft, "--prompt", prompt_text,
                   "--max-tokens", str(max_tokens), "--no-chat-template"]


def run_dflash_cli(target: str, draft: str, prompt_text: str, max_tokens: int) -> EntryArm:
    """The ``dflash generate`` console script in a subprocess (cwd: a fresh directory)."""
    arm = EntryArm("dflash-cli", True, passed={"max_tokens": max_tokens})
    arm.step, arm.received = f"dflash generate {OWN_LOOP}", dict(arm.passed)
    arm.argv = dflash_cli_argv(target, draft, prompt_text, max_tokens)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="specparity-e2e-dflash-") as tmp:
        try:
            # tied: a Ctrl-C, SIGTERM or SIGKILL of this run takes dflash generate with it
            proc = run_tied_captured(arm.argv, "dflash generate", timeout=CLI_TIMEOUT_S, cwd=tmp,
                                     env=dict(os.environ))
        except subprocess.TimeoutExpired:
            arm.error = f"dflash generate did not finish in {CLI_TIMEOUT_S} s"
            return arm
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        arm.error = f"dflash generate exited {proc.returncode}: {last}"
    arm.text = proc.stdout
    m = _ACCEPT_RE.search(proc.stderr)
    if m:
        n, pct = int(m.group(1)), float(m.group(2))
        arm.drafted = round(n * pct / 100.0)
    arm.seconds = time.perf_counter() - t0
    return arm


def run_dflash_e2e(engine: Any, loaded: Any, prompt: list[int], max_tokens: int,
                   entry_points: list[str] | None = None, observer: Observer = NULL) -> E2ERun:
    """Each dflash-mlx entry point against mlx-lm's classic arm on the same prompt."""
    entry_points = list(entry_points or ENTRY_POINTS)
    options = E2EOptions(max_tokens=max_tokens)
    text = loaded.tokenizer.decode(prompt)
    info = engine.info
    run = E2ERun(header=(f"dflash-mlx {info.version} on {info.target} with drafter {info.draft}"
                         f" ({info.family}); classic: mlx-lm's entry points without a drafter;"
                         f" max_tokens={max_tokens}, every other option each side's default"),
                 options=options.passed(True), model=loaded.fingerprint.to_dict())
    with observer.part("entry points", total=len(entry_points)):
        for entry in entry_points:
            if entry == "dflash-stream":
                classic = Classic(max_tokens=max_tokens, loaded=loaded, context=engine.classic).arm(list(prompt))
                drafter = run_dflash_stream(engine, prompt, max_tokens)
            else:
                classic = run_cli_arm(str(loaded.path), None, text, options, False)
                drafter = run_dflash_cli(info.target, str(info.draft), text, max_tokens)
                # dflash generate prints text only: the two CLIs are compared by their text
                classic.tokens = []
            res = compare_arms(entry, classic, drafter, options, loaded.tokenizer)
            if entry == "dflash-cli" and res.difference is None and not (classic.error or drafter.error):
                res.reason = f"identical text over {len(classic.text)} characters (the CLIs print text)"
            run.entries.append(res)
            observer.result(entry, res.to_dict())
            observer.item("entry points")
    return run
