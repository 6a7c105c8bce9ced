"""Paced reads: a provider connection is read at most once per pause while it has nothing
waiting, so a slow stream's tokens are read a few at a time instead of one per wake-up.

A provider sends a streamed answer one token per chunk, tens of milliseconds apart. A
thread that blocks on the socket for every chunk wakes once per token, and a wake-up costs
far more CPU than the token's parsing does (``benchmarks/concurrency.py``: on a virtual
machine a blocking read that waits costs 150 to 250 µs of CPU, a chunk's HTTP, SSE and JSON
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
or ``flush_ms`` anyway.
"""

from __future__ import annotations

import select
import socket
import ssl
import time
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx


class PacedStream(httpcore.NetworkStream):
    """A network stream whose reads that would wait come at most once per ``pause_s``."""

    def __init__(self, inner: httpcore.NetworkStream, pause_s: float) -> None:
        self._inner = inner
        self._pause_s = pause_s
        self._next_read = 0.0  # monotonic time before which a read that would wait sleeps
        #: Reads that found nothing waiting: each a wake-up (a sleep, a blocking wait or both).
        self.waits = 0

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        if not self._waiting():
            self.waits += 1
            wait = self._next_read - time.monotonic()
            if wait > 0:
                time.sleep(wait)
        try:
            return self._inner.read(max_bytes, timeout)
        finally:
            self._next_read = time.monotonic() + self._pause_s

    def _waiting(self) -> bool:
        """Whether bytes are ready to read now (decrypted TLS bytes or the socket's)."""
        sock = self._inner.get_extra_info("socket")
        if not isinstance(sock, socket.socket):
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
        return PacedStream(inner, self._pause_s)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class PacedBackend(httpcore.NetworkBackend):
    """httpcore's own synchronous backend, its streams paced."""

    def __init__(self, pause_s: float, inner: httpcore.NetworkBackend | None = None) -> None:
        self._pause_s = pause_s
        self._inner = inner if inner is not None else httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        inner = self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        return PacedStream(inner, self._pause_s)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        inner = self._inner.connect_unix_socket(path, timeout, socket_options)
        return PacedStream(inner, self._pause_s)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def paced_transport(
    pause_s: float, *, verify: ssl.SSLContext | bool, limits: httpx.Limits
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
        network_backend=PacedBackend(pause_s),
    )
    pool.close()
    return transport
