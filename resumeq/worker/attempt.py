"""One attempt of a job, as RQ runs it (SPEC §8).

Acquire the lease; build the request (fresh, retry or continuation); stream; checkpoint
every ``flush_tokens`` tokens or ``flush_ms``, whichever first (while the provider pauses,
from the process's idle flusher), and at the end; renew the lease from a heartbeat every
TTL/3; close the stream at once when a renew or a flush is refused. When the stream ends or
is cut: flush what arrived, make the counts exact where the provider allows, ask the gate,
and apply its exit — with this attempt's ledger record written by the same script.
"""

from __future__ import annotations

import logging
import random
from datetime import UTC

from rq import get_current_job

from resumeq.core.answer import DurableCall, problem_of, redo_of
from resumeq.core.continuation import RequestPlan, plan_reattach, plan_request
from resumeq.core.errors import (
    ConfigError,
    CorruptRecord,
    InvalidTransition,
    JobCancelled,
    JobFailed,
    JobNotFound,
    LeaseLost,
    ResumeqError,
    WriteRefused,
)
from resumeq.core.gate import Cut, Decision, JobView, decide, pacing
from resumeq.core.models import JobRecord, JobState, Lease, made_for
from resumeq.core.settings import ProviderProfile
from resumeq.core.spec import ToolChoice
from resumeq.providers import (
    make_client,
)
from resumeq.store import SPILL_QUEUE
from resumeq.worker.accounting import Accounting
from resumeq.worker.call import (
    Call,
    kind_of,
    now_ms,
    reads_on,
    splicer_for,
    view_of,
)
from resumeq.worker.checkpoint import Checkpointer
from resumeq.worker.context import WorkerContext, context
from resumeq.worker.exits import apply_decision
from resumeq.worker.responses import BackgroundResponses
from resumeq.worker.stream import Streamer

log = logging.getLogger(__name__)


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
    """One attempt from its lease to its exit: the request planned, the stream run by the
    :class:`~resumeq.worker.stream.Streamer`, its cost counted by the
    :class:`~resumeq.worker.accounting.Accounting`, the gate asked and its exit applied."""

    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self.store = ctx.store
        self.worker = ctx.settings.file.worker
        self.responses = BackgroundResponses(ctx)
        self.accounting = Accounting(ctx)
        self.streamer = Streamer(ctx, self.responses, self.accounting)

    def run(self, job_id: str, *, from_spill: bool = False, dequeued_ms: int | None = None) -> str:
        """Run one attempt; answers the state the job reached (or why nothing ran).
        ``dequeued_ms``: when a worker took the attempt's RQ job, for its ledger record."""
        self.accounting.dequeued_ms = dequeued_ms
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
        started = now_ms()
        early = self._refusal(record)
        if early is not None:
            entry = self.accounting.ledger(
                record, started, outcome=early.action, cut=None, decision=early
            )
            return apply_decision(
                self.store, self.ctx.redis, lease, record, early, ledger=entry.to_json_dict()
            )
        call = self._prepare(lease, record)
        profile, prefix, ckpt = call.profile, call.prefix, call.ckpt
        result, count = self.streamer.stream_and_count(call)
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
                self.responses.count_cancelled_response(call)
            self.accounting.record_stopped(call, result, started, lost)
            raise lost
        for note in call.splicer.report.notes:
            log.info("job %s attempt %d: %s", record.id, record.attempt, note)
        result.cut = self._checked(record, call, result.cut)

        # A handoff is no failure of the provider's: it neither starts nor lengthens a run
        # of attempts that delivered nothing.
        progressed = ckpt.flushed_tokens > 0 or ckpt.flushed_chars > 0 or handoff
        ended_ms = now_ms()
        view = JobView(
            budget_tokens=record.budget_tokens,
            floor_tokens=max(record.floor_tokens, profile.min_output_tokens),
            spent_output_tokens=record.spent_output_tokens + ckpt.flushed_tokens + call.carried,
            prefix_chars=len(prefix) + ckpt.flushed_chars + ckpt.continued_chars,
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
                now_ms=ended_ms,
            ),
            attempt_s=max(0.0, (ended_ms - started) / 1000.0),
            reads_on=reads_on(call, result),
        )
        decision = decide(view, result.cut, jitter=random.random())
        if decision.action not in ("retry", "resume") and result.cut.kind != "finished":
            # An exit: nobody reads this attempt's background response on; what it made is
            # counted before the exit is written.
            self.responses.let_response_go(call)
        handed_on = handoff and decision.action in ("retry", "resume")
        regenerated = self._regenerated(record, profile, view, decision, ckpt)
        entry = self.accounting.ledger(
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
            regenerated=regenerated,
        )
        log.info(
            "job %s attempt %d (%s): %s, %d tokens persisted -> %s (%s)",
            record.id,
            record.attempt,
            kind_of(record, call.plan),
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
                self.responses.count_cancelled_response(call)
            self.accounting.record_stopped(call, result, started, exc, count=count)
            raise
        if result.cut.kind != "finished" and decision.action not in ("retry", "resume"):
            self.responses.cancel_response(call, f"the job's exit is {decision.action}")
        self.accounting.record_metrics(call, result)
        return state

    def _prepare(self, lease: Lease, record: JobRecord) -> Call:
        """What the attempt will call: its profile's client, its plan (a reattach, a fresh
        request or a continuation) and its checkpointer."""
        profile = self.ctx.settings.profile(record.spec.provider)
        prefix = self.store.text(record.id)
        client = make_client(profile, self.ctx.http.get(record.spec.provider, profile))
        redo = redo_of(record.calls, record.spec, continue_calls=profile.continues_calls)
        continued = redo.continued if redo is not None else None
        plan = self._plan(
            lease,
            record,
            profile,
            prefix,
            tool_choice=redo.tool_choice if redo else None,
            call=continued,
        )
        ckpt = Checkpointer(
            self.store,
            lease,
            revision=record.revision,
            flush_tokens=self.worker.flush_tokens,
            flush_ms=self.worker.flush_ms,
            flush_min_ms=self.worker.flush_min_ms,
        )
        if plan.kind == "reattach":
            # The response goes on where it was cut, in a call too: every call is kept, and
            # the stream numbers them as the attempt that made the response did.
            ckpt.keep_calls(record.calls, record.calls)
            ckpt.resume_calls(record.response_attempt or 0)
        else:
            ckpt.keep_calls(record.calls, redo.kept if redo is not None else record.calls)
            if plan.continues_call:
                ckpt.continue_call()
        # What the splice joins: a continued call's arguments, or the text.
        seam = continued.arguments if plan.continues_call and continued else prefix
        call = Call(record, profile, plan, client, splicer_for(plan, profile, seam), ckpt, prefix)
        if plan.kind == "reattach":
            call.response_id = plan.response_id
        elif record.response_id is not None:
            # A response this attempt cannot read on (made for another profile or model:
            # the job was moved): what it made is counted before anything is bought.
            self.responses.continue_without_response(call, why="it cannot be read on")
        return call

    def _plan(
        self,
        lease: Lease,
        record: JobRecord,
        profile: ProviderProfile,
        prefix: str,
        *,
        tool_choice: ToolChoice | None = None,
        call: DurableCall | None = None,
    ) -> RequestPlan:
        """Read on the background response an earlier attempt made, where it can be;
        otherwise a fresh request or a continuation (the response is let go once the
        attempt can count it: :meth:`_let_response_go`). ``tool_choice``: a cut tool
        call's redo, where no response is read on (one that is carries the call on)."""
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
        return plan_request(
            spec,
            profile,
            prefix=prefix,
            remaining_tokens=record.remaining_tokens,
            tool_choice=tool_choice,
            call=call,
        )

    def _checked(self, record: JobRecord, call: Call, cut: Cut) -> Cut:
        """A finished answer, checked against what was asked (tool calls whose arguments
        are JSON objects, a document valid for its schema): one that is not is ``invalid``,
        the job's ``on_invalid`` case. A refusal is an answer of its own: not checked."""
        spec = record.spec
        shaped = spec.tools or spec.response_format
        if cut.kind != "finished" or not shaped or call.ckpt.refusal:
            return cut
        text = self.store.text(record.id) if spec.response_format is not None else ""
        problem = problem_of(spec, text, call.ckpt.calls, cut.finish_reason)
        if problem is None:
            return cut
        log.info("job %s attempt %d: invalid answer: %s", record.id, record.attempt, problem)
        return Cut(kind="invalid", finish_reason=cut.finish_reason, detail=problem)

    @staticmethod
    def _regenerated(
        record: JobRecord,
        profile: ProviderProfile,
        view: JobView,
        decision: Decision,
        ckpt: Checkpointer,
    ) -> tuple[int, str]:
        """Billed output the next attempt buys again, and why: an answer let go, or a tool
        call cut halfway."""
        if decision.discard:
            return view.spent_output_tokens - record.answer_base, "the answer was let go: " + (
                decision.reason
            )
        if decision.action not in ("retry", "resume") or view.reads_on:
            return 0, ""  # a response read on carries a cut call on: nothing bought again
        redo = redo_of(ckpt.calls, record.spec, continue_calls=profile.continues_calls)
        if redo is None or not redo.regenerated_tokens:
            return 0, ""  # nothing cut, or a call continued: nothing bought again
        return redo.regenerated_tokens, redo.why

    def _refusal(self, record: JobRecord) -> Decision | None:
        """An attempt that must not call the provider at all."""
        if record.spec.prompt_hash() != record.prompt_hash:
            return decide(view_of(record), Cut(kind="conflict"))
        try:
            self.ctx.settings.profile(record.spec.provider)
        except ConfigError as exc:
            return Decision(action="failed", reason=str(exc))
        if record.remaining_tokens <= 0:
            return Decision(action="done", reason="budget exhausted")
        return None
