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
"""

from __future__ import annotations

import contextlib
import logging
import reprlib
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, TypeVarTuple

import redis
from rq.registry import clean_registries

from resumeq.core import failpoints
from resumeq.core.calibration import Calibration, pieces
from resumeq.core.counting import estimate, let_go
from resumeq.core.errors import (
    ConfigError,
    CorruptRecord,
    JobNotFound,
    ProviderError,
    RedisUnavailable,
    ReplicaLagging,
    ResumeqError,
    RetryableProviderError,
    SpillExhausted,
    WriteRefused,
)
from resumeq.core.gate import Cut, Decision, JobView, decide, pacing
from resumeq.core.ledger import AttemptRecord
from resumeq.core.liveness import Liveness
from resumeq.core.models import Acquired, JobRecord, JobState, lease_holder
from resumeq.core.settings import ProviderProfile
from resumeq.providers import background
from resumeq.queue import due, outbox
from resumeq.queue.queueing import (
    DeadAttempt,
    attempts_pending,
    discard_attempt,
    enqueue_attempt,
    enqueue_overdue,
    retire_workers,
    rq_queue,
    settle_dead_attempts,
)
from resumeq.store import SPILL_QUEUE, ResponseToStop, Store, redis_errors
from resumeq.store.capabilities import Refusal, is_refusal, refusal, refused, warning
from resumeq.store.presence import present
from resumeq.worker.context import WorkerContext

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
#: Decisions after which an attempt reads the job's background response on.
RESUMING = frozenset({"retry", "resume"})
#: RQ's registries are cleaned at most this often.
REGISTRY_INTERVAL_S = 15.0
#: The oldest entries of the index of every job checked at each registry clean: an entry
#: whose job expired (its retention ran out) goes.
JOBS_INDEX_CHECKED = 500
#: A suspect is looked at again this long after its presence key's TTL runs out.
PRESENCE_SLACK_S = 0.01
#: Expired leases reaped together: each step of a batch is one pipelined round trip.
REAP_BATCH = 500
#: Batches one sweep reaps at most (several processes died at once): the rest wait for
#: the next sweep.
MAX_REAP_BATCHES = 8
#: A background response the provider could not be reached to cancel is asked again for
#: this long; at most this much of one sweep goes to cancelling them.
STOP_GIVE_UP_MS = 600_000
STOP_BUDGET_S = 2.0


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
        self._liveness = Liveness(ctx.settings.file.janitor.liveness_interval_ms / 1000.0)
        self._last_look = float("-inf")
        #: When a suspect's presence key expires: the next look is then.
        self._look_again_at = float("inf")
        #: False once Redis refused ``CLIENT LIST``: dead workers are found by their leases.
        self.looks = ctx.settings.file.janitor.liveness_interval_ms > 0

    def sweep(self) -> SweepReport:
        report = SweepReport()
        for _ in range(MAX_REAP_BATCHES):
            job_ids = self._safe(report, self._expired_leases) or []
            resolved = self._safe(report, self._reap_batch, report, job_ids) if job_ids else 0
            if len(job_ids) < REAP_BATCH or not resolved:
                break  # all expired leases seen, or none of these could be reaped
        self._follow_up(report)
        self._safe(report, self._stop_responses, report)
        self._safe(report, self._requeue_vanished, report)
        self._safe(report, self._enqueue_late_scheduled)
        grace_ms = int(self.store.settings.events_grace_s * 1000)
        for job_id in self._safe(report, self.store.ended_before, grace_ms) or []:
            if self._safe(report, self.store.trim_events, job_id):
                report.trimmed.append(job_id)
        if self.store.replicated:  # followers of a job whose end no replica confirmed
            self._safe(report, self._mark_ended)
        if time.monotonic() - self._last_registry_clean >= REGISTRY_INTERVAL_S:
            self._safe(report, self._clean_registries)
            self._safe(report, self.store.forget_expired, JOBS_INDEX_CHECKED)
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
        """One look at the workers' connections (one ``CLIENT LIST``); a worker missing
        from two looks whose presence key is gone too (:mod:`resumeq.core.liveness`) is dead:
        the jobs it leased are reaped at once, and its RQ registration is retired
        (``rq info`` and rq-dashboard stop listing it, and its executions are settled)."""
        report = SweepReport()
        with redis_errors("client list"):
            clients = self.ctx.redis.client_list(_type="normal")
        names = [_text(c.get("name", "")) for c in clients]
        suspects = self._liveness.observe(names, time.monotonic())
        if not suspects:
            return report
        with redis_errors("presence"):
            alive = present(self.ctx.redis, suspects)
        if left := [ms for ms in alive.values() if ms >= 0]:
            # Looked at again as soon as the first of those keys expires, not a look later.
            self._look_again_at = time.monotonic() + min(left) / 1000 + PRESENCE_SLACK_S
        dead = [w for w in suspects if w not in alive]
        if not dead:
            return report
        for worker in dead:
            self._liveness.dead(worker)
        held = self.store.leases_held_by(set(dead))
        if held:
            self._reap_batch(report, list(held), dead_tokens=held)
        retired = self._safe(report, retire_workers, self.ctx.redis, dead) or []
        log.info(
            "%s: worker(s) %s gone (every connection closed, no presence): reaped %d job(s) "
            "at once%s",
            self.name,
            ", ".join(dead),
            len(report.reaped),
            f", retired {len(retired)} RQ registration(s)" if retired else "",
        )
        return report

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
        if self.looks:
            self._ask_for_client_list()
        failed = 0
        while not stop.is_set():
            try:
                report = self.sweep()
            except RedisUnavailable as exc:
                failed += 1
                cap = max(max_backoff_s, interval_s)
                pause = min(cap, interval_s * 2.0 ** min(failed, 32))
                log.warning("%s: sweep failed: %s (next sweep in %.1f s)", self.name, exc, pause)
                self._look(stop, pause)
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
            self._look(stop, interval_s)

    def _look(self, stop: threading.Event, seconds: float) -> None:
        """Wait ``seconds`` before the next sweep (less once ``stop`` is set), looking at
        the workers' connections every ``liveness_interval_ms`` meanwhile (0: only wait)."""
        every_s = self.ctx.settings.file.janitor.liveness_interval_ms / 1000.0
        if not self.looks:
            stop.wait(seconds)
            return
        until = time.monotonic() + seconds
        while not stop.is_set():
            if not self.looks:  # refused meanwhile
                stop.wait(max(0.0, until - time.monotonic()))
                return
            now = time.monotonic()
            if now - self._last_look >= every_s or now >= self._look_again_at:
                self._last_look, self._look_again_at = now, float("inf")
                try:
                    self.check_liveness()
                except ResumeqError as exc:
                    if isinstance(exc.__cause__, Exception) and is_refusal(exc.__cause__):
                        self._without_client_list([refusal("list", exc.__cause__)])
                    else:  # Redis unreachable: the next sweep says it
                        log.debug("%s: liveness check failed: %s", self.name, exc)
                    self._liveness.forget()
            now = time.monotonic()
            left = until - now
            if left <= 0:
                return
            upcoming = min(self._last_look + every_s, self._look_again_at)
            stop.wait(min(max(0.0, upcoming - now), left))

    def _ask_for_client_list(self) -> None:
        """Whether Redis allows ``CLIENT LIST`` (asked once at start; a Redis that cannot
        be reached now is asked by the first look)."""
        try:
            refusals = refused(self.ctx.settings.redis_url, ["list"])
        except redis.RedisError:
            return
        if refusals:
            self._without_client_list(refusals)

    def _without_client_list(self, refusals: list[Refusal]) -> None:
        """No more looks: said once, at WARNING, with what would restore them."""
        self.looks = False
        lease_s = self.ctx.settings.file.worker.lease_ttl_ms / 1000
        log.warning(
            warning(
                "janitor",
                refusals,
                "dead workers are found by their leases alone: their jobs go on once the "
                f"leases expire ({lease_s:g} s, [worker] lease_ttl_ms), not within a second",
            )
        )

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
            log.warning("%s: %s%s failed: %s", self.name, name, reprlib.repr(args), exc)
        except Exception:
            report.errors += 1
            log.exception("%s: %s%s failed", self.name, name, reprlib.repr(args))
        return None

    def _follow_up(self, report: SweepReport) -> None:
        """Carry out the outboxes their committers left behind, all in one batch."""
        pending = self._safe(report, self._outbox_pending) or []
        followed = self._safe(report, outbox.complete_many, self.store, self.ctx.redis, pending)
        for job_id, count in zip(pending, followed or [0] * len(pending), strict=True):
            if isinstance(count, Exception):
                self._failed(report, "complete", job_id, count)
            elif count:
                report.followed_up.append(job_id)

    def _failed(self, report: SweepReport, step: str, job_id: str, exc: Exception) -> None:
        """One job's step failed, in a batch: logged as :meth:`_safe` would, and the batch
        goes on."""
        report.errors += 1
        if isinstance(exc, ResumeqError | ValueError | OSError):
            log.warning("%s: %s('%s',) failed: %s", self.name, step, job_id, exc)
        else:
            log.error("%s: %s('%s',) failed", self.name, step, job_id, exc_info=exc)

    def _fail_unreadable(self, job_id: str, exc: CorruptRecord) -> str:
        log.warning("job %s cannot be read back, marking it failed: %s", job_id, exc)
        self.store.fail_unreadable(job_id, reason=f"corrupt job record: {exc}")
        return "failed"

    def _expired_leases(self) -> list[str]:
        return self.store.expired_leases(limit=REAP_BATCH)

    def _outbox_pending(self) -> list[str]:
        return self.store.outbox_pending(outbox.JANITOR_GRACE_MS, limit=REAP_BATCH)

    def _reap_batch(
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
            d.counted, d.tokens = self._dead_attempt_tokens(d.record, d.text_bytes, d.tail)
        dead = [d for d in dead if self._judge(report, d)]
        for d in dead:
            self._safe(report, self._count_released, d)
        dead = self._flush_counts(report, dead)
        dead = self._commit(report, dead)
        if not dead:
            return resolved
        failpoints.hit("after_commit")
        ids = [d.job_id for d in dead]
        followed = self._safe(report, outbox.complete_many, self.store, self.ctx.redis, ids)
        for d, count in zip(dead, followed or [0] * len(dead), strict=True):
            if isinstance(count, Exception):  # left in its outbox, for the next sweep
                self._failed(report, "complete", d.job_id, count)
        settling = [DeadAttempt(d.job_id, d.record.attempt, failed=d.rq_failure) for d in dead]
        self._safe(report, settle_dead_attempts, self.ctx.redis, settling)
        for d in dead:
            report.reaped.append(d.job_id)
            report.outcomes[d.job_id] = d.state
        # An exit that reads nobody's response on: its provider-side generation is stopped.
        stopping = [
            found
            for d in dead
            if d.state not in ("queued", "done") and (found := background.response_of(d.record))
        ]
        self._safe(report, self.store.stop_responses, stopping)
        return resolved

    def _stop_responses(self, report: SweepReport) -> None:
        """Cancel at the provider the background responses that may still be generating
        for nobody: their job was cancelled (from any process: a producer's knows no
        provider keys), ended or spilled by a janitor, or went on without them. A provider
        that cannot be reached is asked again next sweep, for up to
        :data:`STOP_GIVE_UP_MS`; at most :data:`STOP_BUDGET_S` of a sweep goes to this."""
        started = time.monotonic()
        done: list[str] = []
        now_ms = int(time.time() * 1000)
        for entry in self.store.responses_to_stop():
            if time.monotonic() - started > STOP_BUDGET_S:
                break
            try:
                if not self._count_stopped(entry) and background.stop_background_response(
                    self.ctx.settings, entry.provider, entry.response_id
                ):
                    log.info("job %s: cancelled response %s", entry.job_id, entry.response_id)
            except RetryableProviderError as exc:
                if now_ms - entry.since_ms < STOP_GIVE_UP_MS:
                    log.info("job %s: response not cancelled yet: %s", entry.job_id, exc)
                    continue
                log.warning("job %s: gave up cancelling its response: %s", entry.job_id, exc)
            except ProviderError as exc:
                log.warning("job %s: response not cancelled: %s", entry.job_id, exc)
            done.append(entry.member)
        self.store.responses_stopped(done)

    def _calibration(self, provider: str, model: str) -> Calibration | None:
        try:
            margin = self.ctx.settings.profile(provider).estimate_margin
        except ConfigError:
            return None
        return self.ctx.calibrations.calibration(provider, model, margin=margin)

    def _count_stopped(self, entry: ResponseToStop) -> bool:
        """A cancelled job's background response: cancelled at the provider, then what it
        made past the cursor counted into the record of the attempt that made it (SPEC
        §22; once, whoever counts it first — the worker that saw the cancel counts it
        itself). Answers whether it was cancelled here (else it is only to be stopped)."""
        try:
            record = self.store.get(entry.job_id)
        except JobNotFound:
            return False
        if record.state is not JobState.CANCELLED or record.response_id != entry.response_id:
            return False  # let go by an attempt that counted it, or a janitor's exit that did
        released = background.release_background_response(
            self.ctx.settings, entry.provider, entry.response_id
        )
        try:
            ratio = self.ctx.settings.profile(entry.provider).bytes_per_token
        except ConfigError:
            ratio = MIN_BYTES_PER_TOKEN
        stored = self.store.attempt_texts([(record.id, record.response_text_base or 0)])[0][0]
        tokens = let_go(
            already=record.spent_output_tokens - (record.response_spent_base or 0),
            billed=released.billed_output,
            output_bytes=released.output_bytes,
            stored_bytes=stored - (record.response_text_base or 0),
            bytes_per_token=ratio,
            calibration=self._calibration(entry.provider, record.spec.model),
        )
        if self.store.amend_ledger(
            record.id, response_id=entry.response_id, provider=record.spec.provider, tokens=tokens
        ):
            log.info(
                "job %s: cancelled response %s; it made %d tokens past the cursor",
                record.id,
                entry.response_id,
                tokens,
            )
        return True

    def _reap(
        self, report: SweepReport, job_ids: list[str], dead_tokens: dict[str, str] | None = None
    ) -> tuple[list[_Dead], int]:
        """The jobs this janitor took over (a corrupt record is failed at once), and how
        many of ``job_ids`` were reaped, found alive or gone."""
        ttl_ms = self.ctx.settings.file.worker.lease_ttl_ms
        dead: list[_Dead] = []
        resolved = 0
        reaps = self.store.reap_many(
            job_ids, janitor=self.name, ttl_ms=ttl_ms, dead_tokens=dead_tokens
        )
        for job_id, result in zip(job_ids, reaps, strict=True):
            if isinstance(result, CorruptRecord):
                if self._safe(report, self._fail_unreadable, job_id, result):
                    report.reaped.append(job_id)
                    report.outcomes[job_id] = "failed"
                    resolved += 1
            elif isinstance(result, Exception):
                self._failed(report, "reap", job_id, result)
            else:
                resolved += 1
                if result.acquired is not None:
                    dead.append(_Dead(result.acquired, by_liveness=job_id in (dead_tokens or {})))
        return dead, resolved

    def _count_released(self, d: _Dead) -> None:
        """A dead attempt whose job takes an exit (no attempt will read its background
        response on): the response is cancelled at its provider, and what it made that the
        cursor had not counted is counted now (SPEC §22), into the flush and the ledger
        record before the exit."""
        record, decision = d.record, d.decision
        if record.response_id is None or decision is None or decision.action in RESUMING:
            return
        provider = (record.response_for or "").partition(" ")[0]
        try:
            profile = self.ctx.settings.profile(provider)
        except ConfigError:
            profile = None
        released = background.Released()
        if profile is not None:
            http = self.ctx.http.get(provider, profile)
            released = background.release_background_response(
                self.ctx.settings, provider, record.response_id, http
            )
        spent = record.spent_output_tokens + d.tokens - d.counted
        d.carried = let_go(
            already=spent - (record.response_spent_base or 0),
            billed=released.billed_output,
            output_bytes=released.output_bytes,
            stored_bytes=d.text_bytes - (record.response_text_base or 0),
            bytes_per_token=profile.bytes_per_token if profile else MIN_BYTES_PER_TOKEN,
            calibration=self._calibration(provider, record.spec.model),
        )
        if d.carried:
            d.ledger["carried_output_tokens"] = d.carried
            d.ledger["output_tokens_persisted"] = d.ledger.get("output_tokens_persisted", 0) + (
                d.carried
            )
            log.info(
                "job %s: its response %s, let go, made %d tokens nobody counted",
                d.job_id,
                record.response_id,
                d.carried,
            )

    def _flush_counts(self, report: SweepReport, dead: list[_Dead]) -> list[_Dead]:
        """The counts that raise a cursor (an estimate above the dead attempt's count, what
        a released response made), flushed in one round trip. Answers the jobs that go on."""
        raised = [d for d in dead if d.tokens > d.counted or d.carried]
        answers = self.store.write_many([d.flush_estimate() for d in raised])
        lost: set[str] = set()
        for d, answer in zip(raised, answers, strict=True):
            if isinstance(answer, Exception):
                self._failed(report, "flush", d.job_id, answer)
                lost.add(d.job_id)
            elif d.tokens > d.counted:
                log.info(
                    "job %s: the dead attempt's %d counted tokens raised to an estimate of %d",
                    d.job_id,
                    d.counted,
                    d.tokens,
                )
        return [d for d in dead if d.job_id not in lost]

    def _dead_attempt_tokens(
        self, record: JobRecord, text_bytes: int, tail: str = ""
    ) -> tuple[int, int]:
        """The dead attempt's output tokens as counted, and as they stand: counted exactly,
        the same; counted chunk by chunk (a lower bound), an estimate that errs high from
        the text it stored and the reasoning it saw, so the continuation cannot buy past
        the budget."""
        counted = record.spent_output_tokens - record.attempt_spent_base
        if record.counts_exact:
            return counted, counted
        if self._read_on(record):
            # The next attempt reads the rest of the same response from the provider, and
            # with it the response's billed total: the count stays as counted (a guess that
            # errs high now would be charged on top of that total).
            return counted, counted
        try:
            profile: ProviderProfile | None = self.ctx.settings.profile(record.spec.provider)
        except ConfigError:
            profile = None
        ratio = profile.bytes_per_token if profile else MIN_BYTES_PER_TOKEN
        calibration = (
            self.ctx.calibrations.calibration(
                record.spec.provider, record.spec.model, margin=profile.estimate_margin
            )
            if profile is not None and tail
            else None
        )
        if calibration is not None:
            # Its text by what the model was seen to do (counted chunk by chunk: as many
            # chunks as it counted); its reasoning at the profile's ratio.
            text = calibration.estimate(
                text_bytes=len(tail.encode("utf-8")), chunks=counted, pieces=pieces(tail)
            )
            hidden = estimate(0, record.attempt_hidden_bytes, counted=0, bytes_per_token=ratio)
            return counted, max(counted, text + hidden)
        output = text_bytes - record.attempt_text_base + record.attempt_hidden_bytes
        return counted, estimate(0, output, counted=counted, bytes_per_token=ratio)

    def _read_on(self, record: JobRecord) -> bool:
        """Whether the job's next attempt reads on from its background response."""
        try:
            background = self.ctx.settings.profile(record.spec.provider).background
        except ConfigError:
            return False
        return background and record.response_readable

    def _min_output_tokens(self, record: JobRecord) -> int:
        """The fewest tokens the job's provider takes a request for (1 if this janitor does
        not know its profile)."""
        try:
            return self.ctx.settings.profile(record.spec.provider).min_output_tokens
        except ConfigError:
            return 1

    def _judge(self, report: SweepReport, d: _Dead) -> bool:
        """Ask the gate for one job and write its dead attempt's ledger record (no I/O);
        answers whether it went through."""
        try:
            d.decision, d.ledger = self._decision(d)
        except Exception as exc:  # one job's failure: logged, and the batch goes on
            self._failed(report, "gate", d.job_id, exc)
            return False
        return True

    def _decision(self, d: _Dead) -> tuple[Decision, dict[str, Any]]:
        record, text_bytes = d.record, d.text_bytes
        spent = record.attempt_spent_base + d.tokens
        d.progressed = d.tokens > 0 or text_bytes > record.attempt_text_base
        view = JobView(
            budget_tokens=record.budget_tokens,
            floor_tokens=max(record.floor_tokens, self._min_output_tokens(record)),
            spent_output_tokens=spent,
            prefix_chars=text_bytes,
            attempts=record.attempt,
            spill_count=record.spill_count,
            counts_exact=record.counts_exact,
            require_exact_counts=record.spec.require_exact_counts,
            byte_exact=record.spec.byte_exact,
            exit=record.spec.exit,
            reads_on=self._read_on(record),
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
                if self._read_on(record)
                else "estimate"
            ),
            counts_exact=record.counts_exact,
            # What it had in flight when it died was billed and never counted.
            billed_lower_bound=True,
        )
        return decision, entry.to_json_dict()

    def _commit(self, report: SweepReport, dead: list[_Dead]) -> list[_Dead]:
        """Every job's exit, with its ledger record and its outbox, in one round trip (as
        :func:`resumeq.worker.exits.apply_decision` commits one): ``finish`` for done and failed,
        ``release`` for the rest; a second spill is refused and fails the job instead,
        in one more round trip for those. Answers the jobs committed."""
        idempotency = {d.job_id: d.record.idempotency_key for d in dead}
        answers = self.store.write_many([d.exit() for d in dead], idempotency=idempotency)
        committed: list[_Dead] = []
        exhausted: list[_Dead] = []
        for d, answer in zip(dead, answers, strict=True):
            if isinstance(answer, SpillExhausted):
                exhausted.append(d)
            elif isinstance(answer, WriteRefused):
                log.info("job %s changed while being reaped: %s", d.job_id, answer)
            elif isinstance(answer, Exception):
                self._failed(report, "exit", d.job_id, answer)
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
                self._failed(report, "exit", d.job_id, answer)
            else:
                committed.append(d)
        return committed

    def _requeue_vanished(self, report: SweepReport) -> None:
        """Enqueue again the ``queued`` jobs whose RQ job vanished: their records, outboxes
        and RQ jobs read in a few round trips for all of them (a backlog of queued jobs
        waiting for workers is looked at every sweep)."""
        job_ids = self.store.queued_before(VANISHED_GRACE_MS)
        queued: list[JobRecord] = []
        for job_id, record in zip(job_ids, self.store.records(job_ids), strict=True):
            if isinstance(record, CorruptRecord):
                self._safe(report, self._fail_unreadable, job_id, record)
            elif isinstance(record, JobNotFound):
                self._safe(report, self._forget_missing, job_id)
            elif isinstance(record, Exception):
                self._failed(report, "get", job_id, record)
            elif record.state is JobState.QUEUED:
                queued.append(record)
        outboxes = self.store.outboxes([record.id for record in queued])
        # A job whose commit's follow-up is pending is left to its outbox (enqueued on time).
        queued = [
            r for r, entries in zip(queued, outboxes, strict=True) if "attempt" not in entries
        ]
        pending = attempts_pending(self.ctx.redis, [(r.id, r.attempt + 1) for r in queued])
        for record, waiting in zip(queued, pending, strict=True):
            if not waiting and self._safe(report, self._enqueue_again, record):
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

    def _clean_registries(self) -> None:
        for name in self._queues():
            clean_registries(rq_queue(name, self.ctx.redis))

    def _enqueue_late_scheduled(self) -> None:
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


class _Dead:
    """A job whose worker died, reaped by this janitor, on its way through one batch."""

    def __init__(self, acquired: Acquired, *, by_liveness: bool = False) -> None:
        self.lease, self.record = acquired.lease, acquired.record
        #: Found by its worker's connections closing, not by its lease expiring.
        self.by_liveness = by_liveness
        self.job_id = acquired.record.id
        #: The stored prefix's length in bytes, and the dead attempt's own text.
        self.text_bytes, self.tail = 0, ""
        #: The dead attempt's output tokens as it counted them, and as they stand.
        self.counted = self.tokens = 0
        #: What its background response made and nobody counted, when it is let go.
        self.carried = 0
        self.progressed = False
        self.decision: Decision | None = None
        self.ledger: dict[str, Any] = {}
        #: The state its exit reached, and the error a failed job was given.
        self.state, self.error = "", ""

    @property
    def reason(self) -> str:
        return self.decision.reason if self.decision else ""

    @property
    def rq_failure(self) -> str | None:
        """The reason its dead attempt's RQ job fails with, if resumeq failed the job."""
        if self.state != JobState.FAILED.value:
            return None
        return f"resumeq failed job {self.job_id} after its worker died: {self.error}"

    def flush_estimate(self) -> Callable[[Store], object]:
        """The write that raises the cursor to the dead attempt's estimate, and by what a
        released response made."""
        lease, revision = self.lease, self.record.revision
        tokens = self.tokens - self.counted + self.carried
        return lambda store: store.flush(
            lease, expected_revision=revision, delta="", tokens=tokens, exact=False
        )

    def exit(self) -> Callable[[Store], object]:
        """The write that applies the gate's decision, as ``resumeq.worker.exits`` commits it;
        sets the state it reaches."""
        decision, lease, ledger = self.decision, self.lease, self.ledger
        assert decision is not None
        progressed, reason = self.progressed, decision.reason
        action = decision.action
        if action == "done":
            self.state = "done"
            hooks = self.record.spec.hooks
            return lambda s: s.finish(
                lease, state="done", finish_reason=reason, ledger=ledger, hooks=hooks
            )
        if action == "failed":
            self.state, self.error = "failed", reason
            return lambda s: s.finish(lease, state="failed", error=reason, ledger=ledger)
        if action in ("retry", "resume"):
            self.state = "queued"
            delay_ms = decision.delay_ms
            return lambda s: s.release(
                lease,
                to="queued",
                reason=reason,
                ledger=ledger,
                delay_ms=delay_ms,
                progressed=progressed,
            )
        # The spill lane: a reserved worker pool may serve it, or an operator requeues.
        to: Literal["abandoned", "spilled"] = "abandoned" if action == "abandon" else "spilled"
        self.state = to
        return lambda s: s.release(
            lease, to=to, reason=reason, ledger=ledger, progressed=progressed
        )

    def fail_after_spill(self) -> Callable[[Store], object]:
        """The write that fails a job refused a second spill (spill is not a loop)."""
        lease, ledger = self.lease, self.ledger
        self.state = "failed"
        self.error = f"{self.reason}, after a spill (spill is not a loop)"
        error = self.error
        return lambda s: s.finish(lease, state="failed", error=error, ledger=ledger)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
