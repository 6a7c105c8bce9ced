"""A job's durable text as Server-Sent Events.

``id:`` is the revision; ``event: delta`` carries ``{"text", "revision"}``, ``event: state``
``{"state"}`` on every state change, and ``event: end`` ``{"state"}`` at a terminal state or
a spill, after which the stream closes. A client that reconnects with ``Last-Event-ID`` (or
``?after=``) gets exactly the text it has not seen: the revisions and the events are the
ones :class:`~resumeq.producer.client.EventCursor` reads for ``Client.follow``.

Followers of one job share one feed per process (:class:`Hub`), and the feeds share a few
blocking reads (:class:`Reader`, one for up to :data:`READER_JOBS` jobs): a thousand
followers of a hundred jobs cost one XREAD at a time and one Redis connection, not a
thousand. The response listens for the client's disconnect itself, whatever ASGI version
the server speaks; the follower leaves the hub at once, a feed goes with its last follower
and a reader's task with its last feed: nothing is left running after followers go away.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import redis
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from resumeq.core.errors import RedisUnavailable
from resumeq.core.models import JobRecord, JobState
from resumeq.producer.async_client import AsyncClient
from resumeq.producer.client import EventCursor
from resumeq.store import keys, redis_errors
from resumeq.store.capabilities import Probe, is_refusal, refusal, warning

log = logging.getLogger(__name__)

#: States after which nothing more happens to a job; a spill waits for a person (a follower
#: is told ``end`` while it is the job's latest state, and a requeue goes on from there).
ENDING_STATES = frozenset(s.value for s in JobState if s.terminal)
SPILLED = JobState.SPILLED.value

#: The most jobs one blocking read covers: each read sends every stream's key and id, so a
#: few readers of a few hundred beat one of thousands.
READER_JOBS = 256
#: How long a read blocks (then quiet jobs are probed: purged, or their events trimmed).
BLOCK_MS = 1000
#: How long it blocks where Redis refuses ``CLIENT ID`` or ``CLIENT UNBLOCK`` (a feed that
#: joins waits for the running read to return: this is how long at most).
POLL_BLOCK_MS = 100
PROBE_S = 1.0
#: How soon an unblock that found the read not yet blocking tries again.
UNBLOCK_RETRY_S = 0.002

#: How long a browser's EventSource waits before it reconnects (ms): every stream's first
#: field. It reconnects with Last-Event-ID, and gets exactly what it has not seen.
RETRY_MS = 1000
OPENING = f"retry: {RETRY_MS}\n: following\n\n".encode()

#: What proxies must not do to an event stream: buffer it (nginx), cache it, transform it.
HEADERS = {
    "Cache-Control": "no-cache, no-transform",
    "X-Accel-Buffering": "no",
    "Connection": "keep-alive",
}


def event(name: str, revision: int | None, data: dict[str, Any]) -> str:
    head = f"id: {revision}\n" if revision is not None else ""
    return f"{head}event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def frames(revision: int, fields: dict[str, str]) -> list[str]:
    """The SSE events one entry of the job's events stream makes (a delta, a state, both)."""
    out = []
    text = fields.get("delta")
    if text:
        out.append(event("delta", revision, {"text": text, "revision": revision}))
    for call in json.loads(fields["calls"]) if fields.get("calls") else ():
        out.append(event("tool_call", revision, {**call, "revision": revision}))
    if fields.get("reset") == "1":
        # The answer so far was let go (not what was asked): a reader drops what it has.
        out.append(event("reset", revision, {"reason": fields.get("reason", "")}))
    state = fields.get("state")
    if state:
        out.append(event("state", revision, {"state": state}))
        if state in ENDING_STATES:
            out.append(event("end", revision, {"state": state}))
    return out


class Feed:
    """One job's events, read once for every follower of the job in this process (by its
    :class:`Reader`), keeping what was read (a job's events are its text in pieces: bounded
    by the job) and waking the followers as each arrives."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.cursor = EventCursor(job_id, after=0, deadline=None, stop_at_spill=False)
        self.started = False  # the cursor has the job's record
        self.entries: list[tuple[int, bytes]] = []  # each entry's revision and SSE frames
        #: Each entry as read (the gateway renders them in a wire's own format).
        self.raw: list[tuple[int, dict[str, str]]] = []
        self.revisions: list[int] = []
        self.done = False
        self.error: BaseException | None = None
        #: The job's latest state read, with its revision.
        self.state: tuple[int, str] | None = None
        self.followers = 0
        self.quiet_since = time.monotonic()  # the last entry read, or the last probe
        self._wake = asyncio.Event()

    def add(self, entries: list[tuple[int, dict[str, str]]]) -> None:
        for revision, fields in entries:
            # Rendered once for every follower.
            self.entries.append((revision, "".join(frames(revision, fields)).encode()))
            self.raw.append((revision, fields))
            self.revisions.append(revision)
            if fields.get("state"):
                self.state = (revision, fields["state"])
        if entries:
            self.quiet_since = time.monotonic()
            self._notify()
        if self.cursor.ended:
            self.finish(None)

    def finish(self, error: BaseException | None) -> None:
        """No more entries: the job ended, or its read failed (the followers' streams end;
        their clients reconnect)."""
        if not self.done:
            self.done = True
            self.error = error
            self._notify()

    def _notify(self) -> None:
        self._wake.set()
        self._wake = asyncio.Event()

    def after(self, revision: int) -> int:
        """Where the entries after ``revision`` begin."""
        return bisect.bisect_right(self.revisions, revision)

    async def changed(self, timeout_s: float) -> bool:
        """Wait for an entry or the end; False after ``timeout_s`` of nothing."""
        wake = self._wake
        try:
            async with asyncio.timeout(timeout_s):  # no task per wait, as wait_for makes
                await wake.wait()
        except TimeoutError:
            return False
        return True


class Unblocking:
    """Whether this process's readers may cut a blocking read short (``CLIENT ID`` and
    ``CLIENT UNBLOCK``, which a restricted Redis may refuse: :mod:`resumeq.store.capabilities`);
    shared by every reader, said once when it is found out."""

    def __init__(self, allowed: bool = True) -> None:
        self.allowed = allowed

    def refused(self, exc: BaseException, probe: Probe) -> None:
        if self.allowed:
            self.allowed = False
            log.warning(warning("serve", [refusal(probe, exc)], POLLING))


#: What ``resumeq serve`` does without ``CLIENT ID`` or ``CLIENT UNBLOCK``.
POLLING = (
    f"event reads block for {POLL_BLOCK_MS} ms at a time instead of {BLOCK_MS} (polling), "
    "and a newly followed job's events start when the running read returns"
)


def _refusal_in(exc: BaseException) -> BaseException | None:
    """The refusal behind ``exc`` (itself, or what a resumeq error was raised from)."""
    for candidate in (exc, exc.__cause__):
        if candidate is not None and is_refusal(candidate):
            return candidate
    return None


class Reader:
    """One blocking XREAD for the events streams of up to :data:`READER_JOBS` feeds, on a
    connection of its own: a process following a thousand jobs holds a handful of
    connections, not a thousand, and an event on any of them wakes one task.

    A feed that joins while the read blocks unblocks it (``CLIENT UNBLOCK``: nothing is
    written to Redis), so that the next read includes it at once. A job quiet for
    :data:`PROBE_S` is probed (one pipelined HMGET for all of them), as
    :class:`~resumeq.producer.client.EventCursor` asks: a purged job ends its feed, a trimmed one is
    read from its snapshot. The task runs while the reader has feeds, and stops with the
    last one."""

    def __init__(
        self, client: AsyncClient, name: str, unblocking: Unblocking | None = None
    ) -> None:
        self.client = client
        self.name = name
        self.unblocking = unblocking or Unblocking()
        self.feeds: dict[bytes, Feed] = {}  # by events stream key
        self._task: asyncio.Task[None] | None = None
        self._probed = time.monotonic()
        self._connection_id: int | None = None  # of the read's connection, while it blocks
        #: A feed joined since the running read was sent: it must be unblocked.
        self._stale = False
        self._pokes: set[asyncio.Task[None]] = set()  # unblocks in flight, held until done

    def add(self, feed: Feed) -> None:
        self.feeds[keys.events(feed.job_id).encode()] = feed
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=self.name)
        elif not self._stale and self.unblocking.allowed:
            self._stale = True
            poke = asyncio.create_task(self._unblock(), name=f"{self.name}:unblock")
            self._pokes.add(poke)
            poke.add_done_callback(self._pokes.discard)

    def remove(self, feed: Feed) -> None:
        """A feed whose followers went: its stream is not read again (nothing to wake:
        a read already blocking on it only returns what nobody takes)."""
        key = keys.events(feed.job_id).encode()
        if self.feeds.get(key) is feed:
            del self.feeds[key]

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def _unblock(self) -> None:
        """Ends the running read early. It may not have reached Redis yet (it goes out on
        another connection): then again, until it is unblocked or has returned by itself
        (the next read includes the new feed)."""
        try:
            while self._stale and self._connection_id is not None and self.unblocking.allowed:
                if await self.client.redis.client_unblock(self._connection_id):
                    return
                await asyncio.sleep(UNBLOCK_RETRY_S)
        except Exception as exc:  # the read returns within a second anyway
            if (refused := _refusal_in(exc)) is not None:
                self.unblocking.refused(refused, "unblock")

    async def _run(self) -> None:
        # Outer loop: a feed that joins while the connection is being given back (the task
        # not done yet, so no new task was started for it) is read on a fresh one.
        while self.feeds:
            try:
                async with self.client.redis.client() as connection:  # one connection, held
                    while self.feeds:
                        await self._read(connection)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis failed: every feed ends; followers reconnect
                for each in self.feeds.values():
                    each.finish(exc)
                self.feeds.clear()
            finally:
                self._connection_id = None  # a new connection has a new id

    async def _read(self, connection: Any) -> None:
        await self._start_new()
        if not self.feeds:
            return
        if self._connection_id is None and self.unblocking.allowed:
            try:
                self._connection_id = await connection.client_id()
            except redis.ResponseError as exc:
                if not is_refusal(exc):
                    raise
                self.unblocking.refused(exc, "id")
        sent = dict(self.feeds)  # the feeds this read is for
        streams: dict[Any, Any] = {}
        for each in sent.values():
            streams.update(each.cursor.streams)
        self._stale = False
        block = BLOCK_MS if self.unblocking.allowed else POLL_BLOCK_MS
        with redis_errors("follow"):
            reply: Any = await connection.xread(streams, count=EventCursor.count, block=block)
        for stream, entries in reply or ():
            target = sent.get(stream)
            # A feed replaced while the read blocked (its job followed afresh) is not the
            # one these entries continue.
            if target is not None and self.feeds.get(stream) is target and not target.done:
                await self._contained(target, self._take(target, [(stream, entries)]))
        await self._probe()

    async def _contained(self, feed: Feed, step: Awaitable[None]) -> None:
        """One job's step: what goes wrong with that job ends its feed alone (Redis
        failing ends them all, above)."""
        try:
            await step
        except RedisUnavailable:
            raise
        except Exception as exc:
            feed.finish(exc)
            self.remove(feed)

    async def _start_new(self) -> None:
        """The job record of each feed that joined since the last read (also of those that
        join meanwhile)."""
        while new := [f for f in self.feeds.values() if not f.started]:
            for feed in new:
                feed.started = True
                await self._contained(feed, self._start(feed))

    async def _start(self, feed: Feed) -> None:
        feed.cursor.start(await self.client.record(feed.job_id))
        await self._fill(feed)
        if feed.done:
            self.remove(feed)

    async def _take(self, feed: Feed, reply: Any) -> None:
        feed.add(feed.cursor.take(reply))
        await self._fill(feed)
        if feed.done:
            self.remove(feed)

    async def _fill(self, feed: Feed) -> None:
        """A job whose events are gone (trimmed) is read from one snapshot, once."""
        if feed.cursor.gap:
            job = await self.client.get(feed.job_id)
            feed.add(feed.cursor.fill(job.record, job.text))

    async def _probe(self) -> None:
        now = time.monotonic()
        if now - self._probed < PROBE_S:
            return
        self._probed = now
        quiet = [f for f in self.feeds.values() if now - f.quiet_since >= PROBE_S]
        if not quiet:
            return
        async with self.client.redis.pipeline(transaction=False) as pipe:
            for feed in quiet:
                pipe.hmget(feed.cursor.job_key, feed.cursor.probe)
            with redis_errors("follow"):
                probed = await pipe.execute()
        for feed, fields in zip(quiet, probed, strict=True):
            feed.quiet_since = now
            await self._contained(feed, self._idle(feed, fields))

    async def _idle(self, feed: Feed, fields: list[Any]) -> None:
        feed.cursor.idle(fields)  # JobNotFound for a job purged
        await self._fill(feed)
        if feed.done:
            self.remove(feed)

    async def close(self) -> None:
        for task in [self._task, *self._pokes]:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self.feeds.clear()


class Full(Exception):
    """A follower this process will not take now (its status, and why)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Hub:
    """The feeds of this process, one per followed job, gone with their last follower,
    read by as few :class:`Reader` s as hold them."""

    def __init__(self, client: AsyncClient, unblocking: Unblocking | None = None) -> None:
        self.client = client
        self.unblocking = unblocking or Unblocking()
        self.feeds: dict[str, Feed] = {}
        self.readers: list[Reader] = []
        self._reader_of: dict[str, Reader] = {}
        self.followers = 0
        #: Followers by the principal that opened them.
        self.by_principal: Counter[str] = Counter()

    def join(self, job_id: str, principal: str) -> Feed:
        feed = self.feeds.get(job_id)
        if feed is None or feed.done:  # a job requeued after its spill: read it afresh
            if feed is not None:
                self._reader_of.pop(job_id).remove(feed)
            feed = self.feeds[job_id] = Feed(job_id)
            reader = next((r for r in self.readers if len(r.feeds) < READER_JOBS), None)
            if reader is None:
                name = f"resumeq-reader:{len(self.readers)}"
                reader = Reader(self.client, name, self.unblocking)
                self.readers.append(reader)
            reader.add(feed)
            self._reader_of[job_id] = reader
        feed.followers += 1
        self.followers += 1
        self.by_principal[principal] += 1
        return feed

    def stream(
        self,
        record: JobRecord,
        *,
        after: int,
        keepalive_s: float,
        principal: str,
        max_jobs: int,
        max_streams: int = 0,
    ) -> EventStream:
        """The event stream of ``record``'s job after revision ``after``: one snapshot read
        of its own for a job whose events were trimmed, else a follower of its feed
        (:meth:`_admit`: :class:`Full` past the limits)."""
        job_id = record.id
        if record.events_trimmed is not None:  # ended a while ago: its text, from a snapshot
            return EventStream(replay(self.client, job_id, after=after, state=record.state.value))
        feed = self._admit(job_id, principal, max_jobs, max_streams)
        body = follow(feed, after=after, keepalive_s=keepalive_s)
        return EventStream(body, release=lambda: self.leave(feed, principal))

    def entries(
        self,
        record: JobRecord,
        *,
        keepalive_s: float,
        principal: str,
        max_jobs: int,
        max_streams: int = 0,
    ) -> tuple[AsyncIterator[Batch], Callable[[], None]]:
        """The entries of ``record``'s job's events stream as read, in batches (an empty
        one every ``keepalive_s`` of nothing), until the job ends; with what to call once
        the reader is done with them. As :meth:`stream` for :class:`Full` and for a job
        whose events were trimmed."""
        if record.events_trimmed is not None:
            return snapshot_entries(self.client, record), lambda: None
        feed = self._admit(record.id, principal, max_jobs, max_streams)
        return feed_entries(feed, keepalive_s=keepalive_s), lambda: self.leave(feed, principal)

    def _admit(self, job_id: str, principal: str, max_jobs: int, max_streams: int) -> Feed:
        """The feed of ``job_id``, joined for ``principal``: :class:`Full` past
        ``max_jobs`` followed jobs or ``max_streams`` streams of ``principal`` (0: no
        limit). Checked and joined with no await between: concurrent requests cannot all
        pass."""
        if job_id not in self.feeds and len(self.feeds) >= max_jobs:
            raise Full(
                503,
                f"this server follows {len(self.feeds)} jobs, its most ([server] "
                "max_followed_jobs): try again, or another server process",
            )
        if max_streams and self.by_principal[principal] >= max_streams:
            raise Full(
                429,
                f"{principal} holds {self.by_principal[principal]} event streams on this "
                "server, its most ([server] max_streams_per_producer): close one, or try again",
            )
        return self.join(job_id, principal)

    def leave(self, feed: Feed, principal: str) -> None:
        feed.followers -= 1
        self.followers -= 1
        self.by_principal[principal] -= 1
        if not self.by_principal[principal]:
            del self.by_principal[principal]
        if feed.followers == 0 and self.feeds.get(feed.job_id) is feed:
            del self.feeds[feed.job_id]
            self._reader_of.pop(feed.job_id).remove(feed)

    @property
    def reading(self) -> int:
        """Readers whose task runs."""
        return sum(1 for r in self.readers if r.running)

    async def close(self) -> None:
        for reader in self.readers:
            await reader.close()
        self.readers.clear()
        self.feeds.clear()
        self._reader_of.clear()


#: Entries of a job's events stream as read: each revision and its fields.
Batch = list[tuple[int, dict[str, str]]]


class Lost(Exception):
    """The read of a job's events failed (Redis gone, the job purged): a reader of its
    entries stops with this, and its client reads again by id."""


async def feed_entries(feed: Feed, *, keepalive_s: float) -> AsyncIterator[Batch]:
    """``feed``'s entries from its first, in batches as they arrive (an empty batch after
    ``keepalive_s`` of nothing), until the job ends; :class:`Lost` if the read fails."""
    index = 0
    while True:
        ready, index = feed.raw[index:], len(feed.raw)
        if ready:
            yield ready
        if feed.done:
            if feed.error is not None:
                raise Lost(f"{type(feed.error).__name__}: {feed.error}") from feed.error
            return
        if not await feed.changed(keepalive_s):
            yield []


async def snapshot_entries(client: AsyncClient, record: JobRecord) -> AsyncIterator[Batch]:
    """The entries of a job whose events stream was removed (it ended a while ago), made
    again from its record and text: a delta at each revision that added text (where
    :attr:`~resumeq.core.models.JobRecord.text_offsets` says each ended), then its calls and
    its end at its last revision. A reader numbers them as it numbered the stream they
    were, as long as the calls came after the text."""
    job = await client.get(record.id)
    data = job.text.encode()
    out: Batch = []
    start = 0
    for pair in job.record.text_offsets.split():
        revision, _, end = pair.partition(":")
        out.append((int(revision), {"rev": revision, "delta": data[start : int(end)].decode()}))
        start = int(end)
    last = str(job.record.events_trimmed or job.record.revision)
    fields = {"rev": last, "state": job.record.state.value}
    if start < len(data):  # text the offsets do not place
        fields["delta"] = data[start:].decode()
    calls = [c.shown() for c in job.record.calls if c.complete]
    if calls:
        fields["calls"] = json.dumps(calls)
    out.append((int(last), fields))
    yield out


async def replay(
    client: AsyncClient, job_id: str, *, after: int, state: str
) -> AsyncIterator[str | bytes]:
    """The body for a job whose events the janitor removed already (it ended a while ago:
    ``state``): one snapshot read of its own, the text after ``after`` and ``end``."""
    yield OPENING.decode()
    ended = False
    async for revision, fields in client.events(job_id, after=after):
        ended = ended or fields.get("state") in ENDING_STATES
        for frame in frames(revision, fields):
            yield frame
    if not ended:
        yield event("end", None, {"state": state})


async def follow(feed: Feed, *, after: int, keepalive_s: float) -> AsyncIterator[bytes]:
    """The stream's body: the job's events after revision ``after`` until it ends (or
    rests on the spill lane), with a comment every ``keepalive_s`` while nothing happens,
    and ``end`` last — also for a follower that had seen everything already. The events
    come from the job's feed, shared with every other follower here. A read that fails
    (Redis gone, the job purged) ends the stream without ``end``; the client reconnects
    from its last id."""
    yield OPENING  # the headers go out now, not with the first event
    index = feed.after(after)  # what the feed has read so far is skipped at once
    sent = False  # any of the job's events, on this connection
    while True:
        # Whatever has arrived goes out as one write.
        ready = [rendered for revision, rendered in feed.entries[index:] if revision > after]
        index = len(feed.entries)
        state = feed.state
        if state is not None and state[1] == SPILLED:
            # Resting on the spill lane: the follower is told so, and goes.
            ready.append(event("end", state[0], {"state": SPILLED}).encode())
            yield b"".join(ready)
            return
        if ready:
            sent = True
            yield b"".join(ready)
        if feed.done:
            if feed.error is not None:
                yield f": stopped: {type(feed.error).__name__}\n\n".encode()
            elif not sent and state is not None:
                # Everything was seen before this connection: still, the end.
                yield event("end", state[0], {"state": state[1]}).encode()
            return
        if not await feed.changed(keepalive_s):
            yield b": keep-alive\n\n"


class EventStream(StreamingResponse):
    """A streaming response that stops, and cancels its body, as soon as the client
    disconnects (Starlette does so only for servers older than ASGI 2.4); ``release``
    runs when it is over, however it ends."""

    media_type = "text/event-stream"

    def __init__(
        self,
        body: AsyncIterator[str | bytes],
        *,
        release: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(body, headers=HEADERS)
        self.release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:

                async def stream() -> None:
                    await self.stream_response(send)
                    group.cancel_scope.cancel()

                group.start_soon(stream)
                await self.listen_for_disconnect(receive)
                group.cancel_scope.cancel()
        finally:
            # A send blocked on a client that stopped reading is cancelled without the
            # body's own cleanup running: it is closed here, so its follower leaves now.
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                with anyio.CancelScope(shield=True):
                    await close()
            if self.release is not None:
                self.release()
