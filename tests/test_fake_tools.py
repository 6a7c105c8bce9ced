"""The fake provider's tool calls, structured output and refusals on its three wires (issue 33),
over real HTTP; every streamed event and every body is validated with the official SDKs'
types (``openai``'s ChatCompletionChunk, ChatCompletion, ResponseStreamEvent and Response;
``anthropic``'s RawMessageStreamEvent and Message)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseFunctionToolCall, ResponseStreamEvent
from pydantic import TypeAdapter

from resumeq.core.answer import CALL_NOTE, CALL_NOTE_SCHEMA
from resumeq.core.continuation import INSTRUCTION, PARTIAL_CLOSE, PARTIAL_OPEN
from resumeq.fake import JSON_OBJECT_NOTE, SCHEMA_NOTE, FakeProvider, count_tokens
from resumeq.fake.conversation import conversation_of
from resumeq.fake.plan import plan
from resumeq.fake.responses_wire import ResponsesStream
from resumeq.fake.shape import Shape, ToolDef
from resumeq.fake.wire import Generation, InputUsage

pytestmark = pytest.mark.timeout(30)

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "description": "Where"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
    },
    "required": ["city", "unit", "days"],
    "additionalProperties": False,
}
SEARCH = {
    "type": "object",
    "properties": {
        "query": {"type": "string"},
        "filters": {
            "type": "array",
            "items": {"type": "string", "enum": ["news", "maps", "images"]},
            "maxItems": 2,
            "uniqueItems": True,
        },
        "since": {"type": "string", "format": "date"},
        "exact": {"type": "boolean"},
    },
    "required": ["query", "filters", "since", "exact"],
    "additionalProperties": False,
}
#: A document's schema: references, nesting, formats, a union.
REPORT = {
    "$defs": {
        "Item": {
            "type": "object",
            "properties": {
                "title": {"type": "string", "minLength": 3},
                "price": {"type": "number", "minimum": 0, "maximum": 500},
                "owner": {"anyOf": [{"type": "string", "format": "email"}, {"type": "null"}]},
            },
            "required": ["title", "price", "owner"],
            "additionalProperties": False,
        }
    },
    "type": "object",
    "properties": {
        "summary": {"type": "string"},
        "status": {"type": "string", "enum": ["open", "closed"]},
        "items": {"type": "array", "items": {"$ref": "#/$defs/Item"}, "minItems": 2},
        "checked": {"type": "string", "format": "date-time"},
    },
    "required": ["summary", "status", "items", "checked"],
    "additionalProperties": False,
}
TOOLS = [("get_weather", WEATHER), ("web_search", SEARCH)]
SCHEMAS = dict(TOOLS)
CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER


def valid(text: str, schema: Mapping[str, Any]) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema, format_checker=CHECKER)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


# -- what an answer came to, on any wire ---------------------------------------------------------


@dataclass
class Got:
    """An answer read back: its text, its calls (id, name, arguments), its wire's finish."""

    text: str = ""
    calls: list[tuple[str, str, str]] = field(default_factory=list)
    finish: str | None = None
    output_tokens: int | None = None
    refusal: str | None = None
    #: Whether the body ended cleanly (a stream: its terminal event arrived).
    ended: bool = False

    @property
    def named(self) -> list[tuple[str, str]]:
        return [(name, arguments) for _, name, arguments in self.calls]


@dataclass(frozen=True)
class Ask:
    """A request, wire-neutral: turns as ``(role, content)`` with tool turns as
    ``("calls", [(id, name, arguments)])`` and ``("tool", (call_id, result))``."""

    turns: tuple[tuple[str, Any], ...]
    tools: tuple[tuple[str, dict[str, Any]], ...] = ()
    choice: str | tuple[str, str] | None = None
    #: ("json_schema", schema, strict) or ("json_object",) or None.
    fmt: tuple[Any, ...] | None = None
    max_tokens: int | None = None
    extra: tuple[tuple[str, Any], ...] = ()


def sse(lines: Iterator[str]) -> Iterator[tuple[str | None, str]]:
    event: str | None = None
    for line in lines:
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            yield event, line[6:]
            event = None


class Wire:
    path: str
    kind: str

    def body(self, ask: Ask, *, stream: bool) -> dict[str, Any]:
        raise NotImplementedError

    def read(self, events: list[tuple[str | None, str]]) -> Got:
        raise NotImplementedError

    def parse(self, body: dict[str, Any]) -> Got:
        raise NotImplementedError


class Chat(Wire):
    path, kind = "/v1/chat/completions", "openai"

    @staticmethod
    def messages(turns: tuple[tuple[str, Any], ...]) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        for role, content in turns:
            if role == "calls":
                calls = [
                    {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                    for i, n, a in content
                ]
                messages.append({"role": "assistant", "content": None, "tool_calls": calls})
            elif role == "tool":
                messages.append({"role": "tool", "tool_call_id": content[0], "content": content[1]})
            else:
                messages.append({"role": role, "content": content})
        return messages

    def body(self, ask: Ask, *, stream: bool) -> dict[str, Any]:
        messages = self.messages(ask.turns)
        body: dict[str, Any] = {"model": "gpt-x", "messages": messages, "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        if ask.tools:
            body["tools"] = [
                {"type": "function", "function": {"name": n, "description": n, "parameters": p}}
                for n, p in ask.tools
            ]
        if isinstance(ask.choice, tuple):
            body["tool_choice"] = {"type": "function", "function": {"name": ask.choice[1]}}
        elif ask.choice is not None:
            body["tool_choice"] = ask.choice
        if ask.fmt is not None and ask.fmt[0] == "json_schema":
            spec = {"name": "report", "schema": ask.fmt[1], "strict": ask.fmt[2]}
            body["response_format"] = {"type": "json_schema", "json_schema": spec}
        elif ask.fmt is not None:
            body["response_format"] = {"type": "json_object"}
        if ask.max_tokens is not None:
            body["max_tokens"] = ask.max_tokens
        return {**body, **dict(ask.extra)}

    def read(self, events: list[tuple[str | None, str]]) -> Got:
        got, calls = Got(), dict[int, list[str]]()
        refusal: list[str] = []
        for _, data in events:
            if data == "[DONE]":
                got.ended = True
                continue
            chunk = ChatCompletionChunk.model_validate(json.loads(data))
            if chunk.usage is not None:
                got.output_tokens = chunk.usage.completion_tokens
            if not chunk.choices:
                continue
            choice = chunk.choices[0]
            delta = choice.delta
            got.text += delta.content or ""
            refusal.append(delta.refusal or "")
            for call in delta.tool_calls or ():
                assert call.function is not None
                if call.id is not None:  # a call's first chunk: its id, type and name
                    assert call.type == "function" and call.function.arguments == ""
                    calls[call.index] = [call.id, call.function.name or "", ""]
                else:
                    assert call.function.name is None
                    calls[call.index][2] += call.function.arguments or ""
            got.finish = choice.finish_reason or got.finish
        got.calls = [(i, n, a) for i, n, a in (calls[k] for k in sorted(calls))]
        got.refusal = "".join(refusal) or None
        return got

    def parse(self, body: dict[str, Any]) -> Got:
        completion = ChatCompletion.model_validate(body)
        message = completion.choices[0].message
        assert completion.usage is not None
        calls = [
            (c.id, c.function.name, c.function.arguments)
            for c in message.tool_calls or ()
            if c.type == "function"
        ]
        if calls and not message.content:
            assert body["choices"][0]["message"]["content"] is None
        return Got(
            message.content or "",
            calls,
            completion.choices[0].finish_reason,
            completion.usage.completion_tokens,
            message.refusal,
            ended=True,
        )


class Messages(Wire):
    path, kind = "/v1/messages", "anthropic"
    events = TypeAdapter(RawMessageStreamEvent)

    def body(self, ask: Ask, *, stream: bool) -> dict[str, Any]:
        system = [c for r, c in ask.turns if r == "system"]
        messages: list[dict[str, Any]] = []
        for role, content in ask.turns:
            if role == "calls":
                blocks = [
                    {"type": "tool_use", "id": i, "name": n, "input": json.loads(a)}
                    for i, n, a in content
                ]
                messages.append({"role": "assistant", "content": blocks})
            elif role == "tool":
                result = {"type": "tool_result", "tool_use_id": content[0], "content": content[1]}
                messages.append({"role": "user", "content": [result]})
            elif role != "system":
                messages.append({"role": role, "content": content})
        body: dict[str, Any] = {
            "model": "claude-x",
            "max_tokens": ask.max_tokens or 4096,
            "messages": messages,
            "stream": stream,
        }
        if system:
            body["system"] = [{"type": "text", "text": text} for text in system]
        if ask.tools:
            body["tools"] = [{"name": n, "description": n, "input_schema": p} for n, p in ask.tools]
        words = {"auto": "auto", "none": "none", "required": "any"}
        if isinstance(ask.choice, tuple):
            body["tool_choice"] = {"type": "tool", "name": ask.choice[1]}
        elif ask.choice is not None:
            body["tool_choice"] = {"type": words[ask.choice]}
        if ask.fmt is not None:
            body["output_config"] = {"format": {"type": "json_schema", "schema": ask.fmt[1]}}
        return {**body, **dict(ask.extra)}

    def read(self, events: list[tuple[str | None, str]]) -> Got:
        got = Got()
        blocks: dict[int, list[str]] = {}  # index: [type, id, name, text]
        for name, data in events:
            if name == "ping":  # the SDK passes over pings: they are no message event
                assert json.loads(data) == {"type": "ping"}
                continue
            event = self.events.validate_python(json.loads(data))
            assert event.type == name
            if event.type in ("content_block_start", "content_block_delta"):
                self.block(event, blocks)
            elif event.type == "message_delta":
                got.finish = event.delta.stop_reason
                got.output_tokens = event.usage.output_tokens
            got.ended = got.ended or event.type == "message_stop"
        for kind, call_id, call_name, text in (blocks[index] for index in sorted(blocks)):
            if kind == "tool_use":
                got.calls.append((call_id, call_name, text))
            elif kind == "text":
                got.text += text
        if got.finish == "refusal":
            got.refusal, got.text = got.text, ""
        return got

    @staticmethod
    def block(event: Any, blocks: dict[int, list[str]]) -> None:
        """A block opened (its type, and a call's id and name), or a piece of it."""
        if event.type == "content_block_start":
            block = event.content_block
            blocks[event.index] = [block.type, "", "", ""]
            if block.type == "tool_use":
                assert block.input == {} and block.id.startswith("toolu_")
                blocks[event.index][1:3] = [block.id, block.name]
            return
        delta = event.delta
        text = delta.partial_json if delta.type == "input_json_delta" else ""
        blocks[event.index][3] += delta.text if delta.type == "text_delta" else text

    def parse(self, body: dict[str, Any]) -> Got:
        message = Message.model_validate(body)
        got = Got(finish=message.stop_reason, output_tokens=message.usage.output_tokens)
        got.ended = True
        for block in message.content:
            if block.type == "text":
                got.text += block.text
            elif block.type == "tool_use":
                arguments = json.dumps(block.input, separators=(",", ":"), ensure_ascii=False)
                got.calls.append((block.id, block.name, arguments))
        if got.finish == "refusal":
            got.refusal, got.text = got.text, ""
        return got


class Responses(Wire):
    path, kind = "/v1/responses", "responses"
    events = TypeAdapter(ResponseStreamEvent)

    def body(self, ask: Ask, *, stream: bool) -> dict[str, Any]:
        items: list[dict[str, Any]] = []
        for role, content in ask.turns:
            if role == "calls":
                items.extend(
                    {"type": "function_call", "call_id": i, "name": n, "arguments": a}
                    for i, n, a in content
                )
            elif role == "tool":
                items.append(
                    {"type": "function_call_output", "call_id": content[0], "output": content[1]}
                )
            else:
                items.append({"role": role, "content": content})
        body: dict[str, Any] = {"model": "gpt-x", "input": items, "stream": stream}
        if ask.tools:
            body["tools"] = [
                {"type": "function", "name": n, "description": n, "parameters": p, "strict": True}
                for n, p in ask.tools
            ]
        if isinstance(ask.choice, tuple):
            body["tool_choice"] = {"type": "function", "name": ask.choice[1]}
        elif ask.choice is not None:
            body["tool_choice"] = ask.choice
        if ask.fmt is not None and ask.fmt[0] == "json_schema":
            fmt = {"type": "json_schema", "name": "report", "schema": ask.fmt[1]}
            body["text"] = {"format": {**fmt, "strict": ask.fmt[2]}}
        elif ask.fmt is not None:
            body["text"] = {"format": {"type": "json_object"}}
        if ask.max_tokens is not None:
            body["max_output_tokens"] = ask.max_tokens
        return {**body, **dict(ask.extra)}

    def read(self, events: list[tuple[str | None, str]]) -> Got:
        got = Got()
        calls: dict[str, list[str]] = {}
        refusal: list[str] = []
        for number, (name, data) in enumerate(events):
            event = self.events.validate_python(json.loads(data))
            assert event.type == name and event.sequence_number == number
            if event.type == "response.output_item.added" and event.item.type == "function_call":
                item = event.item
                assert item.arguments == "" and item.status == "in_progress"
                assert item.id is not None and item.id.startswith("fc_")
                calls[item.id] = [item.call_id, item.name, ""]
            elif event.type == "response.function_call_arguments.delta":
                calls[event.item_id][2] += event.delta
            elif event.type == "response.function_call_arguments.done":
                assert event.arguments == calls[event.item_id][2]
            elif event.type == "response.output_text.delta":
                got.text += event.delta
            elif event.type == "response.refusal.delta":
                refusal.append(event.delta)
            elif event.type == "response.refusal.done":
                assert event.refusal == "".join(refusal)
            elif event.type in ("response.completed", "response.incomplete"):
                response = event.response
                got.finish, got.ended = response.status, True
                assert response.usage is not None
                got.output_tokens = response.usage.output_tokens
                done = [
                    (o.call_id, o.name, o.arguments)
                    for o in response.output
                    if o.type == "function_call"
                ]
                assert done == [tuple(c) for c in calls.values()]
        got.calls = [(c[0], c[1], c[2]) for c in calls.values()]
        got.refusal = "".join(refusal) or None
        return got

    def parse(self, body: dict[str, Any]) -> Got:
        response = Response.model_validate(body)
        assert response.usage is not None
        got = Got(finish=response.status, output_tokens=response.usage.output_tokens, ended=True)
        for item in response.output:
            if item.type == "function_call":
                got.calls.append((item.call_id, item.name, item.arguments))
            elif item.type == "message":
                for part in item.content:
                    if part.type == "output_text":
                        got.text += part.text
                    else:
                        got.refusal = part.refusal
        return got


WIRES = [Chat(), Messages(), Responses()]
IDS = ["chat", "messages", "responses"]
#: What each wire calls a finish with tool calls, a cut by the budget, a natural end.
TOOL_FINISH = {"openai": "tool_calls", "anthropic": "tool_use", "responses": "completed"}
LENGTH_FINISH = {"openai": "length", "anthropic": "max_tokens", "responses": "incomplete"}
STOP_FINISH = {"openai": "stop", "anthropic": "end_turn", "responses": "completed"}
ID_PREFIX = {"openai": "call_", "anthropic": "toolu_", "responses": "call_"}


@pytest.fixture(params=WIRES, ids=IDS)
def wire(request: pytest.FixtureRequest) -> Wire:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def http(fake: FakeProvider) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fake.url, timeout=10) as client:
        yield client


def stream(http: httpx.Client, wire: Wire, ask: Ask) -> Got:
    """A streamed answer, read to its end or to where the connection went."""
    events: list[tuple[str | None, str]] = []
    lines: list[str] = []
    try:
        with http.stream("POST", wire.path, json=wire.body(ask, stream=True)) as response:
            assert response.status_code == 200, response.read()
            for line in response.iter_lines():
                lines.append(line)
    except httpx.TransportError:
        pass  # a fault hung up: what came before is what was sent
    events.extend(sse(iter(lines)))
    return wire.read(events)


def complete(http: httpx.Client, wire: Wire, ask: Ask) -> Got:
    response = http.post(wire.path, json=wire.body(ask, stream=False))
    assert response.status_code == 200, response.text
    return wire.parse(response.json())


def canonical(http: httpx.Client, wire: Wire, ask: Ask) -> dict[str, Any]:
    """The fake's uncut answer, asked in the wire's own form."""
    body = wire.body(ask, stream=False)
    response = http.post("/_fake/canonical", json=body)
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def user(text: str, *, system: str | None = None) -> tuple[tuple[str, Any], ...]:
    return ((("system", system),) if system else ()) + (("user", text),)


def continued(wire: Wire, turns: tuple[tuple[str, Any], ...], prefix: str) -> tuple[Any, ...]:
    """The turns of a continuation from ``prefix``: Anthropic's prefill (without trailing
    white space, which it refuses), or the instruction resumeq writes on the OpenAI wires."""
    if wire.kind == "anthropic":
        return (*turns, ("assistant", prefix.rstrip()))
    return (*turns, ("user", f"{INSTRUCTION}{PARTIAL_OPEN}{prefix}{PARTIAL_CLOSE}"))


def sent_prefix(wire: Wire, prefix: str) -> str:
    return prefix.rstrip() if wire.kind == "anthropic" else prefix


# -- tool calls ----------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [1, 2])
def test_calls_parse_with_the_sdk_types_are_valid_and_stream_as_they_complete(
    http: httpx.Client, wire: Wire, count: int
) -> None:
    marker = "[fake:tool]" if count == 1 else "[fake:tools=2]"
    ask = Ask(user(f"Plan a trip to the coast. {marker}"), tools=tuple(TOOLS))
    streamed, whole, uncut = (
        stream(http, wire, ask),
        complete(http, wire, ask),
        canonical(http, wire, ask),
    )
    expected = [(c["name"], c["arguments"]) for c in uncut["tool_calls"]]
    assert [name for name, _ in expected] == [n for n, _ in TOOLS[:count]]
    assert streamed.named == whole.named == expected
    assert streamed.text == whole.text == uncut["text"] != ""
    for _, name, arguments in streamed.calls:
        assert valid(arguments, SCHEMAS[name])
        assert 30 <= len(next(c for c in uncut["tool_calls"] if c["name"] == name)["tokens"]) <= 200
    ids = [i for i, _, _ in streamed.calls + whole.calls]
    assert len(set(ids)) == 2 * count and all(i.startswith(ID_PREFIX[wire.kind]) for i in ids)
    assert streamed.finish == whole.finish == TOOL_FINISH[wire.kind]
    billed = uncut["count"] + sum(c["count"] for c in uncut["tool_calls"])
    assert streamed.output_tokens == whole.output_tokens == billed
    assert streamed.ended


def test_the_arguments_are_of_the_seed_the_name_and_the_schema_only(http: httpx.Client) -> None:
    wire = Chat()
    twice = canonical(http, wire, Ask(user("Which way? [fake:tools=3]"), tools=(TOOLS[0],)))
    assert len({c["arguments"] for c in twice["tool_calls"]}) == 1  # one tool called thrice
    other = canonical(http, wire, Ask(user("Which way now? [fake:tool]"), tools=(TOOLS[0],)))
    assert other["tool_calls"][0]["arguments"] != twice["tool_calls"][0]["arguments"]
    renamed = canonical(
        http, wire, Ask(user("Which way? [fake:tool]"), tools=(("forecast", WEATHER),))
    )
    assert renamed["tool_calls"][0]["arguments"] != twice["tool_calls"][0]["arguments"]


def test_tool_choice_decides_the_text_and_the_calls(http: httpx.Client, wire: Wire) -> None:
    prompt, tools = "Look around the harbour. [fake:tools=2]", tuple(TOOLS)
    named = complete(http, wire, Ask(user(prompt), tools=tools, choice=("named", "web_search")))
    assert [n for _, n, _ in named.calls] == ["web_search"] and named.text == ""
    auto = canonical(http, wire, Ask(user(prompt), tools=tools))
    assert named.calls[0][2] == auto["tool_calls"][1]["arguments"]  # same tool, same arguments
    required = stream(
        http, wire, Ask(user("Look around. [fake:tools=2]"), tools=tools, choice="required")
    )
    assert [n for _, n, _ in required.calls] == ["get_weather", "web_search"]
    assert required.text == ""
    forced = complete(http, wire, Ask(user("Look around."), tools=tools, choice="required"))
    assert [n for _, n, _ in forced.calls] == ["get_weather"] and forced.text == ""
    none = complete(http, wire, Ask(user(prompt), tools=tools, choice="none"))
    assert none.calls == [] and none.text == auto["text"] and none.finish == STOP_FINISH[wire.kind]
    unmarked = complete(http, wire, Ask(user("Look around."), tools=tools))
    assert unmarked.calls == [] and unmarked.text
    no_tools = complete(http, wire, Ask(user(prompt)))
    assert no_tools.calls == [] and no_tools.text == auto["text"]
    serial: tuple[str, Any] = ("parallel_tool_calls", False)
    if wire.kind == "anthropic":
        serial = ("tool_choice", {"type": "auto", "disable_parallel_tool_use": True})
    assert len(complete(http, wire, Ask(user(prompt), tools=tools, extra=(serial,))).calls) == 1


def test_a_choice_naming_no_tool_and_a_bad_marker_are_refused(
    http: httpx.Client, wire: Wire
) -> None:
    bad = wire.body(Ask(user("Go."), tools=(TOOLS[0],), choice=("named", "nope")), stream=False)
    assert http.post(wire.path, json=bad).status_code == 400
    for marker in ("[fake:tools=9]", "[fake:tools=0]", "[fake:tool=2]", "[fake:tooling]"):
        body = wire.body(Ask(user(f"Go. {marker}"), tools=(TOOLS[0],)), stream=False)
        response = http.post(wire.path, json=body)
        assert response.status_code == 400 and "[fake:" in response.text


def test_a_cut_inside_a_call_is_asked_again_from_the_text_and_gets_the_same_calls(
    fake: FakeProvider, http: httpx.Client, wire: Wire
) -> None:
    ask = Ask(user("Organise the market day. [fake:tools=2]"), tools=tuple(TOOLS))
    uncut = canonical(http, wire, ask)
    first = uncut["tool_calls"][0]["count"]
    fake.add_faults([{"kind": "disconnect", "after_tokens": uncut["count"] + first + 3}])
    cut = stream(http, wire, ask)
    assert not cut.ended and cut.text == uncut["text"]
    assert cut.calls[0][1:] == (uncut["tool_calls"][0]["name"], uncut["tool_calls"][0]["arguments"])
    assert cut.calls[1][2] == "".join(uncut["tool_calls"][1]["tokens"][:3])
    journal = fake.journal(settle_s=1)[-1]
    assert [(c["name"], c["tokens"], c["complete"]) for c in journal["tool_calls"]] == [
        ("get_weather", first, True),
        ("web_search", 3, False),
    ]
    assert journal["tool_calls"][1]["arguments"] == cut.calls[1][2]
    assert journal["output_tokens_billed"] == uncut["count"] + first + 3
    again = Ask(continued(wire, ask.turns, uncut["text"]), tools=tuple(TOOLS))
    rest = stream(http, wire, again)
    assert rest.text == uncut["text"][len(sent_prefix(wire, uncut["text"])) :]
    assert rest.named == [(c["name"], c["arguments"]) for c in uncut["tool_calls"]]
    assert {i for i, _, _ in rest.calls}.isdisjoint(i for i, _, _ in cut.calls)
    entry = fake.journal(settle_s=1)[-1]
    billed = sum(c["count"] for c in uncut["tool_calls"]) + count_tokens(rest.text)
    assert entry["is_continuation"] and entry["output_tokens_billed"] == billed
    assert rest.output_tokens == billed
    # Asked again for the cut call alone: the same arguments, under a new id.
    one = Ask(
        continued(wire, ask.turns, uncut["text"]),
        tools=tuple(TOOLS),
        choice=("named", "web_search"),
    )
    redone = complete(http, wire, one)
    assert redone.named == [("web_search", uncut["tool_calls"][1]["arguments"])]
    assert redone.text == ""


def test_a_call_continued_from_its_partial_arguments_gets_the_rest_of_them_as_text(
    fake: FakeProvider, http: httpx.Client, wire: Wire
) -> None:
    ask = Ask(user("Organise the market day. [fake:tools=2]"), tools=tuple(TOOLS))
    uncut = canonical(http, wire, ask)
    second = uncut["tool_calls"][1]
    partial = "".join(second["tokens"][:5])
    note = f"{CALL_NOTE}web_search{CALL_NOTE_SCHEMA}{json.dumps(SEARCH)}"
    turns = (("system", note), *continued(wire, ask.turns, partial))
    rest = complete(http, wire, Ask(turns, tools=tuple(TOOLS), choice="none"))
    # The arguments' rest, as text: no call, no document of its own, nothing again.
    assert rest.calls == [] and sent_prefix(wire, partial) + rest.text == second["arguments"]
    entry = fake.journal(settle_s=1)[-1]
    assert entry["is_continuation"] and entry["output_tokens_billed"] == second["count"] - 5
    assert rest.output_tokens == second["count"] - 5
    # The note without a tool's name is refused, not answered with a guess.
    bad = (("system", f"{CALL_NOTE}{CALL_NOTE_SCHEMA}{{}}"), *continued(wire, ask.turns, partial))
    refused = http.post(wire.path, json=wire.body(Ask(bad, tools=tuple(TOOLS)), stream=False))
    assert refused.status_code == 400 and "names no tool" in refused.text


def test_max_tokens_inside_a_call_sends_its_partial_arguments(
    http: httpx.Client, wire: Wire
) -> None:
    ask = Ask(user("Check the tides. [fake:tools=2]"), tools=tuple(TOOLS))
    uncut = canonical(http, wire, ask)
    budget = uncut["count"] + 5
    capped = Ask(ask.turns, ask.tools, max_tokens=budget)
    streamed, whole = stream(http, wire, capped), complete(http, wire, capped)
    partial = "".join(uncut["tool_calls"][0]["tokens"][:5])
    for got in (streamed, whole):
        assert got.finish == LENGTH_FINISH[wire.kind] and got.output_tokens == budget
        assert got.text == uncut["text"]
    assert [c[2] for c in streamed.calls] == [partial]
    if wire.kind != "anthropic":  # Anthropic's input is an object: the partial one is {}
        assert [c[2] for c in whole.calls] == [partial]


def test_after_a_tool_result_the_answer_is_text(http: httpx.Client, wire: Wire) -> None:
    ask = Ask(user("Will it rain in the valley? [fake:tool]"), tools=(TOOLS[0],))
    first = complete(http, wire, ask)
    call_id, name, arguments = first.calls[0]
    turns: tuple[tuple[str, Any], ...] = (
        *ask.turns,
        ("calls", [(call_id, name, arguments)]),
        ("tool", (call_id, "Light rain until noon, then sun.")),
    )
    answer = complete(http, wire, Ask(turns, tools=(TOOLS[0],)))
    assert answer.calls == [] and answer.text and answer.text != first.text
    assert answer.finish == STOP_FINISH[wire.kind]
    assert answer.text == canonical(http, wire, Ask(turns, tools=(TOOLS[0],)))["text"]
    other = (*turns[:-1], ("tool", (call_id, "Snow.")))
    assert complete(http, wire, Ask(other, tools=(TOOLS[0],))).text != answer.text
    # A continuation of that answer is located in it, and still makes no call.
    prefix = answer.text[: len(answer.text) // 2]
    rest = complete(http, wire, Ask(continued(wire, turns, prefix), tools=(TOOLS[0],)))
    assert sent_prefix(wire, prefix) + rest.text == answer.text and rest.calls == []


def test_a_corrupt_fault_breaks_the_arguments_and_the_answer_ends_as_usual(
    fake: FakeProvider, http: httpx.Client, wire: Wire
) -> None:
    ask = Ask(user("Book the ferry. [fake:tools=2]"), tools=tuple(TOOLS))
    uncut = canonical(http, wire, ask)
    at = uncut["count"] + 4
    fake.add_faults(
        [{"kind": "corrupt", "after_tokens": at}, {"kind": "corrupt", "after_tokens": at}]
    )
    for got in (stream(http, wire, ask), complete(http, wire, ask)):
        assert got.ended and got.finish == TOOL_FINISH[wire.kind]
        assert got.text == uncut["text"] and [n for _, n, _ in got.calls] == [
            "get_weather",
            "web_search",
        ]
        assert not any(valid(a, SCHEMAS[n]) for _, n, a in got.calls)
        if wire.kind != "anthropic":
            head = "".join(uncut["tool_calls"][0]["tokens"][:4])
            assert got.calls[0][2].startswith(head) and got.calls[0][2].endswith("<garbage>")
    journal = fake.journal(settle_s=1)[-2:]
    assert all(not c["complete"] for entry in journal for c in entry["tool_calls"])
    assert [e["fault"]["kind"] for e in journal] == ["corrupt", "corrupt"]


def test_a_paced_stream_sends_the_same_calls(fake: FakeProvider, http: httpx.Client) -> None:
    fake.token_delay_ms = 1  # the pacing thread sends it
    ask = Ask(user("Walk the pier. [fake:tools=2]"), tools=tuple(TOOLS))
    uncut = canonical(http, Chat(), ask)
    got = stream(http, Chat(), ask)
    assert got.named == [(c["name"], c["arguments"]) for c in uncut["tool_calls"]]
    assert [c["complete"] for c in fake.journal(settle_s=1)[-1]["tool_calls"]] == [True, True]


def test_continuous_usage_counts_the_arguments_as_they_go(http: httpx.Client) -> None:
    ask = Ask(user("Go north. [fake:tool]"), tools=(TOOLS[0],))
    body = {
        **Chat().body(ask, stream=True),
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        chunks = [
            ChatCompletionChunk.model_validate(json.loads(data))
            for _, data in sse(response.iter_lines())
            if data != "[DONE]"
        ]
    used = [c.usage.completion_tokens for c in chunks if c.usage is not None]
    uncut = canonical(http, Chat(), ask)
    assert used == sorted(used) and used[-1] == uncut["count"] + uncut["tool_calls"][0]["count"]


def test_a_background_response_carries_its_calls_into_every_replay(
    fake: FakeProvider, http: httpx.Client
) -> None:
    wire = Responses()
    ask = Ask(user("Map the islands. [fake:tools=2]"), tools=tuple(TOOLS))
    body = {**wire.body(ask, stream=True), "background": True}
    with http.stream("POST", wire.path, json=body) as response:
        events = list(sse(response.iter_lines()))
    got = wire.read(events)
    uncut = canonical(http, wire, ask)
    assert got.named == [(c["name"], c["arguments"]) for c in uncut["tool_calls"]]
    response_id = json.loads(events[0][1])["response"]["id"]
    # From inside the second call's arguments on: the rest of them, then the end.
    deltas = [
        i for i, (name, _) in enumerate(events) if name == "response.function_call_arguments.delta"
    ]
    after = deltas[-4]
    replay = http.get(
        f"{wire.path}/{response_id}", params={"stream": "true", "starting_after": after}
    )
    tail = list(sse(iter(replay.text.splitlines())))
    assert [json.loads(d)["sequence_number"] for _, d in tail] == list(
        range(after + 1, len(events))
    )
    pieces = [
        json.loads(d)["delta"] for n, d in tail if n == "response.function_call_arguments.delta"
    ]
    assert "".join(pieces) == "".join(uncut["tool_calls"][1]["tokens"][-3:])
    kept = Response.model_validate(http.get(f"{wire.path}/{response_id}").json())
    calls = [(o.name, o.arguments) for o in kept.output if o.type == "function_call"]
    assert calls == got.named and kept.tools[0].type == "function"


# -- structured output ---------------------------------------------------------------------------

FORMS = [
    pytest.param(Chat(), ("json_schema", REPORT, True), id="chat-json_schema"),
    pytest.param(Chat(), ("json_object",), id="chat-json_object"),
    pytest.param(Messages(), ("json_schema", REPORT, True), id="messages-output_config"),
    pytest.param(Responses(), ("json_schema", REPORT, True), id="responses-json_schema"),
    pytest.param(Responses(), ("json_object",), id="responses-json_object"),
]


@pytest.mark.parametrize(("wire", "fmt"), FORMS)
def test_a_document_streams_as_it_completes_and_is_valid(
    http: httpx.Client, wire: Wire, fmt: tuple[Any, ...]
) -> None:
    ask = Ask(user("Report on the stock. [fake:code]"), fmt=fmt)
    streamed, whole, uncut = (
        stream(http, wire, ask),
        complete(http, wire, ask),
        canonical(http, wire, ask),
    )
    assert streamed.text == whole.text == uncut["text"] == uncut["document"]
    assert 50 <= uncut["count"] <= 500 and streamed.output_tokens == uncut["count"]
    assert valid(streamed.text, REPORT if fmt[0] == "json_schema" else {"type": "object"})
    assert streamed.finish == whole.finish == STOP_FINISH[wire.kind]


def test_the_anthropic_beta_output_format_is_the_same_document(http: httpx.Client) -> None:
    wire = Messages()
    ask = Ask(user("Report on the stock."), fmt=("json_schema", REPORT, True))
    beta = {
        **wire.body(ask, stream=False),
        "output_format": {"type": "json_schema", "schema": REPORT},
    }
    del beta["output_config"]
    response = http.post(wire.path, json=beta)
    assert wire.parse(response.json()).text == canonical(http, wire, ask)["document"]


def test_a_document_is_continued_from_its_schema_note_exactly(
    http: httpx.Client, wire: Wire
) -> None:
    ask = Ask(user("Report on the warehouse."), fmt=("json_schema", REPORT, True))
    document = canonical(http, wire, ask)["document"]
    note = SCHEMA_NOTE + json.dumps(REPORT)
    noted = user("Report on the warehouse.", system=note)
    assert complete(http, wire, Ask(noted)).text == document  # the note is no part of the seed
    prefix = document[: len(document) // 3]
    rest = stream(http, wire, Ask(continued(wire, noted, prefix)))
    assert sent_prefix(wire, prefix) + rest.text == document and rest.ended
    if wire.kind != "anthropic":
        obj = canonical(http, wire, Ask(user("Any facts."), fmt=("json_object",)))["document"]
        again = complete(
            http, wire, Ask(continued(wire, user("Any facts.", system=JSON_OBJECT_NOTE), obj[:40]))
        )
        assert obj[:40] + again.text == obj


@pytest.mark.parametrize("wire", [Chat(), Responses()], ids=["chat", "responses"])
def test_a_constraining_format_answers_a_continuation_with_the_whole_document(
    fake: FakeProvider, http: httpx.Client, wire: Wire
) -> None:
    ask = Ask(user("Report on the orchard."), fmt=("json_schema", REPORT, True))
    document = canonical(http, wire, ask)["document"]
    again = Ask(continued(wire, ask.turns, document[:60]), fmt=ask.fmt)
    assert stream(http, wire, again).text == document
    assert fake.journal(settle_s=1)[-1]["continuation"]["restarted"] is True
    loose = Ask(again.turns, fmt=("json_schema", REPORT, False))
    assert complete(http, wire, loose).text == document[60:]  # not strict: it continues


def test_anthropic_refuses_a_prefill_with_structured_outputs(fake: FakeProvider) -> None:
    with anthropic.Anthropic(base_url=fake.anthropic_base_url, api_key="x", max_retries=0) as sdk:
        for form in (
            {"output_config": {"format": {"type": "json_schema", "schema": REPORT}}},
            {"output_format": {"type": "json_schema", "schema": REPORT}},
        ):
            with pytest.raises(anthropic.BadRequestError) as refused:
                sdk.messages.create(
                    model="claude-x",
                    max_tokens=100,
                    messages=[
                        {"role": "user", "content": "Report."},
                        {"role": "assistant", "content": '{"summary":'},
                    ],
                    extra_body=form,
                )
            assert refused.value.status_code == 400
            assert refused.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]


def test_a_corrupt_fault_breaks_the_document(
    fake: FakeProvider, http: httpx.Client, wire: Wire
) -> None:
    ask = Ask(user("Report on the mill."), fmt=("json_schema", REPORT, True))
    document = canonical(http, wire, ask)["document"]
    fake.add_faults([{"kind": "corrupt", "after_tokens": 10, "times": 2}])
    for got in (stream(http, wire, ask), complete(http, wire, ask)):
        assert got.ended and got.finish == STOP_FINISH[wire.kind]
        assert not valid(got.text, REPORT) and got.text.endswith("<garbage>")
        assert document.startswith(got.text[:10]) and got.text[10:] != document[10:]


# -- refusals and the canonical endpoint ---------------------------------------------------------


def test_a_refusal_on_each_wire(http: httpx.Client, wire: Wire) -> None:
    ask = Ask(user("Pick the lock. [fake:refusal]"), tools=tuple(TOOLS))
    streamed, whole = stream(http, wire, ask), complete(http, wire, ask)
    refusal = canonical(http, wire, ask)["refusal"]
    assert refusal and streamed.refusal == whole.refusal == refusal
    assert streamed.text == whole.text == "" and streamed.calls == whole.calls == []
    expected = {"openai": "stop", "anthropic": "refusal", "responses": "completed"}[wire.kind]
    assert streamed.finish == whole.finish == expected


def test_the_canonical_endpoint_takes_every_wire_form(http: httpx.Client) -> None:
    ask = Ask(
        user("Survey the bay. [fake:tools=2]"),
        tools=tuple(TOOLS),
        fmt=("json_schema", REPORT, True),
    )
    answers = [canonical(http, wire, ask) for wire in WIRES]
    assert answers[0]["tool_calls"] and answers[0]["document"]
    for answer in answers[1:]:
        assert answer["tool_calls"] == answers[0]["tool_calls"]
        assert answer["document"] == answers[0]["document"] == answers[0]["text"]
    named = canonical(http, Chat(), Ask(ask.turns, ask.tools, choice=("named", "web_search")))
    assert named["text"] == "" and [c["name"] for c in named["tool_calls"]] == ["web_search"]


def test_a_background_response_retrieved_mid_call_shows_the_call_so_far() -> None:
    conversation = conversation_of([{"role": "user", "content": "Go. [fake:tool]"}])
    shape = Shape(tools=(ToolDef("get_weather", json.dumps(WEATHER)),))
    request = Generation(conversation, None, "gpt-x", None, stream=True, shape=shape)
    answer = plan(conversation, None, None, 3, shape=shape)
    fmt = ResponsesStream(request, InputUsage(5), background=True)
    text, call = answer.segments()
    for segment in (text, call):
        fmt.start(segment)
        fmt.delta(segment, "".join(segment.pieces[:2]), 2)
        if segment is text:
            fmt.delta(segment, "".join(segment.pieces[2:]), 3)
            fmt.stop(segment)
    message, partial = fmt.output_so_far()
    assert message["type"] == "message" and message["status"] == "completed"
    shown = ResponseFunctionToolCall.model_validate(partial)
    assert shown.status == "in_progress" and shown.name == "get_weather"
    assert call.call is not None and shown.arguments == "".join(call.pieces[:2])
    assert (shown.id, shown.call_id) == (call.call.item_id, call.call.id)
