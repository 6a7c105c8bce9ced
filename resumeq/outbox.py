"""Completing what must follow a commit (SPEC §2).

The script that commits a state change writes, in the same step, what has to happen next
into the job's outbox: ``attempt`` (``<queue>|<attempt>|<due ms>``: enqueue that attempt's
RQ job, at its due time) or ``hook:<name>`` (``<queue>|<times enqueued again>``: run that
hook of the done job). Whoever gets there first carries an entry out: the committer at
once, or a janitor for anything a dead process left. Carrying an entry out twice is
harmless — an attempt's and a hook's RQ job ids are unique — so a crash at any point
between a commit and its follow-up loses nothing and runs nothing twice.

An ``attempt`` entry is removed once its RQ job is enqueued. A ``hook`` entry stays until
the hook has run (the run records it): a hook whose worker died while it ran — its lease
lapsed, its RQ job started long ago or abandoned — is enqueued again, up to
``HOOK_REENQUEUES`` times. A hook that raised is left to RQ's failed registry.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

import redis
from rq.job import Job, JobStatus

from resumeq import failpoints
from resumeq.errors import RedisUnavailable
from resumeq.hooks import enqueue_hook
from resumeq.queueing import (
    STARTED_GRACE_S,
    DueAttempt,
    discard_attempt,
    discard_hook,
    discard_if_elsewhere,
    enqueue_attempt,
    enqueue_attempts,
    fetch_attempts,
    fetch_hook,
    rq_queue,
)
from resumeq.store import Store, redis_errors

log = logging.getLogger(__name__)

#: A janitor leaves an entry this long to the process that committed it.
JANITOR_GRACE_MS = 2_000
#: How often a hook whose worker died is enqueued again before it is given up.
HOOK_REENQUEUES = 5


@dataclass(frozen=True)
class AttemptEntry:
    queue: str
    attempt: int
    due_ms: int

    @classmethod
    def parse(cls, raw: str) -> AttemptEntry:
        queue, attempt, due = raw.split("|")
        return cls(queue, int(attempt), int(due))


def complete(store: Store, connection: redis.Redis, job_id: str) -> int:
    """Carry out the job's outbox entries; answers how many were carried out."""
    done = 0
    entries = store.outbox(job_id)
    if not entries:  # expired with its job, or carried out by another process meanwhile
        store.outbox_prune(job_id)
    for field, raw in entries.items():
        if field == "attempt":
            entry = AttemptEntry.parse(raw)
            discard_if_elsewhere(connection, job_id, entry.attempt, entry.queue)
            enqueue_attempt(
                connection, job_id, queue=entry.queue, attempt=entry.attempt, due_ms=entry.due_ms
            )
        elif field.startswith("hook:"):
            done += _follow_hook(store, connection, job_id, field, raw)
            continue
        else:
            log.warning("job %s: unknown outbox entry %s=%r left alone", job_id, field, raw)
            continue
        failpoints.hit("after_follow_up")
        store.outbox_done(job_id, field, raw)
        done += 1
    return done


def complete_many(
    store: Store, connection: redis.Redis, job_ids: Sequence[str]
) -> list[int | Exception]:
    """:func:`complete` for many jobs, with the same effects, in a few round trips for all
    of them: their outboxes read together, the attempts' RQ jobs enqueued in one pipeline
    (RQ's unique scripts), the entries marked done in another. A job's hooks are followed
    one job at a time, as :func:`complete` does. Answers, for each job, how many entries
    were carried out, or the error that stopped its follow-up (the others go on; Redis out
    of reach is raised)."""
    batch = _Batch(job_ids)
    for index, entries in enumerate(store.outboxes(job_ids)):
        batch.sort(store, connection, index, entries)
    batch.enqueue(connection)
    answers = store.write_many([mark for _, mark, _ in batch.marks])
    for (index, _, counts), answer in zip(batch.marks, answers, strict=True):
        if isinstance(answer, Exception):
            batch.failed[index] = answer
        elif counts:
            batch.done[index] += 1
    return [batch.failed.get(index, count) for index, count in enumerate(batch.done)]


class _Batch:
    """The follow-ups of many jobs, by job index: what was carried out, what failed, the
    attempts due, and the writes that mark entries done (and whether each counts)."""

    def __init__(self, job_ids: Sequence[str]) -> None:
        self.job_ids = job_ids
        self.done = [0] * len(job_ids)
        self.failed: dict[int, Exception] = {}
        self.due: list[tuple[int, str, AttemptEntry]] = []
        self.marks: list[tuple[int, Callable[[Store], object], bool]] = []

    def sort(
        self, store: Store, connection: redis.Redis, index: int, entries: dict[str, str]
    ) -> None:
        """One job's entries: its hooks followed at once, its attempt kept for the
        batch's enqueue."""
        job_id = self.job_ids[index]
        if not entries:  # expired with its job, or carried out by another process meanwhile
            self.marks.append((index, lambda s: s.outbox_prune(job_id), False))
        for field, raw in entries.items():
            if field == "attempt":
                try:
                    self.due.append((index, raw, AttemptEntry.parse(raw)))
                except ValueError as exc:
                    self.failed[index] = exc
                    return
            elif field.startswith("hook:"):
                try:
                    with redis_errors("follow hook"):
                        self.done[index] += _follow_hook(store, connection, job_id, field, raw)
                except RedisUnavailable:
                    raise
                except Exception as exc:  # answered, and logged by the caller
                    self.failed[index] = exc
                    return
            else:
                log.warning("job %s: unknown outbox entry %s=%r left alone", job_id, field, raw)

    def enqueue(self, connection: redis.Redis) -> None:
        """Enqueue the attempts due (one deleted first where it waits on another queue),
        then mark their entries done, enqueued now or before: carried out either way."""
        if not self.due:
            return
        ids = [self.job_ids[index] for index, _, _ in self.due]
        _discard_elsewhere(connection, [(i, e) for i, (_, _, e) in zip(ids, self.due, strict=True)])
        attempts = [
            DueAttempt(job_id, e.queue, e.attempt, e.due_ms)
            for job_id, (_, _, e) in zip(ids, self.due, strict=True)
        ]
        for job_id, (index, raw, _), result in zip(
            ids, self.due, enqueue_attempts(connection, attempts), strict=True
        ):
            if isinstance(result, Exception):
                self.failed[index] = result
            else:
                self.marks.append((index, _marker(job_id, raw), True))
        failpoints.hit("after_follow_up")


def _marker(job_id: str, raw: str) -> Callable[[Store], object]:
    return lambda store: store.outbox_done(job_id, "attempt", raw)


def _discard_elsewhere(connection: redis.Redis, due: Sequence[tuple[str, AttemptEntry]]) -> None:
    """:func:`~resumeq.queueing.discard_if_elsewhere` for many attempts: their RQ jobs read
    in one round trip; the few waiting on another queue deleted one by one."""
    jobs = fetch_attempts(connection, [(job_id, entry.attempt) for job_id, entry in due])
    for (job_id, entry), job in zip(due, jobs, strict=True):
        if job is None or job.origin == entry.queue:
            continue
        if job.get_status(refresh=False) in (JobStatus.QUEUED, JobStatus.SCHEDULED):
            discard_attempt(connection, job_id, entry.attempt)


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


def _follow_hook(store: Store, connection: redis.Redis, job_id: str, field: str, raw: str) -> int:
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
