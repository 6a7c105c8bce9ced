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
from dataclasses import dataclass, field

from rq import get_current_job

from resumeq.checkpoint import Checkpointer
from resumeq.context import WorkerContext, context
from resumeq.continuation import RequestPlan, plan_request
from resumeq.errors import (
    ConfigError,
    FatalProviderError,
    InvalidTransition,
    JobNotFound,
    LeaseLost,
    ProviderError,
    RetryableProviderError,
    Stalled,
    StreamCut,
    WriteRefused,
)
from resumeq.exits import apply_decision
from resumeq.gate import Cut, Decision, JobView, decide
from resumeq.heartbeat import Heartbeat
from resumeq.ledger import AttemptRecord, CountSource
from resumeq.models import JobRecord, JobState, Lease
from resumeq.providers import ProviderClient, ProviderStream, TextDelta, Usage, make_client
from resumeq.queueing import SPILL_QUEUE
from resumeq.settings import ProviderProfile
from resumeq.splice import Splicer

log = logging.getLogger(__name__)

#: How long the final flush keeps trying while Redis is unreachable, between tries.
_RETRY_PAUSE_S = 0.25


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class StreamResult:
    """How the stream ended, and what it said about itself."""

    cut: Cut
    usage: Usage = field(default_factory=Usage)
    received: list[str] = field(default_factory=list)
    lost: BaseException | None = None


def run_attempt(job_id: str) -> str:
    """The RQ job function of one attempt."""
    rq_job = get_current_job()
    from_spill = rq_job is not None and rq_job.origin == SPILL_QUEUE
    return AttemptRunner(context()).run(job_id, from_spill=from_spill)


class AttemptRunner:
    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self.store = ctx.store
        self.worker = ctx.settings.file.worker

    def run(self, job_id: str, *, from_spill: bool = False) -> str:
        """Run one attempt; answers the state the job reached (or why nothing ran)."""
        if from_spill:
            self._take_from_spill(job_id)
        try:
            got = self.store.acquire(job_id, worker=self.ctx.name, ttl_ms=self.worker.lease_ttl_ms)
        except (InvalidTransition, JobNotFound) as exc:
            # Not queued (cancelled, already running elsewhere, gone): a duplicate or stale
            # RQ job. Nothing to do, and nothing was paid for.
            log.info("job %s: attempt not started: %s", job_id, exc)
            return "skipped"
        try:
            return self._attempt(got.lease, got.record)
        except WriteRefused as exc:
            log.warning("job %s: stopped, %s", job_id, exc)
            return "lost"

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
            entry = self._ledger(record, started, outcome=early.action, cut=None)
            return apply_decision(
                self.store, self.ctx.redis, lease, record, early, ledger=entry.to_json_dict()
            )
        profile = self.ctx.settings.profile(record.spec.provider)
        prefix = self.store.text(record.id)
        plan = plan_request(
            record.spec, profile, prefix=prefix, remaining_tokens=record.remaining_tokens
        )
        client = make_client(profile, self.ctx.http)
        ckpt = Checkpointer(
            self.store,
            lease,
            revision=record.revision,
            flush_tokens=self.worker.flush_tokens,
            flush_ms=self.worker.flush_ms,
            flush_min_ms=self.worker.flush_min_ms,
        )
        splicer = Splicer(prefix, trimmed=plan.trimmed)
        result = self._stream_with_heartbeat(client, plan, splicer, ckpt)
        if result.lost is not None:
            raise (
                result.lost
                if isinstance(result.lost, WriteRefused)
                else LeaseLost(str(result.lost), job_id=record.id)
            )
        ckpt.add(splicer.finish(), 0, exact=ckpt.exact)
        exact_total, source = self._exact_total(result, client, profile, record, ckpt)
        self._final_flush(ckpt, exact_total)

        view = JobView(
            budget_tokens=record.budget_tokens,
            floor_tokens=record.floor_tokens,
            spent_output_tokens=record.spent_output_tokens + ckpt.flushed_tokens,
            prefix_chars=len(prefix) + ckpt.flushed_chars,
            attempts=record.attempt,
            spill_count=record.spill_count,
            counts_exact=record.counts_exact and ckpt.exact,
            require_exact_counts=record.spec.require_exact_counts,
            byte_exact=record.spec.byte_exact,
            exit=record.spec.exit,
        )
        decision = decide(view, result.cut, jitter=random.random())
        entry = self._ledger(
            record,
            started,
            outcome=decision.action,
            cut=result.cut,
            plan=plan,
            usage=result.usage,
            ckpt=ckpt,
            source=source,
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
        return apply_decision(
            self.store,
            self.ctx.redis,
            ckpt.lease,
            record,
            decision,
            ledger=entry.to_json_dict(),
            finish_reason=result.cut.finish_reason or "",
        )

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

    def _stream_with_heartbeat(
        self, client: ProviderClient, plan: RequestPlan, splicer: Splicer, ckpt: Checkpointer
    ) -> StreamResult:
        lost = threading.Event()
        opened: list[ProviderStream] = []

        def on_lost(exc: BaseException) -> None:
            lost.set()
            for stream in opened:
                stream.close()

        heartbeat = Heartbeat(
            self.store, ckpt.lease, on_lost=on_lost, confirmed=lambda: ckpt.lease_confirmed
        ).start()
        try:
            result = self._stream(client, plan, splicer, ckpt, lost=lost, opened=opened)
        finally:
            heartbeat.stop()
        if lost.is_set():
            result.lost = heartbeat.lost or LeaseLost("lease lost", job_id=ckpt.lease.job_id)
        return result

    def _stream(
        self,
        client: ProviderClient,
        plan: RequestPlan,
        splicer: Splicer,
        ckpt: Checkpointer,
        *,
        lost: threading.Event,
        opened: list[ProviderStream],
    ) -> StreamResult:
        try:
            stream = client.open(plan)
        except RetryableProviderError as exc:
            return StreamResult(
                Cut(kind="retryable", retry_after_s=exc.retry_after, detail=str(exc))
            )
        except FatalProviderError as exc:
            return StreamResult(Cut(kind="fatal", detail=str(exc)))
        opened.append(stream)
        result = StreamResult(Cut(kind="stream_cut"))
        with stream:
            if lost.is_set():
                return result
            try:
                for event in stream:
                    if lost.is_set():
                        return result
                    if isinstance(event, TextDelta):
                        result.received.append(event.text)
                        ckpt.add(splicer.feed(event.text), event.tokens, exact=event.exact)
                    else:
                        result.usage = event
            except StreamCut as exc:
                kind = "stall" if isinstance(exc, Stalled) else "stream_cut"
                result.cut = Cut(
                    kind=kind,
                    detail=f"{exc.kind}: {exc}",
                    in_non_text_block=getattr(stream, "in_non_text_block", False),
                )
                return result
        result.usage = stream.usage
        result.cut = Cut(kind="finished", finish_reason=stream.finish_reason)
        return result

    # -- counting and the last flush -----------------------------------------------------

    def _exact_total(
        self,
        result: StreamResult,
        client: ProviderClient,
        profile: ProviderProfile,
        record: JobRecord,
        ckpt: Checkpointer,
    ) -> tuple[int | None, CountSource]:
        """This attempt's exact output count, where the provider tells it."""
        if ckpt.exact and ckpt.flushed_tokens + ckpt.pending_tokens > 0:
            return None, "usage"  # every delta was counted exactly (continuous usage)
        reported = result.usage.output_tokens
        if result.cut.kind == "finished" and reported is not None:
            return reported, "usage"
        if profile.counting == "tokenizer" and result.received:
            try:
                text = "".join(result.received)
                counted = client.count_text_tokens(text, model=record.spec.model)
            except ProviderError as exc:
                log.warning("job %s: counting endpoint failed: %s", record.id, exc)
            else:
                return counted, "tokenizer"
        if not result.received and reported is None:
            return 0, "chunks"  # nothing arrived: zero is exact
        return None, "chunks"

    def _final_flush(self, ckpt: Checkpointer, exact_total: int | None) -> None:
        while not ckpt.flush(exact_total=exact_total):
            time.sleep(_RETRY_PAUSE_S)  # Redis unreachable: ckpt raises once the lease is gone

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
        source: CountSource = "chunks",
    ) -> AttemptRecord:
        usage = usage or Usage()
        return AttemptRecord(
            attempt=record.attempt,
            kind=record.attempt_kind,
            worker=self.ctx.name,
            started_ms=started,
            ended_ms=_now_ms(),
            outcome=outcome,
            cut=cut.kind if cut else None,
            detail=(cut.detail if cut else "")[:500],
            provider=record.spec.provider,
            max_tokens=plan.max_tokens if plan else None,
            prefix_tokens=record.spent_output_tokens,
            prefix_chars_sent=plan.prefix_chars_sent if plan else 0,
            input_tokens=usage.input_tokens,
            cached_input_tokens=usage.cached_input_tokens,
            cache_creation_input_tokens=usage.cache_creation_input_tokens,
            output_tokens=_reported_output(cut, usage, ckpt),
            output_tokens_persisted=ckpt.flushed_tokens if ckpt else 0,
            chars_persisted=ckpt.flushed_chars if ckpt else 0,
            bytes_persisted=ckpt.flushed_bytes if ckpt else 0,
            count_source=source,
            counts_exact=bool(ckpt and ckpt.exact),
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


def _reported_output(cut: Cut | None, usage: Usage, ckpt: Checkpointer | None) -> int | None:
    """The provider's own output count for the attempt, when it is trustworthy: at the end
    of a finished stream, or cumulative in every chunk (continuous usage)."""
    if usage.output_tokens is None or cut is None:
        return None
    if cut.kind == "finished" or (ckpt is not None and ckpt.exact and ckpt.flushes > 0):
        return usage.output_tokens
    return None
