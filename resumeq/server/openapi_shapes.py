"""The OpenAPI document's parts that say what a job spec's messages and the shape of its
answer may be — :class:`~resumeq.core.spec.Message` by role, ``Tool``, ``NamedToolChoice``,
``ResponseFormat`` — and the pieces every schema of the document is built from (a string
held to a pattern and kept free of URLs and credentials, a nullable field).

A message's parts depend on its role, so a ``Message`` is one of four shapes: a system or
user message of text; an assistant message with ``tool_calls`` (its text may be empty); one
of text alone; a tool message answering a call with its result. What enqueue checks of a
JSON Schema (its meta-schema, its references, OpenAI's strict subset) is said in the
descriptions, not as a schema: the JSON Schema meta-schema is no schema a fuzzer can
generate from.
"""

from __future__ import annotations

from typing import Any

from resumeq.core import spec_rules
from resumeq.core.settings import Settings

_REF = "#/components/schemas/"


def not_refused(*extra: dict[str, Any]) -> dict[str, Any]:
    """What a short identifier or a piece of data may not be: a URL or a credential."""
    secrets = ({"pattern": p} for p in spec_rules.SECRET_PATTERNS)
    patterns = [{"pattern": spec_rules.URL_PATTERN}, *secrets]
    return {"not": {"anyOf": [*patterns, *extra]}}


def string(pattern: str, description: str = "", **more: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "string", "pattern": pattern, **not_refused(), **more}
    if description:
        out["description"] = description
    return out


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def _closed(required: list[str], **properties: Any) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False, "required": required,
            "properties": properties}  # fmt: skip


_FUNCTION = {"const": "function"}
_ABSENT = {"type": "null"}
_TEXT = {"type": "string", "minLength": 1}


def _schema_text(limits_bytes: int, what: str, root: str) -> str:
    return (
        f"a JSON Schema{root}, valid by the meta-schema of its $schema's draft (2020-12 "
        "without one), every $ref pointing inside it; with strict, OpenAI's strict subset "
        "(the root an object; every object additionalProperties false with every property "
        "required; no allOf, oneOf, not, if/then/else, dependentRequired, dependentSchemas, "
        "patternProperties, unevaluatedProperties, propertyNames, minProperties, "
        f"maxProperties); {what} at most {limits_bytes} bytes as compact JSON"
    )


def shape_components(settings: Settings) -> dict[str, Any]:
    """The components a spec's messages, tools, tool choice and response format refer to."""
    schema_bytes = settings.file.limits.max_schema_bytes
    name = string(spec_rules.TOOL_NAME_PATTERN)
    call_id = string(spec_rules.TOOL_CALL_ID_PATTERN)
    return {
        "Message": {"anyOf": [
            _closed(["role", "content"], role={"enum": ["system", "user"]}, content=_TEXT,
                    tool_calls=_ABSENT, tool_call_id=_ABSENT),
            _closed(["role", "tool_calls"], role={"const": "assistant"},
                    content={"type": "string"}, tool_call_id=_ABSENT,
                    tool_calls={"type": "array", "minItems": 1,
                                "items": {"$ref": f"{_REF}ToolCall"}}),
            _closed(["role", "content"], role={"const": "assistant"}, content=_TEXT,
                    tool_calls=_ABSENT, tool_call_id=_ABSENT),
            _closed(["role", "tool_call_id", "content"], role={"const": "tool"},
                    content={**_TEXT, "description": "the call's result"},
                    tool_calls=_ABSENT,
                    tool_call_id={**call_id, "description": "a call of an earlier "
                                  "assistant message"}),
        ]},
        "ToolCall": _closed(
            ["id", "function"], id=call_id, type=_FUNCTION,
            function=_closed(["name", "arguments"], name=name, arguments={
                "type": "string", "contentMediaType": "application/json",
                "contentSchema": {"type": "object"},
                "description": "the call's arguments: a JSON object, as text"}),
        ),
        "Tool": _closed(["function"], type=_FUNCTION, function=_closed(
            ["name"], name=name, description=nullable({"type": "string"}),
            strict=nullable({"type": "boolean"}),
            parameters=nullable({
                "type": "object", "required": ["type"],
                "properties": {"type": {"const": "object"}},
                "description": _schema_text(
                    schema_bytes, "the whole function (name, description, parameters, "
                    "strict)", ' of "type": "object"'),
            }),
        )),
        "NamedToolChoice": _closed(["function"], type=_FUNCTION,
                                   function=_closed(["name"], name=name)),
        "ResponseFormat": {"oneOf": [
            _closed(["type", "json_schema"], type={"const": "json_schema"}, json_schema=_closed(
                ["name", "schema"], name=name, description=nullable({"type": "string"}),
                strict=nullable({"type": "boolean"}),
                schema={"type": "object", "description": _schema_text(
                    schema_bytes, "the whole json_schema (name, description, schema, "
                    "strict)", "")},
            )),
            _closed(["type"], type={"const": "json_object"}, json_schema=_ABSENT),
        ]},
    }  # fmt: skip
