"""The checkpointer: buffers an attempt's deltas and flushes them every ``flush_tokens``
tokens or ``flush_ms`` milliseconds, whichever comes first (a token-count flush no sooner
than ``flush_min_ms`` after the last one), plus at the end.

A provider that pauses sends no delta to carry the time threshold: one thread per process,
the :class:`IdleFlusher`, flushes what waits (:meth:`Checkpointer.flush_idle`), so what
arrived is durable about ``flush_ms`` after the last flush even while nothing follows it. A
lock keeps the attempt's own writes and that thread's apart.

Each flush is one round trip (the ``flush`` script). If Redis is unreachable the delta is
kept and the next delta tries again; once the lease would have expired the attempt stops
(:class:`~resumeq.core.errors.LeaseLost`): nobody should pay for tokens that cannot be kept. A
flush whose reply was lost is sent again unchanged, with its request id, and answers as
it did if it had been applied: never written twice.

A Redis failover can lose the last checkpoints (with ``[store] durability = "primary"``
the old primary acknowledged them before its replica had them): the next flush finds the
job at an older revision of this same attempt. The checkpointer keeps what each of its
flushes wrote, and writes the lost ones again, with what is pending, in one flush: the
tokens are not bought twice.

Tokens counted chunk by chunk are a lower bound (see :mod:`resumeq.core.counting`); the last
write, :meth:`Checkpointer.settle`, raises them to the attempt's total and labels it exact
or an estimate. No write ever lowers the cursor.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from resumeq.core.answer import DurableCall, dumps_calls
from resumeq.core.errors import (
    JobNotFound,
    LeaseLost,
    RedisUnavailable,
    StaleRevision,
    WriteRefused,
)
from resumeq.core.models import Lease, ResponsePosition
from resumeq.store import Store, request_id
from resumeq.store.metrics import Histogram

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
    #: The tool calls as they stand (None: unchanged since the last write), the version of
    #: them it holds, and the calls it makes complete (shown once it is written).
    calls: str | None = None
    calls_version: int = 0
    announce: tuple[dict[str, str], ...] = ()
    refusal: str = ""
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
    announce: tuple[dict[str, str], ...] = ()


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
        #: When a flush of this checkpointer last extended the lease.
        self.lease_confirmed = clock()
        #: When the lease keeper last knew the lease extended, by a renewal or by a flush
        #: of this checkpointer's (set by the attempt; the same clock).
        self.renewed: Callable[[], float] | None = None
        #: This attempt's output tokens flushed so far, and the characters persisted.
        self.flushed_tokens = 0
        self.flushed_chars = 0
        self.flushed_bytes = 0
        self.flushes = 0
        #: Each flush's round trip, for the cluster-wide histogram (:mod:`resumeq.store.metrics`).
        self.latency = Histogram()
        #: Whether every count of this attempt so far is exact.
        self.exact = True
        #: The label of the last write (None before the first).
        self._written_exact: bool | None = None
        #: What the last flush tried to write when Redis did not answer. It may have been
        #: applied; the next flush finds out.
        self._inflight: _Batch | None = None
        #: Where what was added so far ends in a background response, if it comes from
        #: one: given to each :meth:`add`, written with the text it goes with.
        self.response: ResponsePosition | None = None
        self._written_response: ResponsePosition | None = None
        #: Writes that failed since the last one that went through.
        self._outage = 0
        #: This attempt's applied flushes, oldest first.
        self._history: list[_Written] = []
        #: Held by every write: the attempt's thread and the idle flusher's.
        self._lock = threading.RLock()
        #: Set by :meth:`close`: the idle flusher writes nothing more.
        self._closed = False
        #: The answer's tool calls: those kept from earlier attempts, then this attempt's
        #: (by the wire's index); a version for each change, the one last written, and the
        #: calls made complete that no write has announced yet.
        self.calls: list[DurableCall] = []
        self._call_at: dict[int, int] = {}
        self._calls_version = 0
        self._calls_written = 0
        self._announce: list[dict[str, str]] = []
        #: The call whose arguments the attempt's text continues (an index into calls).
        self._into: int | None = None
        #: The attempt this checkpointer writes for (a fencing token is attempt:holder:nonce).
        head = lease.token.partition(":")[0]
        self.attempt = int(head) if head.isdigit() else 0
        #: The provider's refusal, written with the next flush.
        self.refusal = ""
        self._refusal_written = ""

    @property
    def pending_tokens(self) -> int:
        return self._pending_tokens

    @property
    def has_pending_text(self) -> bool:
        return bool(self._pending_text)

    def add(
        self,
        text: str,
        tokens: int,
        *,
        exact: bool,
        hidden_bytes: int = 0,
        response: ResponsePosition | None = None,
    ) -> None:
        """Take a delta — text, or output that is not text (``hidden_bytes`` of reasoning,
        recorded so that a janitor can estimate a dead attempt) — and flush if the token or
        time threshold is reached. ``response``: where the delta ends in a background
        response, taken with it (a flush in between would write a position past text it
        does not hold)."""
        with self._lock:
            if response is not None:
                self.response = response
            if text and self._into is not None:
                self._into_call(text, tokens)
                hidden_bytes += len(text.encode("utf-8"))
            elif text:
                self._pending_text.append(text)
            self._pending_tokens += tokens
            self._pending_hidden += hidden_bytes
            self.exact = self.exact and exact
            if self._due():
                self.flush()

    def keep_calls(self, stored: Sequence[DurableCall], kept: Sequence[DurableCall]) -> None:
        """Start from the calls of earlier attempts this one keeps (a cut one is dropped:
        it is asked again); written with the first flush if that drops any. The stream's
        calls are new ones (a response read on maps its own: :meth:`resume_calls`)."""
        with self._lock:
            self.calls = list(kept)
            self._call_at = {}
            self._into = None
            if list(stored) != self.calls:
                self._calls_version += 1

    def continue_call(self) -> None:
        """The attempt continues the arguments of the last call kept (cut inside them): the
        text it takes is theirs (:meth:`add`), until :meth:`end_continued`."""
        with self._lock:
            self._into = len(self.calls) - 1

    @property
    def continued(self) -> DurableCall | None:
        """The call whose arguments this attempt continues, as it stands."""
        with self._lock:
            return None if self._into is None else self.calls[self._into]

    @property
    def continued_chars(self) -> int:
        """The stored characters of the call this attempt continues (0: none)."""
        continued = self.continued
        return len(continued.arguments) if continued is not None else 0

    def end_continued(self) -> None:
        """The continued call's arguments ended with the stream: the call is whole."""
        with self._lock:
            at, self._into = self._into, None
            self._complete(at)

    def _into_call(self, text: str, tokens: int) -> None:
        assert self._into is not None
        call = self.calls[self._into]
        self.calls[self._into] = dataclasses.replace(
            call, arguments=call.arguments + text, tokens=call.tokens + tokens
        )
        self._calls_version += 1

    def resume_calls(self, attempt: int) -> None:
        """A background response read on: its stream numbers its calls 0, 1, … as the stream
        of ``attempt``, which made it, did."""
        with self._lock:
            made = [i for i, c in enumerate(self.calls) if c.attempt == attempt]
            self._call_at = dict(enumerate(made))

    def tool(
        self,
        index: int,
        call_id: str | None,
        name: str | None,
        arguments: str,
        tokens: int,
        *,
        exact: bool,
        response: ResponsePosition | None = None,
    ) -> None:
        """A piece of the attempt's call ``index`` (its first names it)."""
        with self._lock:
            at = self._call_at.get(index)
            if at is None:
                at = self._call_at[index] = len(self.calls)
                self.calls.append(DurableCall(call_id or "", name or "", attempt=self.attempt))
            call = self.calls[at]
            self.calls[at] = dataclasses.replace(
                call,
                id=call.id or call_id or "",
                name=call.name or name or "",
                arguments=call.arguments + arguments,
                tokens=call.tokens + tokens,
            )
            self._calls_version += 1
            self.add("", tokens, exact=exact, hidden_bytes=len(arguments.encode()),
                     response=response)  # fmt: skip

    def tool_end(self, index: int) -> None:
        """The attempt's call ``index`` is whole: shown once written."""
        with self._lock:
            self._complete(self._call_at.get(index))

    def _complete(self, at: int | None) -> None:
        if at is None or self.calls[at].complete:
            return
        self.calls[at] = dataclasses.replace(self.calls[at], complete=True)
        self._announce.append(self.calls[at].shown())
        self._calls_version += 1

    def flush_idle(self) -> bool:
        """Flush what is pending if a threshold has passed with no delta to carry it out
        (the provider paused after a burst). Called from the :class:`IdleFlusher`'s thread:
        it leaves the turn to the attempt's own thread when that is writing, and does nothing
        in an outage (the attempt's next delta tries again; the lease keeper's renewals watch
        the lease) or once the attempt closed it. Answers whether it wrote; raises as
        :meth:`flush` does when refused."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if self._closed or self._outage or not self._due():
                return False
            return self.flush()
        finally:
            self._lock.release()

    def carry(self, tokens: int) -> None:
        """Add ``tokens`` billed outside this attempt's stream (a response that cannot be
        read on) to the job's cursor, with no text and apart from :attr:`flushed_tokens`.
        Raises :class:`RedisUnavailable`, and as a refused flush does."""
        with self._lock:
            self.revision = self.store.flush(
                self.lease, expected_revision=self.revision, delta="", tokens=tokens, exact=False
            ).revision

    def close(self) -> None:
        """The attempt is done streaming: no idle flush writes after this returns (what is
        left pending is the attempt's to write, or nobody's once its lease is gone)."""
        with self._lock:
            self._closed = True

    def _due(self) -> bool:
        if not (self._pending_text or self._pending_tokens or self._announce):
            return False
        since = self._clock() - self._last_flush
        return since >= self.flush_s or (
            self._pending_tokens >= self.flush_tokens and since >= self.flush_min_s
        )

    def flush(self) -> bool:
        """Write what is pending. Answers False if Redis was unreachable (the delta stays
        pending).

        A batch whose flush got no answer is sent again unchanged, with the same expected
        revision, before anything newer: either it was applied (the revision moved by one
        and the lease is still ours) or it is applied now — never twice, never lost. A
        position in a background response not written yet (nothing came with it) is
        written on its own.
        """
        with self._lock:
            return self._write(None) and self.note()

    def note(self, response: ResponsePosition | None = None) -> bool:
        """Write :attr:`response` (first set to ``response``, if given) if it changed since
        the last write (a response named before any of its output, which must be known
        before the first token is). Answers False if Redis was unreachable."""
        with self._lock:
            if response is not None:
                self.response = response
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
        with self._lock:
            counted = self.flushed_tokens + self._pending_tokens
            if total < counted:
                raise ValueError(
                    f"a total of {total} is below the {counted} tokens already counted"
                )
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
                    calls=batch.calls,
                    announce=json.dumps(batch.announce, ensure_ascii=False)
                    if batch.announce
                    else "",
                    refusal=batch.refusal,
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
        if self._calls_version != self._calls_written:
            batch.calls = dumps_calls(self.calls)
            batch.calls_version = self._calls_version
            batch.announce = tuple(self._announce)
        if self.refusal != self._refusal_written:
            batch.refusal = self.refusal
        shaped = batch.calls is not None or bool(batch.refusal)
        if settle is not None:
            total, batch.exact = settle
            batch.tokens = total - self.flushed_tokens
            relabel = self._written_exact is not None and self._written_exact != batch.exact
            if not (batch.items or batch.tokens or relabel or shaped):
                self.exact = batch.exact
                return None
        elif not (batch.items or batch.tokens or batch.hidden_bytes or shaped):
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
        self._announce[:0] = [call for w in lost for call in w.announce]
        self._calls_written = -1  # the calls as they stand are written again
        self._refusal_written = ""
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
            _Written(
                revision, prefix_bytes, delta, batch.tokens, batch.hidden_bytes, batch.announce
            )
        )
        if batch.calls is not None:
            self._calls_written = batch.calls_version
            del self._announce[: len(batch.announce)]
        if batch.refusal:
            self._refusal_written = batch.refusal
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

    def lease_extended(self) -> float:
        """When the lease was last known extended: by a flush, or by a renewal (a stream
        whose provider paused longer than the TTL has had no flush, but its lease is
        fresh)."""
        return self.renewed() if self.renewed is not None else self.lease_confirmed

    def _unreachable(self, exc: RedisUnavailable) -> None:
        lapsed = self._clock() - self.lease_extended()
        if lapsed * 1000 >= self.lease.ttl_ms:
            raise LeaseLost(
                f"lease of job {self.lease.job_id} expired while Redis was unreachable",
                job_id=self.lease.job_id,
            ) from exc
        if not self._outage:  # once per outage, not once per delta that tries again
            log.warning("job %s: Redis unreachable, keeping the delta: %s", self.lease.job_id, exc)
        self._outage += 1


#: The idle flusher's look at its checkpointers: a quarter of the shortest ``flush_ms``
#: watched, within these bounds (a tiny ``flush_ms`` must not make it spin).
IDLE_TICK_MIN_S = 0.01
IDLE_TICK_MAX_S = 0.25


class IdleFlusher:
    """Flushes, from one thread per process, the checkpointers whose provider went quiet
    with a delta pending (:meth:`Checkpointer.flush_idle`): a burst followed by a pause is
    durable within about ``flush_ms``, not at the next token, which may come only when the
    stall timeout cuts the stream. Not the lease keeper's thread: a flush queues for the
    shared connection pool, and a late renewal is a lost lease.

    A refused idle flush (the lease lost, the job cancelled) calls the attempt's
    ``on_refused`` once, on this thread: it must be quick (closing a socket is)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watched: dict[int, tuple[Checkpointer, Callable[[WriteRefused], None]]] = {}
        #: Those whose last look failed with an error nobody planned for (logged once).
        self._failing: set[int] = set()
        self._ids = itertools.count(1)
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None

    def watch(self, ckpt: Checkpointer, on_refused: Callable[[WriteRefused], None]) -> int:
        """Flush ``ckpt`` when it idles; answers a token for :meth:`unwatch`."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the idle flusher is closed")
            token = next(self._ids)
            self._watched[token] = (ckpt, on_refused)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="resumeq-idle-flusher", daemon=True
                )
                self._thread.start()
        self._wake.set()  # a shorter flush_ms than the others may need an earlier look
        return token

    def unwatch(self, token: int) -> None:
        self._drop(token)

    def watching(self) -> int:
        with self._lock:
            return len(self._watched)

    def close(self) -> None:
        """Stop flushing anything, and stop the thread."""
        with self._lock:
            self._closed = True
            self._watched.clear()
            thread = self._thread
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
                watched = list(self._watched.items())
            for token, (ckpt, on_refused) in watched:
                if self._closed:  # an outage makes a round long: no flush after close()
                    return
                self._flush(token, ckpt, on_refused)
            tick = min((c.flush_s / 4 for _, (c, _) in watched), default=IDLE_TICK_MAX_S)
            self._wake.wait(min(max(tick, IDLE_TICK_MIN_S), IDLE_TICK_MAX_S))
            self._wake.clear()

    def _flush(
        self, token: int, ckpt: Checkpointer, on_refused: Callable[[WriteRefused], None]
    ) -> None:
        """One look at ``ckpt``. A refusal (or the job gone) stops the attempt's stream; any
        other failure is logged once until a look goes through (the attempt's own writes
        meet it too), and the flusher goes on with the others."""
        try:
            ckpt.flush_idle()
        except (WriteRefused, JobNotFound) as exc:
            if not self._drop(token):
                return  # its attempt let go meanwhile
            log.warning("job %s: idle flush refused (%s); stopping the stream",
                        ckpt.lease.job_id, exc)  # fmt: skip
            refused = (
                exc if isinstance(exc, WriteRefused) else LeaseLost(str(exc), job_id=exc.job_id)
            )
            try:
                on_refused(refused)
            except Exception:  # this thread serves every attempt of the process: it goes on
                log.exception("job %s: stopping the stream failed", ckpt.lease.job_id)
        except Exception:
            with self._lock:
                first = token in self._watched and token not in self._failing
                if first:
                    self._failing.add(token)
            if first:
                log.exception("job %s: idle flush failed", ckpt.lease.job_id)
        else:
            if token in self._failing:
                with self._lock:
                    self._failing.discard(token)

    def _drop(self, token: int) -> bool:
        """Stop watching ``token``; whether it was still watched."""
        with self._lock:
            self._failing.discard(token)
            return self._watched.pop(token, None) is not None
