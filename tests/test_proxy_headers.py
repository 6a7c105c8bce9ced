"""Forwarded headers are believed from the configured proxies only (no server needed)."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request

from resumeq.server.proxy import ForwardedHeaders

FORWARDED = [
    (b"host", b"127.0.0.1:8000"),
    (b"x-forwarded-proto", b"https"),
    (b"x-forwarded-host", b"resumeq.example"),
    (b"x-forwarded-for", b"203.0.113.7, 10.0.0.5"),
]


def seen(trusted: tuple[str, ...], client: str, headers: list[tuple[bytes, bytes]]) -> Request:
    """The request the app behind the middleware sees."""
    got: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        got.append(scope)

    scope = {
        "type": "http",
        "scheme": "http",
        "path": "/",
        "headers": headers,
        "client": (client, 5000),
        "server": ("127.0.0.1", 8000),
        "query_string": b"",
    }
    asyncio.run(ForwardedHeaders(app, trusted)(scope, None, None))  # type: ignore[arg-type]
    return Request(got[0])


def test_a_trusted_proxy_gives_the_scheme_the_host_and_the_client() -> None:
    request = seen(("10.0.0.0/8",), "10.0.0.9", FORWARDED)
    assert str(request.url) == "https://resumeq.example/"
    assert request.client is not None and request.client.host == "203.0.113.7"


def test_any_other_peer_is_taken_as_it_connects() -> None:
    for trusted in ((), ("127.0.0.1",), ("10.0.0.0/8",)):
        request = seen(trusted, "198.51.100.1", FORWARDED)
        assert str(request.url) == "http://127.0.0.1:8000/"
        assert request.client is not None and request.client.host == "198.51.100.1"


def test_star_trusts_every_peer_and_a_bad_host_is_ignored() -> None:
    request = seen(("*",), "198.51.100.1", [*FORWARDED[:1], (b"x-forwarded-host", b"a b/c")])
    assert request.url.netloc == "127.0.0.1:8000"
    request = seen(("*",), "198.51.100.1", [(b"x-forwarded-proto", b"gopher")])
    assert request.url.scheme == "http"
