"""Errors in each wire's own shape (SPEC §24): what an official SDK raises as its own error
class, with the bad parameter named.

OpenAI's body is ``{"error": {"message", "type", "param", "code"}}``; Anthropic's
``{"type": "error", "error": {"type", "message"}}`` (its message names the field, as
Anthropic's own do: ``max_tokens: Field required``). The same errors end a stream: an
``error`` data line on Chat Completions, ``event: error`` on Messages.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any, Literal

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse

from resumeq.core.errors import (
    IdempotencyConflict,
    InvalidSpec,
    JobNotFound,
    RedisUnavailable,
    ResumeqError,
)
from resumeq.server.problems import RETRY_AFTER_S, Problem
from resumeq.server.sse import Full

log = logging.getLogger(__name__)

Wire = Literal["openai", "anthropic"]

#: OpenAI's error ``type`` by status.
_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_error",
    404: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}
#: Anthropic's error ``type`` by status.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "request_too_large",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


class WireError(Exception):
    """An error answered in the wire's shape: its status, what is wrong, the parameter
    at fault (``param``, a dotted path as OpenAI names it) and a machine ``code``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self, wire: Wire) -> dict[str, Any]:
        if wire == "anthropic":
            kind = _ANTHROPIC_TYPES.get(self.status, "api_error")
            text = self.message
            if self.param and not text.startswith(f"{self.param}:"):
                text = f"{self.param}: {text}"
            return {"type": "error", "error": {"type": kind, "message": text}}
        kind = _OPENAI_TYPES.get(self.status, "server_error")
        error = {"message": self.message, "type": kind, "param": self.param, "code": self.code}
        return {"error": error}

    def response(self, wire: Wire) -> JSONResponse:
        return JSONResponse(self.body(wire), self.status, headers=self.headers)

    def event(self, wire: Wire) -> bytes:
        """The error as the stream's last event."""
        data = json.dumps(self.body(wire), ensure_ascii=False)
        head = "event: error\n" if wire == "anthropic" else ""
        return f"{head}data: {data}\n\n".encode()


def unsupported(param: str, why: str = "") -> WireError:
    """A parameter resumeq cannot honour: a 400 naming it, never silently dropped."""
    more = f" ({why})" if why else ""
    return WireError(
        400,
        f"{param}: resumeq cannot honour this parameter{more}",
        param=param,
        code="unsupported_parameter",
    )


def as_wire_error(exc: Exception, rename: Callable[[str], str] = str) -> WireError:
    """``exc`` as the wire's error: a problem the shared routes raise, a resumeq error, a
    routing error. ``rename`` maps a job spec's field to the wire's parameter."""
    if isinstance(exc, WireError):
        return exc
    if isinstance(exc, Problem):
        field = exc.errors[0][0] if exc.errors else None
        # A bad body is a 400 on these wires, as the providers answer it.
        status = 400 if exc.status == 422 else exc.status
        return WireError(status, exc.detail, param=field, headers=exc.headers)
    if isinstance(exc, InvalidSpec):
        return _invalid(exc, rename)
    return _other(exc)


def _invalid(exc: InvalidSpec, rename: Callable[[str], str]) -> WireError:
    first = exc.errors[0] if exc.errors else None
    if first is None:
        return WireError(400, str(exc))
    param = rename(first.field)
    others = "; ".join(f"{rename(e.field)}: {e.message}" for e in exc.errors[1:])
    message = f"{param}: {first.message}" + (f" (also {others})" if others else "")
    return WireError(400, message, param=param, code="invalid_value")


def _other(exc: Exception) -> WireError:
    retry = {"Retry-After": RETRY_AFTER_S}
    if isinstance(exc, JobNotFound):
        error = WireError(404, f"no response {exc.job_id}", code="not_found")
    elif isinstance(exc, IdempotencyConflict):
        error = WireError(422, str(exc), param="Idempotency-Key", code="idempotency_conflict")
    elif isinstance(exc, RedisUnavailable):
        error = WireError(503, "Redis is unreachable", headers=retry)
    elif isinstance(exc, Full):
        error = WireError(exc.status, exc.message, headers=retry)
    elif isinstance(exc, HTTPException):
        error = WireError(exc.status_code, str(exc.detail), headers=exc.headers)
    else:
        if not isinstance(exc, ResumeqError):
            log.exception("gateway request failed", exc_info=exc)
        error = WireError(500, f"{type(exc).__name__}: the server failed; its log says more")
    return error
