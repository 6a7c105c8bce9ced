"""The producer API over a real redis-server: enqueue, get, wait, cancel, follow."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis
from rq.job import JobStatus

from resumeq.core.errors import InvalidSpec, JobNotFound
from resumeq.core.models import JobState
from resumeq.producer.client import Client, Delta
from resumeq.producer.enqueue import purge_job
from resumeq.queue import outbox
from resumeq.queue.queueing import attempt_rq_id, rq_queue
from resumeq.store import SPILL_QUEUE, keys

SPEC = {"prompt": "Follow me.", "provider": "local", "model": "m", "budget_tokens": 500}


@pytest.fixture
def client(redis_client: redis.Redis) -> Client:
    return Client(redis_client)


def write_attempts(client: Client, job_id: str, attempts: list[list[str]], pause: float) -> None:
    """Play the owner: several attempts, each flushing some pieces, then done."""
    store = client.store
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


ATTEMPTS = [["The ", "quick "], ["brown ", "fox "], ["jumps ", "over."]]
TEXT = "".join(p for a in ATTEMPTS for p in a)


def test_enqueue_writes_the_record_and_the_first_attempt(client: Client) -> None:
    job_id = client.enqueue(SPEC)
    job = client.get(job_id)
    assert job.state is JobState.QUEUED and job.text == "" and job.revision == 0
    assert rq_queue("resumeq", client.redis).fetch_job(attempt_rq_id(job_id, 1)) is not None
    again = client.enqueue({**SPEC, "idempotency_key": "k"})
    assert client.enqueue({**SPEC, "idempotency_key": "k"}) == again


def test_enqueue_refuses_a_bad_spec_and_writes_nothing(client: Client) -> None:
    with pytest.raises(InvalidSpec, match="budget_tokens"):
        client.enqueue({**SPEC, "budget_tokens": 0})
    assert list(client.redis.scan_iter("*")) == []


def test_followers_before_during_and_after_see_the_text_once(client: Client) -> None:
    job_id = client.enqueue(SPEC)
    seen: dict[str, list[Delta]] = {}

    def follower(name: str) -> None:
        seen[name] = list(client.follow(job_id, timeout=20))

    before = threading.Thread(target=follower, args=("before",))
    before.start()
    writer = threading.Thread(target=write_attempts, args=(client, job_id, ATTEMPTS, 0.05))
    writer.start()
    time.sleep(0.2)
    during = threading.Thread(target=follower, args=("during",))
    during.start()
    for t in (writer, before, during):
        t.join(timeout=20)
    follower("after")
    for name, deltas in seen.items():
        assert "".join(d.text for d in deltas) == TEXT, name
        revisions = [d.revision for d in deltas]
        assert revisions == sorted(set(revisions)), name


def test_reconnecting_after_any_revision_yields_exactly_the_rest(client: Client) -> None:
    job_id = client.enqueue(SPEC)
    write_attempts(client, job_id, ATTEMPTS, 0)
    deltas = list(client.follow(job_id))
    for i, d in enumerate(deltas):
        rest = "".join(x.text for x in client.follow(job_id, after=d.revision))
        assert rest == "".join(x.text for x in deltas[i + 1 :])
    final = client.get(job_id).revision
    assert list(client.follow(job_id, after=final)) == []


def test_follow_blocks_until_more_arrives(client: Client) -> None:
    job_id = client.enqueue(SPEC)
    with pytest.raises(TimeoutError):
        list(client.follow(job_id, timeout=0.3))
    with pytest.raises(JobNotFound):
        list(client.follow("no-such-job", timeout=1))


def test_wait_and_cancel(client: Client) -> None:
    job_id = client.enqueue(SPEC)
    with pytest.raises(TimeoutError):
        client.wait(job_id, timeout=0.2)
    timer = threading.Timer(0.2, client.cancel, args=(job_id,))
    timer.start()
    try:
        job = client.wait(job_id, timeout=5)
    finally:
        timer.join(5)  # cancel goes on to read the job: done before the connection closes
    assert job.state is JobState.CANCELLED and job.ended


def test_wait_returns_at_a_spill(client: Client) -> None:
    job_id = client.enqueue(SPEC)
    got = client.store.acquire(job_id, worker="w", ttl_ms=5000)
    client.store.release(got.lease, to="spilled", reason="below floor")
    assert client.wait(job_id, timeout=1).state is JobState.SPILLED


def test_a_job_that_expires_ends_the_follow(client: Client) -> None:
    job_id = client.enqueue(SPEC)
    timer = threading.Timer(0.2, client.redis.delete, args=(keys.job(job_id),))
    timer.start()
    try:
        with pytest.raises(JobNotFound):
            list(client.follow(job_id, timeout=5))
    finally:
        timer.join(5)


def _take(client: Client, job_id: str) -> Any:
    """Play a worker: its first attempt's RQ job dequeued, the lease taken."""
    rq_queue("resumeq", client.redis).remove(attempt_rq_id(job_id, 1))
    return client.store.acquire(job_id, worker="w1", ttl_ms=5000)


def _spilled(client: Client) -> str:
    """A job spilled by its worker: its next attempt waits in the spill lane."""
    job_id = client.enqueue(SPEC)
    got = _take(client, job_id)
    client.store.release(got.lease, to="spilled", reason="on_cut is spill")
    outbox.complete(client.store, client.redis, job_id)
    assert rq_queue(SPILL_QUEUE, client.redis).get_job_ids() == [attempt_rq_id(job_id, 2)]
    return job_id


def test_purging_a_spilled_job_leaves_nothing_in_the_spill_lane(client: Client) -> None:
    job_id = _spilled(client)
    purge_job(client.store, job_id)
    assert client.redis.llen(f"rq:queue:{SPILL_QUEUE}") == 0
    assert not client.redis.exists(f"rq:job:{attempt_rq_id(job_id, 2)}")


def test_cancelling_a_waiting_job_removes_its_rq_job_wherever_it_waits(client: Client) -> None:
    spilled = _spilled(client)
    queued = client.enqueue(SPEC)
    delayed = client.enqueue(SPEC)
    got = _take(client, delayed)
    client.store.release(got.lease, to="queued", reason="429", delay_ms=60_000)
    outbox.complete(client.store, client.redis, delayed)
    assert client.redis.zscore(keys.DUE, attempt_rq_id(delayed, 2)) is not None
    for job_id in (spilled, queued, delayed):
        assert client.cancel(job_id).state is JobState.CANCELLED
    assert client.redis.llen(f"rq:queue:{SPILL_QUEUE}") == 0
    assert client.redis.llen("rq:queue:resumeq") == 0
    assert client.redis.zcard(keys.DUE) == 0
    for rq_id in (attempt_rq_id(spilled, 2), attempt_rq_id(queued, 1), attempt_rq_id(delayed, 2)):
        assert not client.redis.exists(f"rq:job:{rq_id}")


def test_cancel_of_an_ended_job_answers_it_unchanged_as_every_face_does(client: Client) -> None:
    job_id = client.enqueue(SPEC)
    assert client.cancel(job_id).state is JobState.CANCELLED
    again = client.cancel(job_id, reason="a second time")
    assert again.state is JobState.CANCELLED and again.revision == client.get(job_id).revision
    with pytest.raises(JobNotFound):
        client.cancel("no-such-job")


def test_a_running_attempt_is_left_to_its_worker(client: Client) -> None:
    job_id = client.enqueue(SPEC)
    rq_job = rq_queue("resumeq", client.redis).fetch_job(attempt_rq_id(job_id, 1))
    assert rq_job is not None
    rq_job.set_status(JobStatus.STARTED)
    client.store.acquire(job_id, worker="w1", ttl_ms=5000)
    client.cancel(job_id)
    assert client.redis.exists(f"rq:job:{attempt_rq_id(job_id, 1)}")  # its worker's to end
