"""Around a commit: a finish reason is a finished answer, text that is not valid Unicode
is a named cut, a half-moved scheduled attempt is repaired, a read is one snapshot, an
idempotency key lives as long as its job, and a purged job or a read-only replica stops
an attempt cleanly. A real redis-server; providers answered by hand where a real one
misbehaves."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import redis
from rq.registry import ScheduledJobRegistry
from worker_support import attempt_runner, run_to_rest

from resumeq.core.continuation import plan_request
from resumeq.core.errors import JobNotFound, MalformedChunk, RedisUnavailable
from resumeq.core.models import JobState
from resumeq.core.settings import (
    ConfigFile,
    ProviderProfile,
    Settings,
    StoreSettings,
    WorkerSettings,
)
from resumeq.core.spec import parse_spec
from resumeq.janitor.sweep import Janitor
from resumeq.producer.client import Client
from resumeq.providers import TextDelta, make_client
from resumeq.queue.queueing import (
    attempt_pending,
    attempt_rq_id,
    enqueue_attempt,
    enqueue_overdue,
    rq_queue,
)
from resumeq.store import Store, keys, redis_errors
from resumeq.testing import RedisServer
from resumeq.worker.context import build_context

pytestmark = pytest.mark.timeout(60)

SPEC = {"prompt": "p", "provider": "p", "model": "m", "budget_tokens": 500}


def sse(*events: str) -> Callable[[httpx.Request], httpx.Response]:
    body = "".join(f"data: {e}\n\n" for e in events).encode()

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    return handler


def delta(text: str, finish: str | None = None) -> str:
    choice = {"index": 0, "delta": {"content": text} if text else {}, "finish_reason": finish}
    return json.dumps({"choices": [choice]})


def profile() -> dict[str, Any]:
    return {"kind": "openai", "base_url": "http://engine.invalid/v1", "stall_timeout_s": 5}


def run_with(handler: Callable[[httpx.Request], httpx.Response], server: RedisServer,
             store: Store) -> tuple[str, int]:  # fmt: skip
    calls = []

    def counted(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return handler(request)

    job_id = store.create(SPEC).id
    http = httpx.Client(transport=httpx.MockTransport(counted))
    with attempt_runner(server.url, {"p": profile()}, http=http) as runner:
        run_to_rest(runner, job_id)
    return job_id, len(calls)


# -- a finish reason is a finished answer ---------------------------------------------------


def test_a_drop_after_the_finish_reason_is_a_finished_answer(
    redis_server: RedisServer, real_store: Store
) -> None:
    """Before: the drop was a cut, and a continuation of a whole answer was bought."""

    def handler(request: httpx.Request) -> httpx.Response:
        body = f"data: {delta('The answer is 42.')}\n\ndata: {delta('', 'stop')}\n\n".encode()

        def stream() -> Any:
            yield body
            raise httpx.RemoteProtocolError("peer closed connection")

        return httpx.Response(200, content=stream(), headers={"content-type": "text/event-stream"})

    job_id, calls = run_with(handler, redis_server, real_store)
    assert calls == 1
    record = real_store.get(job_id)
    assert record.state is JobState.DONE and real_store.text(job_id) == "The answer is 42."


def test_a_malformed_usage_chunk_after_the_finish_reason_keeps_the_answer() -> None:
    http = httpx.Client(
        transport=httpx.MockTransport(sse(delta("Hi."), delta("", "stop"), "{not json"))
    )
    client = make_client(ProviderProfile.model_validate(profile()), http)
    plan = plan_request(parse_spec(SPEC), client.profile, prefix="", remaining_tokens=10)
    with client.open(plan) as stream:
        text = "".join(e.text for e in stream if isinstance(e, TextDelta))
    assert text == "Hi." and stream.finish_reason == "stop"


# -- text that is not valid Unicode -----------------------------------------------------------


def test_a_surrogate_pair_split_across_chunks_is_joined(
    redis_server: RedisServer, real_store: Store
) -> None:
    handler = sse(delta("Smile "), delta("\ud83d"), delta("\ude00 done"), delta("", "stop"))
    job_id, _ = run_with(handler, redis_server, real_store)
    assert real_store.text(job_id) == "Smile \U0001f600 done"


def test_a_lone_surrogate_is_a_named_cut_never_a_crash(
    redis_server: RedisServer, real_store: Store
) -> None:
    """Before: the flush raised UnicodeEncodeError and the job stayed running until its
    lease expired."""
    handler = sse(delta("Smile "), delta("\ud83d"), delta("no pair"), delta("", "stop"))
    job_id, _ = run_with(handler, redis_server, real_store)
    record = real_store.get(job_id)
    assert record.state is not JobState.RUNNING
    first = real_store.ledger(job_id)[0]
    assert first["cut"] == "stream_cut" and "surrogate" in first["detail"]
    with pytest.raises(MalformedChunk, match="surrogate"):
        client = make_client(ProviderProfile.model_validate(profile()), httpx.Client(
            transport=httpx.MockTransport(sse(delta("\udc00"), delta("", "stop")))))  # fmt: skip
        plan = plan_request(parse_spec(SPEC), client.profile, prefix="", remaining_tokens=10)
        with client.open(plan) as stream:
            list(stream)


# -- a scheduled attempt moved half way ------------------------------------------------------


def test_a_half_moved_scheduled_attempt_is_repaired(
    redis_server: RedisServer, real_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: taken off the scheduled registry and never put on the queue, the RQ job was
    "scheduled" nowhere, counted as pending, and the job stayed queued forever. (Moves out
    of the due-time index are one script now; the entry is lost here by hand.)"""
    job_id = real_store.create(SPEC).id
    real_store.outbox_done(job_id, "attempt", real_store.outbox(job_id)["attempt"])
    due_ms = int(time.time() * 1000) + 60_000
    enqueue_attempt(real_store.redis, job_id, queue="resumeq", attempt=1, due_ms=due_ms)
    assert attempt_pending(real_store.redis, job_id, 1)
    real_store.redis.zrem(keys.DUE, attempt_rq_id(job_id, 1))
    assert not attempt_pending(real_store.redis, job_id, 1)
    monkeypatch.setattr("resumeq.janitor.queues.VANISHED_GRACE_MS", 0)
    settings = Settings(redis_url=redis_server.url, file=ConfigFile(worker=WorkerSettings()))
    ctx = build_context(settings)
    try:
        assert Janitor(ctx).sweep().requeued == [job_id]
    finally:
        ctx.close()
    assert attempt_pending(real_store.redis, job_id, 1)


def test_overdue_scheduled_attempts_move_in_one_transaction(
    real_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Off the registry and onto the queue together, or neither: a process that dies half
    way leaves the attempt where it was."""
    job_id = real_store.create(SPEC).id
    queue = rq_queue("resumeq", real_store.redis)
    past = datetime.now(UTC) - timedelta(seconds=10)
    queue.enqueue_at(past, "resumeq.worker.run_attempt", job_id, job_id=attempt_rq_id(job_id, 1))
    registry = ScheduledJobRegistry(queue=queue)  # type: ignore[no-untyped-call]
    now = int(datetime.now(UTC).timestamp())

    def dies(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("the process died half way")

    monkeypatch.setattr(type(queue), "_enqueue_job", dies)
    with pytest.raises(ConnectionError):
        enqueue_overdue(queue, now)
    assert registry.get_job_ids() == [attempt_rq_id(job_id, 1)]  # still scheduled
    monkeypatch.undo()
    assert enqueue_overdue(queue, now) == [attempt_rq_id(job_id, 1)]
    assert queue.get_job_ids() == [attempt_rq_id(job_id, 1)] and registry.get_job_ids() == []


# -- one snapshot ---------------------------------------------------------------------------


def test_get_reads_the_text_and_the_revision_as_of_one_write(real_store: Store) -> None:
    """Before: two round trips; the text could be ahead of the revision, and following on
    after it repeated text."""
    job_id = real_store.create({**SPEC, "budget_tokens": 60_000}).id
    got = real_store.acquire(job_id, worker="w1", ttl_ms=60_000)
    stop = threading.Event()

    def writer() -> None:
        rev = got.record.revision
        for i in range(400):
            rev = real_store.flush(
                got.lease, expected_revision=rev, delta=f"<{i:08d}>", tokens=1
            ).revision
        stop.set()

    client = Client(real_store.redis)
    thread = threading.Thread(target=writer)
    thread.start()
    torn = 0
    while not stop.is_set():
        job = client.get(job_id)
        torn += len(job.text) != 10 * (job.revision - got.record.revision)
    thread.join()
    assert torn == 0


# -- an idempotency key lives as long as its job --------------------------------------------


def test_an_idempotency_key_lives_exactly_as_long_as_its_job(redis_client: redis.Redis) -> None:
    """Before: its TTL came from the producer's settings (a day) while the job's came from
    the worker's retention: for a day, enqueueing again answered a job that was gone."""
    producer = Store(redis_client)  # default settings
    worker = Store(redis_client, settings=StoreSettings(retention_s=1))
    spec = {**SPEC, "idempotency_key": "order-42"}
    first = producer.create(spec).id
    assert redis_client.ttl("resumeq:idem:order-42") == -1  # no TTL while the job lives
    got = worker.acquire(first, worker="w1", ttl_ms=5000)
    worker.finish(got.lease, state="done")
    assert 0 < redis_client.ttl("resumeq:idem:order-42") <= 1  # it expires with the job
    time.sleep(1.2)
    with pytest.raises(JobNotFound):
        producer.get(first)
    second = producer.create(spec)
    assert second.created and second.id != first
    producer.get(second.id)


# -- a purged job, a read-only replica ------------------------------------------------------


def test_a_job_purged_mid_stream_stops_the_attempt_cleanly(
    redis_server: RedisServer, real_store: Store
) -> None:
    job_id = real_store.create(SPEC).id

    def handler(request: httpx.Request) -> httpx.Response:
        real_store.cancel(job_id)
        real_store.purge(job_id)
        return sse(delta("Hello"), delta(" there"), delta("", "stop"))(request)

    http = httpx.Client(transport=httpx.MockTransport(handler))
    with attempt_runner(redis_server.url, {"p": profile()}, http=http) as runner:
        assert runner.run(job_id) == "lost"
    with pytest.raises(JobNotFound):
        real_store.get(job_id)


def test_a_read_only_replica_is_redis_unavailable() -> None:
    """After a failover the old primary answers READONLY: wait and try again, as for any
    Redis that cannot take the write, never crash."""
    with pytest.raises(RedisUnavailable), redis_errors("flush"):
        raise redis.ReadOnlyError("You can't write against a read only replica.")
