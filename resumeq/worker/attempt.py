"""One attempt of a job, as RQ runs it (SPEC §8).

Acquire the lease; build the request (fresh, retry or continuation); stream; checkpoint
every ``flush_tokens`` tokens or ``flush_ms``, whichever first (while the provider pauses,
from the process's idle flusher), and at the end; renew the lease from a heartbeat every
TTL/3; close the stream at once when a renew or a flush is refused. When the stream ends or
is cut: flush what arrived, make the counts exact where the provider allows, ask the gate,
and apply its exit — with this attempt's ledger record written by the same script.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC

import redis
from rq import get_current_job

from resumeq.core.calibration import Calibration, Sample, pieces
from resumeq.core.continuation import AttemptKind, RequestPlan, plan_reattach, plan_request
from resumeq.core.counting import Count, Tally, let_go, settle
from resumeq.core.errors import (
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
    ReattachRefused,
    RedisUnavailable,
    ResponseQueued,
    ResumeqError,
    RetryableProviderError,
    Stalled,
    StreamCut,
    WriteRefused,
)
from resumeq.core.gate import Cut, Decision, JobView, decide, pacing
from resumeq.core.ledger import AttemptRecord
from resumeq.core.models import JobRecord, JobState, Lease, ResponsePosition, made_for
from resumeq.core.settings import ProviderProfile
from resumeq.core.splice import Splicer, SpliceReport
from resumeq.providers import (
    ProviderClient,
    ProviderStream,
    Started,
    StreamEvent,
    TextDelta,
    Usage,
    background,
    make_client,
)
from resumeq.store import SPILL_QUEUE, metrics
from resumeq.store.metrics import FLUSH_LATENCY, RESUME_LATENCY, Histogram
from resumeq.worker.checkpoint import Checkpointer
from resumeq.worker.context import Handoff, WorkerContext, context
from resumeq.worker.exits import apply_decision

log = logging.getLogger(__name__)

#: How long the final flush keeps trying while Redis is unreachable, between tries.
_RETRY_PAUSE_S = 0.25
#: A queued background response is asked again after this, doubling up to the maximum.
QUEUED_POLL_S = 0.25
QUEUED_POLL_MAX_S = 5.0


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
    #: The stored prefix when the attempt started.
    prefix: str = ""
    #: The background response this attempt reads (made, or reattached), if any.
    response_id: str | None = None
    #: Why the response the attempt meant to read on could not be (it continued instead),
    #: and that response's output tokens the cursor had not counted (billed, never read).
    reattach_refused: str = ""
    carried: int = 0
    #: Output a cancelled job's background response made past the cursor: billed, never
    #: read, and never in the cursor (a cancelled job takes no more writes).
    unread: int = 0
    unread_response: str | None = None
    #: The cursor and the stored text's bytes where the response this attempt made began
    #: (None: it made none; a reattached one's are the record's).
    response_bases: tuple[int, int] | None = None
    #: Set when nothing is to be bought (what a response let go made left too little):
    #: the attempt ends with this cut, before any request.
    skip: Cut | None = None

    @functools.cached_property
    def made_for(self) -> str:
        """What this attempt's background responses are made for (see :func:`made_for`)."""
        return made_for(self.record.spec.provider, self.record.spec.model)


def run_attempt(job_id: str) -> str:
    """The RQ job function of one attempt. Answers what became of the job; raises
    :class:`~resumeq.core.errors.JobFailed` when resumeq failed it, so that RQ counts the
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
        self.ctx.presence.start()  # never a lease held by a process that shows no presence
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
        call = self._prepare(lease, record)
        profile, prefix, ckpt = call.profile, call.prefix, call.ckpt
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
            if isinstance(lost, JobCancelled):
                self._count_cancelled_response(call)
            self._record_stopped(call, result, started, lost)
            raise lost
        for note in call.splicer.report.notes:
            log.info("job %s attempt %d: %s", record.id, record.attempt, note)

        # A handoff is no failure of the provider's: it neither starts nor lengthens a run
        # of attempts that delivered nothing.
        progressed = ckpt.flushed_tokens > 0 or ckpt.flushed_chars > 0 or handoff
        now_ms = _now_ms()
        view = JobView(
            budget_tokens=record.budget_tokens,
            floor_tokens=max(record.floor_tokens, profile.min_output_tokens),
            spent_output_tokens=record.spent_output_tokens + ckpt.flushed_tokens + call.carried,
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
            reads_on=_reads_on(call, result),
        )
        decision = decide(view, result.cut, jitter=random.random())
        if decision.action not in ("retry", "resume") and result.cut.kind != "finished":
            # An exit: nobody reads this attempt's background response on; what it made is
            # counted before the exit is written.
            self._let_response_go(call)
        handed_on = handoff and decision.action in ("retry", "resume")
        entry = self._ledger(
            record,
            started,
            outcome="handoff" if handed_on else decision.action,
            cut=result.cut,
            call=call,
            plan=call.plan,
            usage=result.usage,
            ckpt=ckpt,
            count=count,
            seam=call.splicer.report,
            first_byte_ms=result.first_byte_ms,
            decision=decision,
        )
        log.info(
            "job %s attempt %d (%s): %s, %d tokens persisted -> %s (%s)",
            record.id,
            record.attempt,
            _kind(record, call.plan),
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
            if isinstance(exc, JobCancelled):
                self._count_cancelled_response(call)
            self._record_stopped(call, result, started, exc, count=count)
            raise
        if result.cut.kind != "finished" and decision.action not in ("retry", "resume"):
            self._cancel_response(call, f"the job's exit is {decision.action}")
        self._record_metrics(call, result)
        return state

    def _prepare(self, lease: Lease, record: JobRecord) -> _Call:
        """What the attempt will call: its profile's client, its plan (a reattach, a fresh
        request or a continuation) and its checkpointer."""
        profile = self.ctx.settings.profile(record.spec.provider)
        prefix = self.store.text(record.id)
        client = make_client(profile, self.ctx.http.get(record.spec.provider, profile))
        plan = self._plan(lease, record, profile, prefix)
        ckpt = Checkpointer(
            self.store,
            lease,
            revision=record.revision,
            flush_tokens=self.worker.flush_tokens,
            flush_ms=self.worker.flush_ms,
            flush_min_ms=self.worker.flush_min_ms,
        )
        call = _Call(record, profile, plan, client, _splicer(plan, profile, prefix), ckpt, prefix)
        if plan.kind == "reattach":
            call.response_id = plan.response_id
        elif record.response_id is not None:
            # A response this attempt cannot read on (made for another profile or model:
            # the job was moved): what it made is counted before anything is bought.
            self._continue_without_response(call, why="it cannot be read on")
        return call

    # -- background responses --------------------------------------------------------------

    def _plan(
        self, lease: Lease, record: JobRecord, profile: ProviderProfile, prefix: str
    ) -> RequestPlan:
        """Read on the background response an earlier attempt made, where it can be;
        otherwise a fresh request or a continuation (the response is let go once the
        attempt can count it: :meth:`_let_response_go`)."""
        spec = record.spec
        if record.response_id is not None:
            if profile.background and record.reattachable:
                return plan_reattach(
                    spec,
                    response_id=record.response_id,
                    after=record.response_seq or 0,
                    remaining_tokens=record.remaining_tokens,
                )
            why = "its output since the last checkpoint cannot be placed"
            if record.response_for != made_for(spec.provider, spec.model):
                why = f"it was made for {record.response_for}, not {spec.provider} {spec.model}"
            elif not profile.background:
                why = f"profile {spec.provider} no longer makes background responses"
            log.info("job %s: not reading on response %s: %s", record.id, record.response_id, why)
        return plan_request(spec, profile, prefix=prefix, remaining_tokens=record.remaining_tokens)

    def _let_go(self, lease: Lease, job_id: str, response_id: str, provider: str) -> None:
        """Forget the job's background response (the next attempts do not read it), and
        have the janitor make sure it is stopped at the provider. Best effort while Redis
        is unreachable: the next response this attempt makes replaces it."""
        try:
            self.store.stop_responses([(job_id, response_id, provider)])
            self.store.forget_response(lease)
        except RedisUnavailable as exc:
            log.warning("job %s: the response was not let go: %s", job_id, exc)

    def _refused_reattach(self, call: _Call, exc: ReattachRefused) -> bool:
        """The provider cannot give the rest of the response: go on from the stored prefix
        with the profile's continuation, in this same attempt, once what the response made
        is counted (:meth:`_let_response_go`). Answers False when what is left is below
        what a request may ask for, or the job is byte-exact (the gate decides)."""
        record = call.record
        log.info("job %s: reattach refused, continuing instead: %s", record.id, exc)
        call.reattach_refused = str(exc)[:500]
        counted = self._let_response_go(call, hint=exc.billed_output)
        if record.spec.byte_exact or not counted:
            return False  # a continuation would be a new draw: the gate takes the exit
        return self._replan(call)

    def _continue_without_response(self, call: _Call, *, why: str) -> None:
        """The job's response is let go before the attempt's request (SPEC §22); with
        what is left after counting it the request is planned again, or skipped."""
        counted = self._let_response_go(call)
        if not counted or not self._replan(call):
            call.skip = Cut(
                kind="stream_cut",
                detail=f"the job's background response ({why}) was let go: "
                f"{call.carried} tokens it made counted, too little left to ask for",
            )

    def _replan(self, call: _Call) -> bool:
        """The continuation for what is left once :attr:`_Call.carried` is counted; False
        when that is below what a request may ask for."""
        record, profile = call.record, call.profile
        remaining = record.remaining_tokens - call.carried
        if remaining < max(record.floor_tokens, profile.min_output_tokens, 1):
            return False
        call.plan = plan_request(
            record.spec, profile, prefix=call.prefix, remaining_tokens=remaining
        )
        call.splicer = _splicer(call.plan, profile, call.prefix)
        return True

    def _let_response_go(self, call: _Call, *, hint: int | None = None) -> bool:
        """One rule for a background response nobody will read on (SPEC §22): cancelled at
        its provider first (it bills what it made until it stops), then what it made and
        the cursor had not counted is counted (:meth:`_uncounted`) before anything else is
        bought or the job's exit is written; then it is forgotten. Answers False when Redis
        could not take the count (nothing more is bought then)."""
        found = self._uncounted(call, hint=hint)
        if found is None:
            return True
        response_id, provider, carried = found
        self._let_go(call.ckpt.lease, call.record.id, response_id, provider)
        if carried:
            try:
                call.ckpt.carry(carried)
            except RedisUnavailable as unreachable:
                log.warning("job %s: the response let go not counted: %s", call.record.id,
                            unreachable)  # fmt: skip
                return False
            call.carried += carried
        return True

    def _uncounted(self, call: _Call, *, hint: int | None = None) -> tuple[str, str, int] | None:
        """Cancel the response the attempt reads (or the job had) and answer it with its
        profile and the output it made past the cursor: the provider's figure, else
        ``hint``, else an estimate that errs high (:func:`resumeq.core.counting.let_go`). None:
        there is none."""
        record, ckpt = call.record, call.ckpt
        made_here = call.response_id is not None and call.response_bases is not None
        response_id = call.response_id or record.response_id
        if response_id is None:
            return None
        if made_here:
            provider = record.spec.provider
            spent_base, text_base = call.response_bases or (0, 0)
        else:
            provider = (record.response_for or "").partition(" ")[0]
            spent_base = record.response_spent_base or 0
            text_base = record.response_text_base or 0
        released = self._release(provider, response_id)
        try:
            ratio = self.ctx.settings.profile(provider).bytes_per_token
        except ConfigError:
            ratio = call.profile.bytes_per_token
        billed = released.billed_output if released.billed_output is not None else hint
        spent = record.spent_output_tokens + ckpt.flushed_tokens + call.carried
        carried = let_go(
            already=spent - spent_base,
            billed=billed,
            output_bytes=released.output_bytes,
            stored_bytes=len(call.prefix.encode("utf-8")) + ckpt.flushed_bytes - text_base,
            bytes_per_token=ratio,
            calibration=None if billed is not None else self._calibration(provider, record),
        )
        call.response_id, call.response_bases = None, None
        if released.billed_output is None and released.output_bytes is None:
            with contextlib.suppress(RedisUnavailable):  # not stopped yet: the janitor asks
                self.store.stop_responses([(record.id, response_id, provider)])
        return response_id, provider, carried

    def _calibration(self, provider: str, record: JobRecord) -> Calibration | None:
        """What the exact counts of ``provider``'s answers by the job's model say."""
        try:
            margin = self.ctx.settings.profile(provider).estimate_margin
        except ConfigError:
            return None
        return self.ctx.calibrations.calibration(provider, record.spec.model, margin=margin)

    def _release(self, provider: str, response_id: str) -> background.Released:
        """Cancel the response at its provider and read what it made (best effort)."""
        try:
            profile = self.ctx.settings.profile(provider)
        except ConfigError:
            return background.Released()
        http = self.ctx.http.get(provider, profile)
        return background.release_background_response(
            self.ctx.settings, provider, response_id, http
        )

    def _started(self, call: _Call, stream: ProviderStream) -> None:
        """The provider named the response it makes: recorded at once, before any of its
        output, so that a worker that dies now leaves a response to read on."""
        position = self._position(call, stream)
        if position is not None:
            call.response_id = position.response_id
            # What it makes is what the cursor gains from here (as note_response says).
            ckpt = call.ckpt
            call.response_bases = (
                call.record.spent_output_tokens + ckpt.flushed_tokens + call.carried,
                len(call.prefix.encode("utf-8")) + ckpt.flushed_bytes,
            )
            ckpt.note(position)  # Redis unreachable: every flush tries again, the last one too

    @staticmethod
    def _position(call: _Call, stream: ProviderStream) -> ResponsePosition | None:
        """Where the checkpoint stands in the background response once the delta just read
        is added: the event just read, once the seam is settled (until then the stored text
        matches no event of it). None: it comes from no background response."""
        if not call.profile.background or stream.response_id is None:
            return None
        return ResponsePosition(
            response_id=stream.response_id,
            sequence=stream.sequence if call.splicer.passing and not stream.holding else None,
            made_for=call.made_for,
        )

    def _count_cancelled_response(self, call: _Call) -> None:
        """The job was cancelled while this attempt read a background response: cancel it
        at the provider, then count what it made past what the cursor had (SPEC §22) into
        the attempt's record — the cursor of a cancelled job takes no more writes, but the
        ledger and the totals still say what was billed."""
        if call.response_id is None or not call.profile.background:
            return
        found = self._uncounted(call)
        if found is None:
            return
        response_id, _, carried = found
        if carried:
            log.info("job %s: its cancelled response made %d tokens past the cursor",
                     call.record.id, carried)  # fmt: skip
        call.unread += carried
        call.unread_response = response_id

    def _cancel_response(self, call: _Call, why: str) -> None:
        """Stop the attempt's background response, which nobody will read (best effort: a
        response the provider could not be asked about is left to the janitor)."""
        response_id, job_id = call.response_id, call.record.id
        if response_id is None or not call.profile.background:
            return
        try:
            stopped = call.client.cancel(response_id)
        except ProviderError as exc:
            log.warning("job %s: response %s not cancelled: %s", job_id, response_id, exc)
            with contextlib.suppress(RedisUnavailable):
                self.store.stop_responses([(job_id, response_id, call.record.spec.provider)])
        else:
            if stopped:
                log.info("job %s: cancelled response %s: %s", job_id, response_id, why)

    @staticmethod
    def _reattached_usage(record: JobRecord, usage: Usage) -> Usage:
        """A reattached response's usage is the whole response's: this attempt's output is
        what the earlier attempts that read it did not already count. Its input was billed
        once, and counted by nobody before (a stream cut before its end has no usage)."""
        if usage.output_tokens is None:
            return usage
        already = record.spent_output_tokens - (record.response_spent_base or 0)
        return replace(
            usage,
            output_tokens=max(0, usage.output_tokens - already),
            reasoning_tokens=usage.reasoning_tokens if already == 0 else None,
        )

    def _record_metrics(self, call: _Call, result: StreamResult) -> None:
        """This attempt's flush round trips, and for a continuation the time from its cut
        to its first token, into the cluster-wide histograms (best effort)."""
        resume = Histogram()
        cut_ms = call.record.cut_ms
        if call.plan.kind in ("resume", "reattach") and cut_ms and result.first_text_ms:
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
            call=call,
            plan=call.plan,
            usage=result.usage,
            ckpt=call.ckpt,
            count=count,
            seam=call.splicer.report,
            first_byte_ms=result.first_byte_ms,
        ).model_copy(update={"billed_lower_bound": True})
        try:
            self.store.append_ledger(
                call.record.id,
                attempt=call.record.attempt,
                entry=entry.to_json_dict(),
                counts_response=call.unread_response,
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
        ckpt = call.ckpt

        def on_lost(exc: BaseException) -> None:
            lost.set()
            for stream in opened:
                stream.interrupt()

        def on_handoff() -> None:
            for stream in opened:
                stream.interrupt_for_handoff()

        refused: list[WriteRefused] = []

        def on_refused(exc: WriteRefused) -> None:  # an idle flush refused
            refused.append(exc)
            on_lost(exc)

        count = Count(0, False, "estimate")
        result = StreamResult(Cut(kind="stream_cut"))
        with contextlib.ExitStack() as holding:  # let go in reverse order, whatever happens
            heartbeat = self.ctx.leases.hold(
                ckpt.lease, on_lost=on_lost, confirmed=lambda: ckpt.lease_confirmed
            )
            holding.callback(heartbeat.release)
            ckpt.renewed = heartbeat.last_extended
            holding.callback(self.ctx.handoff.unwatch, self.ctx.handoff.watch(on_handoff))
            holding.callback(ckpt.close)
            holding.callback(self.ctx.idle.unwatch, self.ctx.idle.watch(ckpt, on_refused))
            try:
                self._stream(call, result, lost=lost, opened=opened)
                if not lost.is_set():
                    # A refused reattach's continuation has its own splicer. What it still
                    # held is released at the last event it was fed from, not one that
                    # follows it: the position stays where the seam last stood.
                    splicer = call.splicer
                    ckpt.add(splicer.finish(), splicer.take_tokens(), exact=ckpt.exact)
                    self._until_written(ckpt.flush)  # the text is durable before any counting
                    count = self._count(call, result)
                    self._until_written(lambda: ckpt.settle(count.tokens, exact=count.exact))
            except (WriteRefused, JobNotFound) as exc:  # a checkpoint refused: stop at once
                result.lost = exc
                for stream in opened:
                    stream.close()
        if lost.is_set() and result.lost is None:
            result.lost = (
                heartbeat.lost
                or (refused[0] if refused else None)
                or LeaseLost("lease lost", job_id=ckpt.lease.job_id)
            )
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
        stream = self._open(call, result, lost)
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
                    self._take(event, result, call, stream)
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
        if call.plan.kind == "reattach":
            result.usage = self._reattached_usage(call.record, stream.usage)
        result.cut = Cut(kind="finished", finish_reason=stream.finish_reason)

    def _open(
        self, call: _Call, result: StreamResult, lost: threading.Event
    ) -> ProviderStream | None:
        """The provider's stream; None, with how the attempt ended in ``result``, when it
        was refused — or not asked at all: the worker is shutting down, nothing is bought.
        A background response that cannot be read on is continued instead; one still
        ``queued`` is asked again, less and less often, for up to the profile's
        ``background_queued_timeout_s``."""
        handoff = self.ctx.handoff
        polls = 0
        queued_since = time.monotonic()
        if call.skip is not None:
            result.cut = call.skip
            result.tally.opened = False
            return None
        while not handoff.is_set() and not lost.is_set():
            try:
                stream = call.client.open(call.plan)
                result.first_byte_ms = _now_ms()
                return stream
            except ReattachRefused as exc:
                if not self._refused_reattach(call, exc):
                    result.cut = Cut(kind="stream_cut", detail=f"reattach refused: {exc}")
                    break
            except ResponseQueued as exc:
                waited = time.monotonic() - queued_since
                if waited >= call.profile.background_queued_timeout_s:
                    result.cut = Cut(kind="retryable", detail=f"{exc} after {waited:.0f} s")
                    break
                _pause(min(QUEUED_POLL_MAX_S, QUEUED_POLL_S * 2 ** min(polls, 8)), lost, handoff)
                polls += 1
            except RetryableProviderError as exc:
                result.cut = Cut(kind="retryable", retry_after_s=exc.retry_after, detail=str(exc))
                result.first_byte_ms = _now_ms() if exc.status is not None else None
                break
            except FatalProviderError as exc:
                result.cut = Cut(kind="fatal", detail=str(exc))
                result.first_byte_ms = _now_ms() if exc.status is not None else None
                break
        result.tally.opened = False  # refused before a stream: nothing was bought
        return None

    def _take(
        self, event: StreamEvent, result: StreamResult, call: _Call, stream: ProviderStream
    ) -> None:
        """One stream event into the splice, the checkpoint and the tally."""
        tally, splicer, ckpt = result.tally, call.splicer, call.ckpt
        if isinstance(event, Started):
            self._started(call, stream)
            return
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
            released = splicer.feed(event.text, event.tokens)
            position = self._position(call, stream)
            ckpt.add(released, splicer.take_tokens(), exact=event.exact, response=position)
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
        position = self._position(call, stream)
        ckpt.add("", event.tokens, exact=event.exact, hidden_bytes=size, response=position)

    # -- counting and the last flush -----------------------------------------------------

    def _count(self, call: _Call, result: StreamResult, *, ask_tokenizer: bool = True) -> Count:
        """This attempt's output tokens (:mod:`resumeq.core.counting`), asking the counting
        endpoint where the profile says and nothing better is known."""
        record, profile, ckpt = call.record, call.profile, call.ckpt
        seam = call.splicer.report
        generated = result.received.text()[seam.echo_dropped :]
        tally = result.tally
        tally.text_chunks = result.received.count - seam.echo_pieces
        tally.text_bytes = len(generated.encode("utf-8"))
        tally.text_pieces = pieces(generated)
        tally.tokens = ckpt.flushed_tokens + ckpt.pending_tokens
        usage = result.usage
        asked: list[int | None] = [None, None]  # the counting endpoint's, once asked

        def counted(calibration: Calibration | None = None) -> Count:
            return settle(
                tally,
                finished=result.cut.kind == "finished",
                reported=usage.output_tokens,
                reported_reasoning=usage.reasoning_tokens,
                tokenizer_text=asked[0],
                tokenizer_reasoning=asked[1],
                bytes_per_token=profile.bytes_per_token,
                calibration=calibration,
            )

        if _reads_on(call, result):
            # The next attempt reads the rest of this response from the provider, and with
            # it the response's billed total: counted as it came (a lower bound), never a
            # guess that errs high — one the total would be charged on top of.
            return Count(tally.tokens, False, "chunks", tally.reasoning_tokens or None)
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
                asked[:] = [by_text, by_reasoning]
                count = counted()
        if count.source == "estimate":
            calibration = self.ctx.calibrations.calibration(
                record.spec.provider, record.spec.model, margin=profile.estimate_margin
            )
            if calibration is not None:
                count = replace(counted(calibration), refused=count.refused)
        elif count.exact and call.plan.kind != "reattach":
            self._calibrate(call, tally, count)
        for why in count.refused:
            log.warning(
                "job %s attempt %d: not believed, %s; the count stays an estimate",
                record.id,
                record.attempt,
                why,
            )
        return count

    def _calibrate(self, call: _Call, tally: Tally, count: Count) -> None:
        """An exact count of this attempt's text is a calibration sample (text only: an
        attempt with tool calls, or reasoning whose tokens are not known apart, is none)."""
        if tally.other_chunks or (tally.reasoning_chunks and count.reasoning_tokens is None):
            return
        tokens = count.tokens - (count.reasoning_tokens or 0)
        sample = Sample(tally.text_bytes, tally.text_chunks, tally.text_pieces, tokens)
        spec = call.record.spec
        self.ctx.calibrations.record(spec.provider, spec.model, sample)

    def _count_timeout(self, ckpt: Checkpointer, profile: ProviderProfile) -> float:
        """A counting request may take no longer than the lease has left (less a margin for
        the writes after it), nor than the stall timeout."""
        ttl_s = ckpt.lease.ttl_ms / 1000.0
        left = ttl_s - (time.monotonic() - ckpt.lease_extended()) - ttl_s / 3
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
        call: _Call | None = None,
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
        refused = call.reattach_refused if call is not None else ""
        carried = call.carried if call is not None else 0
        extra = {"reattach_refused": refused} if refused else {}
        return AttemptRecord(
            **extra,
            attempt=record.attempt,
            kind=_kind(record, plan),
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
            # A reattach asks for nothing new: the response's own limit stands.
            max_tokens=plan.max_tokens if plan and plan.kind != "reattach" else None,
            prefix_tokens=record.spent_output_tokens,
            prefix_chars_sent=plan.prefix_chars_sent if plan else 0,
            input_tokens=usage.input_tokens,
            cached_input_tokens=usage.cached_input_tokens,
            cache_creation_input_tokens=usage.cache_creation_input_tokens,
            output_tokens=count.tokens if count and count.exact else None,
            output_tokens_persisted=(ckpt.flushed_tokens if ckpt else 0) + carried,
            carried_output_tokens=carried,
            unread_output_tokens=call.unread if call is not None else 0,
            reasoning_tokens=count.reasoning_tokens if count else None,
            chars_persisted=ckpt.flushed_chars if ckpt else 0,
            bytes_persisted=ckpt.flushed_bytes if ckpt else 0,
            count_source=count.source if count else "usage",
            counts_exact=count.exact if count else True,
            count_refused="; ".join(count.refused)[:500] or None if count else None,
            echo_chars=seam.echo_dropped if seam else 0,
            overlap_chars=seam.overlap_dropped if seam else 0,
        )


def _reads_on(call: _Call, result: StreamResult) -> bool:
    """Whether the next attempt reads on from this attempt's background response: it was
    cut (not finished, not refused before a stream) where the stored text ends at one of
    its events."""
    position = call.ckpt.response
    return (
        call.profile.background
        and result.cut.kind != "finished"
        and position is not None
        and position.sequence is not None
    )


def _kind(record: JobRecord, plan: RequestPlan | None) -> AttemptKind:
    """What the attempt was, as it ran: a reattach refused by the provider continued."""
    if plan is None:
        return record.attempt_kind
    if plan.kind in ("resume", "reattach"):
        return plan.kind
    return "fresh" if record.attempt <= 1 else "retry"


def _splicer(plan: RequestPlan, profile: ProviderProfile, prefix: str) -> Splicer:
    """How the attempt's text joins the stored prefix: a continuation's seam, or (a fresh
    request, a response read on) straight through."""
    return Splicer(
        prefix if plan.kind != "reattach" else "",
        sent=plan.sent if plan.kind == "resume" else None,
        trimmed=plan.trimmed,
        mode=profile.continue_mode,
        echo=profile.echo_policy,
    )


def _pause(seconds: float, lost: threading.Event, handoff: Handoff) -> None:
    """Wait ``seconds``, or less once the lease is lost or the worker shuts down."""
    deadline = time.monotonic() + seconds
    while not lost.is_set() and not handoff.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            return
        lost.wait(min(left, 0.1))


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
