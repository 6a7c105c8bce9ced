"""Tools, tool choice, response format and tool messages at enqueue (SPEC §23): every
refusal names its field — down to the keyword inside a JSON Schema — and writes nothing;
every valid shape round-trips with its prompt hash; a plain spec hashes as it did before
tools existed; the limits on tools and schemas hold, from the defaults and from a config
file."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from resumeq.cli import cli
from resumeq.core import config_digest
from resumeq.core.errors import InvalidSpec
from resumeq.core.settings import load_config_file
from resumeq.core.spec import JobSpec, Limits, parse_spec, parse_spec_json
from resumeq.core.spec_rules import json_size
from resumeq.store import Store, keys
from resumeq.testing import RedisServer

PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
    "additionalProperties": False,
}


def tool(name: str = "forecast", **function: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": PARAMS, **function}}


def call(
    call_id: str = "call_1", name: str = "forecast", arguments: str = '{"city": "Oslo"}'
) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


ASK = {"role": "user", "content": "Weather in Oslo?"}
CALLED = {"role": "assistant", "tool_calls": [call()]}
ANSWERED = {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 4}'}


def schema_format(schema: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, **more}}


def valid(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "messages": [ASK],
        "provider": "local",
        "model": "gpt-4o",
        "budget_tokens": 500,
    }
    return {**base, **over}


def strict_object(**properties: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": sorted(properties),
        "additionalProperties": False,
    }


# (the field the error must name, what it must say, the change that makes the spec invalid)
INVALID: list[tuple[str, str, dict[str, Any]]] = [
    # names
    ("tools.0.function.name", "must be a function's name", {"tools": [tool("get weather")]}),
    ("tools.0.function.name", "must be a function's name", {"tools": [tool("x" * 65)]}),
    ("tools.0.function.name", "must be a function's name", {"tools": [tool("")]}),
    ("tools.0.function.name", "looks like a credential",
     {"tools": [tool("sk-abcdefghijklmnopqrstuvwx")]}),
    ("tools.0.function.name", "must be a function's name", {"tools": [tool("get.weather")]}),
    ("tools.1.function.name", "names the function 'forecast' twice",
     {"tools": [tool(), tool()]}),
    ("tools", "at least one tool", {"tools": []}),
    ("tools.0.type", "", {"tools": [{"type": "retrieval", "function": {"name": "f"}}]}),
    ("tools.0.function.url", "", {"tools": [tool(url="https://example.com/fn")]}),
    ("response_format.json_schema.name", "a response format's name",
     {"response_format": schema_format({"type": "object"}) | {
         "json_schema": {"name": "an answer", "schema": {}}}}),
    ("response_format.json_schema.name", "not a URL",
     {"response_format": {"type": "json_schema",
                          "json_schema": {"name": "www.example", "schema": {}}}}),
    # JSON Schemas
    ("tools.0.function.parameters.type", 'must be "object"',
     {"tools": [tool(parameters={"type": "string"})]}),
    ("tools.0.function.parameters.type", 'must be "object"',
     {"tools": [tool(parameters={"properties": {}})]}),
    ("tools.0.function.parameters.properties.city.type", "'text' is no JSON Schema type",
     {"tools": [tool(parameters={"type": "object", "properties": {"city": {"type": "text"}}})]}),
    ("tools.0.function.parameters.properties.city.$ref", "points nowhere",
     {"tools": [tool(parameters={"type": "object",
                                 "properties": {"city": {"$ref": "#/$defs/City"}}})]}),
    ("tools.0.function.parameters.$ref", "points nowhere",
     {"tools": [tool(parameters={"type": "object", "$ref": "https://example.com/s.json"})]}),
    ("tools.0.function.parameters.required", "is not a JSON Schema",
     {"tools": [tool(parameters={"type": "object", "required": "city"})]}),
    ("tools.0.function.parameters.properties.code.pattern", "is not a JSON Schema",
     {"tools": [tool(parameters={"type": "object",
                                 "properties": {"code": {"pattern": "[A-Z"}}})]}),
    ("tools.0.function.parameters.$schema", "names no JSON Schema draft",
     {"tools": [tool(parameters={"type": "object", "$schema": "urn:nothing"})]}),
    ("tools.0.function.parameters", "valid dictionary", {"tools": [tool(parameters=[1])]}),
    ("response_format.json_schema.schema.items.type", "no JSON Schema type",
     {"response_format": schema_format({"type": "array", "items": {"type": "str"}})}),
    ("response_format.json_schema.schema.anyOf.1.$ref", "points nowhere",
     {"response_format": schema_format({"anyOf": [{"type": "null"}, {"$ref": "#/nope"}]})}),
    ("response_format.json_schema.schema", "valid dictionary",
     {"response_format": schema_format(True)}),  # type: ignore[arg-type]
    # strict: OpenAI's subset
    ("tools.0.function.parameters", "additionalProperties must be false with strict",
     {"tools": [tool(strict=True, parameters={"type": "object"})]}),
    ("tools.0.function.parameters", "required must list every property with strict (not days)",
     {"tools": [tool(strict=True, parameters={**PARAMS, "required": ["city"]})]}),
    ("response_format.json_schema.schema.properties.address",
     "additionalProperties must be false with strict",
     {"response_format": schema_format(
         strict_object(address={"type": "object", "properties": {"street": {"type": "string"}},
                                "required": ["street"]}), strict=True)}),
    ("response_format.json_schema.schema.properties.tags.items",
     "required must list every property with strict",
     {"response_format": schema_format(strict_object(tags={"type": "array", "items": {
         "type": "object", "properties": {"k": {}}, "additionalProperties": False}}),
         strict=True)}),
    ("response_format.json_schema.schema.$defs.Node",
     "additionalProperties must be false with strict",
     {"response_format": schema_format({**strict_object(root={"$ref": "#/$defs/Node"}),
                                        "$defs": {"Node": {"type": "object"}}}, strict=True)}),
    ("response_format.json_schema.schema.properties.v.anyOf.1",
     "additionalProperties must be false with strict",
     {"response_format": schema_format(strict_object(v={"anyOf": [
         {"type": "string"}, {"type": ["object", "null"], "properties": {}}]}), strict=True)}),
    ("response_format.json_schema.schema.oneOf", "is not supported with strict",
     {"response_format": schema_format({**strict_object(), "oneOf": [{}]}, strict=True)}),
    ("response_format.json_schema.schema.anyOf", "cannot be the root with strict",
     {"response_format": schema_format({"anyOf": [strict_object()]}, strict=True)}),
    ("response_format.json_schema.schema.type", 'must be "object" with strict',
     {"response_format": schema_format({"type": "array"}, strict=True)}),
    ("tools.0.function.strict", "must be true or false", {"tools": [tool(strict="yes")]}),
    # tool_choice
    ("tool_choice", "needs tools", {"tool_choice": "auto"}),
    ("tool_choice", "needs tools", {"tool_choice": "required", "tools": None}),
    ("tool_choice", "needs tools",
     {"tool_choice": {"type": "function", "function": {"name": "forecast"}}}),
    ("tool_choice.function.name", "names no function of tools (forecast)",
     {"tools": [tool()], "tool_choice": {"type": "function", "function": {"name": "other"}}}),
    ("tool_choice.function.name", "Field required",
     {"tools": [tool()], "tool_choice": {"type": "function", "function": {}}}),
    ("tool_choice.function.name", "must be a function's name",
     {"tools": [tool()], "tool_choice": {"type": "function", "function": {"name": "a b"}}}),
    ("tool_choice.type", "",
     {"tools": [tool()], "tool_choice": {"type": "tool", "function": {"name": "forecast"}}}),
    ("tool_choice", "must be `auto`, `none`, `required` or a named function",
     {"tools": [tool()], "tool_choice": "any"}),
    ("tool_choice", "must be a string or an object", {"tools": [tool()], "tool_choice": 1}),
    # response_format
    ("response_format.json_schema", "is required with type json_schema",
     {"response_format": {"type": "json_schema"}}),
    ("response_format.json_schema", "goes only with type json_schema",
     {"response_format": {"type": "json_object", "json_schema": {"name": "a", "schema": {}}}}),
    ("response_format.type", "", {"response_format": {"type": "text"}}),
    ("response_format", "forces a call",
     {"tools": [tool()], "tool_choice": "required", "response_format": {"type": "json_object"}}),
    ("response_format", "forces a call",
     {"tools": [tool()], "tool_choice": {"type": "function", "function": {"name": "forecast"}},
      "response_format": schema_format({"type": "object"})}),
    # messages
    ("messages.1.tool_calls", "only an assistant message carries tool calls",
     {"messages": [ASK, {"role": "user", "content": "x", "tool_calls": [call()]}]}),
    ("messages.1.tool_calls", "must hold a call",
     {"messages": [ASK, {"role": "assistant", "tool_calls": []}]}),
    ("messages.0.tool_call_id", "only a tool message answers a call",
     {"messages": [{**ASK, "tool_call_id": "call_1"}]}),
    ("messages.1.tool_call_id", "is required",
     {"messages": [ASK, {"role": "tool", "content": "4"}]}),
    ("messages.2.content", "must not be empty: it is the call's result",
     {"messages": [ASK, CALLED, {**ANSWERED, "content": ""}]}),
    ("messages.1.tool_call_id", "'call_1' names no call of an earlier assistant message",
     {"messages": [ASK, ANSWERED, CALLED]}),
    ("messages.2.tool_call_id", "'call_9' names no call",
     {"messages": [ASK, CALLED, {**ANSWERED, "tool_call_id": "call_9"}]}),
    ("messages.2.tool_call_id", "must be a tool call's id",
     {"messages": [ASK, CALLED, {**ANSWERED, "tool_call_id": "call 1"}]}),
    ("messages.3.tool_calls.0.id", "'call_1' is a call's id twice",
     {"messages": [ASK, CALLED, ANSWERED, CALLED]}),
    ("messages.1.tool_calls.1.id", "'call_1' is a call's id twice",
     {"messages": [ASK, {"role": "assistant", "tool_calls": [call(), call()]}]}),
    ("messages.1.tool_calls.0.id", "must be a tool call's id",
     {"messages": [ASK, {"role": "assistant", "tool_calls": [call("x" * 65)]}]}),
    ("messages.1.tool_calls.0.id", "looks like a credential",
     {"messages": [ASK, {"role": "assistant",
                         "tool_calls": [call("ghp_abcdefghijklmnopqrstuvwx")]}]}),
    ("messages.1.tool_calls.0.function.name", "must be a function's name",
     {"messages": [ASK, {"role": "assistant", "tool_calls": [call(name="get weather")]}]}),
    ("messages.1.tool_calls.0.function.arguments", "must be a JSON object, as text, not an array",
     {"messages": [ASK, {"role": "assistant", "tool_calls": [call(arguments="[1, 2]")]}]}),
    ("messages.1.tool_calls.0.function.arguments", "must be a JSON object, as text:",
     {"messages": [ASK, {"role": "assistant", "tool_calls": [call(arguments='{"city": ')]}]}),
    ("messages.1.tool_calls.0.function.arguments", "NaN is not JSON",
     {"messages": [ASK, {"role": "assistant", "tool_calls": [call(arguments='{"t": NaN}')]}]}),
    ("messages.1.tool_calls.0.function.name", "'other' names no function of tools",
     {"tools": [tool()], "messages": [ASK, {"role": "assistant",
                                            "tool_calls": [call(name="other")]}]}),
    ("messages.1.content", "only an assistant message with tool_calls may have none",
     {"messages": [ASK, {"role": "assistant"}]}),
    ("messages.0.content", "must not be empty", {"messages": [{"role": "user", "content": ""}]}),
    ("messages.0.content", "must not be empty", {"messages": [{"role": "system"}, ASK]}),
    ("messages", "must hold at least one user message", {"messages": [CALLED, ANSWERED]}),
    # the exit for an answer of the wrong shape
    ("exit.on_invalid", "", {"exit": {"on_invalid": "ignore"}}),
    ("exit.on_invalid", "", {"exit": {"on_invalid": None}}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("field", "says", "change"),
    INVALID,
    ids=[f"{f}-{i}" for i, (f, _, _) in enumerate(INVALID)],
)
def test_invalid_field_is_named_and_nothing_is_written(
    redis_client: redis.Redis, field: str, says: str, change: dict[str, Any]
) -> None:
    store = Store(redis_client)
    with pytest.raises(InvalidSpec) as info:
        store.create(valid(**copy.deepcopy(change)))
    said = {e.field: e.message for e in info.value.errors}
    assert field in said, info.value
    assert says in said[field], info.value
    assert field in str(info.value)
    assert list(redis_client.scan_iter("*")) == []


#: Specs of each shape the spec takes (each valid).
SHAPES: dict[str, dict[str, Any]] = {
    "a tool": {"tools": [tool()]},
    "tools, auto": {"tools": [tool(), tool("alerts", description="Weather alerts")],
                    "tool_choice": "auto"},
    "tools, required": {"tools": [tool()], "tool_choice": "required"},
    "a named tool": {"tools": [tool(), tool("alerts")],
                     "tool_choice": {"type": "function", "function": {"name": "alerts"}}},
    "none without tools": {"tool_choice": "none"},
    "a strict tool": {"tools": [tool(strict=True)]},
    "a tool of no parameters": {"tools": [{"type": "function", "function": {"name": "now"}}]},
    "a draft-07 schema": {"tools": [tool(parameters={
        "$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
        "definitions": {"c": {"type": "string"}},
        "properties": {"city": {"$ref": "#/definitions/c"}}})]},
    "a schema": {"response_format": schema_format({"type": "array", "items": {"type": "string"}})},
    "a strict, recursive schema": {"response_format": schema_format({
        **strict_object(root={"$ref": "#/$defs/Node"}),
        "$defs": {"Node": strict_object(label={"type": "string"}, kids={
            "type": "array", "items": {"$ref": "#/$defs/Node"}})}},
        strict=True, description="A tree")},
    "a strict schema with a nullable object": {"response_format": schema_format(strict_object(
        address={"anyOf": [{"type": "null"}, strict_object(street={"type": "string"})]}),
        strict=True)},
    "json_object": {"response_format": {"type": "json_object"}},
    "tools and a schema": {"tools": [tool()], "tool_choice": "auto",
                           "response_format": schema_format({"type": "object"})},
    "a tool conversation": {"tools": [tool()], "messages": [ASK, CALLED, ANSWERED]},
    "calls without tools": {"messages": [ASK, CALLED, ANSWERED]},
    "parallel calls": {"messages": [ASK, {"role": "assistant", "content": "Two looks.",
                                          "tool_calls": [call(), call("call_2")]},
                                    ANSWERED, {**ANSWERED, "tool_call_id": "call_2"}]},
    "on_invalid": {"exit": {"on_invalid": "retry"}},
}  # fmt: skip


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_each_shape_round_trips_with_its_hash(shape: str) -> None:
    spec = parse_spec(valid(**copy.deepcopy(SHAPES[shape])))
    again = parse_spec_json(spec.to_json())
    assert again == spec
    assert again.prompt_hash() == spec.prompt_hash()
    assert parse_spec(spec).prompt_hash() == spec.prompt_hash()  # a model validated again
    assert JobSpec.model_validate_json(spec.to_json()) == spec


def test_a_stored_shape_is_read_back_as_it_was_written(real_store: Store) -> None:
    job_id = real_store.create(valid(**copy.deepcopy(SHAPES["a strict, recursive schema"]))).id
    spec = real_store.get(job_id).spec
    assert spec.response_format is not None and spec.response_format.json_schema is not None
    assert spec.response_format.json_schema.schema_["$defs"]  # by its alias, "schema"
    assert '"schema":' in real_store.get(job_id).spec_json


#: Hashes of specs made with resumeq before tools existed (hash version 1, computed by
#: that code): a job queued then keeps its hash, so its cursor still splices.
VERSION_1 = {
    "9717b8f52bc9bc06a21f4619cf768f49490ebf9886215096f2b13ebe336269a7": {
        "prompt": "hi", "provider": "p", "model": "m", "budget_tokens": 50},
    "7c3cc8c7dc964a5fa1e4217a11f645be4e54a75758e7dcdfd6aba369b17e4e80": {
        "messages": [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": "Name three rivers."},
                     {"role": "assistant", "content": "Nile,"}],
        "provider": "local", "model": "meta-llama/Llama-3.1-8B-Instruct", "budget_tokens": 500,
        "params": {"temperature": 0.5, "seed": 7, "stop": ["\n"]}, "exit": {"on_cut": "spill"}},
}  # fmt: skip


@pytest.mark.parametrize("known", sorted(VERSION_1))
def test_a_plain_spec_hashes_as_version_1_did(known: str) -> None:
    assert parse_spec(VERSION_1[known]).prompt_hash() == known
    with_exit = {**VERSION_1[known], "exit": {"on_invalid": "fail"}}
    assert parse_spec(with_exit).prompt_hash() == known  # the exit is not the answer's


@pytest.mark.parametrize(
    "change",
    [
        {"tools": [tool()]},
        {"tools": [tool(description="Forecast")]},
        {"tools": [tool(strict=True)]},
        {"tools": [tool()], "tool_choice": "auto"},
        {"tools": [tool()], "tool_choice": "required"},
        {"tool_choice": "none"},
        {"response_format": {"type": "json_object"}},
        {"response_format": schema_format({"type": "object"})},
        {"messages": [ASK, CALLED, ANSWERED]},
    ],
)
def test_the_shape_of_the_answer_changes_the_hash(change: dict[str, Any]) -> None:
    plain = parse_spec(valid()).prompt_hash()
    assert parse_spec(valid(**copy.deepcopy(change))).prompt_hash() != plain


def test_each_part_of_the_shape_counts_in_the_hash() -> None:
    hashes = {
        parse_spec(valid(**copy.deepcopy(shape))).prompt_hash()
        for shape in (
            {"tools": [tool()]},
            {"tools": [tool()], "tool_choice": "auto"},
            {"tools": [tool()], "tool_choice": "required"},
            {"tools": [tool()], "tool_choice": {"type": "function",
                                                "function": {"name": "forecast"}}},
            {"tools": [tool("alerts")]},
            {"response_format": schema_format({"type": "object"})},
            {"response_format": schema_format({"type": "object"}, strict=False)},
            {"response_format": schema_format({"type": "array"})},
        )
    }  # fmt: skip
    assert len(hashes) == 8


def _sized(size: int) -> dict[str, Any]:
    """A response format whose ``json_schema`` is ``size`` bytes as compact JSON."""
    fmt = schema_format({"type": "object", "description": ""})
    fmt["json_schema"]["schema"]["description"] = "é" * 10  # bytes, not characters
    pad = size - json_size(fmt["json_schema"])
    fmt["json_schema"]["schema"]["description"] += "x" * pad
    assert json_size(fmt["json_schema"]) == size
    return fmt


def _sized_tool(size: int) -> dict[str, Any]:
    """A tool whose definition is ``size`` bytes as compact JSON."""
    made = tool(description="")
    made["function"]["description"] = "x" * (size - json_size(made["function"]))
    assert json_size(made["function"]) == size
    return made


def test_a_schema_at_the_limit_is_taken_and_one_byte_more_refused(
    redis_client: redis.Redis,
) -> None:
    limit = Limits().max_schema_bytes
    assert limit == 65536
    assert parse_spec(valid(response_format=_sized(limit)))
    assert parse_spec(valid(tools=[_sized_tool(limit)]))
    store = Store(redis_client)
    with pytest.raises(InvalidSpec) as info:
        store.create(valid(response_format=_sized(limit + 1)))
    assert str(info.value).endswith(
        "response_format.json_schema: is 65537 bytes as compact JSON, over the limit of 65536 "
        "([limits] max_schema_bytes)"
    )
    with pytest.raises(InvalidSpec) as info:
        store.create(valid(tools=[tool(), _sized_tool(limit + 1)]))
    assert info.value.fields == ("tools.1.function",)
    assert list(redis_client.scan_iter("*")) == []


def test_at_most_max_tools() -> None:
    many = [tool(f"f{i}") for i in range(128)]
    assert len(parse_spec(valid(tools=many)).tools or ()) == 128
    with pytest.raises(InvalidSpec, match=r"tools: at most 128 tools \(\[limits\] max_tools\)"):
        parse_spec(valid(tools=[*many, tool("one_more")]))
    with pytest.raises(InvalidSpec, match="tools: at most 2 tools"):
        parse_spec(valid(tools=many[:3]), limits=Limits(max_tools=2))


def test_tool_calls_and_results_count_toward_the_prompt_bytes() -> None:
    small = Limits(max_prompt_bytes=60)
    args = json.dumps({"city": "x" * 40})
    conversation = [ASK, {"role": "assistant", "tool_calls": [call(arguments=args)]}, ANSWERED]
    size = sum(len(s.encode()) for s in (ASK["content"], args, ANSWERED["content"]))
    assert size > 60 > len(ASK["content"]) + len(ANSWERED["content"])
    with pytest.raises(InvalidSpec, match=f"messages: content is {size} bytes, over the limit"):
        parse_spec(valid(messages=conversation), limits=small)
    assert parse_spec(valid(messages=conversation), limits=Limits(max_prompt_bytes=size))


def test_a_config_files_limits_apply_to_tools_and_schemas(
    tmp_path: Path, redis_client: redis.Redis
) -> None:
    path = tmp_path / "resumeq.toml"
    path.write_text("[limits]\nmax_schema_bytes = 2000\nmax_tools = 1\n", encoding="utf-8")
    file = load_config_file(path)
    assert (file.limits.max_schema_bytes, file.limits.max_tools) == (2000, 1)
    digested = config_digest.of(file).limits  # what a command line reads of the file
    for limits in (file.limits, digested):
        store = Store(redis_client, limits=limits)
        assert store.create(valid(response_format=_sized(2000))).id
        with pytest.raises(InvalidSpec, match="over the limit of 2000"):
            store.create(valid(response_format=_sized(2001)))
        with pytest.raises(InvalidSpec, match="tools: at most 1 tools"):
            store.create(valid(tools=[tool(), tool("alerts")]))
    assert parse_spec(valid(response_format=_sized(2001)))  # the defaults take it


def test_a_stored_spec_is_read_back_under_the_rules_it_was_enqueued_with(
    real_store: Store, redis_client: redis.Redis
) -> None:
    """A job queued before a message's text had to be non-empty (or before a JSON Schema
    rule was tightened) stays readable: the rules of enqueue are not applied again."""
    job_id = real_store.create(valid()).id
    older = valid(messages=[{"role": "system", "content": ""}, ASK])
    redis_client.hset(keys.job(job_id), "spec", json.dumps(older))
    assert real_store.get(job_id).spec.chat[0].content == ""
    with pytest.raises(InvalidSpec, match=r"messages\.0\.content: must not be empty"):
        parse_spec(older)


def test_every_error_of_the_shape_is_reported_with_the_others() -> None:
    with pytest.raises(InvalidSpec) as info:
        parse_spec(valid(model="", tools=[tool("a b")], response_format={"type": "text"}))
    assert {"model", "tools.0.function.name", "response_format.type"} <= set(info.value.fields)


@pytest.mark.parametrize("choice", ["retry", "spill", "fail"])
def test_the_command_line_chooses_on_invalid(
    redis_server: RedisServer, redis_client: redis.Redis, choice: str
) -> None:
    args = ["--redis-url", redis_server.url, "enqueue", "--provider", "local", "--model", "m",
            "--budget", "50", "--prompt", "hi", "--on-invalid", choice, "--json"]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    job_id = json.loads(result.output)["id"]
    spec = Store(redis_client).get(job_id).spec
    assert spec.exit.on_invalid == choice
    assert spec.prompt_hash() == parse_spec(valid(messages=None, prompt="hi", model="m",
                                                  budget_tokens=50)).prompt_hash()  # fmt: skip


def test_the_command_line_refuses_another_on_invalid(
    redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    args = ["--redis-url", redis_server.url, "enqueue", "--provider", "local", "--model", "m",
            "--budget", "50", "--prompt", "hi", "--on-invalid", "ignore"]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2 and "--on-invalid" in result.output
    assert list(redis_client.scan_iter("*")) == []


KEYWORDS = ["type", "properties", "required", "items", "$ref", "$defs", "anyOf", "oneOf",
            "additionalProperties", "enum", "pattern", "$schema", "$id", "$anchor", "not",
            "minimum", "format", "definitions", "prefixItems", "description"]  # fmt: skip
schema_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False)
    | st.sampled_from(["object", "string", "#", "#/$defs/a", "#a", "[", "a", "urn:x",
                       "http://json-schema.org/draft-07/schema#", "https://example.com/s"]),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.sampled_from(KEYWORDS) | st.text(max_size=3), inner, max_size=4),
    max_leaves=16,
)  # fmt: skip
schemas = st.dictionaries(st.sampled_from(KEYWORDS), schema_values, max_size=5)


@settings(max_examples=400, deadline=None)
@given(parameters=schemas, asked=schemas, strict=st.booleans())
def test_any_json_schema_is_taken_or_refused_by_name_never_a_crash(
    parameters: dict[str, Any], asked: dict[str, Any], strict: bool
) -> None:
    data = valid(tools=[tool(parameters=parameters, strict=strict)],
                 response_format=schema_format(asked, strict=strict))  # fmt: skip
    try:
        spec = parse_spec(data)
    except InvalidSpec as exc:
        where = ("tools.0.function", "response_format.json_schema")
        assert all(e.field.startswith(where) and e.message for e in exc.errors), exc
    else:
        assert parse_spec_json(spec.to_json()).prompt_hash() == spec.prompt_hash()
