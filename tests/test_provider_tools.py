"""Tool calls and refusals as each wire streams them (SPEC §23): ``ToolCallDelta`` pieces
numbered in the order the calls start, one ``ToolCallEnd`` per whole call and none for a call
cut short, refusals as their own output, and malformed pieces as cuts.

The bodies are written here the way the providers send them; every event is first parsed by
the official SDK's type for it (``openai.types.chat.ChatCompletionChunk``, Anthropic's
``RawMessageStreamEvent``, ``openai.types.responses.ResponseStreamEvent``), so a shape the
real provider could not send fails the test before the client reads it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from anthropic.types import RawMessageStreamEvent
from openai.types.chat import ChatCompletionChunk
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from resumeq.core.continuation import plan_reattach, plan_request
from resumeq.core.errors import Disconnected, MalformedChunk, StreamCut, Truncated
from resumeq.core.settings import ProviderProfile
from resumeq.core.spec import parse_spec
from resumeq.providers import (
    AnthropicStream,
    OutputDelta,
    ProviderClient,
    ProviderStream,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    ToolCallEnd,
    Usage,
    make_client,
)

SPEC = parse_spec(
    {"prompt": "What is the weather in Oslo and Bergen?", "provider": "p", "model": "m",
     "budget_tokens": 500}
)  # fmt: skip
ANTHROPIC_EVENT: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)
RESPONSES_EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


class Broken(httpx.SyncByteStream):
    """A body that drops after its bytes, as a connection reset mid-stream does."""

    def __init__(self, body: bytes) -> None:
        self.body = body

    def __iter__(self) -> Iterator[bytes]:
        yield self.body
        raise httpx.RemoteProtocolError("peer closed connection without sending complete body")


def client_for(
    kind: str, body: str, *, broken: bool = False, **over: Any
) -> tuple[ProviderClient, list[httpx.Request]]:
    """A client whose provider answers ``body`` (then drops, if ``broken``)."""
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        headers = {"content-type": "text/event-stream"}
        if broken:
            return httpx.Response(200, headers=headers, stream=Broken(body.encode()))
        return httpx.Response(200, headers=headers, text=body)

    base = "http://provider.invalid" if kind == "anthropic" else "http://provider.invalid/v1"
    profile = ProviderProfile.model_validate({"kind": kind, "base_url": base, **over})
    return make_client(profile, httpx.Client(transport=httpx.MockTransport(handler))), sent


def read(
    client: ProviderClient, *, watch: Callable[[ProviderStream, StreamEvent], None] | None = None
) -> tuple[list[StreamEvent], StreamCut | None, ProviderStream]:
    plan = plan_request(SPEC, client.profile, prefix="", remaining_tokens=500)
    events: list[StreamEvent] = []
    with client.open(plan) as stream:
        try:
            for event in stream:
                events.append(event)
                if watch is not None:
                    watch(stream, event)
        except StreamCut as exc:
            return events, exc, stream
    return events, None, stream


def calls_of(events: list[StreamEvent]) -> list[tuple[str, str, str]]:
    """The calls the events make, in order: (id, name, arguments)."""
    made: dict[int, list[str]] = {}
    names: dict[int, tuple[str, str]] = {}
    for e in events:
        if isinstance(e, ToolCallDelta):
            if e.index not in names:
                assert e.id is not None and e.name is not None, "a call's first delta names it"
                names[e.index] = (e.id, e.name)
            else:
                assert e.id is None and e.name is None
            made.setdefault(e.index, []).append(e.arguments)
    assert sorted(made) == list(range(len(made))), "calls are numbered 0, 1, … as they start"
    return [(*names[i], "".join(made[i])) for i in sorted(made)]


def ends_of(events: list[StreamEvent]) -> list[int]:
    return [e.index for e in events if isinstance(e, ToolCallEnd)]


def tokens_of(events: list[StreamEvent]) -> int:
    return sum(e.tokens for e in events if isinstance(e, TextDelta | OutputDelta | ToolCallDelta))


def kinds(events: list[StreamEvent]) -> list[str]:
    """The events as a short trace: T text, C<n> a piece of call n, E<n> its end, R refusal."""
    out = []
    for e in events:
        if isinstance(e, TextDelta):
            out.append("T")
        elif isinstance(e, ToolCallDelta):
            out.append(f"C{e.index}")
        elif isinstance(e, ToolCallEnd):
            out.append(f"E{e.index}")
        elif isinstance(e, OutputDelta):
            out.append(e.kind[0].upper())
    return out


ARGS_OSLO = '{"city": "Oslo", "unit": "celsius"}'
ARGS_BERGEN = '{"city": "Bergen"}'


def pieces(text: str, size: int = 7) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


# -- OpenAI Chat Completions --------------------------------------------------------------------


def chat_chunk(
    delta: dict[str, Any] | None = None, finish: str | None = None, usage: int | None = None
) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": "gpt-4o-2024-08-06",
        "choices": [{"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish}],
    }
    if usage is not None:
        chunk["usage"] = {"prompt_tokens": 9, "completion_tokens": usage, "total_tokens": 9 + usage}
    ChatCompletionChunk.model_validate(chunk)
    return chunk


def start(index: int, call_id: str, name: str, arguments: str = "") -> dict[str, Any]:
    function = {"name": name, "arguments": arguments}
    return {"index": index, "id": call_id, "type": "function", "function": function}


def more(index: int, arguments: str) -> dict[str, Any]:
    return {"index": index, "function": {"arguments": arguments}}


def chat_body(*chunks: dict[str, Any], done: bool = True) -> str:
    body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks)
    return body + ("data: [DONE]\n\n" if done else "")


def call_chunks(index: int, call_id: str, name: str, arguments: str) -> list[dict[str, Any]]:
    first = chat_chunk({"tool_calls": [start(index, call_id, name)]})
    return [first, *(chat_chunk({"tool_calls": [more(index, p)]}) for p in pieces(arguments))]


ROLE = {"role": "assistant", "content": None, "refusal": None}


def test_chat_one_call() -> None:
    chunks = [chat_chunk(ROLE), *call_chunks(0, "call_Oslo1", "get_weather", ARGS_OSLO)]
    chunks.append(chat_chunk(finish="tool_calls"))
    client, _ = client_for("openai", chat_body(*chunks))
    events, error, stream = read(client)
    assert error is None and stream.finish_reason == "tool_calls"
    assert calls_of(events) == [("call_Oslo1", "get_weather", ARGS_OSLO)]
    assert ends_of(events) == [0] and kinds(events)[-1] == "E0"
    # One estimated token per chunk with content: the call's chunks, not the role's.
    assert tokens_of(events) == len(chunks) - 2
    assert not any(e.exact for e in events if isinstance(e, ToolCallDelta))


def test_chat_two_calls_one_after_the_other() -> None:
    chunks = [
        *call_chunks(0, "call_a", "get_weather", ARGS_OSLO),
        *call_chunks(1, "call_b", "get_weather", ARGS_BERGEN),
        chat_chunk(finish="tool_calls"),
    ]
    events, error, _ = read(client_for("openai", chat_body(*chunks))[0])
    assert error is None
    assert calls_of(events) == [
        ("call_a", "get_weather", ARGS_OSLO),
        ("call_b", "get_weather", ARGS_BERGEN),
    ]
    trace = kinds(events)
    # The first call is whole once the second starts; the second at the finish reason.
    assert trace.index("E0") == trace.index("C1") - 1 and trace[-1] == "E1"
    assert tokens_of(events) == len(chunks) - 1


def test_chat_two_calls_in_one_chunk() -> None:
    """What OpenAI's parallel calls may look like: pieces of two calls in one chunk, the
    first call's last piece and the second's first."""
    chunks = [
        chat_chunk({"tool_calls": [start(0, "call_a", "get_weather", '{"city": ')]}),
        chat_chunk({"tool_calls": [more(0, '"Oslo"}'), start(1, "call_b", "get_time")]}),
        chat_chunk({"tool_calls": [more(1, "{}")]}),
        chat_chunk({"tool_calls": [start(2, "call_c", "f", "{}"), start(3, "call_d", "g", "{}")]}),
        chat_chunk(finish="tool_calls"),
    ]
    events, error, _ = read(client_for("openai", chat_body(*chunks))[0])
    assert error is None
    assert calls_of(events) == [
        ("call_a", "get_weather", '{"city": "Oslo"}'),
        ("call_b", "get_time", "{}"),
        ("call_c", "f", "{}"),
        ("call_d", "g", "{}"),
    ]
    assert kinds(events) == ["C0", "C0", "E0", "C1", "C1", "E1", "C2", "E2", "C3", "E3"]
    # One token per chunk with content, on its first event: 4 chunks, 4 tokens.
    assert [e.tokens for e in events if isinstance(e, ToolCallDelta)] == [1, 1, 0, 1, 1, 0]


def test_chat_text_then_a_call_then_text() -> None:
    chunks = [
        chat_chunk({"role": "assistant", "content": "Let me"}),
        chat_chunk({"content": " check."}),
        *call_chunks(0, "call_a", "get_weather", ARGS_OSLO),
        chat_chunk({"content": "Done."}),
        chat_chunk(finish="stop"),
    ]
    events, error, stream = read(client_for("openai", chat_body(*chunks))[0])
    assert error is None and stream.finish_reason == "stop"
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Let me check.Done."
    trace = kinds(events)
    assert trace[:3] == ["T", "T", "C0"] and trace[-2:] == ["E0", "T"]  # text ends the call
    assert calls_of(events) == [("call_a", "get_weather", ARGS_OSLO)]


def test_chat_exact_counts_under_continuous_usage() -> None:
    """vLLM's continuous usage: each chunk's step, on its first event; the sum is the total."""
    chunks = [
        chat_chunk({"role": "assistant", "content": ""}, usage=0),
        chat_chunk({"tool_calls": [start(0, "call_a", "get_weather")]}, usage=3),
        chat_chunk(
            {
                "tool_calls": [
                    more(0, '{"city": '),
                ]
            },
            usage=6,
        ),
        chat_chunk({"tool_calls": [more(0, '"Oslo"}'), start(1, "call_b", "f", "{}")]}, usage=9),
        chat_chunk(finish="tool_calls", usage=10),
    ]
    client, _ = client_for("openai", chat_body(*chunks), counting="usage")
    events, error, _ = read(client)
    assert error is None
    deltas = [(e.index, e.tokens, e.exact) for e in events if isinstance(e, ToolCallDelta)]
    assert deltas == [(0, 3, True), (0, 3, True), (0, 3, True), (1, 0, True)]
    end_token = [e for e in events if isinstance(e, OutputDelta)]
    assert [(e.kind, e.tokens, e.exact) for e in end_token] == [("other", 1, True)]
    assert tokens_of(events) == 10 == [e for e in events if isinstance(e, Usage)][-1].output_tokens


@pytest.mark.parametrize("broken", [False, True])
def test_chat_a_cut_inside_a_calls_arguments(broken: bool) -> None:
    """The first call is whole (the second started); the second is cut: no end for it."""
    chunks = [
        *call_chunks(0, "call_a", "get_weather", ARGS_OSLO),
        *call_chunks(1, "call_b", "get_weather", ARGS_BERGEN)[:2],
    ]
    client, _ = client_for("openai", chat_body(*chunks, done=False), broken=broken)
    events, error, stream = read(client)
    assert isinstance(error, Disconnected if broken else Truncated)
    assert stream.finish_reason is None
    assert ends_of(events) == [0]
    assert calls_of(events) == [
        ("call_a", "get_weather", ARGS_OSLO),
        ("call_b", "get_weather", ARGS_BERGEN[:7]),
    ]


def test_chat_refusal_is_its_own_output() -> None:
    chunks = [chat_chunk({"role": "assistant", "content": None, "refusal": ""})]
    chunks += [chat_chunk({"refusal": p}) for p in ["I'm sorry, ", "I can't help with that."]]
    chunks.append(chat_chunk(finish="stop"))
    events, error, stream = read(client_for("openai", chat_body(*chunks))[0])
    assert error is None and stream.finish_reason == "stop"
    refusal = [e for e in events if isinstance(e, OutputDelta)]
    assert {e.kind for e in refusal} == {"refusal"}
    assert "".join(e.text for e in refusal) == "I'm sorry, I can't help with that."
    assert tokens_of(events) == 2


def test_chat_a_surrogate_pair_split_across_pieces_is_joined() -> None:
    """A server that splits an emoji's UTF-16 halves across two chunks (JSON escapes)."""
    head = chat_chunk({"tool_calls": [start(0, "call_a", "say", '{"text": "')]})
    body = chat_body(head, done=False)
    body += 'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":'
    body += '{"arguments":"\\ud83d"}}]},"finish_reason":null}]}\n\n'
    body += 'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":'
    body += '{"arguments":"\\ude00\\"}"}}]},"finish_reason":null}]}\n\n'
    body += chat_body(chat_chunk(finish="tool_calls"))
    events, error, _ = read(client_for("openai", body)[0])
    assert error is None
    assert calls_of(events) == [("call_a", "say", '{"text": "\U0001f600"}')]


MALFORMED_PIECES = [
    ({"index": "0", "id": "call_a", "function": {"name": "f", "arguments": ""}}, "index"),
    ({"index": True, "id": "call_a", "function": {"name": "f", "arguments": ""}}, "index"),
    ({"id": "call_a", "function": {"name": "f", "arguments": ""}}, "index"),
    ({"index": 0, "id": "call_a", "function": {"name": "f", "arguments": {"x": 1}}}, "arguments"),
    ({"index": 0, "function": {"arguments": "{}"}}, "without its id and name"),
    ({"index": 0, "id": "call_a", "function": {"arguments": "{}"}}, "without its id and name"),
    ({"index": 0, "id": 7, "function": {"name": "f", "arguments": ""}}, "id"),
    ({"index": 0, "id": "call_a", "function": "f"}, "function"),
]


@pytest.mark.parametrize(("piece", "why"), MALFORMED_PIECES)
def test_chat_malformed_tool_call_pieces_are_cuts(piece: dict[str, Any], why: str) -> None:
    bad = {"choices": [{"index": 0, "delta": {"tool_calls": [piece]}, "finish_reason": None}]}
    body = chat_body(chat_chunk({"content": "Hi"}), bad, chat_chunk(finish="tool_calls"))
    events, error, _ = read(client_for("openai", body)[0])
    assert isinstance(error, MalformedChunk) and why in str(error)
    assert kinds(events) == ["T"]


def test_chat_a_piece_of_a_call_that_ended_is_a_cut() -> None:
    chunks = [
        *call_chunks(0, "call_a", "f", "{}"),
        *call_chunks(1, "call_b", "g", "{}"),
        chat_chunk({"tool_calls": [more(0, " ")]}),
        chat_chunk(finish="tool_calls"),
    ]
    events, error, _ = read(client_for("openai", chat_body(*chunks))[0])
    assert isinstance(error, MalformedChunk) and "after its end" in str(error)
    assert ends_of(events) == [0]


def test_chat_a_call_renamed_midway_is_a_cut() -> None:
    chunks = [
        *call_chunks(0, "call_a", "f", "{}"),
        chat_chunk({"tool_calls": [start(0, "call_z", "f")]}),
        chat_chunk(finish="tool_calls"),
    ]
    _, error, _ = read(client_for("openai", chat_body(*chunks))[0])
    assert isinstance(error, MalformedChunk) and "renamed" in str(error)


def test_chat_a_lone_surrogate_in_arguments_is_a_cut() -> None:
    body = chat_body(chat_chunk({"tool_calls": [start(0, "call_a", "f", '{"a": "')]}), done=False)
    body += 'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":'
    body += '{"arguments":"\\udc00x"}}]},"finish_reason":null}]}\n\n'
    body += chat_body(chat_chunk(finish="tool_calls"))
    events, error, _ = read(client_for("openai", body)[0])
    assert isinstance(error, MalformedChunk) and "tool call 0" in str(error)
    assert ends_of(events) == []


# -- Anthropic Messages ------------------------------------------------------------------------


def anthropic_body(*events: dict[str, Any]) -> str:
    out = []
    for event in events:
        ANTHROPIC_EVENT.validate_python(event)
        out.append(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n")
    return "".join(out)


MESSAGE_START = {
    "type": "message_start",
    "message": {
        "id": "msg_01", "type": "message", "role": "assistant", "content": [],
        "model": "claude-sonnet-4-5", "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 40, "output_tokens": 1},
    },
}  # fmt: skip


def text_block(index: int, *texts: str) -> list[dict[str, Any]]:
    return [
        {"type": "content_block_start", "index": index,
         "content_block": {"type": "text", "text": ""}},
        *({"type": "content_block_delta", "index": index,
           "delta": {"type": "text_delta", "text": t}} for t in texts),
        {"type": "content_block_stop", "index": index},
    ]  # fmt: skip


def tool_block(index: int, call_id: str, name: str, arguments: str) -> list[dict[str, Any]]:
    block = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
    return [
        {"type": "content_block_start", "index": index, "content_block": block},
        *({"type": "content_block_delta", "index": index,
           "delta": {"type": "input_json_delta", "partial_json": p}}
          for p in ["", *pieces(arguments)]),
        {"type": "content_block_stop", "index": index},
    ]  # fmt: skip


def thinking_block(index: int, thought: str) -> list[dict[str, Any]]:
    return [
        {"type": "content_block_start", "index": index,
         "content_block": {"type": "thinking", "thinking": "", "signature": ""}},
        {"type": "content_block_delta", "index": index,
         "delta": {"type": "thinking_delta", "thinking": thought}},
        {"type": "content_block_delta", "index": index,
         "delta": {"type": "signature_delta", "signature": "EqQBCgIYAhIM"}},
        {"type": "content_block_stop", "index": index},
    ]  # fmt: skip


def message_end(stop_reason: str, output_tokens: int) -> list[dict[str, Any]]:
    return [
        {"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": None},
         "usage": {"output_tokens": output_tokens}},
        {"type": "message_stop"},
    ]  # fmt: skip


def test_anthropic_text_then_two_tool_use_blocks() -> None:
    events_in = [
        MESSAGE_START,
        *thinking_block(0, "Two cities: two calls."),
        *text_block(1, "I'll check ", "both."),
        *tool_block(2, "toolu_01A", "get_weather", ARGS_OSLO),
        *tool_block(3, "toolu_01B", "get_weather", ARGS_BERGEN),
        *message_end("tool_use", 60),
    ]
    inside: list[tuple[str, bool]] = []

    def watch(stream: ProviderStream, event: StreamEvent) -> None:
        assert isinstance(stream, AnthropicStream)
        inside.append(("".join(kinds([event])), stream.in_non_text_block))

    client, _ = client_for("anthropic", anthropic_body(*events_in))
    events, error, stream = read(client, watch=watch)
    assert error is None and stream.finish_reason == "tool_calls"
    assert calls_of(events) == [
        ("toolu_01A", "get_weather", ARGS_OSLO),
        ("toolu_01B", "get_weather", ARGS_BERGEN),
    ]
    trace = kinds(events)
    assert trace[0] == "R" and trace[1:3] == ["T", "T"]  # the reasoning, then the text
    assert trace[trace.index("C1") - 1] == "E0" and trace[-1] == "E1"
    # Not resumable mid-block: a thinking block, no longer a tool-use block.
    assert ("R", True) in inside
    assert {flag for kind, flag in inside if kind.startswith(("C", "E"))} == {False}
    # One estimated token per delta; the block's start carries none.
    deltas = sum(1 for e in events_in if e["type"] == "content_block_delta"
                 and e["delta"]["type"] != "signature_delta")  # fmt: skip
    assert tokens_of(events) == deltas


def test_anthropic_a_cut_inside_a_tool_use_block() -> None:
    events_in = [
        MESSAGE_START,
        *tool_block(0, "toolu_01A", "get_weather", ARGS_OSLO),
        *tool_block(1, "toolu_01B", "get_weather", ARGS_BERGEN)[:3],
    ]
    client, _ = client_for("anthropic", anthropic_body(*events_in), broken=True)
    events, error, stream = read(client)
    assert isinstance(error, Disconnected) and stream.finish_reason is None
    assert ends_of(events) == [0]
    assert calls_of(events)[1] == ("toolu_01B", "get_weather", ARGS_BERGEN[:7])


def test_anthropic_refusal_is_the_finish_refusal() -> None:
    events_in = [MESSAGE_START, *text_block(0, "I can't"), *message_end("refusal", 3)]
    events, error, stream = read(client_for("anthropic", anthropic_body(*events_in))[0])
    assert error is None and stream.finish_reason == "refusal"
    assert kinds(events) == ["T"]


@pytest.mark.parametrize(
    ("events_in", "why"),
    [
        ([*text_block(0, "a")[:1], {"type": "content_block_delta", "index": 0, "delta":
          {"type": "input_json_delta", "partial_json": "{}"}}], "outside a tool_use block"),
        ([{"type": "content_block_start", "index": 0, "content_block":
          {"type": "tool_use", "id": "", "name": "f", "input": {}}}], "id and name"),
    ],
)  # fmt: skip
def test_anthropic_malformed_tool_use_is_a_cut(events_in: list[dict[str, Any]], why: str) -> None:
    body = anthropic_body(MESSAGE_START, *events_in, *message_end("tool_use", 5))
    _, error, _ = read(client_for("anthropic", body)[0])
    assert isinstance(error, MalformedChunk) and why in str(error)


# -- OpenAI Responses ----------------------------------------------------------------------------


def response(status: str, output: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
    return {
        "id": "resp_1", "object": "response", "created_at": 1_700_000_000,
        "model": "gpt-4o-2024-08-06", "status": status, "output": output,
        "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], **more,
    }  # fmt: skip


USAGE = {
    "input_tokens": 30, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
    "output_tokens": 20,
    "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 50,
}  # fmt: skip


def fc_item(n: int, arguments: str, status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{n}", "call_id": f"call_{n}",
            "name": "get_weather", "arguments": arguments, "status": status}  # fmt: skip


class Script:
    """A Responses stream, numbered from 0 as OpenAI numbers it."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def add(self, kind: str, **fields: Any) -> Script:
        event = {"type": kind, "sequence_number": len(self.events), **fields}
        RESPONSES_EVENT.validate_python(event)
        self.events.append(event)
        return self

    def call(self, output_index: int, n: int, arguments: str, *, done: bool = True) -> Script:
        where = {"item_id": f"fc_{n}", "output_index": output_index}
        self.add("response.output_item.added", output_index=output_index,
                 item=fc_item(n, "", "in_progress"))  # fmt: skip
        for piece in pieces(arguments):
            self.add("response.function_call_arguments.delta", delta=piece, **where)
        if done:
            self.add("response.function_call_arguments.done", arguments=arguments, **where)
            self.add("response.output_item.done", output_index=output_index,
                     item=fc_item(n, arguments, "completed"))  # fmt: skip
        return self

    def body(self, after: int = -1) -> str:
        return "".join(
            f"event: {e['type']}\ndata: {json.dumps(e)}\n\n"
            for e in self.events
            if e["sequence_number"] > after
        )


def started() -> Script:
    script = Script().add("response.created", response=response("in_progress", []))
    return script.add("response.in_progress", response=response("in_progress", []))


def completed(script: Script, output: list[dict[str, Any]]) -> Script:
    return script.add("response.completed", response=response("completed", output, usage=USAGE))


def test_responses_two_calls() -> None:
    script = started().call(0, 1, ARGS_OSLO).call(1, 2, ARGS_BERGEN)
    completed(script, [fc_item(1, ARGS_OSLO, "completed"), fc_item(2, ARGS_BERGEN, "completed")])
    events, error, stream = read(client_for("openai-responses", script.body())[0])
    assert error is None and stream.finish_reason == "tool_calls"
    assert calls_of(events) == [
        ("call_1", "get_weather", ARGS_OSLO),
        ("call_2", "get_weather", ARGS_BERGEN),
    ]
    assert ends_of(events) == [0, 1]  # once each, though both done events came
    trace = kinds(events)
    assert trace[trace.index("C1") - 1] == "E0"
    assert stream.sequence == len(script.events) - 1
    deltas = sum(1 for e in script.events if e["type"].endswith(".delta"))
    assert tokens_of(events) == deltas


def test_responses_text_then_a_call() -> None:
    message = {"type": "message", "id": "msg_1", "role": "assistant", "status": "in_progress",
               "content": []}  # fmt: skip
    part = {"type": "output_text", "text": "", "annotations": []}
    where = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    script = started().add("response.output_item.added", output_index=0, item=message)
    script.add("response.content_part.added", part=part, **where)
    for text in ["Checking", " Oslo."]:
        script.add("response.output_text.delta", delta=text, logprobs=[], **where)
    script.call(1, 1, ARGS_OSLO)
    completed(script, [fc_item(1, ARGS_OSLO, "completed")])
    events, error, stream = read(client_for("openai-responses", script.body())[0])
    assert error is None and stream.finish_reason == "tool_calls"
    assert kinds(events)[:3] == ["T", "T", "C0"] and ends_of(events) == [0]


def test_responses_a_cut_inside_a_call() -> None:
    script = started().call(0, 1, ARGS_OSLO).call(1, 2, ARGS_BERGEN, done=False)
    client, _ = client_for("openai-responses", script.body(), broken=True)
    events, error, stream = read(client)
    assert isinstance(error, Disconnected)
    assert ends_of(events) == [0] and calls_of(events)[1][2] == ARGS_BERGEN
    # The position to read on from advanced with the call's events, as with text.
    assert stream.sequence == len(script.events) - 1


def test_responses_refusal() -> None:
    refusal = {"type": "refusal", "refusal": ""}
    where = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    script = started().add("response.content_part.added", part=refusal, **where)
    script.add("response.refusal.delta", delta="I can't help with that.", **where)
    completed(script, [])
    events, error, stream = read(client_for("openai-responses", script.body())[0])
    assert error is None and stream.finish_reason == "stop"
    assert [(e.kind, e.text) for e in events if isinstance(e, OutputDelta)] == [
        ("refusal", "I can't help with that.")
    ]


def test_responses_a_piece_of_an_unknown_call_is_a_cut() -> None:
    script = started().add(
        "response.function_call_arguments.delta", item_id="fc_9", output_index=0, delta="{}"
    )
    _, error, _ = read(client_for("openai-responses", script.body())[0])
    assert isinstance(error, MalformedChunk) and "never announced" in str(error)


def test_responses_done_arguments_that_are_not_the_pieces_are_a_cut() -> None:
    script = started().call(0, 1, ARGS_OSLO, done=False)
    script.add("response.function_call_arguments.done", item_id="fc_1", output_index=0,
               arguments='{"city": "Paris"}')  # fmt: skip
    _, error, _ = read(client_for("openai-responses", script.body())[0])
    assert isinstance(error, MalformedChunk) and "not its pieces'" in str(error)


def background(
    script: Script, status_output: list[dict[str, Any]], *, replay: bool = False
) -> tuple[ProviderClient, list[httpx.Request]]:
    """A background response: its status shows ``status_output``; its stream serves the
    events after ``starting_after`` (all of them, if ``replay``: a server that ignores it)."""
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        if request.url.params.get("stream") != "true":
            status = response("in_progress", status_output, background=True)
            status["model"] = "m"
            return httpx.Response(200, json=status)
        after = -1 if replay else int(request.url.params["starting_after"])
        return httpx.Response(200, headers={"content-type": "text/event-stream"},
                              text=script.body(after))  # fmt: skip

    profile = ProviderProfile(kind="openai-responses", base_url="http://p.invalid/v1",
                              background=True)  # fmt: skip
    return make_client(profile, httpx.Client(transport=httpx.MockTransport(handler))), sent


def reattached(client: ProviderClient, after: int) -> tuple[list[StreamEvent], ProviderStream]:
    plan = plan_reattach(SPEC, response_id="resp_1", after=after, remaining_tokens=400)
    with client.open(plan) as stream:
        return list(stream), stream


@pytest.mark.parametrize("replay", [False, True])
def test_a_reattach_inside_a_call_reads_its_arguments_on(replay: bool) -> None:
    """Cut after the second call's first pieces: the reattached stream numbers it as the first
    stream did (1), names it on its first piece here, and ends it once."""
    script = started().call(0, 1, ARGS_OSLO).call(1, 2, ARGS_BERGEN)
    completed(script, [fc_item(1, ARGS_OSLO, "completed"), fc_item(2, ARGS_BERGEN, "completed")])
    after = next(e["sequence_number"] for e in script.events
                 if e.get("item_id") == "fc_2" and e["type"].endswith(".delta"))  # fmt: skip
    # What the status shows while it streams (none, where a server shows no output so far).
    shown = [] if replay else [fc_item(1, ARGS_OSLO, "completed"),
                               fc_item(2, ARGS_BERGEN[:7], "in_progress")]  # fmt: skip
    client, _ = background(script, shown, replay=replay)
    events, stream = reattached(client, after)
    assert stream.finish_reason == "tool_calls" and stream.sequence == len(script.events) - 1
    deltas = [e for e in events if isinstance(e, ToolCallDelta)]
    assert {e.index for e in deltas} == {1}
    assert (deltas[0].id, deltas[0].name) == ("call_2", "get_weather")
    assert ARGS_BERGEN[:7] + "".join(e.arguments for e in deltas) == ARGS_BERGEN
    assert ends_of(events) == [1]


def test_a_reattach_between_a_calls_two_ends_ends_it_not_again() -> None:
    """Cut after ``function_call_arguments.done`` (the call's end, read): the item's own
    ``output_item.done`` that follows ends nothing a second time."""
    script = started().call(0, 1, ARGS_OSLO)
    completed(script, [fc_item(1, ARGS_OSLO, "completed")])
    after = next(e["sequence_number"] for e in script.events
                 if e["type"] == "response.function_call_arguments.done")  # fmt: skip
    client, _ = background(script, [fc_item(1, ARGS_OSLO, "completed")])
    events, stream = reattached(client, after)
    assert stream.finish_reason == "tool_calls"
    assert [e for e in events if isinstance(e, ToolCallDelta | ToolCallEnd)] == []


def test_a_reattach_into_a_call_nobody_shows_is_a_cut() -> None:
    script = started().call(0, 1, ARGS_OSLO)
    completed(script, [fc_item(1, ARGS_OSLO, "completed")])
    client, _ = background(script, [])
    plan = plan_reattach(SPEC, response_id="resp_1", after=4, remaining_tokens=400)
    with client.open(plan) as stream, pytest.raises(MalformedChunk, match="never announced"):
        list(stream)


def test_responses_arguments_said_only_at_their_end_are_read() -> None:
    """A server that streams no pieces: the arguments the ``….done`` event repeats come as the
    call's delta before its end (and the item's own end repeats nothing)."""
    script = started().call(0, 1, "", done=False)
    where = {"item_id": "fc_1", "output_index": 0}
    script.add("response.function_call_arguments.done", arguments=ARGS_OSLO, **where)
    script.add("response.output_item.done", output_index=0,
               item=fc_item(1, ARGS_OSLO, "completed"))  # fmt: skip
    completed(script, [fc_item(1, ARGS_OSLO, "completed")])
    events, error, _ = read(client_for("openai-responses", script.body())[0])
    assert error is None
    assert calls_of(events) == [("call_1", "get_weather", ARGS_OSLO)]
    assert kinds(events) == ["C0", "C0", "E0"] and tokens_of(events) == 1
