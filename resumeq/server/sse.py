"""A job's durable text as Server-Sent Events.

``id:`` is the revision; ``event: delta`` carries ``{"text", "revision"}``, ``event: state``
``{"state"}`` on every state change, and ``event: end`` ``{"state"}`` at a terminal state or
a spill, after which the stream closes. A client that reconnects with ``Last-Event-ID`` (or
``?after=``) gets exactly the text it has not seen: the revisions and the events are the
ones :class:`~resumeq.client.EventCursor` reads for ``Client.follow``.

Followers of one job share one reader per process (:class:`Hub`): a thousand followers
of a job cost one blocking read of Redis, not a thousand. The response listens for the
client's disconnect itself, whatever ASGI version the server speaks; the follower leaves
the hub at once, and the job's reader stops with its last follower: nothing is left
running after followers go away.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from resumeq.async_client import AsyncClient
from resumeq.models import JobState

#: States after which nothing more happens to a job; a spill waits for a person (a follower
#: is told ``end`` while it is the job's latest state, and a requeue goes on from there).
ENDING_STATES = frozenset(s.value for s in JobState if s.terminal)
SPILLED = JobState.SPILLED.value

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
    state = fields.get("state")
    if state:
        out.append(event("state", revision, {"state": state}))
        if state in ENDING_STATES:
            out.append(event("end", revision, {"state": state}))
    return out


class Feed:
    """One job's events, read once for every follower of the job in this process: one
    reader, from the job's first revision, keeping what it read (a job's events are its
    text in pieces: bounded by the job), waking the followers as each arrives."""

    def __init__(self, client: AsyncClient, job_id: str) -> None:
        self.job_id = job_id
        self.entries: list[tuple[int, bytes]] = []  # each entry's revision and SSE frames
        self.revisions: list[int] = []
        self.done = False
        self.error: BaseException | None = None
        #: The job's latest state read, with its revision.
        self.state: tuple[int, str] | None = None
        self.followers = 0
        self._wake = asyncio.Event()
        self._reader = asyncio.create_task(self._read(client), name=f"resumeq-feed:{job_id}")

    async def _read(self, client: AsyncClient) -> None:
        try:
            async for revision, fields in client.events(self.job_id, after=0, stop_at_spill=False):
                # Rendered once for every follower.
                self.entries.append((revision, "".join(frames(revision, fields)).encode()))
                self.revisions.append(revision)
                if fields.get("state"):
                    self.state = (revision, fields["state"])
                self._notify()
        except Exception as exc:  # the followers' streams end; their clients reconnect
            self.error = exc
        finally:
            self.done = True
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

    async def close(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


class Hub:
    """The feeds of this process, one per followed job, gone with their last follower."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self.feeds: dict[str, Feed] = {}
        self.followers = 0

    def join(self, job_id: str) -> Feed:
        feed = self.feeds.get(job_id)
        if feed is None or feed.done:  # a job requeued after its spill: read it afresh
            feed = self.feeds[job_id] = Feed(self.client, job_id)
        feed.followers += 1
        self.followers += 1
        return feed

    async def leave(self, feed: Feed) -> None:
        feed.followers -= 1
        self.followers -= 1
        if feed.followers == 0:
            if self.feeds.get(feed.job_id) is feed:
                del self.feeds[feed.job_id]
            await feed.close()

    async def close(self) -> None:
        for feed in list(self.feeds.values()):
            await feed.close()
        self.feeds.clear()


async def follow(
    hub: Hub, job_id: str, *, after: int, keepalive_s: float, trimmed: str | None
) -> AsyncIterator[str | bytes]:
    """The stream's body: the job's events after revision ``after`` until it ends (or
    rests on the spill lane), with a comment every ``keepalive_s`` while nothing happens,
    and ``end`` last — also for a follower that had seen everything already. A live job's
    events come from its feed, shared with every other follower here; a job whose events
    the janitor removed already (``trimmed``: its state) is one snapshot read of its own. A
    read that fails (Redis gone, the job purged) ends the stream without ``end``; the client
    reconnects from its last id."""
    yield ": following\n\n"  # the headers go out now, not with the first event
    if trimmed is not None:
        ended = False
        async for revision, fields in hub.client.events(job_id, after=after):
            ended = ended or fields.get("state") in ENDING_STATES
            for frame in frames(revision, fields):
                yield frame
        if not ended:
            yield event("end", None, {"state": trimmed})
        return
    feed = hub.join(job_id)
    try:
        async for chunk in _from_feed(feed, after, keepalive_s):
            yield chunk
    finally:
        await hub.leave(feed)


async def _from_feed(feed: Feed, after: int, keepalive_s: float) -> AsyncIterator[bytes]:
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
    disconnects (Starlette does so only for servers older than ASGI 2.4)."""

    media_type = "text/event-stream"

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
