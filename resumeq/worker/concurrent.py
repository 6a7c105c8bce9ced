# RQ's worker and scheduler methods carry no annotations.
# mypy: disable-error-code="no-untyped-call"
"""The concurrent worker: one process runs up to N attempts at once, each in a thread.

A generation stream waits on the network nearly all the time, so a thread per stream costs
a stack's touched pages and little CPU — where RQ's forking worker costs a whole process per
stream. Threads rather than an event loop because the attempt, the checkpointer, the splice
and every provider client are synchronous and proven; ``benchmarks/memory.py`` and
``benchmarks/concurrency.py`` measure the cost against arq's event loop (BENCHMARKS.md).

It is an RQ worker on RQ's own execution records, so RQ's registries tell the truth: each
attempt is one :class:`rq.executions.Execution` (one StartedJobRegistry entry, one execution
heartbeat), finished through ``handle_job_success`` / ``handle_job_failure`` like any RQ job.

- **Dequeue** on the main thread, only while a slot is free; RQ's blocking pop waits at
  most :data:`DEQUEUE_WAIT_S` so that a stop is seen at once.
- **Heartbeats**: RQ's (worker, executions, jobs) every :data:`HEARTBEAT_INTERVAL_S` in one
  pipeline; resumeq's leases from one keeper thread (:mod:`resumeq.worker.heartbeat`).
- **No job timeout**: RQ's SIGALRM timeout works only on the main thread; the lease and the
  provider's read timeout are the deadlines.
- **Schedulers**: resumeq's (:class:`~resumeq.queue.due.DueScheduler`: delayed attempts onto
  their queues to the millisecond) and RQ's (users' own scheduled jobs), each in a thread
  of this process — neither can outlive its worker.
- **Stop**: the first SIGTERM or SIGINT is a *handoff*: no more dequeues, every stream in
  flight is closed, made durable and its job handed back to its queue at once (ledger
  outcome ``handoff``), then the process exits. A second signal is a cold stop: the
  process ends at once, as if killed (the leases expire and a janitor resumes the jobs).
  RQ's ``stop-job`` command cancels that attempt's job, which stops exactly its stream.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import threading
import time
from collections.abc import Sequence
from types import FrameType
from typing import Any

import redis
from redis.typing import EncodableT, FieldT
from rq.command import parse_payload
from rq.exceptions import DequeueTimeout
from rq.job import Job
from rq.queue import Queue
from rq.scheduler import RQScheduler
from rq.timeouts import BaseDeathPenalty
from rq.utils import now
from rq.worker import BaseWorker, WorkerStatus

from resumeq.core.errors import ResumeqError
from resumeq.core.gate import BACKOFF_CAP_S
from resumeq.queue import due
from resumeq.queue.due import DueScheduler
from resumeq.store.capabilities import server_version
from resumeq.worker import heap
from resumeq.worker.context import WorkerContext

log = logging.getLogger(__name__)

#: The longest RQ's blocking pop waits for a job before the loop looks around again (a
#: signal is acted on within it). Whole seconds before Redis 6.
DEQUEUE_WAIT_S = 0.25
#: The pause before the loop tries again when Redis does not answer its bookkeeping.
REDIS_RETRY_S = 0.5
#: RQ's heartbeats for the worker, its executions and their jobs, this often.
HEARTBEAT_INTERVAL_S = 15.0
#: How often the worker publishes its load (:meth:`ConcurrentWorker._publish_load`).
LOAD_INTERVAL_S = 1.0
#: After a handoff began, streams that have not stopped by themselves this soon (a
#: provider that sends nothing for a while) have their connections closed.
INTERRUPT_AFTER_S = 0.2
#: After a handoff began, how long the attempts have to make their text durable and hand
#: their jobs on before the process exits regardless (a lease left behind expires).
HANDOFF_WAIT_S = 2.5
#: At the end, how long the schedulers and RQ's command listener have to stop.
TEARDOWN_WAIT_S = 0.5
#: Freed heap memory is handed back (:mod:`resumeq.worker.heap`) once attempts have started or
#: ended and none has started for this long (a burst of starts is over)...
TRIM_QUIET_S = 1.0
#: ...or, when attempts keep starting, at most this long after the first of them; never
#: twice within :data:`TRIM_MIN_GAP_S`. A trim walks every arena: 10 to 250 ms measured
#: with 200 streams, off the GIL.
TRIM_EVERY_S = 10.0
TRIM_MIN_GAP_S = 2.0
#: A burst worker stays for the delayed attempts bound for its queues that fall due this
#: soon (the longest backoff resumeq chooses); later ones it leaves, and says so.
BURST_DUE_S = BACKOFF_CAP_S
#: How often a burst worker with nothing to do looks for them (seconds).
BURST_LOOK_S = 0.25


def trim_due(turnover: int, since_trim_s: float, since_start_s: float) -> bool:
    """Whether to hand freed heap memory back now: attempts started or ended since the last
    trim (``turnover``), none within :data:`TRIM_MIN_GAP_S`, and either no attempt started
    for :data:`TRIM_QUIET_S` or :data:`TRIM_EVERY_S` passed."""
    if not turnover or since_trim_s < TRIM_MIN_GAP_S:
        return False
    return since_start_s >= TRIM_QUIET_S or since_trim_s >= TRIM_EVERY_S


class NoDeathPenalty(BaseDeathPenalty):
    """No RQ job timeout: SIGALRM cannot reach a thread; the lease is the deadline."""

    def setup_death_penalty(self) -> None:
        pass

    def cancel_death_penalty(self) -> None:
        pass


class ThreadScheduler(RQScheduler):
    """RQ's scheduler on a thread of the worker's process instead of a child process: it
    ends with its worker, however the worker ends (a child forked by RQ keeps running when
    its worker is killed, and keeps its queues' scheduler locks)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> threading.Thread:
        self._status = self.Status.STARTED
        self._stop_requested = False
        self._wake.clear()
        thread = threading.Thread(target=self.work, name="resumeq-scheduler", daemon=True)
        self._thread = thread
        self._process = thread  # type: ignore[assignment] # RQ's maintenance asks it ``is_alive()`` to restart it
        thread.start()
        return thread

    def _install_signal_handlers(self) -> None:
        pass  # the worker's main thread owns the signals

    def work(self) -> None:
        self.log.info(
            "Scheduler for %s started in the worker's process", ", ".join(self._queue_names)
        )
        self.register_birth()
        while not self._stop_requested:
            try:
                if self.should_reacquire_locks:
                    self.acquire_locks()
                self.heartbeat()
                self.enqueue_scheduled_jobs()
            except redis.RedisError as exc:  # Redis away: try again next round
                self.log.warning("scheduler: %s", exc)
            self._wake.wait(self.interval)
        try:
            self.stop()
        except redis.RedisError as exc:
            self.log.warning("scheduler: could not release its locks: %s", exc)

    def request_stop(self, signum: Any = None, frame: Any = None) -> None:
        """Tell the thread to stop (it releases its locks on its way out)."""
        self._stop_requested = True
        self._wake.set()

    def stop_thread(self, timeout_s: float = 5.0) -> None:
        self.request_stop()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=timeout_s)


class ConcurrentWorker(BaseWorker):
    """Runs up to ``concurrency`` attempts at once, each on its own thread (module doc)."""

    death_penalty_class = NoDeathPenalty
    #: Back within two seconds of Redis coming back (RQ's own backoff doubles to a minute).
    max_connection_wait_time = 2.0

    def __init__(
        self,
        queues: Sequence[Queue],
        *,
        connection: redis.Redis,
        ctx: WorkerContext,
        concurrency: int,
        **kwargs: Any,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency}")
        self.ctx = ctx  # before RQ's own start: it names a connection (or not, by ctx)
        super().__init__(list(queues), connection=connection, name=ctx.name, **kwargs)
        self.concurrency = concurrency
        self._slots = threading.Semaphore(concurrency)
        self._lock = threading.Lock()
        self._running: dict[str, Job] = {}  # by execution id, until its thread ends
        self._idle = threading.Condition(self._lock)
        self._cold = False
        self._dequeue_wait_s: float = DEQUEUE_WAIT_S
        self._last_rq_heartbeat = 0.0
        self._last_load = 0.0
        self._last_suspension_check = 0.0
        self._turnover = 0  # attempts started or ended since the last trim
        self._last_start = 0.0
        self._last_trim = time.monotonic()
        self._due: DueScheduler | None = None
        self._server_version: tuple[int, int, int] | None = None
        self._burst_waits_for: set[str] = set()
        self._burst_next_look = 0.0

    # -- what the worker is doing ------------------------------------------------------

    def in_flight(self) -> int:
        with self._lock:
            return len(self._running)

    def get_redis_server_version(self) -> tuple[int, int, int]:
        """RQ asks ``INFO``, which a ``-@dangerous`` ACL denies, and then takes the server
        for Redis 5 (blocking pops in whole seconds); ``HELLO`` answers too."""
        if self._server_version is None:
            self._server_version = server_version(self.connection) or (5, 0, 9)
        return self._server_version

    def get_heartbeat_ttl(self, job: Job, working_time: float = 0.0) -> int:
        return int(HEARTBEAT_INTERVAL_S * 2) + 60

    # -- the loop ----------------------------------------------------------------------

    def work(  # type: ignore[override]
        self,
        burst: bool = False,
        logging_level: str | None = "INFO",
        with_scheduler: bool = True,
        **_: Any,
    ) -> bool:
        """Dequeue and run attempts until told to stop (``burst``: until the queues are
        empty and nothing runs); answers whether any attempt ran."""
        # Before the registration: a worker RQ lists is one a janitor sees beating.
        self.ctx.presence.start()
        self.bootstrap(logging_level)
        version = self.get_redis_server_version()
        if version and version < (6, 0, 0):  # a blocking pop's timeout in whole seconds
            self._dequeue_wait_s = 1
        self.log.info("Worker %s: up to %d attempts at once", self.name, self.concurrency)
        if with_scheduler:
            self._start_scheduler(burst, logging_level)
        ran = 0
        try:
            self._due = DueScheduler(self.connection, name=f"resumeq-due:{self.name}").start()
            self._install_signal_handlers()
            while not self._stop_requested:
                try:
                    started = self._step(burst)
                except (redis.ConnectionError, redis.TimeoutError) as exc:
                    # RQ's bookkeeping (suspension, heartbeats, state) met an outage or a
                    # failover: the attempts in flight ride it out on their own; so does
                    # the loop.
                    self.log.error("Worker %s: cannot reach Redis (%s), retrying", self.name, exc)
                    time.sleep(REDIS_RETRY_S)
                    continue
                if started is None:
                    break
                ran += started
        except SystemExit:
            raise
        except Exception:
            self.log.exception("Worker %s: unhandled error, stopping", self.name)
        finally:
            try:
                self._wind_down()
            finally:
                self.teardown()
        return bool(ran)

    def _step(self, burst: bool) -> int | None:
        """One turn of the loop: start at most one attempt (answers 1 or 0), or None when
        a burst is done."""
        at = time.monotonic()
        if at - self._last_suspension_check >= 1.0:  # ``rq suspend``: a Redis read, once a second
            self._last_suspension_check = at
            self.check_for_suspension(burst)
        if self.should_run_maintenance_tasks:
            self.run_maintenance_tasks()
        self._rq_heartbeats()
        self._publish_load()
        self._trim_memory()
        if self.get_state() == WorkerStatus.BUSY and not self.in_flight():
            self.set_state(WorkerStatus.IDLE)  # ``rq info``: busy exactly while attempts run
        if not self._slots.acquire(timeout=DEQUEUE_WAIT_S):
            return 0
        taken = self._dequeue(block=not burst)
        if taken is not None:
            self._start(*taken)
            return 1
        self._slots.release()
        if burst and not self.in_flight() and not self._due_soon():
            self.log.info("Worker %s: done, quitting", self.name)
            return None
        if burst:  # what runs may queue a continuation: look again when it ends
            self._wait_for_a_change(0.05)
        return 0

    def _dequeue(self, *, block: bool) -> tuple[Job, Queue] | None:
        try:
            result = self.queue_class.dequeue_any(
                self._ordered_queues,
                # RQ hands it to BLPOP, which takes fractions of a second (Redis 6+)
                self._dequeue_wait_s if block else None,  # type: ignore[arg-type]
                connection=self.connection,
                job_class=self.job_class,
                serializer=self.serializer,
                death_penalty_class=self.death_penalty_class,
            )
        except DequeueTimeout:
            return None
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self.log.error("Worker %s: cannot reach Redis (%s), retrying", self.name, exc)
            time.sleep(self.max_connection_wait_time)
            return None
        if result is None:
            return None
        job, queue = result
        self.reorder_queues(reference_queue=queue)
        return job, queue

    def _start(self, job: Job, queue: Queue) -> None:
        try:
            execution = self.prepare_execution(job)
        except BaseException:
            self._slots.release()
            raise
        thread = threading.Thread(
            target=self._execute,
            args=(job, queue, execution),
            name=f"resumeq-attempt:{job.id}",
            daemon=True,
        )
        with self._lock:
            self._running[execution.id] = job
            self._turnover += 1
        self._last_start = time.monotonic()
        self.log.info("Worker %s: %s: %s", self.name, queue.name, job.id)
        thread.start()

    def _execute(self, job: Job, queue: Queue, execution: Any) -> None:
        try:
            self.perform_job(job, queue, execution)
        except Exception:
            self.log.exception(
                "Worker %s: attempt %s raised outside RQ's handling", self.name, job.id
            )
        finally:
            with self._lock:
                self._running.pop(execution.id, None)
                self._turnover += 1
                self._idle.notify_all()
            self._slots.release()

    def _due_soon(self) -> bool:
        """Whether delayed attempts bound for this worker's queues fall due within
        ``BURST_DUE_S``: a burst waits for them. Looked at every ``BURST_LOOK_S``; what is
        due is moved here too, so a burst never waits on a scheduler that is not there."""
        at = time.monotonic()
        if at < self._burst_next_look:
            return bool(self._burst_waits_for)
        self._burst_next_look = at + BURST_LOOK_S
        names = [queue.name for queue in self.queues]
        try:
            due.promote_all(self.connection)
            soon = due.waiting_on(self.connection, names, within_ms=int(BURST_DUE_S * 1000))
        except redis.RedisError as exc:
            self.log.error("Worker %s: cannot reach Redis (%s)", self.name, exc)
            self._burst_waits_for = set()
            return False
        waits_for = {rq_id for _, rq_id, _ in soon}
        if waits_for and waits_for != self._burst_waits_for:
            self.log.info("burst: waiting for %d delayed attempt(s)", len(waits_for))
        self._burst_waits_for = waits_for
        return bool(waits_for)

    def _wait_for_a_change(self, timeout_s: float) -> None:
        with self._idle:
            self._idle.wait(timeout_s)

    def _rq_heartbeats(self, *, force: bool = False) -> None:
        """RQ's heartbeats, in one pipeline: the worker's; and each execution's and its
        job's, so that the StartedJobRegistry keeps exactly the attempts in flight."""
        at = time.monotonic()
        if not force and at - self._last_rq_heartbeat < HEARTBEAT_INTERVAL_S:
            return
        self._last_rq_heartbeat = at
        with self._lock:
            running = list(self._running.items())
        executions = [(self.executions.get(eid), job) for eid, job in running]
        ttl = self.get_heartbeat_ttl(running[0][1]) if running else self.worker_ttl + 60
        state = WorkerStatus.BUSY if running else WorkerStatus.IDLE
        try:
            with self.connection.pipeline() as pipe:
                self.heartbeat(max(ttl, self.worker_ttl + 60), pipeline=pipe)
                self.set_state(state, pipeline=pipe)
                for execution, job in executions:
                    if execution is None:
                        continue  # ended meanwhile
                    execution.heartbeat(job.started_job_registry, ttl, pipeline=pipe)
                    job.heartbeat(now(), ttl, pipeline=pipe, xx=True)
                pipe.execute()
        except redis.RedisError as exc:
            self.log.warning("Worker %s: RQ heartbeat failed: %s", self.name, exc)

    def _trim_memory(self) -> None:
        """Hand freed heap memory back to the system after attempts came and went."""
        at = time.monotonic()
        if not trim_due(self._turnover, at - self._last_trim, at - self._last_start):
            return
        with self._lock:
            self._turnover = 0
        heap.release_free_memory()
        self._last_trim = time.monotonic()

    def _publish_load(self) -> None:
        """Every second, into RQ's hash of this worker (``rq info`` ignores the fields):
        ``resumeq_in_flight`` (attempts running), ``resumeq_lease_lag_ms`` (the worst lateness
        of a lease renewal so far: how far the keeper fell behind under load) and
        ``resumeq_cpu_s`` (the process's CPU time)."""
        at = time.monotonic()
        if at - self._last_load < LOAD_INTERVAL_S:
            return
        self._last_load = at
        fields: dict[FieldT, EncodableT] = {
            "resumeq_in_flight": str(self.in_flight()),
            "resumeq_lease_lag_ms": f"{self.ctx.leases.worst_lag_s * 1000:.1f}",
            "resumeq_cpu_s": f"{time.process_time():.3f}",
        }
        try:
            self.connection.hset(self.key, mapping=fields)
        except redis.RedisError as exc:
            self.log.debug("Worker %s: load not published: %s", self.name, exc)

    # -- stopping ----------------------------------------------------------------------

    def _install_signal_handlers(self) -> None:
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._stop_requested:
            self.log.warning(
                "Worker %s: second signal, cold shut down: %d lease(s) left to expire",
                self.name,
                len(self._running),
            )
            self._cold = True
            # At once, as a SIGKILL would: not one more write (Redis may be what holds the
            # handoff up). The leases expire and a janitor resumes the jobs.
            logging.shutdown()
            os._exit(1)
        self.log.info(
            "Worker %s: %s, handing off %d attempt(s)",
            self.name,
            signal.Signals(signum).name,
            len(self._running),
        )
        self._shutdown_requested_date = now()
        self._stop_requested = True

    def _wind_down(self) -> None:
        """After the loop: hand every attempt in flight on (a stop), or wait for them (the
        queues are empty in burst mode, or the loop failed)."""
        if self._cold:
            return
        if self._stop_requested:
            # Everything alive now lives until the exit: no collection walks it again (a
            # full one over a long-running worker's heap held the GIL for seconds on a
            # busy machine, in the way of the handoff and of the exit).
            gc.freeze()
        if self._stop_requested and self.in_flight():
            begun = self.ctx.handoff.begin()
            self.log.info("Worker %s: handoff of %d stream(s) begun", self.name, begun)
            deadline = time.monotonic() + HANDOFF_WAIT_S
            # Each stream stops after the event it is reading; one that is still waiting
            # for bytes a moment later has its connection closed.
            self._wait_for_attempts(time.monotonic() + INTERRUPT_AFTER_S)
            if not self._cold and self.in_flight():
                closed = self.ctx.handoff.interrupt()
                self.log.info("Worker %s: closed %d quiet stream(s)", self.name, closed)
        else:
            deadline = float("inf")
        left = self._wait_for_attempts(deadline)
        if left and not self._cold:
            self.log.warning(
                "Worker %s: %d attempt(s) did not hand off in time; their leases will expire",
                self.name,
                left,
            )

    def _wait_for_attempts(self, deadline: float) -> int:
        """Until every attempt ended or ``deadline``; answers how many still run."""
        with self._idle:
            while self._running and time.monotonic() < deadline and not self._cold:
                self._idle.wait(min(0.05, max(0.0, deadline - time.monotonic())))
            return len(self._running)

    def teardown(self) -> None:
        """RQ hears of the death first (``rq info`` stops listing the worker), then the
        schedulers and RQ's command listener stop, together, within
        :data:`TEARDOWN_WAIT_S` (their threads end with the process anyway)."""
        self.log.info(
            "Worker %s: worst lease renewal lag %.0f ms",
            self.name,
            self.ctx.leases.worst_lag_s * 1000,
        )
        try:
            self.register_death()
        except redis.RedisError as exc:
            self.log.warning("Worker %s: could not register its death: %s", self.name, exc)
        deadline = time.monotonic() + TEARDOWN_WAIT_S
        scheduler = self.scheduler if isinstance(self.scheduler, ThreadScheduler) else None
        if scheduler is not None:
            scheduler.request_stop()
        if self._due is not None:
            self._due.stop(timeout_s=max(0.1, deadline - time.monotonic()))
        if scheduler is not None:
            scheduler.stop_thread(timeout_s=max(0.1, deadline - time.monotonic()))
        self.unsubscribe()

    def unsubscribe(self) -> None:
        """Stop listening for RQ's commands at once (RQ's own way waits for the listening
        thread's minute-long read to time out, or a second)."""
        thread, pubsub = self.pubsub_thread, getattr(self, "pubsub", None)
        if thread is None or pubsub is None:
            return
        try:
            # redis-py 8 joins the thread in stop() (forever, unless told): not yet, it is
            # the unsubscribe's reply below that wakes it.
            thread.stop(timeout=0)  # type: ignore[call-arg,unused-ignore]
        except TypeError:  # redis-py before 8: stop() only clears the flag
            thread.stop()
        with contextlib.suppress(redis.RedisError):
            pubsub.unsubscribe()  # its reply wakes the listening thread, which sees the stop
        thread.join(timeout=1)
        pubsub.close()
        self.pubsub_thread = None

    def _start_scheduler(
        self, burst: bool = False, logging_level: str | None = "INFO", *_: Any, **__: Any
    ) -> None:
        self.scheduler = ThreadScheduler(
            self.queues,
            connection=self.connection,
            logging_level=logging_level or "INFO",
            serializer=self.serializer,
        )
        self.scheduler.acquire_locks()
        if not self.scheduler.acquired_locks:
            return
        if burst:
            try:
                self.scheduler.register_birth()
                self.scheduler.enqueue_scheduled_jobs()
            finally:
                self.scheduler.release_locks()
                self.scheduler.register_death()
        else:
            self.scheduler.start()

    def stop_scheduler(self) -> None:
        scheduler = self.scheduler
        if isinstance(scheduler, ThreadScheduler):
            scheduler.stop_thread()

    # -- RQ's commands -------------------------------------------------------------------

    def handle_payload(self, message: Any) -> None:
        """RQ's ``stop-job`` and ``stop-execution`` stop exactly that attempt (below); the
        other commands as RQ does (``shutdown`` is a handoff)."""
        payload = parse_payload(message)
        command = payload.get("command")
        if command == "stop-job":
            self._stop_attempts(job_id=payload.get("job_id"))
        elif command == "stop-execution":
            self._stop_attempts(execution_id=payload.get("execution_id"))
        elif command == "kill-horse":
            self.log.info("Worker %s: no work horse to kill (attempts run on threads)", self.name)
        else:
            super().handle_payload(message)

    def request_stop_execution(self, execution_id: str) -> None:
        self._stop_attempts(execution_id=execution_id)

    def _stop_attempts(self, *, job_id: str | None = None, execution_id: str | None = None) -> None:
        """Cancel the job of the attempt with that RQ job or execution id: its stream stops
        at its next write, and no other."""
        with self._lock:
            jobs = [
                job
                for eid, job in self._running.items()
                if eid == execution_id or (job_id is not None and job.id == job_id)
            ]
        if not jobs:
            self.log.warning(
                "Worker %s: not running %s, command ignored", self.name, job_id or execution_id
            )
            return
        for job in jobs:
            try:
                self.ctx.store.cancel(str(job.args[0]), reason="stopped by an RQ stop command")
            except (ResumeqError, IndexError) as exc:
                self.log.warning("Worker %s: could not stop %s: %s", self.name, job.id, exc)
