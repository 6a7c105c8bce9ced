"""What an attempt's output tokens add up to (SPEC §6). Pure: no I/O.

While a stream runs each chunk is counted as it arrives: by the step of the provider's
cumulative usage where it reports one in every chunk (exact), else as one token — every
chunk carries at least one, so that running count is a lower bound. It is checkpointed as
it goes and can only be raised later: the cursor never goes down.

When the attempt ends, :func:`settle` finds its total, first of:

1. the running count, where every chunk was counted exactly;
2. the total a finished stream reported;
3. the counting endpoint's count of what arrived (``tokenizer`` and ``usage+tokenizer``);
4. an estimate that errs high, so that ``budget - spent`` does not buy past the budget: of
   the text, by what the model was seen to do in exact counts where enough were seen
   (:mod:`resumeq.core.calibration`), else one token per ``bytes_per_token`` UTF-8 bytes; and at
   least one token per chunk. It stays labelled an estimate.

A count is believed only if it can be right. :func:`refusal` says why one cannot: a
negative count, zero tokens for output that is not empty, more tokens than bytes (a token
is at least one byte), fewer tokens than chunks received (each carried at least one) or
than were already counted. A refused count is logged with its reason and the attempt
keeps its estimate.

Reasoning (thinking) output is billed output: it counts against the budget like text, and
its tokens are reported apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from resumeq.core.calibration import Calibration

#: ``chunks``: counted as the stream came, a lower bound left as it is because the
#: provider's total comes later (a background response read on after its cut).
CountSource = Literal["usage", "tokenizer", "estimate", "chunks"]

#: Tokens a finished stream may bill beyond its output's bytes: the end-of-sequence token,
#: a stop sequence's tokens that are not part of the text.
END_ALLOWANCE = 8


@dataclass
class Tally:
    """What one attempt received, as counting needs it. ``text`` is the answer text the
    model generated (an echo of the prompt is not output and is not in it)."""

    text_chunks: int = 0
    text_bytes: int = 0
    #: The text's pre-tokenization pieces (:func:`resumeq.core.calibration.pieces`), for a
    #: calibrated estimate.
    text_pieces: int = 0
    reasoning_chunks: int = 0
    reasoning_bytes: int = 0
    other_chunks: int = 0
    other_bytes: int = 0
    #: Tokens counted so far, chunk by chunk (the lower bound), and the shares of the
    #: reasoning and of the other output.
    tokens: int = 0
    reasoning_tokens: int = 0
    other_tokens: int = 0
    #: Whether every chunk was counted exactly (continuous usage), whether any count was
    #: seen at all, and whether the stream opened (an attempt refused before it did
    #: bought nothing: zero is exact).
    exact: bool = True
    reported: bool = False
    opened: bool = True

    @property
    def chunks(self) -> int:
        return self.text_chunks + self.reasoning_chunks + self.other_chunks

    @property
    def output_bytes(self) -> int:
        return self.text_bytes + self.reasoning_bytes + self.other_bytes


@dataclass(frozen=True)
class Count:
    """An attempt's output tokens, where the number came from, and what was refused."""

    tokens: int
    exact: bool
    source: CountSource
    reasoning_tokens: int | None = None
    refused: tuple[str, ...] = field(default_factory=tuple)


def estimate(chunks: int, output_bytes: int, *, counted: int, bytes_per_token: float) -> int:
    """An estimate that errs high: never below the chunks or the tokens already counted."""
    if bytes_per_token <= 0:
        raise ValueError("bytes_per_token must be > 0")
    return max(counted, chunks, math.ceil(output_bytes / bytes_per_token))


#: Bytes per token of an estimate with no chunk to count (a response let go, never read):
#: at most this many, whatever the profile's default — the lowest of the kinds' defaults.
UNREAD_BYTES_PER_TOKEN = 2.0


def let_go(
    *,
    already: int,
    billed: int | None,
    output_bytes: int | None,
    stored_bytes: int,
    bytes_per_token: float,
    calibration: Calibration | None = None,
    output_pieces: int = 0,
) -> int:
    """What a background response being let go made that the cursor has not counted
    (SPEC §22): the provider's figure for it where it said one (``billed``, after it was
    cancelled: it bills what it made until it stops), else an estimate that errs high from
    the larger of what it reports having written (``output_bytes``, ``output_pieces``) and
    what of it was stored — by the calibration where one is known, else at no more than
    :data:`UNREAD_BYTES_PER_TOKEN` bytes a token (no chunks were read to count) — less what
    was ``already`` counted of it. Never negative."""
    if billed is not None and billed >= 0:
        made = billed
    else:
        seen = max(output_bytes or 0, stored_bytes, 0)
        ratio = min(bytes_per_token, UNREAD_BYTES_PER_TOKEN)
        made = estimate(0, seen, counted=already, bytes_per_token=ratio)
        if calibration is not None and seen:
            by_model = calibration.estimate(text_bytes=seen, chunks=0, pieces=output_pieces)
            made = max(already, by_model)
    return max(0, made - already)


@dataclass(frozen=True)
class Refusal:
    """Why a count cannot be right, and whether it is too high (then the truth is at
    least the estimate *and* that count: a count that errs high is never lowered)."""

    reason: str
    too_high: bool = False


def refusal(
    count: int, *, output_bytes: int, chunks: int, counted: int, allowance: int = 0
) -> Refusal | None:
    """Why ``count`` cannot be the tokens of ``output_bytes`` bytes that arrived in
    ``chunks`` chunks after ``counted`` tokens were counted; None if it can be."""
    if count < 0:
        return Refusal(f"a negative count ({count})")
    if count == 0 and output_bytes > 0:
        return Refusal(f"0 tokens for {output_bytes} bytes of output")
    if count > output_bytes + allowance:
        why = f"{count} tokens for {output_bytes} bytes (a token is at least a byte)"
        return Refusal(why, too_high=True)
    if count < chunks:
        return Refusal(f"{count} tokens for {chunks} chunks (each chunk carries at least one)")
    if count < counted:
        return Refusal(f"{count} tokens, fewer than the {counted} already counted")
    return None


def settle(
    tally: Tally,
    *,
    finished: bool,
    reported: int | None,
    reported_reasoning: int | None = None,
    tokenizer_text: int | None = None,
    tokenizer_reasoning: int | None = None,
    bytes_per_token: float,
    calibration: Calibration | None = None,
) -> Count:
    """The attempt's total output tokens (see the module docstring).

    ``reported`` is the provider's output total (believed only for a finished stream);
    ``tokenizer_text`` and ``tokenizer_reasoning`` are the counting endpoint's counts of
    the text and of the reasoning that arrived, where it was asked."""
    refused: list[str] = []
    at_least = 0  # a billed total refused as too high: the charge is never below it
    reasoning_guess = _reasoning_estimate(tally, bytes_per_token)
    if (
        tally.exact
        and (tally.reported or not tally.opened)
        and not (finished and reported is not None and reported != tally.tokens)
    ):
        return Count(tally.tokens, True, "usage", tally.reasoning_tokens)
    if finished and reported is not None:
        # Reasoning a provider bills but streams only summarised (or not at all) has no
        # bytes here to be checked against.
        hidden = (reported_reasoning or 0) if tally.reasoning_bytes == 0 else 0
        no_upper_bound = tally.reasoning_chunks > 0
        why = refusal(
            reported,
            output_bytes=tally.output_bytes,
            chunks=tally.chunks,
            counted=tally.tokens,
            allowance=hidden + END_ALLOWANCE,
        )
        if why is None or (why.too_high and no_upper_bound):
            reasoning = reported_reasoning if reported_reasoning is not None else reasoning_guess
            return Count(reported, True, "usage", reasoning)
        refused.append(f"the provider's usage: {why.reason}")
        at_least = reported if why.too_high else at_least
    if tokenizer_text is not None:
        why = refusal(
            tokenizer_text,
            output_bytes=tally.text_bytes,
            chunks=tally.text_chunks,
            counted=0,
        )
        if why is None:
            total, exact, reasoning = _with_tokenizer(
                tally, tokenizer_text, tokenizer_reasoning, bytes_per_token
            )
            why = refusal(
                total,
                output_bytes=tally.output_bytes,
                chunks=tally.chunks,
                counted=tally.tokens,
                allowance=END_ALLOWANCE,
            )
            if why is None and total >= at_least:
                return Count(total, exact, "tokenizer", reasoning, tuple(refused))
            if why is None:  # the bill, though what arrived does not explain it, is higher
                why = Refusal(f"{total} tokens, below the {at_least} the provider billed")
        # A tokenizer counting more tokens than the text it was given has bytes answered
        # garbage; only a provider's bill can be higher than what was seen of it.
        refused.append(f"the counting endpoint: {why.reason}")
    guess = _estimate(tally, bytes_per_token, calibration)
    return Count(max(guess, at_least), False, "estimate", reasoning_guess, tuple(refused))


def _estimate(tally: Tally, bytes_per_token: float, calibration: Calibration | None) -> int:
    """The estimate that errs high: of the text by what the model was seen to do where a
    calibration says (:mod:`resumeq.core.calibration`), of the rest (reasoning, tool calls) at
    ``bytes_per_token``; never below the chunks or what was counted."""
    if calibration is None:
        return estimate(
            tally.chunks, tally.output_bytes, counted=tally.tokens, bytes_per_token=bytes_per_token
        )
    text = calibration.estimate(
        text_bytes=tally.text_bytes, chunks=tally.text_chunks, pieces=tally.text_pieces
    )
    rest = estimate(
        tally.reasoning_chunks + tally.other_chunks,
        tally.reasoning_bytes + tally.other_bytes,
        counted=0,
        bytes_per_token=bytes_per_token,
    )
    return max(tally.tokens, tally.chunks, text + rest)


def _reasoning_estimate(tally: Tally, bytes_per_token: float) -> int | None:
    if not tally.reasoning_chunks:
        return None
    if tally.exact:
        return tally.reasoning_tokens
    return estimate(
        tally.reasoning_chunks,
        tally.reasoning_bytes,
        counted=tally.reasoning_tokens,
        bytes_per_token=bytes_per_token,
    )


def _with_tokenizer(
    tally: Tally, text: int, reasoning: int | None, bytes_per_token: float
) -> tuple[int, bool, int | None]:
    """Text counted by the endpoint, plus the other output as counted in the stream, plus
    the reasoning: counted by the endpoint too where it could be, else estimated."""
    exact = tally.exact or tally.other_chunks == 0
    parts = text + tally.other_tokens
    if not tally.reasoning_chunks:
        return parts, exact, None
    counted = refusal(
        reasoning or 0, output_bytes=tally.reasoning_bytes, chunks=tally.reasoning_chunks, counted=0
    )
    if reasoning is not None and counted is None:
        return parts + reasoning, exact, reasoning
    guess = _reasoning_estimate(tally, bytes_per_token) or 0
    return parts + guess, exact and tally.exact, guess
