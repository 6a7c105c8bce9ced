"""The CPU time the fake provider's own threads use, apart from the rest of the process.

Each thread the provider runs (accepting, one per connection, pacing) is metered from start to
end: a thread that ended counts what :func:`time.thread_time` said at its end; one still
running is read through its CPU clock (:func:`time.pthread_getcpuclockid`), so a reading is
current at any moment. Where that clock is missing a running thread counts once it ends.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

_clock_of = getattr(time, "pthread_getcpuclockid", None)


class CpuMeter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ended = 0.0
        self._running: dict[int, int | None] = {}

    @contextmanager
    def thread(self) -> Iterator[None]:
        """Meter the calling thread (a thread of the provider's, from its start) while in the
        block."""
        ident = threading.get_ident()
        clock: int | None = None
        if _clock_of is not None:
            try:
                clock = int(_clock_of(ident))
            except OSError:
                clock = None
        with self._lock:
            self._running[ident] = clock
        try:
            yield
        finally:
            # Under the lock: nobody reads this thread's clock once it may have ended.
            with self._lock:
                del self._running[ident]
                self._ended += time.thread_time()

    def seconds(self) -> float:
        """CPU seconds (user and system) of every metered thread so far, running or ended."""
        with self._lock:
            total = self._ended
            for clock in self._running.values():
                if clock is not None:
                    total += time.clock_gettime(clock)
            return total

    def threads(self) -> int:
        """Metered threads running now."""
        with self._lock:
            return len(self._running)
