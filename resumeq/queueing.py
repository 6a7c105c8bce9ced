"""resumeq's attempts as RQ jobs.

Each attempt of a job is its own RQ job, ``<job id>-a<attempt>``, enqueued with RQ's
``unique=True`` so a second enqueue of the same attempt is refused; and even if two ran,
only one could take the lease. RQ jobs carry only the job id, serialized as JSON (never
pickle), and have no RQ timeout: a long stream is never cut by RQ — resumeq's lease is what
detects a dead worker.
"""

from __future__ import annotations

import logging
import math
import time
from datetime import UTC, datetime

import redis
from rq import Queue
from rq.exceptions import DuplicateJobError, InvalidJobOperation, NoSuchJobError
from rq.job import Job, JobStatus
from rq.job_lifecycle import record_job_failure
from rq.registry import CanceledJobRegistry, ScheduledJobRegistry, StartedJobRegistry
from rq.serializers import JSONSerializer

from resumeq.store import check_queue

log = logging.getLogger(__name__)
#: The RQ function that runs one attempt.
ATTEMPT_FUNC = "resumeq.worker.run_attempt"
HOOK_FUNC = "resumeq.hooks.run_hook"
#: RQ keeps a finished attempt's record this long (seconds), for ``rq info`` and dashboards.
RESULT_TTL_S = 3600
FAILURE_TTL_S = 7 * 24 * 3600

#: An attempt RQ started this long ago that has not taken its lease is presumed dead.
STARTED_GRACE_S = 10.0

_ENDED = {JobStatus.FINISHED, JobStatus.FAILED, JobStatus.STOPPED, JobStatus.CANCELED}


def rq_queue(name: str, connection: redis.Redis) -> Queue:
    return Queue(check_queue(name), connection=connection, serializer=JSONSerializer)


def attempt_rq_id(job_id: str, attempt: int) -> str:
    return f"{job_id}-a{attempt}"


def hook_rq_id(job_id: str, hook: str) -> str:
    return f"{job_id}-hook-{hook.replace('.', '_')}"


def enqueue_attempt(
    connection: redis.Redis,
    job_id: str,
    *,
    queue: str,
    attempt: int,
    delay_s: float = 0.0,
) -> bool:
    """Enqueue attempt number ``attempt`` of ``job_id`` (after ``delay_s``).

    Answers False when that attempt is already enqueued (or ran): never twice.
    """
    q = rq_queue(queue, connection)
    options = {
        "job_id": attempt_rq_id(job_id, attempt),
        "job_timeout": -1,
        "result_ttl": RESULT_TTL_S,
        "failure_ttl": FAILURE_TTL_S,
        "description": f"resumeq attempt {attempt} of {job_id}",
        "unique": True,
    }
    try:
        if delay_s > 0:
            # RQ's scheduler keeps whole seconds: round up, so the attempt never starts
            # before the delay (a provider's Retry-After) has passed.
            at = datetime.fromtimestamp(math.ceil(time.time() + delay_s), tz=UTC)
            q.enqueue_at(at, ATTEMPT_FUNC, job_id, **options)
        else:
            q.enqueue(ATTEMPT_FUNC, job_id, **options)
    except DuplicateJobError:
        return False
    return True


def fetch_attempt(connection: redis.Redis, job_id: str, attempt: int) -> Job | None:
    try:
        return Job.fetch(
            attempt_rq_id(job_id, attempt), connection=connection, serializer=JSONSerializer
        )
    except NoSuchJobError:
        return None


def fetch_hook(connection: redis.Redis, job_id: str, hook: str) -> Job | None:
    try:
        return Job.fetch(hook_rq_id(job_id, hook), connection=connection, serializer=JSONSerializer)
    except NoSuchJobError:
        return None


def attempt_pending(connection: redis.Redis, job_id: str, attempt: int) -> bool:
    """Whether the RQ job of that attempt will still run: it is started, scheduled *and* in
    its queue's scheduled registry, or queued *and* on its queue's list. A job RQ calls
    queued but that is on no list was dequeued by a worker that died before starting it;
    one called scheduled but in no registry was half moved by a process that died: RQ
    would find neither, ever."""
    job = fetch_attempt(connection, job_id, attempt)
    if job is None:
        return False
    status = job.get_status(refresh=False)
    if status in _ENDED:
        return False
    if status == JobStatus.QUEUED:
        return rq_queue(job.origin, connection).get_job_position(job.id) is not None
    if status == JobStatus.SCHEDULED:
        registry = ScheduledJobRegistry(  # type: ignore[no-untyped-call]
            job.origin, connection=connection, serializer=JSONSerializer
        )
        return job.id in registry
    if status == JobStatus.STARTED and job.started_at is not None:
        # The first thing an attempt does is take the lease. Started long ago and the job
        # still queued: its work horse died before that, and RQ would notice only when
        # the execution's heartbeat expires, a minute or more later.
        started = job.started_at
        if started.tzinfo is None:
            started = started.replace(tzinfo=UTC)
        return (datetime.now(UTC) - started).total_seconds() < STARTED_GRACE_S
    return True


#: What an attempt's RQ job answers when another attempt (or nobody) goes on with its job
#: and the attempt did not finish its work: RQ keeps it among the canceled, neither
#: finished nor failed.
SUPERSEDED_OUTCOMES = frozenset({"cancelled", "lost"})


def is_attempt(job: Job) -> bool:
    return job.func_name == ATTEMPT_FUNC


def mark_superseded(job: Job) -> bool:
    """Move an attempt's RQ job to RQ's canceled registry (from wherever it is: started,
    finished, failed), so ``rq info`` counts it neither finished nor failed. Answers
    whether it moved."""
    try:
        job.cancel()
    except InvalidJobOperation:  # canceled already
        return False
    return True


def settle_dead_attempt(
    connection: redis.Redis, job_id: str, attempt: int, *, failed: str | None
) -> bool:
    """The RQ job of an attempt whose worker died, once a janitor has decided what becomes
    of the job: RQ-failed with the reason ``failed`` when resumeq failed the job (it needs
    a person), else canceled — the attempt was handed on, which is no failure. Takes it out
    of RQ's started registry either way, so ``rq info`` and dashboards tell the truth
    without waiting for RQ's own cleanup (which would call it failed). Answers whether it
    changed anything."""
    try:
        job = Job.fetch(
            attempt_rq_id(job_id, attempt), connection=connection, serializer=JSONSerializer
        )
    except NoSuchJobError:
        return False
    status = job.get_status(refresh=False)
    if failed is None:
        return status in (JobStatus.STARTED, JobStatus.FAILED) and mark_superseded(job)
    if status not in (JobStatus.STARTED, JobStatus.CANCELED):
        return False
    with connection.pipeline() as pipe:
        if status == JobStatus.STARTED:
            registry = StartedJobRegistry(job.origin, connection=connection,
                                          serializer=JSONSerializer)  # fmt: skip
            registry.remove_executions(job, pipeline=pipe)
        else:
            CanceledJobRegistry(job.origin, connection=connection,
                                serializer=JSONSerializer).remove(job, pipeline=pipe)  # fmt: skip
        record_job_failure(job, failed, pipe)
        pipe.execute()
    return True


def enqueue_overdue(queue: Queue, cutoff_s: int) -> list[str]:
    """Move the queue's scheduled jobs due before ``cutoff_s`` (epoch seconds) onto the
    queue, each in one transaction (off the registry and onto the list together), as RQ's
    scheduler does. Answers the RQ ids moved."""
    registry = ScheduledJobRegistry(queue=queue)  # type: ignore[no-untyped-call]
    moved = []
    for rq_id in registry.get_jobs_to_schedule(cutoff_s):
        job = queue.fetch_job(rq_id)
        with queue.connection.pipeline() as pipe:
            if job is not None:  # what RQ's scheduler calls, for the same one transaction
                queue._enqueue_job(job, pipeline=pipe, at_front=job.should_enqueue_at_front())
            registry.remove(rq_id, pipeline=pipe)
            pipe.execute()
        if job is not None:
            moved.append(rq_id)
    return moved


def discard_if_elsewhere(connection: redis.Redis, job_id: str, attempt: int, queue: str) -> None:
    """An attempt's RQ job waiting on another queue than ``queue`` (the spill lane, after
    an operator requeued the job elsewhere) is deleted, so it can be enqueued where it
    belongs. One that started already is left alone."""
    job = fetch_attempt(connection, job_id, attempt)
    if job is None or job.origin == queue:
        return
    if job.get_status(refresh=False) in (JobStatus.QUEUED, JobStatus.SCHEDULED):
        discard_attempt(connection, job_id, attempt)


def discard_hook(connection: redis.Redis, job_id: str, hook: str) -> None:
    """Delete a hook's RQ job (one whose worker died), so it can be enqueued again."""
    _discard(connection, hook_rq_id(job_id, hook))


def discard_attempt(connection: redis.Redis, job_id: str, attempt: int) -> None:
    """Delete an attempt's RQ job (ended, lost, or parked in the spill queue)."""
    _discard(connection, attempt_rq_id(job_id, attempt))


def _discard(connection: redis.Redis, rq_id: str) -> None:
    try:
        job = Job.fetch(rq_id, connection=connection, serializer=JSONSerializer)
        job.delete()
    except NoSuchJobError:
        return
    except ValueError as exc:
        # RQ refuses to delete a job whose execution record is already gone (its worker
        # died): remove the job's own key, which is all a new enqueue needs.
        log.info("RQ job %s: %s; deleting its key", rq_id, exc)
        connection.delete(Job.key_for(rq_id))
