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

from collections.abc import Iterator
from typing import Any

import httpx
from httpx_sse import ServerSentEvent

from resumeq.continuation import RequestPlan
from resumeq.errors import InBandError, MalformedChunk, ProviderUnavailable
from resumeq.providers.base import (
    ProviderClient,
    ProviderStream,
    StreamEvent,
    TextDelta,
    Usage,
    error_details,
    int_or_none,
    json_object,
)

#: Delta fields that are output but not text (reasoning, tool calls): progress, not a stall.
_OTHER_PROGRESS = ("reasoning_content", "reasoning", "tool_calls", "function_call", "refusal")


def usage_of(raw: Any) -> Usage | None:
    if not isinstance(raw, dict):
        return None
    details = raw.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Usage(
        input_tokens=int_or_none(raw.get("prompt_tokens")),
        cached_input_tokens=int_or_none(cached),
        output_tokens=int_or_none(raw.get("completion_tokens")),
    )


class OpenAIStream(ProviderStream):
    def __init__(self, response: httpx.Response, *, stall_timeout_s: float) -> None:
        super().__init__(response, stall_timeout_s=stall_timeout_s)
        self._done = False
        self._counted = 0  # output tokens already attributed to deltas, when exact

    def _on_event(self, sse: ServerSentEvent) -> Iterator[StreamEvent]:
        if sse.data.strip() == "[DONE]":
            self._done = True
            return
        chunk = json_object(sse)
        if "error" in chunk:
            message, kind = error_details(sse.data)
            raise InBandError(f"in-band error: {message}", error_type=kind, body=sse.data[:4096])
        usage = usage_of(chunk.get("usage"))
        text = self._choice_text(chunk, sse.data)
        if text:
            yield self._delta(text, usage)
        if usage is not None:
            self.usage = usage
            yield usage

    def _choice_text(self, chunk: dict[str, Any], raw: str) -> str:
        """The text of choice 0 in a chunk; notes its finish reason."""
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            raise MalformedChunk(f"chunk without a choices list: {raw[:120]!r}")
        text = ""
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                raise MalformedChunk(f"delta is not an object: {raw[:120]!r}")
            content = delta.get("content")
            if content is not None and not isinstance(content, str):
                raise MalformedChunk(f"delta content is not a string: {raw[:120]!r}")
            text += content or ""
            if any(delta.get(key) for key in _OTHER_PROGRESS):
                self._note_progress()
            reason = choice.get("finish_reason")
            if reason is not None and not isinstance(reason, str):
                raise MalformedChunk(f"finish_reason is not a string: {raw[:120]!r}")
            if reason:
                self.finish_reason = reason
        return text

    def _delta(self, text: str, usage: Usage | None) -> TextDelta:
        if usage is not None and usage.output_tokens is not None:
            # Continuous usage (vLLM): the cumulative count includes this chunk.
            if usage.output_tokens < self._counted:
                raise MalformedChunk(
                    f"cumulative completion_tokens went down to {usage.output_tokens}"
                )
            tokens = usage.output_tokens - self._counted
            self._counted = usage.output_tokens
            return TextDelta(text, tokens, exact=True)
        return TextDelta(text, 1, exact=False)

    def _complete(self) -> bool:
        return self._done


class OpenAIClient(ProviderClient):
    endpoint = "/chat/completions"
    stream_class = OpenAIStream

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
        if self.profile.counting == "usage":
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

    def count_text_tokens(self, text: str, *, model: str) -> int:
        """vLLM's ``/tokenize``, at the server root (the base URL without ``/v1``)."""
        root = self.profile.base_url.removesuffix("/v1")
        data = self.post_json(
            f"{root}/tokenize", {"model": model, "prompt": text, "add_special_tokens": False}
        )
        count = data.get("count")
        if not isinstance(count, int):
            tokens = data.get("tokens")
            if not isinstance(tokens, list):
                raise ProviderUnavailable("/tokenize answered neither count nor tokens")
            count = len(tokens)
        return count
