"""What a request gets back: the pieces of the canonical answer (:mod:`resumeq.fake.answer`)
from its continuation point, after any reasoning the prompt asks for, and the tool calls.

A continuation's prefix (the whole stored text or only its tail) is located in the canonical
text: a prefix the canonical text starts with continues from its end; otherwise the last
occurrence that starts on a token boundary (any occurrence if none does) is used. When the
end falls inside a token, the rest of that token is the first piece emitted. A prefix that is
not part of the canonical text is refused with a 400 (never a pretend continuation). The
prefix is only ever text: the rest of the text follows, then the calls, so a continuation
whose prefix is the whole text answers the calls alone (each with a fresh id, and the same
arguments). An answer that has no text (``tool_choice`` required or named) still locates the
prefix in the conversation's text, and sends none of it. A format that constrains decoding
(:attr:`resumeq.fake.shape.Shape.constrained`) cannot continue a document: the answer to
such a continuation is the whole document again (the journal says ``restarted``).

``[fake:reasoning=N]`` puts N reasoning tokens (prose of their own seed) before the text of a
request without a continuation; a continuation resumes the text and thinks no more.
``max_tokens`` counts reasoning, text and arguments together, in the order they are sent: a
call it cuts is sent partial, the calls after it not at all.

``corrupt`` (a fault): from its token on, the document or the call it falls in, and every
call after it, is sent broken — its closing brackets dropped and ``<garbage>`` after it —
so it is no longer JSON; the answer otherwise ends as it would.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Any, Literal

from resumeq.fake.answer import (
    Answer,
    Canonical,
    answer_for,
    canonical,
    canonical_for,
)
from resumeq.fake.conversation import Continuation, Conversation, InvalidRequest
from resumeq.fake.documents import json_tokens
from resumeq.fake.ids import new_id
from resumeq.fake.shape import Shape
from resumeq.fake.text import canonical_tokens

__all__ = ["Canonical", "Plan", "canonical", "canonical_for", "locate", "plan"]

#: Why an answer ends: its natural end, its budget, its tool calls, or a refusal.
Finish = Literal["stop", "length", "tool_calls", "refusal"]
#: What a token of the output is: the model's reasoning, the text of its answer (a
#: refusal's), or the arguments of a tool call.
Part = Literal["reasoning", "text", "refusal", "call"]
#: What a corrupted part ends with.
GARBAGE = "<garbage>"


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
class PlannedCall:
    """A tool call of the answer, with the ids this response gives it."""

    index: int
    #: What the app answers it with: ``call_…`` (OpenAI) or ``toolu_…`` (Anthropic).
    id: str
    #: The Responses output item's own id, ``fc_…``.
    item_id: str
    name: str
    #: The arguments' tokens as they are sent (cut or corrupted, maybe).
    pieces: tuple[str, ...]
    #: They are the whole arguments, as the model meant them.
    complete: bool = True
    #: A ``corrupt`` fault broke them (the model ended them, badly: not cut).
    broken: bool = False

    @property
    def arguments(self) -> str:
        return "".join(self.pieces)


@dataclass(frozen=True)
class Segment:
    """One part of the output as it is sent: opened, its pieces, closed."""

    part: Part
    pieces: tuple[str, ...]
    call: PlannedCall | None = None


@dataclass(frozen=True)
class Plan:
    """The pieces to send (reasoning, text, then the calls' arguments: at most
    ``max_tokens`` together) and why they end."""

    pieces: tuple[str, ...]
    finish: Finish
    continuation: Continuation | None
    resume_char: int
    ambiguous: bool
    reasoning: tuple[str, ...] = ()
    calls: tuple[PlannedCall, ...] = ()
    #: The text is a refusal.
    refusal: bool = False
    #: The text is a JSON document.
    document: bool = False
    #: A continuation answered from the start (a constrained format).
    restarted: bool = False

    @property
    def tokens(self) -> int:
        return len(self.reasoning) + len(self.pieces) + sum(len(c.pieces) for c in self.calls)

    def segments(self) -> list[Segment]:
        """The parts in the order they are sent. Reasoning cut by ``max_tokens`` is the whole
        output (no text part); an answer that is neither reasoning nor calls always has a
        text part, maybe empty."""
        segments: list[Segment] = []
        if self.reasoning:
            segments.append(Segment("reasoning", self.reasoning))
        if self.pieces or not (self.reasoning or self.calls):
            segments.append(Segment("refusal" if self.refusal else "text", self.pieces))
        segments.extend(Segment("call", call.pieces, call) for call in self.calls)
        return segments

    def head(self, count: int) -> Plan:
        """The first ``count`` tokens of this answer (a call cut is partial, later ones are
        not there)."""
        reasoning = self.reasoning[:count]
        left = count - len(reasoning)
        pieces = self.pieces[: max(left, 0)]
        left -= len(pieces)
        calls: list[PlannedCall] = []
        for call in self.calls:
            if left <= 0:
                break
            sent = call.pieces[:left]
            left -= len(sent)
            whole = call.complete and len(sent) == len(call.pieces)
            calls.append(dataclasses.replace(call, pieces=sent, complete=whole))
        return dataclasses.replace(self, reasoning=reasoning, pieces=pieces, calls=tuple(calls))

    def corrupted(self, after: int) -> Plan:
        """This answer with its JSON broken from token ``after`` on (at most its last)."""
        at = min(after, max(self.tokens - 1, 0))
        position = len(self.reasoning)
        pieces = self.pieces
        if position + len(pieces) > at:
            keep = max(at - position, 0)
            pieces = pieces[:keep] + _garbled(pieces[keep:])
        position += len(self.pieces)
        calls: list[PlannedCall] = []
        for call in self.calls:
            keep = max(at - position, 0)
            position += len(call.pieces)
            if keep >= len(call.pieces):
                calls.append(call)
                continue
            broken = call.pieces[:keep] + _garbled(call.pieces[keep:])
            calls.append(dataclasses.replace(call, pieces=broken, complete=False, broken=True))
        return dataclasses.replace(self, pieces=pieces, calls=tuple(calls))

    def journal(self) -> dict[str, Any] | None:
        if self.continuation is None:
            return None
        return {
            "mode": self.continuation.mode,
            "prefix_chars": len(self.continuation.prefix),
            "resume_char": self.resume_char,
            "ambiguous": self.ambiguous,
            "restarted": self.restarted,
        }


def _garbled(rest: tuple[str, ...]) -> tuple[str, ...]:
    kept = (piece.replace("}", "").replace("]", "") for piece in rest)
    return (*(piece for piece in kept if piece), *json_tokens(GARBAGE))


def _rest(target: Canonical, resume_char: int) -> tuple[str, ...]:
    index = bisect.bisect_right(target.offsets, resume_char) - 1
    if index >= len(target.tokens):
        return ()
    if target.offsets[index] == resume_char:
        return target.tokens[index:]
    return (target.text[resume_char : target.offsets[index + 1]], *target.tokens[index + 1 :])


def _resume(answer: Answer, continuation: Continuation | None, shape: Shape) -> Located:
    if continuation is None or (shape.constrained and answer.document):
        return Located(0, ambiguous=False)
    located = locate(answer.target.text, answer.target.boundaries, continuation.prefix)
    if located is None:
        raise InvalidRequest(
            f"fake provider: the {continuation.mode} prefix is not part of the canonical "
            "text of this conversation, so there is nothing it could continue",
            param="messages",
        )
    return located


def plan(
    conversation: Conversation,
    continuation: Continuation | None,
    max_tokens: int | None,
    completion_tokens: int | None,
    *,
    shape: Shape | None = None,
    call_prefix: str = "call_",
) -> Plan:
    """The plan of one request; its calls get fresh ids (``call_prefix`` and 24 hex)."""
    shape = shape or Shape()
    answer = answer_for(conversation, shape, completion_tokens)
    located = _resume(answer, continuation, shape)
    reasoning: tuple[str, ...] = ()
    if continuation is None:
        reasoning = reasoning_tokens(conversation.seed(), conversation.markers().reasoning)
    pieces = _rest(answer.target, located.char) if answer.has_text else ()
    calls = tuple(
        PlannedCall(index, new_id(call_prefix), new_id("fc_"), call.name, call.tokens)
        for index, call in enumerate(answer.calls)
    )
    finish: Finish = "refusal" if answer.refusal else "tool_calls" if calls else "stop"
    whole = Plan(
        pieces,
        finish,
        continuation,
        located.char,
        located.ambiguous,
        reasoning,
        calls,
        refusal=answer.refusal,
        document=answer.document,
        restarted=continuation is not None and shape.constrained and answer.document,
    )
    if max_tokens is not None and whole.tokens > max_tokens:
        return dataclasses.replace(whole.head(max_tokens), finish="length")
    return whole
