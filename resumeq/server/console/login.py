"""The console's login and logout: a token exchanged for a session cookie (a producer's
token opens nothing), and the way back to the page that asked."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from resumeq.server.console import session
from resumeq.server.console.forms import field
from resumeq.server.console.plumbing import Plumbing, same_site
from resumeq.server.console.render import PageError, render
from resumeq.server.console.session import COOKIE


class Login:
    """``/console/login`` (the form, and the token it posts) and ``/console/logout``."""

    def __init__(self, plumbing: Plumbing) -> None:
        self.plumbing = plumbing
        self.svc = plumbing.svc

    async def login_form(self, request: Request) -> Response:
        expired = request.query_params.get("expired") == "1"
        return render(
            request,
            "login.html",
            next=_safe_next(request.query_params.get("next")),
            message="Your session has expired: log in again." if expired else "",
            open=self.svc.tokens.open,
        )

    async def login(self, request: Request) -> Response:
        svc = self.svc
        try:
            same_site(request)
        except PageError as exc:
            return render(request, "message.html", exc.status, text=exc.message)
        form = await request.form()
        token = (field(form, "token") or "").strip()
        target = _safe_next(request.query_params.get("next"))
        who = svc.tokens.principal(f"Bearer {token}") if token or svc.tokens.open else None
        if who is None or who.role == "producer":
            text = (
                "That token does not open the console (a producer's token creates jobs only)."
                if who is not None
                else "That token is not valid."
            )
            return render(
                request, "login.html", 401, next=target, message=text, open=svc.tokens.open
            )
        session_id = await svc.run(session.open_session, svc.store.redis, who)
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(
            COOKIE,
            session_id,
            max_age=session.TTL_S,
            path="/console",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    async def logout(self, request: Request) -> Response:
        svc = self.svc
        try:
            same_site(request)
        except PageError as exc:
            return render(request, "message.html", exc.status, text=exc.message)
        await svc.run(session.close, svc.store.redis, request.cookies.get(COOKIE))
        response = RedirectResponse("/console/login", status_code=303)
        response.delete_cookie(COOKIE, path="/console")
        return response


def _safe_next(raw: str | None) -> str:
    """Where to go after logging in: a console path only (no open redirect)."""
    if raw and raw.startswith("/console") and not raw.startswith("//") and "\\" not in raw:
        return raw
    return "/console"
