"""How a record's text is shown: a record is data, never terminal control or markup of its own.

One mapping for the terminal (``records show``, ``list``, ``compare``, ``merge``, and the error lines that
quote a record) and for the page (records.html escapes its result as well). No import of the rest.
"""

from __future__ import annotations

# what a terminal or a page would act on rather than show: C0 and C1 controls, the Unicode line and
# paragraph separators, and the bidirectional overrides that reorder what follows them on screen
_GLYPHS = {**{c: "\u00b7" for c in [*range(32), *range(127, 160), 0x2028, 0x2029, *range(0x202A, 0x202F),
                                     *range(0x2066, 0x206A)]},
           ord("\n"): "\u23ce", ord("\t"): "\u2192"}


def printable(s: str) -> str:
    """``s`` with each character a terminal would act on shown as one visible glyph (newline ⏎, tab →,
    any other ·): a record's text can neither move the cursor nor start a line of its own,
    and two texts set one above the other stay aligned character for character."""
    return s.translate(_GLYPHS)
