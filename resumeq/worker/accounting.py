"""What an attempt cost: its cut counted (exact where the provider allows, calibrated where
it does not), its ledger record, and its metrics."""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import redis

from resumeq.core.calibration import Calibration, Sample, pieces
from resumeq.core.continuation import RequestPlan
from resumeq.core.counting import Count, Tally, settle
from resumeq.core.errors import (
    JobCancelled,
    ProviderError,
    ProviderUnavailable,
    ResumeqError,
)
from resumeq.core.gate import Cut, Decision
from resumeq.core.ledger import AttemptRecord
from resumeq.core.models import JobRecord
from resumeq.core.settings import ProviderProfile
from resumeq.core.splice import SpliceReport
from resumeq.providers import (
    Usage,
)
from resumeq.store import metrics
from resumeq.store.metrics import FLUSH_LATENCY, RESUME_LATENCY, Histogram
from resumeq.worker.call import (
    Call,
    StreamResult,
    kind_of,
    now_ms,
    reads_on,
)
from resumeq.worker.checkpoint import Checkpointer
from resumeq.worker.context import WorkerContext

log = logging.getLogger(__name__)


class Accounting:
    """What an attempt cost: its cut counted (exact where the provider allows, calibrated where"""

    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self.store = ctx.store
        #: When a worker took the attempt's RQ job (ms), for its ledger record.
        self.dequeued_ms: int | None = None

    def record_metrics(self, call: Call, result: StreamResult) -> None:
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

    def record_stopped(
        self,
        call: Call,
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
            count = self.count(call, result, ask_tokenizer=False)
        outcome = "cancelled" if isinstance(why, JobCancelled) else "fenced"
        entry = self.ledger(
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

    def count(self, call: Call, result: StreamResult, *, ask_tokenizer: bool = True) -> Count:
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

        if reads_on(call, result):
            # The next attempt reads the rest of this response from the provider, and with
            # it the response's billed total: counted as it came (a lower bound), never a
            # guess that errs high — one the total would be charged on top of.
            return Count(tally.tokens, False, "chunks", tally.reasoning_tokens or None)
        count = counted()
        reasoning = result.reasoning.text()
        ask = ask_tokenizer and profile.counts_with_tokenizer and bool(generated or reasoning)
        if count.source == "estimate" and ask:
            try:
                timeout = self.count_timeout(ckpt, profile)
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
            self.calibrate(call, tally, count)
        for why in count.refused:
            log.warning(
                "job %s attempt %d: not believed, %s; the count stays an estimate",
                record.id,
                record.attempt,
                why,
            )
        return count

    def calibrate(self, call: Call, tally: Tally, count: Count) -> None:
        """An exact count of this attempt's text is a calibration sample (text only: an
        attempt with tool calls, a call's arguments continued, or reasoning whose tokens are
        not known apart, is none)."""
        if tally.other_chunks or (tally.reasoning_chunks and count.reasoning_tokens is None):
            return
        if call.plan.continues_call:
            return  # the text was a call's arguments: JSON, not the model's prose
        tokens = count.tokens - (count.reasoning_tokens or 0)
        sample = Sample(tally.text_bytes, tally.text_chunks, tally.text_pieces, tokens)
        spec = call.record.spec
        self.ctx.calibrations.record(spec.provider, spec.model, sample)

    def count_timeout(self, ckpt: Checkpointer, profile: ProviderProfile) -> float:
        """A counting request may take no longer than the lease has left (less a margin for
        the writes after it), nor than the stall timeout."""
        ttl_s = ckpt.lease.ttl_ms / 1000.0
        left = ttl_s - (time.monotonic() - ckpt.lease_extended()) - ttl_s / 3
        if left <= 0:
            raise ProviderUnavailable("no lease time left to count in")
        return min(profile.stall_timeout_s, left)

    def ledger(
        self,
        record: JobRecord,
        started: int,
        *,
        call: Call | None = None,
        outcome: str,
        cut: Cut | None,
        plan: RequestPlan | None = None,
        usage: Usage | None = None,
        ckpt: Checkpointer | None = None,
        count: Count | None = None,
        seam: SpliceReport | None = None,
        first_byte_ms: int | None = None,
        decision: Decision | None = None,
        regenerated: tuple[int, str] = (0, ""),
    ) -> AttemptRecord:
        usage = usage or Usage()
        refused = call.reattach_refused if call is not None else ""
        carried = call.carried if call is not None else 0
        extra = {"reattach_refused": refused} if refused else {}
        return AttemptRecord(
            **extra,
            attempt=record.attempt,
            kind=kind_of(record, plan),
            worker=self.ctx.name,
            due_ms=record.due_ms,
            dequeued_ms=self.dequeued_ms,
            started_ms=started,
            first_byte_ms=first_byte_ms,
            ended_ms=now_ms(),
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
            regenerated_tokens=regenerated[0],
            regenerated=regenerated[1][:500],
        )
