"""One shape for the conversations of both wires, the seed of their canonical text, and the
continuation a request carries (SPEC §5)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

# The instruction form wraps the unfinished tail in these markers (the exact text between
# them is the tail): the fake follows the instruction resumeq's client writes.
from resumeq.core.continuation import PARTIAL_CLOSE, PARTIAL_OPEN
from resumeq.fake.markers import Markers, markers_of

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
class Message:
    role: str
    blocks: tuple[Block, ...]
    prefix: bool = False

    @property
    def text(self) -> str:
        return "".join(block.text for block in self.blocks)


@dataclass(frozen=True)
class Continuation:
    mode: ContinueMode
    prefix: str


@dataclass(frozen=True)
class Conversation:
    """System messages first (role ``system``), then the turns in order."""

    messages: tuple[Message, ...]

    def source(self) -> tuple[str, str]:
        """The system text and the last original user message: all the canonical text (and
        the markers that shape it) depends on. The model name, earlier turns and any
        continuation do not change it."""
        system = "\n".join(m.text for m in self.messages if m.role == "system")
        users = [m.text for m in self.messages if m.role == "user" and PARTIAL_OPEN not in m.text]
        if not users:
            raise InvalidRequest(
                "fake provider: no user message (a continuation instruction does not count: "
                "send the original request as its own user message before it)",
                param="messages",
            )
        return system, users[-1]

    def seed(self) -> bytes:
        payload = json.dumps(list(self.source()), ensure_ascii=False).encode("utf-8")
        return hashlib.sha256(payload).digest()

    def markers(self) -> Markers:
        system, user = self.source()
        try:
            return markers_of(user, system)
        except ValueError as exc:
            raise InvalidRequest(str(exc), param="messages") from exc

    def continuation(self, *, continue_final_message: bool = False) -> Continuation | None:
        last = self.messages[-1]
        if last.role == "assistant" and last.text:
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
    return Message(
        role=str(role),
        blocks=blocks_of(item.get("content"), f"{param}.content"),
        prefix=item.get("prefix") is True,
    )


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
