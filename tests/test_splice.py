"""Splicing a continuation onto the stored prefix."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from resumeq.splice import DEFAULT_MIN_OVERLAP, Splicer, leading_whitespace, splice

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india"]


@pytest.mark.parametrize(
    ("prefix", "continuation", "trimmed", "appended"),
    [
        # Plain continuation.
        ("The quick brown", " fox jumps.", "", " fox jumps."),
        # Anthropic prefill: " " trimmed, the model starts with it again.
        ("The quick brown ", " fox jumps.", " ", "fox jumps."),
        # ... or glues the next word on: the stored space stays.
        ("The quick brown ", "fox jumps.", " ", "fox jumps."),
        # Trimmed a newline pair, the model writes one of them again, then more text.
        ("Heading\n\n", "\nBody", "\n\n", "Body"),
        # Trimmed "\n", the model opens with "\n\n": one of them is new.
        ("Heading\n", "\n\nBody", "\n", "\nBody"),
        # Different white space than trimmed: nothing is doubled, nothing deleted.
        ("Line one ", "\nLine two", " ", "\nLine two"),
        # A repeat of the prefix's end, long enough to be one: dropped.
        (
            "We went to the old mill by the river",
            " the old mill by the river and on.",
            "",
            " and on.",
        ),
        # A short echo is a legitimate word, not a repeat.
        ("I said no", " no more.", "", " no more."),
        ("The the", " the end", "", " the end"),
        # Repeat after trimmed white space.
        ("It was the best of times, ", "the best of times, it was", " ", "it was"),
        # Empty continuation; empty prefix.
        ("Some text", "", "", ""),
        ("", "Fresh start", "", "Fresh start"),
    ],
)
def test_named_cases(prefix: str, continuation: str, trimmed: str, appended: str) -> None:
    out, _ = splice(prefix, continuation, trimmed=trimmed)
    assert out == appended


def test_report_says_what_was_dropped() -> None:
    _, report = splice("alpha bravo charlie delta ", " bravo charlie delta echo", trimmed=" ")
    assert report.whitespace_dropped == 1
    assert report.overlap_dropped == len("bravo charlie delta ")


def test_trimmed_must_end_the_prefix() -> None:
    with pytest.raises(ValueError, match="trimmed"):
        Splicer("abc", trimmed=" ")


def test_streaming_holds_back_only_a_possible_repeat() -> None:
    s = Splicer("one two three four five six seven")
    assert s.feed(" eight") == " eight"  # cannot be a repeat: released at once
    s = Splicer("one two three four five six seven")
    assert s.feed(" four five") == ""  # might be the start of " four five six seven"
    assert s.feed(" six seven nine") == " nine"


text = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=60)
sentences = st.lists(st.sampled_from(WORDS), min_size=1, max_size=30).map(" ".join)


@given(prefix=text, continuation=text, trimmed=st.sampled_from(["", " ", "\n", "  "]),
       cuts=st.lists(st.integers(0, 60), max_size=6))  # fmt: skip
def test_streaming_equals_whole(
    prefix: str, continuation: str, trimmed: str, cuts: list[int]
) -> None:
    prefix += trimmed
    whole, report = splice(prefix, continuation, trimmed=trimmed)
    s = Splicer(prefix, trimmed=trimmed)
    pieces, last = [], 0
    for c in sorted(cuts):
        pieces.append(continuation[last:c])
        last = max(last, c)
    pieces.append(continuation[last:])
    assert "".join(s.feed(p) for p in pieces) + s.finish() == whole
    assert s.report == report


@given(prefix=text, continuation=text, trimmed=st.sampled_from(["", " ", "\n"]))
def test_only_a_real_repeat_or_repeated_white_space_is_dropped(
    prefix: str, continuation: str, trimmed: str
) -> None:
    prefix += trimmed
    out, report = splice(prefix, continuation, trimmed=trimmed)
    assert continuation.endswith(out)
    ws = report.whitespace_dropped
    assert continuation[:ws] == trimmed[:ws] and ws <= len(leading_whitespace(continuation))
    k = report.overlap_dropped
    assert k == 0 or k >= DEFAULT_MIN_OVERLAP
    assert prefix.endswith(continuation[ws : ws + k])
    assert out == continuation[ws + k :]


@given(words=sentences, cut=st.integers(0, 400), trailing=st.booleans())
def test_a_clean_continuation_restores_the_text(words: str, cut: int, trailing: bool) -> None:
    """Cut a text anywhere; trim the prefix's trailing white space as an Anthropic
    prefill would; the continuation from the trimmed point splices back to the text."""
    cut = min(cut, len(words))
    stored = words[:cut]
    sent = stored.rstrip() if trailing else stored
    trimmed = stored[len(sent) :]
    continuation = words[len(sent) :]
    out, _ = splice(stored, continuation, trimmed=trimmed, min_overlap=10_000)
    assert stored + out == words
