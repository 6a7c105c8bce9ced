"""Completing what must follow a commit (SPEC §2).

The script that commits a state change writes, in the same step, what has to happen next
into the job's outbox: ``attempt`` (``<queue>|<attempt>|<due ms>``: enqueue that attempt's
RQ job, at its due time) or ``hook:<name>`` (``<queue>|<times enqueued again>``: run that
hook of the done job). Whoever gets there first carries an entry out: the committer at
once, or a janitor for anything a dead process left. Carrying an entry out twice is
harmless — an attempt's and a hook's RQ job ids are unique — so a crash at any point
between a commit and its follow-up loses nothing and runs nothing twice.

An ``attempt`` entry is removed once its RQ job is enqueued (a new job's by the script that
writes that RQ job, given the entry: :func:`resumeq.queue.attempt_jobs.write`, without this
module). A ``hook`` entry stays until the hook has run (the run records it): a hook whose
worker died while it ran — its lease lapsed, its RQ job started long ago or abandoned — is
enqueued again, up to ``HOOK_REENQUEUES`` times (:mod:`resumeq.queue.outbox_hooks`). A hook
that raised is left to RQ's failed registry.

An attempt is enqueued without loading RQ (:mod:`resumeq.queue.attempt_jobs`): RQ loads here only
to follow a hook, to delete an attempt's RQ job that waits elsewhere, or for a janitor's
batch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import redis

from resumeq.core import failpoints
from resumeq.core.errors import RedisUnavailable
from resumeq.queue import attempt_jobs
from resumeq.queue.attempt_jobs import DueAttempt
from resumeq.store import Store, redis_errors

log = logging.getLogger(__name__)

#: A janitor leaves an entry this long to the process that committed it.
JANITOR_GRACE_MS = 2_000


def complete(store: Store, connection: redis.Redis, job_id: str) -> int:
    """Carry out the job's outbox entries; answers how many were carried out."""
    done = 0
    entries = store.outbox(job_id)
    if not entries:  # expired with its job, or carried out by another process meanwhile
        store.outbox_prune(job_id)
    for field, raw in entries.items():
        if field == "attempt":
            entry = DueAttempt.of_entry(job_id, raw)
            if attempt_jobs.waiting_elsewhere(connection, job_id, entry.attempt, entry.queue):
                from resumeq.queue.queueing import discard_attempt  # noqa: PLC0415

                discard_attempt(connection, job_id, entry.attempt)
            attempt_jobs.write(connection, entry)
        elif field.startswith("hook:"):
            from resumeq.queue.outbox_hooks import follow_hook  # noqa: PLC0415

            done += follow_hook(store, connection, job_id, field, raw)
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
        self.due: list[tuple[int, str, DueAttempt]] = []
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
                    self.due.append((index, raw, DueAttempt.of_entry(job_id, raw)))
                except ValueError as exc:
                    self.failed[index] = exc
                    return
            elif field.startswith("hook:"):
                from resumeq.queue.outbox_hooks import follow_hook  # noqa: PLC0415

                try:
                    with redis_errors("follow hook"):
                        self.done[index] += follow_hook(store, connection, job_id, field, raw)
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
        from resumeq.queue.queueing import enqueue_attempts  # noqa: PLC0415

        attempts = [entry for _, _, entry in self.due]
        _discard_elsewhere(connection, attempts)
        for (index, raw, entry), result in zip(
            self.due, enqueue_attempts(connection, attempts), strict=True
        ):
            if isinstance(result, Exception):
                self.failed[index] = result
            else:
                self.marks.append((index, _marker(entry.job_id, raw), True))
        failpoints.hit("after_follow_up")


def _marker(job_id: str, raw: str) -> Callable[[Store], object]:
    return lambda store: store.outbox_done(job_id, "attempt", raw)


def _discard_elsewhere(connection: redis.Redis, due: Sequence[DueAttempt]) -> None:
    """What :func:`complete` does with an attempt's RQ job waiting on another queue, for
    many attempts: their RQ jobs read in one round trip; the few waiting on another queue
    deleted one by one."""
    from rq.job import JobStatus  # noqa: PLC0415

    from resumeq.queue.queueing import discard_attempt, fetch_attempts  # noqa: PLC0415

    jobs = fetch_attempts(connection, [(entry.job_id, entry.attempt) for entry in due])
    for entry, job in zip(due, jobs, strict=True):
        if job is None or job.origin == entry.queue:
            continue
        if job.get_status(refresh=False) in (JobStatus.QUEUED, JobStatus.SCHEDULED):
            discard_attempt(connection, entry.job_id, entry.attempt)
