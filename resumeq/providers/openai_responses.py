"""The OpenAI Responses wire (``POST /responses``): OpenAI, and vLLM, llama.cpp, Ollama,
LiteLLM and DeepSeek where they serve it.

A stream is typed events, each with its ``event:`` line and a ``sequence_number`` that goes
up by one from the first: ``response.created``, ``response.in_progress``, then per output
item ``response.output_item.added`` / ``response.content_part.added``, the text as
``response.output_text.delta`` (reasoning as ``response.reasoning_text.delta`` or its
summary's deltas), then ``….done`` events, and one terminal event: ``response.completed``,
``response.incomplete`` (``incomplete_details.reason``: ``max_output_tokens`` is the finish
``length``), ``response.failed`` or ``error``. There is no ``[DONE]``. The usage comes only
in the terminal event, so a cut stream has none (SPEC §6's fallbacks count it).

A number out of sequence — skipped, repeated, going back — is a malformed stream: the text
it carries cannot be placed for sure. The response's id (from ``response.created``) and the
last sequence number read are kept: what a background response is reattached with.

A tool call is a ``function_call`` output item: ``response.output_item.added`` names it (its
``call_id`` and name), ``response.function_call_arguments.delta`` events (by ``item_id`` and
``output_index``) carry its arguments, ``response.function_call_arguments.done`` or the
item's ``response.output_item.done`` ends it. A completed response that made calls finishes
``tool_calls``. A reattached stream takes up the calls begun before its starting point from
the response's status (its ``output`` so far) or, where the server replays from the start,
from the events it skips; a piece of a call neither shows is a cut. ``response.refusal.delta``
is the model's refusal.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
from httpx_sse import ServerSentEvent

from resumeq.core.continuation import RequestPlan
from resumeq.core.errors import (
    FatalProviderError,
    InBandError,
    MalformedChunk,
    ProviderError,
    ReattachRefused,
    ResponseQueued,
)
from resumeq.providers.base import (
    OutputDelta,
    ProviderStream,
    Started,
    StreamEvent,
    TextDelta,
    Usage,
    json_object,
)
from resumeq.providers.calls import StreamedCall, ToolCalls
from resumeq.providers.counts import int_or_none
from resumeq.providers.openai import OpenAIClient
from resumeq.providers.shapes import responses_items, responses_shape

#: Deltas of reasoning text (the model's own, or its summary).
_REASONING_DELTAS = frozenset(
    {"response.reasoning_text.delta", "response.reasoning_summary_text.delta"}
)
#: Deltas of output that is neither text, reasoning, a refusal nor a function call's.
_OTHER_DELTAS = frozenset({"response.custom_tool_call_input.delta"})
#: The events of a function call: its start, its pieces, its end.
_CALL_EVENTS = frozenset(
    {
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    }
)
#: The finish an incomplete response's reason maps to.
_INCOMPLETE = {"max_output_tokens": "length", "content_filter": "content_filter"}


def usage_of(raw: Any) -> Usage | None:
    if not isinstance(raw, dict):
        return None
    details = raw.get("input_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    out_details = raw.get("output_tokens_details")
    reasoning = out_details.get("reasoning_tokens") if isinstance(out_details, dict) else None
    return Usage(
        input_tokens=int_or_none(raw.get("input_tokens")),
        cached_input_tokens=int_or_none(cached),
        output_tokens=int_or_none(raw.get("output_tokens")),
        reasoning_tokens=int_or_none(reasoning),
    )


@dataclass(frozen=True)
class KnownCall:
    """A function call of a background response as its status shows it: what a reattached
    stream takes up a call begun before its starting point with."""

    item_id: str | None
    output_index: int
    call_id: str
    name: str


def known_calls(output: Any) -> tuple[KnownCall, ...]:
    """The function calls of a Responses object's ``output``, in order."""
    found: list[KnownCall] = []
    for index, item in enumerate(output if isinstance(output, list) else ()):
        if not (isinstance(item, dict) and item.get("type") == "function_call"):
            continue
        call_id, name, item_id = item.get("call_id"), item.get("name"), item.get("id")
        if isinstance(call_id, str) and isinstance(name, str):
            found.append(KnownCall(item_id if isinstance(item_id, str) else None, index,
                                   call_id, name))  # fmt: skip
    return tuple(found)


def _keys(item_id: Any, output_index: Any) -> tuple[Hashable, ...]:
    """How an event names its output item: by id, and by place in the output."""
    keys: list[Hashable] = []
    if isinstance(item_id, str) and item_id:
        keys.append(("item", item_id))
    if isinstance(output_index, int) and not isinstance(output_index, bool):
        keys.append(("output", output_index))
    return tuple(keys)


class ResponsesStream(ProviderStream):
    def __init__(
        self,
        response: httpx.Response,
        *,
        stall_timeout_s: float,
        after: int | None = None,
        response_id: str | None = None,
        known: tuple[KnownCall, ...] = (),
    ) -> None:
        super().__init__(response, stall_timeout_s=stall_timeout_s)
        #: The response's id (once ``response.created`` said it, or the one reattached);
        #: the last sequence number read (``after``: a reattached stream's starting point).
        self.response_id = response_id
        self.sequence = after
        #: The response's status as last reported (``queued``, ``in_progress`` …).
        self.status: str | None = None
        self._after = after
        #: Whether this server numbers its events (llama.cpp's does not): the first says.
        self._numbered: bool | None = None
        #: Replaying from 0 (``starting_after`` ignored): the number expected next.
        self._replayed: int | None = None
        self._ended = False
        self._calls = ToolCalls(self._unicode, self._held)
        for call in known:
            self._calls.known(_keys(call.item_id, call.output_index), call.call_id, call.name)

    def _on_event(self, sse: ServerSentEvent) -> Iterator[StreamEvent]:
        event = json_object(sse)
        kind = event.get("type")
        if not isinstance(kind, str):
            raise MalformedChunk(f"an event without a type: {sse.data[:120]!r}")
        if sse.event not in ("message", kind):
            raise MalformedChunk(f"event line {sse.event!r} but type {kind!r}")
        if not self._sequence(event, sse.data):
            self._skipped(kind, event)
            return  # replayed from the start: already read before
        response = event.get("response")
        if isinstance(response, dict):
            self._note(response, sse.data)
        if kind == "response.created" and self.response_id is not None:
            yield Started(self.response_id, self.status)
        yield from self._typed(kind, event, response, sse.data)

    def _typed(
        self, kind: str, event: dict[str, Any], response: Any, raw: str
    ) -> Iterator[StreamEvent]:
        if kind == "response.output_text.delta":
            yield TextDelta(self._unicode(_text(event, raw)), 1, False)
        elif kind in _REASONING_DELTAS:
            text = self._unicode(_text(event, raw), "reasoning")
            yield OutputDelta("reasoning", text, 1, False)
        elif kind == "response.refusal.delta":
            yield OutputDelta("refusal", self._unicode(_text(event, raw), "refusal"), 1, False)
        elif kind in _OTHER_DELTAS:
            yield OutputDelta("other", _text(event, raw), 1, False)
        elif kind in _CALL_EVENTS:
            yield from self._call_event(kind, event, raw)
        elif kind in ("response.completed", "response.incomplete"):
            yield from self._end(kind, response)
        elif kind == "response.failed":
            error = response.get("error") if isinstance(response, dict) else None
            raise _in_band("response failed", error, raw)
        elif kind == "error":
            nested = event.get("error")
            raise _in_band("error event", nested if isinstance(nested, dict) else event, raw)

    @property
    def _call_handlers(
        self,
    ) -> dict[str, Callable[[dict[str, Any], str], Iterator[StreamEvent]]]:
        return {
            "response.output_item.added": self._call_added,
            "response.function_call_arguments.delta": self._call_piece,
            "response.function_call_arguments.done": self._call_done,
            "response.output_item.done": self._call_done,
        }

    def _call_event(self, kind: str, event: dict[str, Any], raw: str) -> Iterator[StreamEvent]:
        item = event.get("item")
        if kind.startswith("response.output_item.") and not (
            isinstance(item, dict) and item.get("type") == "function_call"
        ):
            return  # a message, reasoning, another tool's item: its deltas say what it holds
        yield from self._call_handlers[kind](event, raw)

    def _call_added(self, event: dict[str, Any], raw: str) -> Iterator[StreamEvent]:
        item = event["item"]
        call_id, name = item.get("call_id"), item.get("name")
        if not (isinstance(call_id, str) and call_id and isinstance(name, str) and name):
            raise MalformedChunk(
                f"a function_call item without its call_id and name: {raw[:120]!r}"
            )
        arguments = item.get("arguments") or ""
        if not isinstance(arguments, str):
            raise MalformedChunk(f"function_call arguments that are not text: {raw[:120]!r}")
        keys = _keys(item.get("id"), event.get("output_index"))
        if not keys:
            raise MalformedChunk(f"a function_call item with no id and no place: {raw[:120]!r}")
        yield self._calls.start(
            keys, call_id, name, arguments, tokens=int(bool(arguments)), exact=False
        )

    def _call(self, event: dict[str, Any], raw: str) -> StreamedCall:
        """The call an event is about, or a cut."""
        item = event.get("item")
        item_id = item.get("id") if isinstance(item, dict) else event.get("item_id")
        call = self._calls.find(*_keys(item_id, event.get("output_index")))
        if call is None:
            raise MalformedChunk(f"an event of a function call never announced: {raw[:120]!r}")
        return call

    def _call_piece(self, event: dict[str, Any], raw: str) -> Iterator[StreamEvent]:
        call = self._call(event, raw)
        yield self._calls.piece(call, _text(event, raw), tokens=1, exact=False)

    def _call_done(self, event: dict[str, Any], raw: str) -> Iterator[StreamEvent]:
        call = self._call(event, raw)
        item = event.get("item")
        if item is not None and not call.announced:
            # The item's end, of a call begun before this stream's starting point: its
            # arguments' end came before it, then or here, and said it.
            return
        whole = item.get("arguments") if isinstance(item, dict) else event.get("arguments")
        if whole is not None and not isinstance(whole, str):
            raise MalformedChunk(f"function_call arguments that are not text: {raw[:120]!r}")
        yield from self._calls.end(call, whole)

    def _skipped(self, kind: str, event: dict[str, Any]) -> None:
        """An event a replay skips (read before this stream's starting point): the calls it
        starts or ends are taken up, so that what comes after finds them."""
        item = event.get("item")
        if kind == "response.function_call_arguments.done":
            item = {"type": "function_call", "id": event.get("item_id")}
        if not (isinstance(item, dict) and item.get("type") == "function_call"):
            return
        keys = _keys(item.get("id"), event.get("output_index"))
        call = self._calls.find(*keys)
        call_id, name = item.get("call_id"), item.get("name")
        if call is None and isinstance(call_id, str) and isinstance(name, str):
            call = self._calls.known(keys, call_id, name)
        if call is not None and kind.endswith(".done"):
            self._calls.ended_before(call)

    def _sequence(self, event: dict[str, Any], raw: str) -> bool:
        """Check the event's number; False for an event to skip (a server that ignored
        ``starting_after`` replays from 0: what was read before is dropped, never kept
        twice)."""
        number = event.get("sequence_number")
        if self._numbered is None:
            self._numbered = number is not None
        if not self._numbered:
            if number is not None:
                raise MalformedChunk(f"a numbered event in an unnumbered stream: {raw[:120]!r}")
            return True
        if isinstance(number, bool) or not isinstance(number, int) or number < 0:
            raise MalformedChunk(f"an event without a sequence number: {raw[:120]!r}")
        replaying = self._after is not None and self.sequence is not None
        if replaying and number == 0 and self.sequence == self._after:
            self._replayed = 0  # the server starts over: skip through ``after``
        if self._replayed is not None:
            if number != self._replayed:
                raise MalformedChunk(f"event {number} out of sequence in a replay")
            if number <= (self._after or 0):
                self._replayed = number + 1
                return False
            self._replayed = None
        expected = 0 if self.sequence is None else self.sequence + 1
        if number != expected:
            raise MalformedChunk(
                f"event {number} out of sequence (expected {expected}): its text cannot "
                "be placed for sure"
            )
        self.sequence = number
        return True

    def _note(self, response: dict[str, Any], raw: str) -> None:
        named = response.get("id")
        if isinstance(named, str):
            if self._after is not None and self.response_id not in (None, named):
                raise MalformedChunk(
                    f"reading on response {self.response_id}, an event of {named}: {raw[:120]!r}"
                )
            self.response_id = named
        if isinstance(response.get("status"), str):
            self.status = response["status"]

    def _end(self, kind: str, response: Any) -> Iterator[StreamEvent]:
        if not isinstance(response, dict):
            raise MalformedChunk(f"{kind} without its response")
        # By the response's status, not the event's name: vLLM ends a response cut short by
        # its budget with ``response.completed`` whose status is ``incomplete``.
        status = response.get("status") or kind.removeprefix("response.")
        if status == "incomplete":
            details = response.get("incomplete_details")
            reason = details.get("reason") if isinstance(details, dict) else None
            self.finish_reason = _INCOMPLETE.get(str(reason), str(reason or "incomplete"))
        elif len(self._calls) or known_calls(response.get("output")):
            self.finish_reason = "tool_calls"
        else:
            self.finish_reason = "stop"
        yield from self._calls.end_open()
        self._ended = True
        usage = usage_of(response.get("usage"))
        if usage is not None:
            self.usage = usage
            yield usage

    def _complete(self) -> bool:
        return self._ended


def _text(event: dict[str, Any], raw: str) -> str:
    delta = event.get("delta")
    if not isinstance(delta, str):
        raise MalformedChunk(f"a delta that is not a string: {raw[:120]!r}")
    return delta


def _in_band(what: str, error: Any, raw: str) -> InBandError:
    error = error if isinstance(error, dict) else {}
    message = str(error.get("message") or what)
    code = error.get("code")
    kind = str(code) if code is not None else None
    return InBandError(f"in-band error: {message}", error_type=kind, body=raw[:4096])


#: A background response's statuses that it can be read on from.
_READABLE = frozenset({"in_progress", "completed", "incomplete"})


def _dated(made: str, model: str) -> bool:
    """Whether ``made`` is a dated snapshot of ``model`` (OpenAI answers ``gpt-4o`` with
    ``gpt-4o-2024-08-06``; ``gpt-4o-mini`` is another model)."""
    return re.fullmatch(rf"{re.escape(model)}-\d{{4}}-\d{{2}}-\d{{2}}", made) is not None


class ResponsesClient(OpenAIClient):
    """OpenAI's authentication, another endpoint and body; and for a ``background = true``
    profile, background responses: made with ``background: true, store: true``, read on
    after a cut (:meth:`reattach`), cancelled when nobody will read them."""

    endpoint = "/responses"
    stream_class = ResponsesStream

    def open(self, plan: RequestPlan) -> ProviderStream:
        if plan.kind == "reattach":
            if plan.response_id is None or plan.after is None:
                raise ValueError("a reattach plan needs its response id and sequence number")
            return self.reattach(plan.response_id, after=plan.after, model=plan.model)
        return super().open(plan)

    def _url(self, response_id: str, tail: str = "") -> str:
        if not response_id or "/" in response_id or "?" in response_id:
            raise ReattachRefused(f"not a response id: {response_id!r}")
        return f"{self.profile.base_url}{self.endpoint}/{response_id}{tail}"

    def status(self, response_id: str) -> dict[str, Any]:
        """The response as the provider keeps it (``GET /responses/{id}``, not streamed):
        a 404 or 400 is a :class:`ReattachRefused`."""
        request = self.http.build_request(
            "GET", self._url(response_id), headers=self.headers(), timeout=self.timeout
        )
        try:
            response = self.send(request, stream=False)
        except ProviderError as exc:
            if exc.status in (400, 404):
                raise ReattachRefused(
                    f"response {response_id}: {exc}", status=exc.status, body=exc.body
                ) from None
            raise
        try:
            data = response.json()
        except ValueError:
            raise ReattachRefused(f"response {response_id}: answered non-JSON") from None
        if not isinstance(data, dict):
            raise ReattachRefused(f"response {response_id}: answered a JSON {type(data).__name__}")
        return data

    def reattach(self, response_id: str, *, after: int, model: str) -> ResponsesStream:
        """The rest of background response ``response_id``: the events after number
        ``after``, billed once with the response. First its status: ``queued`` is a
        :class:`ResponseQueued` (poll again later); failed, cancelled, not a background
        response, made for another model, too old to stream (OpenAI's 400) or gone (404)
        is a :class:`ReattachRefused`."""
        data = self.status(response_id)
        status = data.get("status")
        if status == "queued":
            raise ResponseQueued(f"response {response_id} is still queued")
        usage = usage_of(data.get("usage"))
        billed = usage.output_tokens if usage is not None else None

        def refused(why: str, **kw: Any) -> ReattachRefused:
            return ReattachRefused(f"response {response_id}{why}", billed_output=billed, **kw)

        if data.get("id") != response_id:
            raise ReattachRefused(f"asked for response {response_id}, got {data.get('id')!r}")
        if data.get("background") is not True:
            raise refused(" is not a background response")
        made = data.get("model")
        if not (made == model or (isinstance(made, str) and _dated(made, model))):
            raise refused(f" was made by {made!r}, not {model!r}")
        if status not in _READABLE:
            raise refused(f" is {status}")
        request = self.http.build_request(
            "GET",
            self._url(response_id),
            params={"stream": "true", "starting_after": str(after)},
            headers={
                **self.headers(),
                "Accept": "text/event-stream",
                "Accept-Encoding": "identity",
            },
            timeout=self.timeout,
        )
        try:
            response = self.send(request)
        except ProviderError as exc:
            if exc.status in (400, 404):
                raise refused(f": {exc}", status=exc.status, body=exc.body) from None
            raise
        return ResponsesStream(
            response,
            stall_timeout_s=self.profile.stall_timeout_s,
            after=after,
            response_id=response_id,
            known=known_calls(data.get("output")),
        )

    def cancel(self, response_id: str) -> bool:
        """Stop a background response (``POST /responses/{id}/cancel``): nobody will read
        the rest, so nobody should pay for it. Answers False for one that had ended or is
        gone (the provider's 400, 404 or 409: left as it is)."""
        request = self.http.build_request(
            "POST", self._url(response_id, "/cancel"), headers=self.headers(), timeout=self.timeout
        )
        try:
            self.send(request, stream=False).close()
        except ProviderError as exc:
            if exc.status not in (400, 404, 409):
                raise
            return False
        return True

    def body(self, plan: RequestPlan) -> dict[str, Any]:
        extra = dict(plan.extra_body)
        # Chat Completions' flags for going on with the final assistant message: here it is
        # the message's own status instead.
        continue_final = extra.pop("continue_final_message", False) is True
        extra.pop("add_generation_prompt", None)
        items = [item for m in plan.messages for item in responses_items(m)]
        if continue_final and items and items[-1].get("role") == "assistant":
            # vLLM's way to go on with a final assistant message, as Chat Completions'
            # continue_final_message does.
            items[-1]["status"] = "in_progress"
        body: dict[str, Any] = {
            "model": plan.model,
            "input": items,
            "stream": True,
            # A background response is kept by the provider until it is read on.
            "store": self.profile.background,
            "max_output_tokens": plan.max_tokens,
        }
        if self.profile.background:
            body["background"] = True
        params = plan.params
        if params.stop or params.seed is not None:
            raise FatalProviderError(
                "the Responses API takes no stop sequences and no seed: this job's "
                f"{'stop' if params.stop else 'seed'} cannot be sent (use kind openai)"
            )
        if params.temperature is not None:
            body["temperature"] = params.temperature
        if params.top_p is not None:
            body["top_p"] = params.top_p
        body.update(responses_shape(plan.shape))
        body.update(extra)
        return body
