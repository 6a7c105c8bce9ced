"""Start an RQ worker, with RQ's scheduler, on resumeq's queues.

The forking ``rq.Worker`` runs each attempt in a work horse and keeps its own heartbeats
for long jobs; resumeq's lease, not RQ's job timeout, is what detects a dead worker.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis
from rq import Queue, Worker

from resumeq.settings import Settings
from resumeq.store import check_queue


def make_worker(settings: Settings, queues: Sequence[str] = ()) -> Worker:
    names = [check_queue(q) for q in (queues or settings.file.worker.queues)]
    connection = redis.Redis.from_url(settings.redis_url)
    return Worker([Queue(name, connection=connection) for name in names], connection=connection)


def run_worker(settings: Settings, queues: Sequence[str] = (), *, burst: bool = False) -> int:
    """Run a worker until it is told to stop (or, with ``burst``, until the queues are empty)."""
    worker = make_worker(settings, queues)
    worker.work(burst=burst, with_scheduler=True, logging_level="INFO")
    return 0
