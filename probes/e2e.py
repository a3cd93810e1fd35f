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

from specparity.errors import UsageError
from specparity.processors import ProcessorOptions
from specparity.progress import NULL, Observer
from specparity.verdicts import ReportMixin, Verdict, combine

log = logging.getLogger(__name__)

ENTRY_POINTS = ("stream_generate", "generate", "cli")
STEPS = ("generate_step", "speculative_generate_step")
# the calls that draft: mlx-lm's speculative step, dflash-mlx's loop and its CLI (probes/e2e_dflash.py)
DRAFTING_STEPS = ("speculative_generate_step", "stream_dflash_generate", "dflash generate")
SPY_ENV = "SPECPARITY_E2E_SPY"
CONTEXT = 3  # tokens shown either side of a first difference
TEXT_CONTEXT = 24  # characters shown either side of a first text difference
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


def _generate_module() -> Any:
    """The module ``mlx_lm.generate`` (``import mlx_lm.generate as g`` yields the function)."""
    import importlib

    return importlib.import_module("mlx_lm.generate")


class Spy:
    """Wraps mlx-lm's two step functions; records what reached them and what they yielded.

    calls: one dict per step call: ``step`` (its name), ``received`` (keyword
    arguments passed, JSON values), ``defaults`` (its keyword parameters not
    passed, with their defaults), ``tokens`` (yielded token ids, in order),
    ``drafted`` (yielded tokens flagged from_draft).
    """

    SKIP: ClassVar[frozenset[str]] = frozenset({"prompt", "model", "draft_model", "stream"})

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self._saved: dict[str, Any] = {}

    def __enter__(self) -> Self:
        g = _generate_module()

        for name in STEPS:
            self._saved[name] = getattr(g, name)
            setattr(g, name, self._wrap(name, self._saved[name]))
        return self

    def __exit__(self, *exc: object) -> None:
        g = _generate_module()

        for name, fn in self._saved.items():
            setattr(g, name, fn)

    def _wrap(self, name: str, fn: Any) -> Any:
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def spied(*args: Any, **kwargs: Any) -> Any:
            bound = sig.bind(*args, **kwargs)
            call: dict[str, Any] = {
                "step": name,
                "received": {k: _jsonable(k, v) for k, v in bound.arguments.items() if k not in self.SKIP},
                "defaults": {k: _jsonable(k, p.default) for k, p in sig.parameters.items()
                             if k not in bound.arguments and k not in self.SKIP
                             and p.default is not inspect.Parameter.empty},
                "tokens": [], "drafted": 0,
            }
            self.calls.append(call)
            for item in fn(*args, **kwargs):
                tok = item[0]
                call["tokens"].append(int(tok.item() if hasattr(tok, "item") else tok))
                if name == "speculative_generate_step" and item[2]:
                    call["drafted"] += 1
                yield item

        return spied


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
    except (ValueError, TypeError) as err:  # the entry point refused this combination
        arm.error = f"{type(err).__name__}: {err}"
    arm.absorb(spy.calls)
    arm.seconds = time.perf_counter() - t0
    return arm


def cli_argv(target: str, draft: str | None, prompt_text: str, options: E2EOptions,
             trust_remote_code: bool) -> list[str]:
    """The mlx_lm.generate command line for these options (only those the user gave)."""
    script = Path(sys.executable).parent / "mlx_lm.generate"
    argv = [str(script)] if script.exists() else [sys.executable, "-m", "mlx_lm", "generate"]
    argv += ["--model", target, "--prompt", prompt_text, "--verbose", "False"]
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
                trust_remote_code: bool) -> EntryArm:
    """The mlx_lm.generate console script in a subprocess (cwd: a fresh directory), spied."""
    arm = EntryArm("cli", draft is not None, passed=options.passed(draft is not None))
    arm.argv = cli_argv(target, draft, prompt_text, options, trust_remote_code)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="specparity-e2e-") as tmp:
        (Path(tmp) / "sitecustomize.py").write_text(SITECUSTOMIZE)
        spy_out = Path(tmp) / "spy.json"
        env = dict(os.environ)
        # only the spy's sitecustomize: specparity comes from the interpreter's own install
        # (a repository root on the path would shadow the standard library's bisect)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (tmp, env.get("PYTHONPATH")) if p)
        env[SPY_ENV] = str(spy_out)
        work = Path(tmp) / "cwd"
        work.mkdir()
        try:
            proc = subprocess.run(arm.argv, cwd=work, env=env, capture_output=True, text=True,
                                  timeout=CLI_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            arm.error = f"mlx_lm.generate did not finish in {CLI_TIMEOUT_S} s"
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
class FirstDifference:
    """Where the drafter arm's output first left the classic arm's.

    what: ``token ids`` or ``text``. index: token index or character offset.
    before: the shared context just before it. classic / drafter: what each arm has
      from there (a few tokens or characters); *_pieces: the tokens decoded.
    classic_len / drafter_len: lengths of the two outputs.
    """

    what: str
    index: int
    before: Any
    classic: Any
    drafter: Any
    classic_len: int
    drafter_len: int
    classic_pieces: list[str] | None = None
    drafter_pieces: list[str] | None = None

    def describe(self) -> str:
        if self.what == "text":
            return (f"text differs first at character {self.index} (of {self.classic_len} classic /"
                    f" {self.drafter_len} with the drafter): ...{self.before!r} then classic"
                    f" {self.classic!r}, drafter {self.drafter!r}")
        return (f"token ids differ first at index {self.index} (of {self.classic_len} classic /"
                f" {self.drafter_len} with the drafter): after {self.before}, classic {self.classic}"
                f" {self.classic_pieces}, drafter {self.drafter} {self.drafter_pieces}")


def first_token_difference(a: list[int], b: list[int], tokenizer: Any = None) -> FirstDifference | None:
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    if i == len(a) == len(b):
        return None
    ca, cb = a[i: i + CONTEXT], b[i: i + CONTEXT]
    pieces = (lambda ts: [tokenizer.decode([t]) for t in ts]) if tokenizer is not None else (lambda ts: None)
    return FirstDifference("token ids", i, a[max(0, i - CONTEXT): i], ca, cb, len(a), len(b),
                           pieces(ca), pieces(cb))


def first_text_difference(a: str, b: str) -> FirstDifference | None:
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    if i == len(a) == len(b):
        return None
    return FirstDifference("text", i, a[max(0, i - TEXT_CONTEXT): i], a[i: i + TEXT_CONTEXT],
                           b[i: i + TEXT_CONTEXT], len(a), len(b))


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

    tokens_diff / text_diff: the first difference (None: identical).
    dropped: options the drafter arm dropped or changed (OptionFinding).
    not_accepted: options the user gave that this entry point has no way to take
      (the CLI has no logits-processor flags): both arms ran without them.
    default_changes: option -> (classic step's value, drafter step's value), for
      options the user left to the defaults where the two step functions differ.
    verdict: match, diverged (outputs differ or an option was dropped), not_engaged
      (nothing drafted), not_run (an arm failed; reason).
    """

    entry: str
    classic: EntryArm
    drafter: EntryArm
    tokens_diff: FirstDifference | None = None
    text_diff: FirstDifference | None = None
    dropped: list[OptionFinding] = field(default_factory=list)
    not_accepted: list[str] = field(default_factory=list)
    default_changes: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    reason: str = ""

    @property
    def verdict(self) -> Verdict:
        if self.classic.error or self.drafter.error:
            return Verdict.NOT_RUN
        if self.tokens_diff or self.text_diff or self.dropped:
            return Verdict.DIVERGED
        if self.drafter.step not in DRAFTING_STEPS or self.drafter.drafted == 0:
            return Verdict.NOT_ENGAGED
        return Verdict.MATCH

    def lines(self) -> list[str]:
        c, d = self.classic, self.drafter
        out = [f"{self.entry}: {self.verdict}: {self.reason}"]
        out.append(f"  classic: {len(c.tokens)} tokens via {c.step}; drafter: {len(d.tokens)} tokens via"
                   f" {d.step}, {d.drafted} drafted ({c.seconds:.1f} s / {d.seconds:.1f} s)")
        for diff in (self.tokens_diff, self.text_diff):
            if diff is not None:
                out.append("  " + diff.describe())
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


def compare_arms(entry: str, classic: EntryArm, drafter: EntryArm, options: E2EOptions, tokenizer: Any) -> EntryResult:
    res = EntryResult(entry, classic, drafter)
    if classic.error or drafter.error:
        res.reason = "; ".join(f"{a.name} did not run" for a in (classic, drafter) if a.error)
        return res
    res.tokens_diff = first_token_difference(classic.tokens, drafter.tokens, tokenizer)
    res.text_diff = first_text_difference(classic.text, drafter.text)
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
            res.default_changes[k] = (classic.defaults[k], drafter.defaults[k])
    v = res.verdict
    if v == Verdict.DIVERGED:
        parts = []
        if res.tokens_diff:
            parts.append(f"token ids differ at index {res.tokens_diff.index}")
        if res.text_diff:
            parts.append(f"text differs at character {res.text_diff.index}")
        if res.dropped:
            parts.append("with the drafter " + ", ".join(
                f"{f.option} {'dropped' if f.received is None else 'changed'}" for f in res.dropped))
        res.reason = "; ".join(parts)
    elif v == Verdict.NOT_ENGAGED:
        res.reason = (f"no evidence the drafter ran ({drafter.step or 'no step function'} was called,"
                      f" {drafter.drafted} tokens drafted)")
    else:
        res.reason = f"identical token ids and text over {len(classic.tokens)} tokens"
    return res


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
                "model": self.model, "draft_model": self.draft_model,
                "entries": [e.to_dict() for e in self.entries]}


def parse_entry_points(value: str | None) -> list[str]:
    if not value:
        return list(ENTRY_POINTS)
    out = []
    for item in value.split(","):
        item = item.strip()
        if item not in ENTRY_POINTS:
            raise UsageError(f"--entry-points {value!r}: {item!r} is not one of {', '.join(ENTRY_POINTS)}")
        if item not in out:
            out.append(item)
    return out


def run_e2e(loaded: Any, draft: Any, prompt: str | list[int], options: E2EOptions,
            entry_points: list[str] | None = None, trust_remote_code: bool = False,
            observer: Observer = NULL) -> E2ERun:
    """Run each entry point without and with the drafter; compare outputs and the options that reached them."""
    entry_points = list(entry_points or ENTRY_POINTS)
    prompt_text = prompt if isinstance(prompt, str) else loaded.tokenizer.decode(prompt)
    fp, dfp = loaded.fingerprint, draft.fingerprint
    passed = options.passed(True)
    run = E2ERun(
        header=(f"model {fp.path} ({fp.model_type}, fingerprint {fp.short}), drafter {dfp.path}"
                f" (fingerprint {dfp.short}); options: "
                + (", ".join(f"{k}={v}" for k, v in passed.items()) or "none (every entry point's defaults)")),
        options=passed, model=fp.to_dict(), draft_model=dfp.to_dict())
    with observer.part("entry points", total=len(entry_points)):
        for entry in entry_points:
            arms = []
            for with_draft in (False, True):
                observer.note(f"{entry} {'with' if with_draft else 'without'} the drafter")
                if entry == "cli":
                    arm = run_cli_arm(str(fp.path), str(dfp.path) if with_draft else None, prompt_text,
                                      options, trust_remote_code)
                else:
                    arm = run_api_arm(entry, loaded, draft if with_draft else None, prompt, options)
                observer.result(arm.name, asdict(arm))
                arms.append(arm)
            res = compare_arms(entry, arms[0], arms[1], options, loaded.tokenizer)
            if entry == "cli" and not isinstance(prompt, str):
                res.not_accepted.append("prompt ids (the CLI took their decoded text)")
            run.entries.append(res)
            observer.item("entry points")
    return run
