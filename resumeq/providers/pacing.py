"""Paced reads: a provider connection is read at most once per pause while it has nothing
waiting, so a slow stream's tokens are read a few at a time instead of one per wake-up.

A provider sends a streamed answer one token per chunk, tens of milliseconds apart. A
thread that blocks on the socket for every chunk wakes once per token, and a wake-up costs
far more CPU than the token's parsing does (``benchmarks/concurrency.py``: on a virtual
machine a blocking read that waits costs 140 to 260 µs of CPU, a chunk's HTTP, SSE and JSON
parsing 15 µs). With hundreds of streams in one process those wake-ups are most of its
work. A paced connection sleeps out the rest of its pause before it waits for bytes: the
chunks that arrive meanwhile are read by one ``recv`` and parsed in one go. Bytes already
waiting are read at once, so a large body (or TLS records) is never slowed; only the wait
for the next chunk of a slow stream is. Nothing is lost or reordered: the bytes wait in the
kernel's buffer, the read timeout still applies (from after the pause), and a socket shut
down by another thread (:meth:`ProviderStream.interrupt`) is noticed at the end of the
pause at the latest.

The cost is latency, bounded by the pause: a token is read at most ``read_pause_ms`` after
it arrived, while the checkpoint that makes it durable comes every ``flush_tokens`` tokens
or ``flush_ms`` anyway. The pause grows with the load: it is whole once :data:`FULL_AT`
streams of the process are being read at once, and in proportion below that, so a worker
running a few streams reads each token as it comes.

A paced stream can also be drained (:meth:`PacedStream.drain`): a worker handing its jobs
off reads every byte that had already reached it (tokens the provider billed), then ends
the stream.
"""

from __future__ import annotations

import fcntl
import select
import socket
import ssl
import struct
import termios
import threading
import time
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx

#: Streams being read at once from which the pause is the whole ``read_pause_ms``.
FULL_AT = 32

#: Below this a pause is not taken: a stream is read as it comes (a few streams at once).
MIN_PAUSE_S = 0.01


class Readers:
    """How many paced streams of a process are in a read (waiting or pausing): the load
    that decides how long a pause is. Shared by the streams of one backend."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now = 0

    def enter(self) -> None:
        with self._lock:
            self.now += 1

    def leave(self) -> None:
        with self._lock:
            self.now -= 1


class PacedStream(httpcore.NetworkStream):
    """A network stream whose reads that would wait come at most once per pause.

    The pause is ``pause_s`` once ``full_at`` streams of the backend are being read at
    once, and in proportion below that: a worker with a few streams wakes for each token
    (its CPU is idle anyway) and reads it at once; one with hundreds saves the wake-ups.

    :meth:`drain`: the stream is read on up to the bytes that had reached this machine when
    it was called, then ends (a read answers no bytes, as when a peer closes): a worker
    handing off keeps what was paid for and delivered, and takes no more, however fast
    the provider goes on sending."""

    def __init__(
        self,
        inner: httpcore.NetworkStream,
        pause_s: float,
        *,
        readers: Readers | None = None,
        full_at: int = 1,
    ) -> None:
        self._inner = inner
        sock = inner.get_extra_info("socket")
        #: The socket asked whether bytes wait (None: not one we can ask, never delayed).
        self._sock = sock if isinstance(sock, socket.socket) else None
        self._pause_s = pause_s
        self._readers = readers if readers is not None else Readers()
        self._full_at = max(1, full_at)
        self._last_read = 0.0  # monotonic time of the last read's return
        self.draining = False
        self._drain_left = 0  # bytes still to read once draining
        #: Reads that found nothing waiting: each a wake-up (a sleep, a blocking wait or both).
        self.waits = 0
        #: When the reader's patience ends (monotonic; None: the request's read timeout
        #: alone): no read waits past it, however often bytes without content arrive.
        self.deadline: float | None = None

    def pause_s(self) -> float:
        """The pause now: ``pause_s`` scaled by the streams being read."""
        return self._pause_s * min(1.0, self._readers.now / self._full_at)

    def drain(self) -> int:
        """From now on read only the bytes that have arrived (the first call counts them);
        answers how many of them are still to read. Safe from another thread."""
        if not self.draining:
            self._drain_left = self._arrived()
            self.draining = True
        return self._drain_left

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        if self.deadline is not None:
            # A keep-alive restarts the socket's read timeout, not the reader's patience.
            left = max(0.001, self.deadline - time.monotonic())
            timeout = left if timeout is None else min(timeout, left)
        if self.draining:
            if self._drain_left <= 0 or not self._waiting():
                return b""
            # At most what had arrived (raw bytes: a TLS record decrypts to fewer).
            data = self._inner.read(min(max_bytes, self._drain_left), timeout)
            self._drain_left -= len(data)
            return data
        if not self._pause_s:
            return self._inner.read(max_bytes, timeout)
        self._readers.enter()
        try:
            pause = self.pause_s()
            # A short pause saves few wake-ups and costs a readiness check per read.
            if pause >= MIN_PAUSE_S and not self._waiting():
                self.waits += 1
                wait = self._last_read + pause - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
            return self._inner.read(max_bytes, timeout)
        finally:
            self._readers.leave()
            self._last_read = time.monotonic()

    def _arrived(self) -> int:
        """Bytes that have reached this machine and are not read yet (the kernel's count;
        decrypted TLS bytes too)."""
        sock = self._sock
        if sock is None:
            return 0
        pending = sock.pending() if isinstance(sock, ssl.SSLSocket) else 0
        try:
            raw = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
        except (OSError, ValueError):
            return pending
        return pending + int(struct.unpack("i", raw)[0])

    def _waiting(self) -> bool:
        """Whether bytes are ready to read now (decrypted TLS bytes or the socket's)."""
        sock = self._sock
        if sock is None:
            return True  # not a socket we can ask: never delay it
        if isinstance(sock, ssl.SSLSocket) and sock.pending():
            return True
        try:
            ready, _, _ = select.select([sock], [], [], 0)
        except (OSError, ValueError):
            return True  # closed or shut down: let the read report it
        return bool(ready)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, timeout)

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        inner = self._inner.start_tls(ssl_context, server_hostname, timeout)
        return PacedStream(inner, self._pause_s, readers=self._readers, full_at=self._full_at)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class PacedBackend(httpcore.NetworkBackend):
    """httpcore's own synchronous backend, its streams paced (:class:`PacedStream`; 0: no
    pause, and :meth:`PacedStream.drain` still works)."""

    def __init__(
        self, pause_s: float, inner: httpcore.NetworkBackend | None = None, *, full_at: int = 1
    ) -> None:
        self._pause_s = pause_s
        self._inner = inner if inner is not None else httpcore.SyncBackend()
        self._readers = Readers()
        self._full_at = full_at

    def _paced(self, inner: httpcore.NetworkStream) -> PacedStream:
        return PacedStream(inner, self._pause_s, readers=self._readers, full_at=self._full_at)

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        return self._paced(
            self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        )

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        return self._paced(self._inner.connect_unix_socket(path, timeout, socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def paced_transport(
    pause_s: float, *, verify: ssl.SSLContext | bool, limits: httpx.Limits, full_at: int = 1
) -> httpx.HTTPTransport:
    """An ``httpx.HTTPTransport`` (HTTP/1.1) whose connections are paced by ``pause_s``.

    httpx builds its transport's httpcore pool without a way to name the network backend;
    the pool is built here with the same arguments and put in its place. Should a future
    httpx hold something else there, this raises instead of running unpaced unnoticed."""
    transport = httpx.HTTPTransport(verify=verify, limits=limits)
    pool = getattr(transport, "_pool", None)
    if not isinstance(pool, httpcore.ConnectionPool):
        raise RuntimeError(f"httpx's transport holds {type(pool).__name__}, not a connection pool")
    transport._pool = httpcore.ConnectionPool(
        ssl_context=httpx.create_ssl_context(verify=verify),
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
        http1=True,
        http2=False,
        network_backend=PacedBackend(pause_s, full_at=full_at),
    )
    pool.close()
    return transport
