"""Enqueueing a job: the record first (before any call), with its first attempt in the
outbox; then the attempt's RQ job.

RQ's classes load only where an RQ job is in a state they must judge: an attempt's RQ job
is written, and one that waits is deleted, by resumeq's scripts
(:mod:`resumeq.queue.attempt_jobs`). A new job takes two round trips and nothing of the
outbox's or the hooks' machinery: the create script answers the entry it wrote, and the
script that writes the attempt's RQ job marks that entry done."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import redis

from resumeq.core.errors import JobNotFound
from resumeq.core.models import CreateResult
from resumeq.queue import attempt_jobs, outbox
from resumeq.queue.attempt_jobs import DueAttempt, discard_waiting
from resumeq.store import DEFAULT_QUEUE, Store

if TYPE_CHECKING:
    from resumeq.core.spec import JobSpec


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
    result = store.create(spec, queue=queue, owner=owner, request_hash=request_hash)
    if result.follow_up is None:
        # A job that existed (an idempotency key), or a create sent again: its attempt may
        # have been enqueued since, or wait on another queue. The outbox looks first.
        outbox.complete(store, connection, result.id)
        return result
    # A job created by this very call: no RQ job of it can wait anywhere yet.
    first = DueAttempt.of_entry(result.id, result.follow_up)
    attempt_jobs.write(connection, first, entry=result.follow_up)
    return result


def cancel_job(store: Store, job_id: str, *, reason: str) -> int:
    """Cancel a job that is not terminal, and delete the RQ job of the attempt it was
    waiting for (a queued, delayed or spilled job's); answers the new revision. What a
    worker runs stops at its next write."""
    revision = store.cancel(job_id, reason=reason)
    try:
        attempt = store.get(job_id).attempt
    except JobNotFound:  # purged meanwhile: nothing of it waits
        return revision
    _discard_waiting(store.redis, job_id, attempt + 1)
    return revision


def purge_job(store: Store, job_id: str) -> int:
    """Remove a job that no worker holds, everything it owns, and the RQ job of the attempt
    it was waiting for; answers how many of resumeq's keys were deleted (RQ's failed
    registry keeps its attempts' records: history)."""
    attempt = store.get(job_id).attempt  # JobNotFound for an unknown job
    removed = store.purge(job_id)
    _discard_waiting(store.redis, job_id, attempt + 1)
    return removed


def _discard_waiting(connection: redis.Redis, job_id: str, attempt: int) -> None:
    """The RQ job of the attempt a cancelled or purged job waited for, deleted: by resumeq's
    script where it waits as it was written, else by RQ's own delete."""
    if discard_waiting(connection, job_id, attempt) is None:
        from resumeq.queue.queueing import discard_waiting as by_rq  # noqa: PLC0415

        by_rq(connection, job_id, attempt)
