"""The asyncio producer API over a real redis-server: enqueue, get, wait, cancel, follow —
the same answers as the sync client, without ever holding up the event loop, and nothing
left open after close.

No asyncio plugin for pytest is a dependency: each test drives its coroutine with
``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import pytest
import redis

from resumeq import AsyncClient
from resumeq.core.errors import InvalidSpec, JobNotFound, StoreError
from resumeq.core.models import JobState
from resumeq.producer.client import Client, Delta, EventCursor, Job
from resumeq.queue.queueing import attempt_rq_id, rq_queue
from resumeq.store import Store, keys
from resumeq.testing import RedisServer

T = TypeVar("T")

SPEC = {"prompt": "Follow me.", "provider": "local", "model": "m", "budget_tokens": 500}
ATTEMPTS = [["The ", "quick "], ["brown ", "fox "], ["jumps ", "over."]]
TEXT = "".join(p for a in ATTEMPTS for p in a)
#: The longest the event loop may go without running a ready coroutine.
MAX_GAP_S = 0.25


@pytest.fixture
def url(redis_server: RedisServer, redis_client: redis.Redis) -> str:
    """The server's URL, its database flushed (``redis_client`` does that)."""
    return redis_server.url


def run(url: str, body: Callable[[AsyncClient], Awaitable[T]]) -> T:
    async def main() -> T:
        async with AsyncClient.from_url(url) as client:
            return await body(client)

    return asyncio.run(main())


def play_attempts(store: Store, job_id: str, attempts: list[list[str]], pause: float) -> None:
    """Play the owner: several attempts, each flushing some pieces, then done."""
    for n, pieces in enumerate(attempts):
        got = store.acquire(job_id, worker=f"w{n}", ttl_ms=5000)
        rev = got.record.revision
        for piece in pieces:
            time.sleep(pause)
            rev = store.flush(got.lease, expected_revision=rev, delta=piece, tokens=1).revision
        if n < len(attempts) - 1:
            store.release(got.lease, to="queued", reason="cut")
        else:
            store.finish(got.lease, state="done", finish_reason="stop")


def in_thread(fn: Callable[..., Any], *args: Any) -> threading.Thread:
    thread = threading.Thread(target=fn, args=args, daemon=True)
    thread.start()
    return thread


async def collect(client: AsyncClient, job_id: str, **kwargs: Any) -> list[Delta]:
    return [d async for d in client.follow(job_id, **kwargs)]


async def while_ticking(work: Coroutine[Any, Any, T], period: float = 0.01) -> tuple[T, float]:
    """Run ``work`` beside a coroutine that ticks every ``period``; answers its result and
    the longest gap between two ticks (a blocked loop shows up as a long gap)."""
    gaps: list[float] = []

    async def tick() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    try:
        result = await work
        ticks = len(gaps)
        while len(gaps) == ticks:  # the gap that ends when the work does counts too
            await asyncio.sleep(period)
    finally:
        ticker.cancel()
    return result, max(gaps)


def client_count(redis_client: redis.Redis) -> int:
    """Connections to the server, besides the one asking."""
    return len(redis_client.client_list()) - 1


@pytest.mark.timeout(20)
def test_enqueue_writes_the_record_and_the_first_attempt(url: str, real_store: Store) -> None:
    async def body(client: AsyncClient) -> tuple[str, Job, str, str]:
        job_id = await client.enqueue(SPEC)
        first = await client.enqueue({**SPEC, "idempotency_key": "k"})
        again = await client.enqueue({**SPEC, "idempotency_key": "k"})
        return job_id, await client.get(job_id), first, again

    job_id, job, first, again = run(url, body)
    assert job.state is JobState.QUEUED and job.text == "" and job.revision == 0
    assert rq_queue("resumeq", real_store.redis).fetch_job(attempt_rq_id(job_id, 1)) is not None
    assert first == again != job_id
    assert rq_queue("resumeq", real_store.redis).fetch_job(attempt_rq_id(first, 1)) is not None


@pytest.mark.timeout(20)
def test_enqueue_refuses_a_bad_spec_and_writes_nothing(url: str, real_store: Store) -> None:
    async def body(client: AsyncClient) -> None:
        with pytest.raises(InvalidSpec, match="budget_tokens"):
            await client.enqueue({**SPEC, "budget_tokens": 0})

    run(url, body)
    assert list(real_store.redis.scan_iter("*")) == []


@pytest.mark.timeout(20)
def test_get_matches_the_sync_client(url: str, real_store: Store) -> None:
    sync = Client(real_store.redis)
    job_id = sync.enqueue(SPEC)
    got = real_store.acquire(job_id, worker="w", ttl_ms=5000)
    real_store.flush(got.lease, expected_revision=got.record.revision, delta="half ", tokens=2)

    job = run(url, lambda client: client.get(job_id))
    assert job == sync.get(job_id)
    assert job.state is JobState.RUNNING and job.text == "half " and job.attempts == 1


@pytest.mark.timeout(20)
def test_follow_from_any_revision_yields_exactly_the_rest(url: str, real_store: Store) -> None:
    job_id = Client(real_store.redis).enqueue(SPEC)
    play_attempts(real_store, job_id, ATTEMPTS, 0)

    async def body(client: AsyncClient) -> list[tuple[list[Delta], list[Delta]]]:
        deltas = await collect(client, job_id)
        final = await client.get(job_id)
        rests = [(await collect(client, job_id, after=d.revision), deltas) for d in deltas]
        assert await collect(client, job_id, after=final.revision) == []
        assert final.text == TEXT and final.attempts == len(ATTEMPTS)
        return [([], deltas), *rests]

    (_, deltas), *rests = run(url, body)
    assert "".join(d.text for d in deltas) == TEXT
    assert [d.revision for d in deltas] == sorted({d.revision for d in deltas})
    for i, (rest, _) in enumerate(rests):
        assert rest == deltas[i + 1 :]
    sync = list(Client(real_store.redis).follow(job_id))
    assert deltas == sync


@pytest.mark.timeout(30)
def test_follow_while_attempts_are_written_without_blocking_the_loop(
    url: str, real_store: Store
) -> None:
    """Followers from revision 0 and from the middle of the second attempt, while the
    attempts are written; the loop goes on ticking all along."""
    job_id = Client(real_store.redis).enqueue(SPEC)

    async def body(client: AsyncClient) -> tuple[list[Delta], list[Delta], int, float]:
        writer = in_thread(play_attempts, real_store, job_id, ATTEMPTS, 0.15)
        from_start = asyncio.create_task(collect(client, job_id, timeout=20))
        while "brown " not in (job := await client.get(job_id)).text:
            await asyncio.sleep(0.01)
        middle, gap = await while_ticking(collect(client, job_id, after=job.revision, timeout=20))
        writer.join(timeout=20)
        return await from_start, middle, job.revision, gap

    from_start, middle, revision, gap = run(url, body)
    assert "".join(d.text for d in from_start) == TEXT
    cut = next(i for i, d in enumerate(from_start) if d.revision > revision)
    assert middle == from_start[cut:]
    assert "".join(d.text for d in from_start[:cut]).endswith("brown ")
    assert gap < MAX_GAP_S


@pytest.mark.timeout(20)
def test_wait_returns_at_the_end_without_blocking_the_loop(url: str, real_store: Store) -> None:
    job_id = Client(real_store.redis).enqueue(SPEC)

    async def body(client: AsyncClient) -> tuple[Job, float]:
        writer = in_thread(play_attempts, real_store, job_id, ATTEMPTS, 0.2)
        job, gap = await while_ticking(client.wait(job_id, timeout=10))
        writer.join(timeout=10)
        return job, gap

    job, gap = run(url, body)
    assert job.state is JobState.DONE and job.ended and job.text == TEXT
    assert gap < MAX_GAP_S


@pytest.mark.timeout(20)
def test_wait_times_out_without_blocking_the_loop(url: str) -> None:
    async def body(client: AsyncClient) -> tuple[float, float]:
        job_id = await client.enqueue(SPEC)
        start = time.monotonic()

        async def wait() -> float:
            with pytest.raises(TimeoutError):
                await client.wait(job_id, timeout=1.5)  # more than one blocking read
            return time.monotonic() - start

        return await while_ticking(wait())

    took, gap = run(url, body)
    assert 1.4 < took < 3
    assert gap < MAX_GAP_S


@pytest.mark.timeout(10)
def test_the_ticker_notices_a_blocked_loop() -> None:
    async def blocking() -> None:
        await asyncio.sleep(0.05)
        time.sleep(0.5)

    _, gap = asyncio.run(while_ticking(blocking()))
    assert gap >= 0.4


@pytest.mark.timeout(20)
def test_wait_returns_at_a_spill(url: str, real_store: Store) -> None:
    async def body(client: AsyncClient) -> Job:
        job_id = await client.enqueue(SPEC)
        got = real_store.acquire(job_id, worker="w", ttl_ms=5000)
        waiter = asyncio.create_task(client.wait(job_id, timeout=5))
        await asyncio.sleep(0.2)
        assert not waiter.done()
        await asyncio.to_thread(real_store.release, got.lease, to="spilled", reason="below floor")
        job = await waiter
        assert await client.wait(job_id, timeout=0.1) == job  # already resting
        return job

    job = run(url, body)
    assert job.state is JobState.SPILLED and not job.ended and job.reason == "below floor"


@pytest.mark.timeout(20)
def test_cancel_ends_the_job_and_wakes_a_waiter_and_a_follower(url: str) -> None:
    async def body(client: AsyncClient) -> tuple[Job, Job, list[Delta]]:
        job_id = await client.enqueue(SPEC)
        waiter = asyncio.create_task(client.wait(job_id, timeout=5))
        follower = asyncio.create_task(collect(client, job_id, timeout=5))
        await asyncio.sleep(0.2)
        cancelled = await client.cancel(job_id, reason="user left")
        return cancelled, await waiter, await follower

    cancelled, waited, deltas = run(url, body)
    assert cancelled.state is JobState.CANCELLED and cancelled.reason == "user left"
    assert waited == cancelled and deltas == []


@pytest.mark.timeout(20)
def test_an_unknown_job_is_not_found_everywhere(url: str) -> None:
    async def body(client: AsyncClient) -> None:
        with pytest.raises(JobNotFound):
            await client.get("no-such-job")
        with pytest.raises(JobNotFound):
            await client.wait("no-such-job", timeout=1)
        with pytest.raises(JobNotFound):
            await collect(client, "no-such-job", timeout=1)
        with pytest.raises(JobNotFound):
            await client.cancel("no-such-job")

    run(url, body)


@pytest.mark.timeout(20)
def test_a_job_that_expires_ends_the_follow(url: str, real_store: Store) -> None:
    async def body(client: AsyncClient) -> None:
        job_id = await client.enqueue(SPEC)
        expire = threading.Timer(0.2, real_store.redis.delete, args=(keys.job(job_id),))
        expire.start()
        with pytest.raises(JobNotFound):
            await collect(client, job_id, timeout=5)
        expire.join(timeout=5)  # done with the fixture's connection before it closes

    run(url, body)


@pytest.mark.timeout(20)
def test_follow_times_out(url: str) -> None:
    async def body(client: AsyncClient) -> None:
        job_id = await client.enqueue(SPEC)
        with pytest.raises(TimeoutError):
            await collect(client, job_id, timeout=0.3)

    run(url, body)


@pytest.mark.timeout(30)
def test_close_leaves_no_thread_and_no_connection(url: str, redis_client: redis.Redis) -> None:
    """After writes, a follower cancelled in the middle of a blocking read and a write
    under way at close, ``aclose`` leaves no thread and no connection behind."""
    threads = threading.active_count()
    connections = client_count(redis_client)

    async def main() -> None:
        client = AsyncClient.from_url(url)
        job_id = await client.enqueue(SPEC)
        follower = asyncio.create_task(collect(client, job_id))
        await asyncio.sleep(0.3)  # blocked in XREAD now
        follower.cancel()
        with pytest.raises(asyncio.CancelledError):
            await follower
        assert client_count(redis_client) > connections
        assert any(t.name.startswith("resumeq-write") for t in threading.enumerate())
        under_way = asyncio.create_task(client.enqueue(SPEC))
        await asyncio.sleep(0)  # the write is submitted
        await client.aclose()
        assert redis_client.exists(keys.job(await under_way))  # it ran to its end
        assert not any(t.name.startswith("resumeq-write") for t in threading.enumerate())
        await client.aclose()  # harmless
        with pytest.raises(RuntimeError, match="closed"):
            await client.enqueue(SPEC)

        async with AsyncClient.from_url(url) as other:
            await other.cancel(job_id)
            await other.wait(job_id, timeout=1)

    asyncio.run(main())
    assert threading.active_count() == threads
    deadline = time.monotonic() + 5
    while client_count(redis_client) > connections and time.monotonic() < deadline:
        time.sleep(0.02)
    assert client_count(redis_client) == connections


@pytest.mark.timeout(10)
def test_from_url_never_re_sends_and_refuses_a_bad_url(url: str) -> None:
    client = AsyncClient.from_url(url)
    try:
        for connection in (client.redis, client.writer.redis):
            retry = connection.get_retry()
            assert retry is not None and retry.get_retries() == 0
    finally:
        asyncio.run(client.aclose())
    with pytest.raises(StoreError, match="invalid Redis URL"):
        AsyncClient.from_url("nosuchscheme://x")


# -- the shared cursor, without Redis --------------------------------------------------------


def reply(*events: dict[str, str]) -> list[Any]:
    """An XREAD reply (bytes, as a bytes-mode client answers) with one entry per event."""
    entries = [
        (f"1-{n}".encode(), {k.encode(): v.encode() for k, v in e.items()})
        for n, e in enumerate(events)
    ]
    return [[b"events", entries]]


@pytest.mark.timeout(5)
def test_the_cursor_skips_what_was_seen_and_stops_at_the_end() -> None:
    cursor = EventCursor("j", after=1, deadline=None, stop_at_spill=False)
    taken = cursor.take(
        reply(
            {"rev": "1", "delta": "seen "},
            {"rev": "2", "delta": "new "},
            {"rev": "3", "state": "spilled"},  # a follower goes on after a spill
            {"rev": "4", "state": "done"},
            {"rev": "5", "delta": "never"},
        )
    )
    assert [r for r, _ in taken] == [2, 3, 4] and cursor.ended
    assert list(cursor.streams.values()) == ["1-3"]
    waiter = EventCursor("j", after=0, deadline=None, stop_at_spill=True)
    assert [r for r, _ in waiter.take(reply({"rev": "1", "state": "spilled"}))] == [1]
    assert waiter.ended


@pytest.mark.timeout(5)
def test_the_cursor_bounds_each_read_by_the_deadline() -> None:
    cursor = EventCursor("j", after=0, deadline=10.0, stop_at_spill=True)
    assert cursor.block_ms(now=0.0) == 1000
    assert cursor.block_ms(now=9.75) == 250
    with pytest.raises(TimeoutError):
        cursor.block_ms(now=10.0)
    assert EventCursor("j", after=0, deadline=None, stop_at_spill=True).block_ms(now=1e9) == 1000
