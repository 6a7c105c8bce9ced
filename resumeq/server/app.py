"""The HTTP service's routes (SPEC §18): jobs, their event streams, stats and health.

Every operation is the one the CLI and :class:`~resumeq.producer.client.Client` run — the
store's scripts, :func:`~resumeq.producer.enqueue.enqueue_job`, :mod:`resumeq.producer.ops` —
called in a worker thread (they are synchronous and re-send what Redis did not answer);
event streams read Redis with ``redis.asyncio``
(:class:`~resumeq.producer.async_client.AsyncClient`). Nothing is done differently for HTTP.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, ParamSpec, TypeVar

import anyio.to_thread
import redis
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from resumeq.core import names
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
from resumeq.core.models import JobState
from resumeq.core.settings import Role, Settings, load_settings
from resumeq.core.spec import JobSpec, parse_spec
from resumeq.core.spec_rules import looks_like_secret, looks_like_url
from resumeq.producer import enqueue as producer
from resumeq.producer.async_client import AsyncClient
from resumeq.producer.enqueue import enqueue_job
from resumeq.producer.ops import (
    SpillFilter,
    drop_spilled,
    requeue_spilled,
    spill_export_lines,
    spill_page,
    stats,
    status_dict,
    unserved,
)
from resumeq.server import sse
from resumeq.server.auth import (
    CAN_CREATE,
    CAN_OPERATE,
    CAN_READ_ALL,
    Principal,
    Tokens,
    is_loopback,
)
from resumeq.server.console import Console
from resumeq.server.cors import Cors, preflight
from resumeq.server.follow import FollowTokens, TokenRefused
from resumeq.server.openapi import (
    IDEMPOTENCY_HEADER_KEY,
    IDEMPOTENCY_HEADER_PATTERN,
    LAST_EVENT_ID_PATTERN,
    SPILL_CURSOR_PATTERN,
    SPILL_PAGE_MAX,
    document,
)
from resumeq.server.problems import Problem
from resumeq.server.proxy import ForwardedHeaders
from resumeq.store import (
    DEFAULT_QUEUE,
    SPILL_QUEUE,
    Store,
    audit,
    check_queue,
    metrics,
    redis_errors,
)
from resumeq.store.capabilities import refused, warning
from resumeq.store.connection import connect

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

_DIGITS = re.compile(r"[0-9]{1,18}")
#: An ``Idempotency-Key`` as a client may send it (it is kept under its principal's name).
IDEMPOTENCY_HEADER_RE = re.compile(IDEMPOTENCY_HEADER_PATTERN)
#: A body's ``idempotency_key``: the key alone (a JSON string needs no quotes of its own).
_BODY_KEY_RE = re.compile(IDEMPOTENCY_HEADER_KEY)
_LAST_EVENT_ID_RE = re.compile(LAST_EVENT_ID_PATTERN)
_SPILL_CURSOR_RE = re.compile(SPILL_CURSOR_PATTERN)
#: How long the service waits for Redis on one command (its event reads block for 1 s).
REDIS_TIMEOUT_S = 5.0
#: How long ``/healthz`` waits for Redis's answer, once: within the probe timeouts of a load
#: balancer or an orchestrator (Kubernetes' default is 1 s), not a request's ten.
HEALTH_TIMEOUT_S = 0.8
#: A Redis outage: try again this soon.
RETRY_AFTER_S = "1"


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


def principal(request: Request, allowed: frozenset[Role] | None = None) -> Principal:
    """The caller: 401 without a valid token, 403 when its role may not do this."""
    who = service(request).tokens.principal(request.headers.get("authorization"))
    if who is None:
        raise Problem(
            401,
            "a valid bearer token is required (Authorization: Bearer TOKEN)",
            headers={"WWW-Authenticate": 'Bearer realm="resumeq"'},
        )
    if allowed is not None and who.role not in allowed:
        raise Problem(403, f"the {who.role} role may not do this")
    return who


def job_id_of(request: Request) -> str:
    raw = str(request.path_params["job_id"])
    try:
        return names.check_job_id(raw)
    except ValueError:
        raise Problem.field(404, "id", f"malformed job id {raw[:80]!r}") from None


async def visible_job(request: Request, who: Principal, job_id: str) -> dict[str, Any]:
    """The job's ``status --json`` object, if ``who`` may see it (else 404, as for a job
    that does not exist: a producer learns nothing of others' jobs)."""
    job = await service(request).run(status_dict, service(request).store, job_id)
    if not who.sees(job.get("owner")):
        raise Problem(404, f"no job {job_id}")
    return job_json(job)


def job_json(job: dict[str, Any]) -> dict[str, Any]:
    base = f"/v1/jobs/{job['id']}"
    return {
        **job,
        "links": {"self": base, "events": f"{base}/events", "cancel": f"{base}/cancel"},
    }


async def read_json(request: Request, *, empty: Any = None) -> Any:
    """The request body as JSON: 415 for another media type, 413 past the configured
    size (counted as it arrives, whatever Content-Length says), 400 if it does not parse."""
    media = request.headers.get("content-type", "application/json").split(";")[0].strip()
    if media.lower() not in ("application/json", "application/problem+json", ""):
        raise Problem.field(415, "Content-Type", f"expected application/json, not {media}")
    limit = service(request).server.max_body_bytes
    declared = request.headers.get("content-length", "")
    if _DIGITS.fullmatch(declared) and int(declared) > limit:
        raise Problem(413, f"the body is over {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise Problem(413, f"the body is over {limit} bytes")
        chunks.append(chunk)
    raw = b"".join(chunks)
    if empty is not None and not raw.strip():
        return empty  # an optional body, not sent
    try:
        return json.loads(raw, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Problem.field(400, "body", f"not valid JSON ({exc})") from None
    except RecursionError:
        raise Problem.field(400, "body", "nested too deeply") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# -- jobs -------------------------------------------------------------------------------


async def create_job(request: Request) -> Response:
    who = principal(request, CAN_CREATE)
    svc = service(request)
    body = await read_json(request)
    if not isinstance(body, dict):
        raise Problem.field(422, "body", "a JSON object (a job spec) is expected")
    allowed = svc.settings.file.worker.queues
    queue = request.query_params.get("queue", allowed[0] if allowed else DEFAULT_QUEUE)
    try:
        check_queue(queue)
    except ValueError:
        raise Problem.field(422, "queue", f"malformed queue name {queue[:80]!r}") from None
    if queue not in allowed:
        names = ", ".join(allowed)
        raise Problem.field(
            422, "queue", f"not a queue of this deployment ([worker] queues: {names})"
        )
    key = _idempotency_key(request, body)
    if key is not None:
        # Kept under the caller's name: one producer's key never answers another's job.
        body = {**body, "idempotency_key": f"{who.name}:{key}"}
    spec = parse_spec(body, limits=svc.settings.file.limits)  # InvalidSpec: 422
    if spec.provider not in svc.settings.file.providers:
        known = ", ".join(sorted(svc.settings.file.providers)) or "none configured"
        raise Problem.field(422, "provider", f"unknown provider {spec.provider!r} (known: {known})")
    asked = _request_hash(spec, queue)
    result = await svc.run(
        enqueue_job,
        svc.store,
        svc.store.redis,
        spec,
        queue=queue,
        owner=who.name,
        request_hash=asked,
    )
    if not result.created:
        earlier = await svc.run(svc.store.get, result.id)
        # The request that created it, whatever became of the job since (an operator may
        # have requeued it to another provider); a job from before the hash: its spec.
        same = (
            earlier.request_hash == asked
            if earlier.request_hash
            else _canonical(earlier.spec.to_json()) == _canonical(spec.to_json())
        )
        if not same:
            raise Problem.field(
                422,
                "Idempotency-Key",
                f"{key!r} was used for job {result.id} with another body",
            )
    job = await visible_job(request, who, result.id)
    status = 201 if result.created else 200
    return JSONResponse(job, status, headers={"Location": job["links"]["self"]})


def _request_hash(spec: JobSpec, queue: str) -> str:
    """What a job was asked as: its spec (keys in one order) and its queue."""
    blob = json.dumps([_canonical(spec.to_json()), queue], separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def _canonical(spec_json: str) -> str:
    """A spec's JSON with its keys in one order (a body's own order is no difference)."""
    return json.dumps(json.loads(spec_json), sort_keys=True, separators=(",", ":"))


def _idempotency_key(request: Request, body: dict[str, Any]) -> str | None:
    header = request.headers.get("idempotency-key")
    in_body = body.get("idempotency_key")
    if header is not None:
        if not IDEMPOTENCY_HEADER_RE.fullmatch(header):
            raise Problem.field(400, "Idempotency-Key", _KEY_CHARS)
        header = header.removeprefix('"').removesuffix('"')  # the draft's quoted string
        _check_key(400, "Idempotency-Key", header)
        if in_body is not None and in_body != header:
            raise Problem.field(422, "idempotency_key", "differs from the Idempotency-Key header")
        return header
    if in_body is None:
        return None
    if not isinstance(in_body, str) or not _BODY_KEY_RE.fullmatch(in_body):
        raise Problem.field(422, "idempotency_key", _KEY_CHARS)
    _check_key(422, "idempotency_key", in_body)
    return in_body


_KEY_CHARS = "1 to 128 of A-Z a-z 0-9 _ . : @ / + = - (a header's may be quoted)"


def _check_key(status: int, field: str, key: str) -> None:
    """A key is opaque: never a URL or a credential (as a spec's is, before it is kept
    under the caller's name)."""
    if looks_like_url(key):
        raise Problem.field(status, field, "must be an opaque key, not a URL")
    if looks_like_secret(key):
        raise Problem.field(status, field, "looks like a credential, which a job never carries")


async def get_job(request: Request) -> Response:
    who = principal(request)
    return JSONResponse(await visible_job(request, who, job_id_of(request)))


async def job_events(request: Request) -> Response:
    svc = service(request)
    job_id = job_id_of(request)
    token = request.query_params.get("token")
    if token is not None:  # a browser's EventSource, with a follow token
        who = _follower(request, token, job_id)
        job = job_json(await svc.run(status_dict, svc.store, job_id))
        # Counted against the job's owner: a token handed out opens no more streams than
        # its owner may hold.
        counted = str(job.get("owner") or who.name)
        limited = True
    else:
        who = principal(request)
        job = await visible_job(request, who, job_id)
        counted, limited = who.name, who.role == "producer"  # operators, viewers: not counted
    after, named = _after(request)
    if after > job["revision"]:
        # A well-formed revision this job has not reached: the request is fine, the job's
        # state does not allow it (as a Range past a file's end).
        raise Problem.field(
            409, named, f"revision {after} is beyond the job's last ({job['revision']})"
        )
    record = await svc.run(svc.store.get, job_id)
    assert svc.hub is not None
    try:
        return svc.hub.stream(
            record,
            after=after,
            keepalive_s=svc.server.keepalive_s,
            principal=counted,
            max_jobs=svc.server.max_followed_jobs,
            max_streams=svc.server.max_streams_per_producer if limited else 0,
        )
    except sse.Full as full:
        raise Problem(full.status, full.message, headers={"Retry-After": RETRY_AFTER_S}) from None


def _follower(request: Request, token: str, job_id: str) -> Principal:
    """Who a follow token lets follow ``job_id`` (:mod:`resumeq.server.follow`); 401 for
    a malformed, forged or expired one, 404 for another job's."""
    follow = service(request).follow
    if not follow.configured:
        raise Problem.field(401, "token", "follow tokens are not configured ([server] secret_env)")
    try:
        follow.check(token, job_id, now_ms=int(time.time() * 1000))
    except TokenRefused as refused:
        if refused.status == 404:
            raise Problem(404, refused.message) from None
        raise Problem(
            401,
            refused.message,
            errors=[("token", refused.message.removeprefix("token: "))],
            headers={"WWW-Authenticate": 'Bearer realm="resumeq", error="invalid_token"'},
        ) from None
    return Principal(f"follow-token:{job_id}", "viewer")


async def follow_token(request: Request) -> Response:
    """A follow token for the job (its producer, a viewer or an operator asks): what a
    browser's ``EventSource`` presents as ``?token=``."""
    who = principal(request)
    svc = service(request)
    job_id = job_id_of(request)
    await visible_job(request, who, job_id)
    if not svc.follow.configured:
        raise Problem(
            501,
            "follow tokens are not configured: set [server] secret_env to the name of an "
            "environment variable holding a secret every serve process shares",
        )
    body = await read_json(request, empty={})
    if not isinstance(body, dict) or set(body) - {"ttl_s"}:
        raise Problem.field(422, "body", 'a JSON object ({"ttl_s"?}) is expected')
    longest = svc.server.follow_token_ttl_s
    ttl_s = body.get("ttl_s", longest)
    if isinstance(ttl_s, bool) or not isinstance(ttl_s, int | float) or not 0 < ttl_s <= longest:
        raise Problem.field(
            422,
            "ttl_s",
            f"seconds, more than 0 and at most {longest:g} ([server] follow_token_ttl_s)",
        )
    issued = svc.follow.issue(job_id, now_ms=int(time.time() * 1000), ttl_s=float(ttl_s))
    return JSONResponse(
        {
            "token": issued.token,
            "expires_at": issued.expires_at_ms,
            "events": f"/v1/jobs/{job_id}/events?token={issued.token}",
        },
        headers={"Cache-Control": "no-store"},
    )


def _after(request: Request) -> tuple[int, str]:
    """Where a follower resumes, and what said so: ``Last-Event-ID`` (what a reconnecting
    EventSource sends; empty, as the SSE standard's reset of the last event id, is none),
    else ``?after=``, else from the start."""
    last = request.headers.get("last-event-id")
    if last is not None and not _LAST_EVENT_ID_RE.fullmatch(last):
        raise Problem.field(
            400, "Last-Event-ID", f"a revision (digits), or empty, not {last[:40]!r}"
        )
    if last:
        return int(last), "Last-Event-ID"
    raw = request.query_params.get("after")
    if raw is None:
        return 0, "after"
    if not _DIGITS.fullmatch(raw):
        raise Problem.field(400, "after", f"a revision (digits), not {raw[:40]!r}")
    return int(raw), "after"


async def cancel_job(request: Request) -> Response:
    who = principal(request, CAN_CREATE)
    svc = service(request)
    job_id = job_id_of(request)
    await visible_job(request, who, job_id)
    try:
        await svc.run(
            producer.cancel_job, svc.store, job_id, reason=f"cancelled by {who.name} over HTTP"
        )
        already_ended = False
    except InvalidTransition as exc:
        if not JobState(exc.state).terminal:
            raise
        # As ``resumeq cancel`` answers: the job as it ended, and that nothing was done.
        already_ended = True
    else:
        await svc.run(svc.audit, who, "cancel", job_id)
    return JSONResponse({**await visible_job(request, who, job_id), "already_ended": already_ended})


async def job_resource(request: Request) -> Response:
    return await (delete_job if request.method == "DELETE" else get_job)(request)


async def delete_job(request: Request) -> Response:
    who = principal(request, CAN_OPERATE)
    svc = service(request)
    job_id = job_id_of(request)
    await svc.run(svc.store.get, job_id)  # 404 for an unknown job
    await svc.run(producer.purge_job, svc.store, job_id)
    await svc.run(svc.audit, who, "purge", job_id)
    return Response(status_code=204)


# -- the spill lane -------------------------------------------------------------------------


async def spill_list(request: Request) -> Response:
    principal(request, CAN_READ_ALL)
    svc = service(request)
    where = _spill_filter(request)
    limit = _int_param(request, "limit", default=50, low=1, high=SPILL_PAGE_MAX)
    after = _cursor(request.query_params.get("cursor"))
    items, position = await svc.run(spill_page, svc.store, where, limit=limit, after=after)
    next_cursor = f"{position[0]}.{position[1]}" if position is not None else None
    return JSONResponse({"items": items, "next_cursor": next_cursor})


def _spill_filter(request: Request) -> SpillFilter:
    params = request.query_params
    return SpillFilter(
        reason=params.get("reason") or None,
        provider=params.get("provider") or None,
        queue=params.get("queue") or None,
    )


def _int_param(request: Request, name: str, *, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not _DIGITS.fullmatch(raw) or not low <= int(raw) <= high:
        raise Problem.field(400, name, f"an integer from {low} to {high}, not {raw[:40]!r}")
    return int(raw)


def _cursor(raw: str | None) -> tuple[int, str] | None:
    """A page's position, as the previous page answered it (``<spilled ms>.<job id>``)."""
    if raw is None or raw == "":
        return None
    if not _SPILL_CURSOR_RE.fullmatch(raw):
        raise Problem.field(400, "cursor", "not a cursor a page of this list answered")
    at, _, job_id = raw.partition(".")
    return int(at), job_id


async def spill_requeue(request: Request) -> Response:
    who = principal(request, CAN_OPERATE)
    svc = service(request)
    job_id = job_id_of(request)
    body = await read_json(request, empty={})
    if not isinstance(body, dict):
        raise Problem.field(422, "body", 'a JSON object ({"to"?, "provider"?}) is expected')
    unknown = sorted(set(body) - {"to", "provider"})
    if unknown:
        raise Problem.field(422, unknown[0], "not a field of a requeue (to, provider)")
    to, provider = body.get("to"), body.get("provider")
    if to is not None:
        if not isinstance(to, str) or to == SPILL_QUEUE:
            raise Problem.field(422, "to", "a queue name other than the spill lane")
        try:
            check_queue(to)
        except ValueError:
            raise Problem.field(422, "to", f"malformed queue name {to[:80]!r}") from None
    if provider is not None and (
        not isinstance(provider, str) or provider not in svc.settings.file.providers
    ):
        known = ", ".join(sorted(svc.settings.file.providers)) or "none configured"
        raise Problem.field(422, "provider", f"unknown provider {provider!r} (known: {known})")
    queue = await svc.run(requeue_spilled, svc.store, job_id, queue=to, provider=provider)
    # The job as the requeue left it, read first: a worker may take it at once.
    job = await visible_job(request, who, job_id)
    detail = " ".join(f"{k}={v}" for k, v in (("to", to), ("provider", provider)) if v)
    await svc.run(svc.audit, who, "requeue", job_id, detail)
    return JSONResponse({**job, "warnings": await svc.run(unserved, svc.store, [queue])})


async def spill_drop(request: Request) -> Response:
    who = principal(request, CAN_OPERATE)
    svc = service(request)
    job_id = job_id_of(request)
    await svc.run(drop_spilled, svc.store, job_id, reason=f"dropped by {who.name} over HTTP")
    await svc.run(svc.audit, who, "drop", job_id)
    return JSONResponse(await visible_job(request, who, job_id))


async def spill_export(request: Request) -> Response:
    principal(request, CAN_OPERATE)
    svc = service(request)
    where = _spill_filter(request)
    # A plain iterator: Starlette reads it in a worker thread, a line at a time.
    lines = spill_export_lines(svc.store, where)
    return StreamingResponse(lines, media_type="application/x-ndjson")


# -- the service ----------------------------------------------------------------------------


async def get_stats(request: Request) -> Response:
    principal(request, CAN_READ_ALL)
    svc = service(request)
    return JSONResponse(await svc.run(stats, svc.store))


async def get_metrics(request: Request) -> Response:
    svc = service(request)
    if not svc.server.public_metrics:
        principal(request, CAN_READ_ALL)
    # The providers with totals in Redis, whatever this process's config names.
    text = await svc.run(metrics.render, svc.store)
    hub = svc.hub
    text += (
        "# HELP resumeq_server_followers Event streams open on this server process.\n"
        "# TYPE resumeq_server_followers gauge\n"
        f"resumeq_server_followers {hub.followers if hub else 0}\n"
        "# HELP resumeq_server_feeds Jobs whose events this server process reads (one "
        "feed each, whatever the followers).\n"
        "# TYPE resumeq_server_feeds gauge\n"
        f"resumeq_server_feeds {len(hub.feeds) if hub else 0}\n"
        "# HELP resumeq_server_readers Blocking reads of Redis this server process runs "
        f"for its feeds (one for up to {sse.READER_JOBS} jobs).\n"
        "# TYPE resumeq_server_readers gauge\n"
        f"resumeq_server_readers {hub.reading if hub else 0}\n"
    )
    return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")


async def openapi(request: Request) -> Response:
    principal(request)  # every role: a producer's developer reads the API with its token
    return JSONResponse(service(request).openapi)


async def healthz(request: Request) -> Response:
    svc = service(request)
    if not svc.server.public_metrics:
        principal(request, CAN_READ_ALL)
    await svc.run(svc.ping)
    return JSONResponse({"status": "ok", "redis": "reachable"})


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
