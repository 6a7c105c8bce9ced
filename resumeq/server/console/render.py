"""How the console's pages are drawn: the Jinja2 templates (every value escaped) and their
filters, the headers sent with every page, :class:`PageError` (a message on the page,
nothing changed), and the banner an action's redirect asks for by code."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from resumeq.server.console.session import Session
from resumeq.store import check_queue

HERE = Path(__file__).parent
ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(HERE / "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
)


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


def _pretty_json(text: str) -> str:
    """A tool call's arguments, indented when they are JSON (as they came otherwise)."""
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        return text


ENV.filters["when"] = _when
ENV.filters["age"] = _age
ENV.filters["pretty_json"] = _pretty_json
ENV.filters["num"] = lambda n: f"{int(n):,}" if n is not None else "—"


class PageError(Exception):
    """A clear message on the page (and its status); nothing was changed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def render(
    request: Request,
    template: str,
    status: int = 200,
    who: Session | None = None,
    **context: Any,
) -> HTMLResponse:
    """``template`` as a page, with the person, whether they may act, their CSRF token, and
    the banner an action's redirect asked for (unless ``message`` says otherwise)."""
    page = ENV.get_template(template).render(
        request=request,
        who=who,
        operator=who is not None and who.principal.role == "operator",
        csrf=who.csrf if who else "",
        message=context.pop("message", _message(request.query_params)),
        **context,
    )
    return HTMLResponse(page, status_code=status, headers=SECURITY_HEADERS)


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


def back(
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
