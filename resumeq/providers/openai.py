"""The OpenAI Chat Completions wire: OpenAI, vLLM, llama.cpp, Mistral, DeepSeek and other
compatible servers.

Streaming chunks carry ``choices[0].delta.content`` and, at the end, ``finish_reason``;
``stream_options.include_usage`` adds a last chunk with empty ``choices`` and the usage
(``prompt_tokens_details.cached_tokens`` for the prompt cache), and vLLM's
``continuous_usage_stats`` puts the cumulative usage in every chunk — the only way an
OpenAI-wire stream that is cut still has exact counts. ``data: [DONE]`` ends the stream.
An in-band ``{"error": ...}`` chunk is a cut.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

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
from resumeq.providers.counts import int_or_none

#: Delta fields of reasoning text: vLLM's newer ``reasoning`` and older ``reasoning_content``
#: (also DeepSeek's).
_REASONING = ("reasoning_content", "reasoning")
#: Delta fields that are output but neither text nor reasoning.
_OTHER_OUTPUT = ("tool_calls", "function_call", "refusal")

log = logging.getLogger(__name__)


def usage_of(raw: Any) -> Usage | None:
    if not isinstance(raw, dict):
        return None
    details = raw.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    out_details = raw.get("completion_tokens_details")
    reasoning = out_details.get("reasoning_tokens") if isinstance(out_details, dict) else None
    return Usage(
        input_tokens=int_or_none(raw.get("prompt_tokens")),
        cached_input_tokens=int_or_none(cached),
        output_tokens=int_or_none(raw.get("completion_tokens")),
        reasoning_tokens=int_or_none(reasoning) or int_or_none(raw.get("reasoning_tokens")),
    )


@dataclass
class _Parts:
    """What one chunk's choice 0 carries."""

    text: str = ""
    reasoning: str = ""
    other: str = ""

    @property
    def empty(self) -> bool:
        return not (self.text or self.reasoning or self.other)


class OpenAIStream(ProviderStream):
    def __init__(self, response: httpx.Response, *, stall_timeout_s: float) -> None:
        super().__init__(response, stall_timeout_s=stall_timeout_s)
        self._done = False
        #: Output tokens already attributed to deltas under continuous usage.
        self._counted = 0
        #: Whether the cumulative usage in the chunks can be believed (see ``_tokens``).
        self._usage_trusted = True
        self._content_chunks = 0

    def _on_event(self, sse: ServerSentEvent) -> Iterator[StreamEvent]:
        if sse.data.strip() == "[DONE]":
            self._done = True
            return
        chunk = json_object(sse)
        if "error" in chunk:
            message, kind = error_details(sse.data)
            raise InBandError(f"in-band error: {message}", error_type=kind, body=sse.data[:4096])
        usage = usage_of(chunk.get("usage"))
        final = chunk.get("choices") == []  # include_usage's last chunk: totals only
        parts = self._choice_parts(chunk, sse.data)
        if not final:
            yield from self._deltas(parts, usage)
        if usage is not None:
            self.usage = usage
            yield usage

    def _choice_parts(self, chunk: dict[str, Any], raw: str) -> _Parts:
        """What choice 0 of a chunk carries; notes its finish reason."""
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            raise MalformedChunk(f"chunk without a choices list: {raw[:120]!r}")
        parts = _Parts()
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                raise MalformedChunk(f"delta is not an object: {raw[:120]!r}")
            parts.text += self._unicode(_string(delta, "content", raw))
            reasoning = "".join(_string(delta, key, raw) for key in _REASONING)
            parts.reasoning += self._unicode(reasoning, "reasoning")
            for key in _OTHER_OUTPUT:
                value = delta.get(key)
                if value:
                    parts.other += value if isinstance(value, str) else json.dumps(value)
            reason = choice.get("finish_reason")
            if reason is not None and not isinstance(reason, str):
                raise MalformedChunk(f"finish_reason is not a string: {raw[:120]!r}")
            if reason:
                self.finish_reason = reason
        return parts

    def _deltas(self, parts: _Parts, usage: Usage | None) -> Iterator[StreamEvent]:
        tokens, exact = self._tokens(parts, usage)
        if parts.text:
            yield TextDelta(parts.text, tokens, exact)
            tokens = 0
        if parts.reasoning:
            yield OutputDelta("reasoning", parts.reasoning, tokens if exact else 1, exact)
            tokens = 0
        if parts.other or tokens:
            # Tool-call output, or tokens counted in a chunk without content (the end token).
            yield OutputDelta(
                "other", parts.other, tokens if exact else int(bool(parts.other)), exact
            )

    def _tokens(self, parts: _Parts, usage: Usage | None) -> tuple[int, bool]:
        """The chunk's output tokens: the step of the cumulative usage (vLLM's continuous
        usage), or one for a chunk with content (every such chunk carries at least one).

        Continuous usage is believed while it moves with the content: a text chunk that
        adds no token is allowed once, first (an engine's echo of the prefill, which is no
        output); after that the counts are estimates for the rest of the stream."""
        content = not parts.empty
        cumulative = usage.output_tokens if usage is not None else None
        if cumulative is None or not self._usage_trusted:
            return int(content), False
        if cumulative < self._counted:
            raise MalformedChunk(f"cumulative completion_tokens went down to {cumulative}")
        step = cumulative - self._counted
        if parts.text and step == 0 and self._content_chunks > 0:
            self._usage_trusted = False
            log.warning(
                "continuous usage counted no token for a text chunk: counting by estimate "
                "for the rest of this stream"
            )
            return 1, False
        self._content_chunks += int(content)
        self._counted = cumulative
        return step, True

    def _complete(self) -> bool:
        return self._done


def _string(delta: dict[str, Any], key: str, raw: str) -> str:
    value = delta.get(key)
    if value is not None and not isinstance(value, str):
        raise MalformedChunk(f"delta {key} is not a string: {raw[:120]!r}")
    return value or ""


class OpenAIClient(ProviderClient):
    endpoint = "/chat/completions"
    stream_class: type[ProviderStream] = OpenAIStream

    def headers(self) -> dict[str, str]:
        key = self.api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    def body(self, plan: RequestPlan) -> dict[str, Any]:
        messages: list[dict[str, Any]] = []
        for m in plan.messages:
            msg: dict[str, Any] = {"role": m.role, "content": m.content}
            if m.prefix:
                msg["prefix"] = True
            messages.append(msg)
        stream_options: dict[str, bool] = {"include_usage": True}
        if self.profile.asks_continuous_usage:
            stream_options["continuous_usage_stats"] = True
        body: dict[str, Any] = {
            "model": plan.model,
            "messages": messages,
            "stream": True,
            "stream_options": stream_options,
            "max_tokens": plan.max_tokens,
        }
        params = plan.params
        if params.temperature is not None:
            body["temperature"] = params.temperature
        if params.top_p is not None:
            body["top_p"] = params.top_p
        if params.stop:
            body["stop"] = list(params.stop)
        if params.seed is not None:
            body["seed"] = params.seed
        body.update(plan.extra_body)
        return body
