"""What must follow a commit survives the committer: hooks, the next attempt (with its due
time), the spill lane's enqueue. Crash injection at each step between a commit and its
follow-up (a forked process dies at a failpoint), a Redis stall that makes the client send
again, and the janitor carrying out what was left. A real redis-server throughout."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from rq.job import JobStatus

from resumeq.core import failpoints
from resumeq.core.gate import Decision
from resumeq.core.models import Acquired
from resumeq.core.settings import ConfigFile, Settings, WorkerSettings
from resumeq.janitor.sweep import Janitor
from resumeq.queue import due
from resumeq.queue.queueing import attempt_rq_id, fetch_attempt, hook_rq_id, rq_queue
from resumeq.store import SPILL_QUEUE, keys
from resumeq.testing import RedisServer
from resumeq.worker.checkpoint import Checkpointer
from resumeq.worker.context import WorkerContext, build_context, set_context
from resumeq.worker.exits import apply_decision
from resumeq.worker.hooks import HookCall, hook, run_hook

pytestmark = pytest.mark.timeout(60)

SPEC = {"prompt": "p", "provider": "x", "model": "m", "budget_tokens": 500}


@pytest.fixture
def ctx(redis_server: RedisServer, redis_client: redis.Redis) -> Iterator[WorkerContext]:
    settings = Settings(
        redis_url=redis_server.url, file=ConfigFile(worker=WorkerSettings(lease_ttl_ms=3000))
    )
    context = build_context(settings)
    try:
        yield context
    finally:
        context.close()


CALLS: list[str] = []


@hook("notify")
def _notify(call: HookCall) -> None:
    CALLS.append(call.job_id)


@pytest.fixture(autouse=True)
def hooks_here(ctx: WorkerContext) -> Iterator[None]:
    """Hooks run in this process, on this context."""
    CALLS.clear()
    set_context(ctx)
    try:
        yield
    finally:
        set_context(None)


@pytest.fixture
def janitor(ctx: WorkerContext, monkeypatch: pytest.MonkeyPatch) -> Janitor:
    monkeypatch.setattr("resumeq.queue.outbox.JANITOR_GRACE_MS", 0)
    return Janitor(ctx)


def running(ctx: WorkerContext, **over: Any) -> Acquired:
    job_id = ctx.store.create({**SPEC, **over}).id
    ctx.store.outbox_done(job_id, "attempt", ctx.store.outbox(job_id)["attempt"])  # enqueued
    got = ctx.store.acquire(job_id, worker="w1", ttl_ms=3000)
    ctx.store.flush(got.lease, expected_revision=got.record.revision, delta="the answer", tokens=2)
    return got


def die_at(point: str, ctx: WorkerContext, got: Acquired, decision: Decision) -> None:
    """Apply ``decision`` in a forked process that dies at failpoint ``point``."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            failpoints.configure(f"{point}=1")
            child = build_context(ctx.settings)
            apply_decision(child.store, child.redis, got.lease, got.record, decision, ledger={})
        finally:
            os._exit(3)  # reached only if the failpoint did not fire
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 137, "the child did not die at the failpoint"


DONE = Decision(action="done", reason="finish reason stop")


@pytest.mark.parametrize("point", failpoints.NAMES)
def test_hooks_run_once_whatever_step_the_worker_dies_at(
    point: str, ctx: WorkerContext, janitor: Janitor
) -> None:
    got = running(ctx, hooks=["notify"])
    job_id = got.lease.job_id
    die_at(point, ctx, got, DONE)
    assert ctx.store.get(job_id).state.value == "done"
    assert ctx.store.outbox(job_id)  # the hook is still owed
    report = janitor.sweep()
    queue = rq_queue("resumeq", ctx.redis)
    assert queue.fetch_job(hook_rq_id(job_id, "notify")) is not None
    assert [j for j in queue.get_job_ids() if "hook" in j] == [hook_rq_id(job_id, "notify")]
    assert janitor.sweep().followed_up == []  # nothing is enqueued twice
    assert report.followed_up in ([job_id], [])  # (the dying worker may have enqueued it)
    assert run_hook(job_id, "notify") == "ok" and [job_id] == CALLS
    assert ctx.store.outbox(job_id) == {}  # it ran: owed no more
    assert run_hook(job_id, "notify") == "done" and [job_id] == CALLS  # never twice


def test_a_hook_whose_worker_died_while_it_ran_runs_again(
    ctx: WorkerContext, janitor: Janitor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the chaos soak: the hook's RQ job stayed "started" (later failed as
    abandoned) and nothing enqueued it again."""
    got = running(ctx, hooks=["notify"])
    job_id = got.lease.job_id
    apply_decision(ctx.store, ctx.redis, got.lease, got.record, DONE, ledger={})
    queue = rq_queue("resumeq", ctx.redis)
    rq_job = queue.fetch_job(hook_rq_id(job_id, "notify"))
    assert rq_job is not None
    # The run took the hook's lease and its RQ job started; then its worker was killed.
    assert ctx.store.claim_hook(job_id, "notify", token="dead-run", ttl_ms=400) == "ok"
    queue.remove(rq_job)
    rq_job.set_status(JobStatus.STARTED)
    rq_job.started_at = datetime.now(UTC) - timedelta(seconds=60)
    rq_job.save()
    assert janitor.sweep().followed_up == []  # its lease still holds: in progress
    time.sleep(0.5)
    monkeypatch.setattr("resumeq.queue.outbox_hooks.STARTED_GRACE_S", 5)
    assert janitor.sweep().followed_up == [job_id]  # lease lapsed, started long ago: died
    assert queue.get_job_ids() == [hook_rq_id(job_id, "notify")]
    assert ctx.store.outbox(job_id) == {"hook:notify": "resumeq|1"}
    assert run_hook(job_id, "notify") == "ok" and [job_id] == CALLS
    assert ctx.store.outbox(job_id) == {}


def test_a_retry_after_survives_a_crash_and_keeps_its_due_time(
    ctx: WorkerContext, janitor: Janitor
) -> None:
    """Before: the janitor re-enqueued such a job at once, without its Retry-After."""
    got = running(ctx)
    job_id = got.lease.job_id
    die_at("after_commit", ctx, got, Decision(action="retry", reason="429", delay_s=30.0))
    assert ctx.store.get(job_id).state.value == "queued"
    janitor.sweep()
    job = fetch_attempt(ctx.redis, job_id, 2)
    assert job is not None and job.get_status() == JobStatus.SCHEDULED
    (due_ms,) = due.due_at(ctx.redis, [job.id])
    assert due_ms is not None and 29_000 <= due_ms - time.time() * 1000 <= 30_100
    assert rq_queue("resumeq", ctx.redis).get_job_ids() == []  # not on the queue yet


def test_a_spill_survives_a_crash(ctx: WorkerContext, janitor: Janitor) -> None:
    got = running(ctx)
    job_id = got.lease.job_id
    die_at("after_commit", ctx, got, Decision(action="spill", reason="below the floor"))
    assert ctx.store.get(job_id).state.value == "spilled"
    janitor.sweep()
    assert rq_queue(SPILL_QUEUE, ctx.redis).get_job_ids() == [attempt_rq_id(job_id, 2)]


def test_a_resume_survives_a_crash(ctx: WorkerContext, janitor: Janitor) -> None:
    got = running(ctx)
    job_id = got.lease.job_id
    die_at("after_follow_up", ctx, got, Decision(action="resume", reason="cut"))
    janitor.sweep()
    assert rq_queue("resumeq", ctx.redis).get_job_ids() == [attempt_rq_id(job_id, 2)]


def stalled(ctx: WorkerContext, seconds: float, during: Callable[[], Any]) -> Any:
    """Run ``during`` while Redis sleeps for ``seconds`` (longer than the client waits)."""
    admin = redis.Redis.from_url(ctx.settings.redis_url, socket_timeout=30)
    done = threading.Event()

    def sleep() -> None:
        admin.execute_command("DEBUG", "SLEEP", str(seconds))
        done.set()

    thread = threading.Thread(target=sleep)
    thread.start()
    time.sleep(0.1)
    try:
        return during()
    finally:
        thread.join()
        admin.close()
        assert done.is_set()


def test_a_finish_sent_again_during_a_stall_is_recognised(ctx: WorkerContext) -> None:
    """Before: redis-py re-sent it; the second send answered lease_lost although the job
    was done, and its hooks were never enqueued."""
    got = running(ctx, hooks=["notify"])
    job_id = got.lease.job_id
    timeout = ctx.redis.connection_pool.connection_kwargs["socket_timeout"]
    state = stalled(
        ctx,
        timeout + 0.6,
        lambda: apply_decision(ctx.store, ctx.redis, got.lease, got.record, DONE, ledger={}),
    )
    assert state == "done" and ctx.store.get(job_id).state.value == "done"
    assert rq_queue("resumeq", ctx.redis).fetch_job(hook_rq_id(job_id, "notify")) is not None
    assert list(ctx.store.outbox(job_id)) == ["hook:notify"]  # owed until it has run


def test_a_flush_sent_again_after_a_stall_is_applied_once(ctx: WorkerContext) -> None:
    """Before: redis-py re-sent the applied flush, the checkpointer saw a stale revision on
    what it took for its first try, and aborted the attempt."""
    got = running(ctx)
    before = ctx.store.get(got.lease.job_id).revision
    ckpt = Checkpointer(ctx.store, got.lease, revision=before, flush_tokens=100, flush_ms=60_000)
    ckpt.add(" more", 1, exact=True)
    timeout = ctx.redis.connection_pool.connection_kwargs["socket_timeout"]
    assert stalled(ctx, timeout + 0.6, ckpt.flush) is False  # no answer: kept, maybe applied
    assert ckpt.flush() is True  # sent again: it had been applied, and says so
    assert ctx.store.text(got.lease.job_id) == "the answer more"
    assert ctx.store.get(got.lease.job_id).revision == before + 1 == ckpt.revision


def test_an_acquire_sent_again_during_a_stall_holds_the_lease(ctx: WorkerContext) -> None:
    """Before: the re-send answered "already running" and the attempt was skipped."""
    job_id = ctx.store.create(SPEC).id
    timeout = ctx.redis.connection_pool.connection_kwargs["socket_timeout"]
    got = stalled(ctx, timeout + 0.6, lambda: ctx.store.acquire(job_id, worker="w1", ttl_ms=3000))
    assert got.record.state.value == "running" and got.record.attempt == 1
    assert ctx.redis.get(keys.lease(job_id)) == got.lease.token.encode()
