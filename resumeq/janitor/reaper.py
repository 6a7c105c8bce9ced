"""The reaper: takes over the jobs whose worker died (their lease expired, or their worker's
connections all closed), one janitor each, and applies the gate for them with a
``worker_died`` cut — the dead attempt counted, its exit committed with its ledger record,
what follows carried out, its RQ job settled and a background response nobody reads on
stopped. It works in batches of up to :data:`REAP_BATCH` jobs: the gate still decides for
each job on its own, but each step's Redis I/O is one pipelined round trip for the batch."""

from __future__ import annotations

import logging
import time
from typing import Any

from resumeq.core import failpoints
from resumeq.core.errors import CorruptRecord, SpillExhausted, WriteRefused
from resumeq.core.gate import Cut, Decision, JobView, decide, pacing
from resumeq.core.ledger import AttemptRecord
from resumeq.core.models import lease_holder
from resumeq.janitor.accounting import Accounting
from resumeq.janitor.reaped import Reaped
from resumeq.janitor.steps import Steps, SweepReport
from resumeq.providers import background
from resumeq.queue import outbox
from resumeq.queue.queueing import DeadAttempt, settle_dead_attempts
from resumeq.worker.context import WorkerContext

log = logging.getLogger(__name__)

#: Expired leases reaped together: each step of a batch is one pipelined round trip.
REAP_BATCH = 500


class Reaper:
    """Reaps for one janitor: its name is on the leases it takes and in the ledger."""

    def __init__(self, ctx: WorkerContext, steps: Steps, accounting: Accounting) -> None:
        self.ctx = ctx
        self.store = ctx.store
        self.steps = steps
        self.accounting = accounting
        self.name = steps.name

    def expired_leases(self) -> list[str]:
        return self.store.expired_leases(limit=REAP_BATCH)

    def reap_batch(
        self, report: SweepReport, job_ids: list[str], dead_tokens: dict[str, str] | None = None
    ) -> int:
        """Reap ``job_ids`` (each is taken by one janitor only), ask the gate for each job
        it took, apply every exit with its ledger record, carry out what follows (the next
        attempts' RQ jobs) and settle the dead attempts' RQ jobs — each step one round trip
        for all the jobs still in the batch. A job whose step fails is logged and left
        out of the steps after it (a reaped job is reaped again once the janitor's lease
        lapses). Answers how many of ``job_ids`` were reaped, found alive or gone."""
        dead, resolved = self._reap(report, job_ids, dead_tokens)
        if not dead:
            return resolved
        texts = self.store.attempt_texts([(d.job_id, d.record.attempt_text_base) for d in dead])
        for d, (size, tail) in zip(dead, texts, strict=True):
            d.text_bytes, d.tail = size, tail
        for d in dead:
            d.counted, d.tokens = self.accounting.dead_attempt_tokens(
                d.record, d.text_bytes, d.tail
            )
        dead = [d for d in dead if self._judge(report, d)]
        for d in dead:
            self.steps.safe(report, self.accounting.count_released, d)
            self.steps.safe(report, self.accounting.count_regenerated, d)
        dead = self._flush_counts(report, dead)
        dead = self._commit(report, dead)
        if not dead:
            return resolved
        failpoints.hit("after_commit")
        ids = [d.job_id for d in dead]
        followed = self.steps.safe(report, outbox.complete_many, self.store, self.ctx.redis, ids)
        for d, count in zip(dead, followed or [0] * len(dead), strict=True):
            if isinstance(count, Exception):  # left in its outbox, for the next sweep
                self.steps.failed(report, "complete", d.job_id, count)
        settling = [DeadAttempt(d.job_id, d.record.attempt, failed=d.rq_failure) for d in dead]
        self.steps.safe(report, settle_dead_attempts, self.ctx.redis, settling)
        for d in dead:
            report.reaped.append(d.job_id)
            report.outcomes[d.job_id] = d.state
        # An exit that reads nobody's response on: its provider-side generation is stopped.
        stopping = [
            found
            for d in dead
            if d.state not in ("queued", "done") and (found := background.response_of(d.record))
        ]
        self.steps.safe(report, self.store.stop_responses, stopping)
        return resolved

    def _reap(
        self, report: SweepReport, job_ids: list[str], dead_tokens: dict[str, str] | None = None
    ) -> tuple[list[Reaped], int]:
        """The jobs this janitor took over (a corrupt record is failed at once), and how
        many of ``job_ids`` were reaped, found alive or gone."""
        ttl_ms = self.ctx.settings.file.worker.lease_ttl_ms
        dead: list[Reaped] = []
        resolved = 0
        reaps = self.store.reap_many(
            job_ids, janitor=self.name, ttl_ms=ttl_ms, dead_tokens=dead_tokens
        )
        for job_id, result in zip(job_ids, reaps, strict=True):
            if isinstance(result, CorruptRecord):
                if self.steps.safe(report, self.fail_unreadable, job_id, result):
                    report.reaped.append(job_id)
                    report.outcomes[job_id] = "failed"
                    resolved += 1
            elif isinstance(result, Exception):
                self.steps.failed(report, "reap", job_id, result)
            else:
                resolved += 1
                if result.acquired is not None:
                    dead.append(Reaped(result.acquired, by_liveness=job_id in (dead_tokens or {})))
        return dead, resolved

    def fail_unreadable(self, job_id: str, exc: CorruptRecord) -> str:
        log.warning("job %s cannot be read back, marking it failed: %s", job_id, exc)
        self.store.fail_unreadable(job_id, reason=f"corrupt job record: {exc}")
        return "failed"

    def _judge(self, report: SweepReport, d: Reaped) -> bool:
        """Ask the gate for one job and write its dead attempt's ledger record (no I/O);
        answers whether it went through."""
        try:
            d.decision, d.ledger = self._decision(d)
        except Exception as exc:  # one job's failure: logged, and the batch goes on
            self.steps.failed(report, "gate", d.job_id, exc)
            return False
        return True

    def _decision(self, d: Reaped) -> tuple[Decision, dict[str, Any]]:
        record, text_bytes = d.record, d.text_bytes
        spent = record.attempt_spent_base + d.tokens
        d.progressed = d.tokens > 0 or text_bytes > record.attempt_text_base
        view = JobView(
            budget_tokens=record.budget_tokens,
            floor_tokens=max(record.floor_tokens, self.accounting.min_output_tokens(record)),
            spent_output_tokens=spent,
            prefix_chars=text_bytes + self.accounting.continued_chars(record),
            attempts=record.attempt,
            spill_count=record.spill_count,
            counts_exact=record.counts_exact,
            require_exact_counts=record.spec.require_exact_counts,
            byte_exact=record.spec.byte_exact,
            exit=record.spec.exit,
            reads_on=self.accounting.read_on(record),
            **pacing(
                record,
                progressed=d.progressed,
                window_s=self.ctx.settings.file.worker.retry_window_s,
                now_ms=int(time.time() * 1000),
            ),
        )
        decision = decide(view, Cut(kind="worker_died"))
        entry = AttemptRecord(
            attempt=record.attempt,
            kind=record.attempt_kind,
            worker=lease_holder(record.stalled_owner) or "unknown",
            due_ms=record.due_ms,
            started_ms=record.attempt_started_ms,
            ended_ms=record.updated_ms,
            outcome=decision.action,
            cut="worker_died",
            detail=(
                "its worker's Redis connections all closed" if d.by_liveness else "lease expired"
            )
            + "; reaped by "
            + self.name,
            reason=decision.reason[:500],
            delay_ms=decision.delay_ms,
            provider=record.spec.provider,
            prefix_tokens=record.attempt_spent_base,
            output_tokens_persisted=d.tokens,
            # Its text is what follows the attempt's base (a character boundary: where
            # the previous attempt's text ended).
            chars_persisted=len(d.tail),
            bytes_persisted=text_bytes - record.attempt_text_base,
            count_source=(
                "usage"
                if record.counts_exact
                else "chunks"
                if self.accounting.read_on(record)
                else "estimate"
            ),
            counts_exact=record.counts_exact,
            # What it had in flight when it died was billed and never counted.
            billed_lower_bound=True,
        )
        return decision, entry.to_json_dict()

    def _flush_counts(self, report: SweepReport, dead: list[Reaped]) -> list[Reaped]:
        """The counts that raise a cursor (an estimate above the dead attempt's count, what
        a released response made), flushed in one round trip. Answers the jobs that go on."""
        raised = [d for d in dead if d.tokens > d.counted or d.carried]
        answers = self.store.write_many([d.flush_estimate() for d in raised])
        lost: set[str] = set()
        for d, answer in zip(raised, answers, strict=True):
            if isinstance(answer, Exception):
                self.steps.failed(report, "flush", d.job_id, answer)
                lost.add(d.job_id)
            elif d.tokens > d.counted:
                log.info(
                    "job %s: the dead attempt's %d counted tokens raised to an estimate of %d",
                    d.job_id,
                    d.counted,
                    d.tokens,
                )
        return [d for d in dead if d.job_id not in lost]

    def _commit(self, report: SweepReport, dead: list[Reaped]) -> list[Reaped]:
        """Every job's exit, with its ledger record and its outbox, in one round trip (as
        :func:`resumeq.worker.exits.apply_decision` commits one): ``finish`` for done and failed,
        ``release`` for the rest; a second spill is refused and fails the job instead,
        in one more round trip for those. Answers the jobs committed."""
        idempotency = {d.job_id: d.record.idempotency_key for d in dead}
        answers = self.store.write_many([d.exit() for d in dead], idempotency=idempotency)
        committed: list[Reaped] = []
        exhausted: list[Reaped] = []
        for d, answer in zip(dead, answers, strict=True):
            if isinstance(answer, SpillExhausted):
                exhausted.append(d)
            elif isinstance(answer, WriteRefused):
                log.info("job %s changed while being reaped: %s", d.job_id, answer)
            elif isinstance(answer, Exception):
                self.steps.failed(report, "exit", d.job_id, answer)
            else:
                if d.state == "spilled":
                    log.info("job %s spilled: %s", d.job_id, d.reason)
                committed.append(d)
        answers = self.store.write_many([d.fail_after_spill() for d in exhausted],
                                        idempotency=idempotency)  # fmt: skip
        for d, answer in zip(exhausted, answers, strict=True):
            if isinstance(answer, WriteRefused):
                log.info("job %s changed while being reaped: %s", d.job_id, answer)
            elif isinstance(answer, Exception):
                self.steps.failed(report, "exit", d.job_id, answer)
            else:
                committed.append(d)
        return committed
