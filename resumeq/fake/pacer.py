"""Sending a stream's steps (:func:`resumeq.fake.stream.stream_steps`): in the connection's own
thread, or, for streams with pauses between tokens, from one pacing thread for all of them.

A thread per stream that sleeps between tokens costs a wake-up, a hand-over of the GIL and a
timed wait per token: at a thousand streams of fifty tokens a second that is more than a core,
and the pauses drift. The :class:`Pacer` instead keeps every paced stream's next step on one
timer heap, in one thread, and writes without blocking (what a socket will not take yet waits
for it to be writable, so a client that does not read holds up only its own stream). Steps
run on an absolute schedule from the stream's start: a late step does not delay the next, and
the steps a stream is late for go out together, in one send. The connection's thread waits
meanwhile and goes on with the connection (keep-alive or drop) once the stream ended.

What it costs: one send per token while the thread is on time, some 20 µs of CPU a token on
loopback, about half of it the kernel's. Once it falls behind, the tokens a stream is late for
go out in one send, so a token costs less as the load rises: a thousand streams of fifty
tokens a second (50,000 tokens a second) stay on schedule at some 15 µs a token.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import select
import selectors
import socket
import threading
import time
from collections.abc import Callable

from resumeq.fake.cpu import CpuMeter
from resumeq.fake.journal import Exchange
from resumeq.fake.stream import Steps

#: How often a pause (a stall) looks whether its client went away.
GONE_POLL_S = 0.05


def run_inline(
    steps: Steps,
    write: Callable[[bytes], object],
    stopped: threading.Event,
    sock: socket.socket | None = None,
) -> bool:
    """Send ``steps`` from the calling thread, blocking; True when the connection may be kept
    alive. An error writing (the client hung up) is raised, and so is a client that hung up
    during a pause (a stall ends with its client, as a server's handler would)."""
    resume: bool | None = None
    try:
        while True:
            step = steps.send(resume)
            if isinstance(step, bytes):
                write(step)
                resume = None
            else:
                resume = pause(step, stopped, sock)
    except StopIteration as end:
        return bool(end.value)
    finally:
        steps.close()


def pause(seconds: float, stopped: threading.Event, sock: socket.socket | None) -> bool:
    """Wait ``seconds``; True if the server stopped meanwhile. A client that went away
    ends it with a :class:`ConnectionResetError`."""
    if sock is None:
        return stopped.wait(seconds)
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if stopped.wait(min(left, GONE_POLL_S)):
            return True
        if _gone(sock):
            raise ConnectionResetError("the client went away during a pause")


def _gone(sock: socket.socket) -> bool:
    """Whether the peer closed ``sock`` (readable, with nothing to read)."""
    try:
        ready, _, _ = select.select([sock], [], [], 0)
        if not ready:
            return False
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


class _Stream:
    __slots__ = (
        "deadline",
        "done",
        "error",
        "exchange",
        "keep",
        "paused",
        "pending",
        "sock",
        "steps",
    )

    def __init__(self, sock: socket.socket, steps: Steps, exchange: Exchange) -> None:
        self.sock = sock
        self.steps = steps
        self.exchange = exchange
        self.deadline = 0.0
        self.pending = b""  # written, not yet taken by the socket
        self.paused = False  # the steps wait at a pause (else: not started, or ended)
        self.keep: bool | None = None  # what the steps returned, once they did
        self.error: BaseException | None = None
        self.done = threading.Event()


class Pacer:
    """The pacing thread. :meth:`run` hands it a stream and waits for the stream's end;
    :meth:`stop` ends every stream in progress at once (a pause ends as the server's stop, a
    stall as itself) and the thread with them. After a stop (or before a start) streams run in
    their own thread, as :func:`run_inline`."""

    def __init__(self, stopped: threading.Event, meter: CpuMeter, name: str) -> None:
        self._stopped = stopped
        self._meter = meter
        self._name = name
        self._lock = threading.Lock()
        self._incoming: list[_Stream] = []
        self._woken = False
        self._open = False
        self._thread: threading.Thread | None = None
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._timers: list[tuple[float, int, _Stream]] = []
        self._order = itertools.count()
        self._streams: set[_Stream] = set()  # every stream taken and not yet ended

    # -- the connections' side -------------------------------------------------------------

    def start(self) -> None:
        thread = threading.Thread(target=self._main, name=self._name, daemon=True)
        with self._lock:
            self._open = True
        thread.start()
        self._thread = thread

    def stop(self) -> None:
        """End every stream in progress, then the thread; idempotent."""
        with self._lock:
            self._open = False
        self._wake()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    def run(
        self,
        sock: socket.socket,
        steps: Steps,
        write: Callable[[bytes], object],
        exchange: Exchange,
    ) -> bool:
        """Send ``steps`` on ``sock`` and wait until they ended: True when the connection may
        be kept alive. An error writing (the client hung up), or one the steps raised, is
        raised here. ``exchange`` is the one the steps journal their tokens in: those of a
        send that failed are taken back, so that what is journalled is what was sent."""
        stream = _Stream(sock, steps, exchange)
        with self._lock:
            taken = self._open
            if taken:
                self._incoming.append(stream)
        if not taken:
            return run_inline(steps, write, self._stopped, sock)
        self._wake()
        stream.done.wait()
        if stream.error is not None:
            raise stream.error
        return bool(stream.keep)

    def active(self) -> int:
        """Streams in progress."""
        with self._lock:
            return len(self._streams) + len(self._incoming)

    def _wake(self) -> None:
        with self._lock:
            if self._woken:
                return
            self._woken = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    # -- the pacing thread -----------------------------------------------------------------

    def _main(self) -> None:
        with self._meter.thread():
            try:
                self._serve()
            finally:
                self._end_all()

    def _serve(self) -> None:
        while True:
            timeout = None
            if self._timers:
                timeout = max(0.0, self._timers[0][0] - time.monotonic())
            for key, _ in self._selector.select(timeout):
                if key.fileobj is self._wake_r:
                    with contextlib.suppress(OSError):
                        self._wake_r.recv(4096)
                else:
                    self._flush(key.data)
            with self._lock:
                incoming, self._incoming = self._incoming, []
                self._woken = False
                running = self._open
            now = time.monotonic()
            for stream in incoming:
                self._streams.add(stream)
                stream.deadline = now
                self._advance(stream, None, now)
            if not running:
                return
            while self._timers and self._timers[0][0] <= now:
                _, _, stream = heapq.heappop(self._timers)
                self._advance(stream, False, now)

    def _advance(self, stream: _Stream, resume: bool | None, now: float) -> None:
        """Run the stream's steps that are due and send what they gave in one write: a stream
        the thread fell behind on catches up in one send, not one per token, so being late
        costs less, not more."""
        stream.paused = False
        exchange = stream.exchange
        mark = exchange.mark()
        try:
            out, pause = _due_steps(stream, resume, now)
            if out:
                self._write(stream, b"".join(out))
        except Exception as exc:  # the client hung up, or a bug in the steps: for the connection
            # The steps journal a token as they give its chunk: not one of these went out.
            exchange.rollback(mark)
            stream.error = exc
            self._end(stream)
            return
        if stream.keep is not None:
            if not stream.pending:
                self._end(stream)
            return
        stream.paused = True
        stream.deadline += pause
        if not stream.pending:
            heapq.heappush(self._timers, (stream.deadline, next(self._order), stream))

    def _write(self, stream: _Stream, data: bytes) -> None:
        """Send what the socket takes now; the rest waits for it to be writable (the stream
        meanwhile has no timer, so nothing is written behind it)."""
        sent = 0
        with contextlib.suppress(BlockingIOError, InterruptedError):
            sent = stream.sock.send(data, socket.MSG_DONTWAIT)
        if sent < len(data):
            stream.pending = data[sent:]
            self._selector.register(stream.sock, selectors.EVENT_WRITE, stream)

    def _flush(self, stream: _Stream) -> None:
        try:
            sent = stream.sock.send(stream.pending, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            stream.error = exc
            self._end(stream)
            return
        stream.pending = stream.pending[sent:]
        if stream.pending:
            return
        self._selector.unregister(stream.sock)
        if stream.keep is not None:
            self._end(stream)
        else:  # a step overdue goes out in this round
            heapq.heappush(self._timers, (stream.deadline, next(self._order), stream))

    def _end(self, stream: _Stream) -> None:
        if stream.pending:
            stream.pending = b""
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(stream.sock)
        if stream.error is not None or not stream.keep:
            stream.keep = False
            with contextlib.suppress(OSError):
                stream.sock.shutdown(socket.SHUT_RDWR)
        stream.steps.close()
        self._streams.discard(stream)
        stream.done.set()

    def _end_all(self) -> None:
        """The server stops: every stream ends now; one waiting at a pause is told why."""
        with self._lock:
            self._open = False
            incoming, self._incoming = self._incoming, []
        for stream in incoming:
            stream.error = ConnectionAbortedError("the fake provider stopped")
            stream.done.set()
        for stream in list(self._streams):
            if stream.paused:
                stream.paused = False
                with contextlib.suppress(StopIteration, Exception):
                    stream.steps.send(True)
            stream.keep = False
            self._end(stream)
        self._timers.clear()


def _due_steps(stream: _Stream, resume: bool | None, now: float) -> tuple[list[bytes], float]:
    """Run the stream's steps up to the first pause that ends after ``now`` (the pauses that
    end before are taken as over) or to their end, which sets ``keep``: the chunks they gave,
    and that pause."""
    out: list[bytes] = []
    try:
        step = stream.steps.send(resume)
        while True:
            if isinstance(step, bytes):
                out.append(step)
                step = stream.steps.send(None)
            elif stream.deadline + step <= now:
                stream.deadline += step
                step = stream.steps.send(False)
            else:
                return out, step
    except StopIteration as end:
        stream.keep = bool(end.value)
        return out, 0.0
