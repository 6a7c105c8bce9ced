"""Sending a streamed completion, one SSE event per HTTP chunk, and applying stream faults.

Each part of the output (reasoning, then text) is opened, sent as deltas of as many tokens
as the wire groups together, and closed. A fault fires once its number of tokens is out,
reasoning and text counted together, before anything else is sent (a group is cut short).
"""

from __future__ import annotations

import contextlib
import io
import socket
import threading
from dataclasses import dataclass
from typing import Protocol

from resumeq.fake.faults import Fault
from resumeq.fake.journal import Exchange
from resumeq.fake.plan import Finish, Part, Plan


class StreamFormat(Protocol):
    """The events of one wire, already framed as SSE (``...\\n\\n``). ``emitted`` counts
    every output token sent so far, reasoning included."""

    def opening(self) -> list[bytes]: ...

    def group(self, part: Part, emitted: int) -> int:
        """How many tokens the delta after ``emitted`` tokens carries (at least 1)."""
        ...

    def start(self, part: Part) -> list[bytes]: ...

    def delta(self, part: Part, text: str, emitted: int) -> bytes: ...

    def stop(self, part: Part) -> list[bytes]: ...

    def closing(self, finish: Finish, emitted: int, reasoning: int) -> list[bytes]: ...

    def error(self) -> list[bytes]: ...

    def malformed(self) -> bytes: ...


class Sink:
    """The body of a ``Transfer-Encoding: chunked`` response: one write per event."""

    def __init__(self, wfile: io.BufferedIOBase, connection: socket.socket) -> None:
        self._wfile = wfile
        self._connection = connection

    def event(self, data: bytes) -> None:
        self._wfile.write(b"%x\r\n%b\r\n" % (len(data), data))

    def end(self) -> None:
        """Finish the body cleanly (the terminating zero-length chunk)."""
        self._wfile.write(b"0\r\n\r\n")

    def cut(self) -> None:
        """Drop the connection mid-body: the client sees an incomplete chunked read."""
        with contextlib.suppress(OSError):
            self._connection.shutdown(socket.SHUT_RDWR)


@dataclass(frozen=True)
class Pacing:
    delay_s: float
    stopped: threading.Event


def send_stream(
    sink: Sink,
    fmt: StreamFormat,
    completion: Plan,
    *,
    fault: Fault | None,
    exchange: Exchange,
    pacing: Pacing,
) -> bool:
    """Stream the completion's pieces; return True when the connection may be kept alive."""
    cut_at = min(fault.after_tokens, completion.tokens) if fault is not None else -1
    emitted = 0
    for data in fmt.opening():
        sink.event(data)
    for part, pieces in completion.parts():
        journal = exchange.reasoning_pieces if part == "reasoning" else exchange.pieces
        for data in fmt.start(part):
            sink.event(data)
        sent = 0
        while sent < len(pieces) and emitted != cut_at:
            size = min(fmt.group(part, emitted), len(pieces) - sent)
            if cut_at >= 0:
                size = min(size, cut_at - emitted)
            # The pause is per token; none before the first.
            pause = pacing.delay_s * (size - 1 if emitted == 0 else size)
            if pause and pacing.stopped.wait(pause):
                exchange.outcome = "server_stopped"
                sink.cut()
                return False
            group = pieces[sent : sent + size]
            sink.event(fmt.delta(part, "".join(group), emitted + size))
            journal.extend(group)
            sent, emitted = sent + size, emitted + size
        if emitted == cut_at and fault is not None:
            return _apply(sink, fmt, fault, exchange, pacing)
        for data in fmt.stop(part):
            sink.event(data)
    for data in fmt.closing(completion.finish, emitted, len(completion.reasoning)):
        sink.event(data)
    sink.end()
    exchange.outcome = "finished"
    exchange.finish_reason = completion.finish
    return True


def _apply(sink: Sink, fmt: StreamFormat, fault: Fault, exchange: Exchange, pacing: Pacing) -> bool:
    exchange.outcome = fault.kind
    if fault.kind == "truncate":
        sink.end()
        return True
    if fault.kind == "malformed":
        sink.event(fmt.malformed())
        sink.end()
        return True
    if fault.kind == "error_event":
        for data in fmt.error():
            sink.event(data)
        sink.end()
        return True
    if fault.kind == "stall":
        pacing.stopped.wait(fault.seconds)
    sink.cut()
    return False
