"""OpenAI Chat Completions (``POST /v1/chat/completions``), with the vLLM and llama.cpp extras.

Streams are ``data: {chunk}`` events: a first chunk with ``delta.role``, one chunk per token
(reasoning first, as vLLM's ``delta.reasoning_content``, then ``delta.content``), a chunk with
``finish_reason``, with ``include_usage`` a chunk with empty ``choices`` and the usage, then
``data: [DONE]``. With ``include_usage`` every other chunk has ``"usage": null``, or (vLLM,
``continuous_usage_stats`` too) the usage so far. ``completion_tokens`` counts reasoning,
``completion_tokens_details.reasoning_tokens`` says how much. The in-band error is vLLM's:
``data: {"error": {...}}`` followed by ``data: [DONE]``. How the engine echoes a prefill is
:mod:`resumeq.fake.engine`'s.

Tool calls (:mod:`resumeq.fake.answer`) follow the text: a call's first chunk is
``delta.tool_calls: [{"index": i, "id": "call_…", "type": "function", "function": {"name",
"arguments": ""}}]`` (no token), then one ``{"index": i, "function": {"arguments": piece}}``
chunk per token; ``finish_reason`` is ``tool_calls``. A non-streamed answer has
``message.tool_calls`` and ``content: null`` when there is no text. A refusal streams
``delta.refusal`` pieces (the first chunk has ``content: null, refusal: ""``) and finishes
``stop``; non-streamed, ``content`` is null and ``refusal`` holds it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from resumeq.fake.conversation import InvalidRequest, conversation_of
from resumeq.fake.plan import Finish, Part, Plan, PlannedCall, Segment
from resumeq.fake.prompt import PromptCache, layout
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

FINGERPRINT = "fp_resumeq_fake"
#: ``finish_reason`` for each way an answer ends (a refusal ends ``stop``).
FINISH_REASONS: dict[Finish, str] = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "refusal": "stop",
}

_ERRORS: dict[int, tuple[str, str | None, str]] = {
    400: ("invalid_request_error", None, "Invalid request."),
    401: ("invalid_request_error", "invalid_api_key", "Incorrect API key provided."),
    403: ("permission_error", None, "You are not allowed to use this model."),
    404: ("invalid_request_error", "model_not_found", "The model does not exist."),
    429: ("requests", "rate_limit_exceeded", "Rate limit reached. Please try again later."),
    500: ("server_error", None, "The server had an error while processing your request."),
    503: ("server_error", None, "The server is overloaded or not ready yet."),
}


def usage_json(
    usage: InputUsage, completion: int, reasoning: int = 0, *, details: bool = True
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "prompt_tokens": usage.total,
        "completion_tokens": completion,
        "total_tokens": usage.total + completion,
    }
    if details:
        body["prompt_tokens_details"] = {"cached_tokens": usage.cache_read, "audio_tokens": 0}
        body["completion_tokens_details"] = {
            "reasoning_tokens": reasoning,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        }
    return body


def tool_call_json(call: PlannedCall) -> dict[str, Any]:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


class OpenAIStream:
    def __init__(self, request: Generation, usage: InputUsage) -> None:
        head = {
            "id": new_id("chatcmpl-"),
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": request.model,
            "system_fingerprint": FINGERPRINT,
        }
        self._head = dumps(head)[:-1]
        self._request = request
        self._usage = usage
        self._echo = request.echo
        self._emitted = 0

    def _chunk(self, choices: str, emitted: int) -> bytes:
        if self._request.continuous_usage:
            usage = ',"usage":' + dumps(usage_json(self._usage, emitted, details=False))
        elif self._request.include_usage:
            usage = ',"usage":null'
        else:
            usage = ""
        return f'data: {self._head},"choices":{choices}{usage}}}\n\n'.encode()

    def _delta(self, delta: str, emitted: int) -> bytes:
        return self._chunk(
            f'[{{"index":0,"delta":{delta},"logprobs":null,"finish_reason":null}}]', emitted
        )

    def opening(self, completion: Plan) -> list[bytes]:
        texts = bool(completion.pieces or not completion.calls or self._echo)
        delta: dict[str, Any] = {"role": "assistant", "content": "", "refusal": None}
        if completion.refusal:
            delta = {"role": "assistant", "content": None, "refusal": ""}
        elif not texts:
            delta["content"] = None
        choices = f'[{{"index":0,"delta":{dumps(delta)},"logprobs":null,"finish_reason":null}}]'
        return [self._chunk(choices, 0)]

    def group(self, part: Part, emitted: int) -> int:
        return 1

    def start(self, segment: Segment) -> list[bytes]:
        call = segment.call
        if call is None:
            return []
        head = {
            "index": call.index,
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        return [*self._flush_echo(), self._delta(dumps({"tool_calls": [head]}), self._emitted)]

    def delta(self, segment: Segment, text: str, emitted: int) -> bytes:
        self._emitted = emitted
        if segment.call is not None:
            piece = {"index": segment.call.index, "function": {"arguments": text}}
            return self._delta(dumps({"tool_calls": [piece]}), emitted)
        if segment.part == "reasoning":
            return self._delta('{"reasoning_content":' + dumps(text) + "}", emitted)
        if segment.part == "refusal":
            return self._delta('{"refusal":' + dumps(text) + "}", emitted)
        text, self._echo = self._echo + text, ""
        return self._delta('{"content":' + dumps(text) + "}", emitted)

    def stop(self, segment: Segment) -> list[bytes]:
        return self._flush_echo() if segment.part == "text" else []

    def _flush_echo(self) -> list[bytes]:
        """An echo that found no generated token to go with goes out alone."""
        if not self._echo:
            return []
        echo, self._echo = self._echo, ""
        return [self._delta('{"content":' + dumps(echo) + "}", self._emitted)]

    def closing(self, finish: Finish, emitted: int, reasoning: int) -> list[bytes]:
        reason = FINISH_REASONS[finish]
        choices = f'[{{"index":0,"delta":{{}},"logprobs":null,"finish_reason":"{reason}"}}]'
        events = [self._chunk(choices, emitted)]
        if self._request.include_usage:
            usage = dumps(usage_json(self._usage, emitted, reasoning))
            events.append(f'data: {self._head},"choices":[],"usage":{usage}}}\n\n'.encode())
        events.append(b"data: [DONE]\n\n")
        return events

    def error(self) -> list[bytes]:
        error = {
            "message": "The server is overloaded, please try again later.",
            "type": "server_error",
            "param": None,
            "code": 503,
        }
        return [f"data: {dumps({'error': error})}\n\n".encode(), b"data: [DONE]\n\n"]

    def malformed(self) -> bytes:
        whole = self._delta('{"content":" interrupted"}', 0).rstrip(b"\n")
        return whole[: len(whole) // 2] + b"\n\n"


class OpenAIWire:
    name = "openai"
    overload_status = 503

    def parse(self, body: Mapping[str, Any]) -> Generation:
        model = model_of(body)
        conversation = conversation_of(body.get("messages"))
        stream = body.get("stream") is True
        options = body.get("stream_options")
        if options is not None and not stream:
            raise InvalidRequest(
                "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                "stream_options",
            )
        options = options if isinstance(options, Mapping) else {}
        include_usage = options.get("include_usage") is True
        if body.get("n", 1) not in (1, None):
            raise InvalidRequest("n: only one choice is supported", "n")
        continue_final = body.get("continue_final_message") is True
        if continue_final and body.get("add_generation_prompt", True) is not False:
            raise InvalidRequest(
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                "continue_final_message",
            )
        last = conversation.messages[-1]
        if last.prefix and last.role != "assistant":
            raise InvalidRequest("prefix: only the last assistant message may set it", "messages")
        return Generation(
            conversation=conversation,
            continuation=conversation.continuation(continue_final_message=continue_final),
            model=model,
            max_tokens=positive_int(body, "max_completion_tokens", "max_tokens"),
            stream=stream,
            include_usage=include_usage,
            continuous_usage=include_usage and options.get("continuous_usage_stats") is True,
            shape=shape_of("openai", body),
        )

    def input_usage(self, cache: PromptCache, request: Generation) -> InputUsage:
        prompt = layout(request.conversation)
        return InputUsage(len(prompt), cache_read=cache.openai(request.model, prompt).read)

    def stream_format(self, request: Generation, usage: InputUsage) -> StreamFormat:
        return OpenAIStream(request, usage)

    def body(
        self, request: Generation, output: Output, finish: Finish | None, usage: InputUsage
    ) -> dict[str, Any]:
        content: str | None = request.echo + output.text
        if output.refusal or (output.calls and not content):
            content = None
        message: dict[str, Any] = {
            "role": "assistant",
            "content": content,
            "refusal": output.text if output.refusal else None,
            "annotations": [],
        }
        if output.reasoning:
            message["reasoning_content"] = output.reasoning
        if output.calls:
            message["tool_calls"] = [tool_call_json(call) for call in output.calls]
        reason = FINISH_REASONS[finish] if finish is not None else None
        return {
            "id": new_id("chatcmpl-"),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.model,
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": reason}
            ],
            "usage": usage_json(usage, output.tokens, output.reasoning_tokens),
            "service_tier": "default",
            "system_fingerprint": FINGERPRINT,
        }

    def error(
        self, status: int, message: str | None = None, param: str | None = None
    ) -> ErrorReply:
        default_type = "server_error" if status >= 500 else "invalid_request_error"
        kind, code, default = _ERRORS.get(status, (default_type, None, f"Error {status}."))
        error = {"message": message or default, "type": kind, "param": param, "code": code}
        return ErrorReply(status, {"error": error}, {"x-request-id": new_id("req_")})
