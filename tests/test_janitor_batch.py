"""A process that dies takes hundreds of streams with it (SPEC §16): the janitor resumes
all of them in one sweep, its Redis I/O batched — a few round trips per step, not one per
job. Real redis-server; the dead worker is a real RQ worker that started each attempt (an
execution in RQ's started registry, as a worker leaves them), took the leases, wrote some
output and died."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import pytest
import redis
from redis.connection import AbstractConnection
from rq import Worker
from rq.job import Job, JobStatus
from rq.registry import CanceledJobRegistry, FailedJobRegistry, StartedJobRegistry
from rq.serializers import JSONSerializer

from resumeq.core import failpoints
from resumeq.core.errors import CorruptRecord, LeaseLost
from resumeq.core.gate import Cut, Decision, JobView
from resumeq.core.gate import decide as janitor_decide
from resumeq.core.models import Acquired, JobState
from resumeq.core.settings import ConfigFile, JanitorSettings, Settings
from resumeq.janitor.reaper import Reaper
from resumeq.janitor.sweep import Janitor
from resumeq.producer.enqueue import enqueue_job
from resumeq.queue import outbox
from resumeq.queue.queueing import (
    DueAttempt,
    attempt_rq_id,
    enqueue_attempt,
    enqueue_attempts,
    fetch_attempt,
    rq_queue,
)
from resumeq.store import SPILL_QUEUE, Store, keys
from resumeq.testing import RedisServer
from resumeq.worker.context import WorkerContext, build_context

pytestmark = pytest.mark.timeout(120)

SPEC: dict[str, Any] = {"prompt": "p", "provider": "local", "model": "m", "budget_tokens": 500}
#: The dead worker's leases: long enough to write the output, short enough to wait out.
DEAD_TTL_MS = 1_000
#: How many round trips one sweep of any number of dead streams may take (the per-job
#: janitor took about 16 per job: 8,000 for 500).
SWEEP_ROUND_TRIPS = 60


@pytest.fixture
def ctx(redis_server: RedisServer, redis_client: redis.Redis) -> Iterator[WorkerContext]:
    """A janitor's context with the default settings (a lease TTL of 15 s)."""
    context = build_context(Settings(redis_url=redis_server.url, file=ConfigFile()))
    try:
        yield context
    finally:
        context.close()


class DeadWorker:
    """One RQ worker process's worth of streams: it started each attempt's RQ job, took
    its lease (a short TTL), wrote some output, and then died with all of them."""

    def __init__(self, redis_url: str, store: Store) -> None:
        self.store = store
        self.connection = redis.Redis.from_url(redis_url)
        queues = [rq_queue("resumeq", self.connection), rq_queue(SPILL_QUEUE, self.connection)]
        self.rq = Worker(queues, connection=self.connection, serializer=JSONSerializer)
        self.rq.register_birth()
        self.name = "dead-worker-7"
        self.last_deadline_ms = 0

    def close(self) -> None:
        self.connection.close()

    def start(self, job_id: str, *, text: str = "", tokens: int = 0, exact: bool = True) -> None:
        """Run the job's next attempt until the process dies: RQ marks it started with an
        execution, the attempt takes the lease and flushes ``text``."""
        attempt = self.store.get(job_id).attempt + 1
        rq_job = fetch_attempt(self.connection, job_id, attempt)
        assert rq_job is not None, f"attempt {attempt} of {job_id} was never enqueued"
        rq_queue(rq_job.origin, self.connection).remove(rq_job)  # dequeued
        self.rq.prepare_execution(rq_job)
        self.rq.prepare_job_execution(rq_job)
        got = self.store.acquire(job_id, worker=self.name, ttl_ms=DEAD_TTL_MS)
        deadline = got.lease.deadline_ms
        if text or tokens:
            deadline = self._flush(got, text, tokens, exact)
        self.last_deadline_ms = max(self.last_deadline_ms, deadline)

    def _flush(self, got: Acquired, text: str, tokens: int, exact: bool) -> int:
        self.store.flush(got.lease, expected_revision=got.record.revision, delta=text,
                         tokens=tokens, exact=exact)  # fmt: skip
        return int(time.time() * 1000) + DEAD_TTL_MS

    def die(self) -> None:
        """Wait until every lease it held has lapsed (nobody renews them any more)."""
        while time.time() * 1000 < self.last_deadline_ms + 50:
            time.sleep(0.05)


@pytest.fixture
def dead(redis_server: RedisServer, ctx: WorkerContext) -> Iterator[DeadWorker]:
    worker = DeadWorker(redis_server.url, ctx.store)
    try:
        yield worker
    finally:
        worker.close()


def streams(dead: DeadWorker, n: int, **spec: Any) -> list[str]:
    """``n`` jobs enqueued as a producer does, all running on ``dead`` when it died: most
    with text counted exactly, every third counted chunk by chunk (an estimate follows),
    every seventh before any output (a retry)."""
    store = dead.store
    ids = []
    for i in range(n):
        job_id = enqueue_job(store, store.redis, {**SPEC, **spec}).id
        if i % 7 == 6:
            dead.start(job_id)
        else:
            dead.start(job_id, text="partial answer " * 3, tokens=9, exact=i % 3 != 0)
        ids.append(job_id)
    return ids


@contextmanager
def round_trips(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Count the requests this process sends to Redis (a whole pipeline is one)."""
    count = [0]
    send = AbstractConnection.send_packed_command

    def counting(self: AbstractConnection, command: Any, check_health: bool = True) -> None:
        count[0] += 1
        send(self, command, check_health)

    with monkeypatch.context() as patch:
        patch.setattr(AbstractConnection, "send_packed_command", counting)
        yield count


def attempt_ids(ids: list[str], attempt: int) -> list[str]:
    return sorted(attempt_rq_id(job_id, attempt) for job_id in ids)


def assert_handed_on_once(store: Store, ids: list[str]) -> None:
    """Each job queued as a continuation (or retry) exactly once with one ledger record;
    its next attempt on RQ's queue once; its dead attempt canceled, nothing left started."""
    connection = store.redis
    for job_id in ids:
        record = store.get(job_id)
        assert record.state is JobState.QUEUED, (job_id, record.state, record.reason)
        (entry,) = store.ledger(job_id)
        assert entry["cut"] == "worker_died" and entry["worker"] == "dead-worker-7"
        assert entry["outcome"] in ("resume", "retry") and entry["attempt"] == 1
        assert store.outbox(job_id) == {}
    assert store.totals()["attempts"] == len(ids)
    assert sorted(rq_queue("resumeq", connection).get_job_ids()) == attempt_ids(ids, 2)
    assert StartedJobRegistry("resumeq", connection=connection).get_job_ids() == []
    canceled = CanceledJobRegistry("resumeq", connection=connection)
    assert sorted(canceled.get_job_ids()) == attempt_ids(ids, 1)
    assert FailedJobRegistry("resumeq", connection=connection).get_job_ids() == []
    assert store.expired_leases(limit=10_000) == []


def test_500_dead_streams_are_requeued_in_one_sweep_in_a_few_round_trips(
    ctx: WorkerContext, dead: DeadWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = streams(dead, 500)
    estimated = [job_id for i, job_id in enumerate(ids) if i % 3 == 0 and i % 7 != 6]
    started = StartedJobRegistry("resumeq", connection=ctx.redis)
    assert sorted(started.get_job_ids()) == attempt_ids(ids, 1)
    dead.die()
    janitor = Janitor(ctx)
    with round_trips(monkeypatch) as trips:
        wall, cpu = time.perf_counter(), time.process_time()
        report = janitor.sweep()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert sorted(report.reaped) == sorted(ids) and report.errors == 0
    assert set(report.outcomes.values()) == {"queued"}
    assert trips[0] <= SWEEP_ROUND_TRIPS, f"{trips[0]} round trips for 500 jobs"
    # Within one janitor interval (the janitor's own work; Redis runs beside it).
    assert cpu < JanitorSettings().interval_s, f"{cpu:.2f} s of CPU ({wall:.2f} s wall)"
    assert_handed_on_once(ctx.store, ids)
    for job_id in estimated:  # counted chunk by chunk: the cursor raised to an estimate
        (entry,) = ctx.store.ledger(job_id)
        assert entry["count_source"] == "estimate" and entry["output_tokens_persisted"] > 9
        assert ctx.store.get(job_id).spent_output_tokens == entry["output_tokens_persisted"]
    again = janitor.sweep()
    assert again.reaped == [] and again.followed_up == [] and again.requeued == []


def test_round_trips_do_not_grow_with_the_number_of_dead_streams(
    ctx: WorkerContext, dead: DeadWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    counts = []
    for n in (10, 100):
        ctx.redis.flushall()
        streams(dead, n)
        dead.die()
        with round_trips(monkeypatch) as trips:
            report = Janitor(ctx).sweep()
        assert len(report.reaped) == n
        counts.append(trips[0])
    assert counts[1] <= counts[0] + 2, counts  # ten times the jobs, the same round trips


def test_two_janitors_sweeping_the_same_500_at_once_reap_each_job_once(
    redis_server: RedisServer, ctx: WorkerContext, dead: DeadWorker
) -> None:
    ids = streams(dead, 500)
    dead.die()
    other = build_context(ctx.settings)
    janitors = [Janitor(ctx), Janitor(other)]
    janitors[1].name += "-b"
    start = threading.Barrier(2)
    reports: list[Any] = [None, None]

    def sweep(i: int) -> None:
        start.wait()
        reports[i] = janitors[i].sweep()

    threads = [threading.Thread(target=sweep, args=(i,)) for i in range(2)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        other.close()
    first, second = reports[0].reaped, reports[1].reaped
    assert not set(first) & set(second)
    assert sorted(first + second) == sorted(ids)
    assert reports[0].errors == reports[1].errors == 0
    assert_handed_on_once(ctx.store, ids)


def test_a_corrupt_record_among_500_is_failed_and_the_other_499_handed_on(
    ctx: WorkerContext, dead: DeadWorker, caplog: pytest.LogCaptureFixture
) -> None:
    ids = streams(dead, 500)
    bad = ids[123]
    ctx.redis.hset(keys.job(bad), "revision", "many")
    dead.die()
    with caplog.at_level(logging.WARNING, logger="resumeq.janitor.reaper"):
        report = Janitor(ctx).sweep()
    good = [job_id for job_id in ids if job_id != bad]
    assert sorted(report.reaped) == sorted(ids) and report.outcomes[bad] == "failed"
    raw = ctx.redis.hgetall(keys.job(bad))
    assert raw[b"state"] == b"failed" and b"corrupt job record" in raw[b"error"]
    assert any(bad in r.getMessage() and "corrupt" in r.getMessage() for r in caplog.records)
    for job_id in good:
        assert ctx.store.get(job_id).state is JobState.QUEUED
        assert len(ctx.store.ledger(job_id)) == 1
    assert sorted(rq_queue("resumeq", ctx.redis).get_job_ids()) == attempt_ids(good, 2)
    # Its attempt's RQ job is left to RQ's own clean-up: nothing in the record is trusted.
    started = StartedJobRegistry("resumeq", connection=ctx.redis)
    assert started.get_job_ids() == [attempt_rq_id(bad, 1)]


def test_a_job_whose_step_fails_is_logged_and_the_batch_goes_on(
    ctx: WorkerContext,
    dead: DeadWorker,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ids = streams(dead, 30)
    unlucky = ids[4]
    decide = Reaper._decision

    def failing(self: Reaper, d: Any) -> Any:
        if d.job_id == unlucky:
            raise RuntimeError("a bug in one job's gate")
        return decide(self, d)

    monkeypatch.setattr(Reaper, "_decision", failing)
    dead.die()
    with caplog.at_level(logging.WARNING, logger="resumeq.janitor.steps"):
        report = Janitor(ctx).sweep()
    assert report.errors == 1 and sorted(report.reaped) == sorted(set(ids) - {unlucky})
    assert any(unlucky in r.getMessage() and r.exc_info for r in caplog.records)
    # It stays with this janitor's lease: reaped again once that lapses.
    assert ctx.store.get(unlucky).state is JobState.STALLED
    for job_id in ids:
        if job_id != unlucky:
            assert ctx.store.get(job_id).state is JobState.QUEUED


def spilled_and_sent_back(ctx: WorkerContext, dead: DeadWorker, **spec: Any) -> str:
    """A job that spilled once (its worker died) and that an operator sent back."""
    store = ctx.store
    job_id = enqueue_job(store, store.redis, {**SPEC, **spec}).id
    dead.start(job_id, text="once ", tokens=2)
    dead.die()
    assert Janitor(ctx).sweep().outcomes == {job_id: "spilled"}
    store.requeue(job_id, queue="resumeq")
    outbox.complete(store, store.redis, job_id)  # as ``resumeq spill requeue`` does
    return job_id


def test_every_exit_in_one_batch_as_the_gate_decides_for_each_job(
    ctx: WorkerContext, dead: DeadWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, connection = ctx.store, ctx.redis
    again = spilled_and_sent_back(ctx, dead, exit={"on_cut": "spill"})
    # One whose gate (on a view read before an operator's concurrent spill, say) decides
    # to spill again: refused by the store, and failed instead.
    raced = spilled_and_sent_back(ctx, dead, exit={"on_cut": "spill"}, budget_tokens=499)

    def job(**spec: Any) -> str:
        return enqueue_job(store, connection, {**SPEC, **spec}).id

    resume, retry, done = job(), job(), job(budget_tokens=40)
    abandon = job(exit={"on_cut": "abandon", "droppable": True})
    spill = job(exit={"on_cut": "spill"})
    for job_id in (resume, abandon, spill, again, raced):
        dead.start(job_id, text="some text ", tokens=3)
    dead.start(retry)
    dead.start(done, text="all of it ", tokens=40)
    dead.die()
    decide = janitor_decide

    def racing(view: JobView, cut: Cut) -> Decision:
        if view.budget_tokens == 499:
            return Decision(action="spill", reason="raced")
        return decide(view, cut)

    monkeypatch.setattr("resumeq.janitor.reaper.decide", racing)
    report = Janitor(ctx).sweep()
    assert report.errors == 0
    assert report.outcomes == {
        resume: "queued",
        retry: "queued",
        done: "done",
        abandon: "abandoned",
        spill: "spilled",
        again: "failed",
        raced: "failed",
    }
    actions = {resume: "resume", retry: "retry", done: "done", abandon: "abandon",
               spill: "spill", again: "failed", raced: "spill"}  # fmt: skip
    for job_id, action in actions.items():
        assert store.ledger(job_id)[-1]["outcome"] == action
        assert store.ledger(job_id)[-1]["cut"] == "worker_died"
    assert store.get(again).error == "on_cut is spill, after a spill (spill is not a loop)"
    assert store.get(raced).error == "raced, after a spill (spill is not a loop)"
    assert sorted(rq_queue("resumeq", connection).get_job_ids()) == attempt_ids([resume, retry], 2)
    assert rq_queue(SPILL_QUEUE, connection).get_job_ids() == [attempt_rq_id(spill, 2)]
    # RQ's view: a job resumeq failed has its dead attempt failed, with the reason; the
    # others' dead attempts were handed on (canceled); nothing is left started.
    failed = FailedJobRegistry("resumeq", connection=connection)
    assert sorted(failed.get_job_ids()) == attempt_ids([again, raced], 2)
    rq_job = fetch_attempt(connection, again, 2)
    assert rq_job is not None and rq_job.get_status() == JobStatus.FAILED
    result = rq_job.latest_result()
    assert result is not None and "after its worker died: on_cut is spill" in str(result.exc_string)
    assert StartedJobRegistry("resumeq", connection=connection).get_job_ids() == []
    handed_on = [attempt_rq_id(j, 1) for j in (resume, retry, done, abandon, spill)]
    canceled = CanceledJobRegistry("resumeq", connection=connection).get_job_ids()
    assert sorted(handed_on) == sorted(set(canceled) & set(handed_on))


def test_an_enqueue_in_a_batch_writes_what_a_single_enqueue_writes(
    ctx: WorkerContext,
) -> None:
    connection = ctx.redis
    stamps = {b"created_at", b"enqueued_at", b"last_heartbeat"}

    def written(enqueue: Callable[[], object]) -> tuple[dict[bytes, bytes], Any]:
        connection.flushall()
        enqueue()
        fields = connection.hgetall(Job.key_for(attempt_rq_id("j", 1)))
        scheduled = connection.zrange(keys.DUE, 0, -1, withscores=True)
        queued = rq_queue("resumeq", connection).get_job_ids()
        return {k: v for k, v in fields.items() if k not in stamps}, (scheduled, queued)

    later = int(time.time() * 1000) + 30_000
    for due in (DueAttempt("j", "resumeq", 1), DueAttempt("j", "resumeq", 1, due_ms=later)):
        one = partial(enqueue_attempt, connection, "j", queue="resumeq", attempt=1)
        single = written(partial(one, due_ms=due.due_ms))
        assert single == written(partial(enqueue_attempts, connection, [due]))
    # Never twice: a second enqueue of the same attempt is refused, the rest go on.
    answers = enqueue_attempts(
        connection,
        [DueAttempt("j", "resumeq", 1), DueAttempt("k", "resumeq", 1), DueAttempt("x", "bad q", 1)],
    )
    assert answers[:2] == [False, True] and isinstance(answers[2], ValueError)
    assert rq_queue("resumeq", connection).get_job_ids() == [attempt_rq_id("k", 1)]
    assert fetch_attempt(connection, "k", 1) is not None


def test_store_batches_answer_each_job_as_the_single_methods_would(
    ctx: WorkerContext,
) -> None:
    store = ctx.store
    ids = [store.create(SPEC).id for _ in range(4)]
    held = [store.acquire(job_id, worker="w1", ttl_ms=60_000) for job_id in ids]
    for job_id in ids[2:]:
        store.redis.delete(keys.lease(job_id))  # its worker died
    store.redis.hset(keys.job(ids[3]), "revision", "many")
    results = store.reap_many([*ids, "missing"], janitor="j1", ttl_ms=5_000)
    assert [getattr(r, "status", None) for r in results[:3]] == ["alive", "alive", "reaped"]
    assert isinstance(results[3], CorruptRecord)
    assert getattr(results[4], "status", None) == "gone"
    reaped = results[2]
    assert not isinstance(reaped, Exception) and reaped.acquired is not None
    # One write refused (its lease was lost), the others applied.
    answers = store.write_many(
        [
            lambda s: s.release(held[0].lease, to="queued", reason="cut"),
            lambda s: s.release(held[2].lease, to="queued", reason="cut"),
            lambda s: s.flush(
                held[1].lease, expected_revision=held[1].record.revision, delta="abc", tokens=1
            ),
        ]
    )
    assert answers[0] == store.get(ids[0]).revision
    assert isinstance(answers[1], LeaseLost)
    assert answers[2] == store.get(ids[1]).revision and store.text(ids[1]) == "abc"
    assert store.attempt_texts([(ids[1], 1), (ids[0], 0)]) == [(3, "bc"), (0, "")]


def test_a_janitor_killed_after_committing_a_batch_leaves_outboxes_the_next_completes(
    ctx: WorkerContext, dead: DeadWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = streams(dead, 100)
    dead.die()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child: a janitor that dies after its commits
        try:
            failpoints.configure("after_commit=1")
            child = build_context(ctx.settings)
            Janitor(child).sweep()
        finally:
            os._exit(3)  # reached only if the failpoint did not fire
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 137, "the janitor did not die at the failpoint"
    assert all(ctx.store.get(job_id).state is JobState.QUEUED for job_id in ids)
    assert rq_queue("resumeq", ctx.redis).get_job_ids() == []  # died before enqueueing
    monkeypatch.setattr("resumeq.queue.outbox.JANITOR_GRACE_MS", 0)
    with round_trips(monkeypatch) as trips:
        report = Janitor(ctx).sweep()
    assert sorted(report.followed_up) == sorted(ids) and report.reaped == []
    assert trips[0] <= SWEEP_ROUND_TRIPS
    assert sorted(rq_queue("resumeq", ctx.redis).get_job_ids()) == attempt_ids(ids, 2)
    assert all(ctx.store.outbox(job_id) == {} for job_id in ids)
    assert all(len(ctx.store.ledger(job_id)) == 1 for job_id in ids)
