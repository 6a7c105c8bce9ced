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
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from resumeq.core import names
from resumeq.core.errors import (
    InvalidTransition,
    JobNotFound,
    RedisUnavailable,
    ResumeqError,
    StaleRevision,
)
from resumeq.producer.enqueue import cancel_job
from resumeq.producer.ops import (
    SPILL_SCAN_MAX,
    SpillFilter,
    drop_spilled,
    idle_queues,
    requeue_spilled,
    spill_export_lines,
    spill_page,
)
from resumeq.server import sse
from resumeq.server.console import data, session
from resumeq.server.console.session import COOKIE, Session
from resumeq.store import SPILL_QUEUE, audit, check_queue

HERE = Path(__file__).parent
ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(HERE / "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
)
#: The most jobs one "all that match" action touches (the confirmation says how many).
BULK_MAX = 500
PAGE = 50
#: A filter field longer than this is refused (a message, nothing read).
FILTER_MAX = 200
_CURSOR = re.compile(r"^([0-9]{1,16})\.([A-Za-z0-9_-]{1,64})$")
_AGE = re.compile(r"^\s*([0-9]{1,7})\s*([smhd]?)\s*$")
_AGE_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def _when(ms: int | float | None) -> str:
    if not ms:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + " UTC"


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


ENV.filters["when"] = _when
ENV.filters["age"] = _age
ENV.filters["num"] = lambda n: f"{int(n):,}" if n is not None else "—"


class PageError(Exception):
    """A clear message on the page (and its status); nothing was changed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Console:
    def __init__(self, svc: Any) -> None:
        self.svc = svc

    # -- plumbing ---------------------------------------------------------------------------

    def render(
        self,
        request: Request,
        template: str,
        status: int = 200,
        who: Session | None = None,
        **context: Any,
    ) -> HTMLResponse:
        page = ENV.get_template(template).render(
            request=request,
            who=who,
            operator=who is not None and who.principal.role == "operator",
            csrf=who.csrf if who else "",
            message=context.pop("message", _message(request.query_params)),
            **context,
        )
        return HTMLResponse(page, status_code=status, headers=SECURITY_HEADERS)

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
        query = f"?next={_quote(target)}" + ("&expired=1" if expired else "")
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
            return self.render(request, "message.html", exc.status, who=who, text=exc.message)
        except RedisUnavailable as exc:
            return self.render(request, "message.html", 503, text=f"Redis: {exc}")

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
                if not who.csrf_ok(_field(form, "csrf")):
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

    # -- login --------------------------------------------------------------------------------

    async def login_form(self, request: Request) -> Response:
        expired = request.query_params.get("expired") == "1"
        return self.render(
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
            return self.render(request, "message.html", exc.status, text=exc.message)
        form = await request.form()
        token = (_field(form, "token") or "").strip()
        target = _safe_next(request.query_params.get("next"))
        who = svc.tokens.principal(f"Bearer {token}") if token or svc.tokens.open else None
        if who is None or who.role == "producer":
            text = (
                "That token does not open the console (a producer's token creates jobs only)."
                if who is not None
                else "That token is not valid."
            )
            return self.render(
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
            return self.render(request, "message.html", exc.status, text=exc.message)
        await svc.run(session.close, svc.store.redis, request.cookies.get(COOKIE))
        response = RedirectResponse("/console/login", status_code=303)
        response.delete_cookie(COOKIE, path="/console")
        return response

    # -- pages --------------------------------------------------------------------------------

    async def overview(self, request: Request, who: Session) -> Response:
        svc = self.svc
        info = await svc.run(data.overview, svc.store, svc.settings.file.worker.queues)
        fragment = request.query_params.get("fragment") == "1"
        return self.render(
            request, "overview_body.html" if fragment else "overview.html", who=who, o=info
        )

    async def jobs(self, request: Request, who: Session) -> Response:
        svc = self.svc
        params = request.query_params
        state = _filter(params, "state")
        if state and state not in data.STATES:
            raise PageError(400, f"No such state {state!r}: one of {', '.join(data.STATES)}.")
        where = data.JobFilter(
            state=state,
            queue=_filter(params, "queue"),
            provider=_filter(params, "provider"),
            text=_filter(params, "q"),
        )
        before = _cursor(params.get("before"), "before")
        result = await svc.run(data.jobs_page, svc.store, where, before=before, limit=PAGE)
        return self.render(
            request,
            "jobs.html",
            who=who,
            rows=result.rows,
            f=where,
            states=data.STATES,
            next=_next_query(params, "before", result.next),
            examined=result.examined,
            first=before is None,
        )

    async def job(self, request: Request, who: Session) -> Response:
        svc = self.svc
        job_id = _job_id(request)
        try:
            info = await svc.run(data.job_view, svc.store, job_id)
        except JobNotFound:
            raise PageError(404, f"No job {job_id}: it never existed, or it is gone.") from None
        return self.render(request, "job.html", who=who, job=info)

    async def job_events(self, request: Request, who: Session) -> Response:
        """The job's events for its page (the API's stream, with the console's session)."""
        svc = self.svc
        job_id = _job_id(request)
        # A browser reconnecting sends the last id it saw: it goes on from there, not
        # from the page's own revision again.
        last = request.headers.get("last-event-id")
        after = _cursor_int(last if last else request.query_params.get("after"))
        record = await svc.run(_get, svc.store, job_id)
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

    async def spill(self, request: Request, who: Session) -> Response:
        svc = self.svc
        where = _spill_filter(request.query_params)
        after = _cursor(request.query_params.get("cursor"), "cursor")
        items, position = await svc.run(spill_page, svc.store, where, limit=PAGE, after=after)
        return self.render(
            request,
            "spill.html",
            who=who,
            items=items,
            f=_spill_form(request.query_params),
            next=_next_query(request.query_params, "cursor", position),
            providers=sorted(svc.settings.file.providers),
            queues=[q for q in svc.settings.file.worker.queues if q != SPILL_QUEUE],
            now_ms=time.time() * 1000,
            bulk_max=BULK_MAX,
            first=after is None,
        )

    async def spill_export(self, request: Request, who: Session) -> Response:
        if who.principal.role != "operator":
            raise PageError(403, f"The {who.principal.role} role may not export.")
        svc = self.svc
        where = _spill_filter(request.query_params)
        await svc.run(self.audit, who, "export", [], _describe(where))
        return StreamingResponse(
            spill_export_lines(svc.store, where),
            media_type="application/x-ndjson",
            headers={"Content-Disposition": 'attachment; filename="spill.jsonl"'},
        )

    async def spill_edit_form(self, request: Request, who: Session) -> Response:
        svc = self.svc
        job_id = _job_id(request)
        record = await svc.run(_get, svc.store, job_id)
        if record.state.value != "spilled":
            raise PageError(409, f"Job {job_id} is {record.state.value}, not spilled.")
        return self.render(
            request,
            "spill_edit.html",
            who=who,
            job=record,
            providers=sorted(svc.settings.file.providers),
        )

    async def audit_page(self, request: Request, who: Session) -> Response:
        svc = self.svc
        before = request.query_params.get("before")
        if before is not None and not re.fullmatch(r"[0-9]{1,16}-[0-9]{1,10}", before):
            raise PageError(400, f"Not a position in the audit log: {before[:40]!r}.")
        entries, more = await svc.run(audit.page, svc.store.redis, before=before, limit=PAGE)
        return self.render(
            request, "audit.html", who=who, entries=entries, more=more, first=before is None
        )

    # -- actions ------------------------------------------------------------------------------

    async def cancel(self, request: Request, who: Session, form: FormData) -> Response:
        svc = self.svc
        job_id = _job_id(request)
        name = who.principal.name
        try:
            await svc.run(
                cancel_job, svc.store, job_id, reason=f"cancelled by {name} in the console"
            )
        except JobNotFound:
            raise PageError(404, f"No job {job_id}.") from None
        except InvalidTransition as exc:
            raise PageError(409, f"Not cancelled: {exc}") from None
        await svc.run(self.audit, who, "cancel", [job_id])
        return _back(f"/console/jobs/{job_id}", "cancelled")

    async def spill_action(self, request: Request, who: Session, form: FormData) -> Response:
        svc = self.svc
        action = _field(form, "action")
        if action not in ("requeue", "drop"):
            raise PageError(400, f"Unknown action {str(action)[:40]!r}: requeue or drop.")
        to, provider = self.target(form)

        sent_to: list[str] = []

        def one(job_id: str) -> Any:
            if action == "drop":
                reason = f"dropped by {who.principal.name} in the console"
                return drop_spilled(svc.store, job_id, reason=reason)
            sent_to.append(requeue_spilled(svc.store, job_id, queue=to, provider=provider))

        detail = " ".join(f"{k}={v}" for k, v in (("to", to), ("provider", provider)) if v)
        if _field(form, "select") == "all":
            # All that match: the confirmation names how many, and carries exactly those
            # ids; the confirmed action acts on them (not on a new, larger match).
            where = _spill_filter(form, prefix="filter_")
            matched, complete = await svc.run(_matching, svc.store, where)
            return self.render(
                request,
                "spill_confirm.html",
                who=who,
                action=action,
                ids=matched[:BULK_MAX],
                count=min(len(matched), BULK_MAX),
                capped=len(matched) > BULK_MAX,
                complete=complete,
                to=to or "",
                provider=provider or "",
                describe=_describe(where),
            )
        ids = _selected(form)
        done: list[str] = []
        skipped: dict[str, str] = {}
        try:
            for job_id in ids:
                try:
                    await svc.run(one, job_id)
                    done.append(job_id)
                except (ResumeqError, ValueError) as exc:  # changed meanwhile, or gone
                    skipped[job_id] = str(exc)
        finally:  # what was done is in the audit log, even if Redis went away part-way
            if done:
                await svc.run(self.audit, who, action, done, detail)
        return _back(
            "/console/spill",
            "requeued" if action == "requeue" else "dropped",
            n=len(done),
            skipped=len(skipped),
            idle=await svc.run(idle_queues, svc.store, sent_to),
        )

    def target(self, form: FormData) -> tuple[str | None, str | None]:
        """Where a requeue sends jobs: a queue (not the spill lane) and a known provider."""
        to = _field(form, "to") or None
        provider = _field(form, "provider") or None
        if to is not None:
            if to == SPILL_QUEUE:
                raise PageError(400, "Requeue to the spill lane itself? Choose another queue.")
            try:
                check_queue(to)
            except ValueError:
                raise PageError(400, f"{to[:80]!r} is not a valid queue name.") from None
        providers = self.svc.settings.file.providers
        if provider is not None and provider not in providers:
            known = ", ".join(sorted(providers))
            raise PageError(400, f"Unknown provider {provider[:80]!r} (known: {known}).")
        return to, provider

    async def spill_edit(self, request: Request, who: Session, form: FormData) -> Response:
        svc = self.svc
        job_id = _job_id(request)
        to, provider = self.target(form)
        budget = _int_field(form, "budget_tokens")
        floor = _int_field(form, "floor_tokens")
        record = await svc.run(_get, svc.store, job_id)
        if budget == record.budget_tokens:
            budget = None
        if floor == record.floor_tokens:
            floor = None
        if provider == record.spec.provider:
            provider = None
        try:
            queue = await svc.run(
                requeue_spilled,
                svc.store,
                job_id,
                queue=to,
                provider=provider,
                budget=budget,
                floor=floor,
            )
        except JobNotFound:
            raise PageError(404, f"No job {job_id}: it is gone.") from None
        except (ValueError, InvalidTransition, StaleRevision) as exc:
            raise PageError(400, f"Not requeued: {exc}. Nothing was changed.") from None
        changes = {"to": to, "provider": provider, "budget": budget, "floor": floor}
        detail = " ".join(f"{k}={v}" for k, v in changes.items() if v is not None)
        await svc.run(self.audit, who, "edit+requeue", [job_id], detail)
        idle = await svc.run(idle_queues, svc.store, [queue])
        return _back(f"/console/jobs/{job_id}", "edited", idle=idle)

    # -- routes ------------------------------------------------------------------------------

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/console", self.page(self.overview), methods=["GET"]),
            Route("/console/login", self.login_form, methods=["GET"]),
            Route("/console/login", self.login, methods=["POST"]),
            Route("/console/logout", self.logout, methods=["POST"]),
            Route("/console/jobs", self.page(self.jobs), methods=["GET"]),
            Route("/console/jobs/{job_id}", self.page(self.job), methods=["GET"]),
            Route("/console/jobs/{job_id}/events", self.page(self.job_events), methods=["GET"]),
            Route("/console/jobs/{job_id}/cancel", self.action(self.cancel), methods=["POST"]),
            Route("/console/spill", self.page(self.spill), methods=["GET"]),
            Route("/console/spill/export", self.page(self.spill_export), methods=["GET"]),
            Route("/console/spill/action", self.action(self.spill_action), methods=["POST"]),
            Route("/console/spill/{job_id}/edit", self.page(self.spill_edit_form), methods=["GET"]),
            Route("/console/spill/{job_id}/edit", self.action(self.spill_edit), methods=["POST"]),
            Route("/console/audit", self.page(self.audit_page), methods=["GET"]),
            Mount("/console/static", StaticFiles(directory=HERE / "static"), name="console-static"),
        ]


#: Sent with every page: no framing by other sites, no scripts but the console's own.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "object-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def same_site(request: Request) -> None:
    """Refuse a POST another site made the browser send (the cookie is SameSite=Strict
    too; this holds for browsers that send a cross-site POST anyway)."""
    fetch_site = request.headers.get("sec-fetch-site")
    origin = request.headers.get("origin")
    own = f"{request.url.scheme}://{request.url.netloc}"
    if fetch_site == "cross-site" or (origin is not None and origin != own):
        raise PageError(403, "Refused: this request came from another site. Nothing was changed.")


#: The most spilled jobs "all that match" reads to find its matches.
MATCH_SCAN_MAX = 20_000


def _matching(store: Any, where: SpillFilter) -> tuple[list[str], bool]:
    """The ids of the spilled jobs that match, oldest spill first, up to one past
    :data:`BULK_MAX`; and whether the whole lane was read (else the count is "at least")."""
    ids: list[str] = []
    after: tuple[int, str] | None = None
    read = 0
    while len(ids) <= BULK_MAX:
        items, after = spill_page(store, where, limit=BULK_MAX + 1 - len(ids), after=after)
        ids += [item["id"] for item in items]
        read += SPILL_SCAN_MAX
        if after is None:
            return ids, True
        if read >= MATCH_SCAN_MAX:
            return ids, False
    return ids, True


def _selected(form: FormData) -> list[str]:
    """The ticked rows (or the confirmed matches), every id checked before any is acted on."""
    ids = [str(i) for i in form.getlist("ids")]
    if not ids:
        raise PageError(400, "No job selected: tick some rows, or choose all that match.")
    if len(ids) > BULK_MAX:
        raise PageError(400, f"At most {BULK_MAX} jobs at once. Nothing was changed.")
    for job_id in ids:
        try:
            names.check_job_id(job_id)
        except ValueError:
            raise PageError(400, f"{job_id[:80]!r} is not a job id. Nothing was changed.") from None
    return list(dict.fromkeys(ids))


def _get(store: Any, job_id: str) -> Any:
    try:
        return store.get(job_id)
    except JobNotFound:
        raise PageError(404, f"No job {job_id}: it never existed, or it is gone.") from None


def _job_id(request: Request) -> str:
    raw = str(request.path_params["job_id"])
    try:
        return names.check_job_id(raw)
    except ValueError:
        raise PageError(404, f"No job {raw[:80]!r}: not a job id.") from None


def _field(form: Mapping[str, Any], name: str) -> str | None:
    value = form.get(name)
    return value.strip() if isinstance(value, str) else None


def _int_field(form: FormData, name: str) -> int | None:
    raw = _field(form, name)
    if not raw:
        return None
    if not re.fullmatch(r"[0-9]{1,9}", raw):
        raise PageError(400, f"{name}: a whole number of tokens, not {raw[:40]!r}.")
    return int(raw)


def _filter(params: Mapping[str, Any], name: str) -> str | None:
    value = params.get(name)
    if not isinstance(value, str) or not value.strip():
        return None
    if len(value) > FILTER_MAX:
        raise PageError(400, f"The {name} filter is longer than {FILTER_MAX} characters.")
    return value.strip()


def _spill_filter(params: Mapping[str, Any], prefix: str = "") -> SpillFilter:
    """The spill lane's filters from a query (or, ``prefix``-ed, from an action's form)."""
    params = {k.removeprefix(prefix): v for k, v in params.items() if k.startswith(prefix)}
    age = _filter(params, "older_than")
    older_than_s = None
    if age is not None:
        match = _AGE.match(age)
        if not match:
            raise PageError(400, f"Age {age[:40]!r}: a number with s, m, h or d (e.g. 30m).")
        older_than_s = float(int(match[1]) * _AGE_S[match[2]])
    return SpillFilter(
        reason=_filter(params, "reason"),
        provider=_filter(params, "provider"),
        queue=_filter(params, "queue"),
        older_than_s=older_than_s,
    )


def _spill_form(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    names = ("reason", "provider", "queue", "older_than")
    return {k: _filter(params, prefix + k) or "" for k in names}


def _describe(where: SpillFilter) -> str:
    parts = [
        f"{k}={v}"
        for k, v in (
            ("reason", where.reason),
            ("provider", where.provider),
            ("queue", where.queue),
            ("older_than_s", where.older_than_s),
        )
        if v is not None
    ]
    return "(" + (" ".join(parts) or "no filter") + ")"


def _cursor(raw: str | None, name: str) -> tuple[int, str] | None:
    if raw is None or raw == "":
        return None
    match = _CURSOR.match(raw)
    if not match:
        raise PageError(400, f"Not a page position ({name}): {raw[:40]!r}. Start again.")
    return int(match[1]), match[2]


def _cursor_int(raw: str | None) -> int:
    if raw is None or raw == "":
        return 0
    if not re.fullmatch(r"[0-9]{1,18}", raw):
        raise PageError(400, f"after: a revision number, not {raw[:40]!r}.")
    return int(raw)


def _next_query(params: Mapping[str, Any], name: str, position: tuple[int, str] | None) -> str:
    if position is None:
        return ""
    kept = {k: v for k, v in params.items() if k not in (name, "msg") and v}
    kept[name] = f"{position[0]}.{position[1]}"
    return "?" + "&".join(f"{_quote(k)}={_quote(str(v))}" for k, v in kept.items())


def _quote(text: str) -> str:
    return quote(text, safe="")


def _safe_next(raw: str | None) -> str:
    """Where to go after logging in: a console path only (no open redirect)."""
    if raw and raw.startswith("/console") and not raw.startswith("//") and "\\" not in raw:
        return raw
    return "/console"


#: What an action's redirect may say (by code: a link cannot put words of its own in the
#: console's banner).
MESSAGES = {
    "cancelled": "Cancelled.",
    "edited": "Edited and requeued.",
    "requeued": "Requeued {n} job(s).",
    "dropped": "Dropped {n} job(s).",
}


#: The most queues the banner names as having no live worker.
IDLE_NAMED = 5


def _back(
    path: str, code: str, *, n: int = 0, skipped: int = 0, idle: Sequence[str] = ()
) -> Response:
    query = f"?done={code}&n={n}" + (f"&skipped={skipped}" if skipped else "")
    if idle:
        query += "&" + urlencode({"idle": ",".join(idle[:IDLE_NAMED])})
    return RedirectResponse(path + query, status_code=303)


def _message(params: Mapping[str, Any]) -> str:
    template = MESSAGES.get(str(params.get("done", "")))
    if template is None:
        return ""
    n, skipped = (str(params.get(k, "0")) for k in ("n", "skipped"))
    if not (n.isdigit() and skipped.isdigit() and len(n) < 7 and len(skipped) < 7):
        return ""
    text = template.format(n=int(n))
    if int(skipped):
        text += f" Left alone {int(skipped)} that changed meanwhile."
    # Queue names only (a link cannot put other words in the banner).
    idle = [q for q in str(params.get("idle", "")).split(",") if _is_queue(q)]
    for queue in idle[:IDLE_NAMED]:
        text += f" No live worker listens on queue {queue!r}: its jobs wait there until one does."
    return text


def _is_queue(name: str) -> bool:
    try:
        check_queue(name)
    except ValueError:
        return False
    return True
