"""What every provider client shares: the stream's events, the one place where httpx's
errors and HTTP statuses become resumeq's, and Retry-After.

A client takes an injected ``httpx.Client`` and a :class:`~resumeq.core.settings.ProviderProfile`.
``open(plan)`` sends the request and answers a :class:`ProviderStream` once the status is
known (raising a :class:`~resumeq.core.errors.RetryableProviderError` or
:class:`~resumeq.core.errors.FatalProviderError` before any token); iterating the stream yields
:class:`TextDelta`, :class:`OutputDelta`, :class:`ToolCallDelta` / :class:`ToolCallEnd` and
:class:`Usage` events and raises a
:class:`~resumeq.core.errors.StreamCut` subclass when the stream breaks. A stream that ends
without a finish reason is a cut, never a success; a malformed chunk is a cut, never
skipped. The body is read by the bounded reader of :mod:`resumeq.providers.sse`.

Two clocks find a stall. httpx's read timeout (``stall_timeout_s``) fires when no byte
arrives; the stream's own progress deadline fires when bytes keep arriving (keep-alive
events, comments, a line that trickles in a byte at a time) but no content does for
``stall_timeout_s``. So a stall is seen at most ``stall_timeout_s`` after the last byte
and, while bytes trickle in, soon after ``stall_timeout_s`` without progress.
"""

from __future__ import annotations

import contextlib
import email.utils
import json
import os
import re
import socket
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

import httpx
from httpx_sse import ServerSentEvent, SSEError

from resumeq.core.continuation import RequestPlan
from resumeq.core.errors import (
    Disconnected,
    FatalProviderError,
    MalformedChunk,
    ProviderConnectError,
    ProviderError,
    ProviderOverloaded,
    ProviderUnavailable,
    RateLimited,
    Stalled,
    StreamCut,
    Truncated,
    UnreadableCount,
)
from resumeq.core.settings import ProviderProfile
from resumeq.providers.pacing import PacedStream
from resumeq.providers.sse import iter_events
from resumeq.providers.tokenize import READERS

_SURROGATE = re.compile("[\ud800-\udfff]")

#: Error bodies longer than this are cut before they go into an exception.
MAX_ERROR_BODY = 4_096


@dataclass(frozen=True)
class TextDelta:
    """Answer text that arrived, with its output tokens: counted exactly (the provider's
    cumulative usage) or estimated (one per chunk: every chunk carries at least one)."""

    text: str
    tokens: int
    exact: bool


@dataclass(frozen=True)
class OutputDelta:
    """Output the provider bills that is not resumable text: ``reasoning`` (thinking),
    ``refusal`` (the model's refusal to answer: its text is the refusal) or ``other`` (a
    server tool's input, an end token counted on its own), with its tokens."""

    kind: Literal["reasoning", "refusal", "other"]
    text: str
    tokens: int
    exact: bool


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of a tool call. ``index`` orders the calls of one attempt's answer (0, 1, …,
    in the order they start); the call's first delta carries its ``id`` (the id the app must
    send back: OpenAI's tool call id, Anthropic's toolu_ id, the Responses call_id) and
    ``name``; ``arguments`` is the next piece of its arguments' JSON text (may be ""). Its
    tokens are counted as a :class:`TextDelta`'s are."""

    index: int
    id: str | None
    name: str | None
    arguments: str
    tokens: int
    exact: bool


@dataclass(frozen=True)
class ToolCallEnd:
    """Call ``index`` is whole: no more of its arguments will come. A call cut before its
    end gets none."""

    index: int


@dataclass(frozen=True)
class Usage:
    """Provider-reported usage as of this point of the attempt (None: not reported)."""

    input_tokens: int | None = None
    cached_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    #: Output tokens of this attempt so far, cumulative, reasoning included.
    output_tokens: int | None = None
    #: The reasoning tokens among them, where the provider says.
    reasoning_tokens: int | None = None


@dataclass(frozen=True)
class Started:
    """The provider named the response it is making (the Responses API's
    ``response.created``): a background response can be read on from here if cut."""

    response_id: str
    status: str | None


StreamEvent = TextDelta | OutputDelta | ToolCallDelta | ToolCallEnd | Usage | Started


def parse_retry_after(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Seconds to wait, from ``retry-after-ms`` or ``retry-after`` (seconds or HTTP date)."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        try:
            return max(0.0, float(raw_ms) / 1000.0)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if raw is None:
        return None
    raw = raw.strip()
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def status_error(
    status: int, message: str, *, headers: Mapping[str, str], body: str, error_type: str | None
) -> ProviderError:
    """The exception for an HTTP error status, classified once."""
    kwargs: dict[str, Any] = {
        "status": status,
        "retry_after": parse_retry_after(headers),
        "error_type": error_type,
        "body": body[:MAX_ERROR_BODY],
    }
    text = f"HTTP {status}: {message}"
    if status == 429:
        return RateLimited(text, **kwargs)
    if status == 529:
        return ProviderOverloaded(text, **kwargs)
    if status >= 500 or status in (408, 409):
        return ProviderUnavailable(text, **kwargs)
    return FatalProviderError(text, **kwargs)


def error_details(body: str) -> tuple[str, str | None]:
    """Message and type from an OpenAI (``{"error": {...}}``) or Anthropic
    (``{"type": "error", "error": {...}}``) error body; the raw text otherwise."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return body.strip()[:300] or "(empty body)", None
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict):
        message = err.get("message")
        kind = err.get("type") or err.get("code")
        return (str(message) if message else json.dumps(err)[:300]), (str(kind) if kind else None)
    if isinstance(err, str):
        return err, None
    return body.strip()[:300], None


def json_object(sse: ServerSentEvent) -> dict[str, Any]:
    """An SSE event's data as a JSON object, or a :class:`MalformedChunk` cut."""
    try:
        data = json.loads(sse.data)
    except (ValueError, RecursionError):  # RecursionError: nested too deep to decode
        raise MalformedChunk(f"chunk is not JSON: {sse.data[:120]!r}") from None
    if not isinstance(data, dict):
        raise MalformedChunk(f"chunk is not a JSON object: {sse.data[:120]!r}")
    return data


class ProviderStream(ABC):
    """One streaming response. Iterate it for events; close it to stop paying at once."""

    def __init__(self, response: httpx.Response, *, stall_timeout_s: float) -> None:
        self._response = response
        self._stall_timeout_s = stall_timeout_s
        #: The provider's finish reason, once it said one (``stop``, ``length`` …).
        self.finish_reason: str | None = None
        #: The latest usage the provider reported.
        self.usage = Usage()
        self.closed = False
        #: A response a provider keeps (a Responses API background response): its id and
        #: the number of the last event read, where a reader may go on from.
        self.response_id: str | None = None
        self.sequence: int | None = None
        self._deadline = time.monotonic() + stall_timeout_s
        #: Per channel, the first half of a surrogate pair whose second half is to come.
        self._high: dict[str, str] = {}

    def __iter__(self) -> Iterator[StreamEvent]:
        """The stream's events. Once the provider said its finish reason the answer is
        whole: whatever happens to the connection after it (a drop before ``[DONE]``, a
        stall, a broken last chunk) ends the stream normally."""
        try:
            yield from self._events()
        except StreamCut:
            if self.finish_reason is None or self.closed:
                raise

    def _events(self) -> Iterator[StreamEvent]:
        self._note_progress()
        try:
            yield from self._read()
        except httpx.TimeoutException:
            if time.monotonic() >= self._deadline - 0.01:
                raise Stalled(
                    f"no content for {self._stall_timeout_s:g} s "
                    "(no bytes, or only keep-alives and comments)"
                ) from None
            raise Stalled(f"no bytes for {self._stall_timeout_s:g} s") from None
        except (httpx.DecodingError, SSEError) as exc:
            raise MalformedChunk(f"not a readable event stream: {exc}") from None
        except (httpx.HTTPError, httpx.StreamError) as exc:
            if self.closed:
                return
            raise Disconnected(f"connection dropped mid-stream: {exc!r}") from None
        if self.closed:
            return
        if self.finish_reason is None:
            raise Truncated("the stream ended without a finish reason")
        if any(self._high.values()):
            raise MalformedChunk("the stream ended inside a surrogate pair")

    def _unicode(self, text: str, channel: str = "text") -> str:
        """``text`` as valid Unicode. A JSON string may carry a UTF-16 surrogate (a server
        that splits an emoji across two chunks sends its halves apart): a pair split across
        chunks is joined; a half without its other half is a malformed chunk, never text."""
        text = self._high.pop(channel, "") + text
        if not _SURROGATE.search(text):
            return text
        if "\ud800" <= text[-1] <= "\udbff":
            self._high[channel] = text[-1]
            text = text[:-1]
        try:
            return text.encode("utf-16", "surrogatepass").decode("utf-16")
        except UnicodeDecodeError:
            why = f"{channel} holds a lone UTF-16 surrogate: {text[:40]!r}"
            raise MalformedChunk(why) from None

    def _held(self, channel: str) -> bool:
        """Whether ``channel`` holds the first half of a surrogate pair."""
        return channel in self._high

    def _read(self) -> Iterator[StreamEvent]:
        self._check_content_type()
        for sse in iter_events(self._chunks()):
            for event in self._on_event(sse):
                yield event
                if self.closed:
                    return  # closed by the consumer: not one more event
                if isinstance(event, TextDelta | OutputDelta | ToolCallDelta):
                    self._note_progress()  # after the consumer had its turn
            if self._complete():
                return

    def _check_content_type(self) -> None:
        raw = self._response.headers.get("content-type", "")
        media_type = raw.partition(";")[0].strip().lower()
        if media_type != "text/event-stream":
            raise MalformedChunk(f"not an event stream: content-type {raw[:80]!r}")

    def _chunks(self) -> Iterator[bytes]:
        """The body's bytes, until the progress deadline passes."""
        for chunk in self._response.iter_bytes():
            yield chunk
            # Checked once the chunk's events are handled, before waiting for more.
            if time.monotonic() >= self._deadline:
                raise Stalled(
                    f"bytes but no content for {self._stall_timeout_s:g} s "
                    "(keep-alives, comments or an endless line)"
                )

    def _note_progress(self) -> None:
        """The provider produced content: the progress deadline starts again (and the
        connection's reads wait no longer than it, where they can be told)."""
        self._deadline = time.monotonic() + self._stall_timeout_s
        paced = self._paced()
        if paced is not None:
            paced.deadline = self._deadline

    @abstractmethod
    def _on_event(self, sse: ServerSentEvent) -> Iterator[StreamEvent]:
        """Translate one SSE event into stream events (or raise a cut)."""

    def _complete(self) -> bool:
        """Whether the wire format's end-of-stream marker has arrived."""
        return False

    def close(self) -> None:
        """Close the connection now: the provider stops generating (and billing)."""
        self.closed = True
        self._response.close()

    def _paced(self) -> PacedStream | None:
        """The connection, when it is one a worker's clients make (an injected client's
        need not be)."""
        stream = self._response.extensions.get("network_stream")
        return stream if isinstance(stream, PacedStream) else None

    def drain(self) -> bool:
        """Read on only the bytes that have already reached this machine, then end (a
        cut). Answers False when the connection cannot be drained (not a paced one: an
        injected client), so the caller stops."""
        stream = self._paced()
        if stream is None:
            return False
        stream.drain()
        return True

    def interrupt_for_handoff(self) -> None:
        """A handoff's deadline for quiet streams: close this one from another thread —
        unless bytes that reached this machine wait to be read. Those were paid for, and
        their reader is not blocked on the socket (a read with bytes waiting returns at
        once; a paced reader may be in its pause): it reads them and the drain ends the
        stream at the last of them. Shutting the socket would throw them away."""
        stream = self._paced()
        if stream is not None and stream.drain() > 0:
            return
        self.interrupt()

    def interrupt(self) -> None:
        """Close the connection from another thread: the thread reading it is woken at once,
        even from a provider that sends nothing for a while (closing a socket alone does not
        wake a read blocked on it)."""
        self.closed = True
        stream = self._response.extensions.get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(Exception):  # the reader may be closing it at the same time
            self._response.close()

    @property
    def holding(self) -> bool:
        """Whether text read is held back (the first half of a surrogate pair, whose second
        half is to come): what was yielded does not yet end where the last event did."""
        return bool(self._high)

    def __enter__(self) -> ProviderStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class ProviderClient(ABC):
    """A provider profile's wire format over an injected ``httpx.Client``."""

    def __init__(self, profile: ProviderProfile, http: httpx.Client) -> None:
        self.profile = profile
        self.http = http

    @property
    def api_key(self) -> str | None:
        """Read from the profile's variable on every call: never stored anywhere."""
        name = self.profile.api_key_env
        return os.environ.get(name) if name else None

    @property
    def timeout(self) -> httpx.Timeout:
        """Read timeout = stall timeout: no bytes for that long is a stall. No pool
        timeout: a stream that finds every connection of the profile's pool busy waits for
        one (the lease is kept meanwhile), it does not fail for it."""
        p = self.profile
        return httpx.Timeout(p.stall_timeout_s, connect=p.connect_timeout_s, pool=None)

    #: Where generation requests go, below the profile's base URL.
    endpoint: str
    stream_class: type[ProviderStream]

    @abstractmethod
    def body(self, plan: RequestPlan) -> dict[str, Any]:
        """The JSON body for a plan (streaming)."""

    def build(self, plan: RequestPlan) -> httpx.Request:
        """The HTTP request for a plan."""
        return self.http.build_request(
            "POST",
            f"{self.profile.base_url}{self.endpoint}",
            json=self.body(plan),
            # Identity: a compressed body would let one read inflate past the SSE bounds.
            headers={
                **self.headers(),
                "Accept": "text/event-stream",
                "Accept-Encoding": "identity",
            },
            timeout=self.timeout,
        )

    def count_text_tokens(self, text: str, *, model: str, timeout_s: float | None = None) -> int:
        """Tokens of ``text`` by the provider's counting endpoint (the profile's
        ``tokenizer`` format); raises :class:`~resumeq.core.errors.ProviderError` when the
        endpoint fails or answers something that is not a count."""
        if not text:
            return 0
        reader = READERS[self.profile.tokenizer_format]
        return reader(self.profile, self.post_json, text, model, timeout_s)

    def open(self, plan: RequestPlan) -> ProviderStream:
        """Send the plan's request; answer the stream once the status is 2xx."""
        response = self.send(self.build(plan))
        return self.stream_class(response, stall_timeout_s=self.profile.stall_timeout_s)

    def send(self, request: httpx.Request, *, stream: bool = True) -> httpx.Response:
        """Send ``request``; translate connect failures and error statuses."""
        try:
            response = self.http.send(request, stream=stream)
        except httpx.TimeoutException as exc:
            raise ProviderConnectError(f"timed out before a response: {exc!r}") from None
        except httpx.TransportError as exc:
            raise ProviderConnectError(f"could not reach the provider: {exc!r}") from None
        except httpx.HTTPError as exc:  # a body that cannot be decoded, and the like
            raise ProviderUnavailable(f"unreadable answer: {exc!r}") from None
        if response.status_code >= 400:
            try:
                body = _read_bounded(response)
            except httpx.HTTPError:
                body = ""
            finally:
                response.close()
            message, kind = error_details(body)
            raise status_error(
                response.status_code, message, headers=response.headers, body=body, error_type=kind
            )
        return response

    def post_json(
        self, url: str, body: Mapping[str, Any], *, timeout_s: float | None = None
    ) -> dict[str, Any]:
        """A small non-streaming JSON call (the counting endpoints); ``timeout_s`` bounds
        the whole call when given."""
        timeout = self.timeout if timeout_s is None else httpx.Timeout(max(0.05, timeout_s))
        request = self.http.build_request(
            "POST", url, json=dict(body), headers=self.headers(), timeout=timeout
        )
        response = self.send(request, stream=False)
        try:
            data = response.json()
        except ValueError:
            kind = response.headers.get("content-type", "")[:60]
            raise UnreadableCount(f"{url} answered non-JSON ({kind})") from None
        if not isinstance(data, dict):
            raise UnreadableCount(f"{url} answered a JSON {type(data).__name__}")
        return data

    def cancel(self, response_id: str) -> bool:
        """Stop a response the provider keeps generating for nobody (a background response
        of the Responses API); answers whether it was stopped. A wire that keeps none has
        nothing to stop: it answers False."""
        return False

    @abstractmethod
    def headers(self) -> dict[str, str]:
        """Authentication and version headers."""


def _read_bounded(response: httpx.Response, limit: int = 64 * 1024) -> str:
    chunks, size = [], 0
    for chunk in response.iter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size >= limit:
            break
    return b"".join(chunks).decode("utf-8", errors="replace")
