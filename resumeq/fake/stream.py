"""Sending a streamed completion, one SSE event per HTTP chunk, and applying stream faults."""

from __future__ import annotations

import contextlib
import io
import socket
import threading
from dataclasses import dataclass
from typing import Protocol

from resumeq.fake.faults import Fault
from resumeq.fake.journal import Exchange
from resumeq.fake.plan import Finish, Plan


class StreamFormat(Protocol):
    """The events of one wire, already framed as SSE (``...\\n\\n``)."""

    def opening(self) -> list[bytes]: ...

    def piece(self, text: str, emitted: int) -> bytes: ...

    def closing(self, finish: Finish, emitted: int) -> list[bytes]: ...

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
    pieces = completion.pieces
    cut_at = min(fault.after_tokens, len(pieces)) if fault is not None else -1
    for data in fmt.opening():
        sink.event(data)
    for index, piece in enumerate(pieces):
        if index == cut_at:
            break
        if pacing.delay_s and index and pacing.stopped.wait(pacing.delay_s):
            exchange.outcome = "server_stopped"
            sink.cut()
            return False
        sink.event(fmt.piece(piece, index + 1))
        exchange.pieces.append(piece)
    if fault is not None:
        return _apply(sink, fmt, fault, exchange, pacing)
    for data in fmt.closing(completion.finish, len(pieces)):
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
