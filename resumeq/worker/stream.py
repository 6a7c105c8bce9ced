"""The stream of one attempt: opened (or read on from a background response), read event by
event into the checkpointer, paused while a queued response waits, and counted when it
ends or is cut."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

from resumeq.core.answer import LIMITED
from resumeq.core.counting import Count
from resumeq.core.errors import (
    FatalProviderError,
    JobNotFound,
    LeaseLost,
    ReattachRefused,
    ResponseQueued,
    RetryableProviderError,
    Stalled,
    StreamCut,
    WriteRefused,
)
from resumeq.core.gate import Cut
from resumeq.providers import (
    ProviderStream,
    Started,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    ToolCallEnd,
    Usage,
)
from resumeq.worker.accounting import Accounting
from resumeq.worker.call import (
    Call,
    StreamResult,
    now_ms,
    pause,
)
from resumeq.worker.context import WorkerContext
from resumeq.worker.responses import BackgroundResponses

QUEUED_POLL_S = 0.25
QUEUED_POLL_MAX_S = 5.0


_RETRY_PAUSE_S = 0.25


class Streamer:
    """The stream of one attempt: opened (or read on from a background response), read event by"""

    def __init__(
        self, ctx: WorkerContext, responses: BackgroundResponses, accounting: Accounting
    ) -> None:
        self.ctx = ctx
        self.responses = responses
        self.accounting = accounting

    def stream_and_count(self, call: Call) -> tuple[StreamResult, Count]:
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
                self.stream(call, result, lost=lost, opened=opened)
                if not lost.is_set():
                    # A refused reattach's continuation has its own splicer. What it still
                    # held is released at the last event it was fed from, not one that
                    # follows it: the position stays where the seam last stood.
                    splicer = call.splicer
                    ckpt.add(splicer.finish(), splicer.take_tokens(), exact=ckpt.exact)
                    self.end_continued(call, result)
                    self.until_written(ckpt.flush)  # the text is durable before any counting
                    count = self.accounting.count(call, result)
                    self.until_written(lambda: ckpt.settle(count.tokens, exact=count.exact))
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

    @staticmethod
    def end_continued(call: Call, result: StreamResult) -> None:
        """A continued call's arguments that the stream finished are the call's whole: it
        ends as the call would have (``tool_calls``). Cut off by the output limit or a
        filter, or refused, they are not: the call stays cut, never shown, and the answer is
        checked as one whose call did not end (a refusal is the job's answer)."""
        cut = result.cut
        if not call.plan.continues_call or cut.kind != "finished" or call.ckpt.refusal:
            return
        if cut.finish_reason in LIMITED or cut.finish_reason == "refusal":
            return
        call.ckpt.end_continued()
        result.cut = cut.model_copy(update={"finish_reason": "tool_calls"})

    def stream(
        self,
        call: Call,
        result: StreamResult,
        *,
        lost: threading.Event,
        opened: list[ProviderStream],
    ) -> None:
        """Fill ``result`` with what the stream delivers and how it ended."""
        handoff = self.ctx.handoff
        stream = self.open(call, result, lost)
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
                    self.take(event, result, call, stream)
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
            result.usage = self.responses.reattached_usage(call.record, stream.usage)
        if stream.finish_reason == "refusal" and not call.ckpt.refusal:
            # Anthropic's refusal comes as text: the text is the refusal.
            call.ckpt.refusal = result.received.text() or "refused"
        result.cut = Cut(kind="finished", finish_reason=stream.finish_reason)

    def open(
        self, call: Call, result: StreamResult, lost: threading.Event
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
                result.first_byte_ms = now_ms()
                return stream
            except ReattachRefused as exc:
                if not self.responses.refused_reattach(call, exc):
                    result.cut = Cut(kind="stream_cut", detail=f"reattach refused: {exc}")
                    break
            except ResponseQueued as exc:
                waited = time.monotonic() - queued_since
                if waited >= call.profile.background_queued_timeout_s:
                    result.cut = Cut(kind="retryable", detail=f"{exc} after {waited:.0f} s")
                    break
                pause(min(QUEUED_POLL_MAX_S, QUEUED_POLL_S * 2 ** min(polls, 8)), lost, handoff)
                polls += 1
            except RetryableProviderError as exc:
                result.cut = Cut(kind="retryable", retry_after_s=exc.retry_after, detail=str(exc))
                result.first_byte_ms = now_ms() if exc.status is not None else None
                break
            except FatalProviderError as exc:
                result.cut = Cut(kind="fatal", detail=str(exc))
                result.first_byte_ms = now_ms() if exc.status is not None else None
                break
        result.tally.opened = False  # refused before a stream: nothing was bought
        return None

    def take(
        self, event: StreamEvent, result: StreamResult, call: Call, stream: ProviderStream
    ) -> None:
        """One stream event into the splice, the checkpoint and the tally."""
        tally, splicer, ckpt = result.tally, call.splicer, call.ckpt
        if isinstance(event, Started):
            self.responses.started(call, stream)
            return
        if isinstance(event, Usage):
            result.usage = event
            tally.reported = tally.reported or event.output_tokens is not None
            return
        if isinstance(event, ToolCallEnd):
            ckpt.tool_end(event.index)
            return
        tally.exact = tally.exact and event.exact
        tally.reported = tally.reported or event.exact
        if isinstance(event, ToolCallDelta):
            tally.other_chunks += 1
            tally.other_bytes += len(event.arguments.encode("utf-8"))
            tally.other_tokens += event.tokens
            position = self.responses.position(call, stream)
            ckpt.tool(
                event.index,
                event.id,
                event.name,
                event.arguments,
                event.tokens,
                exact=event.exact,
                response=position,
            )
            return
        if isinstance(event, TextDelta):
            if result.first_text_ms is None and event.text:
                result.first_text_ms = now_ms()
            result.received.append(event.text)
            released = splicer.feed(event.text, event.tokens)
            position = self.responses.position(call, stream)
            ckpt.add(released, splicer.take_tokens(), exact=event.exact, response=position)
            return
        size = len(event.text.encode("utf-8"))
        if event.kind == "reasoning":
            result.reasoning.append(event.text)
            tally.reasoning_chunks += 1
            tally.reasoning_bytes += size
            tally.reasoning_tokens += event.tokens
        else:
            if event.kind == "refusal":
                ckpt.refusal += event.text
            tally.other_chunks += bool(event.text)
            tally.other_bytes += size
            tally.other_tokens += event.tokens
        position = self.responses.position(call, stream)
        ckpt.add("", event.tokens, exact=event.exact, hidden_bytes=size, response=position)

    def until_written(self, write: Callable[[], bool]) -> None:
        while not write():
            time.sleep(_RETRY_PAUSE_S)  # Redis unreachable: the write raises once the lease is gone
