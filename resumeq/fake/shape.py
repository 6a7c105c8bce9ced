"""What a request says its answer may be besides text: the tools it may call, how it must
choose among them, and the JSON document it must be — in each wire's own words.

- OpenAI Chat Completions: ``tools: [{"type": "function", "function": {"name",
  "description", "parameters", "strict"}}]``, ``tool_choice: "auto" | "none" | "required" |
  {"type": "function", "function": {"name"}}``, ``parallel_tool_calls``, ``response_format:
  {"type": "json_schema", "json_schema": {"name", "schema", "strict"}} | {"type":
  "json_object"} | {"type": "text"}``. A strict schema constrains decoding.
- Anthropic Messages: ``tools: [{"name", "description", "input_schema"}]``, ``tool_choice:
  {"type": "auto" | "any" | "none"} | {"type": "tool", "name"}`` (``disable_parallel_tool_use``),
  ``output_config: {"format": {"type": "json_schema", "schema"}}`` or the beta
  ``output_format: {"type": "json_schema", "schema"}``: structured outputs always constrain.
- OpenAI Responses: ``tools: [{"type": "function", "name", "description", "parameters",
  "strict"}]``, ``tool_choice: "auto" | "none" | "required" | {"type": "function", "name"}``,
  ``parallel_tool_calls``, ``text: {"format": {"type": "json_schema", "name", "schema",
  "strict"} | {"type": "json_object"} | {"type": "text"}}``; a schema constrains unless
  ``strict`` is false.

A wire takes only its own forms (another's is a 400, as the real API answers it), except
``/_fake/canonical``, which takes any of them (and resumeq's JobSpec, the Chat form). A tool
name is ``^[A-Za-z0-9_-]{1,64}$`` and unique; a ``tool_choice`` that names no tool of the
request, or ``required`` without tools, is refused.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from resumeq.fake.conversation import Format, InvalidRequest

WireForm = Literal["openai", "anthropic", "responses", "any"]
Choice = Literal["auto", "none", "required", "named"]

TOOL_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
#: The parameters of a tool that declares none.
NO_PARAMETERS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolDef:
    name: str
    #: The parameters' JSON Schema as JSON text (its keys in the request's order).
    parameters_json: str

    @property
    def parameters(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.parameters_json)
        return value


@dataclass(frozen=True)
class Shape:
    tools: tuple[ToolDef, ...] = ()
    choice: Choice = "auto"
    #: The tool a ``named`` choice names.
    named: str | None = None
    parallel: bool = True
    format: Format | None = None
    #: The format constrains decoding: a model so bound cannot continue a document, so a
    #: continuation is answered from the document's start.
    constrained: bool = False
    #: The request's own ``tools``, ``tool_choice`` and ``text`` (a Responses object echoes
    #: them).
    declared: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def tool(self, name: str) -> ToolDef:
        return next(tool for tool in self.tools if tool.name == name)


def shape_of(form: WireForm, body: Mapping[str, Any]) -> Shape:
    """The shape of a request on the wire ``form`` (``any``: whichever form each field has)."""
    tools = _tools(form, body.get("tools"))
    choice, named, parallel = _choice(form, body.get("tool_choice"), tools)
    if body.get("parallel_tool_calls") is False:
        parallel = False
    fmt, constrained = _format(form, body)
    declared = {key: body[key] for key in ("tools", "tool_choice", "text") if key in body}
    return Shape(tools, choice, named, parallel, fmt, constrained, declared)


# -- tools --------------------------------------------------------------------------------------


def _tools(form: WireForm, raw: object) -> tuple[ToolDef, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise InvalidRequest("tools: expected a list", "tools")
    tools: list[ToolDef] = []
    for index, item in enumerate(raw):
        param = f"tools.{index}"
        if not isinstance(item, Mapping):
            raise InvalidRequest(f"{param}: expected an object", param)
        name, parameters = _tool(form, item, param)
        if not (isinstance(name, str) and TOOL_NAME_RE.match(name)):
            raise InvalidRequest(
                f"{param}.name: expected a name matching {TOOL_NAME_RE.pattern}", param
            )
        if any(tool.name == name for tool in tools):
            raise InvalidRequest(f"tools: tool names must be unique ({name!r} twice)", "tools")
        if parameters is None:
            parameters = NO_PARAMETERS
        if not isinstance(parameters, Mapping):
            raise InvalidRequest(f"{param}: the parameters must be a JSON Schema object", param)
        tools.append(ToolDef(name, json.dumps(parameters, ensure_ascii=False)))
    return tuple(tools)


def _tool(form: WireForm, item: Mapping[str, Any], param: str) -> tuple[object, object]:
    """A tool's name and parameters schema, as ``form`` spells them."""
    if form == "any":
        if isinstance(item.get("function"), Mapping):
            form = "openai"
        elif "input_schema" in item:
            form = "anthropic"
        else:
            form = "responses"
    if form == "anthropic":
        return _anthropic_tool(item, param)
    if item.get("type") != "function":
        raise InvalidRequest(f"{param}.type: only function tools are served", param)
    if form == "openai":
        function = item.get("function")
        if not isinstance(function, Mapping):
            raise InvalidRequest(f"{param}.function: Field required", param)
        return function.get("name"), function.get("parameters")
    if "function" in item:
        raise InvalidRequest(
            f"{param}: a Responses function tool is flat (name and parameters beside type)",
            param,
        )
    return item.get("name"), item.get("parameters")


def _anthropic_tool(item: Mapping[str, Any], param: str) -> tuple[object, object]:
    if item.get("type", "custom") != "custom":
        raise InvalidRequest(f"{param}.type: only custom tools are served", param)
    if not isinstance(item.get("input_schema"), Mapping):
        raise InvalidRequest(f"{param}.input_schema: Field required", param)
    return item.get("name"), item.get("input_schema")


# -- tool_choice -------------------------------------------------------------------------------


def _choice(
    form: WireForm, raw: object, tools: tuple[ToolDef, ...]
) -> tuple[Choice, str | None, bool]:
    choice, named, parallel = _choice_words(form, raw)
    if choice in ("required", "named") and not tools:
        raise InvalidRequest(
            "tool_choice: a tool may be required only when tools are specified", "tool_choice"
        )
    if named is not None and all(tool.name != named for tool in tools):
        raise InvalidRequest(f"tool_choice: no tool named {named!r} in tools", "tool_choice")
    return choice, named, parallel


def _choice_words(form: WireForm, raw: object) -> tuple[Choice, str | None, bool]:
    if raw is None:
        return "auto", None, True
    if isinstance(raw, str) and form != "anthropic" and raw in ("auto", "none", "required"):
        return raw, None, True  # type: ignore[return-value]
    kind = raw.get("type") if isinstance(raw, Mapping) else None
    if isinstance(raw, Mapping) and form in ("anthropic", "any"):
        parallel = raw.get("disable_parallel_tool_use") is not True
        words: dict[object, Choice] = {"auto": "auto", "any": "required", "none": "none"}
        if kind in words:
            return words[kind], None, parallel
        if kind == "tool" and isinstance(raw.get("name"), str):
            return "named", raw["name"], parallel
    if isinstance(raw, Mapping) and kind == "function":
        function = raw.get("function")
        nested = isinstance(function, Mapping) and isinstance(function.get("name"), str)
        if form in ("openai", "any") and nested:
            assert isinstance(function, Mapping)
            return "named", function["name"], True
        if form in ("responses", "any") and isinstance(raw.get("name"), str):
            return "named", raw["name"], True
    raise InvalidRequest(f"tool_choice: not a tool choice this API takes: {raw!r}", "tool_choice")


# -- the format ----------------------------------------------------------------------------------


def _format(form: WireForm, body: Mapping[str, Any]) -> tuple[Format | None, bool]:
    """The answer's format and whether it constrains decoding."""
    found: list[tuple[Format | None, bool]] = []
    if form in ("openai", "any") and body.get("response_format") is not None:
        found.append(_openai_format(body["response_format"], "response_format"))
    if form in ("anthropic", "any"):
        config = body.get("output_config")
        if isinstance(config, Mapping) and config.get("format") is not None:
            found.append(_anthropic_format(config["format"], "output_config.format"))
        if body.get("output_format") is not None:
            found.append(_anthropic_format(body["output_format"], "output_format"))
    if form in ("responses", "any"):
        text = body.get("text")
        if isinstance(text, Mapping) and text.get("format") is not None:
            found.append(_responses_format(text["format"], "text.format"))
    return found[0] if found else (None, False)


def _schema(value: object, param: str) -> Format:
    if not isinstance(value, Mapping):
        raise InvalidRequest(f"{param}: the schema must be a JSON Schema object", param)
    return Format(json.dumps(value, ensure_ascii=False))


def _openai_format(raw: object, param: str) -> tuple[Format | None, bool]:
    kind = raw.get("type") if isinstance(raw, Mapping) else None
    if kind == "text":
        return None, False
    if kind == "json_object":
        return Format(), False
    spec = raw.get("json_schema") if isinstance(raw, Mapping) else None
    if kind == "json_schema" and isinstance(spec, Mapping):
        return _schema(spec.get("schema"), f"{param}.json_schema.schema"), spec.get(
            "strict"
        ) is True
    raise InvalidRequest(f"{param}: expected text, json_object or json_schema", param)


def _anthropic_format(raw: object, param: str) -> tuple[Format | None, bool]:
    if not (isinstance(raw, Mapping) and raw.get("type") == "json_schema"):
        raise InvalidRequest(f"{param}.type: Input should be 'json_schema'", param)
    return _schema(raw.get("schema"), f"{param}.schema"), True


def _responses_format(raw: object, param: str) -> tuple[Format | None, bool]:
    kind = raw.get("type") if isinstance(raw, Mapping) else None
    if kind == "text":
        return None, False
    if kind == "json_object":
        return Format(), False
    if kind == "json_schema" and isinstance(raw, Mapping):
        return _schema(raw.get("schema"), f"{param}.schema"), raw.get("strict") is not False
    raise InvalidRequest(f"{param}: expected text, json_object or json_schema", param)
