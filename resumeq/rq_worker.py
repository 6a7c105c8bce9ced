"""Start an RQ worker, with RQ's scheduler, on resumeq's queues.

The forking ``rq.Worker`` runs each attempt in a work horse and keeps its own heartbeats
for long jobs; resumeq's lease, not RQ's job timeout, is what detects a dead worker.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis
from rq import Worker
from rq.serializers import JSONSerializer

import resumeq.worker  # noqa: F401 - loaded once here, not in every forked attempt
from resumeq.context import preload
from resumeq.hooks import import_hook_modules
from resumeq.queueing import rq_queue
from resumeq.settings import Settings


class ResumeqWorker(Worker):
    """RQ's forking worker, with two changes.

    It is back within two seconds of Redis coming back: RQ's own backoff between failed
    dequeues doubles up to a minute, which after a Redis restart left queued attempts
    waiting long after every lease-holding worker had recovered. And it tolerates
    Redis-compatible servers whose ``CLIENT INFO`` reply redis-py cannot parse (the
    embedded Redis of ``resumeq demo`` among them).
    """

    max_connection_wait_time = 2.0

    def _set_ip_address(self, connection: redis.Redis) -> None:
        try:
            super()._set_ip_address(connection)
        except ValueError:
            self.ip_address = "unknown"


def make_worker(settings: Settings, queues: Sequence[str] = ()) -> ResumeqWorker:
    """A forking RQ worker on ``queues`` (default: the configured ones), JSON-serialized."""
    import_hook_modules(settings.file.worker.hook_modules)
    preload()
    connection = redis.Redis.from_url(settings.redis_url)
    names = queues or settings.file.worker.queues
    return ResumeqWorker(
        [rq_queue(name, connection) for name in names],
        connection=connection,
        serializer=JSONSerializer,
    )


def run_worker(settings: Settings, queues: Sequence[str] = (), *, burst: bool = False) -> int:
    """Run a worker until it is told to stop (or, with ``burst``, until the queues are empty)."""
    worker = make_worker(settings, queues)
    worker.work(burst=burst, with_scheduler=True, logging_level="INFO")
    return 0
