"""The checkpointer: buffers an attempt's deltas and flushes them every ``flush_tokens``
tokens or ``flush_ms`` milliseconds, whichever comes first, plus at the end.

Each flush is one round trip (the ``flush`` script). If Redis is unreachable the delta is
kept and the next delta tries again; once the lease would have expired the attempt stops
(:class:`~resumeq.errors.LeaseLost`): nobody should pay for tokens that cannot be kept. A
flush whose reply was lost is recognised on retry (the revision moved by one, the lease
is still ours) and not written twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from resumeq.errors import LeaseLost, RedisUnavailable, StaleRevision
from resumeq.models import Lease
from resumeq.store import Store

log = logging.getLogger(__name__)


class Checkpointer:
    def __init__(
        self,
        store: Store,
        lease: Lease,
        *,
        revision: int,
        flush_tokens: int,
        flush_ms: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.lease = lease
        self.revision = revision
        self.flush_tokens = flush_tokens
        self.flush_s = flush_ms / 1000.0
        self._clock = clock
        self._pending_text: list[str] = []
        self._pending_tokens = 0
        self._last_flush = clock()
        #: When the lease was last known to be extended (a flush or a renew).
        self.lease_confirmed = clock()
        #: This attempt's output tokens flushed so far, and the characters persisted.
        self.flushed_tokens = 0
        self.flushed_chars = 0
        self.flushes = 0
        #: Whether every count of this attempt so far is exact.
        self.exact = True

    @property
    def pending_tokens(self) -> int:
        return self._pending_tokens

    @property
    def has_pending_text(self) -> bool:
        return bool(self._pending_text)

    def add(self, text: str, tokens: int, *, exact: bool) -> None:
        """Take a delta; flush if the token or time threshold is reached."""
        if text:
            self._pending_text.append(text)
        self._pending_tokens += tokens
        self.exact = self.exact and exact
        due = self._pending_tokens >= self.flush_tokens or (
            self._clock() - self._last_flush >= self.flush_s
        )
        if due and (self._pending_text or self._pending_tokens):
            self.flush()

    def flush(self, *, exact_total: int | None = None) -> bool:
        """Write what is pending. With ``exact_total`` (this attempt's exact output count)
        the flush also corrects every estimate made so far. Answers False if Redis was
        unreachable (the delta stays pending)."""
        text = "".join(self._pending_text)
        tokens = self._pending_tokens
        exact = self.exact
        if exact_total is not None:
            tokens = exact_total - self.flushed_tokens
            exact = True
        try:
            result = self.store.flush(
                self.lease, expected_revision=self.revision, delta=text, tokens=tokens, exact=exact
            )
        except RedisUnavailable as exc:
            self._unreachable(exc)
            return False
        except StaleRevision as exc:
            if not self._applied_before(exc):
                raise
            self.revision += 1
        else:
            self.revision = result.revision
        self._pending_text.clear()
        self._pending_tokens = 0
        self.flushed_tokens += tokens
        self.flushed_chars += len(text)
        self.flushes += 1
        self.exact = exact
        self._last_flush = self.lease_confirmed = self._clock()
        return True

    def _unreachable(self, exc: RedisUnavailable) -> None:
        lapsed = self._clock() - self.lease_confirmed
        if lapsed * 1000 >= self.lease.ttl_ms:
            raise LeaseLost(
                f"lease of job {self.lease.job_id} expired while Redis was unreachable",
                job_id=self.lease.job_id,
            ) from exc
        log.warning("job %s: Redis unreachable, keeping the delta: %s", self.lease.job_id, exc)

    def _applied_before(self, exc: StaleRevision) -> bool:
        """A flush whose reply was lost may have been applied: the revision is one ahead
        and the lease is still ours (nobody else can write with our token)."""
        if exc.current != self.revision + 1:
            return False
        record = self.store.get(self.lease.job_id)
        return record.lease_token == self.lease.token and record.revision == self.revision + 1
