"""A Responses request's ``input`` (and ``instructions``) as chat messages.

``input`` is a string, or a list of items: messages with a role and a string or a list of
``input_text`` / ``output_text`` parts; ``function_call`` items (``call_id``, ``name``,
``arguments``: the calls of an earlier answer, joined into one assistant message with the
message before them, if it is the assistant's) and ``function_call_output`` items
(``call_id``, ``output``: tool results). ``instructions`` is a system message in front. A
final assistant message with ``status: "in_progress"`` is to be continued.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from resumeq.fake.conversation import InvalidRequest


def items_to_messages(body: Mapping[str, Any]) -> tuple[list[dict[str, Any]], bool]:
    """``input`` (and ``instructions``) as chat messages; whether the last one, an
    assistant message ``in_progress``, is to be continued."""
    raw = body.get("input")
    if isinstance(raw, str):
        items: list[Any] = [{"role": "user", "content": raw}]
    elif isinstance(raw, list) and raw:
        items = raw
    else:
        raise InvalidRequest("input: expected a string or a non-empty list of items", "input")
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise InvalidRequest("instructions: expected a string", "instructions")
        messages.append({"role": "system", "content": instructions})
    continue_final = False
    for index, item in enumerate(items):
        param = f"input.{index}"
        if not isinstance(item, Mapping):
            raise InvalidRequest(f"{param}: expected an object", param)
        kind = item.get("type", "message")
        if kind == "function_call":
            _add_call(messages, item, param)
        elif kind == "function_call_output":
            messages.append(_tool_result(item, param))
        elif kind == "message":
            messages.append({"role": item.get("role"), "content": _content(item, param)})
            continue_final = _continued(item, index == len(items) - 1, param)
        else:
            raise InvalidRequest(
                f"{param}.type: only message, function_call and function_call_output items "
                "are supported",
                param,
            )
    return messages, continue_final


def _continued(item: Mapping[str, Any], last: bool, param: str) -> bool:
    """Whether a message item is the assistant's, in progress, to be continued."""
    if item.get("status") != "in_progress":
        return False
    if not (last and item.get("role") == "assistant"):
        raise InvalidRequest(
            f"{param}.status: only the last, assistant message may be in_progress", param
        )
    return True


def _add_call(messages: list[dict[str, Any]], item: Mapping[str, Any], param: str) -> None:
    call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
    if not (isinstance(call_id, str) and isinstance(name, str) and isinstance(arguments, str)):
        raise InvalidRequest(
            f"{param}: a function_call item has a call_id, a name and arguments (a string)",
            param,
        )
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    last = messages[-1] if messages else None
    if last is None or last.get("role") != "assistant":
        last = {"role": "assistant", "content": None}
        messages.append(last)
    last.setdefault("tool_calls", []).append(call)


def _tool_result(item: Mapping[str, Any], param: str) -> dict[str, Any]:
    call_id, output = item.get("call_id"), item.get("output")
    if not isinstance(call_id, str):
        raise InvalidRequest(f"{param}.call_id: expected a string", param)
    if isinstance(output, list):
        output = _content({"content": output}, param)
    elif not isinstance(output, str):
        raise InvalidRequest(f"{param}.output: expected a string or a list of parts", param)
    return {"role": "tool", "tool_call_id": call_id, "content": output}


def _content(item: Mapping[str, Any], param: str) -> Any:
    """A message's content as the chat wire has it: a string, or a list of text blocks."""
    content = item.get("content")
    if not isinstance(content, list):
        return content
    parts = []
    for n, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind not in ("input_text", "output_text", "text"):
            raise InvalidRequest(
                f"{param}.content.{n}: expected an input_text or output_text part", param
            )
        parts.append({"type": "text", "text": part.get("text")})
    return parts
