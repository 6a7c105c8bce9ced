"""An attempt's received text, kept compact while it streams (``worker.Pieces``)."""

from __future__ import annotations

import sys

from hypothesis import given
from hypothesis import strategies as st

from resumeq.worker.call import Pieces


@given(st.lists(st.text(max_size=12), max_size=400))
def test_pieces_give_back_the_text_and_the_count_as_appended(parts: list[str]) -> None:
    pieces = Pieces()
    for part in parts:
        pieces.append(part)
    assert pieces.text() == "".join(parts)
    assert pieces.count == len(parts)


def test_a_long_stream_is_held_in_few_objects() -> None:
    pieces = Pieces()
    deltas = [f" tok{n % 97}" for n in range(10_000)]  # a 10,000-token answer, a token a piece
    for d in deltas:
        pieces.append(d)
    held = pieces._joined + pieces._recent
    assert len(held) <= 10_000 // Pieces.JOIN_EVERY + Pieces.JOIN_EVERY
    # About the text's own size, not ten times it (a list of 10,000 short strings).
    text = pieces.text()
    assert sum(sys.getsizeof(s) for s in held) < 2 * sys.getsizeof(text)
    assert sum(sys.getsizeof(s) for s in deltas) > 5 * sys.getsizeof(text)
