"""What every console page and action stands on (:class:`Plumbing`): the person's session,
the way to the login page without one, the guards that make a handler a page or an action
(a session; for an action the operator role, a request from this site and the CSRF token),
and the audit log every action writes to."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from resumeq.core.errors import JobNotFound, RedisUnavailable
from resumeq.server.console import session
from resumeq.server.console.forms import field, quoted
from resumeq.server.console.render import PageError, render
from resumeq.server.console.session import COOKIE, Session
from resumeq.store import audit


class Plumbing:
    """The session, the guards and the audit log, over the service every route shares."""

    def __init__(self, svc: Any) -> None:
        self.svc = svc

    async def session(self, request: Request) -> Session | None:
        svc = self.svc
        found: Session | None = await svc.run(
            session.load, svc.store.redis, request.cookies.get(COOKIE)
        )
        if found is not None and not svc.tokens.grants(found.principal):
            return None  # its token was revoked, or its role changed
        return found

    def to_login(self, request: Request, expired: bool) -> Response:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        query = f"?next={quoted(target)}" + ("&expired=1" if expired else "")
        return RedirectResponse(f"/console/login{query}", status_code=303)

    def page(self, handler: Callable[[Request, Session], Any]) -> Callable[[Request], Any]:
        """A page for a logged-in person: to the login page without a session; a
        :class:`PageError` becomes a page with its message."""

        async def endpoint(request: Request) -> Response:
            async def step(seen: list[Session]) -> Response:
                who = await self.session(request)
                if who is None:
                    return self.to_login(request, expired=COOKIE in request.cookies)
                seen.append(who)
                response: Response = await handler(request, who)
                return response

            return await self.guarded(request, step)

        return endpoint

    async def guarded(
        self, request: Request, step: Callable[[list[Session]], Awaitable[Response]]
    ) -> Response:
        """``step``'s response; a :class:`PageError` (or Redis failing) as a page with its
        message, for the person ``step`` found (if it got that far)."""
        seen: list[Session] = []
        try:
            return await step(seen)
        except PageError as exc:
            who = seen[0] if seen else None
            return render(request, "message.html", exc.status, who=who, text=exc.message)
        except RedisUnavailable as exc:
            return render(request, "message.html", 503, text=f"Redis: {exc}")

    def action(
        self, handler: Callable[[Request, Session, FormData], Any]
    ) -> Callable[[Request], Any]:
        """A POST that changes something: a session, the operator role, a request from this
        site, and the session's CSRF token; else a message and nothing done."""

        async def endpoint(request: Request) -> Response:
            async def step(seen: list[Session]) -> Response:
                same_site(request)
                who = await self.session(request)
                if who is None:
                    raise PageError(401, "Your session has expired: log in again, then retry.")
                seen.append(who)
                form = await request.form()
                if not who.csrf_ok(field(form, "csrf")):
                    raise PageError(
                        403,
                        "This form is stale (its CSRF token does not match your session): "
                        "reload the page and try again. Nothing was changed.",
                    )
                if who.principal.role != "operator":
                    raise PageError(403, f"The {who.principal.role} role may not act.")
                response: Response = await handler(request, who, form)
                return response

            return await self.guarded(request, step)

        return endpoint

    def audit(self, who: Session, action: str, jobs: list[str], detail: str = "") -> None:
        audit.record(
            self.svc.store.redis,
            who=who.principal.name,
            role=who.principal.role,
            action=action,
            jobs=jobs,
            detail=detail,
            via="console",
        )


def same_site(request: Request) -> None:
    """Refuse a POST another site made the browser send (the cookie is SameSite=Strict
    too; this holds for browsers that send a cross-site POST anyway)."""
    fetch_site = request.headers.get("sec-fetch-site")
    origin = request.headers.get("origin")
    own = f"{request.url.scheme}://{request.url.netloc}"
    if fetch_site == "cross-site" or (origin is not None and origin != own):
        raise PageError(403, "Refused: this request came from another site. Nothing was changed.")


def record_of(store: Any, job_id: str) -> Any:
    try:
        return store.get(job_id)
    except JobNotFound:
        raise PageError(404, f"No job {job_id}: it never existed, or it is gone.") from None
