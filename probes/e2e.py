"""mlx-lm's own public entry points, each with and without the drafter (``specparity e2e``).

Many served divergences live outside the forward pass: in what an entry point
does with the options it is given once a drafter is attached. This module runs
the entry points themselves, as a user calls them:

    stream_generate   ``mlx_lm.stream_generate(model, tokenizer, prompt, **options)``
    generate          ``mlx_lm.generate(...)`` (returns text only)
    cli               the ``mlx_lm.generate`` console script, a subprocess whose
                      cwd is a fresh directory (never the repository root)

each once without and once with ``draft_model``, passing only the options the
user gave (everything else is the entry point's own default). A spy wraps
``mlx_lm.generate.generate_step`` and ``speculative_generate_step`` (the
functions every entry point ends in, looked up as module globals at call time)
and records the keyword arguments that reached them, their defaults, and the
tokens they yielded; in the CLI's process a ``sitecustomize`` installs the same
spy. It observes and never changes a value.

Per entry point it reports: token ids and text, drafter arm vs classic arm,
with the first differing index and its context; every option the user passed
that did not reach the step function with the drafter (dropped) or reached it
changed; every default that differs between the two step functions; whether
the drafter drafted anything (not engaged otherwise).
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Self

from specparity.errors import InputError, first_line
from specparity.completions import CompletionDifference, Side, first_difference, first_index, other_texts
from specparity.prompts import encode_prompt
from specparity.processors import ProcessorOptions
from specparity.progress import NULL, Observer
from specparity.tied import run_tied_captured
from specparity.verdicts import ReportMixin, Verdict, combine

log = logging.getLogger(__name__)

ENTRY_POINTS = ("stream_generate", "generate", "cli")
STEPS = ("generate_step", "speculative_generate_step")
# the call that drafts in mlx-lm's entry points (an engine's own loop names its step with OWN_LOOP)
DRAFTING_STEPS = ("speculative_generate_step",)
# any engine's own speculative loop (probes/engine_e2e.py, an engine's own e2e) names its step so
OWN_LOOP = "(its own loop)"
SPY_ENV = "SPECPARITY_E2E_SPY"
CLI_TIMEOUT_S = 600
# options a user may pass -> the mlx_lm.generate CLI flag (None: the CLI has no such flag)
CLI_FLAGS = {
    "max_tokens": "--max-tokens", "num_draft_tokens": "--num-draft-tokens",
    "max_kv_size": "--max-kv-size", "prefill_step_size": "--prefill-step-size",
    "kv_bits": "--kv-bits", "kv_group_size": "--kv-group-size",
    "quantized_kv_start": "--quantized-kv-start", "logits_processors": None,
}


@dataclass
class E2EOptions:
    """What the user passes to every entry point; None = not passed (the entry point's default).

    max_tokens, num_draft_tokens (drafter arms only), max_kv_size, prefill_step_size,
    kv_bits, kv_group_size, quantized_kv_start: the entry points' own keyword names.
    processors: logits-processor options, passed as ``logits_processors``.
    """

    max_tokens: int | None = None
    num_draft_tokens: int | None = None
    max_kv_size: int | None = None
    prefill_step_size: int | None = None
    kv_bits: int | None = None
    kv_group_size: int | None = None
    quantized_kv_start: int | None = None
    processors: ProcessorOptions = field(default_factory=ProcessorOptions)

    def passed(self, drafter: bool) -> dict[str, Any]:
        """The options as JSON values, only those given (num_draft_tokens only with a drafter)."""
        out = {k: v for k, v in asdict(self).items() if k != "processors" and v is not None}
        if not drafter:
            out.pop("num_draft_tokens", None)
        if self.processors.active:
            out["logits_processors"] = self.processors.describe()
        return out

    def kwargs(self, drafter: bool) -> dict[str, Any]:
        """The keyword arguments handed to stream_generate / generate."""
        kw: dict[str, Any] = {k: v for k, v in self.passed(drafter).items() if k != "logits_processors"}
        if self.processors.active:
            kw["logits_processors"] = self.processors.make()
        return kw


# ---------------------------------------------------------------- the spy


def _jsonable(name: str, value: Any) -> Any:
    """A received argument as JSON: processors and samplers by description, arrays by shape."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if name == "logits_processors":
        return [getattr(p, "__name__", type(p).__name__) for p in value]
    if callable(value):
        return getattr(value, "__name__", type(value).__name__)
    if hasattr(value, "shape"):
        return f"array{tuple(value.shape)}"
    if isinstance(value, list):
        return f"list[{len(value)}]"
    return type(value).__name__


class Spy:
    """Wraps mlx-lm's two step functions; records what reached them and what they yielded.

    calls: one dict per step call: ``step`` (its name), ``received`` (keyword
    arguments passed, JSON values), ``defaults`` (its keyword parameters not
    passed, with their defaults), ``prompt`` (the prompt token ids it was given),
    ``tokens`` (yielded token ids, in order), ``drafted`` (yielded tokens flagged
    from_draft), ``history`` (the token ids the first logits-processor call saw:
    what the processors knew before the first emitted token; None without processors).
    """

    SKIP: ClassVar[frozenset[str]] = frozenset({"prompt", "model", "draft_model", "stream"})

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self._saved: dict[str, Any] = {}

    def __enter__(self) -> Self:
        from specparity.mlx_compat import generate_module, replace_in_generate

        g = generate_module()
        for name in STEPS:
            self._saved[name] = getattr(g, name)
            replace_in_generate(name, self._wrap(name, self._saved[name]))
        return self

    def __exit__(self, *exc: object) -> None:
        from specparity.mlx_compat import replace_in_generate

        for name, fn in self._saved.items():
            replace_in_generate(name, fn)

    def _wrap(self, name: str, fn: Any) -> Any:
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def spied(*args: Any, **kwargs: Any) -> Any:
            bound = sig.bind(*args, **kwargs)
            prompt = bound.arguments.get("prompt")
            call: dict[str, Any] = {
                "step": name,
                "received": {k: _jsonable(k, v) for k, v in bound.arguments.items() if k not in self.SKIP},
                "defaults": {k: _jsonable(k, p.default) for k, p in sig.parameters.items()
                             if k not in bound.arguments and k not in self.SKIP
                             and p.default is not inspect.Parameter.empty},
                "prompt": _ids(prompt),
                "tokens": [], "drafted": 0, "history": None,
            }
            self.calls.append(call)
            procs = bound.arguments.get("logits_processors")
            if procs:
                # observe the history the processors are given; the values pass through untouched
                bound.arguments["logits_processors"] = [_history_recorder(p, call) for p in procs]
                args, kwargs = bound.args, bound.kwargs
            for item in fn(*args, **kwargs):
                tok = item[0]
                call["tokens"].append(int(tok.item() if hasattr(tok, "item") else tok))
                if name == "speculative_generate_step" and item[2]:
                    call["drafted"] += 1
                yield item

        return spied


def _ids(prompt: Any) -> list[int] | None:
    """An mx.array of token ids as a list (None for anything else, e.g. embeddings only)."""
    if prompt is None or not hasattr(prompt, "tolist"):
        return None
    return [int(t) for t in prompt.tolist()]


def _history_recorder(processor: Any, call: dict[str, Any]) -> Any:
    """``processor``, keeping the first token history it is called with in ``call["history"]``."""

    @functools.wraps(processor)
    def recorded(tokens: Any, logits: Any) -> Any:
        if call["history"] is None:
            call["history"] = [int(t) for t in tokens.tolist()]
        return processor(tokens, logits)

    return recorded


def install_process_spy(out_path: str) -> None:
    """In a CLI subprocess (via sitecustomize): spy for the whole process, write the calls at exit."""
    import atexit

    spy = Spy().__enter__()

    def dump() -> None:
        Path(out_path).write_text(json.dumps(spy.calls))

    atexit.register(dump)


SITECUSTOMIZE = f"""import os
if os.environ.get({SPY_ENV!r}):
    from specparity.probes.e2e import install_process_spy
    install_process_spy(os.environ[{SPY_ENV!r}])
"""


# ---------------------------------------------------------------- one arm


@dataclass
class EntryArm:
    """One entry point run once, with or without the drafter.

    entry: stream_generate / generate / cli. drafter: the drafter was attached.
    tokens: token ids the step function yielded and the entry point consumed
      (the end-of-sequence token included when it stopped there).
    text: the text the entry point returned (the CLI's stdout without its final newline).
    step / received / defaults: the spy's record of the step call (see Spy).
    drafted: tokens the drafter proposed and the target accepted (drafter arms).
    proposed: tokens the drafter proposed in all, where the engine's own record says (None: unknown).
    prompt: the prompt token ids that reached the step function.
    history: what its logits processors saw before the first emitted token (None: no processors).
    passed: the options the user gave this arm.
    error: why the arm did not run (the entry point refused, the CLI failed).
    argv: the CLI's command line. seconds: wall time.
    """

    entry: str
    drafter: bool
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    step: str | None = None
    received: dict[str, Any] = field(default_factory=dict)
    defaults: dict[str, Any] = field(default_factory=dict)
    drafted: int = 0
    proposed: int | None = None
    prompt: list[int] | None = None
    history: list[int] | None = None
    passed: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    argv: list[str] | None = None
    seconds: float = 0.0

    @property
    def name(self) -> str:
        return f"{self.entry}/{'drafter' if self.drafter else 'classic'}"

    def absorb(self, calls: list[dict[str, Any]]) -> None:
        if not calls:
            return
        if len(calls) > 1:
            log.warning("%s: %d step calls; the first is compared", self.name, len(calls))
        c = calls[0]
        self.step, self.received, self.defaults = c["step"], c["received"], c["defaults"]
        self.tokens, self.drafted = c["tokens"], c["drafted"]
        self.prompt, self.history = c.get("prompt"), c.get("history")


def run_api_arm(entry: str, loaded: Any, draft: Any | None, prompt: str | list[int],
                options: E2EOptions) -> EntryArm:
    """stream_generate or generate, in process, under the spy."""
    import mlx_lm

    arm = EntryArm(entry, draft is not None, passed=options.passed(draft is not None))
    kwargs = options.kwargs(draft is not None)
    if draft is not None:
        kwargs["draft_model"] = draft.model
    t0 = time.perf_counter()
    try:
        with Spy() as spy:
            if entry == "stream_generate":
                arm.text = "".join(r.text for r in mlx_lm.stream_generate(
                    loaded.model, loaded.tokenizer, prompt, **kwargs))
            else:
                arm.text = mlx_lm.generate(loaded.model, loaded.tokenizer, prompt, verbose=False, **kwargs)
    except (ValueError, TypeError, IndexError) as err:  # the entry point refused this combination
        arm.error = f"{type(err).__name__}: {first_line(str(err))}"
    arm.absorb(spy.calls)
    arm.seconds = time.perf_counter() - t0
    return arm


def cli_argv(target: str, draft: str | None, options: E2EOptions, trust_remote_code: bool,
             chat_template: bool = False) -> list[str]:
    """The mlx_lm.generate command line for these options (only those the user gave).

    The prompt goes through stdin (``--prompt -``): the CLI reads it verbatim there
    (an argument has its ``\\n`` rewritten, and cannot hold a NUL byte). Without
    ``chat_template`` the CLI is told ``--ignore-chat-template``, as the in-process
    arms get the raw prompt.
    """
    script = Path(sys.executable).parent / "mlx_lm.generate"
    argv = [str(script)] if script.exists() else [sys.executable, "-m", "mlx_lm", "generate"]
    argv += ["--model", target, "--prompt", "-", "--verbose", "False"]
    if not chat_template:
        argv.append("--ignore-chat-template")
    for k, v in options.passed(draft is not None).items():
        flag = CLI_FLAGS.get(k)
        if flag is not None:
            argv += [flag, str(v)]
    if trust_remote_code:
        argv.append("--trust-remote-code")
    if draft is not None:
        argv += ["--draft-model", draft]
    return argv


def run_cli_arm(target: str, draft: str | None, prompt_text: str, options: E2EOptions,
                trust_remote_code: bool, chat_template: bool = False) -> EntryArm:
    """The mlx_lm.generate console script in a subprocess (cwd: a fresh directory), spied."""
    arm = EntryArm("cli", draft is not None, passed=options.passed(draft is not None))
    arm.argv = cli_argv(target, draft, options, trust_remote_code, chat_template)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="specparity-e2e-") as tmp:
        (Path(tmp) / "sitecustomize.py").write_text(SITECUSTOMIZE)
        spy_out = Path(tmp) / "spy.json"
        env = dict(os.environ)
        # only the spy's sitecustomize: specparity comes from the interpreter's own install
        # (a repository root on the path would shadow the standard library's bisect)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (tmp, env.get("PYTHONPATH")) if p)
        env[SPY_ENV] = str(spy_out)
        env["PYTHONIOENCODING"] = "utf-8"
        work = Path(tmp) / "cwd"
        work.mkdir()
        try:
            # tied: a Ctrl-C, SIGTERM or SIGKILL of this run takes mlx_lm.generate with it
            proc = run_tied_captured(arm.argv, "mlx_lm.generate", timeout=CLI_TIMEOUT_S, input=prompt_text,
                                     cwd=work, env=env)
        except subprocess.TimeoutExpired:
            arm.error = f"mlx_lm.generate did not finish in {CLI_TIMEOUT_S} s"
            return arm
        except (OSError, ValueError) as err:  # the command line itself could not be run
            arm.error = f"mlx_lm.generate could not be started: {type(err).__name__}: {err}"
            return arm
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["(no stderr)"])[-1]
            arm.error = f"mlx_lm.generate exited {proc.returncode}: {last}"
        else:
            arm.text = proc.stdout.removesuffix("\n")
        if spy_out.exists():
            arm.absorb(json.loads(spy_out.read_text()))
    arm.seconds = time.perf_counter() - t0
    return arm


# ---------------------------------------------------------------- comparison


@dataclass
class OptionFinding:
    """An option that did not reach the drafter's step function as the user gave it.

    option: its keyword name. passed: the user's value. received: what reached the
    step (None: dropped). classic_received: what reached the classic arm's step.
    """

    option: str
    passed: Any
    received: Any
    classic_received: Any

    def describe(self, entry: str, step: str | None) -> str:
        where = step or "the step function"
        if self.received is None:
            return (f"{self.option}={self.passed} dropped: {entry} with a drafter never passed it to"
                    f" {where} (classic arm: {self.classic_received})")
        return f"{self.option}={self.passed} reached {where} as {self.received}"


@dataclass
class EntryResult(ReportMixin):
    """One entry point: its two arms and what their comparison found.

    difference: where the drafter arm's tokens or text first left the classic arm's (None: identical).
    dropped: options the drafter arm dropped or changed (OptionFinding).
    not_accepted: options the user gave that this entry point has no way to take
      (the CLI has no logits-processor flags): both arms ran without them.
    default_changes: option -> (classic step's value, drafter step's value), for
      options the user left to the defaults where the two step functions differ and
      the difference can matter here (prefill_step_size: a prompt longer than the smaller step).
    defaults_moot: the same for differences that cannot matter on this prompt (not reported).
    cause: why the outputs differ, where the spy saw it (the processors' history).
    refused: why this entry point could not take the prompt (the arms' results are kept).
    lossy: the documented lossy mode this entry point runs (its verdict is ``lossy_by_design``).
    verdict: match, diverged (outputs differ or an option was dropped), not_engaged
      (nothing drafted), not_run (an arm failed, or the entry point could not take the prompt; reason).
    """

    entry: str
    classic: EntryArm
    drafter: EntryArm
    difference: CompletionDifference | None = None
    dropped: list[OptionFinding] = field(default_factory=list)
    not_accepted: list[str] = field(default_factory=list)
    default_changes: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    defaults_moot: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    cause: str | None = None
    refused: str | None = None
    reason: str = ""
    lossy: str = ""

    @property
    def verdict(self) -> Verdict:
        if self.classic.error or self.drafter.error or self.refused:
            return Verdict.NOT_RUN
        if self.lossy:  # a documented lossy mode: what it changed, never a pass or a defect
            return Verdict.LOSSY
        if self.difference or self.dropped:
            # the same ids written as other text with the drafter (one producer, both arms) is still other output,
            # named as text only (judge), never as tokens that differ
            return Verdict.DIVERGED
        step = self.drafter.step or ""
        if (step not in DRAFTING_STEPS and not step.endswith(OWN_LOOP)) or self.drafter.drafted == 0:
            return Verdict.NOT_ENGAGED
        return Verdict.MATCH

    def lines(self) -> list[str]:
        c, d = self.classic, self.drafter
        out = [f"{self.entry}: {self.verdict}: {self.reason}"]
        drafted = f"{d.drafted} drafted" if d.proposed is None else f"{d.proposed} proposed, {d.drafted} accepted"
        out.append(f"  classic: {len(c.tokens)} tokens via {c.step}; drafter: {len(d.tokens)} tokens via"
                   f" {d.step}, {drafted} ({c.seconds:.1f} s / {d.seconds:.1f} s)")
        if self.difference is not None:
            out.append("  " + self.difference.line())
        if self.cause:
            out.append(f"  cause: {self.cause}")
        for f in self.dropped:
            out.append("  option " + f.describe(self.entry, d.step))
        if self.not_accepted:
            out.append(f"  not an option of this entry point (both arms ran without): {', '.join(self.not_accepted)}")
        for k, (a, b) in self.default_changes.items():
            out.append(f"  default differs with the drafter: {k} {a} ({c.step}) vs {b} ({d.step})")
        for arm in (c, d):
            if arm.error:
                out.append(f"  {arm.name}: {arm.error}")
        return out

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["verdict"], d["exit_code"] = self.verdict, self.exit_code
        return d


def can_matter(option: str, values: tuple[Any, Any], prompt_len: int | None) -> bool:
    """Whether a default that differs between the two step functions can change this run.

    prefill_step_size: only a prompt longer than the smaller step is split differently
    (prefill covers all but the last prompt token). Other options: always.
    """
    if option == "prefill_step_size" and prompt_len is not None:
        steps = [v for v in values if isinstance(v, int)]
        return bool(steps) and prompt_len - 1 > min(steps)
    return True


def history_cause(classic: EntryArm, drafter: EntryArm) -> str | None:
    """The processors' histories, where the two arms' differ (None: the same, or no processors)."""
    ch, dh = classic.history, drafter.history
    if ch is None or dh is None or ch == dh:
        return None

    def show(h: list[int]) -> str:
        return f"{h}" if len(h) <= 8 else f"[{', '.join(map(str, h[:4]))}, ..., {', '.join(map(str, h[-2:]))}]"

    return (f"the drafter path's logits processors saw another history: {len(dh)} token(s) {show(dh)} before"
            f" the first emitted token, where classic decode's saw {len(ch)} {show(ch)}"
            + (" (the whole prompt)" if classic.prompt is not None and ch == classic.prompt else ""))


def compare_arms(entry: str, classic: EntryArm, drafter: EntryArm, options: E2EOptions, tokenizer: Any,
                 prompt_len: int | None = None) -> EntryResult:
    res = EntryResult(entry, classic, drafter)
    if classic.error or drafter.error:
        judge(res)  # not run: the cause on the verdict's own line
        return res
    res.difference = first_difference(Side("classic", classic.text, classic.tokens,
                                           texts=other_texts(tokenizer, classic.tokens)),
                                      Side("drafter", drafter.text, drafter.tokens), tokenizer)
    if res.difference is not None:
        res.cause = history_cause(classic, drafter)
    passed = drafter.passed
    for k, v in passed.items():
        if entry == "cli" and CLI_FLAGS.get(k, "") is None:
            res.not_accepted.append(k)
            continue
        if k not in drafter.received:
            res.dropped.append(OptionFinding(k, v, None, classic.received.get(k)))
        elif k != "logits_processors" and drafter.received[k] != v:
            res.dropped.append(OptionFinding(k, v, drafter.received[k], classic.received.get(k)))
    for k in sorted(set(classic.defaults) & set(drafter.defaults)):
        # an option the user left alone, taking each step function's own default
        if k not in passed and classic.defaults[k] != drafter.defaults[k]:
            pair = (classic.defaults[k], drafter.defaults[k])
            if can_matter(k, pair, prompt_len):
                res.default_changes[k] = pair
            else:
                res.defaults_moot[k] = pair
    judge(res)
    return res


def judge(res: EntryResult) -> None:
    """Set ``res.reason`` from its verdict."""
    v = res.verdict
    drafter = res.drafter
    if v == Verdict.NOT_RUN:  # the cause on the verdict's own line: the engine's words, first line
        res.reason = res.refused or "; ".join(
            f"{a.name} did not run: {first_line(a.error or '')}" for a in (res.classic, drafter) if a.error)
    elif v == Verdict.DIVERGED:
        parts = []
        d = res.difference
        if d is not None and d.text_only:
            parts.append(f"identical token ids over {len(res.classic.tokens)} tokens; with the drafter they are written"
                         f" as other text from character {d.char_offset} (text only, not a token divergence)")
        elif d is not None and d.token_index is not None:
            parts.append(f"token ids differ at index {d.token_index}")
        if d is not None and d.char_offset is not None and not d.text_only:
            parts.append(f"text differs at character {d.char_offset}")
        if res.dropped:
            parts.append("with the drafter " + ", ".join(
                f"{f.option} {'dropped' if f.received is None else 'changed'}" for f in res.dropped))
        res.reason = "; ".join(parts)
    elif v == Verdict.NOT_ENGAGED and drafter.proposed:
        res.reason = (f"the drafter proposed {drafter.proposed} tokens and the target accepted none"
                      f" ({drafter.step}): every emitted token came from a verify block's first row, so no"
                      " accepted draft was checked against classic decode: not a pass")
    elif v == Verdict.NOT_ENGAGED:
        res.reason = (f"no evidence the drafter ran ({drafter.step or 'no step function'} was called,"
                      f" {drafter.drafted} tokens drafted)")
    else:
        res.reason = f"identical token ids and text over {len(res.classic.tokens)} tokens"


def prompt_refusal(entry: str, arms: list[EntryArm], expected: list[int]) -> str | None:
    """Why an entry point's arms did not decode the run's prompt tokens (None: they did, or no record)."""
    for arm in arms:
        if arm.prompt is None or arm.prompt == expected:
            continue
        i = first_index(arm.prompt, expected)
        how = " (the CLI tokenizes the prompt's text: the ids do not survive decode and encode)" \
            if entry == "cli" else ""
        return (f"{arm.name} decoded other prompt tokens than the run's: {len(arm.prompt)} vs {len(expected)},"
                f" first different at position {i} ({arm.prompt[i:i + 4]} vs {expected[i:i + 4]}){how};"
                " its results are not comparable with the other entry points'")
    return None


# ---------------------------------------------------------------- the run


@dataclass
class E2ERun(ReportMixin):
    """Every entry point compared, as one report.

    header: model, drafter, prompt and options, one line. entries: one EntryResult per
    entry point. options: what the user passed. prompt_tokens: the prompt's length.
    """

    header: str
    entries: list[EntryResult] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    draft_model: dict[str, Any] = field(default_factory=dict)
    prompt_tokens: int = 0

    @property
    def verdict(self) -> Verdict:
        return combine([e.verdict for e in self.entries])

    def lines(self) -> list[str]:
        out = [self.header]
        for e in self.entries:
            out.extend(e.lines())
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "exit_code": self.exit_code, "options": self.options,
                "model": self.model, "draft_model": self.draft_model, "prompt_tokens": self.prompt_tokens,
                "entries": [e.to_dict() for e in self.entries]}


def parse_entry_points(value: str | None, choices: tuple[str, ...] = ENTRY_POINTS) -> list[str]:
    """``--entry-points``: the named entry points among ``choices`` (an engine's), in order; all when none."""
    if not value:
        return list(choices)
    out = []
    for item in value.split(","):
        item = item.strip()
        if item not in choices:
            raise InputError("entry-points", f"{value!r}: {item!r} is not one of {', '.join(choices)}")
        if item not in out:
            out.append(item)
    return out


def run_e2e(loaded: Any, draft: Any, prompt: str | list[int], options: E2EOptions,
            entry_points: list[str] | None = None, trust_remote_code: bool = False,
            observer: Observer = NULL, chat_template: bool = False) -> E2ERun:
    """Run each entry point without and with the drafter; compare outputs and the options that reached them.

    Every arm decodes the same prompt tokens (:func:`specparity.prompts.encode_prompt`): the in-process
    entry points get the ids, the CLI gets the text (and its chat template only with
    ``chat_template``); an entry point whose step function received other ids is not_run.
    """
    entry_points = list(entry_points or ENTRY_POINTS)
    ids = encode_prompt(loaded.tokenizer, prompt, chat_template)
    if not ids:
        raise InputError("prompt", ": it encodes to no tokens")
    prompt_text = prompt if isinstance(prompt, str) else loaded.tokenizer.decode(ids)
    fp, dfp = loaded.fingerprint, draft.fingerprint
    passed = options.passed(True)
    run = E2ERun(
        header=(f"model {fp.path} ({fp.model_type}, fingerprint {fp.short}), drafter {dfp.path}"
                f" (fingerprint {dfp.short}); prompt: {len(ids)} tokens"
                + (" (through the chat template)" if chat_template else "") + "; options: "
                + (", ".join(f"{k}={v}" for k, v in passed.items()) or "none (every entry point's defaults)")),
        options=passed, model=fp.to_dict(), draft_model=dfp.to_dict(), prompt_tokens=len(ids))
    with observer.part("entry points", total=len(entry_points)):
        for entry in entry_points:
            arms = []
            for with_draft in (False, True):
                observer.note(f"{entry} {'with' if with_draft else 'without'} the drafter")
                if entry == "cli":
                    arm = run_cli_arm(str(fp.path), str(dfp.path) if with_draft else None, prompt_text,
                                      options, trust_remote_code, chat_template)
                else:
                    arm = run_api_arm(entry, loaded, draft if with_draft else None, ids, options)
                observer.result(arm.name, asdict(arm))
                arms.append(arm)
            res = compare_arms(entry, arms[0], arms[1], options, loaded.tokenizer, len(ids))
            refused = prompt_refusal(entry, arms, ids)
            if refused:
                res.refused = refused
                judge(res)
            run.entries.append(res)
            observer.item("entry points")
    return run


def run_mlx_lm_e2e(engine: Any, loaded: Any, prompt: str | list[int], max_tokens: int | None,
                   entry_points: list[str], observer: Observer = NULL, *, options: E2EOptions | None = None,
                   chat_template: bool = False, trust_remote_code: bool = False) -> E2ERun:
    """mlx-lm's e2e as its engine entry (``EngineSpec.e2e``): :func:`run_e2e` with the adapter's drafter.

    It takes what only mlx-lm's entry points take (``options``: the generation options passed to each,
    the prompt as text or ids, ``chat_template``); ``max_tokens`` None: each entry point's own.
    """
    opts = options if options is not None else E2EOptions(max_tokens=max_tokens)
    return run_e2e(loaded, engine.draft, prompt, opts, entry_points, trust_remote_code, observer=observer,
                   chat_template=chat_template)
