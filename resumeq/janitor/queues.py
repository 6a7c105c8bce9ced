"""What the janitor keeps right on RQ's side: ``queued`` jobs whose RQ job vanished are
enqueued again, delayed attempts RQ's scheduler is late with are enqueued, and RQ's own
started/failed registries are kept tidy, so ``rq info`` tells the truth."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

from rq.registry import clean_registries

from resumeq.core.errors import CorruptRecord, JobNotFound
from resumeq.core.models import JobRecord, JobState
from resumeq.janitor.steps import Steps, SweepReport
from resumeq.queue import due
from resumeq.queue.queueing import (
    attempts_pending,
    discard_attempt,
    enqueue_attempt,
    enqueue_overdue,
    rq_queue,
)
from resumeq.store import SPILL_QUEUE
from resumeq.worker.context import WorkerContext

log = logging.getLogger(__name__)

#: A queued job younger than this may still be on its way into RQ.
VANISHED_GRACE_MS = 5_000
#: A delayed attempt this late is enqueued by the janitor itself.
SCHEDULE_GRACE_S = 3.0


class QueueKeeper:
    """``fail_unreadable`` fails a job whose record cannot be read back (the reaper's)."""

    def __init__(
        self,
        ctx: WorkerContext,
        steps: Steps,
        fail_unreadable: Callable[[str, CorruptRecord], str],
    ) -> None:
        self.ctx = ctx
        self.store = ctx.store
        self.steps = steps
        self._fail_unreadable = fail_unreadable

    def requeue_vanished(self, report: SweepReport) -> None:
        """Enqueue again the ``queued`` jobs whose RQ job vanished: their records, outboxes
        and RQ jobs read in a few round trips for all of them (a backlog of queued jobs
        waiting for workers is looked at every sweep)."""
        job_ids = self.store.queued_before(VANISHED_GRACE_MS)
        queued: list[JobRecord] = []
        for job_id, record in zip(job_ids, self.store.records(job_ids), strict=True):
            if isinstance(record, CorruptRecord):
                self.steps.safe(report, self._fail_unreadable, job_id, record)
            elif isinstance(record, JobNotFound):
                self.steps.safe(report, self._forget_missing, job_id)
            elif isinstance(record, Exception):
                self.steps.failed(report, "get", job_id, record)
            elif record.state is JobState.QUEUED:
                queued.append(record)
        outboxes = self.store.outboxes([record.id for record in queued])
        # A job whose commit's follow-up is pending is left to its outbox (enqueued on time).
        queued = [
            r for r, entries in zip(queued, outboxes, strict=True) if "attempt" not in entries
        ]
        pending = attempts_pending(self.ctx.redis, [(r.id, r.attempt + 1) for r in queued])
        for record, waiting in zip(queued, pending, strict=True):
            if not waiting and self.steps.safe(report, self._enqueue_again, record):
                report.requeued.append(record.id)

    def _forget_missing(self, job_id: str) -> None:
        """Half deleted: the index outlived the record. fail_unreadable cleans the index."""
        with contextlib.suppress(JobNotFound):
            self.store.fail_unreadable(job_id, reason="job record missing")

    def _enqueue_again(self, record: JobRecord) -> bool:
        attempt = record.attempt + 1
        discard_attempt(self.ctx.redis, record.id, attempt)
        requeued = enqueue_attempt(self.ctx.redis, record.id, queue=record.queue, attempt=attempt)
        if requeued:
            log.info("job %s was queued without an RQ job: enqueued attempt %d", record.id, attempt)
        return requeued

    def _queues(self) -> set[str]:
        return {*self.ctx.settings.file.worker.queues, SPILL_QUEUE}

    def clean_registries(self) -> None:
        for name in self._queues():
            clean_registries(rq_queue(name, self.ctx.redis))

    def enqueue_late_scheduled(self) -> None:
        """Delayed attempts that are due, from resumeq's due-time index (the workers' own
        schedulers move them to the millisecond; this sweep is for when none runs); and
        those overdue by ``SCHEDULE_GRACE_S`` in RQ's scheduled registry (earlier versions
        put them there): RQ's scheduler lives in one worker and, if that worker died, nobody
        takes its lock over for a minute or two. A doubled enqueue is harmless: only one run
        can take the job's lease."""
        moved = due.promote_all(self.ctx.redis)
        if moved:
            log.info("moved %d due attempt(s) onto their queues", moved)
        cutoff = int(time.time() - SCHEDULE_GRACE_S)
        for name in self._queues():
            for rq_id in enqueue_overdue(rq_queue(name, self.ctx.redis), cutoff):
                log.info("enqueued overdue scheduled attempt %s", rq_id)
