"""Anthropic Messages (``POST /v1/messages`` and ``/v1/messages/count_tokens``).

Streams are ``event: NAME`` / ``data: {json}`` pairs: ``message_start`` (usage with
``output_tokens: 1``, as the real API sends), ``content_block_start``, ``ping``,
``content_block_delta`` events (``text_delta``) of 1 to 4 tokens each, as the real API groups
them (how many is drawn from the conversation's seed and the position), ``content_block_stop``,
``message_delta`` (``stop_reason`` and cumulative usage), ``message_stop``. Reasoning comes
first, as a ``thinking`` block (``thinking_delta`` events, then a ``signature_delta``), and
the text block is then index 1; ``output_tokens`` counts thinking too. ``input_tokens``
excludes the cached parts, as on the real API. A prefill continues the final assistant
message, which must not end in white space; the response text holds only the continuation.

Tool calls follow the text as ``tool_use`` blocks: ``content_block_start`` with
``{"type": "tool_use", "id": "toolu_…", "name", "input": {}}``, ``content_block_delta``
events of ``{"type": "input_json_delta", "partial_json": piece}`` (grouped as text is),
``content_block_stop``; ``stop_reason`` is ``tool_use``. Non-streamed, a ``tool_use`` block's
``input`` is the arguments as an object (``{}`` when they were cut or broken, and are no JSON
object). Messages may hold ``tool_use`` blocks (assistant) and ``tool_result`` blocks (user):
they are the conversation's calls and tool results. Structured outputs (``output_config``
``format``, or the beta ``output_format``) with a final assistant prefill are refused with
a 400, as the real API refuses them. A refusal is a text block and ``stop_reason: refusal``.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from resumeq.fake.conversation import Conversation, InvalidRequest, conversation_of
from resumeq.fake.plan import Finish, Part, Plan, PlannedCall, Segment
from resumeq.fake.prompt import PromptCache, layout
from resumeq.fake.shape import shape_of
from resumeq.fake.text import draw
from resumeq.fake.wire import (
    ErrorReply,
    Generation,
    InputUsage,
    Output,
    dumps,
    model_of,
    new_id,
    positive_int,
)

STOP_REASONS: dict[Finish, str] = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "refusal": "refusal",
}
#: The real API's words for a prefill sent with structured outputs.
PREFILL_WITH_FORMAT = (
    "Prefilling the assistant message is not supported with structured outputs "
    "(output_config.format): end the messages with a user turn, or drop the format."
)

_ERRORS: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "Invalid request."),
    401: ("authentication_error", "invalid x-api-key"),
    402: ("billing_error", "Your credit balance is too low."),
    403: ("permission_error", "Your API key does not have permission to use this resource."),
    404: ("not_found_error", "The requested resource could not be found."),
    413: ("request_too_large", "Request exceeds the maximum allowed number of bytes."),
    429: ("rate_limit_error", "Number of requests has exceeded your rate limit."),
    500: ("api_error", "Internal server error"),
    504: ("timeout_error", "Request timed out"),
    529: ("overloaded_error", "Overloaded"),
}

MAX_GROUP = 4
_GROUP_SALT = 0x6772_6F75_7073

OVERLOADED = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}


def usage_json(usage: InputUsage, output: int) -> dict[str, Any]:
    return {
        "input_tokens": usage.total - usage.cache_read - usage.cache_created,
        "cache_creation_input_tokens": usage.cache_created,
        "cache_read_input_tokens": usage.cache_read,
        "cache_creation": {
            "ephemeral_5m_input_tokens": usage.cache_created,
            "ephemeral_1h_input_tokens": 0,
        },
        "output_tokens": output,
        "service_tier": "standard",
    }


def _event(name: str, data: str) -> bytes:
    return f"event: {name}\ndata: {data}\n\n".encode()


def signature(seed: bytes) -> str:
    """The thinking block's signature: opaque, as the real one is to a client."""
    return base64.b64encode(hashlib.sha512(b"signature\x00" + seed).digest()).decode()


class AnthropicStream:
    def __init__(self, request: Generation, usage: InputUsage) -> None:
        self._request = request
        self._usage = usage
        self._seed = request.conversation.seed()
        self._blocks = 0  # content blocks started; the open one is the last

    def opening(self, completion: Plan) -> list[bytes]:
        message: dict[str, Any] = {
            "id": new_id("msg_"),
            "type": "message",
            "role": "assistant",
            "model": self._request.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage_json(self._usage, 1),
        }
        return [_event("message_start", dumps({"type": "message_start", "message": message}))]

    def group(self, part: Part, emitted: int) -> int:
        return 1 + draw(self._seed, _GROUP_SALT, emitted) % MAX_GROUP

    def start(self, segment: Segment) -> list[bytes]:
        block: dict[str, Any] = {"type": "text", "text": ""}
        if segment.part == "reasoning":
            block = {"type": "thinking", "thinking": ""}
        elif segment.call is not None:
            call = segment.call
            block = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
        start = {"type": "content_block_start", "index": self._blocks, "content_block": block}
        events = [_event("content_block_start", dumps(start))]
        if self._blocks == 0:
            events.append(_event("ping", '{"type":"ping"}'))
        self._blocks += 1
        return events

    def _delta(self, delta: dict[str, str]) -> bytes:
        index = max(self._blocks - 1, 0)
        body = {"type": "content_block_delta", "index": index, "delta": delta}
        return _event("content_block_delta", dumps(body))

    def delta(self, segment: Segment, text: str, emitted: int) -> bytes:
        if segment.part == "reasoning":
            return self._delta({"type": "thinking_delta", "thinking": text})
        if segment.part == "call":
            return self._delta({"type": "input_json_delta", "partial_json": text})
        return self._delta({"type": "text_delta", "text": text})

    def stop(self, segment: Segment) -> list[bytes]:
        stop = {"type": "content_block_stop", "index": self._blocks - 1}
        events = [_event("content_block_stop", dumps(stop))]
        if segment.part == "reasoning":
            sign = {"type": "signature_delta", "signature": signature(self._seed)}
            events.insert(0, self._delta(sign))
        return events

    def closing(self, finish: Finish, emitted: int, reasoning: int) -> list[bytes]:
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": STOP_REASONS[finish], "stop_sequence": None},
            "usage": usage_json(self._usage, emitted),
        }
        return [
            _event("message_delta", dumps(delta)),
            _event("message_stop", '{"type":"message_stop"}'),
        ]

    def error(self) -> list[bytes]:
        return [_event("error", dumps(OVERLOADED))]

    def malformed(self) -> bytes:
        whole = self._delta({"type": "text_delta", "text": " interrupted"}).rstrip(b"\n")
        return whole[: len(whole) - 12] + b"\n\n"


def tool_use_json(call: PlannedCall) -> dict[str, Any]:
    try:
        arguments = json.loads(call.arguments)
    except ValueError:
        arguments = None
    arguments = arguments if isinstance(arguments, dict) else {}
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": arguments}


def parse_conversation(body: Mapping[str, Any]) -> Conversation:
    messages = body.get("messages")
    if not isinstance(messages, list):
        return conversation_of(messages, body.get("system"))
    turns: list[dict[str, Any]] = []
    for index, item in enumerate(messages):
        role = item.get("role") if isinstance(item, Mapping) else None
        if role not in ("user", "assistant"):
            raise InvalidRequest(
                f"messages.{index}.role: Input should be 'user' or 'assistant'",
                f"messages.{index}.role",
            )
        assert isinstance(item, Mapping)
        turns.extend(chat_messages(item, f"messages.{index}"))
    return conversation_of(turns, body.get("system"))


def chat_messages(item: Mapping[str, Any], param: str) -> list[dict[str, Any]]:
    """One Anthropic message in the chat shape: an assistant's ``tool_use`` blocks become
    its ``tool_calls``; a user's ``tool_result`` blocks become tool messages (before what
    else the message says)."""
    content = item.get("content")
    if not isinstance(content, list):
        return [dict(item)]
    blocks, calls, results = [], [], []
    for n, block in enumerate(content):
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind == "tool_use" and item["role"] == "assistant":
            if not isinstance(block.get("input"), Mapping):
                raise InvalidRequest(f"{param}.content.{n}.input: expected an object", param)
            arguments = dumps(block["input"])
            function = {"name": block.get("name"), "arguments": arguments}
            calls.append({"id": block.get("id"), "type": "function", "function": function})
        elif kind == "tool_result" and item["role"] == "user":
            results.append(
                {
                    "role": "tool",
                    "tool_call_id": block.get("tool_use_id"),
                    "content": block.get("content") or "",
                }
            )
        else:
            blocks.append(block)
    out: list[dict[str, Any]] = results
    if blocks or not results:
        message: dict[str, Any] = {"role": item["role"], "content": blocks}
        if calls:
            message["tool_calls"] = calls
        out.append(message)
    return out


class AnthropicWire:
    name = "anthropic"
    overload_status = 529

    def parse(self, body: Mapping[str, Any]) -> Generation:
        model = model_of(body)
        max_tokens = positive_int(body, "max_tokens")
        if max_tokens is None:
            raise InvalidRequest("max_tokens: Field required", "max_tokens")
        conversation = parse_conversation(body)
        last = conversation.messages[-1]
        if last.role == "assistant" and last.text != last.text.rstrip():
            raise InvalidRequest(
                "messages: final assistant content cannot end with trailing whitespace",
                "messages",
            )
        shape = shape_of("anthropic", body)
        if shape.format is not None and last.prefill:
            raise InvalidRequest(PREFILL_WITH_FORMAT, "messages")
        return Generation(
            conversation=conversation,
            continuation=conversation.continuation(),
            model=model,
            max_tokens=max_tokens,
            stream=body.get("stream") is True,
            shape=shape,
            call_prefix="toolu_",
        )

    def input_usage(self, cache: PromptCache, request: Generation) -> InputUsage:
        prompt = layout(request.conversation)
        use = cache.anthropic(request.model, prompt)
        return InputUsage(len(prompt), cache_read=use.read, cache_created=use.created)

    def stream_format(self, request: Generation, usage: InputUsage) -> AnthropicStream:
        return AnthropicStream(request, usage)

    def body(
        self, request: Generation, output: Output, finish: Finish | None, usage: InputUsage
    ) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        if output.reasoning:
            sign = signature(request.conversation.seed())
            content.append({"type": "thinking", "thinking": output.reasoning, "signature": sign})
        if output.text or not (output.reasoning or output.calls):
            content.append({"type": "text", "text": output.text})
        content.extend(tool_use_json(call) for call in output.calls)
        return {
            "id": new_id("msg_"),
            "type": "message",
            "role": "assistant",
            "model": request.model,
            "content": content,
            "stop_reason": STOP_REASONS[finish] if finish is not None else None,
            "stop_sequence": None,
            "usage": usage_json(usage, output.tokens),
        }

    def error(
        self, status: int, message: str | None = None, param: str | None = None
    ) -> ErrorReply:
        default_type = "api_error" if status >= 500 else "invalid_request_error"
        kind, default = _ERRORS.get(status, (default_type, f"Error {status}"))
        request_id = new_id("req_")
        body = {
            "type": "error",
            "error": {"type": kind, "message": message or default},
            "request_id": request_id,
        }
        return ErrorReply(status, body, {"request-id": request_id})


def count_tokens(body: Mapping[str, Any]) -> dict[str, int]:
    model_of(body)
    return {"input_tokens": len(layout(parse_conversation(body)))}
