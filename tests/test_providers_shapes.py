"""What each wire sends for a job's tools, tool choice, response format and tool messages
(SPEC §23), held to the official SDKs' request types: every body is validated whole by
``openai``'s and ``anthropic``'s ``create`` params (a key the type does not know is dropped by
the validation, so the body must come back equal). A plan without shape sends the bytes it
sent before tools."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import httpx
import pytest
from anthropic.types.message_create_params import MessageCreateParamsStreaming
from openai.types.chat.completion_create_params import CompletionCreateParamsStreaming
from openai.types.responses.response_create_params import ResponseCreateParamsStreaming
from pydantic import TypeAdapter

from resumeq.core.continuation import Shape, plan_request
from resumeq.core.errors import FatalProviderError
from resumeq.core.settings import ProviderProfile
from resumeq.core.spec import JobSpec, ResponseFormat, parse_spec
from resumeq.providers import ProviderClient, make_client

PARAMS: dict[str, TypeAdapter[Any]] = {
    "openai": TypeAdapter(CompletionCreateParamsStreaming),
    "anthropic": TypeAdapter(MessageCreateParamsStreaming),
    "openai-responses": TypeAdapter(ResponseCreateParamsStreaming),
}
KINDS = list(PARAMS)

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": ["string", "null"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather now.",
                                      "parameters": WEATHER_SCHEMA, "strict": True}},
    {"type": "function", "function": {"name": "get_time"}},
]  # fmt: skip
ANSWER_SCHEMA = {"type": "object", "properties": {"summary": {"type": "string"}},
                 "required": ["summary"], "additionalProperties": False}  # fmt: skip
JSON_SCHEMA = {
    "type": "json_schema",
    "json_schema": {"name": "answer", "description": "An answer.", "schema": ANSWER_SCHEMA,
                    "strict": True},
}  # fmt: skip
CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Oslo and Bergen?"},
    {"role": "assistant", "content": "Checking both.", "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "unit": null}'}},
        {"id": "call_2", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Bergen", "unit": "C"}'}},
    ]},
    {"role": "tool", "tool_call_id": "call_1", "content": "rain, 8 C"},
    {"role": "tool", "tool_call_id": "call_2", "content": "sun, 12 C"},
    {"role": "user", "content": "And tomorrow?"},
]  # fmt: skip


def spec(**over: Any) -> JobSpec:
    return parse_spec({"messages": CONVERSATION, "provider": "p", "model": "m",
                       "budget_tokens": 300, **over})  # fmt: skip


def client(kind: str, **over: Any) -> ProviderClient:
    base = "http://p.invalid" if kind == "anthropic" else "http://p.invalid/v1"
    profile = ProviderProfile.model_validate({"kind": kind, "base_url": base, **over})
    return make_client(profile, httpx.Client())  # bodies only: nothing is sent


def body_of(
    c: ProviderClient, job: JobSpec, prefix: str = "", shape: Shape | None = None
) -> dict[str, Any]:
    """The plan's body (with ``shape`` instead of the planner's, if given), after checking it
    against the SDK's request type of its wire."""
    plan = plan_request(job, c.profile, prefix=prefix, remaining_tokens=200)
    if shape is not None:
        plan = dataclasses.replace(plan, shape=shape)
    body = c.body(plan)
    adapter = PARAMS[c.profile.kind]
    assert plain(adapter.validate_python(body)) == body, "a field the SDK does not know"
    return body


def plain(value: Any) -> Any:
    """A validated request as plain JSON (the SDK's iterables read out)."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return [plain(v) for v in value]


# -- tools, tool choice, response format ----------------------------------------------------------

WIRE_TOOLS = {
    "openai": TOOLS,
    "anthropic": [
        {"name": "get_weather", "description": "The weather now.", "input_schema": WEATHER_SCHEMA,
         "strict": True},
        {"name": "get_time", "input_schema": {"type": "object", "properties": {}}},
    ],
    "openai-responses": [
        {"type": "function", "name": "get_weather", "description": "The weather now.",
         "parameters": WEATHER_SCHEMA, "strict": True},
        # Said, not left out: a Responses request that omits it is made strict.
        {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}},
         "strict": False},
    ],
}  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
def test_tools_in_each_wires_form(kind: str) -> None:
    assert body_of(client(kind), spec(tools=TOOLS))["tools"] == WIRE_TOOLS[kind]


NAMED = {"type": "function", "function": {"name": "get_time"}}
WIRE_CHOICES: dict[str, list[Any]] = {
    "openai": ["auto", "none", "required", NAMED],
    "anthropic": [{"type": "auto"}, {"type": "none"}, {"type": "any"},
                  {"type": "tool", "name": "get_time"}],
    "openai-responses": ["auto", "none", "required", {"type": "function", "name": "get_time"}],
}  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", range(4))
def test_tool_choice_in_each_wires_form(kind: str, n: int) -> None:
    choice = ["auto", "none", "required", NAMED][n]
    body = body_of(client(kind), spec(tools=TOOLS, tool_choice=choice))
    assert body["tool_choice"] == WIRE_CHOICES[kind][n]


WIRE_SCHEMA: dict[str, dict[str, Any]] = {
    "openai": {"response_format": JSON_SCHEMA},
    "anthropic": {"output_config": {"format": {"type": "json_schema", "schema": ANSWER_SCHEMA}}},
    "openai-responses": {"text": {"format": {"type": "json_schema", "name": "answer",
                                             "description": "An answer.",
                                             "schema": ANSWER_SCHEMA, "strict": True}}},
}  # fmt: skip
WIRE_JSON_OBJECT: dict[str, dict[str, Any]] = {
    "openai": {"response_format": {"type": "json_object"}},
    "anthropic": {},  # no form of its own: the job's instruction asks for it
    "openai-responses": {"text": {"format": {"type": "json_object"}}},
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("prefix", ["", '{"summary": "Rain in Os'])
def test_response_format_in_each_wires_form(kind: str, prefix: str) -> None:
    """A plan's response format, fresh and beside a continuation's prefill or instruction (when
    a continuation sends one is the planner's choice): only its own fields are added."""
    mode = "prefill" if kind == "anthropic" else "instruction"
    c = client(kind, continue_mode=mode)
    plain_body = body_of(c, spec(), prefix)
    for fmt, want in [(JSON_SCHEMA, WIRE_SCHEMA[kind]), ({"type": "json_object"},
                                                        WIRE_JSON_OBJECT[kind])]:  # fmt: skip
        shape = Shape(response_format=ResponseFormat.model_validate(fmt))
        assert body_of(c, spec(), prefix, shape) == {**plain_body, **want}


def test_a_schema_without_strict_is_not_made_strict_on_responses() -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA}}
    body = body_of(client("openai-responses"), spec(response_format=fmt))
    assert body["text"] == {"format": {"type": "json_schema", "name": "answer",
                                       "schema": ANSWER_SCHEMA, "strict": False}}  # fmt: skip
    chat = body_of(client("openai"), spec(response_format=fmt))
    assert chat["response_format"] == fmt


def test_a_fresh_request_sends_the_jobs_response_format() -> None:
    """Through the planner: a fresh attempt asks for the document with the wire's own form."""
    for kind in ("openai", "openai-responses"):
        body = body_of(client(kind), spec(response_format=JSON_SCHEMA))
        assert {k: body[k] for k in WIRE_SCHEMA[kind]} == WIRE_SCHEMA[kind]
    body = body_of(client("anthropic"), spec(response_format=JSON_SCHEMA))
    assert body["output_config"] == WIRE_SCHEMA["anthropic"]["output_config"]


# -- tool messages -------------------------------------------------------------------------------


def test_chat_tool_messages() -> None:
    messages = body_of(client("openai"), spec())["messages"]
    assert messages[2:5] == [
        {"role": "assistant", "content": "Checking both.",
         "tool_calls": CONVERSATION[2]["tool_calls"]},
        {"role": "tool", "tool_call_id": "call_1", "content": "rain, 8 C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "sun, 12 C"},
    ]  # fmt: skip
    calls_only = [*CONVERSATION[:2], {**CONVERSATION[2], "content": ""}, *CONVERSATION[3:]]
    body = body_of(client("openai"), parse_spec({"messages": calls_only, "provider": "p",
                                                 "model": "m", "budget_tokens": 300}))  # fmt: skip
    assert body["messages"][2]["content"] is None


def test_anthropic_tool_messages_alternate_the_roles() -> None:
    """The calls are ``tool_use`` blocks (their arguments parsed), the results of one turn a
    single user message of ``tool_result`` blocks; the next user message stays its own."""
    body = body_of(client("anthropic"), spec())
    assert body["system"] == [{"type": "text", "text": "You are terse."}]
    assert body["messages"] == [
        {"role": "user", "content": "Weather in Oslo and Bergen?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Checking both."},
            {"type": "tool_use", "id": "call_1", "name": "get_weather",
             "input": {"city": "Oslo", "unit": None}},
            {"type": "tool_use", "id": "call_2", "name": "get_weather",
             "input": {"city": "Bergen", "unit": "C"}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "call_1", "content": "rain, 8 C"},
            {"type": "tool_result", "tool_use_id": "call_2", "content": "sun, 12 C"},
        ]},
        {"role": "user", "content": "And tomorrow?"},
    ]  # fmt: skip


def test_anthropic_caches_a_conversation_that_ends_in_tool_results() -> None:
    job = parse_spec({"messages": CONVERSATION[:5], "provider": "p", "model": "m",
                      "budget_tokens": 300})  # fmt: skip
    last = body_of(client("anthropic", cache_prompt=True), job)["messages"][-1]
    assert [b.get("cache_control") for b in last["content"]] == [None, {"type": "ephemeral"}]


def test_anthropic_prefill_after_tool_results_keeps_its_trim() -> None:
    job = parse_spec({"messages": CONVERSATION[:5], "provider": "p", "model": "m",
                      "budget_tokens": 300})  # fmt: skip
    body = body_of(client("anthropic", continue_mode="prefill"), job, prefix="Oslo: rain. ")
    assert body["messages"][-2]["content"][0]["type"] == "tool_result"
    assert body["messages"][-1] == {"role": "assistant", "content": "Oslo: rain."}


def test_anthropic_refuses_arguments_that_are_no_object() -> None:
    """Enqueue refuses such arguments; a record written before that rule (read back
    without it) still never reaches the wire as a tool_use whose input is not an object."""
    whole = [*CONVERSATION[:2], {"role": "assistant", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"}]  # fmt: skip
    job = parse_spec({"messages": whole, "provider": "p", "model": "m", "budget_tokens": 300})
    assert job.messages is not None
    asked = job.messages[2]
    assert asked.tool_calls is not None
    call = asked.tool_calls[0]
    broken = call.model_copy(update={"function": call.function.model_copy(
        update={"arguments": "[1, 2]"})})  # fmt: skip
    messages = (*job.messages[:2], asked.model_copy(update={"tool_calls": (broken,)}),
                *job.messages[3:])  # fmt: skip
    job = job.model_copy(update={"messages": messages})
    with pytest.raises(FatalProviderError, match="not a JSON object"):
        client("anthropic").body(plan_request(job, client("anthropic").profile, prefix="",
                                              remaining_tokens=100))  # fmt: skip


def test_responses_tool_messages_are_items() -> None:
    items = body_of(client("openai-responses"), spec())["input"]
    assert items == [
        {"role": "developer", "content": "You are terse."},
        {"role": "user", "content": "Weather in Oslo and Bergen?"},
        {"role": "assistant", "content": "Checking both."},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
         "arguments": '{"city": "Oslo", "unit": null}'},
        {"type": "function_call", "call_id": "call_2", "name": "get_weather",
         "arguments": '{"city": "Bergen", "unit": "C"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "rain, 8 C"},
        {"type": "function_call_output", "call_id": "call_2", "output": "sun, 12 C"},
        {"role": "user", "content": "And tomorrow?"},
    ]  # fmt: skip


# -- a plan without shape ------------------------------------------------------------------------

PLAIN = parse_spec(
    {"messages": [{"role": "system", "content": "You are terse."},
                  {"role": "user", "content": "Name a lighthouse."}],
     "provider": "p", "model": "m", "budget_tokens": 300,
     "params": {"temperature": 0.5, "top_p": 0.9}}
)  # fmt: skip
SYSTEM = {"role": "system", "content": "You are terse."}
ASK = {"role": "user", "content": "Name a lighthouse."}
OPTIONS = {"include_usage": True}
SAMPLING = {"temperature": 0.5, "top_p": 0.9}
#: The bodies these plans sent before tools, recorded from the clients as they were.
BEFORE: list[tuple[str, dict[str, Any], str, dict[str, Any]]] = [
    ("openai", {}, "", {"model": "m", "messages": [SYSTEM, ASK], "stream": True,
     "stream_options": OPTIONS, "max_tokens": 200, **SAMPLING}),
    ("openai", {"continue_mode": "prefill_flag"}, "The Pharos ", {
        "model": "m", "messages": [SYSTEM, ASK, {"role": "assistant", "content": "The Pharos ",
                                                 "prefix": True}],
        "stream": True, "stream_options": OPTIONS, "max_tokens": 200, **SAMPLING}),
    ("openai", {"continue_mode": "continue_final_message", "counting": "usage"}, "The Pharos", {
        "model": "m", "messages": [SYSTEM, ASK, {"role": "assistant", "content": "The Pharos"}],
        "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "max_tokens": 200, **SAMPLING, "continue_final_message": True,
        "add_generation_prompt": False}),
    ("openai", {"continue_mode": "instruction", "resume_context": "tail:4"},
     "The Pharos of Alexandria stood", {
        "model": "m", "messages": [SYSTEM, ASK, {"role": "user", "content":
            "Your previous answer was cut off. Continue it from exactly where it stops: do not "
            "repeat any of it, add no preamble, and keep the same style. It ends with:\n"
            "<<<PARTIAL\n Pharos of Alexandria stood\nPARTIAL>>>"}],
        "stream": True, "stream_options": OPTIONS, "max_tokens": 200, **SAMPLING}),
    ("anthropic", {"cache_prompt": True}, "", {
        "model": "m", "max_tokens": 200, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "Name a lighthouse.", "cache_control": {"type": "ephemeral"}}
        ]}], "stream": True, "system": [{"type": "text", "text": "You are terse.",
                                         "cache_control": {"type": "ephemeral"}}], **SAMPLING}),
    ("anthropic", {"continue_mode": "prefill"}, "The Pharos ", {
        "model": "m", "max_tokens": 200, "messages": [
            {"role": "user", "content": "Name a lighthouse."},
            {"role": "assistant", "content": "The Pharos"}],
        "stream": True, "system": [{"type": "text", "text": "You are terse."}], **SAMPLING}),
    ("openai-responses", {"background": True}, "", {
        "model": "m", "input": [{"role": "developer", "content": "You are terse."}, ASK],
        "stream": True, "store": True, "max_output_tokens": 200, "background": True, **SAMPLING}),
    ("openai-responses", {"continue_mode": "continue_final_message"}, "The Pharos", {
        "model": "m", "input": [{"role": "developer", "content": "You are terse."}, ASK,
                                {"role": "assistant", "content": "The Pharos",
                                 "status": "in_progress"}],
        "stream": True, "store": False, "max_output_tokens": 200, **SAMPLING}),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "over", "prefix", "before"), BEFORE)
def test_a_plan_without_shape_sends_the_same_bytes(
    kind: str, over: dict[str, Any], prefix: str, before: dict[str, Any]
) -> None:
    c = client(kind, **over)
    request = c.build(plan_request(PLAIN, c.profile, prefix=prefix, remaining_tokens=200))
    assert request.content == httpx.Request("POST", request.url, json=before).content
    assert json.loads(request.content) == before
