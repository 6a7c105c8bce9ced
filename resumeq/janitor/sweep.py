"""The janitor (SPEC §9): finds jobs whose worker died and applies the gate for them.

Each sweep:

1. reaps every job whose lease deadline has passed (atomically: one janitor wins each
   job), asks the gate with a ``worker_died`` cut, and requeues a continuation, spills,
   abandons or fails it — writing the dead attempt's ledger record — and settles the dead
   attempt's RQ job: failed with the reason if the job failed, else canceled (handed on).
   A process that dies takes all its streams with it, so this works in batches of up to
   ``REAP_BATCH`` jobs: the gate still decides for each job on its own, but each step's
   Redis I/O (the reaps, the reads, the exits with their ledger records, the next
   attempts' enqueues, RQ's registries) is one pipelined round trip for the whole batch;
2. carries out outbox entries their committer left behind (it died between a commit and
   what must follow it: the next attempt's enqueue with its due time, the hooks), and
   forgets outboxes that expired with their job — in one batch too;
3. finds ``queued`` jobs whose RQ job has vanished (an RQ job that failed before it could
   acquire, one a dying worker dequeued) and enqueues them again, reading the records and
   RQ jobs of all the queued jobs it looks at in a few round trips;
4. enqueues delayed attempts RQ's scheduler is late with;
5. removes the events stream of jobs that ended ``[store] events_grace_s`` ago (their
   followers read the text instead), storing the text compactly;
6. keeps RQ's own started/failed registries tidy, so ``rq info`` tells the truth.

Several janitors may run at once. A failure on one job is logged and the sweep goes on.

:class:`Janitor` holds the loop and the order of the steps; the steps themselves are in the
modules beside this one: :mod:`~resumeq.janitor.reaper` (1, with
:mod:`~resumeq.janitor.accounting` counting what a dead worker streamed and
:mod:`~resumeq.janitor.reaped` its exit's writes), :mod:`~resumeq.janitor.followups` (2),
:mod:`~resumeq.janitor.queues` (3, 4, 6), :mod:`~resumeq.janitor.responses` (the background
responses nobody reads) and :mod:`~resumeq.janitor.liveness` (the looks at the workers'
connections between sweeps); :mod:`~resumeq.janitor.steps` runs each step and reports it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter

from resumeq.core.errors import RedisUnavailable, ReplicaLagging
from resumeq.janitor.accounting import Accounting
from resumeq.janitor.followups import FollowUps
from resumeq.janitor.liveness import LivenessWatch
from resumeq.janitor.queues import QueueKeeper
from resumeq.janitor.reaper import REAP_BATCH, Reaper
from resumeq.janitor.responses import ResponseStopper
from resumeq.janitor.steps import Steps, SweepReport
from resumeq.worker.context import WorkerContext

log = logging.getLogger(__name__)

#: RQ's registries are cleaned at most this often.
REGISTRY_INTERVAL_S = 15.0
#: The oldest entries of the index of every job checked at each registry clean: an entry
#: whose job expired (its retention ran out) goes.
JOBS_INDEX_CHECKED = 500
#: Batches one sweep reaps at most (several processes died at once): the rest wait for
#: the next sweep.
MAX_REAP_BATCHES = 8


class Janitor:
    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self.store = ctx.store
        self.name = f"janitor-{ctx.name}"
        self._last_registry_clean = 0.0
        self.steps = Steps(self.name)
        accounting = Accounting(ctx)
        self.reaper = Reaper(ctx, self.steps, accounting)
        self.follow_ups = FollowUps(ctx, self.steps)
        self.responses = ResponseStopper(ctx, accounting)
        self.queues = QueueKeeper(ctx, self.steps, self.reaper.fail_unreadable)
        self.watch = LivenessWatch(ctx, self.steps, self.reaper)

    @property
    def looks(self) -> bool:
        """False once Redis refused ``CLIENT LIST``: dead workers are found by their leases."""
        return self.watch.looks

    def sweep(self) -> SweepReport:
        report = SweepReport()
        for _ in range(MAX_REAP_BATCHES):
            job_ids = self.steps.safe(report, self.reaper.expired_leases) or []
            resolved = (
                self.steps.safe(report, self.reaper.reap_batch, report, job_ids) if job_ids else 0
            )
            if len(job_ids) < REAP_BATCH or not resolved:
                break  # all expired leases seen, or none of these could be reaped
        self.follow_ups.carry_out(report)
        self.steps.safe(report, self.responses.stop_responses, report)
        self.steps.safe(report, self.queues.requeue_vanished, report)
        self.steps.safe(report, self.queues.enqueue_late_scheduled)
        grace_ms = int(self.store.settings.events_grace_s * 1000)
        for job_id in self.steps.safe(report, self.store.ended_before, grace_ms) or []:
            if self.steps.safe(report, self.store.trim_events, job_id):
                report.trimmed.append(job_id)
        if self.store.replicated:  # followers of a job whose end no replica confirmed
            self.steps.safe(report, self._mark_ended)
        if time.monotonic() - self._last_registry_clean >= REGISTRY_INTERVAL_S:
            self.steps.safe(report, self.queues.clean_registries)
            self.steps.safe(report, self.store.forget_expired, JOBS_INDEX_CHECKED)
            self._last_registry_clean = time.monotonic()
        return report

    def _mark_ended(self) -> None:
        """:meth:`Store.mark_ended`; a replica that does not answer is tried again at the
        next sweep, and does not end this one."""
        try:
            self.store.mark_ended()
        except ReplicaLagging as exc:
            log.warning("%s: %s", self.name, exc)

    def check_liveness(self) -> SweepReport:
        """One look at the workers' connections: :meth:`LivenessWatch.check`."""
        return self.watch.check()

    def run(
        self,
        *,
        interval_s: float,
        stop: threading.Event | None = None,
        max_backoff_s: float = 30.0,
    ) -> None:
        """Sweep every ``interval_s`` until ``stop`` is set, and between sweeps look at the
        workers' connections every ``liveness_interval_ms``. A sweep that cannot reach
        Redis (or is refused by it) stops at the first step that fails and is logged as
        one line; the pause before the next doubles from twice the interval up to
        ``max_backoff_s``, and the first sweep that gets through brings it back to the
        interval."""
        stop = stop or threading.Event()
        log.info("%s sweeping every %.1f s", self.name, interval_s)
        if self.watch.looks:
            self.watch.ask_for_client_list()
        failed = 0
        while not stop.is_set():
            try:
                report = self.sweep()
            except RedisUnavailable as exc:
                failed += 1
                cap = max(max_backoff_s, interval_s)
                pause = min(cap, interval_s * 2.0 ** min(failed, 32))
                log.warning("%s: sweep failed: %s (next sweep in %.1f s)", self.name, exc, pause)
                self.watch.wait(stop, pause)
                continue
            if failed:
                log.info("%s: Redis answers again after %d failed sweep(s)", self.name, failed)
                failed = 0
            if report.reaped or report.requeued or report.followed_up:
                # Hundreds at once when a process died: the outcomes counted, not listed.
                outcomes = (
                    report.outcomes
                    if len(report.outcomes) <= 10
                    else dict(Counter(report.outcomes.values()))
                )
                log.info(
                    "reaped %d job(s) %s, followed up %d commit(s), re-enqueued %d",
                    len(report.reaped),
                    outcomes,
                    len(report.followed_up),
                    len(report.requeued),
                )
            self.watch.wait(stop, interval_s)
