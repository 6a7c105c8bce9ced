"""What the wires share: the parsed request, input usage, and the wire interface."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from resumeq.fake.conversation import Continuation, Conversation, InvalidRequest
from resumeq.fake.ids import new_id
from resumeq.fake.plan import Finish, Plan, PlannedCall
from resumeq.fake.prompt import PromptCache
from resumeq.fake.shape import Shape
from resumeq.fake.stream import StreamFormat

__all__ = ["new_id"]  # the wires' ids, here as before

#: One encoder for every call: ``json.dumps`` with options builds one each time, which costs
#: more than encoding a token's delta.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def dumps(value: Any) -> str:
    """Compact JSON, as the providers send it."""
    return _ENCODER.encode(value)


@dataclass(frozen=True)
class Generation:
    conversation: Conversation
    continuation: Continuation | None
    model: str
    max_tokens: int | None
    stream: bool
    include_usage: bool = False
    continuous_usage: bool = False
    #: The prefill the engine repeats in front of its text (``prefill_echo``), or "".
    echo: str = ""
    #: Responses: pad each text delta with OpenAI's ``obfuscation`` field.
    obfuscation: bool = True
    #: The tools, tool choice and format the request gives.
    shape: Shape = field(default_factory=Shape)
    #: How this wire's call ids begin (``call_``, ``toolu_``).
    call_prefix: str = "call_"


@dataclass(frozen=True)
class Output:
    """What a non-streaming answer holds: ``tokens`` output tokens, ``reasoning_tokens`` of
    them reasoning."""

    text: str
    reasoning: str = ""
    tokens: int = 0
    reasoning_tokens: int = 0
    calls: tuple[PlannedCall, ...] = ()
    #: The text is a refusal.
    refusal: bool = False

    @classmethod
    def of(cls, completion: Plan) -> Output:
        return cls(
            "".join(completion.pieces),
            "".join(completion.reasoning),
            completion.tokens,
            len(completion.reasoning),
            completion.calls,
            completion.refusal,
        )


@dataclass(frozen=True)
class InputUsage:
    """``total`` is the whole prompt; ``cache_read`` and ``cache_created`` are parts of it."""

    total: int
    cache_read: int = 0
    cache_created: int = 0


@dataclass(frozen=True)
class ErrorReply:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


class Wire(Protocol):
    name: str
    overload_status: int  # what a non-streaming request gets for an ``error_event`` fault

    def parse(self, body: Mapping[str, Any]) -> Generation: ...

    def input_usage(self, cache: PromptCache, request: Generation) -> InputUsage: ...

    def stream_format(self, request: Generation, usage: InputUsage) -> StreamFormat: ...

    def body(
        self, request: Generation, output: Output, finish: Finish | None, usage: InputUsage
    ) -> dict[str, Any]: ...

    def error(
        self, status: int, message: str | None = None, param: str | None = None
    ) -> ErrorReply: ...


def model_of(body: Mapping[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("model: a non-empty string is required", "model")
    return model


def positive_int(body: Mapping[str, Any], *names: str) -> int | None:
    """The first of ``names`` present in ``body``, which must be an integer of at least 1."""
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidRequest(f"{name}: expected an integer of at least 1", name)
        return value
    return None


def retry_after_headers(retry_after: float | None, *, millis: bool) -> dict[str, str]:
    """How long to wait, as real providers say it: ``retry-after`` in whole seconds
    (HTTP's form, rounded up: never early), and on the OpenAI wire also ``retry-after-ms``
    to the millisecond (OpenAI's SDK reads it first)."""
    if retry_after is None:
        return {}
    headers = {"retry-after": str(math.ceil(retry_after))}
    if millis:
        headers["retry-after-ms"] = str(math.ceil(retry_after * 1000))
    return headers
