"""A bounded reader of ``text/event-stream`` bodies, from bytes to events.

It follows the WHATWG event-stream interpretation, as httpx-sse does, with the limits a
worker needs against a provider (or a proxy) that misbehaves: a line or an event longer
than :data:`MAX_EVENT_BYTES` is refused instead of buffered, and a line that is not UTF-8
is refused instead of decoded to U+FFFD (a worker must never store a replacement character
as if the provider had sent it). Lines end in CRLF, LF or CR; a leading byte-order mark is
dropped; an event with no ``data`` field is not dispatched; at the end of the body an
unfinished event is discarded. Refusals are :class:`httpx_sse.SSEError`: the stream that
reads the body turns them into cuts.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from httpx_sse import ServerSentEvent, SSEError

#: The longest SSE line, and the most ``data`` one event may carry, in bytes.
MAX_EVENT_BYTES = 1024 * 1024

_BOM = b"\xef\xbb\xbf"


def iter_lines(chunks: Iterable[bytes], limit: int = MAX_EVENT_BYTES) -> Iterator[bytes]:
    """The lines of a body, without their ends; never holds more than ``limit`` bytes of an
    unfinished line (plus one chunk)."""
    pending = bytearray()
    skip_lf = False  # the last chunk ended in CR: a LF that starts the next one is its pair
    for chunk in chunks:
        if not chunk:
            continue
        text = chunk[1:] if skip_lf and chunk[0] == 0x0A else chunk
        skip_lf = text.endswith(b"\r")
        if b"\r" in text:
            text = text.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        *lines, rest = text.split(b"\n")
        if lines and pending:
            pending += lines[0]
            lines[0] = bytes(pending)
            pending.clear()
        for line in lines:
            if len(line) > limit:
                raise SSEError(f"an event-stream line longer than {limit} bytes")
            yield line
        pending += rest
        if len(pending) > limit:
            raise SSEError(f"an event-stream line longer than {limit} bytes")


def iter_events(chunks: Iterable[bytes], limit: int = MAX_EVENT_BYTES) -> Iterator[ServerSentEvent]:
    """The events of a body."""
    pending = _PendingEvent(limit)
    for i, raw in enumerate(iter_lines(chunks, limit)):
        line = raw.removeprefix(_BOM) if i == 0 else raw
        if not line:
            sse = pending.dispatch()
            if sse is not None:
                yield sse
        elif not line.startswith(b":"):  # a comment: never decoded, never kept
            pending.field(line)


class _PendingEvent:
    """The fields of the event being read (``retry`` is ignored: a worker never reconnects
    by itself)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._name = ""
        self._data: list[str] | None = None  # None: no data field, nothing to dispatch
        self._size = 0
        self._last_id = ""

    def field(self, line: bytes) -> None:
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SSEError(f"an event-stream line that is not UTF-8: {exc}") from None
        name, _, value = text.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._size += len(line) + 1
            if self._size > self._limit:
                raise SSEError(f"an event with more than {self._limit} bytes of data")
            if self._data is None:
                self._data = []
            self._data.append(value)
        elif name == "event":
            self._name = value
        elif name == "id" and "\0" not in value:
            self._last_id = value

    def dispatch(self) -> ServerSentEvent | None:
        """The event a blank line ends, if it had data; the buffers start again."""
        data, self._data, self._size = self._data, None, 0
        name, self._name = self._name, ""
        if data is None:
            return None
        return ServerSentEvent(event=name, data="\n".join(data), id=self._last_id)
