"""Joining a continuation onto the stored prefix. Pure: no I/O, never changes the prefix.

Two things can go wrong at the seam, and both are mended on the continuation's side:

- **Trimmed white space.** Anthropic refuses a prefill that ends in white space, so the
  prefix is sent trimmed and the model usually starts its continuation with the white
  space it expects there. The stored prefix still ends with what was trimmed; the part of
  the continuation's leading white space that repeats it is dropped, so it is not doubled.
- **A repeat.** A model asked to continue sometimes starts by repeating the end of the
  prefix. When the continuation's start equals the prefix's end over at least
  ``min_overlap`` characters — long enough to be a repeat, not a legitimate word — that
  start is dropped. Shorter matches ("the the", a doubled letter) are left alone.

:class:`Splicer` does this on a stream: it holds back the continuation's first characters
only while they could still turn out to be a repeat, then passes everything through.
"""

from __future__ import annotations

from dataclasses import dataclass

#: A repeat shorter than this many characters is taken for legitimate text.
DEFAULT_MIN_OVERLAP = 16
#: How far back into the prefix a repeat is looked for.
DEFAULT_WINDOW = 2_000


def leading_whitespace(text: str) -> str:
    return text[: len(text) - len(text.lstrip())]


def trailing_whitespace(text: str) -> str:
    return text[len(text.rstrip()) :]


def drop_repeated_whitespace(continuation: str, trimmed: str) -> str:
    """Drop the part of the continuation's leading white space that ``trimmed`` repeats."""
    if not trimmed:
        return continuation
    ws = leading_whitespace(continuation)
    shared = 0
    while shared < min(len(trimmed), len(ws)) and trimmed[shared] == ws[shared]:
        shared += 1
    return continuation[shared:]


def overlap(prefix: str, continuation: str, *, min_overlap: int, window: int) -> int:
    """Length of the longest start of ``continuation`` that the prefix ends with, if at
    least ``min_overlap`` characters long; else 0."""
    longest = min(len(prefix), len(continuation), window)
    for k in range(longest, min_overlap - 1, -1):
        if prefix.endswith(continuation[:k]):
            return k
    return 0


@dataclass(frozen=True)
class SpliceReport:
    """What the seam needed: white space dropped, and a repeat dropped."""

    whitespace_dropped: int = 0
    overlap_dropped: int = 0


def splice(
    prefix: str,
    continuation: str,
    *,
    trimmed: str = "",
    min_overlap: int = DEFAULT_MIN_OVERLAP,
    window: int = DEFAULT_WINDOW,
) -> tuple[str, SpliceReport]:
    """Answer what to append to ``prefix`` for a whole continuation, and what was dropped.

    ``trimmed`` is the white space cut off the prefix's end before it was sent; the
    stored prefix still ends with it.
    """
    s = Splicer(prefix, trimmed=trimmed, min_overlap=min_overlap, window=window)
    out = s.feed(continuation) + s.finish()
    return out, s.report


class Splicer:
    """Splice a continuation that arrives in pieces.

    ``feed`` answers the text that may be appended now; ``finish`` answers what was held
    back. The concatenation of the answers equals :func:`splice` of the whole text.
    """

    def __init__(
        self,
        prefix: str,
        *,
        trimmed: str = "",
        min_overlap: int = DEFAULT_MIN_OVERLAP,
        window: int = DEFAULT_WINDOW,
    ) -> None:
        if trimmed and not prefix.endswith(trimmed):
            raise ValueError("trimmed must be the end of the prefix")
        if min_overlap < 1:
            raise ValueError("min_overlap must be >= 1")
        self._tail = prefix[-window:]
        self._trimmed = trimmed
        self._min_overlap = min_overlap
        self._window = window
        self._held = ""
        self._decided = not prefix
        self._whitespace_dropped = 0
        self._overlap_dropped = 0

    @property
    def report(self) -> SpliceReport:
        return SpliceReport(self._whitespace_dropped, self._overlap_dropped)

    @property
    def held(self) -> str:
        """Text received but not yet released."""
        return self._held

    def feed(self, piece: str) -> str:
        if self._decided:
            return piece
        self._held += piece
        if self._could_still_repeat():
            return ""
        return self._decide()

    def finish(self) -> str:
        return "" if self._decided else self._decide()

    def _candidate(self) -> str:
        """The held text with the repeated white space dropped."""
        return drop_repeated_whitespace(self._held, self._trimmed)

    def _could_still_repeat(self) -> bool:
        # A repeat longer than what we hold is possible only while what we hold occurs
        # in the prefix's tail (the empty string, e.g. dropped white space, always does).
        cand = self._candidate()
        return len(cand) < len(self._tail) and cand in self._tail

    def _decide(self) -> str:
        cand = self._candidate()
        self._whitespace_dropped = len(self._held) - len(cand)
        k = overlap(self._tail, cand, min_overlap=self._min_overlap, window=self._window)
        self._overlap_dropped = k
        self._decided = True
        self._held = ""
        return cand[k:]
