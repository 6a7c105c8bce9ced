"""SSE fuzzing: both provider clients against a real loopback server that answers a
scripted or random byte stream. Every stream either ends with a finish reason or is a
:class:`~resumeq.core.errors.StreamCut`, within the stall timeout and with bounded memory."""

from __future__ import annotations

import json
import select
import socket
import socketserver
import struct
import threading
import time
import tracemalloc
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from resumeq.core.continuation import plan_request
from resumeq.core.errors import Disconnected, MalformedChunk, Stalled, StreamCut, Truncated
from resumeq.core.settings import ProviderProfile
from resumeq.core.spec import parse_spec
from resumeq.providers import TextDelta, Usage, make_client

pytestmark = pytest.mark.timeout(15)

Kind = Literal["openai", "anthropic"]
KINDS: tuple[Kind, ...] = ("openai", "anthropic")

#: The stall timeout of every profile here: short, so stalls are quick to see.
STALL_S = 0.4
#: What "a little" over the stall timeout may be, on a slow CI machine.
SLACK_S = 1.0
#: More than any bounded client should hold while reading one stream.
MEMORY_BOUND = 8 * 1024 * 1024

SPEC = parse_spec(
    {"prompt": "Tell me about lighthouses.", "provider": "p", "model": "m", "budget_tokens": 100}
)
BOM = b"\xef\xbb\xbf"


# -- the scripted server -----------------------------------------------------------------


@dataclass(frozen=True)
class Pause:
    seconds: float


@dataclass(frozen=True)
class Forever:
    """Send ``piece`` every ``every_s`` until the client goes away."""

    piece: bytes
    every_s: float = 0.005


@dataclass(frozen=True)
class Hang:
    """Send nothing more and keep the connection open until the client goes away."""


@dataclass(frozen=True)
class Cut:
    """Close the socket now, mid-body (no final chunk)."""


Step = bytes | Pause | Forever | Hang | Cut


@dataclass
class Script:
    """One response: status, headers, then the body, step by step. ``framing="chunked"``
    ends the body with a final chunk; ``"close"`` has no length and ends it by closing."""

    body: Sequence[Step] = ()
    status: int = 200
    content_type: str | None = "text/event-stream"
    framing: Literal["chunked", "close"] = "chunked"
    headers: dict[str, str] = field(default_factory=dict)


class _Gone(Exception):
    """The client closed the connection, or the server is stopping."""


class _Handler(socketserver.BaseRequestHandler):
    server: ScriptServer
    TIMEOUT_S: ClassVar[float] = 5.0

    def handle(self) -> None:
        self.server.connections.append(threading.current_thread())
        conn: socket.socket = self.request
        conn.settimeout(self.TIMEOUT_S)
        try:
            _read_request(conn)
            self._answer(conn, self.server.script)
        except (OSError, _Gone):
            pass

    def _answer(self, conn: socket.socket, script: Script) -> None:
        head = [f"HTTP/1.1 {script.status} Whatever", "Connection: close"]
        if script.content_type is not None:
            head.append(f"Content-Type: {script.content_type}")
        if script.framing == "chunked":
            head.append("Transfer-Encoding: chunked")
        head += [f"{k}: {v}" for k, v in script.headers.items()]
        conn.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        chunked = script.framing == "chunked"
        for step in script.body:
            if isinstance(step, bytes):
                self._send(conn, step, chunked=chunked)
            elif isinstance(step, Pause):
                self._pause(step.seconds)
            elif isinstance(step, Forever):
                while True:
                    self._send(conn, step.piece, chunked=chunked)
                    self._pause(step.every_s)
            elif isinstance(step, Hang):
                self._wait_for_close(conn)
            else:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return
        if chunked:
            conn.sendall(b"0\r\n\r\n")

    def _send(self, conn: socket.socket, data: bytes, *, chunked: bool) -> None:
        if self.server.stopping.is_set():
            raise _Gone
        if not data:
            return
        if chunked:  # three writes: a huge piece is never copied
            conn.sendall(b"%x\r\n" % len(data))
            conn.sendall(data)
            conn.sendall(b"\r\n")
        else:
            conn.sendall(data)

    def _pause(self, seconds: float) -> None:
        if self.server.stopping.wait(seconds):
            raise _Gone

    def _wait_for_close(self, conn: socket.socket) -> None:
        while not self.server.stopping.is_set():
            readable, _, _ = select.select([conn], [], [], 0.02)
            if readable and not conn.recv(4096):
                return
        raise _Gone


def _read_request(conn: socket.socket) -> None:
    data = b""
    while b"\r\n\r\n" not in data:
        more = conn.recv(65536)
        if not more:
            raise _Gone
        data += more
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        more = conn.recv(65536)
        if not more:
            raise _Gone
        body += more


class ScriptServer(socketserver.ThreadingTCPServer):
    """Answers every request with :attr:`script`; one thread per connection."""

    daemon_threads = False
    block_on_close = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script = Script()
        self.stopping = threading.Event()
        self.connections: list[threading.Thread] = []
        self._serving = threading.Thread(target=self.serve_forever, name="sse-fuzz-server")

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def handlers(self) -> list[threading.Thread]:
        return [t for t in self.connections if t.is_alive()]

    def wait_idle(self, timeout: float) -> bool:
        """Whether every connection's thread has ended (the client closed its side)."""
        deadline = time.monotonic() + timeout
        for thread in self.handlers():
            thread.join(max(0.0, deadline - time.monotonic()))
        return not self.handlers()

    def start(self) -> None:
        self._serving.start()

    def stop(self) -> None:
        self.stopping.set()
        self.shutdown()
        self.server_close()  # joins the connection threads (block_on_close)
        self._serving.join()


@pytest.fixture(scope="module")
def server() -> Iterator[ScriptServer]:
    srv = ScriptServer()
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()
    assert not srv.handlers()


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    """One client for the module: building one costs far more than a test here."""
    with httpx.Client() as client:
        yield client


@pytest.fixture
def harness(server: ScriptServer, http: httpx.Client) -> Iterator[Harness]:
    yield Harness(server, http)
    assert server.wait_idle(5.0), "a connection outlived its test: the client did not close it"


# -- the two wires -----------------------------------------------------------------------


def sse_event(data: str | bytes, name: str | None = None, eol: bytes = b"\n") -> bytes:
    raw = data.encode() if isinstance(data, str) else data
    lines = [b"event: " + name.encode()] if name else []
    lines += [b"data: " + line for line in raw.split(b"\n")]
    return eol.join(lines) + eol + eol


def dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


class Wire:
    """Events of one wire format, as a provider sends them."""

    def __init__(self, kind: Kind, eol: bytes = b"\n", multiline: bool = False) -> None:
        self.kind = kind
        self.eol = eol
        self.multiline = multiline

    def _ev(self, obj: Any, name: str | None = None) -> bytes:
        data = json.dumps(obj, indent=1) if self.multiline else dumps(obj)
        return sse_event(data, name, self.eol)

    def start(self) -> bytes:
        if self.kind == "openai":
            return self._ev({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})
        usage = {"input_tokens": 11, "output_tokens": 1}
        return self._ev(
            {"type": "message_start", "message": {"id": "m", "content": [], "usage": usage}},
            "message_start",
        ) + self._ev(
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
            "content_block_start",
        )

    def text(self, text: str) -> bytes:
        if self.kind == "openai":
            choice = {"index": 0, "delta": {"content": text}, "finish_reason": None}
            return self._ev({"choices": [choice]})
        delta = {"type": "text_delta", "text": text}
        return self._ev(
            {"type": "content_block_delta", "index": 0, "delta": delta}, "content_block_delta"
        )

    def keepalive(self) -> bytes:
        """A valid event that carries no content."""
        if self.kind == "openai":
            return self._ev({"choices": [{"index": 0, "delta": {}, "finish_reason": None}]})
        return self._ev({"type": "ping"}, "ping")

    def finish(self, reason: bool = True) -> bytes:
        if self.kind == "openai":
            out = b""
            if reason:
                out += self._ev({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
            usage = {"prompt_tokens": 11, "completion_tokens": 3}
            return (
                out + self._ev({"choices": [], "usage": usage}) + sse_event("[DONE]", eol=self.eol)
            )
        delta: dict[str, Any] = {"stop_reason": "end_turn"} if reason else {}
        return (
            self._ev({"type": "content_block_stop", "index": 0}, "content_block_stop")
            + self._ev(
                {"type": "message_delta", "delta": delta, "usage": {"output_tokens": 3}},
                "message_delta",
            )
            + self._ev({"type": "message_stop"}, "message_stop")
        )

    def raw(self, data: str | bytes) -> bytes:
        """A chunk whose data is ``data`` as is (on Anthropic, a text delta event)."""
        name = None if self.kind == "openai" else "content_block_delta"
        return sse_event(data, name, self.eol)

    def complete(self, *texts: str) -> bytes:
        return self.start() + b"".join(self.text(t) for t in texts) + self.finish()


# -- driving a client --------------------------------------------------------------------


@dataclass
class Outcome:
    text: str
    error: StreamCut | None
    finish_reason: str | None
    usage: Usage
    elapsed: float
    peak_bytes: int | None = None


def profile(server: ScriptServer, kind: Kind, stall_s: float = STALL_S) -> ProviderProfile:
    root = f"http://127.0.0.1:{server.port}"
    base = root if kind == "anthropic" else f"{root}/v1"
    return ProviderProfile(kind=kind, base_url=base, stall_timeout_s=stall_s, connect_timeout_s=2)


@dataclass
class Harness:
    server: ScriptServer
    http: httpx.Client

    def run(self, kind: Kind, script: Script, *, measure: bool = False) -> Outcome:
        """Open a stream against ``script`` and iterate it to its end or its cut. Any
        exception other than a :class:`StreamCut` propagates and fails the test."""
        self.server.script = script
        client = make_client(profile(self.server, kind), self.http)
        plan = plan_request(SPEC, client.profile, prefix="", remaining_tokens=100)
        texts: list[str] = []
        error: StreamCut | None = None
        peak: int | None = None
        if measure:
            tracemalloc.start()
        t0 = time.monotonic()
        try:
            with client.open(plan) as stream:
                try:
                    for ev in stream:
                        if isinstance(ev, TextDelta):
                            texts.append(ev.text)
                except StreamCut as exc:
                    error = exc
            elapsed = time.monotonic() - t0
        finally:
            if measure:
                peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
        return Outcome("".join(texts), error, stream.finish_reason, stream.usage, elapsed, peak)


def assert_finished(out: Outcome, text: str) -> None:
    assert out.error is None, f"{type(out.error).__name__}: {out.error}"
    assert out.finish_reason in ("stop", "end_turn")
    assert out.text == text


def assert_cut(out: Outcome, kind: type[StreamCut]) -> None:
    assert type(out.error) is kind, f"{type(out.error).__name__}: {out.error}"
    assert out.elapsed < STALL_S + SLACK_S


# -- named adversarial streams -----------------------------------------------------------

HUGE = 24 * 1024 * 1024


@pytest.mark.parametrize("kind", KINDS)
def test_a_huge_line_is_a_malformed_chunk_read_in_bounded_memory(
    harness: Harness, kind: Kind
) -> None:
    w = Wire(kind)
    huge = b"data: " + b"a" * HUGE  # built before measuring: the server's copy is not ours
    out = harness.run(kind, Script([w.start(), w.text("Hi"), huge]), measure=True)
    assert_cut(out, MalformedChunk)
    assert out.text == "Hi"
    assert out.peak_bytes is not None and out.peak_bytes < MEMORY_BOUND


@pytest.mark.parametrize("kind", KINDS)
def test_an_event_of_many_data_lines_is_bounded_too(harness: Harness, kind: Kind) -> None:
    w = Wire(kind)
    line = b"data: " + b"b" * 4000 + b"\n"
    out = harness.run(kind, Script([w.start(), Forever(line * 16, every_s=0)]), measure=True)
    assert_cut(out, MalformedChunk)
    assert out.peak_bytes is not None and out.peak_bytes < MEMORY_BOUND


@pytest.mark.parametrize("kind", KINDS)
def test_an_event_just_under_the_limit_is_accepted(harness: Harness, kind: Kind) -> None:
    big = "x" * (900 * 1024)
    out = harness.run(kind, Script([Wire(kind).complete("a", big, "b")]))
    assert_finished(out, "a" + big + "b")


@pytest.mark.parametrize("kind", KINDS)
def test_a_never_ending_line_is_a_stall(harness: Harness, kind: Kind) -> None:
    """A byte every few milliseconds: the read timeout never fires."""
    w = Wire(kind)
    out = harness.run(kind, Script([w.start(), w.text("Hi"), b"data: ", Forever(b"z")]))
    assert_cut(out, Stalled)
    assert out.text == "Hi"


@pytest.mark.parametrize("kind", KINDS)
def test_comments_forever_are_a_stall(harness: Harness, kind: Kind) -> None:
    out = harness.run(kind, Script([Forever(b": ping\n\n")]))
    assert_cut(out, Stalled)


@pytest.mark.parametrize("kind", KINDS)
def test_keep_alive_events_forever_are_a_stall(harness: Harness, kind: Kind) -> None:
    w = Wire(kind)
    out = harness.run(kind, Script([w.start(), w.text("Hi"), Forever(w.keepalive())]))
    assert_cut(out, Stalled)
    assert out.text == "Hi"


@pytest.mark.parametrize("kind", KINDS)
def test_keep_alive_events_between_slow_deltas_are_not_a_stall(
    harness: Harness, kind: Kind
) -> None:
    """Progress resets the clock: a stream twice as long as the stall timeout is fine."""
    w = Wire(kind)
    body: list[Step] = [w.start()]
    for i in range(4):
        body += [
            w.keepalive(),
            Pause(STALL_S / 4),
            w.keepalive(),
            Pause(STALL_S / 4),
            w.text(f"{i}"),
        ]
    out = harness.run(kind, Script([*body, w.finish()]))
    assert_finished(out, "0123")


@pytest.mark.parametrize("kind", KINDS)
def test_silence_is_a_stall(harness: Harness, kind: Kind) -> None:
    w = Wire(kind)
    out = harness.run(kind, Script([w.start(), w.text("Hi"), Hang()]))
    assert_cut(out, Stalled)


@pytest.mark.parametrize("kind", KINDS)
def test_invalid_utf8_is_a_malformed_chunk(harness: Harness, kind: Kind) -> None:
    w = Wire(kind)
    bad = w.text("\x00MARK").replace(b"\\u0000MARK", b"\xff\xfe\xc3")
    assert bad != w.text("\x00MARK")
    out = harness.run(kind, Script([w.start(), w.text("Hi"), bad, w.finish()]))
    assert_cut(out, MalformedChunk)
    assert out.text == "Hi"


NOT_OBJECTS = ["[1, 2]", '"a string"', "42", "null", "true", "[" * 100_000, "{", "not json"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("data", NOT_OBJECTS, ids=lambda d: d[:12])
def test_json_that_is_not_an_object_is_a_malformed_chunk(
    harness: Harness, kind: Kind, data: str
) -> None:
    w = Wire(kind)
    out = harness.run(kind, Script([w.start(), w.raw(data), w.finish()]))
    assert_cut(out, MalformedChunk)


@pytest.mark.parametrize("kind", KINDS)
def test_events_without_a_data_field_are_not_dispatched(harness: Harness, kind: Kind) -> None:
    """WHATWG: an event whose data buffer is empty is not dispatched at all."""
    w = Wire(kind)
    no_data = b"event: content_block_delta\n\nid: 7\n\nretry: 10\n\nevent: message_stop\n\n"
    out = harness.run(kind, Script([w.start(), w.text("a"), no_data, w.text("b"), w.finish()]))
    assert_finished(out, "ab")


@pytest.mark.parametrize("kind", KINDS)
def test_an_empty_data_payload_is_a_malformed_chunk(harness: Harness, kind: Kind) -> None:
    w = Wire(kind)
    for empty in (b"data:\n\n", b"data: \n\n"):
        body = w.start() + (b"event: content_block_delta\n" if kind == "anthropic" else b"")
        out = harness.run(kind, Script([body + empty, w.finish()]))
        assert_cut(out, MalformedChunk)


OPENAI_BAD_CHUNKS = [
    {"id": "x"},
    {"choices": None},
    {"choices": {"index": 0}},
    {"choices": [{"index": 0, "delta": {"content": 5}}]},
    {"choices": [{"index": 0, "delta": {"content": ["a"]}}]},
    {"choices": [{"index": 0, "delta": {"content": {"text": "a"}}}]},
    {"choices": [{"index": 0, "delta": "text"}]},
    {"choices": [{"index": 0, "delta": {}, "finish_reason": {"why": "stop"}}]},
]
ANTHROPIC_BAD_EVENTS = [
    {"type": "content_block_delta", "index": 0},
    {"type": "content_block_delta", "index": 0, "delta": "text"},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta"}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": 5}},
]


@pytest.mark.parametrize("chunk", OPENAI_BAD_CHUNKS, ids=dumps)
def test_openai_chunks_of_the_wrong_shape_are_malformed(
    harness: Harness, chunk: dict[str, Any]
) -> None:
    w = Wire("openai")
    out = harness.run("openai", Script([w.start(), w.text("Hi"), w.raw(dumps(chunk)), w.finish()]))
    assert_cut(out, MalformedChunk)
    assert out.text == "Hi"


@pytest.mark.parametrize("data", ANTHROPIC_BAD_EVENTS, ids=dumps)
def test_anthropic_deltas_of_the_wrong_shape_are_malformed(
    harness: Harness, data: dict[str, Any]
) -> None:
    w = Wire("anthropic")
    out = harness.run("anthropic", Script([w.start(), w.raw(dumps(data)), w.finish()]))
    assert_cut(out, MalformedChunk)


def test_anthropic_unknown_events_are_ignored(harness: Harness) -> None:
    """Anthropic may add event types; clients must ignore the ones they do not know."""
    w = Wire("anthropic")
    unknown = sse_event("not json at all", "some_future_event") + sse_event("{}", "another")
    out = harness.run(
        "anthropic", Script([w.start(), w.text("a"), unknown, w.text("b"), w.finish()])
    )
    assert_finished(out, "ab")


@pytest.mark.parametrize("kind", KINDS)
def test_an_end_marker_without_a_finish_reason_is_truncated(harness: Harness, kind: Kind) -> None:
    """OpenAI ``[DONE]`` / Anthropic ``message_stop`` with no finish reason before it."""
    w = Wire(kind)
    out = harness.run(kind, Script([w.start(), w.text("Hi"), w.finish(reason=False)]))
    assert_cut(out, Truncated)
    assert out.text == "Hi"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("content_type", [None, "application/json", "text/plain", "text/html"])
def test_a_body_that_is_not_an_event_stream_is_malformed(
    harness: Harness, kind: Kind, content_type: str | None
) -> None:
    out = harness.run(kind, Script([Wire(kind).complete("Hi")], content_type=content_type))
    assert_cut(out, MalformedChunk)
    assert out.text == ""


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "content_type", ["text/event-stream; charset=utf-8", "Text/Event-Stream", "text/event-stream;"]
)
def test_event_stream_content_types_are_recognised(
    harness: Harness, kind: Kind, content_type: str
) -> None:
    out = harness.run(kind, Script([Wire(kind).complete("Hi")], content_type=content_type))
    assert_finished(out, "Hi")


@pytest.mark.parametrize("kind", KINDS)
def test_an_undecodable_content_encoding_is_malformed(harness: Harness, kind: Kind) -> None:
    script = Script([b"this is not gzip at all"], headers={"Content-Encoding": "gzip"})
    out = harness.run(kind, script)
    assert_cut(out, MalformedChunk)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("framing", ["chunked", "close"])
def test_a_body_that_ends_mid_event_is_truncated(
    harness: Harness, kind: Kind, framing: Literal["chunked", "close"]
) -> None:
    w = Wire(kind)
    last = w.text("never")
    body = [w.start(), w.text("Hi"), last[: len(last) // 2]]
    out = harness.run(kind, Script(body, framing=framing))
    assert_cut(out, Truncated)
    assert out.text == "Hi"


@pytest.mark.parametrize("kind", KINDS)
def test_a_socket_closed_mid_event_is_a_disconnect(harness: Harness, kind: Kind) -> None:
    w = Wire(kind)
    last = w.text("never")
    out = harness.run(kind, Script([w.start(), w.text("Hi"), last[:9], Cut()]))
    assert_cut(out, Disconnected)
    assert out.text == "Hi"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("framing", ["chunked", "close"])
def test_a_200_with_an_empty_body_is_truncated(
    harness: Harness, kind: Kind, framing: Literal["chunked", "close"]
) -> None:
    out = harness.run(kind, Script([], framing=framing))
    assert_cut(out, Truncated)


TEXTS = ("Hello", ", wörld", " — ☃\n", "")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"], ids=["LF", "CRLF", "CR"])
@pytest.mark.parametrize("multiline", [False, True], ids=["one-line", "multi-line"])
@pytest.mark.parametrize("bom", [False, True], ids=["", "BOM"])
def test_valid_sse_variants_parse(
    harness: Harness, kind: Kind, eol: bytes, multiline: bool, bom: bool
) -> None:
    """Line endings, a byte-order mark and data split over several ``data:`` lines are all
    valid SSE; each byte is its own write, so every split point is exercised."""
    w = Wire(kind, eol=eol, multiline=multiline)
    body = (BOM if bom else b"") + w.complete(*TEXTS)
    pieces: list[Step] = [body[:40], *(body[i : i + 1] for i in range(40, 120)), body[120:]]
    out = harness.run(kind, Script(pieces))
    assert_finished(out, "".join(TEXTS))
    assert out.usage.input_tokens == 11


# -- random streams ----------------------------------------------------------------------

Ending = Literal["finish", "eof", "close", "cut", "hang"]


@dataclass
class RandomStream:
    kind: Kind
    pieces: list[Step]
    texts: list[str]
    clean: bool  # only valid events: the outcome is fully predictable
    ending: Ending

    def __repr__(self) -> str:
        sizes = [len(p) if isinstance(p, bytes) else p for p in self.pieces]
        return f"RandomStream({self.kind}, clean={self.clean}, {self.ending}, {sizes})"


GARBAGE = st.one_of(
    st.binary(max_size=80),
    st.sampled_from(
        [
            b"data: [1]\n\n",
            b"data: null\n\n",
            b"data: \xff\n\n",
            b"data:\n\n",
            b"data: {\n\n",
            b"\xef\xbb\xbf",
            b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error"}}\n\n',
            b'data: {"error": {"message": "boom"}}\n\n',
            b"data: [DONE]\n\n",
            b"\r\r\n\n\r",
        ]
    ),
    st.sampled_from([1024, 1024 * 1024 + 64, 6 * 1024 * 1024]).map(lambda n: b"data: " + b"q" * n),
)


@st.composite
def random_streams(draw: st.DrawFn) -> RandomStream:
    kind = draw(st.sampled_from(KINDS))
    w = Wire(
        kind, eol=draw(st.sampled_from([b"\n", b"\r\n", b"\r"])), multiline=draw(st.booleans())
    )
    texts: list[str] = []
    parts: list[bytes] = [BOM] if draw(st.booleans()) else []
    parts.append(w.start())
    clean = True
    for _ in range(draw(st.integers(0, 6))):
        what = draw(st.sampled_from(["text", "text", "keepalive", "comment", "garbage"]))
        if what == "text":
            text = draw(st.text(max_size=12))
            texts.append(text)
            parts.append(w.text(text))
        elif what == "keepalive":
            parts.append(w.keepalive())
        elif what == "comment":
            parts.append(
                b": " + draw(st.binary(max_size=20)).replace(b"\n", b"").replace(b"\r", b"") + w.eol
            )
        else:
            clean = False
            parts.append(draw(GARBAGE))
    ending: Ending = draw(st.sampled_from(["finish", "finish", "eof", "close", "cut", "hang"]))
    if ending == "finish":
        parts.append(w.finish())
    body = b"".join(parts)
    if ending != "finish" and draw(st.booleans()):
        body = body[: draw(st.integers(0, len(body)))]  # truncated anywhere, even mid-event
    cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=6)))
    pieces: list[Step] = []
    for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True):
        pieces.append(body[a:b])
        if draw(st.booleans()):
            pieces.append(Pause(0.002))
    tail: dict[Ending, list[Step]] = {"cut": [Cut()], "hang": [Hang()]}
    pieces += tail.get(ending, [])
    return RandomStream(kind, pieces, texts, clean, ending)


@pytest.mark.timeout(60)
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(stream=random_streams())
def test_random_streams_end_or_cut_in_bounded_time_and_memory(
    server: ScriptServer, http: httpx.Client, stream: RandomStream
) -> None:
    framing: Literal["chunked", "close"] = "close" if stream.ending == "close" else "chunked"
    out = Harness(server, http).run(
        stream.kind, Script(stream.pieces, framing=framing), measure=True
    )
    event(f"{stream.ending}, clean={stream.clean}: {type(out.error).__name__}")
    assert out.elapsed < STALL_S + SLACK_S
    assert out.peak_bytes is not None and out.peak_bytes < MEMORY_BOUND
    if out.error is None:
        assert out.finish_reason is not None
    want = "".join(stream.texts)
    if stream.clean:
        assert want.startswith(out.text)
        if stream.ending == "finish":
            assert_finished(out, want)
        else:
            assert out.error is not None
    assert server.wait_idle(5.0)


@pytest.mark.parametrize("kind", KINDS)
def test_no_event_after_the_consumer_closes_the_stream(harness: Harness, kind: Kind) -> None:
    """Deltas already read into the buffer are not handed out once the stream is closed."""
    w = Wire(kind)
    harness.server.script = Script([w.start() + b"".join(w.text(f"{i} ") for i in range(50))])
    client = make_client(profile(harness.server, kind), harness.http)
    stream = client.open(plan_request(SPEC, client.profile, prefix="", remaining_tokens=100))
    got = []
    for ev in stream:
        if isinstance(ev, TextDelta):
            got.append(ev.text)
            stream.close()
    assert got == ["0 "]
