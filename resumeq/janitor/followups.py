"""Follow-ups nobody finished: the outboxes their committer left behind (it died between a
commit and what must follow it: the next attempt's enqueue with its due time, the hooks),
carried out in one batch, and those that expired with their job forgotten."""

from __future__ import annotations

from resumeq.janitor.reaper import REAP_BATCH
from resumeq.janitor.steps import Steps, SweepReport
from resumeq.queue import outbox
from resumeq.worker.context import WorkerContext


class FollowUps:
    def __init__(self, ctx: WorkerContext, steps: Steps) -> None:
        self.ctx = ctx
        self.store = ctx.store
        self.steps = steps

    def carry_out(self, report: SweepReport) -> None:
        """Carry out the outboxes their committers left behind, all in one batch."""
        pending = self.steps.safe(report, self._outbox_pending) or []
        followed = self.steps.safe(
            report, outbox.complete_many, self.store, self.ctx.redis, pending
        )
        for job_id, count in zip(pending, followed or [0] * len(pending), strict=True):
            if isinstance(count, Exception):
                self.steps.failed(report, "complete", job_id, count)
            elif count:
                report.followed_up.append(job_id)

    def _outbox_pending(self) -> list[str]:
        return self.store.outbox_pending(outbox.JANITOR_GRACE_MS, limit=REAP_BATCH)
