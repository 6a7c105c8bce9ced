"""Follow tokens: what a browser's ``EventSource`` presents, since it cannot send an
``Authorization`` header (SPEC §21).

``POST /v1/jobs/{id}/follow-token`` answers a token that opens one thing only: ``GET
/v1/jobs/{id}/events?token=...`` of that job, until it expires (``[server]
follow_token_ttl_s``, an hour by default). A web app's backend asks for one with its own
bearer token and hands it to its page. The token is stateless — ``rqf1.<job id>.<expiry,
ms>.<HMAC-SHA256>`` — signed with the secret in the environment variable ``[server]
secret_env`` names, which every ``resumeq serve`` process of a deployment shares;
``previous_secret_env`` names the one before, still accepted while tokens signed with it
live (a rotation). A token in a URL can reach a proxy's access log: that is why it opens
one job's events and nothing else, never a write, and lives an hour.

What a presented token gets: malformed or forged (its signature matches no configured
secret) → 401; another job's, whatever its age → 404, as for a job that does not exist;
expired, on its own job → 401. Expiry refuses new connections; a stream already open goes
on to the job's end.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
from dataclasses import dataclass

from resumeq.core.errors import ConfigError
from resumeq.core.names import JOB_ID_RE
from resumeq.core.settings import ServerSettings

VERSION = "rqf1"
#: A secret shorter than this is refused at start (``openssl rand -hex 32`` makes 64).
MIN_SECRET_CHARS = 32
_SHAPE = re.compile(r"^rqf1\.([A-Za-z0-9_-]{1,64})\.([0-9]{1,15})\.([A-Za-z0-9_-]{43})$")


class TokenRefused(Exception):
    """A presented follow token that opens nothing here: its status (401 or 404) and why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Issued:
    token: str
    expires_at_ms: int


class FollowTokens:
    """Signs and checks follow tokens with the configured secrets (the first signs)."""

    def __init__(self, secrets: list[bytes]) -> None:
        self._secrets = secrets

    @classmethod
    def from_settings(cls, server: ServerSettings) -> FollowTokens:
        """The secrets the configured variables hold. Raises :class:`ConfigError` naming a
        variable that is named but unset, or too short."""
        found = []
        for field, variable in (
            ("secret_env", server.secret_env),
            ("previous_secret_env", server.previous_secret_env),
        ):
            if variable is None:
                continue
            value = os.environ.get(variable, "")
            if len(value) < MIN_SECRET_CHARS:
                state = "unset or empty" if not value else f"{len(value)} characters long"
                raise ConfigError(
                    f"[server] {field} names {variable}, which is {state}: follow tokens need "
                    f"a secret of at least {MIN_SECRET_CHARS} characters that every serve "
                    "process shares (openssl rand -hex 32)"
                )
            found.append(value.encode("utf-8"))
        return cls(found)

    @property
    def configured(self) -> bool:
        return bool(self._secrets)

    def issue(self, job_id: str, *, now_ms: int, ttl_s: float) -> Issued:
        if not JOB_ID_RE.fullmatch(job_id):
            raise ValueError(f"malformed job id {job_id!r}")
        expires = now_ms + int(ttl_s * 1000)
        body = f"{VERSION}.{job_id}.{expires}"
        return Issued(f"{body}.{_sign(self._secrets[0], body)}", expires)

    def check(self, token: str, job_id: str, *, now_ms: int) -> None:
        """Raise :class:`TokenRefused` unless ``token`` opens ``job_id``'s events now."""
        shape = _SHAPE.match(token)
        if shape is None:
            raise TokenRefused(401, "token: not a follow token (rqf1.JOB.EXPIRY.SIGNATURE)")
        signed_for, expires, signature = shape.group(1), int(shape.group(2)), shape.group(3)
        body = f"{VERSION}.{signed_for}.{expires}"
        matches = [hmac.compare_digest(_sign(s, body), signature) for s in self._secrets]
        if not any(matches):  # every secret compared: no early exit to time
            raise TokenRefused(
                401, "token: not signed by this deployment (forged, or its secret was rotated out)"
            )
        if signed_for != job_id:
            raise TokenRefused(404, f"no job {job_id}")
        if now_ms >= expires:
            raise TokenRefused(401, "token: expired; ask for a new one (POST .../follow-token)")


def _sign(secret: bytes, body: str) -> str:
    digest = hmac.new(secret, body.encode("ascii"), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")
