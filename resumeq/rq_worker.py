"""Start an RQ worker, with RQ's scheduler, on resumeq's queues.

The forking ``rq.Worker`` runs each attempt in a work horse and keeps its own heartbeats
for long jobs; resumeq's lease, not RQ's job timeout, is what detects a dead worker.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import redis
from rq import Worker
from rq.serializers import JSONSerializer

import resumeq.worker  # noqa: F401 - loaded once here, not in every forked attempt
from resumeq.context import preload
from resumeq.errors import ConfigError
from resumeq.hooks import import_hook_modules
from resumeq.queueing import rq_queue
from resumeq.settings import Settings
from resumeq.store import redis_errors


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
    """A forking RQ worker on ``queues`` (default: the configured ones), JSON-serialized.

    Redis is asked first: one that cannot be reached, or refuses the login, is a
    :class:`~resumeq.errors.RedisUnavailable` that says which, raised before RQ starts."""
    import_hook_modules(settings.file.worker.hook_modules)
    preload()
    try:
        connection = redis.Redis.from_url(settings.redis_url)
    except ValueError as exc:
        raise ConfigError(f"invalid Redis URL: {exc}") from None
    names = queues or settings.file.worker.queues
    with redis_errors("worker start"):
        connection.ping()
        return ResumeqWorker(
            [rq_queue(name, connection) for name in names],
            connection=connection,
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


def run_worker(settings: Settings, queues: Sequence[str] = (), *, burst: bool = False) -> int:
    """Run a worker until it is told to stop (or, with ``burst``, until the queues are empty)."""
    worker = make_worker(settings, queues)
    worker.work(burst=burst, with_scheduler=True, logging_level="INFO")
    return 0
