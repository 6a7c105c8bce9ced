"""The janitor (SPEC §9): finds jobs whose worker died and applies the gate for them.

Each sweep:

1. reaps every job whose lease deadline has passed (atomically: one janitor wins each
   job), asks the gate with a ``worker_died`` cut, and requeues a continuation, spills,
   abandons or fails it — writing the dead attempt's ledger record — and settles the dead
   attempt's RQ job: failed with the reason if the job failed, else canceled (handed on);
2. carries out outbox entries their committer left behind (it died between a commit and
   what must follow it: the next attempt's enqueue with its due time, the hooks), and
   forgets outboxes that expired with their job;
3. finds ``queued`` jobs whose RQ job has vanished (an RQ job that failed before it could
   acquire, one a dying worker dequeued) and enqueues them again;
4. enqueues delayed attempts RQ's scheduler is late with;
5. removes the events stream of jobs that ended ``[store] events_grace_s`` ago (their
   followers read the text instead), storing the text compactly;
6. keeps RQ's own started/failed registries tidy, so ``rq info`` tells the truth.

Several janitors may run at once. A failure on one job is logged and the sweep goes on.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar, TypeVarTuple

from rq.registry import clean_registries

from resumeq import outbox
from resumeq.context import WorkerContext
from resumeq.counting import estimate
from resumeq.errors import (
    ConfigError,
    CorruptRecord,
    JobNotFound,
    RedisUnavailable,
    ResumeqError,
    WriteRefused,
)
from resumeq.exits import apply_decision
from resumeq.gate import Cut, JobView, decide, pacing
from resumeq.ledger import AttemptRecord
from resumeq.models import JobRecord, JobState, Lease
from resumeq.queueing import (
    attempt_pending,
    discard_attempt,
    enqueue_attempt,
    enqueue_overdue,
    rq_queue,
    settle_dead_attempt,
)
from resumeq.store import SPILL_QUEUE, redis_errors

log = logging.getLogger(__name__)

R = TypeVar("R")
Ts = TypeVarTuple("Ts")

#: A queued job younger than this may still be on its way into RQ.
VANISHED_GRACE_MS = 5_000
#: A delayed attempt this late is enqueued by the janitor itself.
SCHEDULE_GRACE_S = 3.0
#: The estimate's ratio for a job whose provider profile this janitor does not know: the
#: lowest default of any kind, so that it errs high.
MIN_BYTES_PER_TOKEN = 2.0
#: RQ's registries are cleaned at most this often.
REGISTRY_INTERVAL_S = 15.0


@dataclass
class SweepReport:
    reaped: list[str] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)
    #: Jobs whose outbox this sweep carried out.
    followed_up: list[str] = field(default_factory=list)
    #: Ended jobs whose events stream this sweep removed (their text kept compactly).
    trimmed: list[str] = field(default_factory=list)
    outcomes: dict[str, str] = field(default_factory=dict)
    errors: int = 0


class Janitor:
    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self.store = ctx.store
        self.name = f"janitor-{ctx.name}"
        self._last_registry_clean = 0.0

    def sweep(self) -> SweepReport:
        report = SweepReport()
        for job_id in self._safe(report, self.store.expired_leases) or []:
            outcome = self._safe(report, self._reap, job_id)
            if outcome:
                report.reaped.append(job_id)
                report.outcomes[job_id] = outcome
        for job_id in self._safe(report, self.store.outbox_pending, outbox.JANITOR_GRACE_MS) or []:
            if self._safe(report, outbox.complete, self.store, self.ctx.redis, job_id):
                report.followed_up.append(job_id)
        for job_id in self._safe(report, self.store.queued_before, VANISHED_GRACE_MS) or []:
            if self._safe(report, self._requeue_vanished, job_id):
                report.requeued.append(job_id)
        self._safe(report, self._enqueue_late_scheduled)
        grace_ms = int(self.store.settings.events_grace_s * 1000)
        for job_id in self._safe(report, self.store.ended_before, grace_ms) or []:
            if self._safe(report, self.store.trim_events, job_id):
                report.trimmed.append(job_id)
        if time.monotonic() - self._last_registry_clean >= REGISTRY_INTERVAL_S:
            self._safe(report, self._clean_registries)
            self._last_registry_clean = time.monotonic()
        return report

    def run(
        self,
        *,
        interval_s: float,
        stop: threading.Event | None = None,
        max_backoff_s: float = 30.0,
    ) -> None:
        """Sweep every ``interval_s`` until ``stop`` is set. A sweep that cannot reach Redis
        (or is refused by it) stops at the first step that fails and is logged as one line;
        the pause before the next doubles from twice the interval up to ``max_backoff_s``,
        and the first sweep that gets through brings it back to the interval."""
        stop = stop or threading.Event()
        log.info("%s sweeping every %.1f s", self.name, interval_s)
        failed = 0
        while not stop.is_set():
            try:
                report = self.sweep()
            except RedisUnavailable as exc:
                failed += 1
                cap = max(max_backoff_s, interval_s)
                pause = min(cap, interval_s * 2.0 ** min(failed, 32))
                log.warning("%s: sweep failed: %s (next sweep in %.1f s)", self.name, exc, pause)
                stop.wait(pause)
                continue
            if failed:
                log.info("%s: Redis answers again after %d failed sweep(s)", self.name, failed)
                failed = 0
            if report.reaped or report.requeued or report.followed_up:
                log.info(
                    "reaped %d job(s) %s, followed up %d commit(s), re-enqueued %d",
                    len(report.reaped),
                    report.outcomes,
                    len(report.followed_up),
                    len(report.requeued),
                )
            stop.wait(interval_s)

    def _safe(self, report: SweepReport, fn: Callable[[*Ts], R], *args: *Ts) -> R | None:
        """Run one step of a sweep: a failure is logged as one line (a traceback only for
        what resumeq does not expect) and the sweep goes on, except when Redis cannot be
        reached: that is raised, and ends the sweep (every further step would fail too)."""
        name = getattr(fn, "__name__", "sweep step")
        try:
            with redis_errors(name.lstrip("_")):
                return fn(*args)
        except RedisUnavailable:
            raise
        except (ResumeqError, ValueError, OSError) as exc:
            report.errors += 1
            log.warning("%s: %s%s failed: %s", self.name, name, args, exc)
        except Exception:
            report.errors += 1
            log.exception("%s: %s%s failed", self.name, name, args)
        return None

    def _fail_unreadable(self, job_id: str, exc: CorruptRecord) -> str:
        log.warning("job %s cannot be read back, marking it failed: %s", job_id, exc)
        self.store.fail_unreadable(job_id, reason=f"corrupt job record: {exc}")
        return "failed"

    def _reap(self, job_id: str) -> str | None:
        ttl_ms = self.ctx.settings.file.worker.lease_ttl_ms
        try:
            result = self.store.reap(job_id, janitor=self.name, ttl_ms=ttl_ms)
        except CorruptRecord as exc:
            return self._fail_unreadable(job_id, exc)
        if result.acquired is None:
            return None
        lease, record = result.acquired.lease, result.acquired.record
        text_bytes = self.store.text_bytes(job_id)
        counted = self._count_dead_attempt(lease, record, text_bytes)
        spent = record.attempt_spent_base + counted
        progressed = counted > 0 or text_bytes > record.attempt_text_base
        view = JobView(
            budget_tokens=record.budget_tokens,
            floor_tokens=record.floor_tokens,
            spent_output_tokens=spent,
            prefix_chars=text_bytes,
            attempts=record.attempt,
            spill_count=record.spill_count,
            counts_exact=record.counts_exact,
            require_exact_counts=record.spec.require_exact_counts,
            byte_exact=record.spec.byte_exact,
            exit=record.spec.exit,
            **pacing(
                record,
                progressed=progressed,
                window_s=self.ctx.settings.file.worker.retry_window_s,
                now_ms=int(time.time() * 1000),
            ),
        )
        decision = decide(view, Cut(kind="worker_died"))
        owner = (record.stalled_owner or "").split(":")
        entry = AttemptRecord(
            attempt=record.attempt,
            kind=record.attempt_kind,
            worker=owner[1] if len(owner) > 2 else "unknown",
            started_ms=record.attempt_started_ms,
            ended_ms=record.updated_ms,
            outcome=decision.action,
            cut="worker_died",
            detail="lease expired; reaped by " + self.name,
            provider=record.spec.provider,
            prefix_tokens=record.attempt_spent_base,
            output_tokens_persisted=counted,
            # Its text is what follows the attempt's base (a character boundary: where
            # the previous attempt's text ended).
            chars_persisted=len(
                self.store.text(job_id)
                .encode()[record.attempt_text_base :]
                .decode(errors="replace")
            ),
            bytes_persisted=text_bytes - record.attempt_text_base,
            count_source="usage" if record.counts_exact else "estimate",
            counts_exact=record.counts_exact,
            # What it had in flight when it died was billed and never counted.
            billed_lower_bound=True,
        )
        try:
            outcome = apply_decision(
                self.store,
                self.ctx.redis,
                lease,
                record,
                decision,
                ledger=entry.to_json_dict(),
                progressed=progressed,
            )
        except WriteRefused as exc:
            log.info("job %s changed while being reaped: %s", job_id, exc)
            return None
        failed = None
        if outcome == JobState.FAILED.value:
            error = self.store.get(job_id).error
            failed = f"resumeq failed job {job_id} after its worker died: {error}"
        settle_dead_attempt(self.ctx.redis, job_id, record.attempt, failed=failed)
        return outcome

    def _count_dead_attempt(self, lease: Lease, record: JobRecord, text_bytes: int) -> int:
        """The dead attempt's output tokens. Counted exactly, they stand; counted chunk by
        chunk (a lower bound), the cursor is raised to an estimate that errs high from the
        text it stored and the reasoning it saw, so the continuation cannot buy past the
        budget."""
        counted = record.spent_output_tokens - record.attempt_spent_base
        if record.counts_exact:
            return counted
        try:
            ratio = self.ctx.settings.profile(record.spec.provider).bytes_per_token
        except ConfigError:
            ratio = MIN_BYTES_PER_TOKEN
        output = text_bytes - record.attempt_text_base + record.attempt_hidden_bytes
        guess = estimate(0, output, counted=counted, bytes_per_token=ratio)
        if guess > counted:
            self.store.flush(
                lease,
                expected_revision=record.revision,
                delta="",
                tokens=guess - counted,
                exact=False,
            )
            log.info(
                "job %s: the dead attempt's %d counted tokens raised to an estimate of %d",
                record.id,
                counted,
                guess,
            )
        return guess

    def _requeue_vanished(self, job_id: str) -> bool:
        try:
            record = self.store.get(job_id)
        except CorruptRecord as exc:
            self._fail_unreadable(job_id, exc)
            return False
        except JobNotFound:
            # Half deleted: the index outlived the record. fail_unreadable cleans the index.
            with contextlib.suppress(JobNotFound):
                self.store.fail_unreadable(job_id, reason="job record missing")
            return False
        if record.state is not JobState.QUEUED:
            return False
        if "attempt" in self.store.outbox(job_id):
            return False  # its commit's follow-up is pending: the outbox enqueues it, on time
        attempt = record.attempt + 1
        if attempt_pending(self.ctx.redis, job_id, attempt):
            return False
        discard_attempt(self.ctx.redis, job_id, attempt)
        requeued = enqueue_attempt(self.ctx.redis, job_id, queue=record.queue, attempt=attempt)
        if requeued:
            log.info("job %s was queued without an RQ job: enqueued attempt %d", job_id, attempt)
        return requeued

    def _queues(self) -> set[str]:
        return {*self.ctx.settings.file.worker.queues, SPILL_QUEUE}

    def _clean_registries(self) -> None:
        for name in self._queues():
            clean_registries(rq_queue(name, self.ctx.redis))

    def _enqueue_late_scheduled(self) -> None:
        """Delayed attempts overdue by ``SCHEDULE_GRACE_S``: RQ's scheduler lives in one
        worker and, if that worker died, nobody takes its lock over for a minute or two.
        A doubled enqueue is harmless: only one run can take the job's lease."""
        cutoff = int(time.time() - SCHEDULE_GRACE_S)
        for name in self._queues():
            for rq_id in enqueue_overdue(rq_queue(name, self.ctx.redis), cutoff):
                log.info("enqueued overdue scheduled attempt %s", rq_id)
