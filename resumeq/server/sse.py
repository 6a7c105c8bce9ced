"""A job's durable text as Server-Sent Events.

``id:`` is the revision; ``event: delta`` carries ``{"text", "revision"}``, ``event: state``
``{"state"}`` on every state change, and ``event: end`` ``{"state"}`` at a terminal state or
a spill, after which the stream closes. A client that reconnects with ``Last-Event-ID`` (or
``?after=``) gets exactly the text it has not seen: the revisions and the events are the
ones :class:`~resumeq.client.EventCursor` reads for ``Client.follow``.

A follower costs one task that reads the job's events while it is connected. The response
listens for the client's disconnect itself, whatever ASGI version the server speaks, and
the reader is cancelled with it: nothing is left running after a follower goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from resumeq.async_client import AsyncClient
from resumeq.client import RESTING_STATES

#: What proxies must not do to an event stream: buffer it (nginx), cache it, transform it.
HEADERS = {
    "Cache-Control": "no-cache, no-transform",
    "X-Accel-Buffering": "no",
    "Connection": "keep-alive",
}
#: How many events a slow follower may have waiting before its reader waits too.
BUFFER = 256


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
        if state in RESTING_STATES:
            out.append(event("end", revision, {"state": state}))
    return out


async def follow(
    client: AsyncClient, job_id: str, *, after: int, keepalive_s: float
) -> AsyncIterator[str]:
    """The stream's body: events after revision ``after`` until the job rests, with a
    comment every ``keepalive_s`` while nothing happens. A read that fails (Redis gone,
    the job purged) ends the stream; the client reconnects from its last id."""
    queue: asyncio.Queue[tuple[int, dict[str, str]] | BaseException | None] = asyncio.Queue(BUFFER)

    async def read() -> None:
        try:
            async for entry in client.events(job_id, after=after):
                await queue.put(entry)
            await queue.put(None)
        except Exception as exc:  # ends the stream; the client reconnects
            await queue.put(exc)

    reader = asyncio.create_task(read(), name=f"resumeq-sse:{job_id}")
    try:
        yield ": following\n\n"  # the headers go out now, not with the first event
        while True:
            try:
                item = await asyncio.wait_for(queue.get(), keepalive_s)
            except TimeoutError:
                yield ": keep-alive\n\n"
                continue
            if item is None:
                return
            if isinstance(item, BaseException):
                yield f": stopped: {type(item).__name__}\n\n"
                return
            revision, fields = item
            for frame in frames(revision, fields):
                yield frame
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader


class EventStream(StreamingResponse):
    """A streaming response that stops, and cancels its body, as soon as the client
    disconnects (Starlette does so only for servers older than ASGI 2.4)."""

    media_type = "text/event-stream"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as group:

            async def stream() -> None:
                await self.stream_response(send)
                group.cancel_scope.cancel()

            group.start_soon(stream)
            await self.listen_for_disconnect(receive)
            group.cancel_scope.cancel()
