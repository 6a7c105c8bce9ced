"""The spill lane's routes: a page of its jobs (filtered, with a cursor), their export as
NDJSON, and an operator's requeue or drop of one job."""

from __future__ import annotations

import re

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from resumeq.producer.ops import (
    SpillFilter,
    drop_spilled,
    requeue_spilled,
    spill_export_lines,
    spill_page,
    unserved,
)
from resumeq.server.auth import CAN_OPERATE, CAN_READ_ALL
from resumeq.server.openapi import SPILL_CURSOR_PATTERN, SPILL_PAGE_MAX
from resumeq.server.problems import Problem
from resumeq.server.routes.common import DIGITS, job_id_of, principal, read_json, visible_job
from resumeq.server.service import service
from resumeq.store import SPILL_QUEUE, check_queue

_SPILL_CURSOR_RE = re.compile(SPILL_CURSOR_PATTERN)


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
    if not DIGITS.fullmatch(raw) or not low <= int(raw) <= high:
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
