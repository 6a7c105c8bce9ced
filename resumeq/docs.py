"""The job spec reference, ``docs/jobspec.md``, written from :class:`~resumeq.core.spec.JobSpec`.

Every field of the spec and of the models it nests — its JSON type, its default, the bounds
and enums its annotation carries, the rules its validators apply and its description —
comes from the model; the validators' rules are spelled here from the same constants the
validators use, and a field validated with no rule written here stops the generator. Write
the page again with ``python -m resumeq.docs > docs/jobspec.md`` (``make docs``);
tests/test_docs.py fails when the page and the model disagree. No command of the CLI
imports this module.
"""

from __future__ import annotations

import enum
import json
import textwrap
import types
import typing
from collections.abc import Callable, Iterator
from typing import Any

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from resumeq.core import schema_rules, spec, spec_rules
from resumeq.core.names import IDEMPOTENCY_KEY_RE

__all__ = ["EXAMPLE", "jobspec_reference"]

#: The models of the page, in its order, with the field of the spec that holds each.
MODELS: tuple[tuple[type[BaseModel], str], ...] = (
    (spec.JobSpec, ""),
    (spec.Message, "messages"),
    (spec.ToolCall, "messages[].tool_calls"),
    (spec.FunctionCall, "messages[].tool_calls[].function"),
    (spec.GenerationParams, "params"),
    (spec.ExitPolicy, "exit"),
    (spec.Tool, "tools"),
    (spec.FunctionDef, "tools[].function"),
    (spec.NamedToolChoice, "tool_choice"),
    (spec.FunctionName, "tool_choice.function"),
    (spec.ResponseFormat, "response_format"),
    (spec.JsonSchemaFormat, "response_format.json_schema"),
)

_TIDES = {
    "type": "object",
    "properties": {"port": {"type": "string"}, "date": {"type": "string", "format": "date"}},
    "required": ["port", "date"],
    "additionalProperties": False,
}
#: A spec with every nested model in it but a named tool choice, which cannot go with a
#: response format (the generator checks it is valid).
EXAMPLE: dict[str, Any] = {
    "messages": [
        {"role": "system", "content": "Answer in two paragraphs."},
        {"role": "user", "content": "Explain today's tides at Brest"},
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "call_1",
                    "function": {
                        "name": "tide_table",
                        "arguments": '{"port": "Brest", "date": "2026-03-01"}',
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "High water 06:12 and 18:40"},
    ],
    "provider": "fake",
    "model": "fake-model",
    "budget_tokens": 800,
    "floor_tokens": 64,
    "params": {"temperature": 0.7, "stop": ["THE END"]},
    "exit": {"on_cut": "resume", "droppable": True, "max_attempts": 5, "on_invalid": "retry"},
    "idempotency_key": "order-1234",
    "metadata": {"customer": 42},
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "tide_table",
                "description": "High and low water at a port on a date",
                "parameters": _TIDES,
                "strict": True,
            },
        }
    ],
    "tool_choice": "auto",
    "response_format": {
        "type": "json_schema",
        "json_schema": {
            "name": "explanation",
            "schema": {
                "type": "object",
                "properties": {"paragraphs": {"type": "array", "items": {"type": "string"}}},
                "required": ["paragraphs"],
                "additionalProperties": False,
            },
            "strict": True,
        },
    },
}

_NOT_REFUSED = "not a URL and nothing that looks like a credential (an API key, a bearer token)"


def _limit(name: str) -> str:
    return f"`[limits] {name}` ({getattr(spec.DEFAULT_LIMITS, name)} by default)"


_TOOL_NAME = f"matches `{spec_rules.TOOL_NAME_PATTERN}`, {_NOT_REFUSED}"
_SCHEMA = (
    "a JSON Schema by the meta-schema of its `$schema`'s draft (2020-12 without one): an "
    "unknown `type` or a keyword of the wrong form is refused, naming its path in the schema"
)
_REFS = "every `$ref` points inside the schema (no provider fetches another document)"
_DEFINITION = f"the whole {{}} at most {_limit('max_schema_bytes')} bytes as compact JSON"
_STRICT_SUBSET = (
    "with `strict`: OpenAI's strict subset, as it would refuse otherwise — the root an "
    'object, every object `"additionalProperties": false` with every property in '
    "`required` (through `properties`, `items`, `$defs` and `anyOf`), and none of "
    + ", ".join(f"`{k}`" for k in schema_rules.STRICT_REFUSED)
)


#: What each field's validators check beyond its annotation, from their own constants.
RULES: dict[tuple[type[BaseModel], str], tuple[str, ...]] = {
    (spec.JobSpec, "messages"): (
        f"1 to {_limit('max_messages')} messages, at least one of them from the user",
        "the contents and the tool calls' arguments together at most "
        f"{_limit('max_prompt_bytes')} bytes of UTF-8",
        "each tool call's id used once in the conversation; each `tool` message answers a "
        "call of an earlier assistant message; with `tools`, each call names one of them",
        "not with `prompt`: give one of the two",
    ),
    (spec.JobSpec, "prompt"): (
        "not only white space",
        f"at most {_limit('max_prompt_bytes')} bytes of UTF-8",
        "not with `messages`: give one of the two",
    ),
    (spec.JobSpec, "provider"): (
        f"matches `{spec_rules.NAME_PATTERN}`",
        _NOT_REFUSED,
        "over HTTP, one of the serving config's profiles (the OpenAPI document's enum)",
    ),
    (spec.JobSpec, "model"): (f"matches `{spec_rules.MODEL_PATTERN}`", _NOT_REFUSED),
    (spec.JobSpec, "budget_tokens"): (f"at most {_limit('max_budget_tokens')}",),
    (spec.JobSpec, "floor_tokens"): ("less than `budget_tokens`, or 1 (no floor)",),
    (spec.JobSpec, "idempotency_key"): (
        f"matches `{IDEMPOTENCY_KEY_RE.pattern}`",
        _NOT_REFUSED,
        "over HTTP at most 128 characters (a job is kept under its caller's name), and the "
        "`Idempotency-Key` header's value when both are sent",
    ),
    (spec.JobSpec, "metadata"): (
        f"at most {_limit('max_metadata_bytes')} bytes as compact JSON",
        "keys 1 to 64 characters",
        f"every string in it, keys too, {_NOT_REFUSED}",
    ),
    (spec.JobSpec, "hooks"): (
        f"at most {_limit('max_hooks')} names, none twice",
        f"each matches `{spec_rules.NAME_PATTERN}`, {_NOT_REFUSED}",
    ),
    (spec.JobSpec, "tools"): (f"1 to {_limit('max_tools')} tools, no function named twice",),
    (spec.JobSpec, "tool_choice"): (
        "needs `tools`, unless it is `none`",
        "a named function is one of `tools`",
    ),
    (spec.JobSpec, "response_format"): (
        "not with a `tool_choice` that forces a call (`required` or a named function): the "
        "answer would be the call, never the document",
    ),
    (spec.GenerationParams, "stop"): ("each sequence 1 to 64 characters",),
    (spec.Message, "content"): (
        "a `tool` message's is the call's result, not empty; only an assistant message with "
        "`tool_calls` may have none",
    ),
    (spec.Message, "tool_calls"): ("only on an assistant message, and at least one call",),
    (spec.Message, "tool_call_id"): (
        f"matches `{spec_rules.TOOL_CALL_ID_PATTERN}`, {_NOT_REFUSED}",
        "required on a `tool` message, and only there",
    ),
    (spec.ToolCall, "id"): (f"matches `{spec_rules.TOOL_CALL_ID_PATTERN}`, {_NOT_REFUSED}",),
    (spec.FunctionCall, "name"): (_TOOL_NAME,),
    (spec.FunctionCall, "arguments"): ("the text of one JSON object",),
    (spec.FunctionDef, "name"): (_TOOL_NAME,),
    (spec.FunctionDef, "parameters"): (
        '`"type": "object"`: a function takes an object, on every provider',
        _SCHEMA,
        _REFS,
        _STRICT_SUBSET,
        _DEFINITION.format("definition (`name`, `description`, `parameters`, `strict`)"),
    ),
    (spec.FunctionName, "name"): (_TOOL_NAME, "the name of one of `tools`"),
    (spec.JsonSchemaFormat, "name"): (_TOOL_NAME,),
    (spec.JsonSchemaFormat, "schema_"): (
        _SCHEMA,
        _REFS,
        _STRICT_SUBSET,
        _DEFINITION.format("`json_schema` (`name`, `description`, `schema`, `strict`)"),
    ),
    (spec.ResponseFormat, "json_schema"): (
        "required with `type` `json_schema`, refused with `json_object`",
    ),
}

#: Defaults that a model validator derives from other fields.
DERIVED_DEFAULTS: dict[tuple[type[BaseModel], str], str] = {
    (spec.JobSpec, "floor_tokens"): (
        f"{spec_rules.DEFAULT_FLOOR_TOKENS}, or half a budget under "
        f"{2 * spec_rules.DEFAULT_FLOOR_TOKENS} (at least 1)"
    ),
}

#: What the strict JSON readers in a field's annotation refuse.
_STRICT: dict[Callable[[Any], Any], str] = {
    spec_rules.json_integer: "a JSON integer: a string, a boolean or a fraction is refused "
    "(`800.0` is 800)",
    spec_rules.json_number: "a JSON number: a string or a boolean is refused",
    spec_rules.json_boolean: "`true` or `false`: 0, 1 or a string is refused",
}

_BOUNDS: tuple[tuple[type[Any], str, str], ...] = (
    (annotated_types.Gt, "gt", "more than"),
    (annotated_types.Ge, "ge", "at least"),
    (annotated_types.Lt, "lt", "less than"),
    (annotated_types.Le, "le", "at most"),
)
_WIDTH = 92


def _anchor(model: type[BaseModel]) -> str:
    return model.__name__.lower()


def _type_name(annotation: Any) -> str:
    """The JSON type of an annotation, as a reader of the page says it."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        names = [_type_name(a) for a in args if a is not type(None)]
        return " or ".join(names) + (" or null" if type(None) in args else "")
    if origin is typing.Literal:
        return "string, one of " + ", ".join(f"`{a}`" for a in args)
    if origin is tuple:
        return f"array of {_type_name(args[0])}"
    if origin is dict:
        return "object of JSON values"
    return _leaf_name(annotation)


def _leaf_name(annotation: Any) -> str:
    named = {str: "string", int: "integer", float: "number", bool: "boolean"}
    if annotation in named:
        return named[annotation]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"[{annotation.__name__}](#{_anchor(annotation)})"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "string, one of " + ", ".join(f"`{m.value}`" for m in annotation)
    raise TypeError(f"no JSON name for {annotation!r}: teach resumeq.docs._type_name it")


def _metadata(field: FieldInfo) -> Iterator[Any]:
    """The field's metadata, and that of any Annotated inside its annotation."""
    yield from field.metadata

    def inner(annotation: Any) -> Iterator[Any]:
        if typing.get_origin(annotation) is typing.Annotated:
            yield from annotation.__metadata__
        for arg in typing.get_args(annotation):
            yield from inner(arg)

    yield from inner(field.annotation)


def _annotation_rules(field: FieldInfo) -> list[str]:
    out = []
    for item in _metadata(field):
        for kind, attribute, sign in _BOUNDS:
            if isinstance(item, kind):
                out.append(f"{sign} {getattr(item, attribute)}")
        if isinstance(item, annotated_types.MaxLen):
            out.append(f"at most {item.max_length} items")
        if isinstance(item, annotated_types.MinLen):
            out.append(f"at least {item.min_length} items")
        func = getattr(item, "func", None)
        if func in _STRICT:
            out.append(_STRICT[func])
    return out


def _default(model: type[BaseModel], name: str, field: FieldInfo) -> str:
    if (model, name) in DERIVED_DEFAULTS:
        return DERIVED_DEFAULTS[(model, name)]
    if field.is_required():
        return "required"
    if field.default_factory is not None:
        value: Any = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:  # pragma: no cover - required, above
        return "required"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "each field's default"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, tuple):
        value = list(value)
    return f"`{json.dumps(value)}`"


def _validated(model: type[BaseModel]) -> set[str]:
    decorators = model.__pydantic_decorators__.field_validators.values()
    return {name for d in decorators for name in d.info.fields}


def _model_section(model: type[BaseModel], holder: str) -> list[str]:
    undocumented = sorted(_validated(model) - {n for m, n in RULES if m is model})
    if undocumented:
        raise RuntimeError(
            f"{model.__name__}: write the rules of {', '.join(undocumented)} in resumeq.docs.RULES"
        )
    doc = " ".join((model.__doc__ or "").strip().split("\n\n")[0].split())
    where = f" In a spec: `{holder}`." if holder else ""
    lines = [f"## {model.__name__}", "", *_wrap(f"{doc}{where}"), ""]
    for name, field in model.model_fields.items():
        if not field.description:
            raise RuntimeError(f"{model.__name__}.{name}: give it a Field(description=...)")
        rules = [*_annotation_rules(field), *RULES.get((model, name), ())]
        default = _default(model, name, field)
        kind = f"**Type:** {_type_name(field.annotation)}."
        kind += " **Required.**" if default == "required" else f" **Default:** {default}."
        shown = field.alias or name
        lines += [f"### `{shown}`", "", *_wrap(kind), "", *_wrap(field.description)]
        if rules:
            lines.append("")
            for rule in rules:
                lines += _wrap(rule, first="- ", then="  ")
        lines.append("")
    return lines


def _wrap(text: str, first: str = "", then: str = "") -> list[str]:
    return textwrap.wrap(
        text,
        _WIDTH,
        initial_indent=first,
        subsequent_indent=then,
        break_long_words=False,
        break_on_hyphens=False,
    )


def _pretty(value: Any, indent: str, lead: str = "") -> str:
    """``value`` as JSON after ``indent + lead``: on that one line if it fits the page, else
    a key or an item a line, each nested the same way."""
    flat = json.dumps(value, ensure_ascii=False)
    if len(indent) + len(lead) + len(flat) <= _WIDTH or not isinstance(value, dict | list):
        return flat
    inner = indent + "  "
    if isinstance(value, dict):
        rows = [
            f"{inner}{json.dumps(k)}: {_pretty(v, inner, json.dumps(k) + ': ')}"
            for k, v in value.items()
        ]
        return "{\n" + ",\n".join(rows) + f"\n{indent}}}"
    rows = [f"{inner}{_pretty(v, inner)}" for v in value]
    return "[\n" + ",\n".join(rows) + f"\n{indent}]"


def _example() -> str:
    """:data:`EXAMPLE` as JSON, a key a line (and a message a line) where it fits."""
    return _pretty(EXAMPLE, "", "x" * _WIDTH)


def jobspec_reference() -> str:
    """The text of ``docs/jobspec.md``."""
    spec.parse_spec(EXAMPLE)  # the page's example is a spec the model takes
    lines = [
        "# The job spec",
        "",
        "<!-- Written by `python -m resumeq.docs > docs/jobspec.md` (`make docs`) from the",
        "     model, resumeq.core.spec.JobSpec: edit the model, not this page. -->",
        "",
        "What a producer submits: `Client.enqueue(spec)`, `POST /v1/jobs` (a JSON body), or",
        "`resumeq enqueue`'s options ([operations](operations.md#enqueue-and-watch)). A spec",
        "names a provider *profile* and a model, never a URL or a key. A field it does not",
        "have is refused — the exit policy is the object `exit`, so a top-level `on_cut` is",
        "refused — and a refused spec names every bad field; nothing is written. The limits",
        "are the `[limits]` of the config ([configuration](configuration.md#limits)); the",
        "OpenAPI document of `resumeq serve` (`GET /openapi.json`) states the same rules with",
        "its own config's profiles and limits.",
        "",
        "```json",
        _example(),
        "```",
        "",
    ]
    for model, holder in MODELS:
        lines.extend(_model_section(model, holder))
    return "\n".join(lines).rstrip("\n") + "\n"


if __name__ == "__main__":
    print(jobspec_reference(), end="")
