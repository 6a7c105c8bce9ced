"""The job routes: create (with its idempotency key), read, cancel, purge, and the follow
token a browser's ``EventSource`` presents."""

from __future__ import annotations

import hashlib
import json
import re
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from resumeq.core.errors import InvalidTransition
from resumeq.core.models import JobState
from resumeq.core.spec import JobSpec, parse_spec
from resumeq.core.spec_rules import looks_like_secret, looks_like_url
from resumeq.producer import enqueue as producer
from resumeq.producer.enqueue import enqueue_job
from resumeq.server.auth import CAN_CREATE, CAN_OPERATE, Principal
from resumeq.server.openapi import IDEMPOTENCY_HEADER_KEY, IDEMPOTENCY_HEADER_PATTERN
from resumeq.server.problems import Problem
from resumeq.server.routes.common import job_id_of, principal, read_json, visible_job
from resumeq.server.service import Service, service
from resumeq.store import DEFAULT_QUEUE, check_queue

#: An ``Idempotency-Key`` as a client may send it (it is kept under its principal's name).
IDEMPOTENCY_HEADER_RE = re.compile(IDEMPOTENCY_HEADER_PATTERN)
#: A body's ``idempotency_key``: the key alone (a JSON string needs no quotes of its own).
_BODY_KEY_RE = re.compile(IDEMPOTENCY_HEADER_KEY)


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
    key = idempotency_key(request, body)
    job_id, created = await submit(svc, who, body, queue=queue, key=key)
    job = await visible_job(request, who, job_id)
    status = 201 if created else 200
    return JSONResponse(job, status, headers={"Location": job["links"]["self"]})


async def submit(
    svc: Service, who: Principal, body: dict[str, Any], *, queue: str, key: str | None
) -> tuple[str, bool]:
    """Enqueue the job spec ``body`` for ``who`` on ``queue``: its id, and whether this
    request created it (an idempotency ``key`` already used for the same request answers
    that job; for another request, a 422). :class:`~resumeq.core.errors.InvalidSpec` for a
    bad spec, nothing written."""
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
    return result.id, result.created


def _request_hash(spec: JobSpec, queue: str) -> str:
    """What a job was asked as: its spec (keys in one order) and its queue."""
    blob = json.dumps([_canonical(spec.to_json()), queue], separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def _canonical(spec_json: str) -> str:
    """A spec's JSON with its keys in one order (a body's own order is no difference)."""
    return json.dumps(json.loads(spec_json), sort_keys=True, separators=(",", ":"))


def idempotency_key(request: Request, body: dict[str, Any]) -> str | None:
    """The request's idempotency key: its ``Idempotency-Key`` header, or its body's
    ``idempotency_key`` (both: the same one), checked; None for neither."""
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
