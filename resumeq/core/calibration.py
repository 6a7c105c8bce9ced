"""Estimates calibrated on what a model was seen to do (SPEC §22). Pure: no I/O.

A cut stream that no provider count covers is estimated, and the estimate must err high —
but a fixed bytes-per-token ratio errs by a factor of two or three either way: a table of
short tokens is undercounted, a prose answer of long ones charged three times its truth, and
on a wire that sends one token per chunk the chunk count, already exact, is raised for
nothing. So every exact count of a finished answer (the provider's usage, the counting
endpoint's) leaves a :class:`Sample` of its *text* (reasoning and tool calls never enter
one): its UTF-8 bytes, its chunks, its *pieces* (the words, numbers, punctuation runs and
white space a BPE tokenizer's pre-tokenization splits text into: a token never spans two)
and its tokens. Per provider profile and model they are kept in Redis, shared by every
worker (:mod:`resumeq.store.calibrations`).

From them, :class:`Calibration` bounds a cut attempt's tokens by up to three predictors —
tokens per chunk, per piece, per byte — each as its answers showed it: its mean ratio, and
how much that ratio spread from one answer to the next (a short cut text spreads more than
a whole answer, by the square root of their lengths' ratio). A predictor's bound is its mean
plus :data:`Z_HIGH` spreads (the worst 1 %), but never more than ``margin``
(``estimate_margin``, 1.25) times its mean: at most 25 % over what the model was seen to do.
Only predictors the answers showed to be steady are used (:data:`TRUSTED_ANSWERS` answers,
spread under :data:`MAX_SPREAD`): text changes bytes and pieces per token (a table against
prose), never how a wire groups tokens into chunks, so before that the chunks' alone is. The
estimate is the least bound — the predictor that fits the wire wins: chunks where each
carries a token, bytes or pieces where deltas group several and the answers are alike. It
is never below the chunks or what was already counted, and is still labelled an estimate.
Until :data:`ENOUGH_TOKENS` exact tokens were seen, the profile's
``estimate_bytes_per_token`` stands. ``benchmarks/estimates.py`` measures the error.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

#: What a BPE tokenizer's pre-tokenization splits text into (GPT-2's pattern, with Python's
#: classes): contractions, letters, digits, other non-space runs, white space.
_PIECE = re.compile(
    r"'(?:s|t|re|ve|m|ll|d)| ?[^\W\d_]+| ?\d+| ?[^\s\w]+|_+|\s+(?!\S)|\s+",
    re.IGNORECASE,
)

#: Exact tokens, over at least this many answers, before a calibration is believed.
ENOUGH_TOKENS = 200
ENOUGH_SAMPLES = 1
#: The samples kept per profile and model (the latest).
KEPT_SAMPLES = 64


def pieces(text: str) -> int:
    """The pre-tokenization pieces of ``text`` (a lower bound of any BPE tokenizer's count
    that splits as GPT-2's does)."""
    return sum(1 for _ in _PIECE.finditer(text))


@dataclass(frozen=True)
class Sample:
    """One finished answer's text, counted exactly."""

    text_bytes: int
    chunks: int
    pieces: int
    tokens: int

    def refusal(self) -> str | None:
        """Why this cannot be a true count (then it is never stored), or None."""
        if min(self.text_bytes, self.chunks, self.pieces, self.tokens) < 0:
            return "a negative figure"
        if self.text_bytes == 0 or self.tokens == 0:
            return "no text, or no tokens"
        if self.tokens > self.text_bytes:
            return f"{self.tokens} tokens for {self.text_bytes} bytes (a token is at least a byte)"
        if self.chunks and self.tokens < self.chunks:
            return f"{self.tokens} tokens for {self.chunks} chunks (each carries at least one)"
        return None

    def encode(self) -> str:
        return f"{self.text_bytes} {self.chunks} {self.pieces} {self.tokens}"

    @classmethod
    def decode(cls, raw: str) -> Sample:
        """Raises ``ValueError`` for what is not a stored sample."""
        parts = raw.split()
        if len(parts) != 4:
            raise ValueError(f"not a calibration sample: {raw[:40]!r}")
        sample = cls(*(int(p) for p in parts))
        if sample.refusal() is not None:
            raise ValueError(f"not a calibration sample: {raw[:40]!r} ({sample.refusal()})")
        return sample


#: How far above its mean a cut text's ratio is allowed for, in standard deviations (about
#: 99th percentile of a normal spread).
Z_HIGH = 2.25
#: A predictor whose answers' ratios spread more than this (their coefficient of
#: variation) is not trusted: the text the model writes changes what it predicts.
MAX_SPREAD = 0.15
#: The spread assumed from one answer (none can be measured), and the least assumed ever.
ONE_SAMPLE_SPREAD = 0.06
MIN_SPREAD = 0.003
#: Answers a predictor needs before it is trusted (the chunks' is used before that).
TRUSTED_ANSWERS = 8


@dataclass(frozen=True)
class Predictor:
    """Tokens per unit (a chunk, a piece) as the answers showed them: their mean, how much
    one answer's ratio spread, and how many units an answer had (a short cut text spreads
    more than a whole answer: by the square root of the ratio of their lengths)."""

    mean: float
    spread: float  # the answers' standard deviation, relative to the mean
    units: float  # units per answer, on average

    #: Answers it was measured on.
    answers: int = 1

    @classmethod
    def of(cls, pairs: Sequence[tuple[int, int]], *, least: float = 0.0) -> Predictor | None:
        """From ``(tokens, units)`` per answer; None without units. ``least``: the ratio
        no text can be below (a chunk carries at least one token): from one answer, only
        what lies above it is assumed to spread."""
        used = [(t, u) for t, u in pairs if u > 0]
        if not used:
            return None
        ratios = [t / u for t, u in used]
        mean = statistics.fmean(ratios)
        # From few answers a spread is not known: at least what one is assumed to show.
        spread = ONE_SAMPLE_SPREAD * (mean - least) / mean if len(ratios) < TRUSTED_ANSWERS else 0
        if len(ratios) > 1:
            spread = max(spread, statistics.stdev(ratios) / mean)
        units = statistics.fmean(u for _, u in used)
        return cls(mean, max(spread, MIN_SPREAD), units, len(used))

    @property
    def trusted(self) -> bool:
        """Steady across answers (three at least: fewer cannot show how the model's
        texts differ)."""
        return self.answers >= TRUSTED_ANSWERS and self.spread <= MAX_SPREAD

    def bound(self, units: int, margin: float) -> int:
        """At least the tokens of a cut text of ``units`` units but in the worst 1 %, and
        at most ``margin`` times what the mean says."""
        widen = math.sqrt(max(1.0, self.units / max(units, 1)))
        ratio = min(self.mean * (1 + Z_HIGH * self.spread * widen), self.mean * margin)
        return math.ceil(units * ratio)


@dataclass(frozen=True)
class Calibration:
    """The predictors one profile and model's exact counts give (see the module doc)."""

    per_chunk: Predictor | None
    per_piece: Predictor | None
    per_byte: Predictor | None  # tokens per byte
    margin: float
    samples: int
    tokens_seen: int

    @classmethod
    def from_samples(cls, samples: Sequence[Sample], *, margin: float) -> Calibration | None:
        """The calibration, or None until enough was seen."""
        if margin < 1:
            raise ValueError("the margin is at least 1")
        usable = [s for s in samples if s.refusal() is None]
        seen = sum(s.tokens for s in usable)
        if len(usable) < ENOUGH_SAMPLES or seen < ENOUGH_TOKENS:
            return None
        return cls(
            per_chunk=Predictor.of([(s.tokens, s.chunks) for s in usable], least=1.0),
            per_piece=Predictor.of([(s.tokens, s.pieces) for s in usable]),
            per_byte=Predictor.of([(s.tokens, s.text_bytes) for s in usable]),
            margin=margin,
            samples=len(usable),
            tokens_seen=seen,
        )

    def estimate(self, *, text_bytes: int, chunks: int, pieces: int) -> int:
        """A cut text's tokens, erring high: the least bound of the predictors the answers
        showed to be steady (the chunks' where none is), never below its chunks (each
        carried at least one) or above its bytes."""
        if text_bytes <= 0:
            return chunks
        bounds = [
            predictor.bound(units, self.margin)
            for predictor, units in (
                (self.per_chunk, chunks),
                (self.per_piece, pieces),
                (self.per_byte, text_bytes),
            )
            if predictor is not None and predictor.trusted and units > 0
        ]
        if not bounds and self.per_chunk is not None and chunks:
            # Not yet steady (too few answers): the chunks, which no text changes.
            bounds = [self.per_chunk.bound(chunks, self.margin)]
        if not bounds:
            per_byte = self.per_byte
            assert per_byte is not None
            bounds = [math.ceil(text_bytes * per_byte.mean * self.margin)]
        return max(chunks, min(*bounds, text_bytes))
