"""The janitor's sweep, in process, against a real redis-server (no workers running)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
import redis
from rq.job import JobStatus

from resumeq.core.models import JobState
from resumeq.core.settings import ConfigFile, Settings, WorkerSettings
from resumeq.janitor.sweep import Janitor
from resumeq.producer.enqueue import enqueue_job
from resumeq.queue.queueing import attempt_pending, attempt_rq_id, rq_queue
from resumeq.store import Store, keys
from resumeq.testing import RedisServer
from resumeq.worker.context import build_context

SPEC = {"prompt": "p", "provider": "local", "model": "m", "budget_tokens": 500}


@pytest.fixture
def janitor(redis_server: RedisServer, redis_client: redis.Redis) -> Janitor:
    settings = Settings(
        redis_url=redis_server.url, file=ConfigFile(worker=WorkerSettings(lease_ttl_ms=200))
    )
    return Janitor(build_context(settings))


#: A lease that outlives the flush written right after it on a loaded machine, and the wait
#: after which it has surely lapsed.
LEASE_MS, LAPSE_S = 400, 0.5


def running_with_dead_lease(store: Store, spent: int) -> str:
    job_id = store.create(SPEC).id
    got = store.acquire(job_id, worker="dead-worker-1", ttl_ms=LEASE_MS)
    if spent:
        store.flush(got.lease, expected_revision=1, delta="x" * spent, tokens=spent)
    return job_id


def test_a_dead_workers_job_is_resumed_and_its_attempt_recorded(janitor: Janitor) -> None:
    store = janitor.store
    job_id = running_with_dead_lease(store, 40)
    time.sleep(LAPSE_S)
    report = janitor.sweep()
    assert report.reaped == [job_id] and report.outcomes[job_id] == "queued"
    record = store.get(job_id)
    assert record.state is JobState.QUEUED and record.reason == "worker_died after 40 output tokens"
    (entry,) = store.ledger(job_id)
    assert entry["cut"] == "worker_died" and entry["worker"] == "dead-worker-1"
    assert entry["output_tokens_persisted"] == 40 and entry["kind"] == "fresh"
    assert attempt_pending(store.redis, job_id, 2)  # the continuation is enqueued at once


def test_several_janitors_reap_each_job_once(janitor: Janitor) -> None:
    store = janitor.store
    ids = [running_with_dead_lease(store, 10) for _ in range(5)]
    time.sleep(LAPSE_S)
    other = Janitor(janitor.ctx)
    first, second = janitor.sweep(), other.sweep()
    assert sorted(first.reaped + second.reaped) == sorted(ids)
    assert all(len(store.ledger(i)) == 1 for i in ids)


def test_a_job_whose_producer_died_after_writing_it_is_enqueued(
    janitor: Janitor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record holds its first attempt in the outbox: the janitor carries it out."""
    store = janitor.store
    job_id = store.create(SPEC).id  # written, but its RQ job never was
    assert janitor.sweep().followed_up == []  # the producer's own moment first
    monkeypatch.setattr("resumeq.queue.outbox.JANITOR_GRACE_MS", 0)
    report = janitor.sweep()
    assert report.followed_up == [job_id] and report.requeued == []
    assert rq_queue("resumeq", store.redis).fetch_job(attempt_rq_id(job_id, 1)) is not None
    assert store.outbox(job_id) == {}
    assert janitor.sweep().followed_up == []  # once


def test_a_queued_job_whose_rq_job_vanished_is_enqueued_again(
    janitor: Janitor, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = janitor.store
    job_id = enqueue_job(store, store.redis, SPEC).id
    rq_queue("resumeq", store.redis).fetch_job(attempt_rq_id(job_id, 1)).delete()  # type: ignore[union-attr]
    monkeypatch.setattr("resumeq.janitor.queues.VANISHED_GRACE_MS", 0)
    report = janitor.sweep()
    assert report.requeued == [job_id]
    assert rq_queue("resumeq", store.redis).fetch_job(attempt_rq_id(job_id, 1)) is not None
    assert janitor.sweep().requeued == []  # once


@pytest.mark.parametrize(
    "damage",
    [
        lambda r, k: r.hset(k, "spec", "{garbled"),
        lambda r, k: r.hdel(k, "spec", "budget_tokens"),
        lambda r, k: r.hset(k, "revision", "many"),
    ],
    ids=["garbled-spec", "fields-deleted", "garbled-revision"],
)
def test_a_corrupt_record_fails_and_the_sweep_goes_on(janitor: Janitor, damage: object) -> None:
    store = janitor.store
    bad = running_with_dead_lease(store, 5)
    good = running_with_dead_lease(store, 5)
    damage(store.redis, keys.job(bad))  # type: ignore[operator]
    time.sleep(LAPSE_S)
    report = janitor.sweep()
    assert good in report.reaped and store.get(good).state is JobState.QUEUED
    raw = store.redis.hgetall(keys.job(bad))
    assert raw[b"state"] == b"failed" and b"corrupt job record" in raw[b"error"]
    assert store.redis.zscore(keys.LEASES, bad) is None
    assert store.expired_leases() == []


def test_a_half_deleted_job_leaves_the_indexes(
    janitor: Janitor, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = janitor.store
    job_id = store.create(SPEC).id
    store.redis.delete(keys.job(job_id))
    monkeypatch.setattr("resumeq.janitor.queues.VANISHED_GRACE_MS", 0)
    janitor.sweep()
    assert store.redis.zscore(keys.QUEUED, job_id) is None


def test_an_attempt_dequeued_by_a_dead_worker_is_enqueued_again(
    janitor: Janitor, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = janitor.store
    job_id = enqueue_job(store, store.redis, SPEC).id
    queue = rq_queue("resumeq", store.redis)
    assert store.redis.lpop(queue.key) == attempt_rq_id(job_id, 1).encode()  # then it died
    monkeypatch.setattr("resumeq.janitor.queues.VANISHED_GRACE_MS", 0)
    assert janitor.sweep().requeued == [job_id]
    assert queue.get_job_ids() == [attempt_rq_id(job_id, 1)]
    assert janitor.sweep().requeued == []


def test_an_attempt_started_by_a_horse_that_died_before_its_lease_is_enqueued_again(
    janitor: Janitor, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = janitor.store
    job_id = enqueue_job(store, store.redis, SPEC).id
    queue = rq_queue("resumeq", store.redis)
    rq_job = queue.fetch_job(attempt_rq_id(job_id, 1))
    assert rq_job is not None
    store.redis.lpop(queue.key)  # a worker took it, marked it started, and died
    rq_job.set_status(JobStatus.STARTED)
    rq_job.started_at = datetime.now(UTC) - timedelta(seconds=2)
    rq_job.save()
    monkeypatch.setattr("resumeq.janitor.queues.VANISHED_GRACE_MS", 0)
    assert janitor.sweep().requeued == []  # just started: it may still take its lease
    rq_job.started_at = datetime.now(UTC) - timedelta(seconds=30)
    rq_job.save()
    assert janitor.sweep().requeued == [job_id]
    assert queue.get_job_ids() == [attempt_rq_id(job_id, 1)]


def test_a_dead_attempts_characters_are_counted_from_its_text(janitor: Janitor) -> None:
    store = janitor.store
    job_id = store.create(SPEC).id
    got = store.acquire(job_id, worker="w1", ttl_ms=5000)
    store.flush(got.lease, expected_revision=1, delta="héllo ", tokens=2)
    store.release(got.lease, to="queued", reason="disconnected")
    got = store.acquire(job_id, worker="dead-worker-2", ttl_ms=LEASE_MS)
    store.flush(got.lease, expected_revision=got.record.revision, delta="wörld ✓", tokens=3)
    time.sleep(LAPSE_S)
    assert janitor.sweep().reaped == [job_id]
    (entry,) = store.ledger(job_id)  # the first release wrote no record
    assert entry["kind"] == "resume" and entry["attempt"] == 2
    assert (entry["chars_persisted"], entry["bytes_persisted"]) == (7, len("wörld ✓".encode()))


class Waits(threading.Event):
    """A stop event that records each pause instead of sleeping, and runs ``then`` after
    pause n (1-based); it stops the loop after ``stop_after`` pauses."""

    def __init__(self, stop_after: int, then: dict[int, Callable[[], None]]) -> None:
        super().__init__()
        self.pauses: list[float] = []
        self.stop_after, self.then = stop_after, then

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.pauses.append(timeout)
        self.then.get(len(self.pauses), lambda: None)()
        if len(self.pauses) >= self.stop_after:
            self.set()
        return self.is_set()


def test_with_redis_down_each_sweep_logs_one_line_and_the_pause_doubles_to_a_cap(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = RedisServer()  # stopped for most of the test, started once
    # The sweeps' pauses alone (no looks at the workers' connections between them).
    settings = Settings(
        redis_url=server.url,
        file=ConfigFile.model_validate({"janitor": {"liveness_interval_ms": 0}}),
    )
    sweeper = Janitor(build_context(settings))
    waits = Waits(7, {3: server.start, 4: server.stop})
    try:
        with caplog.at_level(logging.INFO, logger="resumeq.janitor.sweep"):
            sweeper.run(interval_s=0.5, stop=waits, max_backoff_s=3.0)
    finally:
        server.close()
    # Three failed sweeps (1, 2, 3 s: doubling), one after Redis came back (the interval
    # again), then failures from the first pause again, capped.
    assert waits.pauses == [1.0, 2.0, 3.0, 0.5, 1.0, 2.0, 3.0]
    failures = [r for r in caplog.records if "sweep failed" in r.getMessage()]
    assert len(failures) == 6 and all(r.exc_info is None for r in failures)
    assert all("Redis unreachable" in r.getMessage() for r in failures)
    assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    assert any("Redis answers again" in r.getMessage() for r in caplog.records)
