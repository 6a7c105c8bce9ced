"""The checkpointer: buffers an attempt's deltas and flushes them every ``flush_tokens``
tokens or ``flush_ms`` milliseconds, whichever comes first (a token-count flush no sooner
than ``flush_min_ms`` after the last one), plus at the end.

Each flush is one round trip (the ``flush`` script). If Redis is unreachable the delta is
kept and the next delta tries again; once the lease would have expired the attempt stops
(:class:`~resumeq.errors.LeaseLost`): nobody should pay for tokens that cannot be kept. A
flush whose reply was lost is sent again unchanged, with its request id, and answers as
it did if it had been applied: never written twice.

A Redis failover can lose the last checkpoints (with ``[store] durability = "primary"``
the old primary acknowledged them before its replica had them): the next flush finds the
job at an older revision of this same attempt. The checkpointer keeps what each of its
flushes wrote, and writes the lost ones again, with what is pending, in one flush: the
tokens are not bought twice.

Tokens counted chunk by chunk are a lower bound (see :mod:`resumeq.counting`); the last
write, :meth:`Checkpointer.settle`, raises them to the attempt's total and labels it exact
or an estimate. No write ever lowers the cursor.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from resumeq.errors import LeaseLost, RedisUnavailable, StaleRevision
from resumeq.metrics import Histogram
from resumeq.models import Lease, ResponsePosition
from resumeq.store import Store, request_id

log = logging.getLogger(__name__)


@dataclass
class _Batch:
    """One flush's worth: pending text items, tokens sent, pending tokens it accounts for,
    and the request id that makes a re-send of it recognisable."""

    items: int
    tokens: int
    consumed: int
    exact: bool = True
    #: Bytes of output that is not text (reasoning), for a janitor's estimate.
    hidden_bytes: int = 0
    #: Where the batch ends in a background response (None: it comes from none).
    response: ResponsePosition | None = None
    request: str = field(default_factory=request_id)


@dataclass(frozen=True)
class _Written:
    """One applied flush, kept until the attempt ends: what it wrote and the revision and
    text length it left, to write it again if a failover loses it."""

    revision: int
    prefix_bytes: int
    text: str
    tokens: int
    hidden_bytes: int


class Checkpointer:
    def __init__(
        self,
        store: Store,
        lease: Lease,
        *,
        revision: int,
        flush_tokens: int,
        flush_ms: int,
        flush_min_ms: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.lease = lease
        self.revision = revision
        self.flush_tokens = flush_tokens
        self.flush_s = flush_ms / 1000.0
        self.flush_min_s = flush_min_ms / 1000.0
        self._clock = clock
        self._pending_text: list[str] = []
        self._pending_tokens = 0
        self._pending_hidden = 0
        self._last_flush = clock()
        #: When the lease was last known to be extended (a flush or a renew).
        self.lease_confirmed = clock()
        #: This attempt's output tokens flushed so far, and the characters persisted.
        self.flushed_tokens = 0
        self.flushed_chars = 0
        self.flushed_bytes = 0
        self.flushes = 0
        #: Each flush's round trip, for the cluster-wide histogram (:mod:`resumeq.metrics`).
        self.latency = Histogram()
        #: Whether every count of this attempt so far is exact.
        self.exact = True
        #: The label of the last write (None before the first).
        self._written_exact: bool | None = None
        #: What the last flush tried to write when Redis did not answer. It may have been
        #: applied; the next flush finds out.
        self._inflight: _Batch | None = None
        #: Where what was added so far ends in a background response, if it comes from
        #: one: set before each :meth:`add`, written with the text it goes with.
        self.response: ResponsePosition | None = None
        self._written_response: ResponsePosition | None = None
        #: Writes that failed since the last one that went through.
        self._outage = 0
        #: This attempt's applied flushes, oldest first.
        self._history: list[_Written] = []

    @property
    def pending_tokens(self) -> int:
        return self._pending_tokens

    @property
    def has_pending_text(self) -> bool:
        return bool(self._pending_text)

    def add(self, text: str, tokens: int, *, exact: bool, hidden_bytes: int = 0) -> None:
        """Take a delta — text, or output that is not text (``hidden_bytes`` of reasoning,
        recorded so that a janitor can estimate a dead attempt) — and flush if the token or
        time threshold is reached."""
        if text:
            self._pending_text.append(text)
        self._pending_tokens += tokens
        self._pending_hidden += hidden_bytes
        self.exact = self.exact and exact
        since = self._clock() - self._last_flush
        due = since >= self.flush_s or (
            self._pending_tokens >= self.flush_tokens and since >= self.flush_min_s
        )
        if due and (self._pending_text or self._pending_tokens):
            self.flush()

    def flush(self) -> bool:
        """Write what is pending. Answers False if Redis was unreachable (the delta stays
        pending).

        A batch whose flush got no answer is sent again unchanged, with the same expected
        revision, before anything newer: either it was applied (the revision moved by one
        and the lease is still ours) or it is applied now — never twice, never lost. A
        position in a background response not written yet (nothing came with it) is
        written on its own.
        """
        return self._write(None) and self.note()

    def note(self) -> bool:
        """Write :attr:`response` if it changed since the last write (a response named
        before any of its output, which must be known before the first token is). Answers
        False if Redis was unreachable."""
        position = self.response
        if position is None or position == self._written_response:
            return True
        try:
            self.store.note_response(self.lease, position)
        except RedisUnavailable as exc:
            self._unreachable(exc)
            return False
        self._written_response = position
        return True

    def settle(self, total: int, *, exact: bool) -> bool:
        """Write what is pending and make this attempt's tokens ``total``, labelled exact
        or an estimate. ``total`` may not be below the tokens already counted (flushed or
        pending): the cursor never goes down. Answers False if Redis was unreachable."""
        counted = self.flushed_tokens + self._pending_tokens
        if total < counted:
            raise ValueError(f"a total of {total} is below the {counted} tokens already counted")
        return self._write((total, exact))

    def _write(self, settle: tuple[int, bool] | None) -> bool:
        while True:
            retry = self._inflight is not None
            batch = self._inflight or self._next_batch(settle)
            if batch is None:
                return True
            began = time.perf_counter()
            delta = "".join(self._pending_text[: batch.items])
            try:
                result = self.store.flush(
                    self.lease,
                    expected_revision=self.revision,
                    delta=delta,
                    tokens=batch.tokens,
                    exact=batch.exact,
                    hidden_bytes=batch.hidden_bytes,
                    request=batch.request,
                    response=batch.response,
                )
            except RedisUnavailable as exc:
                self._inflight = batch
                self._unreachable(exc)
                return False
            except StaleRevision as exc:
                try:
                    recovered = self._lost_to_a_failover(exc)
                except RedisUnavailable as unreachable:
                    self._inflight = batch  # find out again once Redis answers
                    self._unreachable(unreachable)
                    return False
                if not recovered:
                    raise
                continue
            self.latency.observe(time.perf_counter() - began)
            self._written(batch, delta, revision=result.revision, prefix_bytes=result.prefix_bytes)
            if not retry:
                return True

    def _next_batch(self, settle: tuple[int, bool] | None) -> _Batch | None:
        """Everything pending, or None when there is nothing to write."""
        batch = _Batch(len(self._pending_text), self._pending_tokens, self._pending_tokens)
        batch.exact = self.exact
        batch.hidden_bytes = self._pending_hidden
        batch.response = self.response
        if settle is not None:
            total, batch.exact = settle
            batch.tokens = total - self.flushed_tokens
            relabel = self._written_exact is not None and self._written_exact != batch.exact
            if not (batch.items or batch.tokens or relabel):
                self.exact = batch.exact
                return None
        elif not batch.items and not batch.tokens and not batch.hidden_bytes:
            return None
        return batch

    def _lost_to_a_failover(self, exc: StaleRevision) -> bool:
        """Whether the job went back to one of this attempt's own checkpoints — what a
        failover that lost the last ones leaves — and those were made pending again, in
        front of what was, to be written at the job's revision. Anything else (another
        writer moved the job) is a refusal."""
        lost = [w for w in self._history if w.revision > exc.current]
        kept = self._history[: len(self._history) - len(lost)]
        if not lost or exc.current >= exc.expected:
            return False
        at = kept[-1].prefix_bytes if kept else lost[0].prefix_bytes - len(lost[0].text.encode())
        start = kept[-1].revision if kept else lost[0].revision - 1
        if start != exc.current:
            return False
        revision, size = self.store.text_size(self.lease.job_id)  # RedisUnavailable: later
        if (revision, size) != (exc.current, at):
            return False
        text = [w.text for w in lost if w.text]
        tokens = sum(w.tokens for w in lost)
        self._pending_text[:0] = text
        self._pending_tokens += tokens
        self._pending_hidden += sum(w.hidden_bytes for w in lost)
        self.flushed_tokens -= tokens
        self.flushed_chars -= sum(len(t) for t in text)
        self.flushed_bytes -= sum(len(t.encode()) for t in text)
        self.flushes -= len(lost)
        self.revision = exc.current
        self._inflight = None
        self._written_response = None
        del self._history[len(kept) :]
        log.warning(
            "job %s: %d checkpoint(s) lost (a Redis failover: revision %d, not %d); "
            "writing them again",
            self.lease.job_id,
            len(lost),
            exc.current,
            exc.expected,
        )
        return True

    def _written(self, batch: _Batch, delta: str, *, revision: int, prefix_bytes: int) -> None:
        """``batch`` was applied: ``delta`` (its text) is durable at ``revision``."""
        self._history.append(
            _Written(revision, prefix_bytes, delta, batch.tokens, batch.hidden_bytes)
        )
        del self._pending_text[: batch.items]
        self._pending_tokens -= batch.consumed
        self._pending_hidden -= batch.hidden_bytes
        self._inflight = None
        self.revision = revision
        self.flushed_tokens += batch.tokens
        self.flushed_chars += len(delta)
        self.flushed_bytes += len(delta.encode("utf-8"))
        self.flushes += 1
        self.exact = self._written_exact = batch.exact
        self._written_response = batch.response
        self._last_flush = self.lease_confirmed = self._clock()
        if self._outage:
            log.info("job %s: Redis answers again after %d failed write(s)", self.lease.job_id,
                     self._outage)  # fmt: skip
            self._outage = 0

    def _unreachable(self, exc: RedisUnavailable) -> None:
        lapsed = self._clock() - self.lease_confirmed
        if lapsed * 1000 >= self.lease.ttl_ms:
            raise LeaseLost(
                f"lease of job {self.lease.job_id} expired while Redis was unreachable",
                job_id=self.lease.job_id,
            ) from exc
        if not self._outage:  # once per outage, not once per delta that tries again
            log.warning("job %s: Redis unreachable, keeping the delta: %s", self.lease.job_id, exc)
        self._outage += 1
