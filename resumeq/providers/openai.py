"""The OpenAI Chat Completions wire: OpenAI, vLLM, llama.cpp, Mistral, DeepSeek and other
compatible servers.

Streaming chunks carry ``choices[0].delta.content`` and, at the end, ``finish_reason``;
``stream_options.include_usage`` adds a last chunk with empty ``choices`` and the usage
(``prompt_tokens_details.cached_tokens`` for the prompt cache), and vLLM's
``continuous_usage_stats`` puts the cumulative usage in every chunk — the only way an
OpenAI-wire stream that is cut still has exact counts. ``data: [DONE]`` ends the stream.
An in-band ``{"error": ...}`` chunk is a cut.

Tool calls come as ``delta.tool_calls`` pieces, each naming its call by ``index``: the
first piece of a call has its ``id`` and ``function.name``, the next ones more of
``function.arguments``; one chunk may carry pieces of several calls. A call is whole when a
piece of a higher index comes, when text comes after it, or at the finish reason
(``tool_calls``). ``delta.refusal`` is the model's refusal, as text of its own.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
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
from resumeq.providers.calls import ToolCalls
from resumeq.providers.counts import int_or_none
from resumeq.providers.shapes import chat_message, chat_shape

#: Delta fields of reasoning text: vLLM's newer ``reasoning`` and older ``reasoning_content``
#: (also DeepSeek's).
_REASONING = ("reasoning_content", "reasoning")

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


@dataclass(frozen=True)
class _Piece:
    """One ``tool_calls`` piece: the call's index on the wire, and what it carries."""

    index: int
    id: str | None
    name: str | None
    arguments: str


@dataclass
class _Parts:
    """What one chunk's choice 0 carries."""

    text: str = ""
    reasoning: str = ""
    refusal: str = ""
    #: The deprecated ``function_call``: billed output, not a call this client follows.
    other: str = ""
    calls: list[_Piece] = field(default_factory=list)
    finished: bool = False

    @property
    def empty(self) -> bool:
        return not (self.text or self.reasoning or self.refusal or self.other or self.calls)


class _Tokens:
    """A chunk's output tokens over its events, as counted before tool calls: exact, the
    step all on the chunk's first event; estimated, one for its text, one for its reasoning
    and one for the rest of its output (refusal, tool calls) together."""

    def __init__(self, tokens: int, exact: bool) -> None:
        self.left = tokens
        self.exact = exact

    def take(self, estimate: int = 1) -> int:
        out = self.left if self.exact else estimate
        self.left = 0
        return out


class OpenAIStream(ProviderStream):
    def __init__(self, response: httpx.Response, *, stall_timeout_s: float) -> None:
        super().__init__(response, stall_timeout_s=stall_timeout_s)
        self._done = False
        #: Output tokens already attributed to deltas under continuous usage.
        self._counted = 0
        #: Whether the cumulative usage in the chunks can be believed (see ``_tokens``).
        self._usage_trusted = True
        self._content_chunks = 0
        self._calls = ToolCalls(self._unicode, self._held)
        #: Each call's index on the wire, by its number in this answer.
        self._wire: dict[int, int] = {}

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
            parts.refusal += self._unicode(_string(delta, "refusal", raw), "refusal")
            legacy = delta.get("function_call")
            if legacy:
                parts.other += legacy if isinstance(legacy, str) else json.dumps(legacy)
            parts.calls += self._pieces(delta.get("tool_calls"), raw)
            reason = choice.get("finish_reason")
            if reason is not None and not isinstance(reason, str):
                raise MalformedChunk(f"finish_reason is not a string: {raw[:120]!r}")
            if reason:
                self.finish_reason = reason
                parts.finished = True
        return parts

    def _pieces(self, raw_calls: Any, raw: str) -> list[_Piece]:
        """A delta's ``tool_calls``, checked before anything of the chunk is taken: each
        names its call by an int index; a call not seen before starts with its id and name;
        arguments are text."""
        if raw_calls is None:
            return []
        if not isinstance(raw_calls, list):
            raise MalformedChunk(f"tool_calls is not a list: {raw[:120]!r}")
        pieces = [_piece(p, raw) for p in raw_calls]
        starting: set[int] = set()
        for p in pieces:
            call = self._calls.find(p.index)
            if call is not None and call.ended:
                raise MalformedChunk(f"a piece of tool call {p.index} after its end: {raw[:120]!r}")
            if call is None and p.index not in starting:
                if not (p.id and p.name):
                    raise MalformedChunk(
                        f"tool call {p.index} starts without its id and name: {raw[:120]!r}"
                    )
                starting.add(p.index)
        return pieces

    def _deltas(self, parts: _Parts, usage: Usage | None) -> Iterator[StreamEvent]:
        tokens, exact = self._tokens(parts, usage)
        share = _Tokens(tokens, exact)
        if parts.text:
            yield from self._calls.end_open()  # text after a call: the call is whole
            yield TextDelta(parts.text, share.take(), exact)
        if parts.reasoning:
            yield OutputDelta("reasoning", parts.reasoning, share.take(), exact)
        other = 1  # the estimate of the rest of the chunk's output, on its first event
        if parts.refusal:
            yield OutputDelta("refusal", parts.refusal, share.take(other), exact)
            other = 0
        for piece in parts.calls:
            yield from self._piece(piece, share.take(other), exact)
            other = 0
        if parts.other or share.left:
            # The deprecated function_call, or tokens counted in a chunk without content
            # (the end token).
            yield OutputDelta("other", parts.other, share.take(int(bool(parts.other))), exact)
        if parts.finished:
            yield from self._calls.end_open()

    def _piece(self, piece: _Piece, tokens: int, exact: bool) -> Iterator[StreamEvent]:
        for earlier in self._calls.open():
            if self._wire[earlier.index] < piece.index:
                yield from self._calls.end(earlier)  # a piece of a later call: this one is whole
        call = self._calls.find(piece.index)
        if call is None:
            if piece.id is None or piece.name is None:
                raise MalformedChunk(f"tool call {piece.index} starts without its id and name")
            delta = self._calls.start(
                (piece.index,), piece.id, piece.name, piece.arguments, tokens=tokens, exact=exact
            )
            self._wire[delta.index] = piece.index
            yield delta
            return
        if piece.id not in (None, call.id) or piece.name not in (None, call.name):
            raise MalformedChunk(
                f"tool call {piece.index} ({call.id} {call.name!r}) renamed to "
                f"{piece.id} {piece.name!r}"
            )
        yield self._calls.piece(call, piece.arguments, tokens=tokens, exact=exact)

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


def _piece(raw_piece: Any, raw: str) -> _Piece:
    """One ``tool_calls`` piece, or a cut: its index an int, its id, name and arguments text."""
    if not isinstance(raw_piece, dict):
        raise MalformedChunk(f"a tool call piece that is not an object: {raw[:120]!r}")
    index = raw_piece.get("index")
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise MalformedChunk(f"a tool call piece without an index: {raw[:120]!r}")
    function = raw_piece.get("function") or {}
    if not isinstance(function, dict):
        raise MalformedChunk(f"a tool call's function is not an object: {raw[:120]!r}")
    call_id = raw_piece.get("id")
    if call_id is not None and not isinstance(call_id, str):
        raise MalformedChunk(f"a tool call id that is not a string: {raw[:120]!r}")
    return _Piece(
        index=index,
        id=call_id or None,
        name=_string(function, "name", raw) or None,
        arguments=_string(function, "arguments", raw),
    )


class OpenAIClient(ProviderClient):
    endpoint = "/chat/completions"
    stream_class: type[ProviderStream] = OpenAIStream

    def headers(self) -> dict[str, str]:
        key = self.api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    def body(self, plan: RequestPlan) -> dict[str, Any]:
        messages = [chat_message(m) for m in plan.messages]
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
        body.update(chat_shape(plan.shape))
        body.update(plan.extra_body)
        return body
