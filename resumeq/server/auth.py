"""Who is asking: bearer tokens, configured by their SHA-256 (``[server] tokens``), each
with a role. ``producer`` creates jobs and reads, follows and cancels the jobs it created;
``viewer`` reads everything and changes nothing; ``operator`` does everything.

A presented token is hashed and compared with every configured hash in constant time (no
early exit: how long a check takes says nothing about which token came close). With no
token configured the service answers on a loopback address only, and every caller is the
local operator."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from dataclasses import dataclass

from resumeq.core.settings import Role, ServerToken

#: Who may do what (SPEC §18).
CAN_CREATE: frozenset[Role] = frozenset({"producer", "operator"})
CAN_READ_ALL: frozenset[Role] = frozenset({"operator", "viewer"})
CAN_OPERATE: frozenset[Role] = frozenset({"operator"})


@dataclass(frozen=True)
class Principal:
    name: str
    role: Role

    def sees(self, owner: str | None) -> bool:
        """Whether this principal may see a job created by ``owner``."""
        return self.role in CAN_READ_ALL or (owner is not None and owner == self.name)


#: Every caller, when no token is configured (loopback only).
LOCAL = Principal("local", "operator")


class Tokens:
    def __init__(self, tokens: tuple[ServerToken, ...]) -> None:
        self._entries = [(bytes.fromhex(t.sha256), Principal(t.principal, t.role)) for t in tokens]

    @property
    def open(self) -> bool:
        """No token configured: every caller is :data:`LOCAL`."""
        return not self._entries

    def grants(self, principal: Principal) -> bool:
        """Whether a configured token still names ``principal`` with its role (a console
        session ends when its token is revoked or its role changes)."""
        if self.open:
            return principal == LOCAL
        return any(known == principal for _, known in self._entries)

    def principal(self, authorization: str | None) -> Principal | None:
        """The principal an ``Authorization: Bearer …`` header names, or None."""
        if self.open:
            return LOCAL
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        digest = hashlib.sha256(token.strip().encode("utf-8")).digest()
        found = None
        for expected, principal in self._entries:
            if hmac.compare_digest(expected, digest):
                found = principal
        return found


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def new_token(role: Role, name: str | None = None) -> tuple[str, str]:
    """A fresh token and the line to paste into ``[server] tokens``."""
    token = "rq_" + secrets.token_urlsafe(32)
    digest = hashlib.sha256(token.encode("utf-8")).hexdigest()
    entry = f'sha256 = "{digest}", role = "{role}"'
    if name:
        entry += f', name = "{name}"'
    return token, "{ " + entry + " }"
