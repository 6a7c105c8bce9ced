"""The shape of an answer a job spec asks for (SPEC §23): the tools the model may call, how
it must choose among them, the JSON document it must be, and the tool calls and results a
conversation carries back — the models, in OpenAI's shapes (the workers translate them per
wire), and the rules that hold them to each other at enqueue.

Each refusal names where it is: a field's location, then the path inside it (a tool's
name, a keyword deep in a JSON Schema). The JSON Schemas themselves are checked by
:mod:`resumeq.core.schema_rules`; :class:`~resumeq.core.spec.JobSpec` holds these models and
applies the rules between its fields (:func:`check_tools`, :func:`check_tool_choice`,
:func:`check_response_format`, :func:`check_conversation`, :func:`check_called_tools`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from resumeq.core import schema_rules
from resumeq.core.spec_rules import (
    AtPath,
    check_arguments,
    check_tool_call_id,
    check_tool_name,
    json_size,
)
from resumeq.core.spec_types import JsonBool, Limits, at_enqueue, at_path, limits_of

#: The ``tool_choice`` strings; a named function is the object form.
TOOL_CHOICE_MODES = ("auto", "none", "required")
_SCHEMA_LIMIT = "[limits] max_schema_bytes"


class FunctionCall(BaseModel):
    """The function a tool call names, and its arguments as JSON text (as OpenAI sends them)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="The function's name.")
    arguments: str = Field(description="The call's arguments: a JSON object, as text.")

    @field_validator("name")
    @classmethod
    def _check_name(cls, v: str) -> str:
        return check_tool_name(v)

    @field_validator("arguments")
    @classmethod
    def _check_arguments(cls, v: str) -> str:
        return check_arguments(v)


class ToolCall(BaseModel):
    """A tool call an assistant message made (an app sends it back with the call's result)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(description="The call's id, which the tool message's `tool_call_id` names.")
    type: Literal["function"] = Field(default="function", description="Always `function`.")
    function: FunctionCall = Field(description="The function called, and its arguments.")

    @field_validator("id")
    @classmethod
    def _check_id(cls, v: str) -> str:
        return check_tool_call_id(v)


def _definition_size(definition: BaseModel, limits: Limits) -> None:
    size = json_size(definition.model_dump(mode="json", by_alias=True, exclude_none=True))
    if size > limits.max_schema_bytes:
        limit = limits.max_schema_bytes
        reason = f"is {size} bytes as compact JSON, over the limit of {limit} ({_SCHEMA_LIMIT})"
        raise at_path(AtPath("", reason))


def _check_schema(schema: Mapping[str, Any], field: str, *, strict: bool, root: bool) -> None:
    """A JSON Schema (``root``: an object's) with strict mode's subset if ``strict``."""
    try:
        schema_rules.check_schema(schema, root=root, strict=strict)
    except AtPath as exc:
        raise at_path(exc, field) from None


class FunctionDef(BaseModel):
    """A function the model may call: its name, what it does, and its parameters' JSON Schema."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="The function's name, `^[A-Za-z0-9_-]{1,64}$`.")
    description: str | None = Field(default=None, description="What the function does.")
    parameters: dict[str, JsonValue] | None = Field(
        default=None, description="The JSON Schema of the function's arguments (an object)."
    )
    strict: JsonBool | None = Field(
        default=None, description="OpenAI's strict mode: the arguments follow the schema exactly."
    )

    @field_validator("name")
    @classmethod
    def _check_name(cls, v: str) -> str:
        return check_tool_name(v)

    @model_validator(mode="after")
    def _check_definition(self, info: ValidationInfo) -> FunctionDef:
        if not at_enqueue(info):
            return self
        _definition_size(self, limits_of(info))
        if self.parameters is not None:
            _check_schema(self.parameters, "parameters", strict=self.strict is True, root=True)
        return self


class Tool(BaseModel):
    """A function tool, in OpenAI's shape (translated per wire by the workers)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["function"] = Field(default="function", description="Always `function`.")
    function: FunctionDef = Field(description="The function the model may call.")


class FunctionName(BaseModel):
    """The function a named `tool_choice` forces."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="The name of one of the spec's `tools`.")

    @field_validator("name")
    @classmethod
    def _check_name(cls, v: str) -> str:
        return check_tool_name(v)


class NamedToolChoice(BaseModel):
    """A `tool_choice` that forces one function."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["function"] = Field(default="function", description="Always `function`.")
    function: FunctionName = Field(description="The function forced.")


ToolChoice = Literal["auto", "none", "required"] | NamedToolChoice


class JsonSchemaFormat(BaseModel):
    """A structured output's schema: its name, the JSON Schema, and OpenAI's strict mode."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    name: str = Field(description="The schema's name, `^[A-Za-z0-9_-]{1,64}$`.")
    description: str | None = Field(default=None, description="What the document is for.")
    schema_: dict[str, JsonValue] = Field(
        alias="schema", description="The JSON Schema the answer must be valid for."
    )
    strict: JsonBool | None = Field(
        default=None, description="OpenAI's strict mode: the answer follows the schema exactly."
    )

    @field_validator("name")
    @classmethod
    def _check_name(cls, v: str) -> str:
        return check_tool_name(v, "a response format's name")

    @model_validator(mode="after")
    def _check_definition(self, info: ValidationInfo) -> JsonSchemaFormat:
        if not at_enqueue(info):
            return self
        _definition_size(self, limits_of(info))
        _check_schema(self.schema_, "schema", strict=self.strict is True, root=False)
        return self


class ResponseFormat(BaseModel):
    """The answer is a JSON document: one valid for a schema, or any JSON object."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["json_schema", "json_object"] = Field(
        description="`json_schema`: a document valid for `json_schema`; `json_object`: any "
        "JSON object."
    )
    json_schema: JsonSchemaFormat | None = Field(
        default=None, description="The schema, with `type` `json_schema` (and only then)."
    )

    @model_validator(mode="after")
    def _check_pairing(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise at_path(AtPath("json_schema", "is required with type json_schema"))
        if self.type == "json_object" and self.json_schema is not None:
            raise at_path(AtPath("json_schema", "goes only with type json_schema"))
        return self


def read_tool_choice(v: Any) -> Any:
    """``tool_choice`` read as one of its two forms, refused naming what is wrong in the one
    it is (a string is a mode, an object a named function), not in both."""
    if v is None or isinstance(v, NamedToolChoice):
        return v
    if isinstance(v, str):
        if v in TOOL_CHOICE_MODES:
            return v
        raise ValueError(f"must be `auto`, `none`, `required` or a named function, not {v[:40]!r}")
    if isinstance(v, Mapping):
        try:
            return NamedToolChoice.model_validate(v)
        except ValidationError as exc:
            first = exc.errors(include_url=False, include_input=False)[0]
            path = ".".join(str(p) for p in first["loc"])
            raise at_path(AtPath(path, first["msg"].removeprefix("Value error, "))) from None
    raise ValueError(f"must be a string or an object, not {type(v).__name__}")


def tool_names(tools: Sequence[Tool] | None) -> tuple[str, ...]:
    return tuple(t.function.name for t in tools or ())


def check_tools(tools: tuple[Tool, ...], info: ValidationInfo) -> tuple[Tool, ...]:
    limit = limits_of(info).max_tools
    if not tools:
        raise ValueError("must hold at least one tool (leave it out for none)")
    if len(tools) > limit:
        raise ValueError(f"at most {limit} tools ([limits] max_tools), got {len(tools)}")
    seen: set[str] = set()
    for i, name in enumerate(tool_names(tools)):
        if name in seen:
            raise at_path(AtPath(f"{i}.function.name", f"names the function {name!r} twice"))
        seen.add(name)
    return tools


def check_tool_choice(choice: Any, info: ValidationInfo) -> Any:
    """A choice other than ``none`` needs tools; a named one names one of them."""
    if choice is None or choice == "none" or "tools" not in info.data:
        return choice  # tools refused: their own error says why
    tools: tuple[Tool, ...] | None = info.data["tools"]
    if tools is None:
        raise ValueError("needs tools: only `none` goes without them")
    if isinstance(choice, NamedToolChoice):
        names = tool_names(tools)
        if choice.function.name not in names:
            known = ", ".join(names[:8]) + (", …" if len(names) > 8 else "")
            raise at_path(AtPath("function.name", f"names no function of tools ({known})"))
    return choice


def forces_a_call(choice: Any) -> bool:
    return choice == "required" or isinstance(choice, NamedToolChoice)


def check_response_format(fmt: ResponseFormat | None, info: ValidationInfo) -> Any:
    if fmt is not None and forces_a_call(info.data.get("tool_choice")):
        raise ValueError(
            "cannot go with a tool_choice that forces a call (`required` or a named "
            "function): the answer would be the call, never the document"
        )
    return fmt


class _Said(Protocol):
    """What the conversation's rules read of a message."""

    @property
    def role(self) -> Any: ...
    @property
    def content(self) -> str: ...
    @property
    def tool_calls(self) -> tuple[ToolCall, ...] | None: ...
    @property
    def tool_call_id(self) -> str | None: ...


def check_message(message: _Said, info: ValidationInfo) -> None:
    """One message's parts, for its role: only an assistant's carries tool calls, only a
    tool's (and every tool's) names the call it answers, with its result as content; no
    other is empty but an assistant's that only calls tools."""
    role = str(message.role.value)
    if message.tool_calls is not None:
        if role != "assistant":
            raise at_path(AtPath("tool_calls", "only an assistant message carries tool calls"))
        if not message.tool_calls:
            raise at_path(AtPath("tool_calls", "must hold a call (leave it out for none)"))
    if message.tool_call_id is not None and role != "tool":
        raise at_path(AtPath("tool_call_id", "only a tool message answers a call"))
    if role == "tool":
        if message.tool_call_id is None:
            raise at_path(AtPath("tool_call_id", "is required: a tool message names its call"))
        if not message.content:
            raise at_path(AtPath("content", "must not be empty: it is the call's result"))
    elif not message.content and not message.tool_calls and at_enqueue(info):
        reason = "must not be empty (only an assistant message with tool_calls may have none)"
        raise at_path(AtPath("content", reason))


def check_conversation(messages: Sequence[_Said]) -> int:
    """The calls across the conversation: each id once, each tool message answering a call
    of an earlier assistant message. Answers the conversation's size in bytes (contents
    and calls' arguments, what :class:`~resumeq.core.spec.Limits` ``max_prompt_bytes``
    bounds)."""
    calls: set[str] = set()
    size = 0
    for i, m in enumerate(messages):
        size += len(m.content.encode("utf-8"))
        for j, call in enumerate(m.tool_calls or ()):
            if call.id in calls:
                raise at_path(AtPath(f"{i}.tool_calls.{j}.id", f"{call.id!r} is a call's id twice"))
            calls.add(call.id)
            size += len(call.function.arguments.encode("utf-8"))
        if m.tool_call_id is not None and m.tool_call_id not in calls:
            reason = f"{m.tool_call_id!r} names no call of an earlier assistant message"
            raise at_path(AtPath(f"{i}.tool_call_id", reason))
    return size


def check_called_tools(messages: Sequence[_Said], tools: Sequence[Tool] | None) -> None:
    """With tools given, every call the conversation carries names one of them."""
    if tools is None:
        return
    names = tool_names(tools)
    for i, m in enumerate(messages):
        for j, call in enumerate(m.tool_calls or ()):
            if call.function.name not in names:
                where = f"messages.{i}.tool_calls.{j}.function.name"
                raise at_path(AtPath(where, f"{call.function.name!r} names no function of tools"))
