"""The producer API for asyncio apps (FastAPI and the like): :class:`AsyncClient`, the
operations of :class:`~resumeq.producer.client.Client` as coroutines, ``follow`` an async iterator.

Reads — ``get`` and the blocking reads of the events stream behind ``follow`` and ``wait``
— go through ``redis.asyncio``: a follower never holds up the event loop. The two writes —
``enqueue`` (the create script, then the outbox: attempt 1's RQ job) and ``cancel`` — run
the synchronous client's own code in a worker thread, on a connection of its own: the same
request ids, the same re-sends when Redis does not answer, the outbox carried out. What a
snapshot holds, which events a follower sees and when it stops are decided by the pure
helpers of :mod:`resumeq.producer.client`, which both clients call.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import aclosing
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

import redis
import redis.asyncio

from resumeq.core.errors import RedisUnavailable
from resumeq.core.models import JobRecord
from resumeq.core.settings import StoreSettings
from resumeq.core.spec import JobSpec, Limits
from resumeq.producer.client import (
    CANCEL_REASON,
    Client,
    Delta,
    EventCursor,
    Job,
    delta_of,
    is_resting,
    record_of,
)
from resumeq.store import DEFAULT_QUEUE, RETRY_PAUSE_S, Store, decode_text, keys, redis_errors
from resumeq.store.connection import connect_async

P = ParamSpec("P")
R = TypeVar("R")

#: Worker threads for writes: each holds one connection of the write pool while it runs.
WRITE_THREADS = 4


class AsyncClient:
    """A producer's handle on resumeq for asyncio code.

    It owns an asyncio connection (reads), a synchronous one (writes) and the threads
    the writes run in; :meth:`aclose` (or leaving ``async with``) waits for writes under
    way, then closes all of them.
    """

    def __init__(
        self,
        connection: redis.asyncio.Redis,
        write_connection: redis.Redis,
        *,
        settings: StoreSettings | None = None,
        limits: Limits | None = None,
        write_threads: int = WRITE_THREADS,
    ) -> None:
        self.redis = connection
        #: The synchronous client whose ``enqueue`` and ``cancel`` the writes run.
        self.writer = Client(write_connection, settings=settings, limits=limits)
        self._threads = ThreadPoolExecutor(write_threads, thread_name_prefix="resumeq-write")
        self._writes: set[Future[Any]] = set()
        self._closed = False

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        max_connections: int | None = None,
        socket_timeout: float | None = None,
        socket_connect_timeout: float | None = None,
        **kwargs: Any,
    ) -> AsyncClient:
        """Both connections for ``url``, neither re-sending a command by itself
        (:mod:`resumeq.store.connection`); nothing connects until the first command.
        ``max_connections`` bounds the asyncio pool (redis-py's default: 100): each
        follower blocked in a read holds one connection; the timeouts apply to it too
        (a read blocks for up to a second: keep ``socket_timeout`` above that)."""
        store = Store.from_url(url)  # StoreError for a URL redis-py cannot read
        given = {
            "max_connections": max_connections,
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": socket_connect_timeout,
        }
        options = {k: v for k, v in given.items() if v is not None}
        return cls(connect_async(url, **options), store.redis, **kwargs)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Refuse new writes, wait for those under way, then close the threads and both
        connections. Closing twice is harmless."""
        if self._closed:
            return
        self._closed = True
        self._threads.shutdown(wait=False)  # each thread exits once its write returns
        under_way = [asyncio.wrap_future(f) for f in list(self._writes)]
        if under_way:
            await asyncio.wait(under_way)
        self._threads.shutdown(wait=True)  # their writes returned: this joins at once
        self.writer.redis.close()
        await self.redis.aclose()

    # -- writes: the synchronous client's, in a worker thread ----------------------------

    async def enqueue(
        self, spec: JobSpec | Mapping[str, Any], *, queue: str = DEFAULT_QUEUE
    ) -> str:
        """As :meth:`Client.enqueue <resumeq.producer.client.Client.enqueue>`: the job id; the same
        id again for the same idempotency key; :class:`~resumeq.core.errors.InvalidSpec`, with
        nothing written, for a refused spec."""
        return await self._write(self.writer.enqueue, spec, queue=queue)

    async def cancel(self, job_id: str, *, reason: str = CANCEL_REASON) -> Job:
        """As :meth:`Client.cancel <resumeq.producer.client.Client.cancel>`: a job that had ended is
        answered as it ended."""
        return await self._write(self.writer.cancel, job_id, reason=reason)

    async def _write(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Run a write in a worker thread. Cancelling the caller does not cut it short: a
        write that started runs to its end (with its re-sends), one that had not is not
        sent."""
        if self._closed:
            raise RuntimeError("AsyncClient is closed")
        future = self._threads.submit(fn, *args, **kwargs)
        self._writes.add(future)
        future.add_done_callback(self._writes.discard)
        return await asyncio.wrap_future(future)

    # -- reads: redis.asyncio -----------------------------------------------------------

    async def get(self, job_id: str) -> Job:
        """As :meth:`Client.get <resumeq.producer.client.Client.get>`: the job as of one revision,
        its text exactly the text up to it (read in one transaction)."""

        async def both(r: redis.asyncio.Redis) -> list[Any]:
            async with r.pipeline(transaction=True) as pipe:
                pipe.hgetall(keys.job(job_id))
                pipe.get(keys.text(job_id))
                return await pipe.execute()

        fields, raw = await self._read("snapshot", both)
        return Job.from_snapshot(record_of(job_id, fields), decode_text(raw))

    async def wait(self, job_id: str, timeout: float) -> Job:
        """Wait until the job ends (or spills: it then waits for a person); raise
        ``TimeoutError`` after ``timeout`` seconds."""
        record = await self.record(job_id)
        if not is_resting(record):
            deadline = time.monotonic() + timeout
            async with aclosing(
                self._entries(job_id, after=record.revision, deadline=deadline)
            ) as entries:
                async for _ in entries:
                    pass  # the entries end at a resting state
        return await self.get(job_id)

    async def follow(
        self, job_id: str, *, after: int = 0, timeout: float | None = None
    ) -> AsyncGenerator[Delta, None]:
        """As :meth:`Client.follow <resumeq.producer.client.Client.follow>`: the durable text deltas
        after revision ``after``, one continuous text across attempts, until the job ends.
        ``timeout`` bounds the whole follow (``TimeoutError``);
        :class:`~resumeq.core.errors.JobNotFound` for an unknown job."""
        deadline = None if timeout is None else time.monotonic() + timeout
        entries = self._entries(job_id, after=after, deadline=deadline, stop_at_spill=False)
        async with aclosing(entries):
            async for revision, fields in entries:
                delta = delta_of(revision, fields)
                if delta is not None:
                    yield delta

    async def events(
        self, job_id: str, *, after: int = 0, stop_at_spill: bool = True
    ) -> AsyncGenerator[tuple[int, dict[str, str]], None]:
        """The job's events after revision ``after`` — ``(revision, fields)``: ``delta``
        for text, ``state`` for a state change — blocking for more, until the job ends (or
        spills, with ``stop_at_spill``); what the HTTP service's event streams send.
        :class:`~resumeq.core.errors.JobNotFound` for an unknown job."""
        entries = self._entries(job_id, after=after, deadline=None, stop_at_spill=stop_at_spill)
        async with aclosing(entries):
            async for entry in entries:
                yield entry

    async def _entries(
        self,
        job_id: str,
        *,
        after: int,
        deadline: float | None,
        stop_at_spill: bool = True,
    ) -> AsyncGenerator[tuple[int, dict[str, str]], None]:
        """Events after revision ``after``, blocking (without blocking the loop) for more,
        until a resting state."""
        cursor = EventCursor(job_id, after=after, deadline=deadline, stop_at_spill=stop_at_spill)
        cursor.start(await self.record(job_id))  # JobNotFound for an unknown job
        while not cursor.ended:
            if cursor.gap:
                job = await self.get(job_id)
                for entry in cursor.fill(job.record, job.text):
                    yield entry
                continue
            block = cursor.block_ms(time.monotonic())
            with redis_errors("follow"):
                reply: Any = await self.redis.xread(cursor.streams, count=cursor.count, block=block)
                if not reply:
                    cursor.idle(await self.redis.hmget(cursor.job_key, cursor.probe))
            for entry in cursor.take(reply):
                yield entry

    async def record(self, job_id: str) -> JobRecord:
        """The job's record alone (no text); :class:`~resumeq.core.errors.JobNotFound` for an
        unknown job."""

        async def fields(r: redis.asyncio.Redis) -> Any:
            return await r.hgetall(keys.job(job_id))

        return record_of(job_id, await self._read("get", fields))

    async def _read(self, op: str, fn: Callable[[redis.asyncio.Redis], Awaitable[R]]) -> R:
        """A read (idempotent), tried again once if Redis does not answer — as the store's."""
        for left in (1, 0):
            try:
                with redis_errors(op):
                    return await fn(self.redis)
            except RedisUnavailable:
                if not left:
                    raise
                await asyncio.sleep(RETRY_PAUSE_S)
        raise AssertionError("unreachable")
