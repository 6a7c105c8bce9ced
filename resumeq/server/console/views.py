"""The operator console's pages and actions, served by ``resumeq serve`` at ``/console``.

Server-rendered (Jinja2, every value escaped: a prompt or an LLM answer is untrusted input),
with one small script of its own for the live parts; no build step, nothing fetched from
elsewhere. Every job operation goes through the same functions as the CLI and the HTTP API.

Roles are the API's: ``viewer`` sees everything and gets no action controls (its POSTs are
refused); ``operator`` acts; a producer's token does not open the console. Every action is a
POST carrying the session's CSRF token, refused when it comes from another site; each one
is written to the audit log.
"""

from __future__ import annotations

import re
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from resumeq.server.console import data
from resumeq.server.console.forms import PAGE
from resumeq.server.console.jobs import JobPages
from resumeq.server.console.login import Login
from resumeq.server.console.plumbing import Plumbing
from resumeq.server.console.render import HERE, PageError, render
from resumeq.server.console.session import Session
from resumeq.server.console.spill import SpillPages
from resumeq.store import audit


class Console:
    """The console's pages at their paths: the overview and the audit log here, the rest
    by page (:mod:`.login`, :mod:`.jobs`, :mod:`.spill`), all on one :class:`Plumbing`."""

    def __init__(self, svc: Any) -> None:
        self.svc = svc
        self.plumbing = Plumbing(svc)
        self.login = Login(self.plumbing)
        self.jobs = JobPages(self.plumbing)
        self.spill = SpillPages(self.plumbing)

    async def overview(self, request: Request, who: Session) -> Response:
        svc = self.svc
        info = await svc.run(data.overview, svc.store, svc.settings.file.worker.queues)
        fragment = request.query_params.get("fragment") == "1"
        return render(
            request, "overview_body.html" if fragment else "overview.html", who=who, o=info
        )

    async def audit_page(self, request: Request, who: Session) -> Response:
        svc = self.svc
        before = request.query_params.get("before")
        if before is not None and not re.fullmatch(r"[0-9]{1,16}-[0-9]{1,10}", before):
            raise PageError(400, f"Not a position in the audit log: {before[:40]!r}.")
        entries, more = await svc.run(audit.page, svc.store.redis, before=before, limit=PAGE)
        return render(
            request, "audit.html", who=who, entries=entries, more=more, first=before is None
        )

    def routes(self) -> list[BaseRoute]:
        page, action = self.plumbing.page, self.plumbing.action
        return [
            Route("/console", page(self.overview), methods=["GET"]),
            Route("/console/login", self.login.login_form, methods=["GET"]),
            Route("/console/login", self.login.login, methods=["POST"]),
            Route("/console/logout", self.login.logout, methods=["POST"]),
            Route("/console/jobs", page(self.jobs.jobs), methods=["GET"]),
            Route("/console/jobs/{job_id}", page(self.jobs.job), methods=["GET"]),
            Route("/console/jobs/{job_id}/events", page(self.jobs.job_events), methods=["GET"]),
            Route("/console/jobs/{job_id}/cancel", action(self.jobs.cancel), methods=["POST"]),
            Route("/console/spill", page(self.spill.spill), methods=["GET"]),
            Route("/console/spill/export", page(self.spill.spill_export), methods=["GET"]),
            Route("/console/spill/action", action(self.spill.spill_action), methods=["POST"]),
            Route(
                "/console/spill/{job_id}/edit", page(self.spill.spill_edit_form), methods=["GET"]
            ),
            Route("/console/spill/{job_id}/edit", action(self.spill.spill_edit), methods=["POST"]),
            Route("/console/audit", page(self.audit_page), methods=["GET"]),
            Mount("/console/static", StaticFiles(directory=HERE / "static"), name="console-static"),
        ]
