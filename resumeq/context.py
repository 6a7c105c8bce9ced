"""What a worker process works with: settings, the store, Redis and an HTTP client.

Built once per process from the environment (``RESUMEQ_REDIS_URL``, ``RESUMEQ_CONFIG``).
RQ's forking worker runs each attempt in a child process: a child builds its own context
(an HTTP connection pool must never be shared across a fork).
"""

from __future__ import annotations

import os
import re
import socket
import ssl
from dataclasses import dataclass

import httpx
import redis

from resumeq.connection import connect
from resumeq.heartbeat import LeaseKeeper
from resumeq.settings import Settings, load_settings
from resumeq.store import Store


@dataclass
class WorkerContext:
    settings: Settings
    store: Store
    redis: redis.Redis
    http: httpx.Client
    #: Who this process is, in fencing tokens and ledger records.
    name: str
    pid: int
    #: Keeps the leases of every attempt this process runs (one thread, started on use).
    leases: LeaseKeeper

    def close(self) -> None:
        """Stop renewing leases, close the HTTP client and the Redis connections."""
        self.leases.close()
        self.http.close()
        self.redis.close()


_CURRENT: WorkerContext | None = None
#: Built once in a worker's parent process and inherited by every forked attempt: loading
#: the CA bundle costs about 0.1 s, too much to pay per attempt.
_SSL_CONTEXT: ssl.SSLContext | None = None


def preload() -> None:
    """Prepare, in a worker's parent process, what each forked attempt would build again."""
    global _SSL_CONTEXT  # noqa: PLW0603 - one per process tree, by design
    if _SSL_CONTEXT is None:
        _SSL_CONTEXT = httpx.create_ssl_context()


def worker_name() -> str:
    host = re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname())[:60] or "host"
    return f"{host}-{os.getpid()}"


def redis_client(settings: Settings) -> redis.Redis:
    """A client that fails fast and never re-sends on its own: a Redis call that hangs
    would hold up the stream, and the checkpointer, the heartbeat and the store re-send
    their writes themselves, recognisably, until the lease would have expired."""
    timeout = max(1.0, settings.file.worker.lease_ttl_ms / 3000)
    return connect(
        settings.redis_url,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        health_check_interval=30,
    )


def build_context(settings: Settings) -> WorkerContext:
    client = redis_client(settings)
    file = settings.file
    store = Store(client, settings=file.store, limits=file.limits)
    return WorkerContext(
        settings=settings,
        store=store,
        redis=client,
        http=httpx.Client(verify=_SSL_CONTEXT or True),
        name=worker_name(),
        pid=os.getpid(),
        leases=LeaseKeeper(store),
    )


def context() -> WorkerContext:
    """This process's context, built from the environment on first use."""
    global _CURRENT  # noqa: PLW0603 - one context per process, by design
    if _CURRENT is None or _CURRENT.pid != os.getpid():
        _CURRENT = build_context(load_settings())
    return _CURRENT


def set_context(ctx: WorkerContext | None) -> None:
    """Use ``ctx`` in this process (tests and the embedded demo)."""
    global _CURRENT  # noqa: PLW0603
    _CURRENT = ctx
