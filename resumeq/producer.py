"""Enqueueing a job: the record first (before any call), with its first attempt in the
outbox; then the attempt's RQ job.

RQ loads only where an RQ job is written or looked for: the cancel of a job that is gone,
or had ended, is answered without it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import redis

from resumeq.errors import JobNotFound
from resumeq.models import CreateResult
from resumeq.store import DEFAULT_QUEUE, Store

if TYPE_CHECKING:
    from resumeq.spec import JobSpec


def enqueue_job(
    store: Store,
    connection: redis.Redis,
    spec: JobSpec | Mapping[str, Any],
    *,
    queue: str = DEFAULT_QUEUE,
    owner: str | None = None,
    request_hash: str | None = None,
) -> CreateResult:
    """Validate and write the job record, then enqueue attempt 1.

    With an idempotency key a second call answers the first job (and makes sure its first
    attempt was enqueued). If the process dies between the two steps, the janitor carries
    the outbox out.
    """
    from resumeq import outbox  # noqa: PLC0415

    result = store.create(spec, queue=queue, owner=owner, request_hash=request_hash)
    outbox.complete(store, connection, result.id)
    return result


def cancel_job(store: Store, job_id: str, *, reason: str) -> int:
    """Cancel a job that is not terminal, and delete the RQ job of the attempt it was
    waiting for (:func:`~resumeq.queueing.discard_waiting`: a queued, delayed or spilled
    job's); answers the new revision. What a worker runs stops at its next write."""
    revision = store.cancel(job_id, reason=reason)
    try:
        attempt = store.get(job_id).attempt
    except JobNotFound:  # purged meanwhile: nothing of it waits
        return revision
    from resumeq.queueing import discard_waiting  # noqa: PLC0415

    discard_waiting(store.redis, job_id, attempt + 1)
    return revision


def purge_job(store: Store, job_id: str) -> int:
    """Remove a job that no worker holds, everything it owns, and the RQ job of the attempt
    it was waiting for; answers how many of resumeq's keys were deleted (RQ's failed
    registry keeps its attempts' records: history)."""
    attempt = store.get(job_id).attempt  # JobNotFound for an unknown job
    removed = store.purge(job_id)
    from resumeq.queueing import discard_waiting  # noqa: PLC0415

    discard_waiting(store.redis, job_id, attempt + 1)
    return removed
