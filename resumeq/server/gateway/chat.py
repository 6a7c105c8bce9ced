"""``POST /v1/chat/completions`` as OpenAI's Chat Completions answers it, streamed or not,
from a resumeq job (SPEC §24).

The request becomes a job spec (:func:`spec_of`): its messages (text parts joined, the
``developer`` role as ``system``), ``max_completion_tokens`` or ``max_tokens`` as the budget,
the sampling parameters, ``tools``, ``tool_choice`` and ``response_format`` as they are.
A parameter resumeq cannot honour is a 400 naming it, never dropped. The answer is read
from the job's checkpoints: a streamed one as ``chat.completion.chunk`` events (the first
at once, then each durable delta, each tool call once whole, the finish, the usage when
``stream_options.include_usage`` asks, ``[DONE]``); an end other than ``done`` as an
``error`` data line naming the job and why.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from resumeq.server import sse
from resumeq.server.auth import Principal
from resumeq.server.gateway import common
from resumeq.server.gateway.common import Call, Ended, Text
from resumeq.server.gateway.errors import WireError, unsupported
from resumeq.server.service import Service, service

#: Parameters taken as they are, or kept with the job.
_TAKEN = frozenset(
    {
        "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
        "stop", "seed", "tools", "tool_choice", "response_format", "stream", "stream_options",
        "user", "metadata", "parallel_tool_calls", "n", "logprobs", "top_logprobs",
        "logit_bias", "presence_penalty", "frequency_penalty", "store", "service_tier",
    }
)  # fmt: skip
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant",
          "tool": "tool"}  # fmt: skip


def spec_of(body: dict[str, Any], settings: Any) -> tuple[dict[str, Any], str]:
    """The job spec a Chat Completions request asks for, and the model it named."""
    given = {k: v for k, v in body.items() if v is not None}
    for name in given:
        if name not in _TAKEN:
            raise WireError(
                400,
                f"Unrecognized request argument supplied: {name}",
                param=name,
                code="unsupported_parameter",
            )
    _refuse_unhonoured(given)
    profile, model = common.resolve_model(settings, given.get("model"))
    messages = given.get("messages")
    if not isinstance(messages, list) or not messages:
        raise WireError(400, "messages: a non-empty array is required", param="messages")
    budget = given.get("max_completion_tokens", given.get("max_tokens"))
    spec: dict[str, Any] = {
        "messages": [_message(i, m) for i, m in enumerate(messages)],
        "provider": profile,
        "model": model,
        "budget_tokens": settings.file.gateway.default_max_tokens if budget is None else budget,
        "metadata": _metadata(given, "chat.completions"),
    }
    params: dict[str, Any] = {k: given[k] for k in ("temperature", "top_p", "seed") if k in given}
    if "stop" in given:
        params["stop"] = [given["stop"]] if isinstance(given["stop"], str) else given["stop"]
    if params:
        spec["params"] = params
    for name in ("tools", "tool_choice"):
        if name in given:
            spec[name] = given[name]
    format_ = given.get("response_format")
    if isinstance(format_, dict) and format_.get("type") == "text":
        format_ = None  # the default: plain text
    if format_ is not None:
        spec["response_format"] = format_
    return spec, str(given["model"])


def _refuse_unhonoured(given: dict[str, Any]) -> None:
    if given.get("n", 1) != 1:
        raise unsupported("n", "one answer per request: enqueue one request per answer")
    if given.get("logprobs") or "top_logprobs" in given:
        raise unsupported("logprobs" if given.get("logprobs") else "top_logprobs")
    if given.get("logit_bias"):
        raise unsupported("logit_bias")
    for name in ("presence_penalty", "frequency_penalty"):
        if given.get(name, 0) != 0:
            raise unsupported(name)
    if given.get("parallel_tool_calls") is False:
        raise unsupported("parallel_tool_calls", "only the provider's default, true")
    options = given.get("stream_options")
    if options is not None and (
        not isinstance(options, dict) or set(options) - {"include_usage", "include_obfuscation"}
    ):
        raise WireError(400, "stream_options: only include_usage is taken", param="stream_options")


def _metadata(given: dict[str, Any], wire: str) -> dict[str, Any]:
    out: dict[str, Any] = {"gateway": {"wire": wire, "model": given.get("model")}}
    if "user" in given:
        out["user"] = given["user"]
    if "metadata" in given:
        out["metadata"] = given["metadata"]
    return out


def _message(i: int, m: Any) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise WireError(400, f"{where}: a message object is expected", param=where)
    role = _ROLES.get(m.get("role"))  # type: ignore[arg-type]
    if role is None:
        raise WireError(
            400,
            f"{where}.role: one of system, developer, user, assistant, tool "
            f"(not {str(m.get('role'))[:40]!r})",
            param=f"{where}.role",
        )
    for name in m:
        if name not in ("role", "content", "tool_calls", "tool_call_id", "refusal", "name"):
            raise WireError(400, f"{where}.{name}: not taken", param=f"{where}.{name}")
    if m.get("name") is not None:
        raise unsupported(f"{where}.name", "participant names are not passed on")
    out: dict[str, Any] = {"role": role, "content": text_of(m.get("content"), f"{where}.content")}
    if m.get("tool_calls") is not None:
        out["tool_calls"] = m["tool_calls"]
    if m.get("tool_call_id") is not None:
        out["tool_call_id"] = m["tool_call_id"]
    return out


def text_of(content: Any, where: str) -> str:
    """A message's content as one text: a string, or an array of text parts (joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise WireError(400, f"{where}: a string or an array of text parts", param=where)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("text", "input_text", "output_text") or not isinstance(
            part.get("text"), str
        ):
            raise WireError(
                400,
                f"{where}[{j}].type: only text parts are taken (not {str(kind)[:40]!r})",
                param=f"{where}[{j}].type",
            )
        texts.append(part["text"])
    return "".join(texts)


_INDEXED = re.compile(r"\.(\d+)(?=\.|$)")


def rename(field: str) -> str:
    """A job spec's field as Chat Completions names the parameter."""
    if field in ("budget_tokens", "floor_tokens"):
        return "max_completion_tokens"
    if field == "prompt":
        return "messages"
    field = field.removeprefix("params.")
    return _INDEXED.sub(r"[\1]", field)


# -- the route ------------------------------------------------------------------------------


async def chat_completions(request: Request) -> Response:
    who = common.caller(request, "openai")
    svc = service(request)
    body = await common.read_body(request)
    spec, model = spec_of(body, svc.settings)
    stream = bool(body.get("stream"))
    options = body.get("stream_options") or {}
    job_id = await common.create(request, who, spec)
    if not stream:
        patience = svc.settings.file.gateway.max_wait_s
        async for happened in common.happenings(svc, who, job_id, patience_s=patience):
            if isinstance(happened, Ended):
                return JSONResponse(completion(happened.job, model))
        raise AssertionError("happenings end with Ended or raise")  # pragma: no cover
    frames = chunks(svc, who, job_id, model, include_usage=bool(options.get("include_usage")))
    return sse.EventStream(frames)


def completion(job: dict[str, Any], model: str) -> dict[str, Any]:
    """The ``chat.completion`` of a job that ended ``done``."""
    use = common.usage(job)
    message: dict[str, Any] = {
        "role": "assistant",
        "content": job["text"] if job["text"] or not job["tool_calls"] else None,
        "refusal": job.get("refusal"),
    }
    if job["tool_calls"]:
        message["tool_calls"] = [_call(c) for c in job["tool_calls"]]
    return {
        "id": job["id"],
        "object": "chat.completion",
        "created": int(job["created_ms"]) // 1000,
        "model": model,
        "choices": [
            {"index": 0, "message": message, "finish_reason": common.finish(job), "logprobs": None}
        ],
        "usage": _usage(use),
        "resumeq": use.extension,
    }


def _call(call: dict[str, str], index: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": call["id"],
        "type": "function",
        "function": {"name": call["name"], "arguments": call["arguments"]},
    }
    if index is not None:
        out = {"index": index, **out}
    return out


def _usage(use: common.Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": use.input_tokens,
        "completion_tokens": use.output_tokens,
        "total_tokens": use.input_tokens + use.output_tokens,
        "prompt_tokens_details": {"cached_tokens": use.cached_input_tokens},
    }


async def chunks(
    svc: Service, who: Principal, job_id: str, model: str, *, include_usage: bool
) -> AsyncIterator[bytes]:
    """The streamed answer: ``chat.completion.chunk`` events from the job's checkpoints."""
    created = int(time.time())

    def chunk(delta: dict[str, Any] | None, finish: str | None = None, **more: Any) -> bytes:
        choices = [] if delta is None else [
            {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        ]  # fmt: skip
        body: dict[str, Any] = {
            "id": job_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": choices,
            **({"usage": None} if include_usage else {}),
            **more,
        }
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n".encode()

    over = False
    try:
        # The headers and the role go out now: the client knows the request was taken.
        yield common.OPENING + chunk({"role": "assistant", "content": ""})
        try:
            async for happened in common.happenings(svc, who, job_id):
                if isinstance(happened, Text):
                    yield chunk({"content": happened.text})
                elif isinstance(happened, Call):
                    yield chunk({"tool_calls": [_call(happened.call, happened.index)]})
                elif isinstance(happened, Ended):
                    yield _ending(happened.job, chunk, include_usage)
                    over = True
                    return
                else:
                    yield b": keep-alive\n\n"
        except WireError as exc:
            over = True
            yield exc.event("openai")
    finally:
        if not over and svc.settings.file.gateway.cancel_on_disconnect:
            with anyio.CancelScope(shield=True):
                await common.cancel_on_disconnect(svc, who, job_id)


def _ending(job: dict[str, Any], chunk: Any, include_usage: bool) -> bytes:
    use = common.usage(job)
    out = []
    if job.get("refusal"):
        out.append(chunk({"refusal": job["refusal"]}))
    if include_usage:
        out.append(chunk({}, common.finish(job)))
        out.append(chunk(None, usage=_usage(use), resumeq=use.extension))
    else:
        out.append(chunk({}, common.finish(job), resumeq=use.extension))
    out.append(b"data: [DONE]\n\n")
    return b"".join(out)
