"""What a worker process works with: settings, the store, Redis and the HTTP clients.

Built once per process from the environment (``RESUMEQ_REDIS_URL``, ``RESUMEQ_CONFIG``) and
shared by every attempt the process runs at once (:mod:`resumeq.worker.concurrent`): one Redis
pool and one HTTP client per provider profile, each bounded and sized from the worker's
concurrency. A forked child (RQ's forking worker runs each attempt in one) builds its own
context: an HTTP connection pool must never be shared across a fork.
"""

from __future__ import annotations

import itertools
import os
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import redis

from resumeq.core import names
from resumeq.core.identity import process_name
from resumeq.core.settings import ProviderProfile, Settings, load_settings
from resumeq.providers.pacing import FULL_AT, paced_transport
from resumeq.store import Store
from resumeq.store.calibrations import Calibrations
from resumeq.store.connection import connect
from resumeq.store.presence import Presence
from resumeq.worker.checkpoint import IdleFlusher
from resumeq.worker.heartbeat import LeaseKeeper


class HttpClients:
    """One HTTP client per provider profile (one TLS context, one connection pool each),
    made on first use. A pool holds at most the profile's ``max_connections`` (by default
    the worker's concurrency): a stream that finds every connection busy waits for one —
    it never fails for it. Connections are paced by ``read_pause_ms``
    (:mod:`resumeq.providers.pacing`) and can be drained at a handoff."""

    def __init__(
        self, concurrency: int = 1, *, read_pause_ms: int = 0, only: httpx.Client | None = None
    ) -> None:
        self.concurrency = concurrency
        self.read_pause_ms = read_pause_ms
        self._only = only
        self._clients: dict[str, httpx.Client] = {}
        self._lock = threading.Lock()

    @classmethod
    def only(cls, client: httpx.Client) -> HttpClients:
        """Every profile uses ``client`` (tests answer some endpoints by hand)."""
        return cls(only=client)

    def get(self, name: str, profile: ProviderProfile) -> httpx.Client:
        if self._only is not None:
            return self._only
        with self._lock:
            client = self._clients.get(name)
            if client is None:
                size = profile.max_connections or self.concurrency
                # HTTP/1.1 (benchmarks/http2.py: HTTP/2 costs the same CPU per token, and
                # httpx's shares one connection badly between threads); every connection
                # kept alive a minute, so a continuation reuses one (no new TLS handshake)
                limits = httpx.Limits(
                    max_connections=size, max_keepalive_connections=size, keepalive_expiry=60
                )
                verify = _SSL_CONTEXT or True
                transport = paced_transport(
                    self.read_pause_ms / 1000, verify=verify, limits=limits, full_at=FULL_AT
                )
                client = httpx.Client(verify=verify, limits=limits, transport=transport)
                self._clients[name] = client
            return client

    def close(self) -> None:
        with self._lock:
            clients = [*self._clients.values(), *([self._only] if self._only else [])]
            self._clients.clear()
        for client in clients:
            client.close()


class Handoff:
    """A worker's shutdown, as its attempts see it: once :meth:`begin` is called, every
    attempt in flight (and any that starts after) stops streaming, makes what it received
    durable and hands its job back to its queue at once (SPEC §16)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._stops: dict[int, Callable[[], None]] = {}
        self._ids = itertools.count(1)

    def is_set(self) -> bool:
        return self._event.is_set()

    def watch(self, stop: Callable[[], None]) -> int:
        """Call ``stop`` (quick: close a socket) on :meth:`interrupt`; answers a token for
        :meth:`unwatch`."""
        with self._lock:
            token = next(self._ids)
            self._stops[token] = stop
        return token

    def unwatch(self, token: int) -> None:
        with self._lock:
            self._stops.pop(token, None)

    def begin(self) -> int:
        """Start the handoff: each stream stops after the event it is reading (what arrived
        is kept: it was paid for); answers how many attempts were streaming."""
        with self._lock:
            self._event.set()
            return len(self._stops)

    def interrupt(self) -> int:
        """Close every stream that has not stopped yet (one waiting on a provider that
        sends nothing); answers how many."""
        with self._lock:
            stops = list(self._stops.values())
        for stop in stops:
            stop()
        return len(stops)


@dataclass
class WorkerContext:
    settings: Settings
    store: Store
    redis: redis.Redis
    http: HttpClients
    #: Who this process is, in RQ, in fencing tokens and ledger records
    #: (:func:`resumeq.core.identity.process_name`: unique per incarnation).
    name: str
    pid: int
    #: Keeps the leases of every attempt this process runs (one thread, started on use).
    leases: LeaseKeeper
    #: This process's presence beat (one thread, started by the worker's loop and before
    #: any lease is taken; a janitor's is never started).
    presence: Presence
    #: The exact counts each profile and model was seen to give (calibrated estimates).
    calibrations: Calibrations
    #: Whether its connections carry its name (False where Redis refuses CLIENT SETNAME).
    named: bool = True
    handoff: Handoff = field(default_factory=Handoff)
    #: Flushes the checkpoints of streams whose provider went quiet (one thread, on use).
    idle: IdleFlusher = field(default_factory=IdleFlusher)

    def close(self) -> None:
        """Stop renewing leases, flushing and beating, close the HTTP clients and the Redis
        connections."""
        self.idle.close()
        self.leases.close()
        self.presence.close()
        self.http.close()
        self.redis.close()
        for other in (self.leases.store.redis, self.presence.client):
            if other is not self.redis:
                other.close()


_CURRENT: WorkerContext | None = None
#: Built once in a worker's parent process and inherited by every forked attempt: loading
#: the CA bundle costs about 0.1 s, too much to pay per attempt.
_SSL_CONTEXT: ssl.SSLContext | None = None


def preload() -> None:
    """Prepare, in a worker's parent process, what each forked attempt would build again."""
    global _SSL_CONTEXT  # noqa: PLW0603 - one per process tree, by design
    if _SSL_CONTEXT is None:
        _SSL_CONTEXT = httpx.create_ssl_context()


def redis_pool_size(concurrency: int) -> int:
    """Connections for ``concurrency`` attempts at once: one per attempt, up to 512, and
    8 for the worker's own bookkeeping (the lease keeper has a connection of its own).
    A checkpoint holds its connection for one round trip, but under a saturated interpreter
    lock a thread that sent its command holds the connection until it gets the lock back
    to read the reply: at 500 streams a pool of 72 ran dry (1,868 waits past the pool's
    timeout in 10 s, each a failed flush, and late lease renewals behind them;
    BENCHMARKS.md §7). Connections open on demand, so a quiet worker holds few."""
    return min(concurrency, 512) + 8


def redis_client(
    settings: Settings,
    *,
    concurrency: int = 1,
    pool_size: int | None = None,
    client_name: str | None = None,
) -> redis.Redis:
    """A client that fails fast and never re-sends on its own: a Redis call that hangs
    would hold up the stream, and the checkpointer, the heartbeat and the store re-send
    their writes themselves, recognisably, until the lease would have expired. Its pool is
    bounded (:func:`redis_pool_size`); a caller that finds every connection busy waits
    for one, up to the same timeout. ``client_name``: what each of its connections is
    called (set again on every reconnect; :func:`resumeq.store.names.worker_client_name` for a
    worker's: the janitor knows a worker died when none is left)."""
    timeout = max(1.0, settings.file.worker.lease_ttl_ms / 3000)
    return connect(
        settings.redis_url,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        health_check_interval=30,
        pool_size=pool_size or redis_pool_size(concurrency),
        pool_timeout_s=timeout,
        client_name=client_name,
    )


def build_context(settings: Settings, *, concurrency: int = 1, named: bool = True) -> WorkerContext:
    """The context of a worker process. ``named``: its connections carry its name (what
    liveness reads); False for a janitor's (it holds no leases), and where Redis refuses
    ``CLIENT SETNAME`` (:mod:`resumeq.store.capabilities`)."""
    name = process_name()
    client_name = names.worker_client_name(name) if named else None
    client = redis_client(settings, concurrency=concurrency, client_name=client_name)
    file = settings.file
    store = Store(client, settings=file.store, limits=file.limits)
    # The lease keeper renews on a connection of its own: checkpoints queueing for the
    # shared pool never hold up a renewal (a late renewal is a lost lease); so does the
    # presence beat, which a reset must never find waiting behind anything.
    renewing = Store(
        redis_client(settings, pool_size=1, client_name=client_name),
        settings=file.store,
        limits=file.limits,
    )
    beat = redis_client(settings, pool_size=1, client_name=client_name)
    return WorkerContext(
        settings=settings,
        store=store,
        redis=client,
        http=HttpClients(concurrency, read_pause_ms=file.worker.read_pause_ms),
        name=name,
        pid=os.getpid(),
        leases=LeaseKeeper(renewing),
        presence=Presence(beat, name),
        calibrations=Calibrations(client),
        named=named,
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
