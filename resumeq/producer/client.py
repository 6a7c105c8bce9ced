"""The producer API (SPEC §12): what a web app uses to enqueue, read, wait for, cancel and
follow jobs.

``follow`` reads the job's events stream: one entry per revision, text deltas among them.
Every delta it yields is durable — already checkpointed, never taken back by a resume — so
a follower sees one continuous text across cuts and attempts. Start it late, or again
after any revision, and it yields exactly the text not seen yet.

What a snapshot holds, which events a reader sees and when it stops are decided here, once,
by pure helpers (:meth:`Job.from_snapshot`, :class:`EventCursor`, :func:`delta_of`): the
synchronous :class:`Client` and :class:`~resumeq.producer.async_client.AsyncClient` only carry out
the reads they ask for.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis
from redis.typing import KeyT, StreamIdT

from resumeq.core.answer import shown
from resumeq.core.errors import InvalidTransition, JobNotFound, StoreError
from resumeq.core.models import TERMINAL_STATES, JobRecord, JobState
from resumeq.producer.enqueue import cancel_job, enqueue_job
from resumeq.store import DEFAULT_QUEUE, Store, decode, keys, redis_errors
from resumeq.store.codec import job_record

if TYPE_CHECKING:
    from resumeq.core.defaults import LimitDefaults, StoreDefaults
    from resumeq.core.settings import StoreSettings
    from resumeq.core.spec import JobSpec, Limits

#: States no worker moves a job out of on its own: ``wait`` returns on them.
RESTING_STATES = frozenset({*(s.value for s in JobState if s.terminal), JobState.SPILLED.value})
#: States a follow ends at: a spilled job may be requeued and go on.
_ENDING_STATES = frozenset(s.value for s in TERMINAL_STATES)
#: How long one blocking read of the events stream waits before checking the clock.
_BLOCK_MS = 1000
#: What ``cancel`` records as the reason unless told otherwise.
CANCEL_REASON = "cancelled by producer"


@dataclass(frozen=True)
class Delta:
    """Durable text, with the revision that wrote it (resume a follower after it); the tool
    calls that revision made whole (``{"id", "name", "arguments"}``); ``reset``: the answer
    so far was let go (it was not what was asked) and is asked again from the start."""

    revision: int
    text: str
    tool_calls: tuple[dict[str, str], ...] = ()
    reset: bool = False


@dataclass(frozen=True)
class Job:
    """A snapshot of a job for producers."""

    id: str
    state: JobState
    text: str
    revision: int
    spent_output_tokens: int
    budget_tokens: int
    counts_exact: bool
    attempts: int
    finish_reason: str | None
    error: str | None
    reason: str | None
    record: JobRecord
    #: The answer's tool calls, complete ones only, and the provider's refusal.
    tool_calls: tuple[dict[str, str], ...] = ()
    refusal: str | None = None

    @property
    def ended(self) -> bool:
        return self.state.terminal

    @classmethod
    def from_snapshot(cls, record: JobRecord, text: str) -> Job:
        """The job as of ``record.revision``; ``text`` is its text up to that revision."""
        return cls(
            id=record.id,
            state=record.state,
            text=text,
            revision=record.revision,
            spent_output_tokens=record.spent_output_tokens,
            budget_tokens=record.budget_tokens,
            counts_exact=record.counts_exact,
            attempts=record.attempt,
            finish_reason=record.finish_reason,
            error=record.error,
            reason=record.reason,
            record=record,
            tool_calls=tuple(shown(record.calls)),
            refusal=record.refusal,
        )


def record_of(job_id: str, fields: Mapping[Any, Any]) -> JobRecord:
    """The record from the job hash as a bytes-mode client answers it (HGETALL);
    :class:`~resumeq.core.errors.JobNotFound` when it is empty."""
    if not fields:
        raise JobNotFound(f"no job {job_id}", job_id=job_id)
    return job_record(job_id, {decode(k): decode(v) for k, v in fields.items()})


def is_resting(record: JobRecord) -> bool:
    """Whether ``wait`` has nothing to wait for: the job ended, or spilled."""
    return record.state.value in RESTING_STATES


def delta_of(revision: int, fields: Mapping[str, str]) -> Delta | None:
    """The durable text and tool calls an event added, if any, or the answer it let go
    (other state changes add none)."""
    text = fields.get("delta") or ""
    calls = tuple(json.loads(fields["calls"])) if fields.get("calls") else ()
    reset = fields.get("reset") == "1"
    return Delta(revision, text, calls, reset) if text or calls or reset else None


class EventCursor:
    """Where a reader of a job's events stream is, and when it is done: ``follow`` and
    ``wait`` without the I/O, so the sync and async clients read the same events and stop
    at the same one.

    A reader passes the job's record to :meth:`start`, then, until :attr:`ended`, reads
    :attr:`streams` (XREAD, :attr:`count` entries, blocking :meth:`block_ms`) and hands each
    reply to :meth:`take`. After an empty reply it reads the job hash's ``id`` and
    ``events_trimmed`` (:attr:`probe`) and hands them to :meth:`idle`, which raises
    :meth:`gone` for a job that is gone.

    A job that ended a while ago has no events stream: the janitor removed it, keeping
    where each text delta ended. The cursor then sets :attr:`gap` (at :meth:`start`, at
    :meth:`idle`, or at a hole in the revisions); the reader reads the job and its text in
    one snapshot and hands both to :meth:`fill`, which answers the text not seen yet and
    ends the read.
    """

    count = 500

    def __init__(
        self, job_id: str, *, after: int, deadline: float | None, stop_at_spill: bool
    ) -> None:
        self.job_id = job_id
        self.job_key = keys.job(job_id)
        self.after = after
        self.deadline = deadline
        self.ended = False
        #: Revisions are missing from the stream: :meth:`fill` before reading on.
        self.gap = False
        self._seen = after  # the last revision accounted for
        self._stream = keys.events(job_id)
        self._last_id = "0-0"
        #: Events read but not shown yet: a checkpoint written with replica durability
        #: (``held``) and everything after it, until a ``durable`` marker at its revision
        #: or later says a replica holds it. A reader that fails (a failover) drops them:
        #: whoever reads again from the last revision shown reads them from the new primary,
        #: or, if they were lost, the text that replaced them.
        self._held: list[tuple[int, dict[str, str]]] = []
        self._durable = 0
        self._stops = RESTING_STATES if stop_at_spill else _ENDING_STATES

    #: The job hash fields :meth:`idle` needs.
    probe = ("id", "events_trimmed", "state", "revision")

    def start(self, record: JobRecord) -> None:
        """Nothing to read when the job rests at or before revision ``after``; the text
        alone when its events are gone."""
        if record.revision <= self.after and record.state.value in self._stops:
            self.ended = True
        elif record.events_trimmed is not None:
            self.gap = True

    def idle(self, probed: list[Any]) -> None:
        """After an empty read: the job's :attr:`probe` fields (HMGET)."""
        job_id, trimmed, state, revision = probed
        if job_id is None:
            raise self.gone()
        if trimmed is not None:
            self.gap = True  # removed while this reader waited
        elif (
            state is not None
            and decode(state) in self._stops
            and revision is not None
            and int(revision) <= self._seen
            and not self._held
        ):
            # The job rests at a revision this reader has passed: a failover took back
            # revisions it was shown (``durability = "primary"``) and the job ended
            # before reaching them again. Nothing more will come.
            self.ended = True

    @property
    def streams(self) -> dict[KeyT, StreamIdT]:
        """XREAD's streams argument: the events after the last one taken."""
        return {self._stream: self._last_id}

    def block_ms(self, now: float) -> int:
        """How long the next read may block; ``TimeoutError`` once the deadline passed."""
        if self.deadline is None:
            return _BLOCK_MS
        left = self.deadline - now
        if left <= 0:
            raise TimeoutError(f"job {self.job_id} did not end in time")
        return max(1, min(_BLOCK_MS, int(left * 1000)))

    def take(self, reply: Any) -> list[tuple[int, dict[str, str]]]:
        """The events of an XREAD reply after revision ``after``, up to the first at a
        state the reader stops at (then :attr:`ended`)."""
        taken: list[tuple[int, dict[str, str]]] = []
        for entry_id, raw in reply[0][1] if reply else ():
            fields = {decode(k): decode(v) for k, v in raw.items()}
            revision = int(fields["rev"])
            if "durable" in fields:  # a replica holds everything up to revision
                self._last_id = decode(entry_id)
                self._durable = max(self._durable, revision)
                if self._release(taken):
                    break
                continue
            if revision > self._seen + 1:
                self.gap = True  # read this entry again after the fill
                break
            self._last_id = decode(entry_id)
            if revision <= self._seen:
                continue
            self._seen = revision
            if self._held or (fields.get("held") == "1" and revision > self._durable):
                self._held.append((revision, fields))  # shown once a replica holds it
                continue
            if self._take(revision, fields, taken):
                break
        return taken

    def _take(
        self, revision: int, fields: dict[str, str], taken: list[tuple[int, dict[str, str]]]
    ) -> bool:
        """Hand the event on; True if the reader stops at it."""
        taken.append((revision, fields))
        if fields.get("state") in self._stops:
            self.ended = True
        return self.ended

    def _release(self, taken: list[tuple[int, dict[str, str]]]) -> bool:
        """Hand on the held events a replica now holds, in order; True if the reader
        stops at one of them."""
        while self._held and self._held[0][0] <= self._durable:
            if self._take(*self._held.pop(0), taken):
                self._held.clear()
                return True
        return False

    def fill(self, record: JobRecord, text: str) -> list[tuple[int, dict[str, str]]]:
        """From a snapshot of a job whose events are gone (``record`` and its ``text``):
        the text past where the reader is, with the job's end, as one event at its last
        revision. The read is over."""
        if record.events_trimmed is None:
            raise StoreError(
                f"job {self.job_id}: its events stream lacks revisions after {self._seen} "
                "and was never trimmed"
            )
        # Held events were never shown: the text goes on from before the first of them.
        shown = self._held[0][0] - 1 if self._held else self._seen
        self._held.clear()
        rest = text.encode()[record.text_bytes_after(shown) :].decode()
        self._seen = record.events_trimmed
        self.gap = False
        self.ended = True
        fields = {"rev": str(self._seen), "state": record.state.value}
        return [(self._seen, {**fields, "delta": rest} if rest else fields)]

    def gone(self) -> JobNotFound:
        return JobNotFound(f"job {self.job_id} is gone", job_id=self.job_id)


class Client:
    """A producer's handle on resumeq: one Redis connection, no workers needed."""

    def __init__(
        self,
        connection: redis.Redis,
        *,
        settings: StoreSettings | StoreDefaults | None = None,
        limits: Limits | LimitDefaults | None = None,
    ) -> None:
        self.store = Store(connection, settings=settings, limits=limits)
        self.redis = connection

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> Client:
        store = Store.from_url(url)
        return cls(store.redis, **kwargs)

    def enqueue(self, spec: JobSpec | Mapping[str, Any], *, queue: str = DEFAULT_QUEUE) -> str:
        """Validate ``spec``, write the job record and enqueue its first attempt.

        Answers the job id. With an idempotency key, enqueueing again answers the same id
        (and enqueues nothing). A refused spec raises
        :class:`~resumeq.core.errors.InvalidSpec` naming every bad field; nothing is written.
        """
        return enqueue_job(self.store, self.redis, spec, queue=queue).id

    def get(self, job_id: str) -> Job:
        """The job as of one revision: its text is exactly the text up to ``revision``, so
        ``follow(after=job.revision)`` goes on from there without a repeat."""
        return Job.from_snapshot(*self.store.snapshot(job_id))

    def cancel(self, job_id: str, *, reason: str = CANCEL_REASON) -> Job:
        """Cancel a job that has not ended, and answer it. A job that had ended is answered
        as it ended, unchanged (its state says so), as ``resumeq cancel`` and ``POST
        /v1/jobs/ID/cancel`` answer it; :class:`~resumeq.core.errors.JobNotFound` for an unknown
        job."""
        try:
            cancel_job(self.store, job_id, reason=reason)
        except InvalidTransition as exc:
            if not JobState(exc.state).terminal:
                raise
        return self.get(job_id)

    def wait(self, job_id: str, timeout: float) -> Job:
        """Block until the job ends (or spills: it then waits for a person); raise
        ``TimeoutError`` after ``timeout`` seconds."""
        record = self.store.get(job_id)
        if not is_resting(record):
            deadline = time.monotonic() + timeout
            for _ in self._entries(job_id, after=record.revision, deadline=deadline):
                pass  # the entries end at a resting state
        return self.get(job_id)

    def follow(
        self, job_id: str, *, after: int = 0, timeout: float | None = None
    ) -> Iterator[Delta]:
        """Durable text deltas of the job after revision ``after``, as they are written.

        Blocks for more; ends when the job ends. ``timeout`` bounds the whole follow
        (``TimeoutError``); without it, a follower of a spilled job waits for the
        operator. Raises :class:`~resumeq.core.errors.JobNotFound` for an unknown job.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        for revision, fields in self._entries(
            job_id, after=after, deadline=deadline, stop_at_spill=False
        ):
            delta = delta_of(revision, fields)
            if delta is not None:
                yield delta

    def _entries(
        self,
        job_id: str,
        *,
        after: int,
        deadline: float | None,
        stop_at_spill: bool = True,
    ) -> Iterator[tuple[int, dict[str, str]]]:
        """Events after revision ``after``, blocking for more, until a resting state."""
        cursor = EventCursor(job_id, after=after, deadline=deadline, stop_at_spill=stop_at_spill)
        cursor.start(self.store.get(job_id))  # JobNotFound for an unknown job
        while not cursor.ended:
            if cursor.gap:
                yield from cursor.fill(*self.store.snapshot(job_id))
                continue
            block = cursor.block_ms(time.monotonic())
            with redis_errors("follow"):
                reply: Any = self.redis.xread(cursor.streams, count=cursor.count, block=block)
                if not reply:
                    cursor.idle(self.redis.hmget(cursor.job_key, cursor.probe))
            yield from cursor.take(reply)
