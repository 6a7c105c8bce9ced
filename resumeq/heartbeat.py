"""The lease heartbeat: a thread that renews the attempt's lease every TTL/3.

When a renew is refused (the lease was lost, the job was cancelled) or Redis stays
unreachable until the lease would have expired, it calls ``on_lost`` once — the worker
closes its stream at once so that nobody pays for tokens that cannot be kept.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from resumeq.errors import RedisUnavailable, StoreError, WriteRefused
from resumeq.models import Lease
from resumeq.store import Store

log = logging.getLogger(__name__)


class Heartbeat:
    def __init__(
        self,
        store: Store,
        lease: Lease,
        *,
        on_lost: Callable[[BaseException], None],
        confirmed: Callable[[], float],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``confirmed`` answers when the lease was last known extended (a flush extends it
        too), on the ``clock``'s scale."""
        self.store = store
        self.lease = lease
        self.interval_s = lease.ttl_ms / 3000.0
        self._on_lost = on_lost
        self._confirmed = confirmed
        self._clock = clock
        self._last_renew = clock()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"heartbeat-{lease.job_id}", daemon=True
        )
        self.lost: BaseException | None = None

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s / 4):
            last = max(self._last_renew, self._confirmed())
            if self._clock() - last < self.interval_s:
                continue
            try:
                self.lease = self.store.renew(self.lease)
                self._last_renew = self._clock()
            except WriteRefused as exc:
                self._lose(exc)
                return
            except (RedisUnavailable, StoreError) as exc:
                if (self._clock() - last) * 1000 >= self.lease.ttl_ms:
                    self._lose(exc)
                    return
                log.warning("job %s: renew failed, retrying: %s", self.lease.job_id, exc)

    def _lose(self, exc: BaseException) -> None:
        self.lost = exc
        log.warning("job %s: lease lost (%s); stopping the stream", self.lease.job_id, exc)
        self._on_lost(exc)
