"""The producer API (SPEC §12): what a web app uses to enqueue, read, wait for, cancel and
follow jobs.

``follow`` reads the job's events stream: one entry per revision, text deltas among them.
Every delta it yields is durable — already checkpointed, never taken back by a resume — so
a follower sees one continuous text across cuts and attempts. Start it late, or again
after any revision, and it yields exactly the text not seen yet.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import redis

from resumeq import keys
from resumeq.errors import JobNotFound
from resumeq.models import JobRecord, JobState
from resumeq.producer import enqueue_job
from resumeq.settings import StoreSettings
from resumeq.spec import JobSpec, Limits
from resumeq.store import DEFAULT_QUEUE, Store, decode, redis_errors

#: States no worker moves a job out of on its own: ``wait`` returns on them.
RESTING_STATES = frozenset({*(s.value for s in JobState if s.terminal), JobState.SPILLED.value})
#: How long one blocking read of the events stream waits before checking the clock.
_BLOCK_MS = 1000


@dataclass(frozen=True)
class Delta:
    """Durable text, with the revision that wrote it (resume a follower after it)."""

    revision: int
    text: str


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

    @property
    def ended(self) -> bool:
        return self.state.terminal


class Client:
    """A producer's handle on resumeq: one Redis connection, no workers needed."""

    def __init__(
        self,
        connection: redis.Redis,
        *,
        settings: StoreSettings | None = None,
        limits: Limits | None = None,
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
        :class:`~resumeq.errors.InvalidSpec` naming every bad field; nothing is written.
        """
        return enqueue_job(self.store, self.redis, spec, queue=queue).id

    def get(self, job_id: str) -> Job:
        """The job as of one revision: its text is exactly the text up to ``revision``, so
        ``follow(after=job.revision)`` goes on from there without a repeat."""
        record, text = self.store.snapshot(job_id)
        return Job(
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
        )

    def cancel(self, job_id: str, *, reason: str = "cancelled by producer") -> Job:
        self.store.cancel(job_id, reason=reason)
        return self.get(job_id)

    def wait(self, job_id: str, timeout: float) -> Job:
        """Block until the job ends (or spills: it then waits for a person); raise
        ``TimeoutError`` after ``timeout`` seconds."""
        record = self.store.get(job_id)
        if record.state.value not in RESTING_STATES:
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
        operator. Raises :class:`~resumeq.errors.JobNotFound` for an unknown job.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        for revision, fields in self._entries(
            job_id, after=after, deadline=deadline, stop_at_spill=False
        ):
            delta = fields.get("delta")
            if delta:
                yield Delta(revision, delta)

    def _entries(
        self,
        job_id: str,
        *,
        after: int,
        deadline: float | None,
        stop_at_spill: bool = True,
    ) -> Iterator[tuple[int, dict[str, str]]]:
        """Events after revision ``after``, blocking for more, until a resting state."""
        record = self.store.get(job_id)  # JobNotFound for an unknown job
        stream = keys.events(job_id)
        last_id = "0-0"
        stops = RESTING_STATES if stop_at_spill else {s.value for s in JobState if s.terminal}
        if record.revision <= after and record.state.value in stops:
            return
        while True:
            block = _BLOCK_MS
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"job {job_id} did not end in time")
                block = max(1, min(block, int(left * 1000)))
            with redis_errors("follow"):
                reply: Any = self.redis.xread({stream: last_id}, count=500, block=block)
                if not reply and not self.redis.exists(keys.job(job_id)):
                    raise JobNotFound(f"job {job_id} is gone", job_id=job_id)
            for entry_id, raw in reply[0][1] if reply else ():
                last_id = decode(entry_id)
                fields = {decode(k): decode(v) for k, v in raw.items()}
                revision = int(fields["rev"])
                if revision <= after:
                    continue
                yield revision, fields
                if fields.get("state") in stops:
                    return
