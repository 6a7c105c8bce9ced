"""The canonical answer to a conversation: its text, and the tool calls that follow it.

The text is the conversation's canonical text (:mod:`resumeq.fake.text`, a genre of
:mod:`resumeq.fake.genres`), or, when the answer has a format (the request's
``response_format`` in its wire's words, or a system note, :data:`SCHEMA_NOTE`), the JSON
document for its schema (:mod:`resumeq.fake.documents`: ``completion_tokens`` and the genre
do not apply), or with ``[fake:refusal]`` a short refusal (then nothing else). A continuation
of a tool call's arguments (a system note, :data:`CALL_NOTE`, names the tool) is answered
with those arguments as text, and no call.

Calls, when the request carries tools: ``[fake:tool]`` asks for one, ``[fake:tools=N]`` for
N, made after the text with ``tool_choice`` absent, ``auto`` or ``required``; ``required``
and a named choice answer the calls alone, with no text; a named choice makes exactly one
call, to its tool; ``none`` makes none. Without a marker, ``required`` or a named choice
call as ``[fake:tool]`` does, ``auto`` and ``none`` answer text. ``parallel_tool_calls:
false`` (Anthropic's ``disable_parallel_tool_use``) makes one call at most. Call i goes to
the request's tool i (mod their number); its arguments are of the conversation's seed, the
tool's name and its parameters only, so a call asked for again has the same arguments. An
answer to a tool result (the turn answered is one) is text: no calls.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

from resumeq.fake.conversation import Conversation, Format
from resumeq.fake.documents import arguments_tokens, document_tokens
from resumeq.fake.genres import genre_length, genre_tokens
from resumeq.fake.markers import Genre
from resumeq.fake.shape import Shape, ToolDef
from resumeq.fake.text import draw, tokenize

#: What a refusal says (one of them, drawn from the seed).
REFUSALS = (
    "I'm sorry, but I can't help with that request.",
    "I can't assist with that.",
    "I'm sorry, I can't help with that.",
    "I won't be able to help with this request.",
)


@dataclass(frozen=True)
class Canonical:
    tokens: tuple[str, ...]
    text: str
    offsets: tuple[int, ...]  # offsets[i] is where token i starts; offsets[-1] == len(text)
    boundaries: frozenset[int]


def canonical_of_tokens(tokens: tuple[str, ...]) -> Canonical:
    offsets = [0]
    for token in tokens:
        offsets.append(offsets[-1] + len(token))
    return Canonical(tokens, "".join(tokens), tuple(offsets), frozenset(offsets))


@functools.lru_cache(maxsize=64)
def canonical(seed: bytes, completion_tokens: int | None, genre: Genre = "prose") -> Canonical:
    length = completion_tokens if completion_tokens is not None else genre_length(genre, seed)
    return canonical_of_tokens(genre_tokens(genre, seed, length))


def canonical_for(conversation: Conversation, completion_tokens: int | None) -> Canonical:
    """The canonical text of a conversation, in the genre its markers pick."""
    return canonical(conversation.seed(), completion_tokens, conversation.markers().genre)


@functools.lru_cache(maxsize=64)
def document(seed: bytes, fmt: Format) -> Canonical:
    return canonical_of_tokens(document_tokens(seed, fmt.schema))


def refusal(seed: bytes) -> Canonical:
    return canonical_of_tokens(tuple(tokenize(REFUSALS[draw(seed, 0x7EF) % len(REFUSALS)])))


@dataclass(frozen=True)
class CanonicalCall:
    name: str
    tokens: tuple[str, ...]

    @property
    def arguments(self) -> str:
        return "".join(self.tokens)


@dataclass(frozen=True)
class Answer:
    """The whole answer to a fresh request: where a continuation is located (``target``),
    whether the answer has that text, and the calls after it."""

    target: Canonical
    has_text: bool
    calls: tuple[CanonicalCall, ...]
    refusal: bool = False
    #: The text is a JSON document.
    document: bool = False

    def describe(self) -> dict[str, object]:
        """What ``/_fake/canonical`` reports of the calls and the document."""
        return {
            "tool_calls": [
                {
                    "name": call.name,
                    "arguments": call.arguments,
                    "tokens": list(call.tokens),
                    "count": len(call.tokens),
                }
                for call in self.calls
            ],
            "document": self.target.text if self.document else None,
            "refusal": self.target.text if self.refusal else None,
        }


def answer_for(conversation: Conversation, shape: Shape, completion_tokens: int | None) -> Answer:
    markers = conversation.markers()
    seed = conversation.seed()
    if markers.refusal:
        return Answer(refusal(seed), has_text=True, calls=(), refusal=True)
    fmt = shape.format or conversation.format_note()
    if fmt is not None and fmt.tool is not None:
        # A call's arguments continued as text: they are the call's, whole, and no call
        # follows them.
        declared = next((t for t in shape.tools if t.name == fmt.tool), None)
        parameters = declared.parameters if declared is not None else fmt.schema or {}
        return Answer(canonical_of_tokens(arguments_tokens(seed, fmt.tool, parameters)),
                      has_text=True, calls=())  # fmt: skip
    target = (
        document(seed, fmt) if fmt is not None else canonical_for(conversation, completion_tokens)
    )
    tools = _called(conversation, shape, markers.tool_calls)
    calls = tuple(
        CanonicalCall(
            tool.name, arguments_tokens(seed, tool.name, json.loads(tool.parameters_json))
        )
        for tool in tools
    )
    has_text = not calls or shape.choice not in ("required", "named")
    return Answer(target, has_text, calls, document=fmt is not None)


def _called(conversation: Conversation, shape: Shape, asked: int) -> tuple[ToolDef, ...]:
    """The tools the answer calls, in order."""
    if not shape.tools or shape.choice == "none" or conversation.answers_tool_result():
        return ()
    if shape.choice == "named" and shape.named is not None:
        return (shape.tool(shape.named),)
    count = asked or (1 if shape.choice == "required" else 0)
    if not shape.parallel:
        count = min(count, 1)
    return tuple(shape.tools[index % len(shape.tools)] for index in range(count))
