"""Lease heartbeats: one thread per process keeps the leases of every attempt it runs.

Each held lease is renewed once a third of its TTL has passed since it was last known
extended (a renew, or a flush: flushes extend the lease too). When one is due, the keeper
renews it together with every lease past half its interval, in one pipelined round trip:
the leases fall into step, and a worker with hundreds of streams pays one round trip per
tick — never one thread or one timer per stream.

When a renew is refused (the lease was lost, the job was cancelled) or Redis stays
unreachable until the lease would have expired, the holder's ``on_lost`` is called once —
the worker closes that stream at once so that nobody pays for tokens that cannot be kept.
``on_lost`` runs on the keeper's thread: it must be quick (closing a socket is).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from resumeq.core.errors import RedisUnavailable, StoreError, WriteRefused
from resumeq.core.models import Lease
from resumeq.store import Store

log = logging.getLogger(__name__)

#: The longest the keeper sleeps between looks at its leases.
MAX_TICK_S = 1.0


class Held:
    """A lease the keeper renews until :meth:`release`."""

    def __init__(
        self,
        keeper: LeaseKeeper,
        lease: Lease,
        on_lost: Callable[[BaseException], None],
        confirmed: Callable[[], float],
        now: float,
    ) -> None:
        self.lease = lease
        self.interval_s = lease.ttl_ms / 3000.0
        self.lost: BaseException | None = None
        self._keeper = keeper
        self._on_lost = on_lost
        self._confirmed = confirmed
        self._last_renew = now

    def last_extended(self) -> float:
        return max(self._last_renew, self._confirmed())

    def release(self) -> None:
        """Stop renewing it (the attempt made its last write). A renew in flight may
        still land: harmless, the lease's owner is about to give it up anyway."""
        self._keeper._drop(self)

    def _lose(self, exc: BaseException) -> None:
        self.lost = exc
        log.warning("job %s: lease lost (%s); stopping the stream", self.lease.job_id, exc)
        self._on_lost(exc)


class LeaseKeeper:
    """Renews the held leases of one process from one thread (started on first hold)."""

    def __init__(self, store: Store, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self._clock = clock
        self._held: dict[int, Held] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        #: The worst lateness of a renew past its due time seen so far (s): how far behind
        #: the keeper fell under load.
        self.worst_lag_s = 0.0

    def hold(
        self,
        lease: Lease,
        *,
        on_lost: Callable[[BaseException], None],
        confirmed: Callable[[], float],
    ) -> Held:
        """Keep ``lease`` renewed; ``confirmed`` answers when it was last known extended
        (on this keeper's clock), so a flush spares a renew."""
        held = Held(self, lease, on_lost, confirmed, self._clock())
        with self._lock:
            if self._closed:
                raise RuntimeError("the lease keeper is closed")
            self._held[id(held)] = held
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="resumeq-lease-keeper", daemon=True
                )
                self._thread.start()
        self._wake.set()  # a shorter TTL than the others may need an earlier tick
        return held

    def held(self) -> int:
        with self._lock:
            return len(self._held)

    def close(self) -> None:
        """Stop renewing anything, and stop the thread."""
        with self._lock:
            self._closed = True
            self._held.clear()
            thread = self._thread
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def _drop(self, held: Held) -> None:
        with self._lock:
            self._held.pop(id(held), None)

    def _run(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
                holding = list(self._held.values())
            now = self._clock()
            if any(now - h.last_extended() >= h.interval_s for h in holding):
                # with it, every lease past half its interval: they fall into step, and
                # one round trip serves them all
                self._renew([h for h in holding if now - h.last_extended() >= h.interval_s / 2],
                            now)  # fmt: skip
            wait = min((h.interval_s / 4 for h in holding), default=MAX_TICK_S)
            self._wake.wait(min(wait, MAX_TICK_S))
            self._wake.clear()

    def _lapsed(self, h: Held) -> bool:
        """Unconfirmed for a whole TTL: the lease may have expired in Redis meanwhile."""
        return (self._clock() - h.last_extended()) * 1000 >= h.lease.ttl_ms

    def _renew(self, due: list[Held], now: float) -> None:
        for h in due:
            lag = now - h.last_extended() - h.interval_s
            self.worst_lag_s = max(self.worst_lag_s, lag)
        try:
            results: list[Lease | StoreError] = self.store.renew_many([h.lease for h in due])
        except (RedisUnavailable, StoreError) as exc:
            results = [exc] * len(due)
        for h, result in zip(due, results, strict=True):
            with self._lock:
                if id(h) not in self._held:
                    continue  # released meanwhile
            if isinstance(result, Lease):
                h.lease = result
                # From when the renew was sent, not answered: the TTL ran from no earlier.
                h._last_renew = now
            elif isinstance(result, WriteRefused) or self._lapsed(h):
                self._drop(h)
                h._lose(result)
            else:
                log.warning("job %s: renew failed, retrying: %s", h.lease.job_id, result)
