"""Text and tokens told apart (issue 46): the same ids written as other text is never a token divergence.

On the fixture pair's real byte-level BPE tokenizer: mlx-lm's streaming detokenizer (classic decode's text)
drops a completion's leading space, ``tokenizer.decode`` keeps it, so an engine that writes its text the
second way differs at character 0 from identical ids.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from specparity.completions import Side, first_difference, other_texts

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def tok(llama_pair: Any) -> Any:
    from mlx_lm.utils import load_tokenizer

    return load_tokenizer(Path(llama_pair.target))


@pytest.fixture(scope="module")
def ids(tok: Any) -> list[int]:
    out = tok.encode(" the cat sat on the mat and the dog")
    assert tok.decode(out).startswith(" ")  # the case: a completion whose first token carries a space
    return out


def test_the_same_ids_written_two_ways_is_text_only_and_named(tok: Any, ids: list[int]) -> None:
    from specparity.decode import stream_text

    classic = Side("classic", stream_text(tok, ids), list(ids), texts=other_texts(tok, ids))
    engine = Side("engine", tok.decode(ids), list(ids))
    assert classic.text != engine.text and engine.text == " " + classic.text
    d = first_difference(classic, engine, tok)
    assert d is not None and d.text_only and d.char_offset == 0
    assert d.detokenization == f"both sides emitted these {len(ids)} token ids: engine's text is them decoded by" \
                               " tokenizer.decode"
    assert d.line().startswith("the same token ids, other text from char 0: both sides emitted")


def test_a_text_only_side_that_wrote_the_references_ids_another_way_is_text_only(tok: Any, ids: list[int]) -> None:
    from specparity.decode import stream_text

    classic = Side("classic decode", stream_text(tok, ids), list(ids), texts=other_texts(tok, ids))
    served = Side("w4", tok.decode(ids))  # a server that gives text only
    d = first_difference(classic, served)
    assert d is not None and d.text_only
    assert "w4 gave text only, and its text is classic decode's" in str(d.detokenization)


def test_a_text_only_answer_stripped_of_the_whitespace_around_it_is_text_only(tok: Any) -> None:
    """A server that strips its answer (yunshu's chat content, mlx-vlm's text) wrote classic decode's ids, then cut
    the whitespace at the ends: named so, on a chat answer (no other ways of writing it) as on a completion. The
    same stripped text with one character changed inside stays a divergence, placed where it parts."""
    from specparity.decode import stream_text

    ids = tok.encode("\n\n the cat sat on the mat \n")
    text = stream_text(tok, ids)
    assert text != text.strip() and text.strip()
    for texts in ({}, other_texts(tok, ids)):  # a chat answer's reference has no other ways; a completion's has
        classic = Side("classic decode", text, list(ids), texts=texts)
        d = first_difference(classic, Side("baseline-start", text.strip()))
        assert d is not None and d.text_only, d
        assert "stripped of the whitespace around it" in str(d.detokenization)
        d = first_difference(classic, Side("w4", text.strip().replace("mat", "hat")))
        assert d is not None and not d.text_only
    # ids and text on both sides: other ids are a divergence whatever the text
    other = list(ids)
    other[-2] = (other[-2] + 1) % 256
    d = first_difference(Side("classic", text, list(ids)), Side("engine", tok.decode(other).strip(), other))
    assert d is not None and not d.text_only


def test_other_ids_or_other_text_stay_a_divergence(tok: Any, ids: list[int]) -> None:
    """Both ways: a token that differs, or a text-only answer that is not the ids' text any known way, is a
    divergence with its place, never explained away."""
    from specparity.decode import stream_text

    classic = Side("classic", stream_text(tok, ids), list(ids), texts=other_texts(tok, ids))
    other_ids = list(ids)
    other_ids[3] = (other_ids[3] + 1) % 256
    d = first_difference(classic, Side("engine", tok.decode(other_ids), other_ids), tok)
    assert d is not None and not d.text_only and d.token_index == 3
    changed = tok.decode(ids).replace("dog", "cog")
    d = first_difference(classic, Side("w4", changed))
    # placed where the text really parts (past the leading space it writes as tokenizer.decode does), not at 0
    assert d is not None and not d.text_only and d.char_offset == len(classic.text) - 3
    assert (d.written_as, d.reference_snippet, d.other_snippet) == ("tokenizer.decode", "dog", "cog")


def test_e2e_names_a_text_only_difference_and_writes_an_engines_ids_as_classic_decode_does(
        tok: Any, ids: list[int], llama_pair: Any) -> None:
    """e2e's comparison. An engine's own-loop arm gets its text the way classic decode writes ids
    (``stream_text``), so the same ids are the same text: match (it read "token ids differ at index N; text
    differs at character 0" with every id equal). Two arms of one producer whose same ids became other text
    with the drafter stay a finding, named text only; one other token is diverged at that token."""
    from specparity.decode import stream_text
    from specparity.probes.e2e import OWN_LOOP, E2EOptions, EntryArm, compare_arms
    from specparity.verdicts import Verdict

    def arm(name: str, tokens: list[int], text: str, drafts: bool) -> EntryArm:
        a = EntryArm(name, drafts, passed={"max_tokens": len(tokens)})
        a.step = f"engine generate {OWN_LOOP}" if drafts else "stream_generate"
        a.received, a.tokens, a.text, a.drafted = dict(a.passed), list(tokens), text, 5 if drafts else 0
        return a

    options = E2EOptions(max_tokens=len(ids))
    classic = arm("stream_generate", ids, stream_text(tok, ids), False)
    res = compare_arms("generate", classic, arm("generate", ids, stream_text(tok, ids), True), options, tok)
    assert res.verdict == Verdict.MATCH and res.difference is None, res.reason
    res = compare_arms("generate", classic, arm("generate", ids, tok.decode(ids), True), options, tok)
    assert res.verdict == Verdict.DIVERGED and res.difference is not None and res.difference.text_only
    assert res.reason == (f"identical token ids over {len(ids)} tokens; with the drafter they are written as other"
                          " text from character 0 (text only, not a token divergence)")
    other = list(ids)
    other[5] = (other[5] + 1) % 256
    res = compare_arms("generate", classic, arm("generate", other, tok.decode(other), True), options, tok)
    assert res.verdict == Verdict.DIVERGED and res.reason.startswith("token ids differ at index 5")
