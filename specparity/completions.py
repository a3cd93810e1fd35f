"""The one completion comparison: where two generated outputs first part, and how confidently.

Every comparison of two completions goes through :func:`first_difference`:
``specparity e2e`` (classic arm vs drafter arm), ``specparity served`` (an
arm vs the baseline server, vs classic decode computed in process, vs its own
cold answer). A side is what one producer emitted (:class:`Side`); the answer
names the first differing emitted token (where both sides have token ids) and
the first differing character, with the shared context before it, a few
tokens or characters of each side after it, whether the emitted-token
logprobs agreed bitwise before it, and each side's top-2 margin there (a flip
at a near tie reads differently from a confident one).

Text and tokens are told apart: two sides that emitted the very same token ids
and wrote different text differ only in how ids became text (mlx-lm's streaming
detokenizer drops a completion's leading space, ``tokenizer.decode`` keeps it),
which is not a divergence of the tokens. Where the other side gave text only,
its text is checked against the reference's ids turned into text the other
known ways (:func:`other_texts`). Such a difference carries
:attr:`CompletionDifference.detokenization` and is :attr:`~CompletionDifference.text_only`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

CONTEXT_TOKENS = 4
CONTEXT_CHARS = 24
# record fields written before the one comparison existed (served records), read as today's
_LEGACY = {"baseline_snippet": "reference_snippet", "arm_snippet": "other_snippet",
           "margin_baseline": "margin_reference", "margin_arm": "margin_other"}


@dataclass
class Side:
    """One completion as the comparison sees it.

    name: how reports call it (``classic decode``, ``baseline-start``, ``w4``).
    text: the decoded text. token_ids: the emitted token ids (None: the producer gave none).
    logprobs: the emitted token's logprob per token. top: per token, (id, logprob) pairs best first.
    texts: the same token ids turned into text the other known ways, by how (:func:`other_texts`): a
      side that gave text only and wrote one of these emitted these ids, detokenized otherwise.
    """

    name: str
    text: str
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    top: list[list[tuple[int, float]]] | None = None
    texts: dict[str, str] = field(default_factory=dict)


@dataclass
class CompletionDifference:
    """Where ``other`` first leaves ``reference``.

    reference / other: the two sides' names.
    token_index: first differing emitted token (None when a side has no token ids).
    tokens_before: the shared ids just before it; reference_tokens / other_tokens: each
      side's ids from there (a few); reference_pieces / other_pieces: those ids decoded.
    reference_token_count / other_token_count: emitted tokens on each side (None: unknown).
    char_offset: first differing character (None when the texts are equal: the ids differ
      only, e.g. two tokenizations of the same text).
    text_before: the shared text just before it; reference_snippet / other_snippet: each
      side's text from there (a few characters).
    reference_chars / other_chars: text lengths.
    logprobs_equal_before: emitted-token logprobs bitwise equal on every token before
      token_index (None without logprobs on both sides).
    first_logprob_diff: first token whose logprob differs bitwise (it may precede the flip).
    margin_reference / margin_other: top-1 minus top-2 logprob at token_index on each side.
    detokenization: the sides emitted the same token ids (shown equal, or the other side's text is the
      reference's ids turned into text another known way) and differ only in the text made of them: how
      (None: the tokens, or the text they stand for, differ).
    written_as: a text-only other side writes its text this other known way (``tokenizer.decode``: the
      leading space kept): char_offset and the snippets compare the texts past that lead, so the first
      real difference is placed in the reference's text, not at the lead.
    """

    reference: str
    other: str
    token_index: int | None = None
    tokens_before: list[int] = field(default_factory=list)
    reference_tokens: list[int] = field(default_factory=list)
    other_tokens: list[int] = field(default_factory=list)
    reference_pieces: list[str] | None = None
    other_pieces: list[str] | None = None
    reference_token_count: int | None = None
    other_token_count: int | None = None
    char_offset: int | None = None
    text_before: str = ""
    reference_snippet: str = ""
    other_snippet: str = ""
    reference_chars: int = 0
    other_chars: int = 0
    logprobs_equal_before: bool | None = None
    first_logprob_diff: int | None = None
    margin_reference: float | None = None
    margin_other: float | None = None
    detokenization: str | None = None
    written_as: str | None = None

    @property
    def text_only(self) -> bool:
        """The same token ids on both sides; only the text made of them differs (not a token divergence)."""
        return self.detokenization is not None

    @property
    def index(self) -> int:
        """The token index where known, else the character offset (the first place they part)."""
        if self.token_index is not None:
            return self.token_index
        return self.char_offset if self.char_offset is not None else 0

    def line(self) -> str:
        """One line: where, what each side has there, the logprobs before it, the margins."""
        if self.detokenization is not None:
            return (f"the same token ids, other text from char {self.char_offset}: {self.detokenization}:"
                    f" ...{self.text_before!r} then {self.reference} {self.reference_snippet!r}"
                    f" vs {self.other} {self.other_snippet!r}")
        where = []
        if self.token_index is not None:
            where.append(f"token {self.token_index}")
        if self.char_offset is not None:
            where.append(f"char {self.char_offset}")
        s = f"first difference at {', '.join(where) or 'the end'}"
        if self.written_as is not None:
            s += f" (compared past the leading text {self.other} writes as {self.written_as} does)"
        if self.token_index is not None and self.reference_token_count is None:
            s += f" (the token index from {self.reference}'s pieces: the other side gave text only):"
        elif self.token_index is not None:
            s += (f" (of {self.reference_token_count} {self.reference} / {self.other_token_count} {self.other}"
                  f" tokens): after {self.tokens_before}, {self.reference} {self.reference_tokens}"
                  + (f" {self.reference_pieces}" if self.reference_pieces is not None else "")
                  + f" vs {self.other} {self.other_tokens}"
                  + (f" {self.other_pieces}" if self.other_pieces is not None else ""))
            s += "; text" if self.char_offset is not None else " (the texts are equal: only the token ids differ)"
        else:
            s += ":"
        if self.char_offset is not None:
            s += (f" ...{self.text_before!r} then {self.reference} {self.reference_snippet!r}"
                  f" vs {self.other} {self.other_snippet!r}")
        if self.logprobs_equal_before is not None:
            s += ("; logprobs bitwise equal before it" if self.logprobs_equal_before
                  else f"; logprobs first differ at token {self.first_logprob_diff}")
        if self.margin_reference is not None or self.margin_other is not None:
            s += (f"; top-2 margin there {_fmt(self.margin_reference)} ({self.reference}) /"
                  f" {_fmt(self.margin_other)} ({self.other}) nats")
        return s

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CompletionDifference:
        """Read back what :meth:`to_dict` wrote (and the older served records' field names)."""
        names = {f.name for f in fields(cls)}
        kw = {_LEGACY.get(k, k): v for k, v in d.items()}
        kw.setdefault("reference", "baseline")
        kw.setdefault("other", "arm")
        return cls(**{k: v for k, v in kw.items() if k in names})


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4g}"


def first_index(a: Sequence[Any], b: Sequence[Any]) -> int:
    """The first index where two sequences (token ids, text) differ: the shorter length where one is
    a prefix of the other, or they are equal. Every first-difference position is found here."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def margin(top: list[list[tuple[int, float]]] | None, i: int | None) -> float | None:
    """Top-1 minus top-2 logprob at token ``i`` (None without two candidates there)."""
    if top is None or i is None or i >= len(top) or len(top[i]) < 2:
        return None
    return float(top[i][0][1]) - float(top[i][1][1])


def first_difference(reference: Side, other: Side, tokenizer: Any = None) -> CompletionDifference | None:
    """None when the two sides emitted the same tokens and text, else where they first part.

    tokenizer: decodes the differing ids into pieces (optional).
    """
    same_ids = reference.token_ids is None or other.token_ids is None or reference.token_ids == other.token_ids
    if reference.text == other.text and same_ids:
        return None
    d = CompletionDifference(reference.name, other.name, reference_chars=len(reference.text),
                             other_chars=len(other.text))
    if reference.text != other.text:
        lead, d.written_as = _written_as(reference, other)
        off = first_index(reference.text, other.text[len(lead):])
        d.char_offset = off
        d.text_before = reference.text[max(off - CONTEXT_CHARS, 0):off]
        d.reference_snippet = reference.text[off:off + CONTEXT_CHARS]
        d.other_snippet = other.text[len(lead) + off:len(lead) + off + CONTEXT_CHARS]
    a, b = reference.token_ids, other.token_ids
    if a is not None and b is not None:
        i = first_index(a, b)
        d.token_index = i
        d.reference_token_count, d.other_token_count = len(a), len(b)
        d.tokens_before = list(a[max(i - CONTEXT_TOKENS, 0):i])
        d.reference_tokens, d.other_tokens = list(a[i:i + CONTEXT_TOKENS]), list(b[i:i + CONTEXT_TOKENS])
        if tokenizer is not None:
            d.reference_pieces = [tokenizer.decode([t]) for t in d.reference_tokens]
            d.other_pieces = [tokenizer.decode([t]) for t in d.other_tokens]
        if reference.logprobs is not None and other.logprobs is not None:
            k = first_index(reference.logprobs, other.logprobs)
            n = min(len(reference.logprobs), len(other.logprobs))
            d.first_logprob_diff = k if k < n else None
            d.logprobs_equal_before = k >= n or k >= i
        d.margin_reference, d.margin_other = margin(reference.top, i), margin(other.top, i)
    if d.char_offset is not None:
        d.detokenization = _detokenization(reference, other)
    return d


def _written_as(reference: Side, other: Side) -> tuple[str, str | None]:
    """A text-only side that writes text another known way (a leading space mlx-lm's detokenizer drops):
    the lead its text starts with and the way, so the two texts are compared past it and the first real
    difference is placed in the reference's text ("", None: compared as they are)."""
    if other.token_ids is not None:
        return "", None
    for how, text in reference.texts.items():
        lead = text[:len(text) - len(reference.text)]
        if lead and text.endswith(reference.text) and other.text.startswith(lead) \
                and not reference.text.startswith(lead):
            return lead, how
    return "", None


STRIPPED = "stripped of the whitespace around it"


def _detokenization(reference: Side, other: Side) -> str | None:
    """How two sides whose texts differ emitted the same ids (None: nothing shows they did).

    A side that gives text only and whose text is the reference's (or one of its other ways) with the whitespace
    at its ends stripped wrote those ids and then stripped them, as servers do to an answer (yunshu's chat
    content, mlx-vlm's text): named so, never a token divergence. Nothing is hidden but the whitespace at the two
    ends; text that parts anywhere between is not this."""
    how = next((k for k, text in reference.texts.items() if text == other.text), None)
    if how is None and other.token_ids is None and other.text.strip():
        ways = {"mlx-lm's streaming detokenizer": reference.text, **reference.texts}
        how = next((f"{k}, {STRIPPED}" for k, text in ways.items() if text.strip() == other.text), None)
    named = f": {other.name}'s text is them decoded by {how}" if how else ""
    if reference.token_ids is not None and other.token_ids is not None:
        if reference.token_ids != other.token_ids:
            return None
        return f"both sides emitted these {len(reference.token_ids)} token ids{named}"
    if how is None or reference.token_ids is None:
        return None
    return (f"{other.name} gave text only, and its text is {reference.name}'s {len(reference.token_ids)} token"
            f" ids decoded by {how} (where {reference.name}'s is mlx-lm's streaming detokenizer's)")


# the ways an engine or a server turns emitted ids into text, besides mlx-lm's streaming detokenizer
# (which drops a completion's leading space): one call of the tokenizer's decode, with and without
# the special tokens, and the tokens decoded one at a time and joined
def other_texts(tokenizer: Any, token_ids: Sequence[int]) -> dict[str, str]:
    """``token_ids`` (a trailing eos left out: no producer writes its text) turned into text each other
    known way, by how; ways that raise or give the same text as an earlier one are left out."""
    ids = [int(t) for t in token_ids]
    eos = {int(e) for e in getattr(tokenizer, "eos_token_ids", None) or ()}
    if ids and ids[-1] in eos:
        ids = ids[:-1]
    ways = {"tokenizer.decode": lambda: tokenizer.decode(ids),
            "tokenizer.decode(skip_special_tokens=True)": lambda: tokenizer.decode(ids, skip_special_tokens=True),
            "per-token decode, joined": lambda: "".join(tokenizer.decode([t]) for t in ids)}
    out: dict[str, str] = {}
    for how, make in ways.items():
        try:
            text = make()
        except Exception:  # noqa: BLE001  (a tokenizer without that way: not one of its texts)
            continue
        if isinstance(text, str) and text not in out.values():
            out[how] = text
    return out
