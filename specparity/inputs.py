"""Checks on user input: bounded lists and ranges, limits, token ids, fault specs.

Every check raises a one-line :class:`~specparity.errors.UsageError` naming the
flag (or file and line) and the value, and runs before anything is expanded,
allocated or loaded. Shared by every command and every source of the same kind
of input (a flag, a log, a record), so the class of input is closed once.

Limits a user may legitimately need raised are options of the root command
(``specparity --max-width N --max-positions N ...``) and environment variables
(``SPECPARITY_MAX_WIDTH``, ``SPECPARITY_MAX_POSITIONS``, ``SPECPARITY_MAX_SAMPLES``,
``SPECPARITY_MAX_ITEMS``), so an in-process caller (a server's ``gate_check``) sees the
same limits.
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from specparity.errors import InputError, Name, UsageError

from specparity.limits import (  # noqa: F401  (re-exported: the CLI's root options and the checks use them)
    DEFAULT_MAX_ITEMS,
    DEFAULT_MAX_POSITIONS,
    DEFAULT_MAX_SAMPLES,
    DEFAULT_MAX_WIDTH,
    ENV,
    OPTION,
    Limits,
    limits,
    raise_it,
    set_limits,
)


def _above(flag: str, value: Any, n: int, limit: str) -> UsageError:
    cap = getattr(limits(), limit)
    return UsageError(f"{flag} {value!r}: {n} is above the maximum {cap} {raise_it(limit)}")


def check_limit(n: int, flag: str, limit: str, value: Any = None) -> int:
    """``n`` itself if it is within ``limits().<limit>``; else a UsageError naming ``flag``."""
    if n > getattr(limits(), limit):
        raise _above(flag, n if value is None else value, n, limit)
    return n


def expand_user(path: str | os.PathLike[str], name: str | Name = "") -> Path:
    """``path`` with a leading ``~`` or ``~user`` expanded. A user with no home directory here is a
    UsageError naming ``name`` (the flag or key, or a library :class:`Name` the command shows as its
    flag; the message starts with the path when empty), not the RuntimeError pathlib raises."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        user = str(path)[1:].split("/", 1)[0]
        who = f"user {user!r}" if user else "the current user"
        rest = f"{path}: cannot expand '~{user}': {who} has no home directory here"
        if isinstance(name, Name):
            raise UsageError(name, " " + rest) from None
        raise UsageError(f"{name + ' ' if name else ''}{rest}") from None


def check_width(width: int, flag: str = "--width") -> int:
    """A verify block's row count: >= 1 and within --max-width."""
    if isinstance(width, bool) or not isinstance(width, int):
        raise UsageError(f"{flag} {width!r}: not an integer")
    if width < 1:
        raise UsageError(f"{flag} {width}: must be >= 1")
    return check_limit(width, flag, "max_width")


def check_positions(n: int, flag: str) -> int:
    """Tokens decoded past the prompt: >= 0 and within --max-positions."""
    if n < 0:
        raise UsageError(f"{flag} {n}: must be >= 0")
    return check_limit(n, flag, "max_positions")


def parse_int_list(value: str | None, flag: str, minimum: int = 0,
                   maximum: int | None = None, limit: str | None = None) -> list[int]:
    """``"2,4,8"`` or ``"2-16"`` -> sorted unique ints; a bad item names the flag.

    The bound (``maximum``, else ``limits().<limit>``) is checked on each item and
    each range's ends before anything is expanded, so no input can allocate more
    than ``maximum - minimum + 1`` integers.
    """
    if value is None or str(value).strip() == "":
        return []
    if maximum is None and limit is not None:
        maximum = getattr(limits(), limit)
    text = str(value)
    spans: list[tuple[int, int]] = []
    for raw in text.split(","):
        item = raw.strip()
        try:
            if "-" in item[1:]:
                cut = item.index("-", 1)
                lo, hi = int(item[:cut]), int(item[cut + 1:])
                if hi < lo:
                    raise UsageError(f"{flag} {text!r}: range {item!r} is empty (high end below low)")
            else:
                lo = hi = int(item)
        except ValueError:
            raise UsageError(f"{flag} {text!r}: {item!r} is not an integer or range") from None
        if lo < minimum:
            raise UsageError(f"{flag} {text!r}: {lo} is below the minimum {minimum}")
        if maximum is not None and hi > maximum:
            if limit is not None:
                raise _above(flag, text, hi, limit)
            raise UsageError(f"{flag} {text!r}: {hi} is above the maximum {maximum}")
        spans.append((lo, hi))
    if maximum is None and sum(hi - lo + 1 for lo, hi in spans) > 1_000_000:
        raise UsageError(f"{flag} {text!r}: more than 1000000 values")
    out: set[int] = set()
    for lo, hi in spans:
        out.update(range(lo, hi + 1))
    return sorted(out)


# ---------------------------------------------------------------- token ids


def vocab_size(loaded: Any) -> int:
    """Rows of the model's embedding: token ids must be in 0..vocab_size - 1.

    ``loaded`` is a :class:`~specparity.checkpoint.Loaded`, or an mlx-lm model.
    The embedding's shape is what a lookup indexes, so it wins over a config that
    says otherwise; the config's ``vocab_size`` (or ``text_config.vocab_size``) is
    the fallback for a model without a recognisable embedding.
    """
    model = getattr(loaded, "model", loaded)
    try:
        from mlx.utils import tree_flatten

        params: dict[str, Any] = dict(tree_flatten(model.parameters()))
        for name, v in params.items():
            if name.endswith(("embed_tokens.weight", "wte.weight")):
                return int(v.shape[0])
    except (AttributeError, ImportError, TypeError):
        pass
    cfg = getattr(loaded, "config", None) or {}
    for c in (cfg, cfg.get("text_config") or {}):
        if isinstance(c.get("vocab_size"), int) and c["vocab_size"] > 0:
            return int(c["vocab_size"])
    raise UsageError("cannot tell the model's vocabulary size (no embedding, no vocab_size)")


def check_token_ids(ids: Iterable[Any], vocab: int, what: str) -> list[int]:
    """Every id an integer in 0..vocab - 1; else a UsageError naming ``what`` and the id.

    ``what`` says where the ids came from: ``--prompt-ids '1,2'``, ``run.jsonl:3 'tokens'``.
    """
    out = []
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not _is_int(t):
            raise UsageError(f"{what}: item {i} ({t!r}) is not a token id")
        t = int(t)
        if not 0 <= t < vocab:
            raise UsageError(f"{what}: token {t} is outside the vocabulary (0..{vocab - 1})")
        out.append(t)
    return out


def _is_int(t: Any) -> bool:
    if isinstance(t, int):
        return True
    try:
        import numpy as np

        return isinstance(t, np.integer)
    except ImportError:
        return False


def check_prompts(prompts: list[list[int]], loaded: Any, what: str = "--prompt-ids") -> None:
    """Each prompt's ids within ``loaded``'s vocabulary (see :func:`check_token_ids`)."""
    vocab = vocab_size(loaded)
    for n, p in enumerate(prompts):
        label = what if len(prompts) == 1 else f"{what} (prompt {n})"
        check_token_ids(p, vocab, label)


def check_accept_log(req: Any, vocab: int) -> None:
    """Every token id an accept log carries: prompt, served tokens, transcript rounds."""
    src = getattr(req, "source", "log")
    if getattr(req, "prompt_ids", None) is not None:
        check_token_ids(req.prompt_ids, vocab, f"{src} 'prompt_ids'")
    for rnd in getattr(req, "rounds", None) or []:  # first: they name the exact line and field
        where = f"{src.rsplit(':', 1)[0]}:{rnd.line}"
        check_token_ids([rnd.bonus], vocab, f"{where} 'bonus'")
        check_token_ids(rnd.draft, vocab, f"{where} 'draft_tokens'")
        check_token_ids(rnd.target, vocab, f"{where} 'target_tokens'")
        check_token_ids(rnd.new_tokens, vocab, f"{where} 'new_tokens'")
    if getattr(req, "tokens", None) is not None:
        check_token_ids(req.tokens, vocab, f"{src} 'tokens'")


def check_accept_widths(req: Any) -> None:
    """A log's width(s) within --max-width, and its emitted tokens within --max-positions."""
    src = getattr(req, "source", "log")
    if getattr(req, "width", None) is not None:
        check_width(req.width, f"{src} 'width'")
    for w in getattr(req, "widths", None) or []:
        check_width(w, f"{src} 'widths'")
    emitted = sum(a + 1 for a in req.accepts)
    check_limit(emitted, f"{src}: the accept vector", "max_positions",
                f"{len(req.accepts)} rounds emitting {emitted} tokens")


# ---------------------------------------------------------------- fixture faults

FAULT_KINDS = ("rows", "depth", "prefill_path", "stale_trim", "noise", "tie")


def parse_fault(text: str, num_layers: int | None = None) -> dict[str, Any]:
    """A ``--fault`` JSON object, every field checked (see fixture_models/specparity_fixture.py)."""
    try:
        item = json.loads(text)
    except ValueError as err:
        raise InputError("fault", f"{text!r}: not JSON ({str(err).splitlines()[0]})") from None
    except RecursionError:
        raise InputError("fault", f"{text!r}: nested too deeply") from None
    if not isinstance(item, dict) or item.get("kind") not in FAULT_KINDS:
        raise InputError("fault", f"{text!r}: kind must be {', '.join(FAULT_KINDS)}")

    def int_field(key: str, lo: int, hi: int | None = None, required: bool = False) -> None:
        if key not in item:
            if required:
                raise InputError("fault", f"{text!r}: {item['kind']} needs {key!r}")
            return
        v = item[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
            rng = f"{lo}..{hi}" if hi is not None else f">= {lo}"
            raise InputError("fault", f"{text!r}: {key!r} must be an integer {rng}, got {v!r}")

    if item["kind"] in ("rows", "depth", "prefill_path", "noise"):  # a noise fault without a layer: the logits
        int_field("layer", 0, None if num_layers is None else num_layers - 1, required=item["kind"] != "noise")
    if item["kind"] in ("rows", "depth", "prefill_path", "tie"):
        int_field("min_rows", 1)
    if item["kind"] in ("rows", "depth", "prefill_path", "noise"):
        sub = item.get("subop")
        if sub is not None and (not isinstance(sub, str) or (sub and not sub.isidentifier())):
            raise InputError("fault", f"{text!r}: 'subop' must be an attribute name, got {sub!r}")
    if item["kind"] == "depth":
        int_field("min_offset", 0, required=True)
    scale = item.get("scale", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise InputError("fault", f"{text!r}: 'scale' must be a positive number, got {scale!r}")
    return item


# ---------------------------------------------------------------- request bodies

INT32_MAX = 2**31 - 1  # what an mlx index or slice bound takes (a context size past it overflows)
SEED_MAX = 2**64 - 1  # mx.random.seed takes an unsigned 64-bit integer
XTC_THRESHOLD_MAX = 0.5  # mlx-lm's apply_xtc refuses more, on the generation thread


@functools.lru_cache(maxsize=16)
def request_schema(vocab: int | None = None) -> Any:
    """The fields of an OpenAI-style request body that reach mlx-lm's sampler, processors and
    generation loop, each with the range that cannot fail or crash there (mlx-lm's server checks
    types and lower bounds; NaN passes its ``<`` checks, an id outside the vocabulary writes out
    of bounds, a top_k it cannot partition raises on the generation thread). ``vocab``: the
    model's vocabulary size, bounding token ids and top_k (None: not known here; the ids are then
    only integers >= 0). Other keys (prompt, messages, model, tools...) are left to the reader.
    """
    from specparity.schema import AnyOf, Bool, Fields, Int, Json, ListOf, MapOf, Nullable, Number, Str

    tokens = Int(1, limit="max_positions")
    context = Int(0, INT32_MAX)
    return Fields({
        "max_tokens": tokens,
        "max_completion_tokens": Nullable(tokens),
        "temperature": Number(ge=0),
        "top_p": Number(ge=0, le=1),
        "top_k": Int(0, None if vocab is None else vocab - 1),
        "min_p": Number(ge=0, le=1),
        "xtc_probability": Number(ge=0, le=1, integers=False),
        "xtc_threshold": Number(ge=0, le=XTC_THRESHOLD_MAX, integers=False),
        "repetition_penalty": Number(ge=0),
        "repetition_context_size": context,
        "presence_penalty": Number(),
        "presence_context_size": context,
        "frequency_penalty": Number(),
        "frequency_context_size": context,
        "logit_bias": Nullable(LogitBias(vocab)),
        "stop": Nullable(AnyOf(Str(), ListOf(Str(), limit="max_items"),
                               what="a string or a list of strings")),
        "seed": Nullable(Int(0, SEED_MAX)),
        "num_draft_tokens": Int(0),
        "stream": Bool(),
        # read after the last token (a client's truncated stream, not a 400) unless checked here
        "stream_options": Nullable(Fields({"include_usage": Bool()}, required=("include_usage",), open=True)),
        "model": Str("a checkpoint path or hub id (a string)"),
        "draft_model": Nullable(Str("a checkpoint path or hub id (a string)")),
        "adapters": Nullable(Str("an adapter path (a string)")),
        "logprobs": Bool(),
        "top_logprobs": Int(-1, 11),
        "chat_template_kwargs": Nullable(MapOf(Json(limit="max_items"), key=Str())),
    }, open=True, what="a JSON object (the request body)")


def LogitBias(vocab: int | None) -> Any:  # noqa: N802 (reads as the other checkers do)
    """A mapping of token id (a JSON key, read by ``int()`` as mlx-lm does) to a finite bias."""
    from specparity.schema import Check, Invalid, Number, describe

    class _Check(Check):
        what = "a mapping of token id to a finite number"

        def check(self, value: Any, path: tuple[Any, ...]) -> None:
            if not isinstance(value, dict):
                raise self.fail(value, path)
            bias = Number()
            for k, v in value.items():
                try:
                    t = int(k)
                except (TypeError, ValueError):
                    raise Invalid((*path, k), f"{describe(k)} is not a token id") from None
                top = f"0..{vocab - 1}" if vocab is not None else ">= 0"
                if t < 0 or (vocab is not None and t >= vocab):
                    raise Invalid((*path, k), f"token {t} is outside the vocabulary ({top})")
                bias.check(v, (*path, k))

    return _Check()


def check_request(body: Any, vocab: int | None = None, where: str = "") -> None:
    """``body``'s generation fields within :func:`request_schema`; else a UsageError naming the
    field: ``[where: ]request field logit_bias['99999']: token 99999 is outside the vocabulary (0..511)``."""
    from specparity.schema import Invalid, describe, key_path

    at = f"{where}: " if where else ""
    if not isinstance(body, dict):
        raise UsageError(f"{at}request body: expected a JSON object, got {describe(body)}")
    try:
        request_schema(vocab).check(body, ())
    except Invalid as bad:
        raise UsageError(f"{at}request field {key_path(bad.path)}: {bad.message}") from None


def config_vocab_size(model: str | os.PathLike[str]) -> int | None:
    """The vocabulary size a local checkpoint's ``config.json`` states (``vocab_size``, or
    ``text_config.vocab_size``), read without loading weights; None when there is no such file
    or number (a hub id, another layout): the loaded model's check then applies."""
    from specparity.schema import load_json, read_text

    try:
        path = Path(model).expanduser() / "config.json"
        if not path.is_file():
            return None
        cfg = load_json(read_text(path, str(path)), str(path))
    except (UsageError, OSError, RuntimeError, ValueError):  # a name no file system takes, ~nobody
        return None
    if not isinstance(cfg, dict):
        return None
    for c in (cfg, cfg.get("text_config")):
        if isinstance(c, dict):
            v = c.get("vocab_size")
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
    return None
