"""What a request gets back: the pieces of the canonical completion from its continuation point,
after any reasoning the prompt asks for.

A continuation's prefix (the whole stored text or only its tail) is located in the canonical
text: a prefix the canonical text starts with continues from its end; otherwise the last
occurrence that starts on a token boundary (any occurrence if none does) is used. When the
end falls inside a token, the rest of that token is the first piece emitted. A prefix that is
not part of the canonical text is refused with a 400 (never a pretend continuation).

``[fake:reasoning=N]`` puts N reasoning tokens (prose of their own seed) before the text of a
request without a continuation; a continuation resumes the text and thinks no more.
``max_tokens`` counts reasoning and text together.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
from dataclasses import dataclass
from typing import Any, Literal

from resumeq.fake.conversation import Continuation, Conversation, InvalidRequest
from resumeq.fake.genres import genre_length, genre_tokens
from resumeq.fake.markers import Genre
from resumeq.fake.text import canonical_tokens

Finish = Literal["stop", "length"]
#: What a token of the output is: the model's reasoning, or the text of its answer.
Part = Literal["reasoning", "text"]


@dataclass(frozen=True)
class Canonical:
    tokens: tuple[str, ...]
    text: str
    offsets: tuple[int, ...]  # offsets[i] is where token i starts; offsets[-1] == len(text)
    boundaries: frozenset[int]


@functools.lru_cache(maxsize=64)
def canonical(seed: bytes, completion_tokens: int | None, genre: Genre = "prose") -> Canonical:
    length = completion_tokens if completion_tokens is not None else genre_length(genre, seed)
    tokens = genre_tokens(genre, seed, length)
    offsets = [0]
    for token in tokens:
        offsets.append(offsets[-1] + len(token))
    return Canonical(tokens, "".join(tokens), tuple(offsets), frozenset(offsets))


def canonical_for(conversation: Conversation, completion_tokens: int | None) -> Canonical:
    """The canonical text of a conversation, in the genre its markers pick."""
    return canonical(conversation.seed(), completion_tokens, conversation.markers().genre)


def reasoning_tokens(seed: bytes, count: int) -> tuple[str, ...]:
    if count == 0:
        return ()
    return canonical_tokens(hashlib.sha256(b"reasoning\x00" + seed).digest(), count)


@dataclass(frozen=True)
class Located:
    """Where a continuation resumes in the canonical text."""

    char: int
    ambiguous: bool


def locate(text: str, boundaries: frozenset[int], prefix: str) -> Located | None:
    if text.startswith(prefix):
        return Located(len(prefix), ambiguous=False)
    starts: list[int] = []
    position = text.find(prefix)
    while position >= 0:
        starts.append(position)
        position = text.find(prefix, position + 1)
    if not starts:
        return None
    aligned = [start for start in starts if start in boundaries]
    chosen = (aligned or starts)[-1]
    return Located(chosen + len(prefix), ambiguous=len(aligned or starts) > 1)


@dataclass(frozen=True)
class Plan:
    """The pieces to send (reasoning, then text: at most ``max_tokens`` together) and why
    they end."""

    pieces: tuple[str, ...]
    finish: Finish
    continuation: Continuation | None
    resume_char: int
    ambiguous: bool
    reasoning: tuple[str, ...] = ()

    @property
    def tokens(self) -> int:
        return len(self.reasoning) + len(self.pieces)

    def parts(self) -> list[tuple[Part, tuple[str, ...]]]:
        """The parts in the order they are sent. Reasoning cut by ``max_tokens`` is the whole
        output (no text part); without reasoning there is always a text part, maybe empty."""
        parts: list[tuple[Part, tuple[str, ...]]] = []
        if self.reasoning:
            parts.append(("reasoning", self.reasoning))
        if self.pieces or not self.reasoning:
            parts.append(("text", self.pieces))
        return parts

    def head(self, count: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The reasoning and text pieces among the first ``count`` tokens."""
        reasoning = self.reasoning[:count]
        return reasoning, self.pieces[: max(0, count - len(self.reasoning))]

    def journal(self) -> dict[str, Any] | None:
        if self.continuation is None:
            return None
        return {
            "mode": self.continuation.mode,
            "prefix_chars": len(self.continuation.prefix),
            "resume_char": self.resume_char,
            "ambiguous": self.ambiguous,
        }


def _rest(target: Canonical, resume_char: int) -> tuple[str, ...]:
    index = bisect.bisect_right(target.offsets, resume_char) - 1
    if index >= len(target.tokens):
        return ()
    if target.offsets[index] == resume_char:
        return target.tokens[index:]
    return (target.text[resume_char : target.offsets[index + 1]], *target.tokens[index + 1 :])


def plan(
    conversation: Conversation,
    continuation: Continuation | None,
    max_tokens: int | None,
    completion_tokens: int | None,
) -> Plan:
    target = canonical_for(conversation, completion_tokens)
    resume_char, ambiguous = 0, False
    reasoning: tuple[str, ...] = ()
    if continuation is not None:
        located = locate(target.text, target.boundaries, continuation.prefix)
        if located is None:
            raise InvalidRequest(
                f"fake provider: the {continuation.mode} prefix is not part of the canonical "
                "text of this conversation, so there is nothing it could continue",
                param="messages",
            )
        resume_char, ambiguous = located.char, located.ambiguous
    else:
        reasoning = reasoning_tokens(conversation.seed(), conversation.markers().reasoning)
    pieces = _rest(target, resume_char)
    finish: Finish = "stop"
    if max_tokens is not None and len(reasoning) + len(pieces) > max_tokens:
        reasoning = reasoning[:max_tokens]
        pieces, finish = pieces[: max_tokens - len(reasoning)], "length"
    return Plan(pieces, finish, continuation, resume_char, ambiguous, reasoning)
