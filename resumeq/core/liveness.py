"""Which workers died, from their Redis connections and their presence (SPEC §17, §21).

Every connection a worker process opens carries its name (``CLIENT SETNAME``,
:func:`resumeq.core.names.worker_client_name`). When the process dies its sockets close, and
Redis drops the connections at once: a janitor that reads ``CLIENT LIST`` every
``liveness_interval_ms`` sees the name go. A name missing at :data:`MISSES` reads at least
that far apart makes the worker a *suspect*; it is taken for dead only once its presence
key (:mod:`resumeq.store.presence`, set again every tenth of a second, living 0.6 s) is gone too,
and then the jobs it leased are reaped at once instead of when their leases expire.

A live worker whose connections were reset (``CLIENT KILL``, a proxy's idle reset) keeps
beating: its next beat, within a tenth of a second, opens a new named connection and sets
its key again, whatever its provider is doing — so it is never a suspect for long, and
never taken for dead unless its beat thread also missed six beats in a row. A frozen
process (``SIGSTOP``) or a partition keeps its connections, or loses them without Redis
noticing: its leases expire as before; the fence makes any wrong guess harmless.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from resumeq.core import names

#: Reads that must miss a worker's connections before it is a suspect.
MISSES = 2


@dataclass
class Liveness:
    """The workers one janitor has seen, and those it has missed. Pure: fed the names of
    the connections and the time of each read."""

    interval_s: float
    #: Worker → when it was last seen.
    seen: dict[str, float] = field(default_factory=dict)
    #: Worker → (reads in a row that missed it, when the last counted miss was).
    missed: dict[str, tuple[int, float]] = field(default_factory=dict)

    def observe(self, connection_names: Iterable[str], now: float) -> list[str]:
        """One read of the connections' names at ``now`` (seconds, monotonic); answers the
        suspects: workers seen before and missed at :data:`MISSES` reads at least
        ``interval_s`` apart. A suspect stays one (answered at every read) until it is seen
        again or :meth:`dead` is called for it."""
        present = {w for n in connection_names if (w := names.worker_of_client(n))}
        for worker in present:
            self.seen[worker] = now
            self.missed.pop(worker, None)
        suspects: list[str] = []
        for worker in [w for w in self.seen if w not in present]:
            count, last = self.missed.get(worker, (0, float("-inf")))
            if now - last >= self.interval_s:  # reads closer together count once
                count, last = count + 1, now
                self.missed[worker] = (count, last)
            if count >= MISSES:
                suspects.append(worker)
        return suspects

    def dead(self, worker: str) -> None:
        """``worker`` was taken for dead: forget it (it is answered once)."""
        self.seen.pop(worker, None)
        self.missed.pop(worker, None)

    def forget(self) -> None:
        """Start again from nothing (the janitor lost Redis: a restart or a partition drops
        every connection, and workers reconnect at their own pace; none is taken for dead
        until it has been seen again)."""
        self.seen.clear()
        self.missed.clear()
