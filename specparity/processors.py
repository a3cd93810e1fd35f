"""Logits processors as classic decode applies them (repetition/presence/frequency penalty, logit_bias).

mlx-lm's ``generate_step`` runs every processor of ``make_logits_processors``
on each step's raw logits row, in the model's dtype, with the whole history
seen so far: the prompt plus every token emitted before the row. Sampling
(greedy: the argmax of logprobs) follows. :class:`ProcessorOptions` holds
the user's options; :func:`process_row` applies them to one row exactly that
way, so a reference chain built with it is classic decode's own.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from specparity.errors import InputError, UsageError

DEFAULT_CONTEXT = 20  # make_logits_processors' default context sizes


@dataclass
class ProcessorOptions:
    """The logits-processor options a user passes (mlx-lm's ``make_logits_processors`` arguments).

    repetition_penalty / presence_penalty / frequency_penalty: None (or 0) = off.
    *_context_size: how many trailing history tokens each penalty sees.
    logit_bias: token id -> additive bias (empty = off).
    """

    repetition_penalty: float | None = None
    repetition_context_size: int = DEFAULT_CONTEXT
    presence_penalty: float | None = None
    presence_context_size: int = DEFAULT_CONTEXT
    frequency_penalty: float | None = None
    frequency_context_size: int = DEFAULT_CONTEXT
    logit_bias: dict[int, float] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return bool(self.logit_bias) or any(
            v not in (None, 0) for v in (self.repetition_penalty, self.presence_penalty,
                                         self.frequency_penalty))

    def kwargs(self) -> dict[str, Any]:
        """``make_logits_processors`` keyword arguments."""
        return {k: v for k, v in asdict(self).items() if not (k == "logit_bias" and not v)}

    def make(self) -> list[Any]:
        """mlx-lm's own processors for these options (empty when none is active)."""
        if not self.active:
            return []
        from mlx_lm.sample_utils import make_logits_processors

        try:
            return make_logits_processors(**self.kwargs())
        except ValueError as err:  # mlx-lm refuses a negative repetition penalty
            raise InputError("repetition-penalty", f": {err}") from None

    def flags(self) -> list[str]:
        """The command-line flags that give these options (``replay``, ``e2e``): empty when none is active."""
        out: list[str] = []
        for name in ("repetition", "presence", "frequency"):
            v = getattr(self, f"{name}_penalty")
            if v not in (None, 0):
                out += [f"--{name}-penalty", f"{v:g}"]
                if getattr(self, f"{name}_context_size") != DEFAULT_CONTEXT:
                    out += [f"--{name}-context-size", str(getattr(self, f"{name}_context_size"))]
        if self.logit_bias:
            out += ["--logit-bias", ",".join(f"{k}:{v:g}" for k, v in self.logit_bias.items())]
        return out

    def describe(self) -> str:
        if not self.active:
            return "none"
        parts = []
        for name in ("repetition", "presence", "frequency"):
            v = getattr(self, f"{name}_penalty")
            if v not in (None, 0):
                parts.append(f"{name}_penalty={v:g} (context {getattr(self, f'{name}_context_size')})")
        if self.logit_bias:
            parts.append("logit_bias={" + ", ".join(f"{k}: {v:g}" for k, v in self.logit_bias.items()) + "}")
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["logit_bias"] = {str(k): v for k, v in self.logit_bias.items()}
        return d


def parse_logit_bias(value: str | None, flag: str = "--logit-bias") -> dict[int, float]:
    """``"5:2.5,17:-100"`` -> {5: 2.5, 17: -100.0}; a bad item names the flag and item."""
    out: dict[int, float] = {}
    if not value:
        return out
    for item in value.split(","):
        item = item.strip()
        if not item:
            continue
        tok, sep, bias = item.partition(":")
        try:
            if not sep:
                raise ValueError
            t = int(tok)
            out[t] = float(bias)
        except ValueError:
            raise UsageError(f"{flag} {value!r}: {item!r} is not TOKEN_ID:BIAS") from None
        if t < 0:
            raise UsageError(f"{flag} {value!r}: token id {t} is negative")
    return out


def process_row(processors: list[Any], history: list[int], row: Any) -> Any:
    """One logits row (vocab,) after ``processors``, with ``history`` (prompt + emitted so far).

    Exactly ``generate_step``'s call: a (1, vocab) row in the model's dtype and
    the history as a uint32-compatible array; returns (vocab,).
    """
    if not processors:
        return row
    import mlx.core as mx

    tokens = mx.array(history)
    logits = row[None]
    for p in processors:
        logits = p(tokens, logits)
    return logits[0]


def check_vocab(opts: ProcessorOptions, vocab: int) -> None:
    """A logit_bias token outside the vocabulary is a usage error, not an mlx crash."""
    bad = [t for t in opts.logit_bias if t >= vocab]
    if bad:
        raise InputError("logit-bias", f": token id {bad[0]} is outside the vocabulary (0..{vocab - 1})")
