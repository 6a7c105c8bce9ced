"""Console sessions: a person logs in with a bearer token once and gets a random session id
in an ``HttpOnly``, ``SameSite=Strict`` cookie. The session (its principal, and the CSRF
token every form carries) lives in Redis under the SHA-256 of the id, so that a copy of Redis
holds no usable cookie; it expires after :data:`TTL_S` of no use, and after
:data:`MAX_AGE_S` in any case. The console ends it too once no configured token grants its
principal any more (revoked, or its role changed)."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

import redis

from resumeq.core.settings import Role
from resumeq.server.auth import Principal
from resumeq.store import decode, keys, redis_errors

COOKIE = "resumeq_console"
#: A session unused this long is gone: the next page asks to log in again.
TTL_S = 8 * 3600
#: However much it is used (a tab left open refreshes its overview), a session lasts at
#: most this long.
MAX_AGE_S = 24 * 3600


@dataclass(frozen=True)
class Session:
    principal: Principal
    csrf: str

    def csrf_ok(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.csrf.encode())


def _key(session_id: str) -> str:
    return f"{keys.CONSOLE_SESSION}:{hashlib.sha256(session_id.encode()).hexdigest()}"


def open_session(connection: redis.Redis, principal: Principal) -> str:
    """A new session for ``principal``; answers the id to put in the cookie."""
    session_id = secrets.token_urlsafe(32)
    with redis_errors("session"), connection.pipeline(transaction=True) as pipe:
        key = _key(session_id)
        pipe.hset(
            key,
            mapping={
                "name": principal.name,
                "role": principal.role,
                "csrf": secrets.token_urlsafe(32),
                "created": str(int(time.time())),
            },
        )
        pipe.expire(key, TTL_S)
        pipe.execute()
    return session_id


def load(connection: redis.Redis, session_id: str | None) -> Session | None:
    """The session the cookie names, its lifetime renewed; None when it is unknown or
    expired."""
    if not session_id or len(session_id) > 128:
        return None
    key = _key(session_id)
    with redis_errors("session"), connection.pipeline(transaction=False) as pipe:
        pipe.hgetall(key)
        pipe.expire(key, TTL_S)
        fields, _ = pipe.execute()
    if not fields:
        return None
    f = {decode(k): decode(v) for k, v in fields.items()}
    if time.time() - int(f.get("created", "0")) > MAX_AGE_S:
        close(connection, session_id)
        return None
    role: Role = f["role"]  # type: ignore[assignment]
    return Session(Principal(f["name"], role), f["csrf"])


def close(connection: redis.Redis, session_id: str | None) -> None:
    if session_id:
        with redis_errors("session"):
            connection.delete(_key(session_id))
