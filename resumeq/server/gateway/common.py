"""What the drop-in endpoints share (SPEC §24): the caller by its API key, the model a
request names, the job it becomes, and what the job does until it ends, read from its
durable checkpoints.

A request becomes a job as ``POST /v1/jobs`` makes one (the same tokens and roles, the same
``Idempotency-Key``); its answer is read from the job's events stream through the
process's :class:`~resumeq.server.sse.Hub`, so that a cut, a 429, a worker's death or a
handoff is only time to the client. :func:`happenings` turns the stream into what every
wire renders: text, whole tool calls, keep-alives, and the end (the job's view when it is
``done``; a :class:`~resumeq.server.gateway.errors.WireError` naming the job and why when it
ended otherwise, or rested on the spill lane past ``[gateway] max_wait_s``).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from resumeq.core.errors import InvalidTransition
from resumeq.core.models import JobState
from resumeq.core.settings import Role, Settings
from resumeq.producer import enqueue as producer
from resumeq.producer.ops import status_dict
from resumeq.server import sse
from resumeq.server.auth import CAN_CREATE, Principal
from resumeq.server.gateway.errors import Wire, WireError, as_wire_error

__all__ = ["Wire"]
from resumeq.server.routes.common import read_json
from resumeq.server.routes.jobs import idempotency_key, submit
from resumeq.server.service import Service, service
from resumeq.store import DEFAULT_QUEUE

#: Answers that are finished: what a provider's finish reason means, per wire.
STOPPED = frozenset({"stop", "end_turn", "stop_sequence", "completed", "refusal"})
LIMITED = frozenset({"length", "max_tokens", "max_output_tokens", "incomplete", "budget exhausted"})
CALLED = frozenset({"tool_calls", "tool_use"})

#: A gateway stream's first bytes: a comment, no ``retry:`` (the SDKs' decoders take an event
#: with a retry and no data for one to parse).
OPENING = b": resumeq\n\n"

#: Retrying the request would not help (the job ended): the SDKs read this header.
NO_RETRY = {"x-should-retry": "false"}


def caller(request: Request, wire: Wire, allowed: frozenset[Role] = CAN_CREATE) -> Principal:
    """The caller, by its API key: ``Authorization: Bearer KEY`` (OpenAI's SDKs, and
    Anthropic's when given an auth token) or ``x-api-key: KEY`` (Anthropic's)."""
    svc = service(request)
    header = request.headers.get("authorization")
    key = request.headers.get("x-api-key")
    if header is None and key:
        header = f"Bearer {key}"
    who = svc.tokens.principal(header)
    if who is None:
        where = "x-api-key" if wire == "anthropic" else "Authorization: Bearer"
        raise WireError(
            401,
            f"a valid API key is required ({where} KEY, a resumeq token)",
            code="invalid_api_key",
        )
    if who.role not in allowed:
        raise WireError(403, f"the {who.role} role may not do this", code="forbidden")
    return who


def resolve_model(settings: Settings, name: Any) -> tuple[str, str]:
    """The provider profile and model a request's ``model`` names: an alias of
    ``[gateway] models``, else ``PROFILE/MODEL`` (split at the first slash: model ids hold
    slashes of their own)."""
    if not isinstance(name, str) or not name:
        raise WireError(400, "model: a model name is required", param="model")
    target = settings.file.gateway.models.get(name, name)
    profile, slash, model = target.partition("/")
    if not slash or not model or profile not in settings.file.providers:
        known = ", ".join(sorted(settings.file.gateway.models)) or "none"
        raise WireError(
            404,
            f"The model `{name[:200]}` does not exist: give PROFILE/MODEL with a configured "
            f"provider profile, or an alias of [gateway] models (aliases: {known})",
            param="model",
            code="model_not_found",
        )
    return profile, model


def gateway_queue(settings: Settings) -> str:
    queues = settings.file.worker.queues
    return settings.file.gateway.queue or (queues[0] if queues else DEFAULT_QUEUE)


async def read_body(request: Request) -> dict[str, Any]:
    body = await read_json(request)
    if not isinstance(body, dict):
        raise WireError(400, "the body must be a JSON object", param="body")
    return body


async def create(request: Request, who: Principal, spec: dict[str, Any]) -> str:
    """Enqueue ``spec`` for ``who`` (its ``Idempotency-Key`` attaching a retried request
    to the same job): the job's id."""
    svc = service(request)
    key = idempotency_key(request, {})
    job_id, _ = await submit(svc, who, spec, queue=gateway_queue(svc.settings), key=key)
    return job_id


async def visible(svc: Service, who: Principal, job_id: str) -> dict[str, Any]:
    """The job's view, if ``who`` may read it (else 404, as for a job that does not exist)."""
    job = await svc.run(status_dict, svc.store, job_id)
    if not who.sees(job.get("owner")):
        raise WireError(404, f"no response {job_id}", code="not_found")
    return job


# -- what a job does, until it ends ----------------------------------------------------


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Call:
    """A whole tool call (``{"id", "name", "arguments"}``), its index in the answer."""

    index: int
    call: dict[str, str]


@dataclass(frozen=True)
class Ended:
    """The job ended ``done``: its view (text, calls, ledger)."""

    job: dict[str, Any]


#: Nothing happened for a keep-alive's while.
Quiet = None

Happening = Text | Call | Ended | None


@dataclass
class Progress:
    """What a reader was shown so far (an event counter for the wires that number theirs)."""

    chars: int = 0
    calls: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


async def happenings(
    svc: Service, who: Principal, job_id: str, *, patience_s: float | None = None
) -> AsyncIterator[Happening]:
    """The job's durable text and whole calls as they are checkpointed, then
    :class:`Ended`; a :class:`WireError` naming the job and why for any other end. A job
    resting on the spill lane is waited for up to ``[gateway] max_wait_s`` (a person may
    requeue it); ``patience_s`` bounds the whole wait (a non-streamed request)."""
    assert svc.hub is not None and svc.client is not None
    record = await svc.client.record(job_id)
    entries, release = svc.hub.entries(
        record,
        keepalive_s=svc.server.keepalive_s,
        principal=who.name,
        max_jobs=svc.server.max_followed_jobs,
    )
    clock = _Clock(job_id, svc.settings.file.gateway.max_wait_s, patience_s)
    calls = 0
    try:
        async for batch in entries:
            for _, fields in batch:
                for happened in _taken(job_id, fields, calls):
                    calls += isinstance(happened, Call)
                    yield happened
                clock.state(fields.get("state"))
                if fields.get("state") in sse.ENDING_STATES:
                    yield await _ending(svc, job_id, fields["state"])
                    return
            await clock.check(svc)
            if not batch:
                yield Quiet
    except sse.Lost as exc:
        raise WireError(
            503,
            f"job {job_id}: the read of its answer failed ({exc}); read it again by id",
            code="read_failed",
        ) from None
    finally:
        release()


def _taken(job_id: str, fields: Mapping[str, str], calls: int) -> list[Happening]:
    """What one entry of the events stream shows: its text, then its whole calls."""
    if fields.get("reset") == "1":
        raise WireError(
            502,
            f"job {job_id}: the answer shown so far was let go "
            f"({fields.get('reason') or 'not what was asked'}); read the job again",
            code="answer_reset",
            headers=NO_RETRY,
        )
    out: list[Happening] = [Text(fields["delta"])] if fields.get("delta") else []
    for i, call in enumerate(json.loads(fields["calls"]) if fields.get("calls") else ()):
        out.append(Call(calls + i, call))
    return out


class _Clock:
    """How long a reader waits: for a job resting on the spill lane, ``wait_s``; at all,
    ``patience_s`` (None: no bound)."""

    def __init__(self, job_id: str, wait_s: float, patience_s: float | None) -> None:
        self.job_id = job_id
        self.wait_s = wait_s
        self.patience_s = patience_s
        self.started = time.monotonic()
        self.spilled_at: float | None = None

    def state(self, state: str | None) -> None:
        if state == JobState.SPILLED:
            self.spilled_at = time.monotonic()
        elif state:
            self.spilled_at = None

    async def check(self, svc: Service) -> None:
        now = time.monotonic()
        if self.spilled_at is not None and now - self.spilled_at >= self.wait_s:
            job = await svc.run(status_dict, svc.store, self.job_id)
            raise WireError(
                504,
                f"job {self.job_id} rests on the spill lane ({job.get('reason')}) and was not "
                f"requeued within {self.wait_s:g} s ([gateway] max_wait_s); read it later by id",
                code="job_spilled",
                headers=NO_RETRY,
            )
        if self.patience_s is not None and now - self.started >= self.patience_s:
            raise WireError(
                504,
                f"job {self.job_id} did not end within {self.patience_s:g} s ([gateway] "
                "max_wait_s); it goes on: read it later by id",
                code="timeout",
                headers=NO_RETRY,
            )


async def _ending(svc: Service, job_id: str, state: str) -> Ended:
    job = await svc.run(status_dict, svc.store, job_id)
    if state == JobState.DONE:
        return Ended(job)
    why = job.get("reason") or job.get("error") or state
    status = 409 if state in ("cancelled", "dropped") else 502
    raise WireError(
        status, f"job {job_id} ended {state}: {why}", code=f"job_{state}", headers=NO_RETRY
    )


async def cancel_on_disconnect(svc: Service, who: Principal, job_id: str) -> None:
    """``[gateway] cancel_on_disconnect``: the client went away, so its job stops."""
    try:
        await svc.run(
            producer.cancel_job,
            svc.store,
            job_id,
            reason=f"cancelled: {who.name}'s client went away ([gateway] cancel_on_disconnect)",
        )
    except InvalidTransition:
        return  # it ended meanwhile
    await svc.run(svc.audit, who, "cancel", job_id, "client disconnected")


# -- usage ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Usage:
    """The answer's usage, as a direct call would report it, and what resumeq billed."""

    input_tokens: int
    output_tokens: int
    cached_input_tokens: int
    reasoning_tokens: int
    extension: dict[str, Any]


def usage(job: Mapping[str, Any]) -> Usage:
    """From the job's view: input as its first attempt sent it, output as the answer's
    tokens (counted, or estimated where the profile counts no other way: ``usage_exact``),
    and the ``resumeq`` extension with what every attempt billed."""
    ledger = job.get("attempts") or []
    summary = job.get("summary") or {}
    first: Mapping[str, Any] = next((a for a in ledger if a.get("input_tokens")), {})
    answer = int(summary.get("output_tokens_persisted") or 0)
    extension = {
        "job_id": job["id"],
        "attempts": len(ledger),
        "billed": {
            "input_tokens": summary.get("input_tokens_billed", 0),
            "cached_input_tokens": summary.get("cached_input_tokens", 0),
            "output_tokens": summary.get("output_tokens_billed", 0),
        },
        "regenerated_tokens": summary.get("regenerated_tokens", 0),
        "usage_exact": bool(job.get("counts_exact")),
        "provider": job.get("provider"),
        "model": job.get("model"),
    }
    return Usage(
        input_tokens=int(first.get("input_tokens") or 0),
        output_tokens=max(answer, 0),
        cached_input_tokens=int(first.get("cached_input_tokens") or 0),
        reasoning_tokens=0,
        extension=extension,
    )


def finish(job: Mapping[str, Any]) -> str:
    """The job's end as ``stop``, ``length``, ``tool_calls`` or ``content_filter``."""
    reason = str(job.get("finish_reason") or "").removeprefix("finish reason ")
    if job.get("tool_calls"):
        return "tool_calls"
    if reason in LIMITED:
        return "length"
    if reason == "content_filter":
        return "content_filter"
    return "stop"


def answered(
    wire: Wire,
    handler: Callable[[Request], Awaitable[Response]],
    rename: Callable[[str], str] = str,
) -> Callable[[Request], Awaitable[Response]]:
    """``handler`` with every error it raises in ``wire``'s shape (``rename``: a job
    spec's field as the wire's parameter)."""

    async def route(request: Request) -> Response:
        try:
            return await handler(request)
        except Exception as exc:
            return as_wire_error(exc, rename).response(wire)

    route.__name__ = getattr(handler, "__name__", "route")
    return route
