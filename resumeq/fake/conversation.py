"""One shape for the conversations of every wire, the seed of their canonical text, and the
continuation a request carries (SPEC §5).

The seed is the system text and the last original user message, and the tool results that
came after that message (an answer to them is another text): never the ids of calls, which
are fresh in every response. A continuation's instruction message is not part of it, nor is
a note that states the answer's format (:data:`SCHEMA_NOTE` followed by the JSON Schema,
or :data:`JSON_OBJECT_NOTE`) in a system message: a continuation sent without
``response_format`` carries the schema that way, and the document it continues is the same
one. The note is read (:meth:`Conversation.format_note`) wherever it stands in the system
text; with the JSON after it, and the white space around it, it is left out of the seed.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

# The format notes a continuation carries instead of a response format (the JSON Schema
# follows SCHEMA_NOTE): the fake reads the notes resumeq's client writes.
from resumeq.core.answer import CALL_NOTE, CALL_NOTE_SCHEMA, JSON_OBJECT_NOTE, SCHEMA_NOTE

# The instruction form wraps the unfinished tail in these markers (the exact text between
# them is the tail): the fake follows the instruction resumeq's client writes.
from resumeq.core.continuation import PARTIAL_CLOSE, PARTIAL_OPEN
from resumeq.fake.markers import Markers, markers_of

_TOOL_NAME_RE = re.compile(r"([A-Za-z0-9_-]{1,64})" + re.escape(CALL_NOTE_SCHEMA))

ContinueMode = Literal["prefill", "prefill_flag", "continue_final_message", "instruction"]


class InvalidRequest(ValueError):
    """The request cannot be served; the wire answers it with a 400."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


@dataclass(frozen=True)
class Block:
    text: str
    cache_control: bool = False


@dataclass(frozen=True)
class SentCall:
    """A tool call an assistant message of the conversation made."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Format:
    """The JSON document an answer must be: valid for a JSON Schema (``schema_json``, the
    schema as JSON text), or (None) any JSON object."""

    schema_json: str | None = None
    #: The document is the arguments of a call to this tool, continued
    #: (:data:`CALL_NOTE`): its schema is the tool's parameters.
    tool: str | None = None

    @property
    def schema(self) -> dict[str, object] | None:
        return None if self.schema_json is None else json.loads(self.schema_json)


@dataclass(frozen=True)
class Message:
    role: str
    blocks: tuple[Block, ...]
    prefix: bool = False
    #: An assistant message's tool calls.
    tool_calls: tuple[SentCall, ...] = ()
    #: A tool message: the call it answers.
    tool_call_id: str | None = None

    @property
    def text(self) -> str:
        return "".join(block.text for block in self.blocks)

    @property
    def prefill(self) -> bool:
        """A final assistant message like this one is continued."""
        return self.role == "assistant" and bool(self.text) and not self.tool_calls


@dataclass(frozen=True)
class Continuation:
    mode: ContinueMode
    prefix: str


@dataclass(frozen=True)
class Conversation:
    """System messages first (role ``system``), then the turns in order."""

    messages: tuple[Message, ...]

    def source(self) -> tuple[str, str]:
        """The system text (without a format note) and the last original user message: all
        the canonical text (and the markers that shape it) depends on, with the tool results
        after it. The model name, earlier turns and any continuation do not change it."""
        system: list[str] = []
        for message in self.messages:
            if message.role == "system":
                text, note = split_note(message.text)
                if note is None or text:
                    system.append(text)
        return "\n".join(system), self.messages[self._last_user()].text

    def _last_user(self) -> int:
        for index in range(len(self.messages) - 1, -1, -1):
            message = self.messages[index]
            if message.role == "user" and PARTIAL_OPEN not in message.text:
                return index
        raise InvalidRequest(
            "fake provider: no user message (a continuation instruction does not count: "
            "send the original request as its own user message before it)",
            param="messages",
        )

    def tool_results(self) -> tuple[str, ...]:
        """The tool results after the last original user message, in order."""
        after = self.messages[self._last_user() + 1 :]
        return tuple(m.text for m in after if m.role == "tool")

    def seed(self) -> bytes:
        source: list[str] = [*self.source(), *self.tool_results()]
        payload = json.dumps(source, ensure_ascii=False).encode("utf-8")
        return hashlib.sha256(payload).digest()

    def answers_tool_result(self) -> bool:
        """Whether the turn answered is a tool result (a continuation of that answer too)."""
        messages = list(self.messages)
        last = messages[-1]
        if last.prefill or (last.role == "user" and partial_tail(last.text) is not None):
            messages.pop()
        return bool(messages) and messages[-1].role == "tool"

    def format_note(self) -> Format | None:
        """The format a system note states, if one does."""
        for message in self.messages:
            if message.role == "system":
                note = split_note(message.text)[1]
                if note is not None:
                    return note
        return None

    def markers(self) -> Markers:
        system, user = self.source()
        try:
            return markers_of(user, system)
        except ValueError as exc:
            raise InvalidRequest(str(exc), param="messages") from exc

    def continuation(self, *, continue_final_message: bool = False) -> Continuation | None:
        last = self.messages[-1]
        if last.prefill:
            mode: ContinueMode = "prefill"
            if last.prefix:
                mode = "prefill_flag"
            elif continue_final_message:
                mode = "continue_final_message"
            return Continuation(mode, last.text)
        tail = partial_tail(last.text) if last.role == "user" else None
        return Continuation("instruction", tail) if tail is not None else None


def partial_tail(text: str) -> str | None:
    """The text between the first ``PARTIAL_OPEN`` and the last ``PARTIAL_CLOSE``, if any."""
    start = text.find(PARTIAL_OPEN)
    if start < 0:
        return None
    start += len(PARTIAL_OPEN)
    end = text.rfind(PARTIAL_CLOSE)
    if end < start:
        return None
    return text[start:end]


def split_note(text: str) -> tuple[str, Format | None]:
    """``text`` without its format note (and the schema after it), and the format it
    states; ``(text, None)`` when it has none."""
    for note in (SCHEMA_NOTE, JSON_OBJECT_NOTE, CALL_NOTE):
        at = text.find(note)
        if at < 0:
            continue
        end, fmt = at + len(note), Format()
        tool = None
        if note == CALL_NOTE:
            named = _TOOL_NAME_RE.match(text, end)
            if named is None:
                raise InvalidRequest(
                    f"fake provider: the call note names no tool followed by {CALL_NOTE_SCHEMA!r}",
                    param="messages",
                )
            tool, end = named.group(1), named.end()
        if note != JSON_OBJECT_NOTE:
            rest = text[end:]
            body = rest.lstrip()
            try:
                schema, used = json.JSONDecoder().raw_decode(body)
            except ValueError:
                schema, used = None, 0
            if not isinstance(schema, dict):
                raise InvalidRequest(
                    "fake provider: the schema note is not followed by a JSON Schema object",
                    param="messages",
                )
            end += len(rest) - len(body) + used
            fmt = Format(json.dumps(schema, ensure_ascii=False), tool)
        before, after = text[:at].rstrip(), text[end:].lstrip()
        return (before + "\n" + after if before and after else before + after), fmt
    return text, None


def blocks_of(content: object, param: str) -> tuple[Block, ...]:
    """A message's content, a string or a list of blocks; only text blocks carry text."""
    if content is None:
        return ()
    if isinstance(content, str):
        return (Block(content),)
    if not isinstance(content, list):
        raise InvalidRequest(f"{param}: expected a string or a list of content blocks", param)
    blocks: list[Block] = []
    for index, item in enumerate(content):
        if not isinstance(item, Mapping):
            raise InvalidRequest(f"{param}.{index}: expected an object", param)
        text = item.get("text") if item.get("type", "text") == "text" else ""
        if not isinstance(text, str):
            raise InvalidRequest(f"{param}.{index}.text: expected a string", param)
        blocks.append(Block(text, cache_control=item.get("cache_control") is not None))
    return tuple(blocks)


def message_of(item: object, index: int) -> Message:
    param = f"messages.{index}"
    if not isinstance(item, Mapping):
        raise InvalidRequest(f"{param}: expected an object", param)
    role = item.get("role")
    if role == "developer":
        role = "system"
    if role not in ("system", "user", "assistant", "tool"):
        raise InvalidRequest(f"{param}.role: unknown role {role!r}", f"{param}.role")
    call_id = item.get("tool_call_id")
    if role == "tool" and not (isinstance(call_id, str) and call_id):
        raise InvalidRequest(
            f"{param}.tool_call_id: a tool message must name the call it answers",
            f"{param}.tool_call_id",
        )
    calls = item.get("tool_calls")
    return Message(
        role=str(role),
        blocks=blocks_of(item.get("content"), f"{param}.content"),
        prefix=item.get("prefix") is True,
        tool_calls=sent_calls(calls, f"{param}.tool_calls") if role == "assistant" else (),
        tool_call_id=call_id if role == "tool" else None,
    )


def sent_calls(calls: object, param: str) -> tuple[SentCall, ...]:
    """An assistant message's ``tool_calls`` (OpenAI's shape)."""
    if calls is None:
        return ()
    if not isinstance(calls, list):
        raise InvalidRequest(f"{param}: expected a list", param)
    out: list[SentCall] = []
    for index, call in enumerate(calls):
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(call, Mapping) or not isinstance(function, Mapping):
            raise InvalidRequest(f"{param}.{index}: expected a function call", param)
        call_id, name = call.get("id"), function.get("name")
        arguments = function.get("arguments")
        if not (isinstance(call_id, str) and isinstance(name, str)):
            raise InvalidRequest(f"{param}.{index}: a call has an id and a name", param)
        if not isinstance(arguments, str):
            raise InvalidRequest(f"{param}.{index}.function.arguments: expected a string", param)
        out.append(SentCall(call_id, name, arguments))
    return tuple(out)


def conversation_of(messages: object, system: object = None) -> Conversation:
    """Normalise OpenAI-style ``messages`` (system messages inline) or Anthropic-style
    ``messages`` plus a top-level ``system`` (a string or a list of text blocks)."""
    if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
        raise InvalidRequest("messages: expected a non-empty list", "messages")
    parsed = [message_of(item, index) for index, item in enumerate(messages)]
    head: list[Message] = []
    if system is not None:
        head.append(Message("system", blocks_of(system, "system")))
    return Conversation(tuple(head + parsed))
