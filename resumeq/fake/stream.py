"""Sending a streamed completion, one SSE event per HTTP chunk, and applying stream faults.

Each part of the output (reasoning, then text or a refusal, then each tool call's arguments:
:meth:`resumeq.fake.plan.Plan.segments`) is opened, sent as deltas of as many tokens as the
wire groups together, and closed. A fault fires once its number of tokens is out, reasoning,
text and arguments counted together, before anything else is sent (a group is cut short), so
it can cut inside a call's arguments.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Protocol

from resumeq.fake.faults import Fault
from resumeq.fake.journal import Exchange
from resumeq.fake.plan import Finish, Part, Plan, Segment


class StreamFormat(Protocol):
    """The events of one wire, already framed as SSE (``...\\n\\n``). ``emitted`` counts
    every output token sent so far, reasoning and arguments included."""

    def opening(self, completion: Plan) -> list[bytes]: ...

    def group(self, part: Part, emitted: int) -> int:
        """How many tokens the delta after ``emitted`` tokens carries (at least 1)."""
        ...

    def start(self, segment: Segment) -> list[bytes]: ...

    def delta(self, segment: Segment, text: str, emitted: int) -> bytes: ...

    def stop(self, segment: Segment) -> list[bytes]: ...

    def closing(self, finish: Finish, emitted: int, reasoning: int) -> list[bytes]: ...

    def error(self) -> list[bytes]: ...

    def malformed(self) -> bytes: ...


#: What :func:`stream_steps` yields: an HTTP chunk to send (framed), or a pause in seconds.
Step = bytes | float
#: A stream's steps. A pause's ``yield`` receives True when the server stopped during it; the
#: value returned is True when the connection may be kept alive (False: drop it).
Steps = Generator[Step, bool | None, bool]


def chunk(data: bytes) -> bytes:
    """``data`` as one chunk of a ``Transfer-Encoding: chunked`` body."""
    return b"%x\r\n%b\r\n" % (len(data), data)


#: The terminating zero-length chunk: the body ends cleanly.
END = b"0\r\n\r\n"
#: An SSE comment: what providers send to keep an idle stream open.
KEEPALIVE = b": keep-alive\n\n"


def stream_steps(
    fmt: StreamFormat, completion: Plan, *, fault: Fault | None, exchange: Exchange, delay_s: float
) -> Steps:
    """The completion's pieces as chunks, with the pauses between them (``delay_s`` per token,
    none before the first). What sends the chunks and keeps the pauses is the caller's
    (:mod:`resumeq.fake.pacer`); a connection to drop is dropped there too."""
    cut_at = pause_at = -1
    if fault is not None and fault.kind == "pause":  # before a token, so never past the last
        pause_at = min(fault.after_tokens, max(completion.tokens - 1, 0))
    elif fault is not None:
        cut_at = min(fault.after_tokens, completion.tokens)
    emitted = 0
    for data in fmt.opening(completion):
        yield chunk(data)
    for segment in completion.segments():
        for data in fmt.start(segment):
            yield chunk(data)
        marks = _Marks(cut_at, pause_at, fault, delay_s)
        emitted = yield from _deltas(fmt, segment, exchange=exchange, emitted=emitted, marks=marks)
        if emitted < 0:
            exchange.outcome = "server_stopped"
            return False
        pause_at = marks.pause_at
        if emitted == cut_at and fault is not None:
            return (yield from _apply(fmt, fault, exchange))
        for data in fmt.stop(segment):
            yield chunk(data)
        exchange.closed(segment)
    for data in fmt.closing(completion.finish, emitted, len(completion.reasoning)):
        yield chunk(data)
    yield END
    exchange.outcome = "finished"
    exchange.finish_reason = completion.finish
    return True


@dataclass
class _Marks:
    """Where a stream's fault falls (-1: nowhere), and the pace."""

    cut_at: int
    pause_at: int
    fault: Fault | None
    delay_s: float


def _deltas(
    fmt: StreamFormat,
    segment: Segment,
    *,
    exchange: Exchange,
    emitted: int,
    marks: _Marks,
) -> Generator[Step, bool | None, int]:
    """One part's deltas, up to a cut; a pause fault is kept where it falls. Answers the
    tokens emitted in all, or -1 when the server stopped meanwhile."""
    journal = exchange.record(segment)
    pieces: Sequence[str] = segment.pieces
    part = segment.part
    sent = 0
    while sent < len(pieces) and emitted != marks.cut_at:
        if emitted == marks.pause_at and marks.fault is not None:
            marks.pause_at = -1
            if (yield from quiet(marks.fault)):  # quiet mid-answer, then the rest
                return -1
        size = min(fmt.group(part, emitted), len(pieces) - sent)
        for mark in (marks.cut_at, marks.pause_at):
            if mark > emitted:
                size = min(size, mark - emitted)
        # The pause is per token; none before the first.
        pause = marks.delay_s * (size - 1 if emitted == 0 else size)
        if pause and (yield pause):
            return -1
        group = pieces[sent : sent + size]
        yield chunk(fmt.delta(segment, "".join(group), emitted + size))
        journal.extend(group)
        sent, emitted = sent + size, emitted + size
    return emitted


def _apply(fmt: StreamFormat, fault: Fault, exchange: Exchange) -> Steps:
    exchange.outcome = fault.kind
    if fault.kind == "truncate":
        yield END
        return True
    if fault.kind in ("sequence_skip", "sequence_repeat"):
        numbered = getattr(fmt, "out_of_sequence", None)
        data = numbered(repeat=fault.kind == "sequence_repeat") if numbered else fmt.malformed()
        yield chunk(data)
        yield END
        return True
    if fault.kind == "malformed":
        yield chunk(fmt.malformed())
        yield END
        return True
    if fault.kind == "error_event":
        for data in fmt.error():
            yield chunk(data)
        yield END
        return True
    if fault.kind == "stall":
        yield from quiet(fault)  # ended early by a stop, it closes all the same
    return False


def quiet(fault: Fault) -> Generator[Step, bool | None, bool]:
    """``fault.seconds`` of no content, with a keep-alive comment every ``keepalive_s``;
    answers True when the server stopped meanwhile."""
    left = fault.seconds
    while left > 0:
        step = left if fault.keepalive_s is None else min(fault.keepalive_s, left)
        if (yield step):
            return True
        left -= step
        if left > 0 and fault.keepalive_s is not None:
            yield chunk(KEEPALIVE)
    return False
