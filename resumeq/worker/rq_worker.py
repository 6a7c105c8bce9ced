"""Start a resumeq worker, with RQ's scheduler, on resumeq's queues.

``resumeq worker`` runs :class:`ResumeqWorker`: one process, up to ``--concurrency``
attempts at once on threads (:mod:`resumeq.worker.concurrent`). :class:`ForkingWorker` is RQ's
forking worker with the same registry rules, for ``rq worker -w
resumeq.worker.rq_worker.ForkingWorker`` (a process per attempt). Either way resumeq's lease, not
RQ's job timeout, is what detects a dead worker.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, NoReturn

import redis
from rq import Queue, Worker
from rq.executions import Execution
from rq.job import Job
from rq.job_lifecycle import call_exception_handlers
from rq.registry import ScheduledJobRegistry, StartedJobRegistry
from rq.serializers import JSONSerializer

import resumeq.worker.attempt  # noqa: F401 - loaded once here, not in every forked attempt
from resumeq.core.errors import ConfigError, JobFailed
from resumeq.core.gate import BACKOFF_CAP_S
from resumeq.core.settings import Settings
from resumeq.queue import due
from resumeq.queue.due import DueScheduler
from resumeq.queue.queueing import (
    SUPERSEDED_OUTCOMES,
    enqueue_overdue,
    is_attempt,
    mark_superseded,
    rq_queue,
)
from resumeq.store import decode, redis_errors
from resumeq.store.capabilities import refused, warning
from resumeq.store.connection import connect
from resumeq.worker.concurrent import ConcurrentWorker
from resumeq.worker.context import build_context, preload, redis_pool_size, set_context
from resumeq.worker.hooks import import_hook_modules

log = logging.getLogger(__name__)

#: How RQ's exception string for a work horse that died begins.
_HORSE_DIED = "Work-horse terminated unexpectedly"


class TruthfulRegistries:
    """What resumeq changes in an RQ worker, concurrent or forking.

    It tolerates Redis-compatible servers whose ``CLIENT INFO`` reply redis-py cannot parse
    (the embedded Redis of ``resumeq demo`` among them). And its registries say what
    became of each attempt, as operators read them (``rq info``): an attempt whose job
    resumeq failed is failed, with the reason (the job function raises JobFailed); an
    attempt whose job was cancelled, or that was fenced out, is canceled; one whose work
    horse died is canceled too — its lease expires and a janitor hands the job on (or
    fails it, and then fails this RQ job with the reason). Everything else is finished: an
    attempt that was cut and handed its job on did its work.
    """

    name: str
    log: Any
    connection: redis.Redis

    def _set_ip_address(self, connection: redis.Redis) -> None:
        ctx = getattr(self, "ctx", None)
        if ctx is not None and not ctx.named:
            # Redis refuses CLIENT SETNAME: RQ would only warn once more of what this
            # worker said at start.
            self.ip_address = "unknown"
            return
        try:
            super()._set_ip_address(connection)  # type: ignore[misc]
        except ValueError:
            self.ip_address = "unknown"

    def handle_job_success(
        self,
        job: Job,
        queue: Queue,
        started_job_registry: StartedJobRegistry,
        execution: Execution,
    ) -> None:
        super().handle_job_success(job, queue, started_job_registry, execution)  # type: ignore[misc]
        if is_attempt(job) and job.return_value() in SUPERSEDED_OUTCOMES:
            mark_superseded(job)

    def handle_exception(self, job: Job, *exc_info: Any) -> None:
        """An attempt whose job resumeq failed is an expected failure: one line with the
        reason resumeq recorded (RQ's failed registry keeps the whole record); anything
        else is a defect, and RQ logs its traceback."""
        exc = exc_info[1] if len(exc_info) > 1 else None
        if not isinstance(exc, JobFailed):
            super().handle_exception(job, *exc_info)  # type: ignore[misc]
            return
        self.log.warning("Worker %s: attempt %s: %s", self.name, job.id, exc)
        call_exception_handlers(self._exc_handlers, job, *exc_info)  # type: ignore[attr-defined]

    def handle_job_failure(
        self,
        job: Job,
        queue: Queue,
        started_job_registry: StartedJobRegistry | None = None,
        exc_string: str = "",
        execution: Execution | None = None,
    ) -> None:
        if not (is_attempt(job) and exc_string.startswith(_HORSE_DIED)):
            super().handle_job_failure(  # type: ignore[misc]
                job, queue, started_job_registry, exc_string, execution
            )
            return
        self.log.warning(
            "Worker %s: attempt %s died (%s): a janitor hands its job on once the lease expires",
            self.name,
            job.id,
            exc_string.rstrip("; "),
        )
        with self.connection.pipeline() as pipe:
            self.cleanup_execution(job, pipeline=pipe, execution=execution)  # type: ignore[attr-defined]
            pipe.execute()
        mark_superseded(job)


class ResumeqWorker(TruthfulRegistries, ConcurrentWorker):
    """The worker ``resumeq worker`` runs: many attempts per process, on threads."""


class ForkingWorker(TruthfulRegistries, Worker):
    """RQ's forking worker: each attempt in a work horse of its own. Back within two
    seconds of Redis coming back (RQ's own backoff between failed dequeues doubles up to a
    minute)."""

    max_connection_wait_time = 2.0

    def work(self, *args: Any, **kwargs: Any) -> bool:
        """RQ's loop, with resumeq's due-time scheduler beside it (in this process only:
        a work horse is forked from the loop's thread and has none)."""
        scheduler = DueScheduler(self.connection, name=f"resumeq-due:{self.name}").start()
        try:
            return bool(super().work(*args, **kwargs))
        finally:
            scheduler.stop()


def make_worker(
    settings: Settings, queues: Sequence[str] = (), *, concurrency: int | None = None
) -> ResumeqWorker:
    """A worker on ``queues`` (default: the configured ones), JSON-serialized, running up
    to ``concurrency`` attempts at once (default: ``[worker] concurrency``).

    Redis is asked first: one that cannot be reached, or refuses the login, is a
    :class:`~resumeq.core.errors.RedisUnavailable` that says which, raised before RQ starts."""
    n = settings.file.worker.concurrency if concurrency is None else concurrency
    if n < 1:
        raise ConfigError(f"--concurrency must be at least 1, not {n}")
    import_hook_modules(settings.file.worker.hook_modules)
    preload()
    try:
        # RQ's own connection (its blocking dequeue among its uses), apart from the store's.
        # A Sentinel URL's client asks the sentinels again at each new connection: RQ's
        # dequeues follow a failover as the store's writes do.
        connection = connect(settings.redis_url, pool_size=redis_pool_size(n), pool_timeout_s=30)
    except ValueError as exc:
        raise ConfigError(f"invalid Redis URL: {exc}") from None
    names = queues or settings.file.worker.queues
    with redis_errors("worker start"):
        connection.ping()
        unnamed = refused(settings.redis_url, ["setname"])
        if unnamed:
            lease_s = settings.file.worker.lease_ttl_ms / 1000
            log.warning(
                warning(
                    "worker",
                    unnamed,
                    "its connections go unnamed, so a janitor cannot see it die: the jobs of "
                    f"a worker that died go on once their leases expire ({lease_s:g} s, "
                    "[worker] lease_ttl_ms), not within a second",
                )
            )
        ctx = build_context(settings, concurrency=n, named=not unnamed)
        set_context(ctx)
        return ResumeqWorker(
            [rq_queue(name, connection) for name in names],
            connection=connection,
            ctx=ctx,
            concurrency=n,
            serializer=JSONSerializer,
        )


def missing_api_keys(
    settings: Settings, environ: Mapping[str, str] | None = None
) -> list[tuple[str, str]]:
    """``(profile, variable)`` for each configured profile whose ``api_key_env`` variable
    is unset or empty here: its requests would go without a key, and fail (401) only when
    a job runs. A worker warns of them and starts all the same: it may serve only some
    profiles, and a key may be meant for other workers."""
    env = os.environ if environ is None else environ
    return [
        (name, profile.api_key_env)
        for name, profile in sorted(settings.file.providers.items())
        if profile.api_key_env is not None and not env.get(profile.api_key_env)
    ]


def run_worker(
    settings: Settings,
    queues: Sequence[str] = (),
    *,
    burst: bool = False,
    concurrency: int | None = None,
) -> int:
    """Run a worker until it is told to stop; with ``burst``, until the queues are empty
    and no attempt waits on them that falls due within the longest backoff resumeq would
    choose (:data:`~resumeq.core.gate.BACKOFF_CAP_S`): a retry it scheduled is waited for and
    run, not left behind. What is scheduled later still is logged, one line each."""
    worker = make_worker(settings, queues, concurrency=concurrency)
    try:
        worker.work(burst=burst, with_scheduler=True, logging_level="INFO")
        while burst and not worker._stop_requested:
            scheduled = scheduled_on(worker.queues)
            if not scheduled:
                break
            due_s = min(at for _, _, at in scheduled)
            wait_s = due_s - time.time()
            if wait_s > BURST_WAIT_S:
                for queue, rq_id, at in scheduled:
                    worker.log.warning(
                        "burst: leaving %s on queue %s, scheduled in %.0f s (at %s)",
                        rq_id, queue.name, at - time.time(),
                        datetime.fromtimestamp(at, tz=UTC).isoformat(timespec="seconds"),
                    )  # fmt: skip
                break
            worker.log.info(
                "burst: waiting %.1f s for %d scheduled attempt(s)",
                max(0.0, wait_s),
                len(scheduled),
            )
            time.sleep(max(0.0, wait_s))
            due.promote_all(worker.connection)
            for queue in worker.queues:
                enqueue_overdue(queue, math.floor(time.time()))
            worker.ctx.close()
            worker = make_worker(settings, queues, concurrency=concurrency)
            worker.work(burst=True, with_scheduler=True, logging_level="INFO")
    finally:
        worker.ctx.close()
    return 0


def exit_now(code: int) -> NoReturn:
    """End the worker process at once, its work done: every attempt handed on or ended,
    its death registered with RQ, its logs flushed. Skips the interpreter's teardown, which
    collects every object the streams left and joins what remains: seconds on a busy
    machine, in the way of a rolling deploy (SIGTERM's exit is promised within 3 s)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


#: The longest a burst worker waits for a scheduled attempt to fall due.
BURST_WAIT_S = BACKOFF_CAP_S


def scheduled_on(queues: Sequence[Queue]) -> list[tuple[Queue, str, float]]:
    """``(queue, RQ job id, due as epoch seconds)`` of every job scheduled on ``queues``:
    in resumeq's due-time index, or RQ's scheduled registries."""
    if not queues:
        return []
    by_name = {queue.name: queue for queue in queues}
    found: list[tuple[Queue, str, float]] = [
        (by_name[name], rq_id, at_ms / 1000.0)
        for name, rq_id, at_ms in due.waiting_on(queues[0].connection, list(by_name))
    ]
    for queue in queues:
        registry = ScheduledJobRegistry(queue=queue)  # type: ignore[no-untyped-call]
        pairs: Any = queue.connection.zrange(registry.key, 0, -1, withscores=True)
        found += [(queue, decode(rq_id), float(score)) for rq_id, score in pairs]
    return found
