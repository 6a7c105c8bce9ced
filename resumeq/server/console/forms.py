"""What the console reads from a query or a form, checked before anything is read or done:
a job id, fields and filters (the spill lane's among them), page positions, and the query
of the next page. A bad value is a :class:`~resumeq.server.console.render.PageError`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from starlette.datastructures import FormData
from starlette.requests import Request

from resumeq.core import names
from resumeq.producer.ops import SpillFilter
from resumeq.server.console.render import PageError

#: Rows a page shows.
PAGE = 50
#: A filter field longer than this is refused (a message, nothing read).
FILTER_MAX = 200
_CURSOR = re.compile(r"^([0-9]{1,16})\.([A-Za-z0-9_-]{1,64})$")
_AGE = re.compile(r"^\s*([0-9]{1,7})\s*([smhd]?)\s*$")
_AGE_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def job_id_of(request: Request) -> str:
    raw = str(request.path_params["job_id"])
    try:
        return names.check_job_id(raw)
    except ValueError:
        raise PageError(404, f"No job {raw[:80]!r}: not a job id.") from None


def field(form: Mapping[str, Any], name: str) -> str | None:
    value = form.get(name)
    return value.strip() if isinstance(value, str) else None


def int_field(form: FormData, name: str) -> int | None:
    raw = field(form, name)
    if not raw:
        return None
    if not re.fullmatch(r"[0-9]{1,9}", raw):
        raise PageError(400, f"{name}: a whole number of tokens, not {raw[:40]!r}.")
    return int(raw)


def text_filter(params: Mapping[str, Any], name: str) -> str | None:
    value = params.get(name)
    if not isinstance(value, str) or not value.strip():
        return None
    if len(value) > FILTER_MAX:
        raise PageError(400, f"The {name} filter is longer than {FILTER_MAX} characters.")
    return value.strip()


def spill_filter(params: Mapping[str, Any], prefix: str = "") -> SpillFilter:
    """The spill lane's filters from a query (or, ``prefix``-ed, from an action's form)."""
    params = {k.removeprefix(prefix): v for k, v in params.items() if k.startswith(prefix)}
    age = text_filter(params, "older_than")
    older_than_s = None
    if age is not None:
        match = _AGE.match(age)
        if not match:
            raise PageError(400, f"Age {age[:40]!r}: a number with s, m, h or d (e.g. 30m).")
        older_than_s = float(int(match[1]) * _AGE_S[match[2]])
    return SpillFilter(
        reason=text_filter(params, "reason"),
        provider=text_filter(params, "provider"),
        queue=text_filter(params, "queue"),
        older_than_s=older_than_s,
    )


def spill_form(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    names = ("reason", "provider", "queue", "older_than")
    return {k: text_filter(params, prefix + k) or "" for k in names}


def describe(where: SpillFilter) -> str:
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


def cursor(raw: str | None, name: str) -> tuple[int, str] | None:
    if raw is None or raw == "":
        return None
    match = _CURSOR.match(raw)
    if not match:
        raise PageError(400, f"Not a page position ({name}): {raw[:40]!r}. Start again.")
    return int(match[1]), match[2]


def cursor_int(raw: str | None) -> int:
    if raw is None or raw == "":
        return 0
    if not re.fullmatch(r"[0-9]{1,18}", raw):
        raise PageError(400, f"after: a revision number, not {raw[:40]!r}.")
    return int(raw)


def next_query(params: Mapping[str, Any], name: str, position: tuple[int, str] | None) -> str:
    if position is None:
        return ""
    kept = {k: v for k, v in params.items() if k not in (name, "msg") and v}
    kept[name] = f"{position[0]}.{position[1]}"
    return "?" + "&".join(f"{quoted(k)}={quoted(str(v))}" for k, v in kept.items())


def quoted(text: str) -> str:
    return quote(text, safe="")
