"""Counting an attempt's output tokens: what is believed, what is refused, and estimates
that err high. Pure: no I/O."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from resumeq.core.counting import END_ALLOWANCE, Tally, estimate, let_go, refusal, settle

LOREM = "lorem ipsum dolor "  # ~5 tokens a delta, as Claude sends them


def text_tally(chunks: int, text: str, *, exact: bool = False, tokens: int | None = None) -> Tally:
    return Tally(
        text_chunks=chunks,
        text_bytes=len(text.encode()),
        tokens=chunks if tokens is None else tokens,
        exact=exact,
        reported=exact,
    )


def test_exact_running_counts_stand() -> None:
    count = settle(text_tally(20, "x" * 80, exact=True, tokens=20), finished=False,
                   reported=None, bytes_per_token=4)  # fmt: skip
    assert (count.tokens, count.exact, count.source) == (20, True, "usage")


def test_a_finished_streams_usage_is_believed() -> None:
    count = settle(text_tally(10, LOREM * 10), finished=True, reported=50, bytes_per_token=2)
    assert (count.tokens, count.exact, count.source, count.refused) == (50, True, "usage", ())


def test_a_cut_streams_usage_is_not_used() -> None:
    count = settle(text_tally(10, LOREM * 10), finished=False, reported=50, bytes_per_token=2)
    assert count.source == "estimate" and not count.exact


def test_the_estimate_errs_high_from_the_bytes() -> None:
    """The defect: an Anthropic cut counted one token per delta (10 for ~50 generated) and
    the continuation asked for 50 more on a budget of 60."""
    count = settle(text_tally(10, LOREM * 10), finished=False, reported=None, bytes_per_token=2)
    assert count.tokens == 90 and not count.exact and count.source == "estimate"
    assert count.tokens >= 50


@pytest.mark.parametrize(
    ("count", "why"),
    [
        (0, "0 tokens for"),
        (-3, "negative"),
        (10_000, "a token is at least a byte"),
        (5, "each chunk carries at least one"),
    ],
)
def test_counts_that_cannot_be_right_are_refused(count: int, why: str) -> None:
    tally = text_tally(10, LOREM * 10)
    result = settle(tally, finished=False, reported=None, tokenizer_text=count, bytes_per_token=2)
    assert result.source == "estimate" and not result.exact
    assert result.tokens == 90
    assert len(result.refused) == 1 and why in result.refused[0]


def test_an_empty_token_list_is_never_taken_for_zero() -> None:
    """llama.cpp answers {"tokens": []} to a body it does not understand."""
    result = settle(
        text_tally(150, "word " * 150), finished=False, reported=None, tokenizer_text=0,
        bytes_per_token=4,
    )  # fmt: skip
    assert result.tokens >= 150 and not result.exact
    assert "0 tokens for 750 bytes" in result.refused[0]


def test_a_believable_tokenizer_count_is_exact() -> None:
    result = settle(
        text_tally(150, "word " * 150), finished=False, reported=None, tokenizer_text=150,
        bytes_per_token=4,
    )  # fmt: skip
    assert (result.tokens, result.exact, result.source) == (150, True, "tokenizer")


def test_an_implausible_usage_falls_back_to_the_tokenizer() -> None:
    tally = text_tally(10, "word " * 10)
    result = settle(tally, finished=True, reported=0, tokenizer_text=10, bytes_per_token=4)
    assert (result.tokens, result.exact, result.source) == (10, True, "tokenizer")
    assert "usage" in result.refused[0]


def test_a_usage_total_may_hold_an_end_token() -> None:
    tally = text_tally(3, "abc")
    assert settle(tally, finished=True, reported=4, bytes_per_token=4).exact
    too_many = 3 + END_ALLOWANCE + 1
    assert not settle(tally, finished=True, reported=too_many, bytes_per_token=4).exact


def test_a_count_refused_as_too_high_is_never_lowered() -> None:
    """300 tokens reported for 200 bytes cannot be right, but the truth is not below it."""
    tally = text_tally(50, "x" * 200)
    count = settle(tally, finished=True, reported=300, bytes_per_token=4)
    assert (count.tokens, count.exact, count.source) == (300, False, "estimate")
    assert "a token is at least a byte" in count.refused[0]
    # A tokenizer that counts more tokens than the text's bytes answered garbage.
    by_tokenizer = settle(tally, finished=False, reported=None, tokenizer_text=900,
                          bytes_per_token=4)  # fmt: skip
    assert by_tokenizer.tokens == 50 and not by_tokenizer.exact


def test_summarised_thinking_explains_a_high_total() -> None:
    """Claude streams a summary of its thinking and bills all of it."""
    tally = Tally(text_chunks=10, text_bytes=400, reasoning_chunks=5, reasoning_bytes=300,
                  tokens=15, reasoning_tokens=5, exact=False)  # fmt: skip
    count = settle(tally, finished=True, reported=9_000, bytes_per_token=2)
    assert (count.tokens, count.exact) == (9_000, True)


def test_nothing_counted_is_exact_only_if_nothing_was_asked() -> None:
    """A stream cut before any content may have generated tokens it never sent (a model
    thinking silently): zero is a guess. A request refused before a stream bought none."""
    silent = settle(Tally(), finished=False, reported=None, bytes_per_token=4)
    assert (silent.tokens, silent.exact, silent.source) == (0, False, "estimate")
    refused = settle(Tally(opened=False), finished=False, reported=None, bytes_per_token=4)
    assert (refused.tokens, refused.exact) == (0, True)


def test_reasoning_counts_against_the_budget() -> None:
    """vLLM cut while thinking: 300 tokens reported chunk by chunk, no text."""
    tally = Tally(reasoning_chunks=30, reasoning_bytes=1200, tokens=300, reasoning_tokens=300,
                  reported=True)  # fmt: skip
    count = settle(tally, finished=False, reported=300, bytes_per_token=4)
    assert (count.tokens, count.exact, count.reasoning_tokens) == (300, True, 300)


def test_hidden_reasoning_reported_by_a_finished_stream() -> None:
    """OpenAI reasoning models bill reasoning they never stream."""
    tally = text_tally(5, "Hello there!")
    count = settle(tally, finished=True, reported=205, reported_reasoning=200, bytes_per_token=4)
    assert (count.tokens, count.exact, count.reasoning_tokens) == (205, True, 200)


def test_reasoning_with_the_tokenizer_is_counted_too() -> None:
    tally = Tally(
        text_chunks=4, text_bytes=20, reasoning_chunks=10, reasoning_bytes=60,
        tokens=14, reasoning_tokens=10, exact=False,
    )  # fmt: skip
    both = settle(tally, finished=False, reported=None, tokenizer_text=4, tokenizer_reasoning=12,
                  bytes_per_token=4)  # fmt: skip
    assert (both.tokens, both.exact, both.reasoning_tokens) == (16, True, 12)
    text_only = settle(tally, finished=False, reported=None, tokenizer_text=4, bytes_per_token=4)
    assert text_only.tokens == 4 + 15 and not text_only.exact  # the reasoning estimated


@given(
    chunks=st.integers(0, 200),
    extra_bytes=st.integers(0, 4000),
    counted_extra=st.integers(0, 50),
    exact=st.booleans(),
    finished=st.booleans(),
    reported=st.none() | st.integers(-5, 5000),
    tokenizer=st.none() | st.integers(-5, 5000),
    ratio=st.sampled_from([1.0, 2.0, 4.0]),
)
def test_the_total_never_goes_below_what_was_counted(  # noqa: PLR0917 - drawn by hypothesis
    chunks: int,
    extra_bytes: int,
    counted_extra: int,
    exact: bool,
    finished: bool,
    reported: int | None,
    tokenizer: int | None,
    ratio: float,
) -> None:
    text_bytes = chunks + extra_bytes
    tally = Tally(text_chunks=chunks, text_bytes=text_bytes, tokens=chunks + counted_extra,
                  exact=exact, reported=exact)  # fmt: skip
    count = settle(tally, finished=finished, reported=reported, tokenizer_text=tokenizer,
                   bytes_per_token=ratio)  # fmt: skip
    assert count.tokens >= tally.tokens  # the cursor never goes down
    if finished and reported is not None and reported > text_bytes + END_ALLOWANCE:
        assert count.tokens >= reported  # a bill that errs high is never lowered
    if not count.exact:
        assert count.tokens >= math.ceil(text_bytes / ratio)  # an estimate errs high
        assert count.source == "estimate"
    if count.source == "tokenizer":
        assert refusal(tokenizer or 0, output_bytes=text_bytes, chunks=chunks, counted=0) is None


def test_estimate_needs_a_positive_ratio() -> None:
    with pytest.raises(ValueError, match="bytes_per_token"):
        estimate(1, 1, counted=0, bytes_per_token=0)


def test_what_a_response_let_go_made_is_its_bill_else_an_estimate_that_errs_high() -> None:
    kw: dict[str, Any] = {"stored_bytes": 400, "bytes_per_token": 4.0}
    assert let_go(already=100, billed=260, output_bytes=None, **kw) == 160
    assert let_go(already=300, billed=260, output_bytes=None, **kw) == 0  # never negative
    # No bill: from the larger of its output and what was stored, at no more than 2 bytes
    # a token (no chunk was read to count), whatever the profile's default.
    assert let_go(already=100, billed=None, output_bytes=1000, **kw) == 400
    assert let_go(already=100, billed=None, output_bytes=None, **kw) == 100
