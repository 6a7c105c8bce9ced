"""Cross-origin calls from browsers (CORS), for ``[server] cors_origins`` only (SPEC §21).

A page on a listed origin may call ``/v1/``: its preflight (``OPTIONS`` with
``Access-Control-Request-Method``) is answered with the methods and headers resumeq takes,
and every answer to it — errors included — carries ``Access-Control-Allow-Origin`` with
that origin. No cookies are involved (``/v1/`` takes bearer tokens and follow tokens), so no
credentials are allowed. An origin not listed gets no CORS header at all: the browser keeps
the answer from the page. ``OPTIONS`` without a preflight is answered with ``Allow``.
"""

from __future__ import annotations

from collections.abc import Iterable

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

METHODS = ("GET", "POST", "DELETE")
HEADERS = ("Authorization", "Content-Type", "Idempotency-Key", "Last-Event-ID")
#: What a page may read of an answer beyond the basic headers.
EXPOSED = ("Location", "Retry-After")
#: How long a browser may keep a preflight's answer (seconds).
MAX_AGE_S = 600
PREFIX = "/v1/"


def preflight(request: Request, methods: Iterable[str], origins: tuple[str, ...]) -> Response:
    """The answer to ``OPTIONS`` on a ``/v1/`` route: ``Allow``, and for a preflight from a
    listed origin, what it may send."""
    allowed = sorted({*methods, "OPTIONS"} - {"HEAD"})
    headers = {"Allow": ", ".join(allowed)}
    origin = request.headers.get("origin")
    asked = request.headers.get("access-control-request-method")
    if origin is not None and asked is not None and origin.lower() in origins:
        headers.update(
            {
                "Access-Control-Allow-Methods": ", ".join(m for m in METHODS if m in allowed),
                "Access-Control-Allow-Headers": ", ".join(HEADERS),
                "Access-Control-Max-Age": str(MAX_AGE_S),
            }
        )
    return Response(status_code=204, headers=headers)


class Cors:
    """Adds ``Access-Control-Allow-Origin`` (and ``Vary: Origin``) to ``/v1/`` answers for
    requests from a listed origin."""

    def __init__(self, app: ASGIApp, origins: tuple[str, ...]) -> None:
        self.app = app
        self.origins = origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.origins or not scope["path"].startswith(PREFIX):
            await self.app(scope, receive, send)
            return
        origin = next((v for k, v in scope["headers"] if k == b"origin"), None)
        if origin is None:
            await self.app(scope, receive, send)
            return
        listed = origin.decode("latin-1").lower() in self.origins

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [*message.get("headers", []), (b"vary", b"Origin")]
                if listed:
                    headers += [
                        (b"access-control-allow-origin", origin),
                        (b"access-control-expose-headers", ", ".join(EXPOSED).encode()),
                    ]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_cors)
