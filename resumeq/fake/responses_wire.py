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

The input is ``input`` (a string, or a list of items: messages with a role and a string or a
list of ``input_text`` / ``output_text`` parts) and ``instructions`` (a system message in
front). A final assistant message with ``status: "in_progress"`` is continued, vLLM's way
(Chat Completions' ``continue_final_message``).
"""

from __future__ import annotations

import random
import string
import time
from collections.abc import Mapping
from typing import Any

from resumeq.fake.conversation import InvalidRequest, conversation_of
from resumeq.fake.openai_wire import OpenAIWire
from resumeq.fake.plan import Finish, Part
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
        "input_tokens_details": {"cached_tokens": usage.cache_read},
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
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "store": store,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": usage,
        "user": None,
        "metadata": {},
    }


def message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    content = [{"type": "output_text", "annotations": [], "logprobs": [], "text": text}]
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "content": content if status != "in_progress" else [],
        "role": "assistant",
    }


def reasoning_item(item_id: str, text: str, done: bool) -> dict[str, Any]:
    item: dict[str, Any] = {"id": item_id, "type": "reasoning", "summary": []}
    if done:
        item["content"] = [{"type": "reasoning_text", "text": text}]
    return item


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
        self._echo = request.echo
        self._texts: dict[Part, list[str]] = {"reasoning": [], "text": []}
        self._items: list[dict[str, Any]] = []
        self._ids: dict[Part, str] = {}
        self._last_delta: bytes | None = None
        self._part: Part = "text"  # the part the last delta was of
        #: The response object of the terminal event, once sent.
        self.last_response: dict[str, Any] | None = None

    @property
    def message_id(self) -> str:
        """The id of the answer's message item (made when it starts, or now)."""
        return self._ids.setdefault("text", new_id("msg_"))

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

    def _index(self, part: Part) -> int:
        return 0 if part == "reasoning" or not self._texts["reasoning"] else 1

    def opening(self) -> list[bytes]:
        return [self.created(), self.in_progress()]

    def created(self) -> bytes:
        """``response.created``: a background response starts ``queued``."""
        status = "queued" if self._background else "in_progress"
        return self.event("response.created", {"response": self._response(status)})

    def in_progress(self) -> bytes:
        return self.event("response.in_progress", {"response": self._response("in_progress")})

    def group(self, part: Part, emitted: int) -> int:
        return 1

    def start(self, part: Part) -> list[bytes]:
        item_id = self._ids[part] = (
            new_id("rs_") if part == "reasoning" else self._ids.get("text") or new_id("msg_")
        )
        index = self._index(part)
        part_added: dict[str, Any]
        if part == "reasoning":
            added = reasoning_item(item_id, "", done=False)
            part_added = {"type": "reasoning_text", "text": ""}
        else:
            added = message_item(item_id, "", "in_progress")
            part_added = {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}
        where = {"item_id": item_id, "output_index": index, "content_index": 0}
        return [
            self.event("response.output_item.added", {"output_index": index, "item": added}),
            self.event("response.content_part.added", {**where, "part": part_added}),
        ]

    def delta(self, part: Part, text: str, emitted: int) -> bytes:
        self._part = part
        if part == "text":
            text, self._echo = self._echo + text, ""
        self._texts[part].append(text)
        fields: dict[str, Any] = {
            "item_id": self._ids[part],
            "output_index": self._index(part),
            "content_index": 0,
            "delta": text,
        }
        if part == "reasoning":
            self._last_delta = self.event("response.reasoning_text.delta", fields)
            return self._last_delta
        fields["logprobs"] = []
        if self._obfuscation:
            # OpenAI pads each delta with random characters so that sizes on the wire do
            # not tell the tokens.
            size = self._rng.randint(1, 16)
            fields["obfuscation"] = "".join(self._rng.choices(_OBFUSCATION, k=size))
        self._last_delta = self.event("response.output_text.delta", fields)
        return self._last_delta

    def stop(self, part: Part) -> list[bytes]:
        text = "".join(self._texts[part])
        if part == "text" and self._echo:  # an echo that found no token to go with
            text, self._echo = self._echo + text, ""
        item_id, index = self._ids.get(part, ""), self._index(part)
        where = {"item_id": item_id, "output_index": index, "content_index": 0}
        if part == "reasoning":
            item = reasoning_item(item_id, text, done=True)
            self._items.append(item)
            return [
                self.event("response.reasoning_text.done", {**where, "text": text}),
                self.event(
                    "response.content_part.done",
                    {**where, "part": {"type": "reasoning_text", "text": text}},
                ),
                self.event("response.output_item.done", {"output_index": index, "item": item}),
            ]
        item = message_item(item_id, text, "completed")
        self._items.append(item)
        return [
            self.event("response.output_text.done", {**where, "text": text, "logprobs": []}),
            self.event("response.content_part.done", {**where, "part": item["content"][0]}),
            self.event("response.output_item.done", {"output_index": index, "item": item}),
        ]

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
        return self.delta(self._part, " skipped", 0)

    def malformed(self) -> bytes:
        whole = self.delta(self._part, " interrupted", 0).rstrip(b"\n")
        return whole[: len(whole) // 2] + b"\n\n"


def _items_to_messages(body: Mapping[str, Any]) -> tuple[list[dict[str, Any]], bool]:
    """``input`` (and ``instructions``) as chat messages; whether the last one, an
    assistant message ``in_progress``, is to be continued."""
    raw = body.get("input")
    if isinstance(raw, str):
        items: list[Any] = [{"role": "user", "content": raw}]
    elif isinstance(raw, list) and raw:
        items = raw
    else:
        raise InvalidRequest("input: expected a string or a non-empty list of items", "input")
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise InvalidRequest("instructions: expected a string", "instructions")
        messages.append({"role": "system", "content": instructions})
    continue_final = False
    for index, item in enumerate(items):
        param = f"input.{index}"
        if not isinstance(item, Mapping):
            raise InvalidRequest(f"{param}: expected an object", param)
        if item.get("type", "message") != "message":
            raise InvalidRequest(f"{param}.type: only message items are supported", param)
        messages.append({"role": item.get("role"), "content": _content(item, param)})
        if item.get("status") == "in_progress":
            if not (index == len(items) - 1 and item.get("role") == "assistant"):
                raise InvalidRequest(
                    f"{param}.status: only the last, assistant message may be in_progress",
                    param,
                )
            continue_final = True
    return messages, continue_final


def _content(item: Mapping[str, Any], param: str) -> Any:
    """A message's content as the chat wire has it: a string, or a list of text blocks."""
    content = item.get("content")
    if not isinstance(content, list):
        return content
    parts = []
    for n, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind not in ("input_text", "output_text", "text"):
            raise InvalidRequest(
                f"{param}.content.{n}: expected an input_text or output_text part", param
            )
        parts.append({"type": "text", "text": part.get("text")})
    return parts


class ResponsesWire(OpenAIWire):
    """OpenAI's errors and prompt cache, another request and stream."""

    name = "responses"

    def parse(self, body: Mapping[str, Any]) -> Generation:
        model = model_of(body)
        messages, continue_final = _items_to_messages(body)
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
        )

    def stream_format(self, request: Generation, usage: InputUsage) -> StreamFormat:
        return ResponsesStream(request, usage, obfuscation=request.obfuscation)

    def body(
        self, request: Generation, output: Output, finish: Finish | None, usage: InputUsage
    ) -> dict[str, Any]:
        items: list[dict[str, Any]] = []
        if output.reasoning:
            items.append(reasoning_item(new_id("rs_"), output.reasoning, done=True))
        items.append(message_item(new_id("msg_"), request.echo + output.text, "completed"))
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
