"""What every route reads from a request: the caller (its token and role), a job id from
the path, the job as the caller may see it, and a JSON body within the configured size."""

from __future__ import annotations

import json
import re
from typing import Any

from starlette.requests import Request

from resumeq.core import names
from resumeq.core.settings import Role
from resumeq.producer.ops import status_dict
from resumeq.server.auth import Principal
from resumeq.server.problems import Problem
from resumeq.server.service import service

DIGITS = re.compile(r"[0-9]{1,18}")


def principal(request: Request, allowed: frozenset[Role] | None = None) -> Principal:
    """The caller: 401 without a valid token, 403 when its role may not do this."""
    who = service(request).tokens.principal(request.headers.get("authorization"))
    if who is None:
        raise Problem(
            401,
            "a valid bearer token is required (Authorization: Bearer TOKEN)",
            headers={"WWW-Authenticate": 'Bearer realm="resumeq"'},
        )
    if allowed is not None and who.role not in allowed:
        raise Problem(403, f"the {who.role} role may not do this")
    return who


def job_id_of(request: Request) -> str:
    raw = str(request.path_params["job_id"])
    try:
        return names.check_job_id(raw)
    except ValueError:
        raise Problem.field(404, "id", f"malformed job id {raw[:80]!r}") from None


async def visible_job(request: Request, who: Principal, job_id: str) -> dict[str, Any]:
    """The job's ``status --json`` object, if ``who`` may see it (else 404, as for a job
    that does not exist: a producer learns nothing of others' jobs)."""
    job = await service(request).run(status_dict, service(request).store, job_id)
    if not who.sees(job.get("owner")):
        raise Problem(404, f"no job {job_id}")
    return job_json(job)


def job_json(job: dict[str, Any]) -> dict[str, Any]:
    base = f"/v1/jobs/{job['id']}"
    return {
        **job,
        "links": {"self": base, "events": f"{base}/events", "cancel": f"{base}/cancel"},
    }


async def read_json(request: Request, *, empty: Any = None) -> Any:
    """The request body as JSON: 415 for another media type, 413 past the configured
    size (counted as it arrives, whatever Content-Length says), 400 if it does not parse."""
    media = request.headers.get("content-type", "application/json").split(";")[0].strip()
    if media.lower() not in ("application/json", "application/problem+json", ""):
        raise Problem.field(415, "Content-Type", f"expected application/json, not {media}")
    limit = service(request).server.max_body_bytes
    declared = request.headers.get("content-length", "")
    if DIGITS.fullmatch(declared) and int(declared) > limit:
        raise Problem(413, f"the body is over {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise Problem(413, f"the body is over {limit} bytes")
        chunks.append(chunk)
    raw = b"".join(chunks)
    if empty is not None and not raw.strip():
        return empty  # an optional body, not sent
    try:
        return json.loads(raw, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Problem.field(400, "body", f"not valid JSON ({exc})") from None
    except RecursionError:
        raise Problem.field(400, "body", "nested too deeply") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
