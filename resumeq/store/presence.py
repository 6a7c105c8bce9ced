"""A worker process's presence: the janitor's second sign that it lives (SPEC §21).

The first sign is its Redis connections (:mod:`resumeq.core.liveness`): a process that dies
loses them at once. But a live worker can lose them too — ``CLIENT KILL``, a load
balancer's idle reset — and while its provider is quiet nothing would make it reconnect:
no checkpoint is due, and leases renew every third of their TTL. So every worker process
keeps one key, :func:`resumeq.store.keys.presence`, set again every :data:`BEAT_S` on a connection
of its own, each time with a TTL of :data:`TTL_MS`. A beat that finds its connection reset
opens another at once: a live worker's beat shows it again within a tenth of a second of a
reset, both in ``CLIENT LIST`` and in its key.

A janitor takes a worker for dead only when both signs are gone: none of its connections
at two looks ``liveness_interval_ms`` apart, *and* its presence key expired — about six
beats in a row missed. A process that dies meets both within about half a second; a live
one whose connections were reset would have to miss six beats as well (its beat thread
starved for half a second), and even then the fence keeps the guess harmless.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Collection

import redis

from resumeq.store import keys

log = logging.getLogger(__name__)

#: How often a worker process sets its presence key again.
BEAT_S = 0.1
#: How long one beat keeps the key: six beats.
TTL_MS = 600


class Presence:
    """One worker process's beat (a thread, started on first use)."""

    def __init__(
        self, client: redis.Redis, worker: str, *, beat_s: float = BEAT_S, ttl_ms: int = TTL_MS
    ) -> None:
        self.client = client
        self.worker = worker
        self.key = keys.presence(worker)
        self.beat_s = beat_s
        self.ttl_ms = ttl_ms
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._failing = False

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Beat from now on; the first beat is written before this returns (a lease taken
        after it is never held by a worker that shows no presence). Safe to call again."""
        with self._lock:
            if self._thread is not None or self._stop.is_set():
                return
            self._beat()
            self._thread = threading.Thread(target=self._run, name="resumeq-presence", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.beat_s):
            self._beat()

    def _beat(self) -> None:
        for again in (True, False):
            try:
                self.client.set(self.key, b"1", px=self.ttl_ms)
            except redis.ConnectionError as exc:
                if again:  # reset (CLIENT KILL, a proxy): a new connection, at once
                    continue
                self._failed(exc)
            except redis.RedisError as exc:
                self._failed(exc)
            else:
                if self._failing:
                    self._failing = False
                    log.info("worker %s: presence beats go through again", self.worker)
            return

    def _failed(self, exc: Exception) -> None:
        if not self._failing:
            self._failing = True
            log.warning(
                "worker %s: presence beat failed (%s); trying again every %.1f s",
                self.worker,
                exc,
                self.beat_s,
            )

    def close(self) -> None:
        """Stop beating and remove the key: a clean exit leaves nobody waiting for it."""
        with self._lock:
            self._stop.set()
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
            with contextlib.suppress(redis.RedisError):
                self.client.delete(self.key)


def present(client: redis.Redis, workers: Collection[str]) -> dict[str, int]:
    """Which of ``workers`` show their presence key, each with the milliseconds it has left
    (one pipelined round trip)."""
    ordered = list(workers)
    if not ordered:
        return {}
    with client.pipeline(transaction=False) as pipe:
        for worker in ordered:
            pipe.pttl(keys.presence(worker))
        left = pipe.execute()
    # -2: no key; -1: a key without a TTL (set by hand): present, for as long as it stays.
    return {w: int(ms) for w, ms in zip(ordered, left, strict=True) if ms != -2}
