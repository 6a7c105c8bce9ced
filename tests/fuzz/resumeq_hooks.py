"""schemathesis hooks (``SCHEMATHESIS_HOOKS``) for the rules of ``POST /v1/jobs`` that
compare one value with another, which JSON Schema cannot say (the OpenAPI document's
descriptions state them): a valid case is made to keep them, an invalid one is left as
generated.

- ``floor_tokens`` is under ``budget_tokens``, or 1;
- a body's ``idempotency_key`` is the ``Idempotency-Key`` header's, when both are sent;
- a key names one request: reused with another body or queue it is a 422 (the
  Idempotency-Key draft), so a generated key is made that request's own;
- tools: no function named twice, each JSON Schema one enqueue takes (a generated object
  seldom is: it is made the smallest that is, the one strict mode takes too);
- a ``tool_choice`` other than ``none`` has tools and names one of them; a forced one goes
  without ``response_format``;
- a conversation's tool calls: ids used once, arguments a JSON object, names of the tools;
  a tool message answers an earlier call (or goes, when there is none)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import schemathesis

from resumeq.core import schema_rules
from resumeq.core.spec_rules import AtPath, check_arguments

KEY_MAX = 128


@schemathesis.hook
def before_call(ctx: Any, case: Any, kwargs: dict[str, Any]) -> None:
    if case.operation.path != "/v1/jobs" or case.method.upper() != "POST":
        return
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive:
        return
    body = case.body
    if not isinstance(body, dict):
        return
    _keep_the_shape(body)
    budget, floor = body.get("budget_tokens"), body.get("floor_tokens")
    if _int(budget) and _int(floor) and floor != 1 and floor >= budget:
        body["floor_tokens"] = 1
    headers = case.headers or {}
    header = headers.get("Idempotency-Key")
    if isinstance(header, str):
        quoted = header.startswith('"')
        key = _own(header.strip('"'), body, case.query)
        headers["Idempotency-Key"] = f'"{key}"' if quoted else key
        if body.get("idempotency_key") is not None:
            body["idempotency_key"] = key
    elif isinstance(body.get("idempotency_key"), str):
        body["idempotency_key"] = _own(body["idempotency_key"], body, case.query)


def _int(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == int(value)


def _own(key: str, body: dict[str, Any], query: Any) -> str:
    """``key``, made the key of this request alone (a digest of its body and its queue
    appended)."""
    rest = {k: v for k, v in body.items() if k != "idempotency_key"}
    asked = json.dumps([rest, dict(query or {})], sort_keys=True, default=str)
    digest = hashlib.sha256(asked.encode()).hexdigest()[:16]
    return f"{key[: KEY_MAX - 17]}.{digest}"  # "." ends a credential's run


#: The smallest JSON Schema of an object that every check takes, strict mode's too.
CLOSED_OBJECT = {"type": "object", "properties": {}, "required": [], "additionalProperties": False}


def _taken(schema: Any, *, root: bool, strict: bool) -> bool:
    try:
        schema_rules.check_schema(schema, root=root, strict=strict)
    except AtPath:
        return False
    return True


def _keep_the_shape(body: dict[str, Any]) -> None:
    names = _tools(body)
    choice = body.get("tool_choice")
    if choice is not None and choice != "none":
        if not names:
            body["tool_choice"] = "none"
        elif isinstance(choice, dict) and choice["function"]["name"] not in names:
            choice["function"]["name"] = names[0]
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and isinstance(fmt.get("json_schema"), dict):
        asked = fmt["json_schema"]
        if not _taken(asked["schema"], root=False, strict=bool(asked.get("strict"))):
            asked["schema"] = dict(CLOSED_OBJECT)
    forced = body.get("tool_choice") == "required" or isinstance(body.get("tool_choice"), dict)
    if fmt is not None and forced:
        body["tool_choice"] = "auto"
    if isinstance(body.get("messages"), list):
        body["messages"] = _answered(body["messages"], names)


def _tools(body: dict[str, Any]) -> list[str]:
    """The tools made distinct, each schema one enqueue takes; answers their names."""
    tools = body.get("tools")
    names: list[str] = []
    if not isinstance(tools, list):
        return names
    kept = []
    for tool in tools:
        function = tool["function"]
        if function["name"] in names:
            continue
        names.append(function["name"])
        params, strict = function.get("parameters"), bool(function.get("strict"))
        if params is not None and not _taken(params, root=True, strict=strict):
            function["parameters"] = dict(CLOSED_OBJECT)
        kept.append(tool)
    body["tools"] = kept
    return names


def _answered(messages: list[Any], names: list[str]) -> list[Any]:
    """The conversation with its calls made consistent: ids once, arguments an object,
    names of the tools; a tool message answering an earlier call, or left out."""
    calls: list[str] = []
    out = []
    for message in messages:
        for n, call in enumerate(message.get("tool_calls") or ()):
            if call["id"] in calls:
                call["id"] = f"call{len(calls)}x{n}"
            calls.append(call["id"])
            function = call["function"]
            if names and function["name"] not in names:
                function["name"] = names[0]
            try:
                check_arguments(function["arguments"])
            except ValueError:
                function["arguments"] = "{}"
        if message.get("role") == "tool" and message.get("tool_call_id") not in calls:
            if not calls:
                continue
            message["tool_call_id"] = calls[0]
        out.append(message)
    return out
