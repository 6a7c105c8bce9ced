"""Which workers died, from their Redis connections (SPEC §17).

Every connection a worker process opens carries its name (``CLIENT SETNAME``,
:func:`resumeq.keys.worker_client_name`). When the process dies its sockets close, and
Redis drops the connections at once: a janitor that reads ``CLIENT LIST`` every
``liveness_interval_ms`` sees the name go. A name missing at two reads at least that far
apart is a dead worker, and the jobs it leased are reaped then instead of when their leases
expire. A connection that blips is back within one read (a worker reconnects at its next
command, and checkpoints every few hundred milliseconds); if it was not, the worker is
taken for dead, its next write is refused by the fence, and the job goes on from its last
checkpoint — nothing is duplicated. A frozen process (``SIGSTOP``) or a partition keeps its
connections, or loses them without Redis noticing: its leases expire as before.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from resumeq import keys

#: Reads that must miss a worker before it is taken for dead.
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
        workers found dead by it (each once)."""
        present = {w for n in connection_names if (w := keys.worker_of_client(n))}
        for worker in present:
            self.seen[worker] = now
            self.missed.pop(worker, None)
        dead: list[str] = []
        for worker in [w for w in self.seen if w not in present]:
            count, last = self.missed.get(worker, (0, float("-inf")))
            if now - last < self.interval_s:
                continue  # reads closer together than the interval count once
            count += 1
            if count >= MISSES:
                dead.append(worker)
                del self.seen[worker]
                self.missed.pop(worker, None)
            else:
                self.missed[worker] = (count, now)
        return dead

    def forget(self) -> None:
        """Start again from nothing (the janitor lost Redis: a restart or a partition drops
        every connection, and workers reconnect at their own pace; none is taken for dead
        until it has been seen again)."""
        self.seen.clear()
        self.missed.clear()
