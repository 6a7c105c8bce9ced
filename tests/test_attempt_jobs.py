"""An attempt's RQ job as resumeq writes it without RQ is the one RQ makes: the same hash,
on the same keys; RQ reads it back and a worker runs it (the end-to-end tests). One that
waits is deleted as RQ deletes it."""

from __future__ import annotations

import zlib
from datetime import UTC, datetime
from typing import Any

import pytest
import redis
import rq.defaults
from rq import Queue
from rq.job import Job, JobStatus
from rq.scripts import _build_hset_args
from rq.serializers import JSONSerializer

from resumeq.queue import attempt_jobs, queueing
from resumeq.queue.attempt_jobs import DueAttempt, attempt_rq_id, enqueue_attempt
from resumeq.queue.queueing import rq_queue

JOB = "0123456789abcdef0123456789abcdef"


def stored(redis_client: redis.Redis, flat: list[object]) -> dict[bytes, bytes]:
    """A flat list of fields and values, as Redis stores them."""
    encode: Any = redis_client.connection_pool.get_encoder().encode
    return {encode(k): encode(v) for k, v in zip(flat[::2], flat[1::2], strict=True)}


def by_rq(redis_client: redis.Redis, item: DueAttempt) -> dict[bytes, bytes]:
    """The hash RQ writes for the attempt: ``Queue.create_job`` as resumeq called it, after
    RQ's preparation for its queue."""
    queue = Queue(item.queue, connection=redis_client, serializer=JSONSerializer)
    job = queue.create_job(
        attempt_jobs.ATTEMPT_FUNC,
        args=(item.job_id,),
        timeout=-1,
        result_ttl=attempt_jobs.RESULT_TTL_S,
        failure_ttl=attempt_jobs.FAILURE_TTL_S,
        description=f"resumeq attempt {item.attempt} of {item.job_id}",
        job_id=attempt_rq_id(item.job_id, item.attempt),
    )
    queue._prepare_for_queue(job)
    return stored(redis_client, _build_hset_args(job))  # type: ignore[no-untyped-call]


def test_the_hash_is_the_one_rq_writes(redis_client: redis.Redis) -> None:
    item = DueAttempt(JOB, "resumeq", 2)
    theirs = by_rq(redis_client, item)
    ours = stored(redis_client, list(attempt_jobs.rq_fields(item, datetime.now(UTC))))
    stamps = (b"created_at", b"enqueued_at")
    assert {k: v for k, v in ours.items() if k not in stamps} == {
        k: v for k, v in theirs.items() if k not in stamps
    }
    for stamp in stamps:
        assert datetime.strptime(ours[stamp].decode(), "%Y-%m-%dT%H:%M:%S.%fZ")
    assert zlib.decompress(ours[b"data"]) == zlib.decompress(theirs[b"data"])


def test_rq_reads_it_back_on_rqs_own_keys(redis_client: redis.Redis) -> None:
    assert attempt_jobs.RQ_KEY_PREFIX == rq.defaults.RQ_KEY_PREFIX
    assert Queue.redis_queues_keys == attempt_jobs.RQ_QUEUES
    assert enqueue_attempt(redis_client, JOB, queue="resumeq", attempt=1)
    assert not enqueue_attempt(redis_client, JOB, queue="resumeq", attempt=1)  # never twice
    queue = rq_queue("resumeq", redis_client)
    rq_id = attempt_rq_id(JOB, 1)
    assert attempt_jobs.rq_job_key(rq_id) == Job.key_for(rq_id)
    assert queue.key == attempt_jobs.rq_queue_key("resumeq")
    assert queue.job_ids == [rq_id]
    job = Job.fetch(rq_id, connection=redis_client, serializer=JSONSerializer)
    assert (job.func_name, job.args, job.kwargs) == (attempt_jobs.ATTEMPT_FUNC, [JOB], {})
    assert job.get_status() == JobStatus.QUEUED and job.origin == "resumeq"
    assert job.timeout == -1 and job.result_ttl == attempt_jobs.RESULT_TTL_S
    assert job.enqueued_at is not None and job.created_at is not None
    assert "resumeq" in {q.name for q in Queue.all(connection=redis_client)}


def test_an_attempt_waiting_on_another_queue_is_seen(redis_client: redis.Redis) -> None:
    enqueue_attempt(redis_client, JOB, queue="resumeq-spill", attempt=1)
    assert attempt_jobs.waiting_elsewhere(redis_client, JOB, 1, "resumeq")
    assert not attempt_jobs.waiting_elsewhere(redis_client, JOB, 1, "resumeq-spill")
    assert not attempt_jobs.waiting_elsewhere(redis_client, JOB, 2, "resumeq")  # none
    redis_client.hset(attempt_jobs.rq_job_key(attempt_rq_id(JOB, 1)), "status", "started")
    assert not attempt_jobs.waiting_elsewhere(redis_client, JOB, 1, "resumeq")


def keyspace(r: redis.Redis) -> dict[bytes, object]:
    """Every key and what it holds, RQ's timestamps aside."""
    out: dict[bytes, object] = {}
    for key in sorted(r.scan_iter("*")):
        kind = r.type(key)
        if kind == b"hash":
            out[key] = {k: v for k, v in r.hgetall(key).items() if not k.endswith(b"_at")}
        elif kind == b"list":
            out[key] = r.lrange(key, 0, -1)
        elif kind == b"zset":
            out[key] = r.zrange(key, 0, -1)
        elif kind == b"set":
            out[key] = sorted(r.smembers(key))
        else:
            out[key] = kind
    return out


WAITING = {
    "queued": lambda r: enqueue_attempt(r, JOB, queue="resumeq", attempt=2),
    "spilled": lambda r: enqueue_attempt(r, JOB, queue="resumeq-spill", attempt=2),
    "delayed": lambda r: enqueue_attempt(r, JOB, queue="resumeq", attempt=2, due_ms=2**42),
    "in RQ's scheduled registry": lambda r: (
        enqueue_attempt(r, JOB, queue="resumeq", attempt=2),
        r.lrem("rq:queue:resumeq", 0, attempt_rq_id(JOB, 2)),
        r.hset(attempt_jobs.rq_job_key(attempt_rq_id(JOB, 2)), "status", "scheduled"),
        r.zadd("rq:scheduled:resumeq", {attempt_rq_id(JOB, 2): 2**31}),
    ),
    "started": lambda r: (
        enqueue_attempt(r, JOB, queue="resumeq", attempt=2),
        r.hset(attempt_jobs.rq_job_key(attempt_rq_id(JOB, 2)), "status", "started"),
    ),
    "finished": lambda r: (
        enqueue_attempt(r, JOB, queue="resumeq", attempt=2),
        r.hset(attempt_jobs.rq_job_key(attempt_rq_id(JOB, 2)), "status", "finished"),
    ),
    "none": lambda r: None,
}


@pytest.mark.parametrize("state", sorted(WAITING))
def test_a_waiting_attempt_is_deleted_as_rq_deletes_it(
    redis_client: redis.Redis, state: str
) -> None:
    """What resumeq's delete leaves is what RQ's leaves; an RQ job in a state it does not
    take (finished) is left to RQ, which then deletes it as before."""
    other = enqueue_attempt(redis_client, "f" * 32, queue="resumeq", attempt=1)  # untouched
    assert other
    WAITING[state](redis_client)
    before = keyspace(redis_client)
    answer = attempt_jobs.discard_waiting(redis_client, JOB, 2)
    if answer is None:
        assert state == "finished" and keyspace(redis_client) == before
        assert queueing.discard_waiting(redis_client, JOB, 2)
    ours = keyspace(redis_client)
    redis_client.flushall()
    enqueue_attempt(redis_client, "f" * 32, queue="resumeq", attempt=1)
    WAITING[state](redis_client)
    assert queueing.discard_waiting(redis_client, JOB, 2) == (answer is not False)
    assert ours == keyspace(redis_client)
    assert answer is (None if state == "finished" else state not in ("started", "none"))
