"""The enqueue path: a new job costs two round trips (the create script, which answers the
outbox entry it wrote; the script that writes the attempt's RQ job and marks that entry
done) and calls nothing of the hooks' machinery. A job that existed, or a create sent
again, takes the outbox's careful path; a producer that dies between the two round trips
leaves its entry to the janitor. A real redis-server throughout."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator
from types import FrameType
from typing import Any

import pytest
import redis
from redis.connection import Connection

from resumeq.core.settings import ConfigFile, Settings, WorkerSettings
from resumeq.janitor.sweep import Janitor
from resumeq.producer.enqueue import enqueue_job
from resumeq.queue import attempt_jobs
from resumeq.queue.attempt_jobs import DueAttempt, attempt_rq_id, rq_job_key, rq_queue_key
from resumeq.store import Store, keys
from resumeq.testing import RedisServer
from resumeq.worker.context import build_context

pytestmark = pytest.mark.timeout(60)

SPEC = {"prompt": "p", "provider": "x", "model": "m", "budget_tokens": 500}
JOB = "0123456789abcdef0123456789abcdef"
#: The hooks' machinery, which a job without hooks never calls into.
HOOK_MODULES = ("resumeq.queue.outbox_hooks", "resumeq.worker.hooks")


def round_trips(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """What each round trip to Redis sends from now on (its first bytes): redis-py sends
    a command, or a pipeline's commands, in one ``send_packed_command``."""
    sent: list[bytes] = []
    send = Connection.send_packed_command

    def counted(self: Connection, command: Any, check_health: bool = True) -> None:
        packed = command if isinstance(command, bytes | memoryview) else b"".join(command)
        sent.append(bytes(packed)[:80])
        send(self, command, check_health)

    monkeypatch.setattr(Connection, "send_packed_command", counted)
    return sent


def queued(r: redis.Redis, queue: str = "resumeq") -> list[bytes]:
    return r.lrange(rq_queue_key(queue), 0, -1)


def test_a_new_job_is_enqueued_in_two_round_trips(
    real_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: five (the create; the outbox read back; the RQ job looked for on another
    queue; the RQ job written; the entry marked done)."""
    enqueue_job(real_store, real_store.redis, SPEC)  # warm: the scripts are loaded
    sent = round_trips(monkeypatch)
    result = enqueue_job(real_store, real_store.redis, SPEC)
    monkeypatch.undo()
    assert len(sent) == 2, sent
    assert all(b"EVALSHA" in command for command in sent)
    assert result.created and result.follow_up is not None
    assert attempt_rq_id(result.id, 1).encode() in queued(real_store.redis)
    assert real_store.outbox(result.id) == {}
    assert real_store.redis.zscore(keys.OUTBOX, result.id) is None
    assert real_store.get(result.id).state.value == "queued"


def test_enqueueing_a_job_without_hooks_calls_nothing_of_the_hooks(real_store: Store) -> None:
    for name in HOOK_MODULES:
        importlib.import_module(name)  # loaded, so that a call into them would be seen
    called: list[str] = []

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            called.append(f"{frame.f_globals.get('__name__')}.{frame.f_code.co_name}")

    enqueue_job(real_store, real_store.redis, SPEC)
    sys.setprofile(profile)
    try:
        job_id = enqueue_job(real_store, real_store.redis, SPEC).id
    finally:
        sys.setprofile(None)
    assert "resumeq.queue.attempt_jobs.write" in called  # the profile saw the path
    assert [c for c in called if c.startswith(HOOK_MODULES)] == []
    assert not [c for c in called if c.startswith("resumeq.queue.outbox.")]
    assert attempt_rq_id(job_id, 1).encode() in queued(real_store.redis)


def test_an_idempotent_repeat_takes_the_careful_path(real_store: Store) -> None:
    """The first call's producer died after its create: the repeat answers that job, with
    no entry of its own, and carries the outbox out."""
    spec = {**SPEC, "idempotency_key": "order-7"}
    first = real_store.create(spec)
    assert first.follow_up is not None and real_store.outbox(first.id)
    again = enqueue_job(real_store, real_store.redis, spec)
    assert again.id == first.id and not again.created and again.follow_up is None
    assert queued(real_store.redis) == [attempt_rq_id(first.id, 1).encode()]
    assert real_store.outbox(first.id) == {}
    enqueue_job(real_store, real_store.redis, spec)
    assert queued(real_store.redis) == [attempt_rq_id(first.id, 1).encode()]  # never twice


def test_a_create_sent_again_answers_no_entry(
    real_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A re-send of an applied create (its reply was lost) does not know what became of the
    entry since: the careful path follows it."""
    monkeypatch.setattr("resumeq.store.transport.request_id", lambda: "one-request")
    first = real_store.create(SPEC, job_id=JOB)
    resent = real_store.create(SPEC, job_id=JOB)
    assert first.follow_up is not None and first.follow_up.startswith("resumeq|1|")
    assert resent.created and resent.follow_up is None
    assert first == resent  # the entry is not part of the answer's value


def test_the_script_marks_the_entry_done_only_if_it_is_still_the_one_written(
    real_store: Store,
) -> None:
    r = real_store.redis
    first = real_store.create(SPEC, job_id=JOB)
    entry = first.follow_up
    assert entry is not None
    item = DueAttempt.of_entry(JOB, entry)
    assert (item.queue, item.attempt) == ("resumeq", 1)
    # A newer commit replaced the entry meanwhile: the RQ job is written, the entry stays.
    r.hset(keys.outbox(JOB), "attempt", "resumeq|2|0")
    assert attempt_jobs.write(r, item, entry=entry) == 1
    assert real_store.outbox(JOB) == {"attempt": "resumeq|2|0"}
    assert r.zscore(keys.OUTBOX, JOB) is not None
    # The RQ job written twice is refused; the entry it answers is marked done all the same.
    r.hset(keys.outbox(JOB), "attempt", entry)
    assert attempt_jobs.write(r, item, entry=entry) == 0
    assert real_store.outbox(JOB) == {} and r.zscore(keys.OUTBOX, JOB) is None
    assert queued(r) == [attempt_rq_id(JOB, 1).encode()]
    assert r.hget(rq_job_key(attempt_rq_id(JOB, 1)), "status") == b"queued"


def test_the_job_stays_owed_while_other_entries_remain(real_store: Store) -> None:
    r = real_store.redis
    entry = real_store.create(SPEC, job_id=JOB).follow_up
    assert entry is not None
    r.hset(keys.outbox(JOB), "hook:notify", "resumeq|0")  # as if a commit had owed a hook
    assert attempt_jobs.write(r, DueAttempt.of_entry(JOB, entry), entry=entry) == 1
    assert real_store.outbox(JOB) == {"hook:notify": "resumeq|0"}
    assert r.zscore(keys.OUTBOX, JOB) is not None


def test_without_an_entry_the_outbox_is_left_alone(real_store: Store) -> None:
    r = real_store.redis
    entry = real_store.create(SPEC, job_id=JOB).follow_up
    assert entry is not None
    assert attempt_jobs.write(r, DueAttempt.of_entry(JOB, entry)) == 1
    assert real_store.outbox(JOB) == {"attempt": entry}
    assert r.zscore(keys.OUTBOX, JOB) is not None


def test_a_later_attempt_due_later_is_scheduled_and_its_entry_done(real_store: Store) -> None:
    r = real_store.redis
    real_store.create(SPEC, job_id=JOB)
    entry = "resumeq|2|" + str(2**42)
    r.hset(keys.outbox(JOB), "attempt", entry)
    assert attempt_jobs.write(r, DueAttempt.of_entry(JOB, entry), entry=entry) == 1
    assert r.zscore(keys.DUE, attempt_rq_id(JOB, 2)) == 2**42
    assert r.hget(rq_job_key(attempt_rq_id(JOB, 2)), "status") == b"scheduled"
    assert real_store.outbox(JOB) == {} and queued(r) == []


@pytest.fixture
def janitor(redis_server: RedisServer, redis_client: redis.Redis) -> Iterator[Janitor]:
    settings = Settings(redis_url=redis_server.url, file=ConfigFile(worker=WorkerSettings()))
    context = build_context(settings)
    try:
        yield Janitor(context)
    finally:
        context.close()


def test_a_producer_that_dies_between_the_round_trips_leaves_the_janitor_its_entry(
    redis_server: RedisServer, janitor: Janitor, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = janitor.store
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            attempt_jobs.write = lambda *args, **kwargs: os._exit(137)  # type: ignore[assignment]
            producer = Store(redis.Redis.from_url(redis_server.url))
            enqueue_job(producer, producer.redis, SPEC)
        finally:
            os._exit(3)  # reached only if it did not die between the two
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 137, "the child did not die between the two"
    (job_id,) = store.outbox_pending(0)
    assert store.get(job_id).state.value == "queued" and queued(store.redis) == []
    monkeypatch.setattr("resumeq.queue.outbox.JANITOR_GRACE_MS", 0)
    assert janitor.sweep().followed_up == [job_id]
    assert queued(store.redis) == [attempt_rq_id(job_id, 1).encode()]
    assert store.outbox(job_id) == {} and store.outbox_pending(0) == []
    assert janitor.sweep().followed_up == []  # once
