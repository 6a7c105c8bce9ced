"""Delayed attempts: resumeq's own due-time index, to the millisecond.

RQ's scheduler keeps whole seconds and looks once a second, from one worker: an attempt
delayed by a provider's ``retry-after-ms: 300`` would start up to two seconds late, and a
job's answer with it. resumeq keeps its delayed attempts in one sorted set of its own
(:data:`~resumeq.store.keys.DUE`), each RQ job id scored by the time it falls due, and moves each
onto the front of its queue when that time comes, in one script (:func:`promote`): the
attempt waited already, and goes before work that has not started.

Never early: the due time is set, and compared, on Redis's clock, never a worker's.

Who moves them: every worker process runs a :class:`DueScheduler` thread, which sleeps
until the earliest due time it knows of (a second at most) and is woken when an attempt
is scheduled (:func:`resumeq.queue.attempt_jobs.write` puts one into the index). Redis times
blocking calls out only every 100 ms (``hz`` 10), so the last
stretch before a due time is slept locally. Any number of schedulers can serve one Redis:
each move is atomic and happens once. The janitor moves what is due at every sweep too,
so that attempts are never stranded while no worker runs.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Sequence
from importlib import resources
from typing import Any, cast

import redis
from redis.commands.core import Script
from rq.job import Job
from rq.queue import Queue
from rq.utils import now, utcformat

from resumeq.queue.attempt_jobs import nudge
from resumeq.store import SPILL_QUEUE, decode, keys
from resumeq.store.capabilities import server_version

log = logging.getLogger(__name__)

#: A scheduler looks at the index at least this often (seconds).
POLL_S = 1.0
#: Redis times blocking calls out on its 100 ms tick: a blocking wait ends this long before
#: a due time, and the rest is slept on this process's own clock.
BLOCK_SLACK_S = 0.15
#: The most attempts one move takes at once.
MOVE_LIMIT = 500


def _script(name: str) -> Script:
    source = resources.files("resumeq.store.scripts").joinpath(f"{name}.lua").read_bytes()
    # Always called with its client: none is registered here.
    return Script(cast(Any, None), source)


_PROMOTE = _script("due_promote")


def promote(connection: redis.Redis, *, limit: int = MOVE_LIMIT) -> tuple[int, int | None, int]:
    """Move every attempt that is due onto its queue (at most ``limit``). Answers how many
    moved, when the next one falls due (None: none waits) and Redis's time (ms)."""
    moved, head, now_ms = _PROMOTE(
        keys=[keys.DUE],
        args=[
            Job.redis_job_namespace_prefix,
            Queue.redis_queue_namespace_prefix,
            utcformat(now()),
            limit,
            SPILL_QUEUE,
        ],
        client=connection,
    )
    head = decode(head)
    return int(moved), int(float(head)) if head else None, int(now_ms)


def promote_all(connection: redis.Redis) -> int:
    """:func:`promote` until nothing due is left; answers how many moved."""
    total = 0
    while True:
        moved, _, _ = promote(connection)
        total += moved
        if moved < MOVE_LIMIT:
            return total


def due_at(connection: redis.Redis, rq_ids: Sequence[str]) -> list[int | None]:
    """When each RQ job falls due (ms), or None where it is not in the index."""
    if not rq_ids:
        return []
    scores = connection.zmscore(keys.DUE, list(rq_ids))
    return [None if s is None else int(s) for s in scores]


def waiting_on(
    connection: redis.Redis, queues: Sequence[str], *, within_ms: int | None = None
) -> list[tuple[str, str, int]]:
    """``(queue, RQ job id, due ms)`` of the attempts in the index bound for ``queues``
    (those due within ``within_ms`` of Redis's time, if given; at most ``MOVE_LIMIT``)
    whose RQ job still waits (an entry left by a deleted job is no attempt)."""
    if within_ms is None:
        horizon: str | int = "+inf"
    else:
        seconds, micros = connection.time()
        horizon = int(seconds) * 1000 + int(micros) // 1000 + within_ms
    entries: Any = connection.zrangebyscore(
        keys.DUE, "-inf", horizon, start=0, num=MOVE_LIMIT, withscores=True
    )
    if not entries:
        return []
    with connection.pipeline(transaction=False) as pipe:
        for rq_id, _ in entries:
            pipe.hmget(Job.key_for(decode(rq_id)), "status", "origin")
        fields = pipe.execute()
    wanted = set(queues)
    return [
        (decode(origin), decode(rq_id), int(score))
        for (rq_id, score), (status, origin) in zip(entries, fields, strict=True)
        if status == b"scheduled" and origin is not None and decode(origin) in wanted
    ]


class DueScheduler:
    """A thread that moves attempts onto their queues as they fall due (module doc)."""

    def __init__(self, connection: redis.Redis, *, name: str = "resumeq-due") -> None:
        self.connection = connection
        self.name = name
        self._stop = threading.Event()
        self._stop_key = keys.due_stop(uuid.uuid4().hex)
        self._thread: threading.Thread | None = None
        #: Blocking waits take fractions of a second from Redis 6 on; before, only local
        #: sleeps are used (and an attempt scheduled elsewhere waits for the next look).
        self._can_block = True
        self.moved = 0
        # A blocking wait ends well inside the client's socket timeout, if it has one.
        socket_timeout = connection.connection_pool.connection_kwargs.get("socket_timeout")
        self._block_limit_s = float(socket_timeout) - 0.3 if socket_timeout else POLL_S

    def start(self) -> DueScheduler:
        try:
            version = server_version(self.connection)
            self._can_block = version is None or version >= (6, 0, 0)
        except redis.RedisError:
            pass
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop the thread and wait for it (its blocking wait is woken through its own key)."""
        self._stop.set()
        nudge().set()
        thread, self._thread = self._thread, None
        if thread is None:
            return
        try:
            with self.connection.pipeline() as pipe:
                pipe.lpush(self._stop_key, "1")
                pipe.expire(self._stop_key, 10)
                pipe.execute()
        except redis.RedisError:
            pass  # it is not blocked in Redis either, then; it notices within a second
        thread.join(timeout_s)
        with contextlib.suppress(redis.RedisError):
            self.connection.delete(self._stop_key)

    def _run(self) -> None:
        failed = 0
        while not self._stop.is_set():
            nudge().clear()  # what is scheduled from here on is either read below, or wakes us
            try:
                moved, next_due, now_ms = promote(self.connection)
                self.moved += moved
                if moved:
                    log.debug("%s: %d delayed attempt(s) moved onto their queues", self.name, moved)
                wait_s = POLL_S if next_due is None else (next_due - now_ms) / 1000.0
                self._wait(min(POLL_S, max(0.0, wait_s)))
                failed = 0
            except Exception as exc:  # never dies: a dead scheduler strands delayed attempts
                failed += 1
                if failed == 1:
                    unreachable = isinstance(exc, redis.RedisError)
                    log.log(
                        logging.WARNING if unreachable else logging.ERROR,
                        "%s: %s (%s); trying again",
                        self.name,
                        "cannot reach Redis" if unreachable else "failed",
                        exc,
                        exc_info=not unreachable,
                    )
                self._stop.wait(min(POLL_S, 0.1 * failed))

    def _wait(self, wait_s: float) -> None:
        """Until ``wait_s`` has passed, an attempt was scheduled, or the stop."""
        if wait_s <= 0:
            return
        block_s = min(wait_s - BLOCK_SLACK_S, self._block_limit_s)
        if self._can_block and block_s > 0.01:
            # Woken by the stop, or a schedule anywhere (one token: one scheduler looks;
            # the stop key first, so that a stopping scheduler leaves the token).
            self.connection.blpop([self._stop_key, keys.DUE_WAKE], timeout=block_s)
            return
        nudge().wait(wait_s)
