"""The HTTP service's app (SPEC §18): its routes at their paths (:mod:`resumeq.server.routes`,
the console's), the middleware, errors as problem documents, what is opened and closed with
it, and the checks before serving.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio.to_thread
import redis
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from resumeq.core.errors import (
    ConfigError,
    IdempotencyConflict,
    InvalidSpec,
    InvalidTransition,
    JobNotFound,
    RedisUnavailable,
    ResumeqError,
    WriteRefused,
)
from resumeq.core.settings import Settings, load_settings
from resumeq.producer.async_client import AsyncClient
from resumeq.server import gateway, sse
from resumeq.server.auth import is_loopback
from resumeq.server.console import Console
from resumeq.server.cors import Cors, preflight
from resumeq.server.problems import RETRY_AFTER_S, Problem
from resumeq.server.proxy import ForwardedHeaders
from resumeq.server.routes.events import job_events
from resumeq.server.routes.jobs import cancel_job, create_job, follow_token, job_resource
from resumeq.server.routes.spill import spill_drop, spill_export, spill_list, spill_requeue
from resumeq.server.routes.status import get_metrics, get_stats, healthz, openapi
from resumeq.server.service import REDIS_TIMEOUT_S, Service
from resumeq.store.capabilities import refused, warning

log = logging.getLogger(__name__)


# -- errors -------------------------------------------------------------------------------


def _problem(request: Request, exc: Exception) -> Response:
    if isinstance(exc, Problem):
        return exc.response(request.url.path)
    if isinstance(exc, HTTPException):  # routing's 404 and 405 (with its Allow)
        problem = Problem(exc.status_code, str(exc.detail), headers=exc.headers)
        return problem.response(request.url.path)
    return _from_resumeq(exc).response(request.url.path)


def _from_resumeq(exc: Exception) -> Problem:
    if isinstance(exc, InvalidSpec):
        return Problem(422, str(exc), errors=[(e.field, e.message) for e in exc.errors])
    if isinstance(exc, JobNotFound):
        return Problem(404, f"no job {exc.job_id}" if exc.job_id else str(exc))
    if isinstance(exc, IdempotencyConflict):
        return Problem.field(422, "Idempotency-Key", str(exc))
    if isinstance(exc, InvalidTransition | WriteRefused):
        return Problem(409, str(exc))
    if isinstance(exc, RedisUnavailable):
        # Not its address: /healthz may be public.
        return Problem(503, "Redis is unreachable", headers={"Retry-After": RETRY_AFTER_S})
    log.exception("request failed", exc_info=exc)
    return Problem(500, f"{type(exc).__name__}: the server failed; its log says more")


async def _handle(request: Request, exc: Exception) -> Response:
    return _problem(request, exc)


# -- the app --------------------------------------------------------------------------------


def create_app(settings: Settings) -> Starlette:
    """The ASGI app for ``settings``."""
    svc = Service(settings)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        svc.client = AsyncClient.from_url(
            settings.redis_url,
            # Each reader of followed jobs holds one (its blocking read); each request in
            # flight one for a moment: a burst of followers connecting at once needs many.
            max_connections=settings.file.server.max_followed_jobs + 64,
            # Above the event reads' one-second blocks.
            socket_timeout=REDIS_TIMEOUT_S,
            socket_connect_timeout=REDIS_TIMEOUT_S,
            settings=settings.file.store,
            limits=settings.file.limits,
        )
        svc.hub = sse.Hub(svc.client, await anyio.to_thread.run_sync(unblocking, settings))
        try:
            yield
        finally:
            await svc.hub.close()
            await svc.client.aclose()
            svc.close()

    api = [
        ("/v1/jobs", create_job, ["POST"]),
        # One route for both methods: a 405 then names both in its Allow.
        ("/v1/jobs/{job_id}", job_resource, ["GET", "DELETE"]),
        ("/v1/jobs/{job_id}/events", job_events, ["GET"]),
        ("/v1/jobs/{job_id}/follow-token", follow_token, ["POST"]),
        ("/v1/jobs/{job_id}/cancel", cancel_job, ["POST"]),
        ("/v1/spill", spill_list, ["GET"]),
        ("/v1/spill/export", spill_export, ["GET"]),
        ("/v1/spill/{job_id}/requeue", spill_requeue, ["POST"]),
        ("/v1/spill/{job_id}/drop", spill_drop, ["POST"]),
        ("/v1/stats", get_stats, ["GET"]),
        *gateway.ROUTES,
    ]
    origins = settings.file.server.cors_origins
    routes = [
        *(
            Route(path, _answers_options(endpoint, methods, origins), methods=[*methods, "OPTIONS"])
            for path, endpoint, methods in api
        ),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/metrics", get_metrics, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
        *Console(svc).routes(),
    ]
    handlers: dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
        Problem: _handle,
        HTTPException: _handle,
        ResumeqError: _handle,
        Exception: _handle,
    }
    middleware = [
        Middleware(ForwardedHeaders, trusted=settings.file.server.forwarded_allow_ips),
        Middleware(Cors, origins=origins),
    ]
    app = Starlette(
        routes=routes, exception_handlers=handlers, lifespan=lifespan, middleware=middleware
    )
    app.state.service = svc
    return app


def _answers_options(
    endpoint: Callable[[Request], Awaitable[Response]],
    methods: list[str],
    origins: tuple[str, ...],
) -> Callable[[Request], Awaitable[Response]]:
    """``endpoint``, with ``OPTIONS`` answered (a CORS preflight among them)."""

    async def route(request: Request) -> Response:
        if request.method == "OPTIONS":
            return preflight(request, methods, origins)
        return await endpoint(request)

    route.__name__ = getattr(endpoint, "__name__", "route")
    return route


def unblocking(settings: Settings) -> sse.Unblocking:
    """Whether Redis lets the event readers cut a blocking read short (asked once at
    start, said once at WARNING if not; a Redis that cannot be reached now is asked by the
    first read)."""
    try:
        refusals = refused(settings.redis_url, ["id", "unblock"])
    except redis.RedisError:
        return sse.Unblocking()
    if refusals:
        log.warning(warning("serve", refusals, sse.POLLING))
    return sse.Unblocking(not refusals)


def app_from_env() -> Starlette:
    """The app for ``RESUMEQ_REDIS_URL`` and ``RESUMEQ_CONFIG`` (uvicorn's factory)."""
    try:
        return create_app(load_settings())
    except ConfigError as exc:
        raise SystemExit(f"resumeq serve: {exc}") from None


def check_exposure(settings: Settings, host: str) -> None:
    """Refuse to serve on a non-loopback address with no token configured, or behind a
    proxy with none (everyone the proxy lets through would be an operator)."""
    server = settings.file.server
    if server.tokens:
        return
    if not is_loopback(host):
        raise ConfigError(
            f"refusing to serve on {host} with no [server] tokens: anyone who can reach it "
            "could read every job (add tokens with `resumeq token new`, or bind to 127.0.0.1)"
        )
    if server.forwarded_allow_ips:
        raise ConfigError(
            "refusing to serve behind a proxy ([server] forwarded_allow_ips) with no [server] "
            "tokens: everyone the proxy lets through would be an operator (add tokens with "
            "`resumeq token new`)"
        )
