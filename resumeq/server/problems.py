"""Errors as ``application/problem+json`` (RFC 9457): a status, a title, a detail that
says what is wrong, and the bad fields named (``errors``: ``[{"field", "message"}]``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from starlette.responses import JSONResponse

PROBLEM_JSON = "application/problem+json"
#: A Redis outage: try again this soon.
RETRY_AFTER_S = "1"

_TITLES = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Content Too Large",
    415: "Unsupported Media Type",
    422: "Unprocessable Content",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
}


class Problem(Exception):
    """Raised by a handler: answered as a problem document."""

    def __init__(
        self,
        status: int,
        detail: str,
        *,
        errors: Sequence[tuple[str, str]] = (),
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.errors = tuple(errors)
        self.headers = dict(headers or {})

    @classmethod
    def field(cls, status: int, field: str, message: str) -> Problem:
        """A problem with one named field."""
        return cls(status, f"{field}: {message}", errors=[(field, message)])

    def response(self, instance: str) -> JSONResponse:
        body: dict[str, object] = {
            "type": "about:blank",
            "title": _TITLES.get(self.status, "Error"),
            "status": self.status,
            "detail": self.detail,
            "instance": instance,
        }
        if self.errors:
            body["errors"] = [{"field": f, "message": m} for f, m in self.errors]
        return JSONResponse(body, self.status, headers=self.headers, media_type=PROBLEM_JSON)
