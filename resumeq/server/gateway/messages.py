"""``POST /v1/messages`` as Anthropic's Messages API answers it, streamed or not, from a
resumeq job (SPEC §24).

The request becomes a job spec (:func:`spec_of`): ``system`` (a string or text blocks) as
the first message, each message's text blocks joined, an assistant's ``tool_use`` blocks as
its tool calls and a user's ``tool_result`` blocks as tool messages, ``max_tokens`` as the
budget, ``stop_sequences`` as stops, ``tools`` (``input_schema``) and ``tool_choice``
(``auto``, ``any``, ``tool``, ``none``) in OpenAI's shape, which the workers translate for
each provider. A streamed answer is Anthropic's events: ``message_start``, a
``content_block_start``/``_delta``/``_stop`` for the text and for each tool call once whole,
``message_delta`` with the stop reason, the usage and the ``resumeq`` extension, then
``message_stop``; an end other than ``done`` is ``event: error`` naming the job and why.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from resumeq.core.errors import InvalidSpec
from resumeq.server import sse
from resumeq.server.auth import Principal
from resumeq.server.gateway import common
from resumeq.server.gateway.common import Call, Ended, Text
from resumeq.server.gateway.errors import WireError, as_wire_error, unsupported
from resumeq.server.service import Service, service

_TAKEN = frozenset(
    {
        "model", "messages", "max_tokens", "system", "temperature", "top_p", "top_k",
        "stop_sequences", "stream", "tools", "tool_choice", "metadata", "thinking",
        "service_tier",
    }
)  # fmt: skip
_CHOICES = {"auto": "auto", "any": "required", "none": "none"}
_STOPS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def spec_of(body: dict[str, Any], settings: Any) -> tuple[dict[str, Any], str, int]:
    """The job spec a Messages request asks for, the model it named, and how many
    messages ``system`` added before its own (an error's index is the request's)."""
    given = {k: v for k, v in body.items() if v is not None}
    for name in given:
        if name not in _TAKEN:
            raise WireError(400, f"{name}: Extra inputs are not permitted", param=name)
    for name in ("top_k", "thinking"):
        if name in given:
            raise unsupported(name)
    profile, model = common.resolve_model(settings, given.get("model"))
    if "max_tokens" not in given:
        raise WireError(400, "max_tokens: Field required", param="max_tokens")
    messages = given.get("messages")
    if not isinstance(messages, list) or not messages:
        raise WireError(400, "messages: a non-empty list is required", param="messages")
    system = _system(given.get("system"))
    converted = [m for i, message in enumerate(messages) for m in _messages(i, message)]
    spec: dict[str, Any] = {
        "messages": system + converted,
        "provider": profile,
        "model": model,
        "budget_tokens": given["max_tokens"],
        "metadata": {"gateway": {"wire": "messages", "model": given["model"]}},
    }
    if "metadata" in given:
        spec["metadata"]["metadata"] = given["metadata"]
    return {**spec, **_sampling(given)}, str(given["model"]), len(system)


def _sampling(given: dict[str, Any]) -> dict[str, Any]:
    """The spec's ``params``, ``tools`` and ``tool_choice`` from the request's."""
    out: dict[str, Any] = {}
    params: dict[str, Any] = {k: given[k] for k in ("temperature", "top_p") if k in given}
    if "stop_sequences" in given:
        params["stop"] = given["stop_sequences"]
    if params:
        out["params"] = params
    if "tools" in given:
        out["tools"] = _tools(given["tools"])
    if "tool_choice" in given:
        out["tool_choice"] = _choice(given["tool_choice"])
    return out


def _system(system: Any) -> list[dict[str, Any]]:
    if system is None or system == "":
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}]
    if isinstance(system, list):
        texts = []
        for j, block in enumerate(system):
            if not isinstance(block, dict) or block.get("type") != "text":
                raise WireError(400, f"system.{j}: only text blocks", param=f"system.{j}")
            texts.append(str(block.get("text", "")))
        return [{"role": "system", "content": "\n\n".join(texts)}]
    raise WireError(400, "system: a string or a list of text blocks", param="system")


def _messages(i: int, message: Any) -> list[dict[str, Any]]:
    """One request message as the job's messages: a user message's tool results become
    tool messages (first, as the calls they answer came before)."""
    where = f"messages.{i}"
    if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
        raise WireError(400, f"{where}.role: user or assistant", param=f"{where}.role")
    role, content = message["role"], message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise WireError(400, f"{where}.content: a string or a list of blocks", param=where)
    parts = _Parts()
    for j, block in enumerate(content):
        parts.take(f"{where}.content.{j}", role, block)
    out = list(parts.results)
    if parts.texts or parts.calls or not parts.results:
        own: dict[str, Any] = {"role": role, "content": "".join(parts.texts)}
        if parts.calls:
            own["tool_calls"] = parts.calls
        out.append(own)
    return out


class _Parts:
    """A message's blocks, sorted: its text, an assistant's calls, a user's tool results."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.calls: list[dict[str, Any]] = []
        self.results: list[dict[str, Any]] = []

    def take(self, where: str, role: str, block: Any) -> None:
        _block(where, role, block, self)


def _block(where: str, role: str, block: Any, parts: _Parts) -> None:
    texts, calls, results = parts.texts, parts.calls, parts.results
    kind = block.get("type") if isinstance(block, dict) else None
    if kind == "text" and isinstance(block.get("text"), str):
        texts.append(block["text"])
    elif kind == "tool_use" and role == "assistant":
        arguments = json.dumps(block.get("input", {}), ensure_ascii=False)
        function = {"name": block.get("name"), "arguments": arguments}
        calls.append({"id": block.get("id"), "type": "function", "function": function})
    elif kind == "tool_result" and role == "user":
        results.append(
            {
                "role": "tool",
                "tool_call_id": block.get("tool_use_id"),
                "content": _result_text(where, block.get("content")),
            }
        )
    else:
        raise WireError(
            400,
            f"{where}.type: text, tool_use (assistant) or tool_result (user) blocks only "
            f"(not {str(kind)[:40]!r})",
            param=f"{where}.type",
        )


def _result_text(where: str, content: Any) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(
        isinstance(b, dict) and b.get("type") == "text" for b in content
    ):
        return "".join(str(b.get("text", "")) for b in content)
    raise WireError(400, f"{where}.content: text only", param=f"{where}.content")


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise WireError(400, "tools: a list of tools", param="tools")
    out = []
    for j, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type", "custom") != "custom":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise unsupported(f"tools.{j}.type", f"client tools only, not {str(kind)[:40]!r}")
        function = {"name": tool.get("name"), "parameters": tool.get("input_schema")}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _choice(choice: Any) -> Any:
    if not isinstance(choice, dict) or choice.get("type") not in (*_CHOICES, "tool"):
        raise WireError(400, "tool_choice.type: auto, any, tool or none", param="tool_choice")
    if choice.get("disable_parallel_tool_use"):
        raise unsupported("tool_choice.disable_parallel_tool_use")
    if choice["type"] == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return _CHOICES[choice["type"]]


_INDEX = re.compile(r"^messages\.(\d+)")


def renamer(system: int) -> Callable[[str], str]:
    """A job spec's field as the request names it (its messages counted without the
    system message the spec put first)."""

    def rename(field: str) -> str:
        if field in ("budget_tokens", "floor_tokens"):
            return "max_tokens"
        if field == "params.stop":
            return "stop_sequences"
        field = field.removeprefix("params.")
        found = _INDEX.match(field)
        if found and system:
            at = int(found.group(1)) - system
            field = "system" if at < 0 else f"messages.{at}{field[found.end() :]}"
        return field

    return rename


# -- the route ------------------------------------------------------------------------------


async def create_message(request: Request) -> Response:
    who = common.caller(request, "anthropic")
    svc = service(request)
    body = await common.read_body(request)
    spec, model, system = spec_of(body, svc.settings)
    try:
        job_id = await common.create(request, who, spec)
    except InvalidSpec as exc:
        raise as_wire_error(exc, renamer(system)) from None
    if not body.get("stream"):
        patience = svc.settings.file.gateway.max_wait_s
        async for happened in common.happenings(svc, who, job_id, patience_s=patience):
            if isinstance(happened, Ended):
                return JSONResponse(message(happened.job, model))
        raise AssertionError("happenings end with Ended or raise")  # pragma: no cover
    return sse.EventStream(events(svc, who, job_id, model))


def message(job: dict[str, Any], model: str) -> dict[str, Any]:
    """The ``message`` of a job that ended ``done``."""
    content: list[dict[str, Any]] = []
    if job["text"]:
        content.append({"type": "text", "text": job["text"]})
    content += [_tool_use(c) for c in job["tool_calls"]]
    return {
        **_head(job["id"], model),
        "content": content,
        "stop_reason": stop_reason(job),
        "usage": _usage(common.usage(job)),
        "resumeq": common.usage(job).extension,
    }


def _head(job_id: str, model: str) -> dict[str, Any]:
    return {"id": job_id, "type": "message", "role": "assistant", "model": model,
            "stop_reason": None, "stop_sequence": None}  # fmt: skip


def stop_reason(job: dict[str, Any]) -> str:
    if job.get("refusal"):
        return "refusal"
    if str(job.get("finish_reason") or "").endswith("stop_sequence"):
        return "stop_sequence"
    return _STOPS.get(common.finish(job), "end_turn")


def _tool_use(call: dict[str, str]) -> dict[str, Any]:
    try:
        arguments = json.loads(call["arguments"] or "{}")
    except ValueError:  # a done job's calls were checked: not expected
        arguments = {}
    return {"type": "tool_use", "id": call["id"], "name": call["name"], "input": arguments}


def _usage(use: common.Usage) -> dict[str, Any]:
    return {
        "input_tokens": use.input_tokens,
        "output_tokens": use.output_tokens,
        "cache_read_input_tokens": use.cached_input_tokens,
        "cache_creation_input_tokens": 0,
    }


def _event(name: str, data: dict[str, Any]) -> bytes:
    payload = json.dumps({"type": name, **data}, ensure_ascii=False)
    return f"event: {name}\ndata: {payload}\n\n".encode()


async def events(svc: Service, who: Principal, job_id: str, model: str) -> AsyncIterator[bytes]:
    """The streamed answer: Anthropic's events from the job's checkpoints."""
    start = {**_head(job_id, model), "content": [],
             "usage": {"input_tokens": 0, "output_tokens": 0}}  # fmt: skip
    blocks = _Blocks()
    over = False
    try:
        yield common.OPENING + _event("message_start", {"message": start})
        try:
            async for happened in common.happenings(svc, who, job_id):
                if isinstance(happened, Text):
                    yield blocks.text(happened.text)
                elif isinstance(happened, Call):
                    yield blocks.call(happened.call)
                elif isinstance(happened, Ended):
                    over = True
                    yield blocks.close() + _ending(happened.job)
                    return
                else:
                    yield _event("ping", {})
        except WireError as exc:
            over = True
            yield exc.event("anthropic")
    finally:
        if not over and svc.settings.file.gateway.cancel_on_disconnect:
            with anyio.CancelScope(shield=True):
                await common.cancel_on_disconnect(svc, who, job_id)


class _Blocks:
    """The content blocks streamed so far: a text block stays open while text comes; a
    tool call is a block of its own, whole."""

    def __init__(self) -> None:
        self.count = 0
        self.open_text = False

    def text(self, text: str) -> bytes:
        head = b""
        if not self.open_text:
            head = _event(
                "content_block_start",
                {"index": self.count, "content_block": {"type": "text", "text": ""}},
            )
            self.open_text = True
        delta = {"index": self.count, "delta": {"type": "text_delta", "text": text}}
        return head + _event("content_block_delta", delta)

    def call(self, call: dict[str, str]) -> bytes:
        out = self.close()
        block = {"type": "tool_use", "id": call["id"], "name": call["name"], "input": {}}
        at = self.count
        out += _event("content_block_start", {"index": at, "content_block": block})
        partial = {"type": "input_json_delta", "partial_json": call["arguments"]}
        out += _event("content_block_delta", {"index": at, "delta": partial})
        out += _event("content_block_stop", {"index": at})
        self.count += 1
        return out

    def close(self) -> bytes:
        if not self.open_text:
            return b""
        self.open_text = False
        self.count += 1
        return _event("content_block_stop", {"index": self.count - 1})


def _ending(job: dict[str, Any]) -> bytes:
    use = common.usage(job)
    delta = {
        "delta": {"stop_reason": stop_reason(job), "stop_sequence": None},
        "usage": _usage(use),
        "resumeq": use.extension,
    }
    return _event("message_delta", delta) + _event("message_stop", {})
