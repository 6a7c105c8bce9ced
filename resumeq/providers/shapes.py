"""A request's shape — the tools the answer may call, how it must choose among them, the
JSON document it must be — and a conversation's tool messages, in each wire's form (SPEC
§23). The job gives them in OpenAI Chat Completions' form; the forms here are the official
SDKs' request types (``openai.types.chat``, ``openai.types.responses``,
``anthropic.types``).

A plan without shape adds nothing: its body is the same, byte for byte, as before tools.

- Chat Completions: ``tools``, ``tool_choice`` and ``response_format`` as the job gives
  them; an assistant message's ``tool_calls`` (its ``content`` null when it has none), a
  tool message ``{"role": "tool", "tool_call_id", "content"}``.
- Anthropic Messages: ``tools`` with ``input_schema`` (and ``strict`` where the job says),
  ``tool_choice`` ``auto`` / ``any`` / ``none`` / ``tool``, a JSON schema as structured
  outputs' ``output_config.format``; ``json_object`` has no API form (the job's own
  instruction asks for it). An assistant's calls are ``tool_use`` blocks, tool messages
  ``tool_result`` blocks of one user message (the roles must alternate).
- Responses: flat function ``tools`` (``strict`` always said: a Responses request that omits
  it is made strict, which Chat Completions' default is not), ``text.format``;
  ``function_call`` and ``function_call_output`` input items.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from resumeq.core.continuation import ChatMessage, Shape
from resumeq.core.errors import FatalProviderError
from resumeq.core.spec import FunctionDef, JsonSchemaFormat, ToolCall, ToolChoice

#: A function without parameters: what Chat Completions takes an omitted schema for.
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
CACHE = {"type": "ephemeral"}

_ANTHROPIC_CHOICE = {"auto": "auto", "required": "any", "none": "none"}


def _chat_choice(choice: ToolChoice) -> str | dict[str, Any]:
    return choice if isinstance(choice, str) else choice.model_dump(mode="json")


# -- OpenAI Chat Completions ---------------------------------------------------------------


def chat_shape(shape: Shape) -> dict[str, Any]:
    """The body fields of a shape on the Chat Completions wire."""
    body: dict[str, Any] = {}
    if shape.tools:
        body["tools"] = [t.model_dump(mode="json", exclude_none=True) for t in shape.tools]
    if shape.tool_choice is not None:
        body["tool_choice"] = _chat_choice(shape.tool_choice)
    if shape.response_format is not None:
        body["response_format"] = shape.response_format.model_dump(
            mode="json", by_alias=True, exclude_none=True
        )
    return body


def chat_message(m: ChatMessage) -> dict[str, Any]:
    """A message on the Chat Completions wire."""
    if m.role == "tool":
        return {"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content}
    msg: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        msg["content"] = m.content or None
        msg["tool_calls"] = [c.model_dump(mode="json") for c in m.tool_calls]
    if m.prefix:
        msg["prefix"] = True
    return msg


# -- Anthropic Messages --------------------------------------------------------------------


def anthropic_shape(shape: Shape) -> dict[str, Any]:
    """The body fields of a shape on the Messages wire."""
    body: dict[str, Any] = {}
    if shape.tools:
        body["tools"] = [_anthropic_tool(t.function) for t in shape.tools]
    choice = shape.tool_choice
    if isinstance(choice, str):
        body["tool_choice"] = {"type": _ANTHROPIC_CHOICE[choice]}
    elif choice is not None:
        body["tool_choice"] = {"type": "tool", "name": choice.function.name}
    fmt = shape.response_format
    if fmt is not None and fmt.type == "json_schema" and fmt.json_schema is not None:
        schema = fmt.json_schema.schema_
        body["output_config"] = {"format": {"type": "json_schema", "schema": schema}}
    return body


def _anthropic_tool(f: FunctionDef) -> dict[str, Any]:
    tool: dict[str, Any] = {"name": f.name}
    if f.description is not None:
        tool["description"] = f.description
    tool["input_schema"] = f.parameters if f.parameters is not None else NO_PARAMETERS
    if f.strict is not None:
        tool["strict"] = f.strict
    return tool


def anthropic_messages(messages: Iterable[ChatMessage]) -> list[dict[str, Any]]:
    """The conversation's turns (its system messages go apart). Tool messages in a row are
    one user turn of ``tool_result`` blocks, as Anthropic needs the roles to alternate."""
    out: list[dict[str, Any]] = []
    results: list[dict[str, Any]] | None = None  # the tool results' turn being filled
    for m in messages:
        if m.role == "system":
            continue
        if m.role != "tool":
            results = None
            content = _tool_uses(m) if m.tool_calls else anthropic_content(m)
            out.append({"role": m.role, "content": content})
            continue
        block: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": m.tool_call_id,
            "content": m.content,
        }
        if m.cache:
            block["cache_control"] = CACHE
        if results is None:
            results = []
            out.append({"role": "user", "content": results})
        results.append(block)
    return out


def anthropic_content(m: ChatMessage) -> str | list[dict[str, Any]]:
    """A text message's content (a block, when it marks the prompt cache)."""
    if not m.cache:
        return m.content
    return [{"type": "text", "text": m.content, "cache_control": CACHE}]


def _tool_uses(m: ChatMessage) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = [{"type": "text", "text": m.content}] if m.content else []
    blocks += [
        {"type": "tool_use", "id": c.id, "name": c.function.name, "input": _input(c)}
        for c in m.tool_calls
    ]
    if m.cache:
        blocks[-1]["cache_control"] = CACHE
    return blocks


def _input(call: ToolCall) -> dict[str, Any]:
    """A call's arguments as the object a ``tool_use`` block holds."""
    text = call.function.arguments
    try:
        value = json.loads(text) if text.strip() else {}
    except (ValueError, RecursionError):
        value = None
    if not isinstance(value, dict):
        raise FatalProviderError(
            f"tool call {call.id}'s arguments are not a JSON object, which Anthropic's "
            f"tool_use block needs: {text[:80]!r}"
        )
    return value


# -- OpenAI Responses ----------------------------------------------------------------------


def responses_shape(shape: Shape) -> dict[str, Any]:
    """The body fields of a shape on the Responses wire."""
    body: dict[str, Any] = {}
    if shape.tools:
        body["tools"] = [_responses_tool(t.function) for t in shape.tools]
    choice = shape.tool_choice
    if isinstance(choice, str):
        body["tool_choice"] = choice
    elif choice is not None:
        body["tool_choice"] = {"type": "function", "name": choice.function.name}
    fmt = shape.response_format
    if fmt is not None and fmt.type == "json_schema" and fmt.json_schema is not None:
        body["text"] = {"format": _responses_schema(fmt.json_schema)}
    elif fmt is not None and fmt.type == "json_object":
        body["text"] = {"format": {"type": "json_object"}}
    return body


def _responses_tool(f: FunctionDef) -> dict[str, Any]:
    tool: dict[str, Any] = {"type": "function", "name": f.name}
    if f.description is not None:
        tool["description"] = f.description
    tool["parameters"] = f.parameters if f.parameters is not None else NO_PARAMETERS
    tool["strict"] = bool(f.strict)
    return tool


def _responses_schema(s: JsonSchemaFormat) -> dict[str, Any]:
    fmt: dict[str, Any] = {"type": "json_schema", "name": s.name}
    if s.description is not None:
        fmt["description"] = s.description
    fmt["schema"] = s.schema_
    fmt["strict"] = bool(s.strict)
    return fmt


def responses_items(m: ChatMessage) -> list[dict[str, Any]]:
    """The input items of a message: a tool result is a ``function_call_output``, an
    assistant's calls ``function_call`` items after its text (if any); other messages are
    one item each."""
    if m.role == "tool":
        return [{"type": "function_call_output", "call_id": m.tool_call_id, "output": m.content}]
    item = {"role": "developer" if m.role == "system" else m.role, "content": m.content}
    if not m.tool_calls:
        return [item]
    calls = [
        {
            "type": "function_call",
            "call_id": c.id,
            "name": c.function.name,
            "arguments": c.function.arguments,
        }
        for c in m.tool_calls
    ]
    return [item, *calls] if m.content else calls
