"""One attempt of a job, as RQ runs it (SPEC §8).

Acquire the lease; build the request (fresh, retry or continuation); stream; checkpoint
every ``flush_tokens`` tokens or ``flush_ms``, whichever first, and at the end; renew the
lease from a heartbeat every TTL/3; close the stream at once when a renew or a flush is
refused. When the stream ends or is cut: flush what arrived, make the counts exact where
the provider allows, ask the gate, and apply its exit — with this attempt's ledger record
written by the same script.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC

import redis
from rq import get_current_job

from resumeq import metrics
from resumeq.checkpoint import Checkpointer
from resumeq.context import WorkerContext, context
from resumeq.continuation import RequestPlan, plan_request
from resumeq.counting import Count, Tally, settle
from resumeq.errors import (
    ConfigError,
    CorruptRecord,
    FatalProviderError,
    InvalidTransition,
    JobCancelled,
    JobFailed,
    JobNotFound,
    LeaseLost,
    ProviderError,
    ProviderUnavailable,
    ResumeqError,
    RetryableProviderError,
    Stalled,
    StreamCut,
    WriteRefused,
)
from resumeq.exits import apply_decision
from resumeq.gate import Cut, Decision, JobView, decide, pacing
from resumeq.ledger import AttemptRecord
from resumeq.metrics import FLUSH_LATENCY, RESUME_LATENCY, Histogram
from resumeq.models import JobRecord, JobState, Lease
from resumeq.providers import (
    ProviderClient,
    ProviderStream,
    StreamEvent,
    TextDelta,
    Usage,
    make_client,
)
from resumeq.settings import ProviderProfile
from resumeq.splice import Splicer, SpliceReport
from resumeq.store import SPILL_QUEUE

log = logging.getLogger(__name__)

#: How long the final flush keeps trying while Redis is unreachable, between tries.
_RETRY_PAUSE_S = 0.25


def _now_ms() -> int:
    return int(time.time() * 1000)


class Pieces:
    """Text that arrives a token at a time, kept compact. A stream's deltas are short
    strings of some 50 bytes of object each: kept as they came, a long answer's pieces cost
    ten times its text for as long as the attempt runs, and a worker holds hundreds of
    attempts. Every :data:`JOIN_EVERY` pieces are joined into one string."""

    JOIN_EVERY = 64

    __slots__ = ("_joined", "_recent", "count")

    def __init__(self) -> None:
        self._joined: list[str] = []
        self._recent: list[str] = []
        #: Pieces appended (the chunks that carried text).
        self.count = 0

    def append(self, text: str) -> None:
        self._recent.append(text)
        self.count += 1
        if len(self._recent) >= self.JOIN_EVERY:
            self._joined.append("".join(self._recent))
            self._recent.clear()

    def text(self) -> str:
        return "".join(self._joined) + "".join(self._recent)


@dataclass
class StreamResult:
    """How the stream ended, what it said about itself, and what it delivered."""

    cut: Cut
    usage: Usage = field(default_factory=Usage)
    #: Text deltas as they arrived (an echo included), and the reasoning's text.
    received: Pieces = field(default_factory=Pieces)
    reasoning: Pieces = field(default_factory=Pieces)
    tally: Tally = field(default_factory=Tally)
    lost: BaseException | None = None
    #: When the provider answered (ms): its stream's headers, or its refusal.
    first_byte_ms: int | None = None
    #: When the first text arrived (ms).
    first_text_ms: int | None = None


@dataclass
class _Call:
    """What one attempt works with once it has decided to call the provider."""

    record: JobRecord
    profile: ProviderProfile
    plan: RequestPlan
    client: ProviderClient
    splicer: Splicer
    ckpt: Checkpointer


def run_attempt(job_id: str) -> str:
    """The RQ job function of one attempt. Answers what became of the job; raises
    :class:`~resumeq.errors.JobFailed` when resumeq failed it, so that RQ counts the
    attempt failed, with the reason, exactly when the job needs a person (a cut that was
    handed on is an attempt that did its work)."""
    rq_job = get_current_job()
    from_spill = rq_job is not None and rq_job.origin == SPILL_QUEUE
    dequeued = rq_job.started_at if rq_job is not None else None
    if dequeued is not None and dequeued.tzinfo is None:
        dequeued = dequeued.replace(tzinfo=UTC)
    ctx = context()
    outcome = AttemptRunner(ctx).run(
        job_id,
        from_spill=from_spill,
        dequeued_ms=int(dequeued.timestamp() * 1000) if dequeued is not None else None,
    )
    if outcome == "failed":
        try:
            error = ctx.store.get(job_id).error
        except ResumeqError:
            error = None
        raise JobFailed(f"resumeq failed job {job_id}: {error or 'no reason recorded'}")
    return outcome


class AttemptRunner:
    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self.store = ctx.store
        self.worker = ctx.settings.file.worker
        self.dequeued_ms: int | None = None

    def run(self, job_id: str, *, from_spill: bool = False, dequeued_ms: int | None = None) -> str:
        """Run one attempt; answers the state the job reached (or why nothing ran).
        ``dequeued_ms``: when a worker took the attempt's RQ job, for its ledger record."""
        self.dequeued_ms = dequeued_ms
        if from_spill:
            self._take_from_spill(job_id)
        try:
            got = self.store.acquire(job_id, worker=self.ctx.name, ttl_ms=self.worker.lease_ttl_ms)
        except (InvalidTransition, JobNotFound) as exc:
            # Not queued (cancelled, already running elsewhere, gone): a duplicate or stale
            # RQ job. Nothing to do, and nothing was paid for.
            log.info("job %s: attempt not started: %s", job_id, exc)
            cancelled = isinstance(exc, InvalidTransition) and exc.state == "cancelled"
            return "cancelled" if cancelled else "skipped"
        except CorruptRecord as exc:
            # Edited by hand: nothing of it can be trusted, and nothing was paid for.
            log.warning("job %s cannot be read back, marking it failed: %s", job_id, exc)
            self.store.fail_unreadable(job_id, reason=f"corrupt job record: {exc}")
            return "failed"
        try:
            return self._attempt(got.lease, got.record)
        except (WriteRefused, JobNotFound) as exc:
            # Fenced out, cancelled, or purged meanwhile: nothing more may be written.
            log.warning("job %s: stopped, %s", job_id, exc)
            return "cancelled" if isinstance(exc, JobCancelled) else "lost"

    def _take_from_spill(self, job_id: str) -> None:
        """A worker pool serving the spill lane takes spilled jobs on purpose."""
        try:
            if self.store.get(job_id).state is JobState.SPILLED:
                self.store.requeue(job_id, queue=SPILL_QUEUE)
        except (InvalidTransition, JobNotFound):
            pass

    def _attempt(self, lease: Lease, record: JobRecord) -> str:
        started = _now_ms()
        early = self._refusal(record)
        if early is not None:
            entry = self._ledger(record, started, outcome=early.action, cut=None, decision=early)
            return apply_decision(
                self.store, self.ctx.redis, lease, record, early, ledger=entry.to_json_dict()
            )
        profile = self.ctx.settings.profile(record.spec.provider)
        prefix = self.store.text(record.id)
        plan = plan_request(
            record.spec, profile, prefix=prefix, remaining_tokens=record.remaining_tokens
        )
        client = make_client(profile, self.ctx.http.get(record.spec.provider, profile))
        ckpt = Checkpointer(
            self.store,
            lease,
            revision=record.revision,
            flush_tokens=self.worker.flush_tokens,
            flush_ms=self.worker.flush_ms,
            flush_min_ms=self.worker.flush_min_ms,
        )
        splicer = Splicer(
            prefix,
            sent=plan.sent if plan.kind == "resume" else None,
            trimmed=plan.trimmed,
            mode=profile.continue_mode,
            echo=profile.echo_policy,
        )
        call = _Call(record, profile, plan, client, splicer, ckpt)
        result, count = self._stream_and_count(call)
        handoff = self.ctx.handoff.is_set() and result.cut.kind in ("stream_cut", "stall")
        if handoff:
            # Cut by this worker's own shutdown, not by the provider: handed on at once.
            result.cut = Cut(kind="handoff", detail="the worker is shutting down")
        if result.lost is not None:
            lost = (
                result.lost
                if isinstance(result.lost, WriteRefused)
                else LeaseLost(str(result.lost), job_id=record.id)
            )
            self._record_stopped(call, result, started, lost)
            raise lost
        for note in splicer.report.notes:
            log.info("job %s attempt %d: %s", record.id, record.attempt, note)

        # A handoff is no failure of the provider's: it neither starts nor lengthens a run
        # of attempts that delivered nothing.
        progressed = ckpt.flushed_tokens > 0 or ckpt.flushed_chars > 0 or handoff
        now_ms = _now_ms()
        view = JobView(
            budget_tokens=record.budget_tokens,
            floor_tokens=max(record.floor_tokens, profile.min_output_tokens),
            spent_output_tokens=record.spent_output_tokens + ckpt.flushed_tokens,
            prefix_chars=len(prefix) + ckpt.flushed_chars,
            attempts=record.attempt,
            spill_count=record.spill_count,
            counts_exact=record.counts_exact and ckpt.exact,
            require_exact_counts=record.spec.require_exact_counts,
            byte_exact=record.spec.byte_exact,
            exit=record.spec.exit,
            **pacing(
                record,
                progressed=progressed,
                window_s=self.worker.retry_window_s,
                now_ms=now_ms,
            ),
            attempt_s=max(0.0, (now_ms - started) / 1000.0),
        )
        decision = decide(view, result.cut, jitter=random.random())
        handed_on = handoff and decision.action in ("retry", "resume")
        entry = self._ledger(
            record,
            started,
            outcome="handoff" if handed_on else decision.action,
            cut=result.cut,
            plan=plan,
            usage=result.usage,
            ckpt=ckpt,
            count=count,
            seam=splicer.report,
            first_byte_ms=result.first_byte_ms,
            decision=decision,
        )
        log.info(
            "job %s attempt %d (%s): %s, %d tokens persisted -> %s (%s)",
            record.id,
            record.attempt,
            record.attempt_kind,
            result.cut.kind,
            ckpt.flushed_tokens,
            decision.action,
            decision.reason,
        )
        try:
            state = apply_decision(
                self.store,
                self.ctx.redis,
                ckpt.lease,
                record,
                decision,
                ledger=entry.to_json_dict(),
                finish_reason=result.cut.finish_reason or "",
                progressed=progressed,
            )
        except (WriteRefused, JobNotFound) as exc:
            self._record_stopped(call, result, started, exc, count=count)
            raise
        self._record_metrics(call, result)
        return state

    def _record_metrics(self, call: _Call, result: StreamResult) -> None:
        """This attempt's flush round trips, and for a continuation the time from its cut
        to its first token, into the cluster-wide histograms (best effort)."""
        resume = Histogram()
        cut_ms = call.record.cut_ms
        if call.record.attempt_kind == "resume" and cut_ms and result.first_text_ms:
            resume.observe(max(0, result.first_text_ms - cut_ms) / 1000.0)
        try:
            metrics.record(
                self.ctx.redis, {FLUSH_LATENCY: call.ckpt.latency, RESUME_LATENCY: resume}
            )
        except redis.RedisError as exc:
            log.info("job %s: metrics not recorded: %s", call.record.id, exc)

    def _record_stopped(
        self,
        call: _Call,
        result: StreamResult,
        started: int,
        why: BaseException,
        *,
        count: Count | None = None,
    ) -> None:
        """The ledger record of an attempt stopped before its exit — a cancel, a lost
        lease — with what it received: it reached the provider and was billed. Written at
        most once per attempt; best effort (the job may be gone)."""
        if count is None:
            count = self._count(call, result, ask_tokenizer=False)
        outcome = "cancelled" if isinstance(why, JobCancelled) else "fenced"
        entry = self._ledger(
            call.record,
            started,
            outcome=outcome,
            cut=Cut(kind="stream_cut", detail=f"stopped: {why}"),
            plan=call.plan,
            usage=result.usage,
            ckpt=call.ckpt,
            count=count,
            seam=call.splicer.report,
            first_byte_ms=result.first_byte_ms,
        ).model_copy(update={"billed_lower_bound": True})
        try:
            self.store.append_ledger(
                call.record.id, attempt=call.record.attempt, entry=entry.to_json_dict()
            )
        except ResumeqError as exc:
            log.warning("job %s: the stopped attempt was not recorded: %s", call.record.id, exc)

    def _refusal(self, record: JobRecord) -> Decision | None:
        """An attempt that must not call the provider at all."""
        if record.spec.prompt_hash() != record.prompt_hash:
            return decide(_view(record), Cut(kind="conflict"))
        try:
            self.ctx.settings.profile(record.spec.provider)
        except ConfigError as exc:
            return Decision(action="failed", reason=str(exc))
        if record.remaining_tokens <= 0:
            return Decision(action="done", reason="budget exhausted")
        return None

    # -- streaming -----------------------------------------------------------------------

    def _stream_and_count(self, call: _Call) -> tuple[StreamResult, Count]:
        """Stream, make the text durable, count, and write the count — all under the
        heartbeat, which runs until this attempt's last write before its exit."""
        lost = threading.Event()
        opened: list[ProviderStream] = []
        ckpt, splicer = call.ckpt, call.splicer

        def on_lost(exc: BaseException) -> None:
            lost.set()
            for stream in opened:
                stream.interrupt()

        def on_handoff() -> None:
            for stream in opened:
                stream.interrupt_for_handoff()

        heartbeat = self.ctx.leases.hold(
            ckpt.lease, on_lost=on_lost, confirmed=lambda: ckpt.lease_confirmed
        )
        watching = self.ctx.handoff.watch(on_handoff)
        count = Count(0, False, "estimate")
        result = StreamResult(Cut(kind="stream_cut"))
        try:
            self._stream(call, result, lost=lost, opened=opened)
            if not lost.is_set():
                ckpt.add(splicer.finish(), splicer.take_tokens(), exact=ckpt.exact)
                self._until_written(ckpt.flush)  # the text is durable before any counting
                count = self._count(call, result)
                self._until_written(lambda: ckpt.settle(count.tokens, exact=count.exact))
        except (WriteRefused, JobNotFound) as exc:  # a checkpoint refused: stop at once
            result.lost = exc
            for stream in opened:
                stream.close()
        finally:
            self.ctx.handoff.unwatch(watching)
            heartbeat.release()
        if lost.is_set() and result.lost is None:
            result.lost = heartbeat.lost or LeaseLost("lease lost", job_id=ckpt.lease.job_id)
        return result, count

    def _stream(
        self,
        call: _Call,
        result: StreamResult,
        *,
        lost: threading.Event,
        opened: list[ProviderStream],
    ) -> None:
        """Fill ``result`` with what the stream delivers and how it ended."""
        handoff = self.ctx.handoff
        stream = self._open(call, result)
        if stream is None:
            return
        opened.append(stream)
        with stream:
            if lost.is_set() or handoff.is_set():  # either began while the request was sent
                return
            try:
                for event in stream:
                    if lost.is_set():
                        return  # nothing more may be written
                    self._take(event, result, call.splicer, call.ckpt)
                    # A handoff keeps what had reached this machine when it began (it was
                    # paid for): the stream is read on up to those bytes, then cut.
                    if handoff.is_set() and not stream.drain():
                        return
            except StreamCut as exc:
                kind = "stall" if isinstance(exc, Stalled) else "stream_cut"
                result.cut = Cut(
                    kind=kind,
                    detail=f"{exc.kind}: {exc}",
                    in_non_text_block=getattr(stream, "in_non_text_block", False),
                )
                return
        if stream.closed and stream.finish_reason is None:
            return  # closed by this worker (a lost lease, a handoff): a cut, not an end
        result.usage = stream.usage
        result.cut = Cut(kind="finished", finish_reason=stream.finish_reason)

    def _open(self, call: _Call, result: StreamResult) -> ProviderStream | None:
        """The provider's stream; None, with how the attempt ended in ``result``, when it
        was refused — or not asked at all: the worker is shutting down, nothing is bought."""
        if not self.ctx.handoff.is_set():
            try:
                stream = call.client.open(call.plan)
                result.first_byte_ms = _now_ms()
                return stream
            except RetryableProviderError as exc:
                result.cut = Cut(kind="retryable", retry_after_s=exc.retry_after, detail=str(exc))
                result.first_byte_ms = _now_ms() if exc.status is not None else None
            except FatalProviderError as exc:
                result.cut = Cut(kind="fatal", detail=str(exc))
                result.first_byte_ms = _now_ms() if exc.status is not None else None
        result.tally.opened = False  # refused before a stream: nothing was bought
        return None

    @staticmethod
    def _take(
        event: StreamEvent, result: StreamResult, splicer: Splicer, ckpt: Checkpointer
    ) -> None:
        """One stream event into the splice, the checkpoint and the tally."""
        tally = result.tally
        if isinstance(event, Usage):
            result.usage = event
            tally.reported = tally.reported or event.output_tokens is not None
            return
        tally.exact = tally.exact and event.exact
        tally.reported = tally.reported or event.exact
        if isinstance(event, TextDelta):
            if result.first_text_ms is None and event.text:
                result.first_text_ms = _now_ms()
            result.received.append(event.text)
            ckpt.add(
                splicer.feed(event.text, event.tokens), splicer.take_tokens(), exact=event.exact
            )
            return
        size = len(event.text.encode("utf-8"))
        if event.kind == "reasoning":
            result.reasoning.append(event.text)
            tally.reasoning_chunks += 1
            tally.reasoning_bytes += size
            tally.reasoning_tokens += event.tokens
        else:
            tally.other_chunks += bool(event.text)
            tally.other_bytes += size
            tally.other_tokens += event.tokens
        ckpt.add("", event.tokens, exact=event.exact, hidden_bytes=size)

    # -- counting and the last flush -----------------------------------------------------

    def _count(self, call: _Call, result: StreamResult, *, ask_tokenizer: bool = True) -> Count:
        """This attempt's output tokens (:mod:`resumeq.counting`), asking the counting
        endpoint where the profile says and nothing better is known."""
        record, profile, ckpt = call.record, call.profile, call.ckpt
        seam = call.splicer.report
        generated = result.received.text()[seam.echo_dropped :]
        tally = result.tally
        tally.text_chunks = result.received.count - seam.echo_pieces
        tally.text_bytes = len(generated.encode("utf-8"))
        tally.tokens = ckpt.flushed_tokens + ckpt.pending_tokens
        usage = result.usage

        def counted(by_text: int | None = None, by_reasoning: int | None = None) -> Count:
            return settle(
                tally,
                finished=result.cut.kind == "finished",
                reported=usage.output_tokens,
                reported_reasoning=usage.reasoning_tokens,
                tokenizer_text=by_text,
                tokenizer_reasoning=by_reasoning,
                bytes_per_token=profile.bytes_per_token,
            )

        count = counted()
        reasoning = result.reasoning.text()
        ask = ask_tokenizer and profile.counts_with_tokenizer and bool(generated or reasoning)
        if count.source == "estimate" and ask:
            try:
                timeout = self._count_timeout(ckpt, profile)
                model = record.spec.model
                by_text = call.client.count_text_tokens(generated, model=model, timeout_s=timeout)
                by_reasoning = (
                    call.client.count_text_tokens(reasoning, model=model, timeout_s=timeout)
                    if reasoning
                    else None
                )
            except ProviderError as exc:
                log.warning("job %s: counting endpoint failed: %s", record.id, exc)
                count = replace(count, refused=(*count.refused, f"the counting endpoint: {exc}"))
            else:
                count = counted(by_text, by_reasoning)
        for why in count.refused:
            log.warning(
                "job %s attempt %d: not believed, %s; the count stays an estimate",
                record.id,
                record.attempt,
                why,
            )
        return count

    def _count_timeout(self, ckpt: Checkpointer, profile: ProviderProfile) -> float:
        """A counting request may take no longer than the lease has left (less a margin for
        the writes after it), nor than the stall timeout."""
        ttl_s = ckpt.lease.ttl_ms / 1000.0
        left = ttl_s - (time.monotonic() - ckpt.lease_confirmed) - ttl_s / 3
        if left <= 0:
            raise ProviderUnavailable("no lease time left to count in")
        return min(profile.stall_timeout_s, left)

    def _until_written(self, write: Callable[[], bool]) -> None:
        while not write():
            time.sleep(_RETRY_PAUSE_S)  # Redis unreachable: the write raises once the lease is gone

    # -- the ledger ----------------------------------------------------------------------

    def _ledger(
        self,
        record: JobRecord,
        started: int,
        *,
        outcome: str,
        cut: Cut | None,
        plan: RequestPlan | None = None,
        usage: Usage | None = None,
        ckpt: Checkpointer | None = None,
        count: Count | None = None,
        seam: SpliceReport | None = None,
        first_byte_ms: int | None = None,
        decision: Decision | None = None,
    ) -> AttemptRecord:
        usage = usage or Usage()
        return AttemptRecord(
            attempt=record.attempt,
            kind=record.attempt_kind,
            worker=self.ctx.name,
            due_ms=record.due_ms,
            dequeued_ms=self.dequeued_ms,
            started_ms=started,
            first_byte_ms=first_byte_ms,
            ended_ms=_now_ms(),
            outcome=outcome,
            cut=cut.kind if cut else None,
            detail=(cut.detail if cut else "")[:500],
            reason=decision.reason[:500] if decision else "",
            delay_ms=decision.delay_ms if decision else 0,
            provider=record.spec.provider,
            max_tokens=plan.max_tokens if plan else None,
            prefix_tokens=record.spent_output_tokens,
            prefix_chars_sent=plan.prefix_chars_sent if plan else 0,
            input_tokens=usage.input_tokens,
            cached_input_tokens=usage.cached_input_tokens,
            cache_creation_input_tokens=usage.cache_creation_input_tokens,
            output_tokens=count.tokens if count and count.exact else None,
            output_tokens_persisted=ckpt.flushed_tokens if ckpt else 0,
            reasoning_tokens=count.reasoning_tokens if count else None,
            chars_persisted=ckpt.flushed_chars if ckpt else 0,
            bytes_persisted=ckpt.flushed_bytes if ckpt else 0,
            count_source=count.source if count else "usage",
            counts_exact=count.exact if count else True,
            count_refused="; ".join(count.refused)[:500] or None if count else None,
            echo_chars=seam.echo_dropped if seam else 0,
            overlap_chars=seam.overlap_dropped if seam else 0,
        )


def _view(record: JobRecord) -> JobView:
    return JobView(
        budget_tokens=record.budget_tokens,
        floor_tokens=record.floor_tokens,
        spent_output_tokens=record.spent_output_tokens,
        prefix_chars=0,
        attempts=record.attempt,
        spill_count=record.spill_count,
        exit=record.spec.exit,
    )
