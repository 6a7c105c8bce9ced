"""What every route shares (:class:`Service`): the settings, the tokens, a synchronous store
for the operations, an asyncio client for the event streams, and Redis's timeouts."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import anyio.to_thread
from starlette.requests import Request

from resumeq.core.settings import Settings
from resumeq.producer.async_client import AsyncClient
from resumeq.server import sse
from resumeq.server.auth import Principal, Tokens
from resumeq.server.follow import FollowTokens
from resumeq.server.openapi import document
from resumeq.store import Store, audit, redis_errors
from resumeq.store.connection import connect

P = ParamSpec("P")
R = TypeVar("R")

#: How long the service waits for Redis on one command (its event reads block for 1 s).
REDIS_TIMEOUT_S = 5.0
#: How long ``/healthz`` waits for Redis's answer, once: within the probe timeouts of a load
#: balancer or an orchestrator (Kubernetes' default is 1 s), not a request's ten.
HEALTH_TIMEOUT_S = 0.8
#: A Redis outage: try again this soon.


class Service:
    """What the routes share: the settings, the tokens, a synchronous store for the
    operations, and an asyncio client for the event streams (opened with the app)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.server = settings.file.server
        self.tokens = Tokens(self.server.tokens)
        self.follow = FollowTokens.from_settings(self.server)  # ConfigError: a secret unset
        # A stalled Redis is an error within seconds, never a request held forever.
        connection = connect(
            settings.redis_url,
            socket_timeout=REDIS_TIMEOUT_S,
            socket_connect_timeout=REDIS_TIMEOUT_S,
        )
        self.store = Store(connection, settings=settings.file.store, limits=settings.file.limits)
        # Its own connection: a probe neither waits for a pool the requests hold nor holds
        # one of theirs.
        self._health = connect(
            settings.redis_url,
            pool_size=1,
            pool_timeout_s=HEALTH_TIMEOUT_S,
            socket_timeout=HEALTH_TIMEOUT_S,
            socket_connect_timeout=HEALTH_TIMEOUT_S,
        )
        self.client: AsyncClient | None = None
        self.hub: sse.Hub | None = None
        self.openapi = document(settings)

    async def run(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """A synchronous operation, in a worker thread."""
        return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))

    def audit(self, who: Principal, action: str, job_id: str, detail: str = "") -> None:
        """An operator action over the API, in the audit log (a producer cancelling its own
        job too: it changes what a job does)."""
        audit.record(
            self.store.redis,
            who=who.name,
            role=who.role,
            action=action,
            jobs=[job_id],
            detail=detail,
            via="api",
        )

    def ping(self) -> None:
        """Redis answers within :data:`HEALTH_TIMEOUT_S`, asked once, or
        :class:`~resumeq.core.errors.RedisUnavailable`."""
        with redis_errors("ping"):
            self._health.ping()

    def close(self) -> None:
        self.store.redis.close()
        self._health.close()


def service(request: Request) -> Service:
    svc: Service = request.app.state.service
    return svc
