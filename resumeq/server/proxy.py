"""Behind a reverse proxy: the scheme, host and client the proxy saw, from the proxies
``[server] forwarded_allow_ips`` names (SPEC §21).

A request from a trusted peer is taken as its ``X-Forwarded-Proto`` (the scheme: the
console's same-site check compares ``Origin`` with it, and its cookie is ``Secure`` behind
TLS), ``X-Forwarded-Host`` (the host, port included, the browser asked for) and
``X-Forwarded-For`` (the client: the rightmost address that is not a trusted proxy). From
any other peer those headers are ignored: a client cannot make itself another site.
"""

from __future__ import annotations

import ipaddress
import re

from starlette.types import ASGIApp, Receive, Scope, Send

_HOST = re.compile(rb"^[A-Za-z0-9.-]+(:[0-9]{1,5})?$|^\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?$")
_SCHEMES = {b"http": "http", b"https": "https"}

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class ForwardedHeaders:
    def __init__(self, app: ASGIApp, trusted: tuple[str, ...]) -> None:
        self.app = app
        self.any = "*" in trusted
        self.networks: list[Network] = [
            ipaddress.ip_network(t, strict=False) for t in trusted if t != "*"
        ]

    def trusts(self, address: str | None) -> bool:
        if address is None:
            return False
        if self.any:
            return True
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in network for network in self.networks)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        client = scope.get("client")
        if scope["type"] != "http" or not self.trusts(client[0] if client else None):
            await self.app(scope, receive, send)
            return
        scope = dict(scope)
        headers = list(scope["headers"])
        given = {k: v for k, v in headers}
        proto = _first(given.get(b"x-forwarded-proto"))
        if proto is not None and proto.lower() in _SCHEMES:
            scheme = _SCHEMES[proto.lower()]
            websocket = scope["type"] == "websocket"
            scope["scheme"] = (
                {"http": "ws", "https": "wss"}.get(scheme, scheme) if websocket else scheme
            )
        host = _first(given.get(b"x-forwarded-host"))
        if host is not None and _HOST.match(host):
            headers = [(k, v) for k, v in headers if k != b"host"] + [(b"host", host)]
            scope["headers"] = headers
        forwarded_for = given.get(b"x-forwarded-for")
        if forwarded_for is not None:
            hops = [h.strip().decode("latin-1") for h in forwarded_for.split(b",") if h.strip()]
            for hop in reversed(hops):
                if not self.trusts(hop) or hop == hops[0]:
                    scope["client"] = (hop, 0)
                    break
        await self.app(scope, receive, send)


def _first(value: bytes | None) -> bytes | None:
    """The first of a header's comma-separated values (the client's end of the chain)."""
    if value is None:
        return None
    first = value.split(b",")[0].strip()
    return first or None
