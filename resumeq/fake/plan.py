"""What a request gets back: the pieces of the canonical completion from its continuation point.

A continuation's prefix (the whole stored text or only its tail) is located in the canonical
text: a prefix the canonical text starts with continues from its end; otherwise the last
occurrence that starts on a token boundary (any occurrence if none does) is used. When the
end falls inside a token, the rest of that token is the first piece emitted. A prefix that is
not part of the canonical text is refused with a 400 (never a pretend continuation).
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass
from typing import Any, Literal

from resumeq.fake.conversation import Continuation, Conversation, InvalidRequest
from resumeq.fake.text import canonical_tokens, default_length

Finish = Literal["stop", "length"]


@dataclass(frozen=True)
class Canonical:
    tokens: tuple[str, ...]
    text: str
    offsets: tuple[int, ...]  # offsets[i] is where token i starts; offsets[-1] == len(text)
    boundaries: frozenset[int]


@functools.lru_cache(maxsize=64)
def canonical(seed: bytes, completion_tokens: int | None) -> Canonical:
    length = completion_tokens if completion_tokens is not None else default_length(seed)
    tokens = canonical_tokens(seed, length)
    offsets = [0]
    for token in tokens:
        offsets.append(offsets[-1] + len(token))
    return Canonical(tokens, "".join(tokens), tuple(offsets), frozenset(offsets))


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
    """The pieces to send (at most ``max_tokens``) and why they end."""

    pieces: tuple[str, ...]
    finish: Finish
    continuation: Continuation | None
    resume_char: int
    ambiguous: bool

    def journal(self) -> dict[str, Any] | None:
        if self.continuation is None:
            return None
        return {
            "mode": self.continuation.mode,
            "prefix_chars": len(self.continuation.prefix),
            "resume_char": self.resume_char,
            "ambiguous": self.ambiguous,
        }


def plan(
    conversation: Conversation,
    continuation: Continuation | None,
    max_tokens: int | None,
    completion_tokens: int | None,
) -> Plan:
    target = canonical(conversation.seed(), completion_tokens)
    resume_char, ambiguous = 0, False
    if continuation is not None:
        located = locate(target.text, target.boundaries, continuation.prefix)
        if located is None:
            raise InvalidRequest(
                f"fake provider: the {continuation.mode} prefix is not part of the canonical "
                "text of this conversation, so there is nothing it could continue",
                param="messages",
            )
        resume_char, ambiguous = located.char, located.ambiguous
    index = bisect.bisect_right(target.offsets, resume_char) - 1
    pieces: tuple[str, ...]
    if index >= len(target.tokens):
        pieces = ()
    elif target.offsets[index] == resume_char:
        pieces = target.tokens[index:]
    else:
        pieces = (target.text[resume_char : target.offsets[index + 1]], *target.tokens[index + 1 :])
    finish: Finish = "stop"
    if max_tokens is not None and len(pieces) > max_tokens:
        pieces, finish = pieces[:max_tokens], "length"
    return Plan(pieces, finish, continuation, resume_char, ambiguous)
