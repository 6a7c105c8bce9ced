"""The Anthropic Messages wire.

``message_start`` carries the input usage (``cache_read_input_tokens`` and
``cache_creation_input_tokens`` for the prompt cache); ``content_block_delta`` events carry
the text (``text_delta``); ``message_delta`` carries the stop reason and the cumulative
``output_tokens``; ``message_stop`` ends the stream. ``ping`` events keep it alive. An
``event: error`` (``overloaded_error``) behind HTTP 200 is a cut. Only text blocks are
resumable: a cut inside a tool-use or thinking block is not continued mid-block.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Literal

import httpx
from httpx_sse import ServerSentEvent

from resumeq.core.continuation import ChatMessage, RequestPlan
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
from resumeq.providers.counts import int_or_none

API_VERSION = "2023-06-01"
_CACHE = {"type": "ephemeral"}
#: Deltas of output that is not text, and the field holding it: billed, never resumed.
_OUTPUT: dict[str, tuple[Literal["reasoning", "other"], str]] = {
    "thinking_delta": ("reasoning", "thinking"),
    "input_json_delta": ("other", "partial_json"),
}
#: Deltas that carry no output tokens of their own: progress, not a stall.
_PROGRESS = ("signature_delta", "citations_delta")


class AnthropicStream(ProviderStream):
    def __init__(self, response: httpx.Response, *, stall_timeout_s: float) -> None:
        super().__init__(response, stall_timeout_s=stall_timeout_s)
        self._stopped = False
        #: Set when a non-text block (tool use, thinking) is open: not resumable mid-block.
        self.in_non_text_block = False

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
        self.in_non_text_block = not (isinstance(block, dict) and block.get("type") == "text")
        return iter(())

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
            yield OutputDelta(channel, self._unicode(value, channel), 1, exact=False)
        elif kind in _PROGRESS:
            self._note_progress()

    def _block_stop(self, data: dict[str, Any]) -> Iterator[StreamEvent]:
        self.in_non_text_block = False
        return iter(())

    def _message_delta(self, data: dict[str, Any]) -> Iterator[StreamEvent]:
        delta = data.get("delta")
        reason = delta.get("stop_reason") if isinstance(delta, dict) else None
        if reason is not None and not isinstance(reason, str):
            raise MalformedChunk("stop_reason is not a string")
        if reason:
            self.finish_reason = reason
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


def _content(m: ChatMessage) -> str | list[dict[str, Any]]:
    if not m.cache:
        return m.content
    return [{"type": "text", "text": m.content, "cache_control": _CACHE}]


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
            "messages": [
                {"role": m.role, "content": _content(m)}
                for m in plan.messages
                if m.role != "system"
            ],
            "stream": True,
        }
        if system:
            blocks: list[dict[str, Any]] = [{"type": "text", "text": m.content} for m in system]
            if self.profile.cache_prompt:
                blocks[-1]["cache_control"] = _CACHE
            body["system"] = blocks
        params = plan.params
        if params.temperature is not None:
            body["temperature"] = min(params.temperature, 1.0)
        if params.top_p is not None:
            body["top_p"] = params.top_p
        if params.stop:
            body["stop_sequences"] = list(params.stop)
        body.update(plan.extra_body)
        return body
