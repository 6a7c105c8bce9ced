"""The console's job pages: the list (filtered, a page at a time), one job with its live
events, and its cancel."""

from __future__ import annotations

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response

from resumeq.core.errors import InvalidTransition, JobNotFound
from resumeq.producer.enqueue import cancel_job
from resumeq.server import sse
from resumeq.server.console import data
from resumeq.server.console.forms import (
    PAGE,
    cursor,
    cursor_int,
    job_id_of,
    next_query,
    text_filter,
)
from resumeq.server.console.plumbing import Plumbing, record_of
from resumeq.server.console.render import PageError, back, render
from resumeq.server.console.session import Session


class JobPages:
    """``/console/jobs``, ``/console/jobs/ID`` (its events, its cancel)."""

    def __init__(self, plumbing: Plumbing) -> None:
        self.plumbing = plumbing
        self.svc = plumbing.svc

    async def jobs(self, request: Request, who: Session) -> Response:
        svc = self.svc
        params = request.query_params
        state = text_filter(params, "state")
        if state and state not in data.STATES:
            raise PageError(400, f"No such state {state!r}: one of {', '.join(data.STATES)}.")
        where = data.JobFilter(
            state=state,
            queue=text_filter(params, "queue"),
            provider=text_filter(params, "provider"),
            text=text_filter(params, "q"),
        )
        before = cursor(params.get("before"), "before")
        result = await svc.run(data.jobs_page, svc.store, where, before=before, limit=PAGE)
        return render(
            request,
            "jobs.html",
            who=who,
            rows=result.rows,
            f=where,
            states=data.STATES,
            next=next_query(params, "before", result.next),
            examined=result.examined,
            first=before is None,
        )

    async def job(self, request: Request, who: Session) -> Response:
        svc = self.svc
        job_id = job_id_of(request)
        try:
            info = await svc.run(data.job_view, svc.store, job_id)
        except JobNotFound:
            raise PageError(404, f"No job {job_id}: it never existed, or it is gone.") from None
        return render(request, "job.html", who=who, job=info)

    async def job_events(self, request: Request, who: Session) -> Response:
        """The job's events for its page (the API's stream, with the console's session)."""
        svc = self.svc
        job_id = job_id_of(request)
        # A browser reconnecting sends the last id it saw: it goes on from there, not
        # from the page's own revision again.
        last = request.headers.get("last-event-id")
        after = cursor_int(last if last else request.query_params.get("after"))
        record = await svc.run(record_of, svc.store, job_id)
        try:
            stream: Response = svc.hub.stream(
                record,
                after=after,
                keepalive_s=svc.server.keepalive_s,
                principal=who.principal.name,
                max_jobs=svc.server.max_followed_jobs,
            )
        except sse.Full as full:
            raise PageError(full.status, full.message) from None
        return stream

    async def cancel(self, request: Request, who: Session, form: FormData) -> Response:
        svc = self.svc
        job_id = job_id_of(request)
        name = who.principal.name
        try:
            await svc.run(
                cancel_job, svc.store, job_id, reason=f"cancelled by {name} in the console"
            )
        except JobNotFound:
            raise PageError(404, f"No job {job_id}.") from None
        except InvalidTransition as exc:
            raise PageError(409, f"Not cancelled: {exc}") from None
        await svc.run(self.plumbing.audit, who, "cancel", [job_id])
        return back(f"/console/jobs/{job_id}", "cancelled")
