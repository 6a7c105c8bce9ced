"""A job's event stream (``GET /v1/jobs/ID/events``): who may follow it (a bearer token, or a
browser's follow token), where a follower resumes, and the stream itself
(:mod:`resumeq.server.sse`)."""

from __future__ import annotations

import re
import time

from starlette.requests import Request
from starlette.responses import Response

from resumeq.producer.ops import status_dict
from resumeq.server import sse
from resumeq.server.auth import Principal
from resumeq.server.follow import TokenRefused
from resumeq.server.openapi import LAST_EVENT_ID_PATTERN
from resumeq.server.problems import RETRY_AFTER_S, Problem
from resumeq.server.routes.common import DIGITS, job_id_of, job_json, principal, visible_job
from resumeq.server.service import service

_LAST_EVENT_ID_RE = re.compile(LAST_EVENT_ID_PATTERN)


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
    if not DIGITS.fullmatch(raw):
        raise Problem.field(400, "after", f"a revision (digits), not {raw[:40]!r}")
    return int(raw), "after"
