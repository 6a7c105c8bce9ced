"""The outbox's hook entries (:mod:`resumeq.queue.outbox`): a done job's hook enqueued once, and
again if its worker died while it ran, up to :data:`HOOK_REENQUEUES` times."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Literal

import redis
from rq.exceptions import DuplicateJobError
from rq.job import Job, JobStatus

from resumeq.core import failpoints
from resumeq.core.models import JobRecord
from resumeq.queue.queueing import (
    FAILURE_TTL_S,
    HOOK_FUNC,
    RESULT_TTL_S,
    STARTED_GRACE_S,
    discard_hook,
    fetch_hook,
    hook_rq_id,
    rq_queue,
)
from resumeq.store import Store

log = logging.getLogger(__name__)

#: How often a hook whose worker died is enqueued again before it is given up.
HOOK_REENQUEUES = 5

HookState = Literal["ran", "running", "absent", "on_its_way", "raised", "died"]


def _hook_state(store: Store, connection: redis.Redis, job_id: str, name: str) -> HookState:
    if store.hook_ran(job_id, name):
        return "ran"
    if store.hook_running(job_id, name):
        return "running"
    job = fetch_hook(connection, job_id, name)
    if job is None:
        return "absent"
    status = job.get_status(refresh=False)
    if _on_its_way(connection, job, status):
        return "on_its_way"
    return "raised" if status == JobStatus.FAILED and not _died(job) else "died"


def follow_hook(store: Store, connection: redis.Redis, job_id: str, field: str, raw: str) -> int:
    """Enqueue a hook that has not run and is not on its way; answers 1 if it did."""
    name = field.removeprefix("hook:")
    queue, _, again_raw = raw.rpartition("|")
    again = int(again_raw or 0)
    state = _hook_state(store, connection, job_id, name)
    if state in ("running", "on_its_way"):
        return 0
    if state == "absent":
        enqueue_hook(connection, job_id, name, queue=queue)
        failpoints.hit("after_follow_up")
        return 1
    if state == "died" and again < HOOK_REENQUEUES:
        log.info("job %s: hook %s died while it ran: enqueued again", job_id, name)
        discard_hook(connection, job_id, name)
        enqueue_hook(connection, job_id, name, queue=queue)
        store.outbox_replace(job_id, field, raw, f"{queue}|{again + 1}")
        return 1
    if state == "raised":
        log.warning("job %s: hook %s raised; left in RQ's failed registry", job_id, name)
    elif state == "died":
        log.warning("job %s: hook %s died %d times; given up", job_id, name, again)
    store.outbox_done(job_id, field, raw)  # ran, raised, or given up: nothing more to do
    return 0


def _on_its_way(connection: redis.Redis, job: Job, status: JobStatus | None) -> bool:
    """Queued on its queue, scheduled in its registry, or started only a moment ago (it
    takes its lease first thing)."""
    if status == JobStatus.QUEUED:
        return rq_queue(job.origin, connection).get_job_position(job.id) is not None
    if status in (JobStatus.SCHEDULED, JobStatus.DEFERRED):
        return True
    if status == JobStatus.STARTED and job.started_at is not None:
        started = job.started_at
        if started.tzinfo is None:
            started = started.replace(tzinfo=UTC)
        return (datetime.now(UTC) - started).total_seconds() < STARTED_GRACE_S
    return status == JobStatus.FINISHED


def _died(job: Job) -> bool:
    """An RQ job that failed because its worker died, not because the hook raised."""
    reason = job.exc_info or ""
    return "AbandonedJobError" in reason or "terminated unexpectedly" in reason


def enqueue_hook(connection: redis.Redis, job_id: str, name: str, *, queue: str) -> bool:
    """Enqueue the RQ job of one hook of a done job; answers whether it was new (a hook's RQ
    job id is unique: enqueueing it again adds nothing)."""
    try:
        rq_queue(queue, connection).enqueue(
            HOOK_FUNC,
            job_id,
            name,
            job_id=hook_rq_id(job_id, name),
            description=f"hook {name} of {job_id}",
            result_ttl=RESULT_TTL_S,
            failure_ttl=FAILURE_TTL_S,
            unique=True,
        )
    except DuplicateJobError:
        return False
    return True


def enqueue_hooks(connection: redis.Redis, record: JobRecord, *, queue: str | None = None) -> int:
    """Enqueue one RQ job per hook of a done job (on ``queue``, default the job's); answers
    how many were new."""
    target = queue or record.queue
    return sum(
        enqueue_hook(connection, record.id, name, queue=target) for name in record.spec.hooks
    )
