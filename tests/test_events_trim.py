"""An ended job's events stream, trimmed to its terminal entry once the grace has passed:
the text is kept once, and a follower that comes later — from the start, after any
revision, or in the middle of reading when the trim happens — still reads exactly the text
it has not seen, from the sync and the async client alike."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis

from resumeq import AsyncClient
from resumeq.core.errors import StoreError
from resumeq.core.settings import ConfigFile, Settings, StoreSettings
from resumeq.janitor.sweep import Janitor
from resumeq.producer import ops
from resumeq.producer.client import Client, EventCursor
from resumeq.store import PACKED_TEXT, Store, decode_text, keys, pack_text
from resumeq.testing import RedisServer
from resumeq.worker.context import build_context

SPEC = {"prompt": "Trim me.", "provider": "local", "model": "m", "budget_tokens": 500}
#: Two attempts (a cut between), multi-byte text, a piece that is one emoji.
ATTEMPTS = [["| a | b |\n", "|---|---|\n", "| ü | 表 |\n"], ["🙂", "\n```py\nx = 1\n```", " done."]]
TEXT = "".join(p for a in ATTEMPTS for p in a)


def finished_job(store: Store) -> str:
    job_id = store.create(SPEC).id
    for n, pieces in enumerate(ATTEMPTS):
        got = store.acquire(job_id, worker=f"w{n}", ttl_ms=5000)
        rev = got.record.revision
        for piece in pieces:
            rev = store.flush(got.lease, expected_revision=rev, delta=piece, tokens=1).revision
        if n < len(ATTEMPTS) - 1:
            store.release(got.lease, to="queued", reason="cut")
        else:
            store.finish(got.lease, state="done", finish_reason="stop")
    return job_id


def revisions_of(client: redis.Redis, job_id: str) -> list[int]:
    return [int(f[b"rev"]) for _, f in client.xrange(keys.events(job_id))]


@pytest.fixture
def client(real_store: Store) -> Iterator[Client]:
    yield Client(real_store.redis)


def test_trim_removes_the_stream_and_keeps_where_each_delta_ended(
    real_store: Store, redis_client: redis.Redis
) -> None:
    job_id = finished_job(real_store)
    last = real_store.get(job_id).revision
    assert revisions_of(redis_client, job_id) == list(range(1, last + 1))
    text_ttl = redis_client.ttl(keys.text(job_id))
    padded = redis_client.memory_usage(keys.text(job_id), samples=0)
    assert real_store.trim_events(job_id) == last
    assert redis_client.exists(keys.events(job_id)) == 0
    record = real_store.get(job_id)
    assert record.events_trimmed == last
    assert record.text_bytes_after(0) == 0
    assert record.text_bytes_after(last) == len(TEXT.encode())
    first_delta = len(ATTEMPTS[0][0].encode())
    assert record.text_bytes_after(2) == first_delta  # revision 2: the first flush
    # what only a running job needs is gone; the text is the same, at its exact size
    assert redis_client.hget(keys.job(job_id), "lease_token") is None
    assert real_store.text(job_id) == TEXT
    assert 0 < redis_client.ttl(keys.text(job_id)) <= text_ttl
    assert redis_client.memory_usage(keys.text(job_id), samples=0) <= padded
    assert real_store.trim_events(job_id) == 0  # once is enough
    assert redis_client.zscore(keys.ENDED, job_id) is None
    assert ops.status_dict(real_store, job_id)["text"] == TEXT
    assert real_store.purge(job_id) > 0
    assert redis_client.keys(f"*{job_id}*") == []


def test_only_ended_jobs_are_trimmed(real_store: Store, redis_client: redis.Redis) -> None:
    job_id = real_store.create(SPEC).id
    got = real_store.acquire(job_id, worker="w", ttl_ms=5000)
    real_store.flush(got.lease, expected_revision=1, delta="still going", tokens=1)
    redis_client.zadd(keys.ENDED, {job_id: 1})  # a stray index entry
    assert real_store.trim_events(job_id) == 0
    assert revisions_of(redis_client, job_id) == [1, 2]
    assert redis_client.zscore(keys.ENDED, job_id) is None
    assert real_store.trim_events("no-such-job") == 0


def test_ended_jobs_wait_out_the_grace(real_store: Store) -> None:
    job_id = finished_job(real_store)
    assert real_store.ended_before(60_000) == []
    assert real_store.ended_before(0) == [job_id]


def test_a_late_follower_reads_exactly_the_rest_after_any_revision(
    real_store: Store, client: Client
) -> None:
    job_id = finished_job(real_store)
    last = real_store.get(job_id).revision
    untrimmed = {after: "".join(d.text for d in client.follow(job_id, after=after, timeout=5))
                 for after in range(last + 1)}  # fmt: skip
    assert untrimmed[0] == TEXT
    real_store.trim_events(job_id)
    for after in range(last + 1):
        deltas = list(client.follow(job_id, after=after, timeout=5))
        assert "".join(d.text for d in deltas) == untrimmed[after], after
        for d in deltas:  # resuming after any delta's revision goes on without a repeat
            rest = "".join(x.text for x in client.follow(job_id, after=d.revision, timeout=5))
            assert untrimmed[after].endswith(rest)
    assert client.wait(job_id, timeout=5).text == TEXT


def test_a_trim_while_a_follower_reads_loses_nothing(
    real_store: Store, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = finished_job(real_store)
    monkeypatch.setattr(EventCursor, "count", 1)  # one entry per read
    follow = client.follow(job_id, timeout=5)
    first = next(follow)
    real_store.trim_events(job_id)
    assert first.text + "".join(d.text for d in follow) == TEXT


def test_the_async_client_reads_a_trimmed_stream(
    redis_server: RedisServer, real_store: Store
) -> None:
    job_id = finished_job(real_store)
    real_store.trim_events(job_id)
    middle = real_store.get(job_id).revision // 2

    async def main() -> tuple[str, str]:
        async with AsyncClient.from_url(redis_server.url) as aclient:
            whole = "".join([d.text async for d in aclient.follow(job_id, timeout=5)])
            rest = "".join([d.text async for d in aclient.follow(job_id, after=middle, timeout=5)])
            return whole, rest

    whole, rest = asyncio.run(main())
    assert whole == TEXT
    sync_rest = "".join(d.text for d in Client(real_store.redis).follow(job_id, after=middle))
    assert rest == sync_rest and TEXT.endswith(rest) and rest


def test_a_hole_no_trim_explains_is_an_error(
    real_store: Store, client: Client, redis_client: redis.Redis
) -> None:
    job_id = finished_job(real_store)
    first_id = redis_client.xrange(keys.events(job_id), count=1)[0][0]
    redis_client.xdel(keys.events(job_id), first_id)  # not the janitor's doing
    with pytest.raises(StoreError, match="lacks revisions after 0 and was never trimmed"):
        list(client.follow(job_id, timeout=5))


def test_the_janitor_trims_once_the_grace_has_passed(
    redis_server: RedisServer, real_store: Store, redis_client: redis.Redis
) -> None:
    def janitor(grace_s: float) -> Janitor:
        file = ConfigFile(store=StoreSettings(events_grace_s=grace_s))
        return Janitor(build_context(Settings(redis_url=redis_server.url, file=file)))

    job_id = finished_job(real_store)
    entries = redis_client.xlen(keys.events(job_id))
    assert janitor(60).sweep().trimmed == []
    assert redis_client.xlen(keys.events(job_id)) == entries
    assert janitor(0).sweep().trimmed == [job_id]
    assert redis_client.exists(keys.events(job_id)) == 0
    assert redis_client.zcard(keys.ENDED) == 0
    follower = Client(real_store.redis)
    assert "".join(d.text for d in follower.follow(job_id, timeout=5)) == TEXT


def test_a_long_text_is_kept_compressed_and_reads_back_exactly(
    redis_server: RedisServer, real_store: Store, redis_client: redis.Redis
) -> None:
    rows = [f"| {n} | {'ü' * (n % 5)} | 表 {n * n} |\n" for n in range(200)]  # ~5 KB, a table
    job_id = real_store.create(SPEC).id
    got = real_store.acquire(job_id, worker="w", ttl_ms=5000)
    rev = got.record.revision
    for k in range(0, len(rows), 20):
        rev = real_store.flush(got.lease, expected_revision=rev, delta="".join(rows[k : k + 20]),
                               tokens=20).revision  # fmt: skip
    real_store.finish(got.lease, state="done", finish_reason="stop")
    text = "".join(rows)
    middle = rev - 4
    expected_rest = "".join(d.text for d in Client(real_store.redis).follow(job_id, after=middle))
    real_store.trim_events(job_id)
    stored = redis_client.get(keys.text(job_id))
    assert stored is not None and stored.startswith(PACKED_TEXT)
    assert len(stored) < len(text.encode()) // 3
    assert real_store.text(job_id) == text and Client(real_store.redis).get(job_id).text == text
    rest = "".join(d.text for d in Client(real_store.redis).follow(job_id, after=middle))
    assert rest == expected_rest and text.endswith(rest)

    async def read() -> str:
        async with AsyncClient.from_url(redis_server.url) as aclient:
            return (await aclient.get(job_id)).text

    assert asyncio.run(read()) == text


def test_packing_only_what_it_makes_smaller() -> None:
    assert pack_text(b"") is None and pack_text(b"short") is None
    assert pack_text(PACKED_TEXT + b"x" * 100) is None  # packed already
    packed = pack_text(("na" * 500).encode())
    assert packed is not None and decode_text(packed) == "na" * 500
    assert decode_text("plain ✓".encode()) == "plain ✓" and decode_text(None) == ""
