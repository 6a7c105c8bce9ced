"""OpenAI Responses (``POST /v1/responses``), as OpenAI sends it.

A stream is typed events, each framed with its ``event:`` line, numbered from 0 by
``sequence_number``: ``response.created`` and ``response.in_progress`` (the response object,
``status: "in_progress"``); for reasoning (when the prompt asks for it) a ``reasoning``
output item whose text comes as ``response.reasoning_text.delta``; then the ``message``
item — ``response.output_item.added``, ``response.content_part.added``, one
``response.output_text.delta`` per token (with ``logprobs: []`` and OpenAI's
``obfuscation`` padding unless ``stream_options.include_obfuscation`` is false),
``response.output_text.done``, ``response.content_part.done``, ``response.output_item.done``
— and the terminal event: ``response.completed``, or ``response.incomplete`` with
``incomplete_details.reason: "max_output_tokens"`` when the budget ran out. Usage
(``input_tokens``, ``input_tokens_details.cached_tokens``, ``output_tokens``,
``output_tokens_details.reasoning_tokens``) is only in the terminal event. There is no
``[DONE]``. The in-band error is the ``error`` event.

Tool calls follow the message as ``function_call`` items: ``response.output_item.added``
(``{"type": "function_call", "id": "fc_…", "call_id": "call_…", "name", "arguments": "",
"status": "in_progress"}``), one ``response.function_call_arguments.delta`` (``item_id``,
``output_index``, ``delta``) per token, ``response.function_call_arguments.done``
(``arguments``), ``response.output_item.done`` (``completed``; ``incomplete`` when the budget
cut it); the terminal event's ``output`` holds them. A refusal is the message's ``refusal``
part: ``response.content_part.added`` with ``{"type": "refusal", "refusal": ""}``,
``response.refusal.delta`` events, ``response.refusal.done``. The response object echoes the
request's ``tools``, ``tool_choice`` and ``text``.

The input (:mod:`resumeq.fake.responses_input`) is ``input`` and ``instructions``. A final
assistant message with ``status: "in_progress"`` is continued, vLLM's way (Chat Completions'
``continue_final_message``).
"""

from __future__ import annotations

import random
import string
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from resumeq.fake.conversation import InvalidRequest, conversation_of
from resumeq.fake.openai_wire import OpenAIWire
from resumeq.fake.plan import Finish, Part, Plan, PlannedCall, Segment
from resumeq.fake.responses_input import items_to_messages
from resumeq.fake.shape import shape_of
from resumeq.fake.stream import StreamFormat
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

_OBFUSCATION = string.ascii_letters + string.digits
#: OpenAI refuses a ``max_output_tokens`` below this.
MIN_OUTPUT_TOKENS = 16


def usage_json(usage: InputUsage, output: int, reasoning: int) -> dict[str, Any]:
    return {
        "input_tokens": usage.total,
        # Prompt caching on this API writes for free: no token is ever a write.
        "input_tokens_details": {"cached_tokens": usage.cache_read, "cache_write_tokens": 0},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": usage.total + output,
    }


def response_object(
    response_id: str,
    request: Generation,
    *,
    status: str,
    created_at: int,
    output: list[dict[str, Any]] | None = None,
    usage: dict[str, Any] | None = None,
    incomplete: str | None = None,
    background: bool = False,
    store: bool = True,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The response object as the API shows it, in every event that carries one."""
    declared = request.shape.declared
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "background": background,
        "error": error,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "instructions": None,
        "max_output_tokens": request.max_tokens,
        "model": request.model,
        "output": output or [],
        "parallel_tool_calls": request.shape.parallel,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "store": store,
        "temperature": 1.0,
        "text": declared.get("text", {"format": {"type": "text"}}),
        "tool_choice": declared.get("tool_choice", "auto"),
        "tools": declared.get("tools", []),
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": usage,
        "user": None,
        "metadata": {},
    }


def message_item(item_id: str, text: str, status: str, *, refusal: bool = False) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "output_text", "annotations": [], "logprobs": [], "text": text}
    if refusal:
        part = {"type": "refusal", "refusal": text}
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "content": [part] if status != "in_progress" else [],
        "role": "assistant",
    }


def reasoning_item(item_id: str, text: str, done: bool) -> dict[str, Any]:
    item: dict[str, Any] = {"id": item_id, "type": "reasoning", "summary": []}
    if done:
        item["content"] = [{"type": "reasoning_text", "text": text}]
    return item


def function_call_item(call: PlannedCall, arguments: str, status: str) -> dict[str, Any]:
    return {
        "id": call.item_id,
        "type": "function_call",
        "status": status,
        "arguments": arguments,
        "call_id": call.id,
        "name": call.name,
    }


def _call_status(call: PlannedCall) -> str:
    """A call sent to its end: ``completed``, or ``incomplete`` when the budget cut it."""
    return "completed" if call.complete or call.broken else "incomplete"


@dataclass
class _Open:
    """The output item being sent, and its text so far."""

    segment: Segment
    item_id: str
    index: int
    texts: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self.texts)

    def where(self) -> dict[str, Any]:
        where: dict[str, Any] = {"item_id": self.item_id, "output_index": self.index}
        if self.segment.part != "call":
            where["content_index"] = 0
        return where


class ResponsesStream:
    """The events of one response, numbered as they go out."""

    def __init__(
        self,
        request: Generation,
        usage: InputUsage,
        *,
        response_id: str | None = None,
        obfuscation: bool = True,
        background: bool = False,
        store: bool = True,
    ) -> None:
        self.response_id = response_id or new_id("resp_")
        self._request = request
        self._usage = usage
        self._obfuscation = obfuscation
        self._background = background
        self._store = store
        self._created = int(time.time())
        self._rng = random.Random(self.response_id)
        self._sequence = 0
        self._message_id = new_id("msg_")
        self._items: list[dict[str, Any]] = []  # the output items done
        self._open: _Open | None = None
        self._last_delta: bytes | None = None
        self._last: Segment = Segment("text", ())  # the segment the last delta was of
        #: The response object of the terminal event, once sent.
        self.last_response: dict[str, Any] | None = None

    def event(self, kind: str, fields: dict[str, Any]) -> bytes:
        data = dumps({"type": kind, "sequence_number": self._sequence, **fields})
        self._sequence += 1
        return f"event: {kind}\ndata: {data}\n\n".encode()

    def _response(self, status: str, **extra: Any) -> dict[str, Any]:
        return response_object(
            self.response_id,
            self._request,
            status=status,
            created_at=self._created,
            background=self._background,
            store=self._store,
            **extra,
        )

    def opening(self, completion: Plan) -> list[bytes]:
        return [self.created(), self.in_progress()]

    def created(self) -> bytes:
        """``response.created``: a background response starts ``queued``."""
        status = "queued" if self._background else "in_progress"
        return self.event("response.created", {"response": self._response(status)})

    def in_progress(self) -> bytes:
        return self.event("response.in_progress", {"response": self._response("in_progress")})

    def group(self, part: Part, emitted: int) -> int:
        return 1

    def start(self, segment: Segment) -> list[bytes]:
        part, index = segment.part, len(self._items)
        part_added: dict[str, Any] | None
        if segment.call is not None:
            item_id = segment.call.item_id
            added = function_call_item(segment.call, "", "in_progress")
            part_added = None
        elif part == "reasoning":
            item_id = new_id("rs_")
            added = reasoning_item(item_id, "", done=False)
            part_added = {"type": "reasoning_text", "text": ""}
        else:
            item_id = self._message_id
            added = message_item(item_id, "", "in_progress")
            part_added = {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}
            if part == "refusal":
                part_added = {"type": "refusal", "refusal": ""}
        self._open = opened = _Open(segment, item_id, index)
        events = [self.event("response.output_item.added", {"output_index": index, "item": added})]
        if part_added is not None:
            events.append(
                self.event("response.content_part.added", {**opened.where(), "part": part_added})
            )
        return events

    def _opened(self, segment: Segment) -> _Open:
        if self._open is None or self._open.segment != segment:
            self._open = _Open(segment, self._message_id, len(self._items))
        return self._open

    def delta(self, segment: Segment, text: str, emitted: int) -> bytes:
        self._last = segment
        opened = self._opened(segment)
        opened.texts.append(text)
        fields: dict[str, Any] = {**opened.where(), "delta": text}
        kind = {
            "reasoning": "response.reasoning_text.delta",
            "refusal": "response.refusal.delta",
            "call": "response.function_call_arguments.delta",
        }.get(segment.part)
        if kind is None:
            kind = "response.output_text.delta"
            fields["logprobs"] = []
            if self._obfuscation:
                # OpenAI pads each delta with random characters so that sizes on the wire
                # do not tell the tokens.
                size = self._rng.randint(1, 16)
                fields["obfuscation"] = "".join(self._rng.choices(_OBFUSCATION, k=size))
        self._last_delta = self.event(kind, fields)
        return self._last_delta

    def stop(self, segment: Segment) -> list[bytes]:
        opened = self._opened(segment)
        self._open = None
        text, where, index = opened.text, opened.where(), opened.index
        if segment.call is not None:
            item = function_call_item(segment.call, text, _call_status(segment.call))
            done = [
                self.event("response.function_call_arguments.done", {**where, "arguments": text})
            ]
        elif segment.part == "reasoning":
            item = reasoning_item(opened.item_id, text, done=True)
            done = [
                self.event("response.reasoning_text.done", {**where, "text": text}),
                self.event("response.content_part.done", {**where, "part": item["content"][0]}),
            ]
        else:
            refusal = segment.part == "refusal"
            item = message_item(opened.item_id, text, "completed", refusal=refusal)
            text_done = (
                self.event("response.refusal.done", {**where, "refusal": text})
                if refusal
                else self.event(
                    "response.output_text.done", {**where, "text": text, "logprobs": []}
                )
            )
            done = [
                text_done,
                self.event("response.content_part.done", {**where, "part": item["content"][0]}),
            ]
        self._items.append(item)
        return [
            *done,
            self.event("response.output_item.done", {"output_index": index, "item": item}),
        ]

    def output_so_far(self) -> list[dict[str, Any]]:
        """The output items as a retrieve shows them mid-answer: those done, then the one
        being sent, as far as it went."""
        items = list(self._items)
        opened = self._open
        if opened is not None and opened.texts:
            segment = opened.segment
            if segment.call is not None:
                items.append(function_call_item(segment.call, opened.text, "in_progress"))
            elif segment.part == "reasoning":
                items.append(reasoning_item(opened.item_id, opened.text, done=False))
            else:
                refusal = segment.part == "refusal"
                items.append(
                    message_item(opened.item_id, opened.text, "incomplete", refusal=refusal)
                )
        return items

    def closing(self, finish: Finish, emitted: int, reasoning: int) -> list[bytes]:
        usage = usage_json(self._usage, emitted, reasoning)
        if finish == "length":
            response = self._response(
                "incomplete", output=self._items, usage=usage, incomplete="max_output_tokens"
            )
            self.last_response = response
            return [self.event("response.incomplete", {"response": response})]
        response = self._response("completed", output=self._items, usage=usage)
        self.last_response = response
        return [self.event("response.completed", {"response": response})]

    def error(self) -> list[bytes]:
        fields = {
            "code": "server_error",
            "message": "The server is overloaded, please try again later.",
            "param": None,
        }
        return [self.event("error", fields)]

    def out_of_sequence(self, *, repeat: bool) -> bytes:
        """A delta numbered wrong: the last one again under its own number (``repeat``), or
        the next piece with one number skipped."""
        if repeat and self._last_delta is not None:
            return self._last_delta
        self._sequence += 1
        return self.delta(self._last, " skipped", 0)

    def malformed(self) -> bytes:
        whole = self.delta(self._last, " interrupted", 0).rstrip(b"\n")
        return whole[: len(whole) // 2] + b"\n\n"


class ResponsesWire(OpenAIWire):
    """OpenAI's errors and prompt cache, another request and stream."""

    name = "responses"

    def parse(self, body: Mapping[str, Any]) -> Generation:
        model = model_of(body)
        messages, continue_final = items_to_messages(body)
        stream = body.get("stream") is True
        options = body.get("stream_options")
        if options is not None and not stream:
            raise InvalidRequest(
                "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                "stream_options",
            )
        conversation = conversation_of(messages)
        options = options if isinstance(options, Mapping) else {}
        max_tokens = positive_int(body, "max_output_tokens")
        if max_tokens is not None and max_tokens < MIN_OUTPUT_TOKENS:
            # OpenAI's own words and code for it.
            raise InvalidRequest(
                "Invalid 'max_output_tokens': integer below minimum value. Expected a value "
                f">= {MIN_OUTPUT_TOKENS}, but got {max_tokens} instead.",
                "max_output_tokens",
            )
        return Generation(
            conversation=conversation,
            continuation=conversation.continuation(continue_final_message=continue_final),
            model=model,
            max_tokens=max_tokens,
            stream=stream,
            include_usage=True,
            obfuscation=options.get("include_obfuscation") is not False,
            shape=shape_of("responses", body),
        )

    def stream_format(self, request: Generation, usage: InputUsage) -> StreamFormat:
        return ResponsesStream(request, usage, obfuscation=request.obfuscation)

    def body(
        self, request: Generation, output: Output, finish: Finish | None, usage: InputUsage
    ) -> dict[str, Any]:
        items: list[dict[str, Any]] = []
        if output.reasoning:
            items.append(reasoning_item(new_id("rs_"), output.reasoning, done=True))
        if output.text or not output.calls:
            text = request.echo + output.text
            items.append(message_item(new_id("msg_"), text, "completed", refusal=output.refusal))
        items.extend(
            function_call_item(call, call.arguments, _call_status(call)) for call in output.calls
        )
        status = "incomplete" if finish == "length" else "completed"
        return response_object(
            new_id("resp_"),
            request,
            status=status,
            created_at=int(time.time()),
            output=items,
            usage=usage_json(usage, output.tokens, output.reasoning_tokens),
            incomplete="max_output_tokens" if finish == "length" else None,
        )

    def not_found(self, response_id: str) -> ErrorReply:
        reply = self.error(404, f"Response with id '{response_id}' not found.", None)
        reply.body["error"]["code"] = None
        return reply
