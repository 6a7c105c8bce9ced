"""The Anthropic Messages wire.

``message_start`` carries the input usage (``cache_read_input_tokens`` and
``cache_creation_input_tokens`` for the prompt cache); ``content_block_delta`` events carry
the text (``text_delta``); ``message_delta`` carries the stop reason and the cumulative
``output_tokens``; ``message_stop`` ends the stream. ``ping`` events keep it alive. An
``event: error`` (``overloaded_error``) behind HTTP 200 is a cut.

A ``tool_use`` block is a tool call: ``content_block_start`` names it (its ``toolu_`` id
and name), its ``input_json_delta`` pieces are its arguments' JSON text, its
``content_block_stop`` ends it. The stop reason ``tool_use`` is the finish ``tool_calls``,
``refusal`` stays ``refusal``. A thinking block (or a server tool's) is not resumable: a cut
inside one is not continued mid-block.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any, Literal

import httpx
from httpx_sse import ServerSentEvent

from resumeq.core.continuation import RequestPlan
from resumeq.core.errors import InBandError, MalformedChunk
from resumeq.providers.base import (
    OutputDelta,
    ProviderClient,
    ProviderStream,
    StreamEvent,
    TextDelta,
    Usage,
    error_details,
    json_object,
)
from resumeq.providers.calls import StreamedCall, ToolCalls
from resumeq.providers.counts import int_or_none
from resumeq.providers.shapes import CACHE, anthropic_messages, anthropic_shape

API_VERSION = "2023-06-01"
#: Deltas of output that is not text, and the field holding it: billed, never resumed (an
#: ``input_json_delta`` of a ``tool_use`` block is a tool call's, any other a server tool's).
_OUTPUT: dict[str, tuple[Literal["reasoning", "other"], str]] = {
    "thinking_delta": ("reasoning", "thinking"),
    "input_json_delta": ("other", "partial_json"),
}
#: Stop reasons under the name the other wires give them.
_FINISH = {"tool_use": "tool_calls"}
#: Deltas that carry no output tokens of their own: progress, not a stall.
_PROGRESS = ("signature_delta", "citations_delta")


class AnthropicStream(ProviderStream):
    def __init__(self, response: httpx.Response, *, stall_timeout_s: float) -> None:
        super().__init__(response, stall_timeout_s=stall_timeout_s)
        self._stopped = False
        #: Set when a block that is neither text nor a tool call (thinking, a server tool's)
        #: is open: not resumable mid-block.
        self.in_non_text_block = False
        self._calls = ToolCalls(self._unicode, self._held)
        #: The open ``tool_use`` block's call.
        self._tool: StreamedCall | None = None

    def _on_event(self, sse: ServerSentEvent) -> Iterator[StreamEvent]:
        if sse.event == "error":
            message, err_type = error_details(sse.data)
            raise InBandError(
                f"in-band error: {message}", error_type=err_type, body=sse.data[:4096]
            )
        handler = self._handlers.get(sse.event)
        if handler is None:
            return  # ``ping``, and event types added after this client: ignored
        data = json_object(sse)
        if data.get("type") == "error":
            message, err_type = error_details(sse.data)
            raise InBandError(
                f"in-band error: {message}", error_type=err_type, body=sse.data[:4096]
            )
        yield from handler(data)

    @property
    def _handlers(self) -> dict[str, Callable[[dict[str, Any]], Iterator[StreamEvent]]]:
        return {
            "message_start": self._message_start,
            "content_block_start": self._block_start,
            "content_block_delta": self._block_delta,
            "content_block_stop": self._block_stop,
            "message_delta": self._message_delta,
            "message_stop": self._message_stop,
        }

    def _message_start(self, data: dict[str, Any]) -> Iterator[StreamEvent]:
        message = data.get("message")
        if not isinstance(message, dict):
            raise MalformedChunk("message_start without a message")
        yield self._usage(message.get("usage"), merge=False)

    def _block_start(self, data: dict[str, Any]) -> Iterator[StreamEvent]:
        block = data.get("content_block")
        kind = block.get("type") if isinstance(block, dict) else None
        self.in_non_text_block = kind not in ("text", "tool_use")
        self._tool = None
        if isinstance(block, dict) and kind == "tool_use":
            call_id, name = block.get("id"), block.get("name")
            if not (isinstance(call_id, str) and call_id and isinstance(name, str) and name):
                raise MalformedChunk("a tool_use block without its id and name")
            arguments = _input_text(block.get("input"))
            delta = self._calls.start(
                (), call_id, name, arguments, tokens=int(bool(arguments)), exact=False
            )
            self._tool = self._calls[delta.index]
            yield delta

    def _block_delta(self, data: dict[str, Any]) -> Iterator[StreamEvent]:
        delta = data.get("delta")
        if not isinstance(delta, dict):
            raise MalformedChunk("content_block_delta without a delta")
        kind = delta.get("type")
        if kind == "text_delta":
            text = delta.get("text")
            if not isinstance(text, str):
                raise MalformedChunk("text_delta without text")
            text = self._unicode(text)
            if text:
                # A delta carries one token or several: one is what is known for sure.
                yield TextDelta(text, 1, exact=False)
        elif kind in _OUTPUT:
            channel, field = _OUTPUT[kind]
            value = delta.get(field)
            if not isinstance(value, str):
                raise MalformedChunk(f"{kind} without {field}")
            if kind == "input_json_delta" and self._tool is not None:
                yield self._calls.piece(self._tool, value, tokens=1, exact=False)
            elif kind == "input_json_delta" and not self.in_non_text_block:
                raise MalformedChunk("an input_json_delta outside a tool_use block")
            else:
                yield OutputDelta(channel, self._unicode(value, channel), 1, exact=False)
        elif kind in _PROGRESS:
            self._note_progress()

    def _block_stop(self, data: dict[str, Any]) -> Iterator[StreamEvent]:
        self.in_non_text_block = False
        call, self._tool = self._tool, None
        if call is not None:
            yield from self._calls.end(call)

    def _message_delta(self, data: dict[str, Any]) -> Iterator[StreamEvent]:
        delta = data.get("delta")
        reason = delta.get("stop_reason") if isinstance(delta, dict) else None
        if reason is not None and not isinstance(reason, str):
            raise MalformedChunk("stop_reason is not a string")
        if reason:
            self.finish_reason = _FINISH.get(reason, reason)
        yield self._usage(data.get("usage"), merge=True)

    def _message_stop(self, data: dict[str, Any]) -> Iterator[StreamEvent]:
        self._stopped = True
        return iter(())

    def _usage(self, raw: Any, *, merge: bool) -> Usage:
        if not isinstance(raw, dict):
            raise MalformedChunk("usage is not an object")
        old = self.usage if merge else Usage()

        def pick(key: str, before: int | None) -> int | None:
            value = int_or_none(raw.get(key))
            return before if value is None else value

        self.usage = Usage(
            input_tokens=pick("input_tokens", old.input_tokens),
            cached_input_tokens=pick("cache_read_input_tokens", old.cached_input_tokens),
            cache_creation_input_tokens=pick(
                "cache_creation_input_tokens", old.cache_creation_input_tokens
            ),
            output_tokens=int_or_none(raw.get("output_tokens")),
        )
        return self.usage

    def _complete(self) -> bool:
        return self._stopped


def _input_text(value: Any) -> str:
    """A ``tool_use`` block's ``input`` at its start as arguments' text: ``{}`` (Anthropic's,
    the input comes in pieces) is none yet; a server that sends it whole sends its JSON."""
    if value is None or value == {}:
        return ""
    if not isinstance(value, dict):
        raise MalformedChunk("a tool_use block whose input is not an object")
    return json.dumps(value, ensure_ascii=False)


class AnthropicClient(ProviderClient):
    endpoint = "/v1/messages"
    stream_class = AnthropicStream

    def headers(self) -> dict[str, str]:
        headers = {"anthropic-version": API_VERSION}
        key = self.api_key
        if key:
            headers["x-api-key"] = key
        return headers

    def body(self, plan: RequestPlan) -> dict[str, Any]:
        system = [m for m in plan.messages if m.role == "system"]
        body: dict[str, Any] = {
            "model": plan.model,
            "max_tokens": plan.max_tokens,
            "messages": anthropic_messages(plan.messages),
            "stream": True,
        }
        if system:
            blocks: list[dict[str, Any]] = [{"type": "text", "text": m.content} for m in system]
            if self.profile.cache_prompt:
                blocks[-1]["cache_control"] = CACHE
            body["system"] = blocks
        params = plan.params
        if params.temperature is not None:
            body["temperature"] = min(params.temperature, 1.0)
        if params.top_p is not None:
            body["top_p"] = params.top_p
        if params.stop:
            body["stop_sequences"] = list(params.stop)
        body.update(anthropic_shape(plan.shape))
        body.update(plan.extra_body)
        return body
