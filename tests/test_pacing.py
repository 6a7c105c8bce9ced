"""Paced reads (``[worker] read_pause_ms``): a connection with nothing to read waits for
bytes at most once per pause, so a slow stream is read a few chunks per wake-up; bytes
already waiting are read at once; nothing is lost, reordered or held past an interrupt."""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpcore
import httpx
import pytest

from resumeq.core.settings import ProviderProfile, WorkerSettings
from resumeq.fake import FakeProvider
from resumeq.providers.pacing import PacedBackend, PacedStream
from resumeq.worker.context import HttpClients


class Sender:
    """A loopback server that accepts one connection and sends what it is told to."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._tls = tls
        self._conn: socket.socket | None = None
        self._accepted = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        if self._tls is not None:
            conn = self._tls.wrap_socket(conn, server_side=True)
        self._conn = conn
        self._accepted.set()

    @property
    def conn(self) -> socket.socket:
        assert self._accepted.wait(10), "the client never connected"
        assert self._conn is not None
        return self._conn

    def trickle(self, pieces: list[bytes], gap_s: float) -> threading.Thread:
        def run() -> None:
            for piece in pieces:
                self.conn.sendall(piece)
                time.sleep(gap_s)
            self.conn.shutdown(socket.SHUT_WR)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        self._thread.join(timeout=10)
        with contextlib.suppress(OSError):
            if self._conn is not None:
                self._conn.close()
        self.listener.close()


@pytest.fixture
def sender() -> Iterator[Sender]:
    s = Sender()
    yield s
    s.close()


class Counting(httpcore.NetworkBackend):
    """httpcore's backend, counting the reads of its streams."""

    def __init__(self) -> None:
        self.reads = 0
        self._inner = httpcore.SyncBackend()

    def connect_tcp(
        self, host: str, port: int, timeout: float | None = None, *_: object
    ) -> httpcore.NetworkStream:
        inner = self._inner.connect_tcp(host, port, timeout)
        counting = self

        class Stream(httpcore.NetworkStream):
            def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
                counting.reads += 1
                return inner.read(max_bytes, timeout)

            def write(self, buffer: bytes, timeout: float | None = None) -> None:
                inner.write(buffer, timeout)

            def close(self) -> None:
                inner.close()

            def get_extra_info(self, info: str) -> object:
                return inner.get_extra_info(info)

        return Stream()


def read_all(stream: httpcore.NetworkStream) -> tuple[bytes, int]:
    """Everything until the end of the stream, and how many reads it took."""
    got, reads = b"", 0
    while True:
        chunk = stream.read(65536, timeout=10)
        reads += 1
        if not chunk:
            return got, reads
        got += chunk


def test_a_slow_stream_is_read_a_few_pieces_per_read(sender: Sender) -> None:
    pieces = [f"data: {{'token': {n}, 'text': 'héllo 🌍'}}\n\n".encode() for n in range(40)]
    counting = Counting()
    stream = PacedBackend(0.1, inner=counting).connect_tcp("127.0.0.1", sender.port, timeout=10)
    writer = sender.trickle(pieces, gap_s=0.01)  # 40 pieces over ~0.4 s
    try:
        got, reads = read_all(stream)
    finally:
        stream.close()
        writer.join(timeout=10)
    assert got == b"".join(pieces)  # every byte, in order
    # Unpaced, a reader that keeps up reads about once per piece (40); paced by 100 ms it
    # reads about once per pause over ~0.4 s, plus the end of the stream.
    assert counting.reads == reads <= 12, reads
    assert isinstance(stream, PacedStream) and stream.waits <= reads


def test_a_lone_stream_is_read_as_it_comes(sender: Sender) -> None:
    # Whole from 32 streams on: one stream's pause (3 ms) is under MIN_PAUSE_S, not taken.
    pieces = [f"token {n}\n".encode() for n in range(20)]
    stream = PacedBackend(0.1, full_at=32).connect_tcp("127.0.0.1", sender.port, timeout=10)
    writer = sender.trickle(pieces, gap_s=0.02)
    try:
        got, reads = read_all(stream)
    finally:
        stream.close()
        writer.join(timeout=10)
    assert got == b"".join(pieces)
    assert isinstance(stream, PacedStream) and stream.waits == 0 and reads >= 15


def test_bytes_already_waiting_are_read_without_a_pause(sender: Sender) -> None:
    body = bytes(range(256)) * 600  # 150 KB: many reads of 64 KB at most
    stream = PacedBackend(2.0).connect_tcp("127.0.0.1", sender.port, timeout=10)
    writer = sender.trickle([body], gap_s=0)
    writer.join(timeout=10)  # everything is in the kernel's buffers before the first read
    began = time.monotonic()
    try:
        got, reads = read_all(stream)
    finally:
        stream.close()
    assert got == body and reads >= 2
    assert isinstance(stream, PacedStream) and stream.waits <= 1  # the end of the stream
    # A read that finds bytes waiting never sleeps: far less than one 2 s pause in all.
    assert time.monotonic() - began < 1.0


def test_an_interrupt_ends_a_paced_read_by_the_end_of_the_pause(sender: Sender) -> None:
    stream = PacedBackend(0.3).connect_tcp("127.0.0.1", sender.port, timeout=10)
    sender.conn.sendall(b"first")
    assert stream.read(100, timeout=10) == b"first"
    sock = stream.get_extra_info("socket")
    assert isinstance(sock, socket.socket)
    interrupt = threading.Timer(0.05, sock.shutdown, args=(socket.SHUT_RDWR,))
    interrupt.start()
    began = time.monotonic()
    with contextlib.suppress(httpcore.ReadError):
        assert stream.read(100, timeout=30) == b""  # the server sent nothing more
    interrupt.join(timeout=5)
    stream.close()
    assert time.monotonic() - began < 2.0  # not the 30 s read timeout


def test_the_read_timeout_still_applies_after_the_pause(sender: Sender) -> None:
    stream = PacedBackend(0.2).connect_tcp("127.0.0.1", sender.port, timeout=10)
    sender.conn.sendall(b"x")
    assert stream.read(10, timeout=5) == b"x"
    began = time.monotonic()
    with pytest.raises(httpcore.ReadTimeout):
        stream.read(10, timeout=0.3)
    stream.close()
    assert 0.3 <= time.monotonic() - began < 3.0


def self_signed(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


def test_a_tls_stream_is_paced_and_whole(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_side.load_cert_chain(cert, key)
    client_side = ssl.create_default_context(cafile=str(cert))
    sender = Sender(tls=server_side)
    handshake = threading.Thread(target=lambda: sender.conn, daemon=True)
    handshake.start()
    try:
        plain = PacedBackend(0.1).connect_tcp("127.0.0.1", sender.port, timeout=10)
        stream = plain.start_tls(client_side, server_hostname="localhost", timeout=10)
        handshake.join(timeout=10)
        assert isinstance(stream, PacedStream)
        assert stream.get_extra_info("ssl_object") is not None
        # A big message (several TLS records) and a trickle (a record each). A TLS read
        # answers one record, so reads are not fewer; wake-ups are: records already
        # waiting (decrypted or not) are read at once, the trickle a few per wake-up.
        pieces = [b"z" * 40_000, *(f"token {n}\n".encode() for n in range(30))]
        writer = sender.trickle(pieces, gap_s=0.01)
        got, reads = read_all(stream)
        writer.join(timeout=10)
        stream.close()
    finally:
        sender.close()
    assert got == b"".join(pieces)
    assert reads >= len(pieces) and stream.waits <= 12, (reads, stream.waits)


def profile(base_url: str) -> ProviderProfile:
    return ProviderProfile.model_validate({"kind": "openai", "base_url": base_url})


def test_a_worker_reads_its_providers_over_paced_connections(fake: FakeProvider) -> None:
    assert WorkerSettings().read_pause_ms == 0  # off by default (opt in: hundreds of streams)
    body = {"model": "m", "messages": [{"role": "user", "content": "a story"}], "stream": True}
    texts = []
    for pause in (100, 0):
        clients = HttpClients(concurrency=4, read_pause_ms=pause)
        try:
            client = clients.get("fake", profile(fake.openai_base_url))
            with client.stream("POST", f"{fake.openai_base_url}/chat/completions", json=body) as r:
                stream = r.extensions["network_stream"]
                texts.append(r.read())
            # Paced or not, a worker's connections can be drained at a handoff.
            assert isinstance(stream, PacedStream) and stream.pause_s() == 0
            assert stream._pause_s == pause / 1000
        finally:
            clients.close()
    assert content(texts[0]) == content(texts[1]) and len(content(texts[0])) > 200


def content(body: bytes) -> str:
    """The text of an OpenAI chat-completions event stream."""
    out = []
    for line in body.decode().splitlines():
        data = line.removeprefix("data: ")
        if line.startswith("data: ") and data != "[DONE]":
            for choice in json.loads(data).get("choices", []):
                out.append(choice["delta"].get("content") or "")
    return "".join(out)


def test_the_pause_grows_with_the_streams_being_read(sender: Sender) -> None:
    backend = PacedBackend(0.2, full_at=4)
    stream = backend.connect_tcp("127.0.0.1", sender.port, timeout=10)
    assert isinstance(stream, PacedStream)
    readers = backend._readers
    try:
        assert stream.pause_s() == 0  # nobody reading: no pause
        for now, pause in ((1, 0.05), (2, 0.1), (4, 0.2), (50, 0.2)):
            readers.now = now
            assert stream.pause_s() == pytest.approx(pause)
        readers.now = 0
        # Counted while a read waits, and no more once it returned.
        sender.conn.sendall(b"late")
        assert stream.read(100, timeout=10) == b"late" and readers.now == 0
    finally:
        stream.close()


def test_a_drained_stream_keeps_what_arrived_and_ends_without_waiting(sender: Sender) -> None:
    stream = PacedBackend(0.05).connect_tcp("127.0.0.1", sender.port, timeout=10)
    assert isinstance(stream, PacedStream)
    pieces = [f"token {n}\n".encode() for n in range(20)]
    for piece in pieces:
        sender.conn.sendall(piece)
    time.sleep(0.05)  # everything sent has arrived
    assert stream.read(8, timeout=10) == b"token 0\n"  # one read before the handoff
    stream.drain()
    sender.conn.sendall(b"sent after the handoff began\n")  # not read: not yet arrived
    time.sleep(0.05)
    began = time.monotonic()
    got, _ = read_all(stream)  # the server never closes: drained, not ended by the peer
    stream.close()
    assert b"token 0\n" + got == b"".join(pieces)
    assert time.monotonic() - began < 1.0  # not the 10 s read timeout


def test_an_unpaced_stream_can_be_drained_too(sender: Sender) -> None:
    stream = PacedBackend(0).connect_tcp("127.0.0.1", sender.port, timeout=10)
    assert isinstance(stream, PacedStream)
    sender.conn.sendall(b"abc")
    time.sleep(0.05)
    stream.drain()
    sender.conn.sendall(b"def")
    time.sleep(0.05)
    assert stream.read(100, timeout=10) == b"abc"
    assert stream.read(100, timeout=10) == b""
    stream.close()


def test_read_pause_is_bounded() -> None:
    with pytest.raises(ValueError, match="read_pause_ms"):
        WorkerSettings(read_pause_ms=-1)
    with pytest.raises(ValueError, match="read_pause_ms"):
        WorkerSettings(read_pause_ms=5000)
    assert WorkerSettings(read_pause_ms=0).read_pause_ms == 0


def test_httpx_transport_shape_is_what_pacing_expects() -> None:
    """The paced transport replaces httpx's connection pool; a future httpx that holds
    something else there must fail here, not run unpaced."""
    clients = HttpClients(concurrency=3, read_pause_ms=50)
    try:
        client = clients.get("p", profile("http://127.0.0.1:9/v1"))
        pool = client._transport._pool  # type: ignore[attr-defined]
        assert isinstance(pool, httpcore.ConnectionPool)
        assert isinstance(pool._network_backend, PacedBackend)
        assert pool._max_connections == 3
    finally:
        clients.close()
    with httpx.HTTPTransport() as plain:
        assert isinstance(plain._pool, httpcore.ConnectionPool)
