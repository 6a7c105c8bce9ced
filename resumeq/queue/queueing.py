"""resumeq's attempts as RQ jobs: written once each (:mod:`resumeq.queue.attempt_jobs`, which
needs no RQ), then looked for, settled and deleted through RQ's own objects.

Each attempt of a job is its own RQ job, ``<job id>-a<attempt>``, and a second enqueue of
the same attempt is refused; even if two ran, only one could take the lease.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis
from rq import Queue
from rq.exceptions import InvalidJobOperation, NoSuchJobError
from rq.executions import WORKER_EXECUTIONS_KEY_TEMPLATE, Execution, ExecutionRegistry
from rq.job import Job, JobStatus
from rq.job_lifecycle import record_job_failure
from rq.registry import CanceledJobRegistry, ScheduledJobRegistry, StartedJobRegistry
from rq.serializers import JSONSerializer
from rq.utils import now, utcformat
from rq.worker import Worker
from rq.worker_registration import REDIS_WORKER_KEYS, WORKERS_BY_QUEUE_KEY

from resumeq.core import names
from resumeq.queue import attempt_jobs, due
from resumeq.queue.attempt_jobs import (
    ATTEMPT_FUNC,
    FAILURE_TTL_S,
    RESULT_TTL_S,
    DueAttempt,
    attempt_rq_id,
    enqueue_attempt,
)
from resumeq.store import check_queue, decode, keys

__all__ = [
    "ATTEMPT_FUNC",
    "FAILURE_TTL_S",
    "HOOK_FUNC",
    "RESULT_TTL_S",
    "DueAttempt",
    "attempt_rq_id",
    "enqueue_attempt",
]

log = logging.getLogger(__name__)
HOOK_FUNC = "resumeq.hooks.run_hook"

#: An attempt RQ started this long ago that has not taken its lease is presumed dead.
STARTED_GRACE_S = 10.0

_ENDED = {JobStatus.FINISHED, JobStatus.FAILED, JobStatus.STOPPED, JobStatus.CANCELED}


def rq_queue(name: str, connection: redis.Redis) -> Queue:
    return Queue(check_queue(name), connection=connection, serializer=JSONSerializer)


def attempt_of(rq_id: str) -> tuple[str, int] | None:
    """The job id and attempt an attempt's RQ job id names, or None (another RQ job)."""
    job_id, sep, attempt = rq_id.rpartition("-a")
    if not sep or not attempt.isdigit() or not names.JOB_ID_RE.fullmatch(job_id):
        return None
    return job_id, int(attempt)


def hook_rq_id(job_id: str, hook: str) -> str:
    return f"{job_id}-hook-{hook.replace('.', '_')}"


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
    """Whether the RQ job of that attempt will still run: it is started, scheduled *and*
    in the due-time index (or RQ's scheduled registry), or queued *and* on its queue's
    list. A job RQ calls queued but that is on no list was dequeued by a worker that died
    before starting it; one called scheduled but in no index was half moved by a process
    that died: RQ would find neither, ever."""
    job = fetch_attempt(connection, job_id, attempt)
    if job is None:
        return False
    status = job.get_status(refresh=False)
    if status in _ENDED:
        return False
    if status == JobStatus.QUEUED:
        return rq_queue(job.origin, connection).get_job_position(job.id) is not None
    if status == JobStatus.SCHEDULED:
        return _scheduled(connection, job)
    if status == JobStatus.STARTED and job.started_at is not None:
        # The first thing an attempt does is take the lease. Started long ago and the job
        # still queued: its work horse died before that, and RQ would notice only when
        # the execution's heartbeat expires, a minute or more later.
        started = job.started_at
        if started.tzinfo is None:
            started = started.replace(tzinfo=UTC)
        return (datetime.now(UTC) - started).total_seconds() < STARTED_GRACE_S
    return True


def _scheduled(connection: redis.Redis, job: Job) -> bool:
    """A scheduled attempt waits in resumeq's due-time index, or in RQ's scheduled
    registry (where earlier versions put delayed attempts)."""
    if due.due_at(connection, [job.id])[0] is not None:
        return True
    registry = ScheduledJobRegistry(  # type: ignore[no-untyped-call]
        job.origin, connection=connection, serializer=JSONSerializer
    )
    return job.id in registry


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


def discard_hook(connection: redis.Redis, job_id: str, hook: str) -> None:
    """Delete a hook's RQ job (one whose worker died), so it can be enqueued again."""
    _discard(connection, hook_rq_id(job_id, hook))


def discard_attempt(connection: redis.Redis, job_id: str, attempt: int) -> None:
    """Delete an attempt's RQ job (ended, lost, or parked in the spill queue)."""
    _discard(connection, attempt_rq_id(job_id, attempt))


def discard_waiting(connection: redis.Redis, job_id: str, attempt: int) -> bool:
    """Delete an attempt's RQ job if it waits — on its queue, in the spill lane, in the
    due-time index or RQ's scheduled registry — for a job that was cancelled or purged: a
    worker would pop it as a no-op, and ``rq info`` would count it meanwhile. One a worker
    runs is left to it (it sees the job ended at its first write). Answers whether it
    deleted one. RQ's way: :func:`resumeq.queue.attempt_jobs.discard_waiting` deletes one that
    waits as it was written, without RQ."""
    rq_id = attempt_rq_id(job_id, attempt)
    raw: Any = connection.hget(Job.key_for(rq_id), "status")
    status = _status(raw)
    connection.zrem(keys.DUE, rq_id)
    if status is None or status == JobStatus.STARTED:
        return False  # none (or of a status RQ does not know), or a worker runs it
    _discard(connection, rq_id)
    return True


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


# -- many attempts at once (a janitor after a process died with hundreds of streams) -----
#
# The same effects as the single-attempt functions above, in a few round trips for all.


@dataclass(frozen=True)
class DeadAttempt:
    """The RQ job of an attempt whose worker died, and ``failed``: the reason when resumeq
    failed its job (else None: the job was handed on)."""

    job_id: str
    attempt: int
    failed: str | None = None


def enqueue_attempts(
    connection: redis.Redis, attempts: Sequence[DueAttempt]
) -> list[bool | Exception]:
    """:func:`enqueue_attempt` for many attempts in one round trip (the same script,
    pipelined). For each: True if enqueued, False if that attempt was enqueued already (or
    ran), or the error (a malformed queue name)."""
    out: list[bool | Exception] = []
    sent: dict[int, int] = {}  # the position of an attempt's script reply → its answer
    with connection.pipeline(transaction=False) as pipe:
        for item in attempts:
            try:
                attempt_jobs.write(pipe, item)
                sent[len(pipe.command_stack) - 1] = len(out)
                out.append(False)
            except ValueError as exc:
                out.append(exc)
        replies = pipe.execute() if sent else []
    for position, index in sent.items():
        out[index] = bool(replies[position])
    return out


def fetch_attempts(
    connection: redis.Redis, attempts: Sequence[tuple[str, int]]
) -> list[Job | None]:
    """:func:`fetch_attempt` for many ``(job id, attempt)``, in one round trip."""
    if not attempts:
        return []
    ids = [attempt_rq_id(job_id, attempt) for job_id, attempt in attempts]
    return Job.fetch_many(ids, connection=connection, serializer=JSONSerializer)


def settle_dead_attempts(connection: redis.Redis, dead: Sequence[DeadAttempt]) -> list[bool]:
    """:func:`settle_dead_attempt` for many attempts, in two round trips: each RQ job's
    status, queue and executions read, then one transaction that cancels or fails them all
    as :meth:`Job.cancel` and :func:`record_job_failure` would, each taken out of RQ's
    started registry (a job to fail is read whole first, one by one: a rare case). Answers,
    for each, whether it changed anything."""
    ids = [attempt_rq_id(d.job_id, d.attempt) for d in dead]
    with connection.pipeline(transaction=False) as pipe:
        for rq_id in ids:
            pipe.hmget(Job.key_for(rq_id), "status", "origin")
            pipe.zrange(ExecutionRegistry(rq_id, connection=connection).key, 0, -1)
        replies = pipe.execute() if ids else []
    settled: list[tuple[DeadAttempt, Job, JobStatus, list[Any]]] = []
    changed: list[bool] = []
    for item, rq_id, (status, origin), executions in zip(
        dead, ids, replies[::2], replies[1::2], strict=True
    ):
        was = _status(status) if origin else None
        # Started or failed (by RQ's own clean-up) is canceled; started or canceled (by
        # the worker that saw its work horse die) is failed.
        settles = (
            JobStatus.STARTED,
            JobStatus.FAILED if item.failed is None else JobStatus.CANCELED,
        )
        job = (
            _settled_job(connection, rq_id, decode(origin or b""), item) if was in settles else None
        )
        changed.append(job is not None)
        if job is not None and was is not None:
            settled.append((item, job, was, executions))
    with connection.pipeline() as pipe:
        for item, job, was, executions in settled:
            _settle(pipe, item, job, was, executions)
        if settled:
            pipe.execute()
    return changed


def _status(raw: bytes | None) -> JobStatus | None:
    try:
        return JobStatus(decode(raw)) if raw else None
    except ValueError:  # not a status RQ knows: left alone
        return None


def _settled_job(connection: redis.Redis, rq_id: str, origin: str, item: DeadAttempt) -> Job | None:
    """The RQ job to settle: whole when it is to fail (its failure is recorded with its
    TTLs), else just its id and queue, all that canceling it needs."""
    if item.failed is not None:
        try:
            return Job.fetch(rq_id, connection=connection, serializer=JSONSerializer)
        except NoSuchJobError:
            return None
    job = Job(rq_id, connection=connection, serializer=JSONSerializer)
    job.origin = origin
    return job


def _settle(
    pipe: redis.client.Pipeline, item: DeadAttempt, job: Job, was: JobStatus, executions: list[Any]
) -> None:
    connection = job.connection
    if was == JobStatus.STARTED:
        registry = StartedJobRegistry(job.origin, connection=connection, serializer=JSONSerializer)
        for raw in executions:
            execution = Execution(decode(raw), job.id, connection=connection)
            registry.remove_execution(execution, pipeline=pipe)
    canceled = CanceledJobRegistry(job.origin, connection=connection, serializer=JSONSerializer)
    if item.failed is not None:
        if was == JobStatus.CANCELED:
            canceled.remove(job, pipeline=pipe)
        record_job_failure(job, item.failed, pipe)
        return
    # What Job.cancel does, for a job without dependents or a rate limit.
    if was == JobStatus.FAILED:
        job.failed_job_registry.remove(job, pipeline=pipe)
    job.set_status(JobStatus.CANCELED, pipeline=pipe)
    rq_queue(job.origin, connection).remove(job, pipeline=pipe)
    canceled.add(job, pipeline=pipe)


def attempts_pending(connection: redis.Redis, attempts: Sequence[tuple[str, int]]) -> list[bool]:
    """:func:`attempt_pending` for many ``(job id, attempt)``, in two round trips: their RQ
    jobs read, then where each queued one sits on its queue's list and whether each
    scheduled one is in the due-time index or its queue's scheduled registry."""
    jobs = fetch_attempts(connection, attempts)
    status = [job.get_status(refresh=False) if job is not None else None for job in jobs]
    where: dict[int, list[int]] = {}  # the job's index → its replies'
    with connection.pipeline(transaction=False) as pipe:
        for index, (job, was) in enumerate(zip(jobs, status, strict=True)):
            if job is None or was not in (JobStatus.QUEUED, JobStatus.SCHEDULED):
                continue
            where[index] = [len(pipe.command_stack)]
            if was == JobStatus.QUEUED:
                pipe.lpos(rq_queue(job.origin, connection).key, job.id)
            else:
                registry = ScheduledJobRegistry(  # type: ignore[no-untyped-call]
                    job.origin, connection=connection, serializer=JSONSerializer
                )
                pipe.zscore(keys.DUE, job.id)
                where[index].append(len(pipe.command_stack))
                pipe.zscore(registry.key, job.id)
        replies = pipe.execute() if where else []
    pending: list[bool] = []
    for index, (job, was) in enumerate(zip(jobs, status, strict=True)):
        if job is None or was in _ENDED:
            pending.append(False)
        elif index in where:
            pending.append(any(replies[at] is not None for at in where[index]))
        else:
            pending.append(_started_recently(job) if was == JobStatus.STARTED else True)
    return pending


def _started_recently(job: Job) -> bool:
    """An attempt started less than ``STARTED_GRACE_S`` ago: it may still take its lease."""
    if job.started_at is None:
        return True
    started = job.started_at
    if started.tzinfo is None:
        started = started.replace(tzinfo=UTC)
    return (datetime.now(UTC) - started).total_seconds() < STARTED_GRACE_S


def retire_workers(connection: redis.Redis, names: Sequence[str]) -> list[str]:
    """Retire the RQ registrations of workers found dead, as each would have registered
    its death (a SIGKILL leaves ``rq info`` and rq-dashboard listing a worker, busy, until
    RQ's worker TTL runs out: minutes). The attempts they were running that RQ still counts
    started are settled as canceled first (their jobs were handed on; RQ's own registry
    clean-up would later call them failed). Answers the names that were registered."""
    prefix = Worker.redis_worker_namespace_prefix
    with connection.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.hmget(prefix + name, "queues", "death")
            pipe.smembers(WORKER_EXECUTIONS_KEY_TEMPLATE.format(name))
        replies = pipe.execute() if names else []
    registered: list[tuple[str, list[str]]] = []
    running: list[DeadAttempt] = []
    for name, (queues, death), executions in zip(names, replies[::2], replies[1::2], strict=True):
        if queues is not None and death is None:
            registered.append((name, [q for q in decode(queues).split(",") if q]))
        for composite in executions:
            found = attempt_of(decode(composite).rpartition(":")[0])
            if found is not None:
                running.append(DeadAttempt(*found, failed=None))
    settle_dead_attempts(connection, _still_started(connection, running))
    stamp = utcformat(now())
    with connection.pipeline() as pipe:
        for name, queues in registered:
            key = prefix + name
            pipe.srem(REDIS_WORKER_KEYS, key)
            for queue in queues:
                pipe.srem(WORKERS_BY_QUEUE_KEY % queue, key)
            pipe.hset(key, "death", stamp)
            pipe.expire(key, 60)
            pipe.delete(WORKER_EXECUTIONS_KEY_TEMPLATE.format(name))
        if registered:
            pipe.execute()
    return [name for name, _ in registered]


def _still_started(connection: redis.Redis, attempts: list[DeadAttempt]) -> list[DeadAttempt]:
    """Those of ``attempts`` whose RQ job is still started (one a janitor already settled,
    failed or canceled, is left as it is)."""
    if not attempts:
        return []
    with connection.pipeline(transaction=False) as pipe:
        for item in attempts:
            pipe.hget(Job.key_for(attempt_rq_id(item.job_id, item.attempt)), "status")
        statuses = pipe.execute()
    return [a for a, s in zip(attempts, statuses, strict=True) if _status(s) == JobStatus.STARTED]


def listening_workers(connection: redis.Redis, queue: str) -> int:
    """How many live RQ workers listen on ``queue``: registered on it, their registration
    not expired (RQ's worker TTL) and no death recorded (a janitor records a dead one's)."""
    members = [decode(m) for m in connection.smembers(WORKERS_BY_QUEUE_KEY % queue)]
    if not members:
        return 0
    with connection.pipeline(transaction=False) as pipe:
        for key in members:
            pipe.hmget(key, "birth", "death")
        replies = pipe.execute()
    return sum(birth is not None and death is None for birth, death in replies)
