"""A background response's life in an attempt (the Responses wire's ``background``): read on
where the last attempt stopped, or let go and counted when it cannot be (refused, expired,
made for another request), and stopped at the provider when the job is cancelled."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import replace

from resumeq.core.answer import redo_of
from resumeq.core.calibration import Calibration
from resumeq.core.continuation import plan_request
from resumeq.core.counting import let_go
from resumeq.core.errors import (
    ConfigError,
    ProviderError,
    ReattachRefused,
    RedisUnavailable,
)
from resumeq.core.gate import Cut
from resumeq.core.models import JobRecord, Lease, ResponsePosition
from resumeq.providers import (
    ProviderStream,
    Usage,
    background,
)
from resumeq.worker.call import (
    Call,
    splicer_for,
)
from resumeq.worker.context import WorkerContext

log = logging.getLogger(__name__)


class BackgroundResponses:
    """A background response's life in an attempt (the Responses wire's ``background``): read on"""

    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self.store = ctx.store

    def let_go(self, lease: Lease, job_id: str, response_id: str, provider: str) -> None:
        """Forget the job's background response (the next attempts do not read it), and
        have the janitor make sure it is stopped at the provider. Best effort while Redis
        is unreachable: the next response this attempt makes replaces it."""
        try:
            self.store.stop_responses([(job_id, response_id, provider)])
            self.store.forget_response(lease)
        except RedisUnavailable as exc:
            log.warning("job %s: the response was not let go: %s", job_id, exc)

    def refused_reattach(self, call: Call, exc: ReattachRefused) -> bool:
        """The provider cannot give the rest of the response: go on from the stored prefix
        with the profile's continuation, in this same attempt, once what the response made
        is counted (:meth:`_let_response_go`). Answers False when what is left is below
        what a request may ask for, or the job is byte-exact (the gate decides)."""
        record = call.record
        log.info("job %s: reattach refused, continuing instead: %s", record.id, exc)
        call.reattach_refused = str(exc)[:500]
        counted = self.let_response_go(call, hint=exc.billed_output)
        if record.spec.byte_exact or not counted:
            return False  # a continuation would be a new draw: the gate takes the exit
        return self.replan(call)

    def continue_without_response(self, call: Call, *, why: str) -> None:
        """The job's response is let go before the attempt's request (SPEC §22); with
        what is left after counting it the request is planned again, or skipped."""
        counted = self.let_response_go(call)
        if not counted or not self.replan(call):
            call.skip = Cut(
                kind="stream_cut",
                detail=f"the job's background response ({why}) was let go: "
                f"{call.carried} tokens it made counted, too little left to ask for",
            )

    def replan(self, call: Call) -> bool:
        """The continuation for what is left once :attr:`Call.carried` is counted; False
        when that is below what a request may ask for."""
        record, profile = call.record, call.profile
        remaining = record.remaining_tokens - call.carried
        if remaining < max(record.floor_tokens, profile.min_output_tokens, 1):
            return False
        ckpt, tool_choice = call.ckpt, call.plan.shape.tool_choice
        if call.plan.kind == "reattach":
            # The response carried a cut call on; now it is asked again (a background
            # profile does not continue calls), the calls kept as that says.
            redo = redo_of(ckpt.calls, record.spec, continue_calls=profile.continues_calls)
            ckpt.keep_calls(ckpt.calls, redo.kept if redo is not None else ckpt.calls)
            tool_choice = redo.tool_choice if redo is not None else None
            if redo is not None and redo.continued is not None:
                ckpt.continue_call()
        continued = ckpt.continued
        call.plan = plan_request(
            record.spec,
            profile,
            prefix=call.prefix,
            remaining_tokens=remaining,
            tool_choice=tool_choice,
            call=continued,
        )
        seam = continued.arguments if continued is not None else call.prefix
        call.splicer = splicer_for(call.plan, profile, seam)
        return True

    def let_response_go(self, call: Call, *, hint: int | None = None) -> bool:
        """One rule for a background response nobody will read on (SPEC §22): cancelled at
        its provider first (it bills what it made until it stops), then what it made and
        the cursor had not counted is counted (:meth:`_uncounted`) before anything else is
        bought or the job's exit is written; then it is forgotten. Answers False when Redis
        could not take the count (nothing more is bought then)."""
        found = self.uncounted(call, hint=hint)
        if found is None:
            return True
        response_id, provider, carried = found
        self.let_go(call.ckpt.lease, call.record.id, response_id, provider)
        if carried:
            try:
                call.ckpt.carry(carried)
            except RedisUnavailable as unreachable:
                log.warning("job %s: the response let go not counted: %s", call.record.id,
                            unreachable)  # fmt: skip
                return False
            call.carried += carried
        return True

    def uncounted(self, call: Call, *, hint: int | None = None) -> tuple[str, str, int] | None:
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
        released = self.release(provider, response_id)
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
            calibration=None if billed is not None else self.calibration(provider, record),
        )
        call.response_id, call.response_bases = None, None
        if released.billed_output is None and released.output_bytes is None:
            with contextlib.suppress(RedisUnavailable):  # not stopped yet: the janitor asks
                self.store.stop_responses([(record.id, response_id, provider)])
        return response_id, provider, carried

    def calibration(self, provider: str, record: JobRecord) -> Calibration | None:
        """What the exact counts of ``provider``'s answers by the job's model say."""
        try:
            margin = self.ctx.settings.profile(provider).estimate_margin
        except ConfigError:
            return None
        return self.ctx.calibrations.calibration(provider, record.spec.model, margin=margin)

    def release(self, provider: str, response_id: str) -> background.Released:
        """Cancel the response at its provider and read what it made (best effort)."""
        try:
            profile = self.ctx.settings.profile(provider)
        except ConfigError:
            return background.Released()
        http = self.ctx.http.get(provider, profile)
        return background.release_background_response(
            self.ctx.settings, provider, response_id, http
        )

    def started(self, call: Call, stream: ProviderStream) -> None:
        """The provider named the response it makes: recorded at once, before any of its
        output, so that a worker that dies now leaves a response to read on."""
        position = self.position(call, stream)
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
    def position(call: Call, stream: ProviderStream) -> ResponsePosition | None:
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

    def count_cancelled_response(self, call: Call) -> None:
        """The job was cancelled while this attempt read a background response: cancel it
        at the provider, then count what it made past what the cursor had (SPEC §22) into
        the attempt's record — the cursor of a cancelled job takes no more writes, but the
        ledger and the totals still say what was billed."""
        if call.response_id is None or not call.profile.background:
            return
        found = self.uncounted(call)
        if found is None:
            return
        response_id, _, carried = found
        if carried:
            log.info("job %s: its cancelled response made %d tokens past the cursor",
                     call.record.id, carried)  # fmt: skip
        call.unread += carried
        call.unread_response = response_id

    def cancel_response(self, call: Call, why: str) -> None:
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
    def reattached_usage(record: JobRecord, usage: Usage) -> Usage:
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
