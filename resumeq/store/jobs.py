"""A job's lifecycle and its reads: create, cancel, fail, purge, and the record, text and
ledger read back (one job, or many in one round trip).

Every method is one round trip (one script, or one read).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import redis

from resumeq.core import names
from resumeq.core.defaults import LIMIT_DEFAULTS, LimitDefaults
from resumeq.core.errors import IdempotencyConflict, JobNotFound, StoreError
from resumeq.core.models import CreateResult, JobRecord
from resumeq.core.spec_rules import CheckedSpec, quick_spec
from resumeq.store import keys
from resumeq.store.codec import (
    check_owner,
    check_queue,
    decode,
    decode_text,
    fields_of,
    job_record,
    non_negative,
)
from resumeq.store.transport import WRITE_TRIES, Transport, refused

if TYPE_CHECKING:
    from resumeq.core.spec import JobSpec, Limits

#: The indexes a script that ends a job (or an attempt) takes it out of or puts it in.
ENDING_INDEXES = (keys.RUNNING, keys.STALLED, keys.ENDED)


def ending_keys(job_id: str) -> list[str]:
    """The keys a script that ends a job from any state touches (cancel, fail)."""
    return [
        keys.job(job_id),
        keys.lease(job_id),
        keys.LEASES,
        keys.QUEUED,
        keys.SPILLED,
        keys.events(job_id),
        keys.text(job_id),
        keys.ledger(job_id),
        keys.outbox(job_id),
        keys.OUTBOX,
        *ENDING_INDEXES,
        keys.TOTALS,
    ]


class Jobs:
    """Jobs written and read whole: what a producer, an operator and a follower do."""

    def __init__(self, transport: Transport, limits: Limits | LimitDefaults | None) -> None:
        self.transport = transport
        #: The limits specs are validated against (None: the defaults).
        self.limits = limits

    # -- a job's lifecycle ---------------------------------------------------------------

    def create(
        self,
        spec: JobSpec | Mapping[str, Any],
        *,
        queue: str = keys.DEFAULT_QUEUE,
        job_id: str | None = None,
        owner: str | None = None,
        request_hash: str | None = None,
    ) -> CreateResult:
        """Validate ``spec`` and write the job record (state ``queued``, cursor 0);
        ``owner``: the principal that creates it (the HTTP service's producers);
        ``request_hash``: what created it, kept to compare an idempotent repeat with.

        Raises :class:`~resumeq.core.errors.InvalidSpec` before anything is written. With an
        idempotency key, a second create answers the first job's id (``created=False``),
        or raises :class:`~resumeq.core.errors.IdempotencyConflict` if the prompt differs.
        """
        checked = self._checked(spec)
        check_queue(queue)
        job_id = names.check_job_id(job_id) if job_id is not None else uuid.uuid4().hex
        job_keys = [
            keys.job(job_id),
            keys.QUEUED,
            keys.outbox(job_id),
            keys.OUTBOX,
            keys.TOTALS,
            keys.JOBS,
        ]
        if checked.idempotency_key is not None:
            job_keys.append(keys.idempotency(checked.idempotency_key))
        args: list[str | int] = [
            job_id,
            checked.json,
            checked.prompt_hash,
            checked.budget_tokens,
            checked.floor_tokens,
            queue,
            checked.idempotency_key or "",
            self.transport.request_id(),
            check_owner(owner) if owner else "",
            request_hash or "",
        ]
        status, *rest = self.transport.run("create", job_keys, args, job_id, tries=WRITE_TRIES)
        bound_id = decode(rest[0])
        if status == "created":  # with its first attempt's outbox entry, unless sent again
            follow_up = decode(rest[1]) if len(rest) > 1 else None
            return CreateResult(id=bound_id, created=True, follow_up=follow_up)
        if status == "exists":
            return CreateResult(id=bound_id, created=False)
        if status == "idempotency_conflict":
            raise IdempotencyConflict(
                f"idempotency key {checked.idempotency_key!r} is bound to job {bound_id} "
                "whose prompt differs",
                job_id=job_id,
                existing_job_id=bound_id,
            )
        if status == "id_taken":
            raise StoreError(f"job id {job_id} is already taken", job_id=job_id)
        refused(status, rest, job_id, "create")

    def _checked(self, spec: JobSpec | Mapping[str, Any]) -> CheckedSpec:
        """``spec`` validated against this store's limits: by the rules alone where they
        decide (:func:`~resumeq.core.spec_rules.quick_spec`), else by the model."""
        if isinstance(spec, Mapping):
            quick = quick_spec(spec, self.limits or LIMIT_DEFAULTS)
            if quick is not None:
                return quick
        from resumeq.core.spec import parse_spec  # noqa: PLC0415

        return CheckedSpec.of(parse_spec(spec, limits=self.limits))

    def cancel(self, job_id: str, *, reason: str = "cancelled") -> int:
        """Cancel a job that is not terminal; answers the new revision."""
        job_keys = [
            *ending_keys(job_id),
            keys.STOP_RESPONSES,
            *self.transport.idempotency_key_of(job_id),
        ]
        args: list[str | int] = [
            reason,
            self.transport.settings.retention_s,
            self.transport.request_id(),
        ]
        return self.transport.write("cancel", job_keys, args, job_id)

    def fail_unreadable(self, job_id: str, *, reason: str) -> int:
        """End a job whose record cannot be read back as ``failed`` (janitor only): no
        field of it is trusted. Answers the new revision."""
        try:
            idem = self.transport.idempotency_key_of(job_id)  # expires with the job, if it names it
        except ValueError:
            idem = []  # that field is as unreadable as the rest
        job_keys = [*ending_keys(job_id), *idem]
        args: list[str | int] = [job_id, reason, self.transport.settings.retention_s]
        return self.transport.write("fail", job_keys, args, job_id)

    def purge(self, job_id: str) -> int:
        """Remove a job that no worker holds, and everything it owns (text, events, ledger,
        idempotency key). Answers how many keys were deleted."""
        job_keys = [
            keys.job(job_id),
            keys.text(job_id),
            keys.lease(job_id),
            keys.events(job_id),
            keys.ledger(job_id),
            keys.LEASES,
            keys.QUEUED,
            keys.SPILLED,
            keys.outbox(job_id),
            keys.OUTBOX,
            keys.RUNNING,
            keys.STALLED,
            keys.ENDED,
            keys.JOBS,
            *self.transport.idempotency_key_of(job_id),
        ]
        status, *rest = self.transport.run("purge", job_keys, [job_id], job_id, tries=WRITE_TRIES)
        if status != "ok":
            refused(status, rest, job_id, "purge")
        return int(rest[0])

    # -- reads ---------------------------------------------------------------------------

    def ping(self) -> None:
        """Redis answers, or :class:`~resumeq.core.errors.RedisUnavailable`."""
        self.transport.read("ping", lambda r: r.ping())

    def get(self, job_id: str) -> JobRecord:
        fields = self.transport.read("get", lambda r: r.hgetall(keys.job(job_id)))
        if not fields:
            raise JobNotFound(f"no job {job_id}", job_id=job_id)
        return job_record(job_id, fields_of(fields))

    def get_many(self, job_ids: Sequence[str]) -> list[JobRecord | None]:
        """Each job's record, in one round trip (None for a job that is gone)."""

        def all_of(r: redis.Redis) -> list[Any]:
            with r.pipeline(transaction=False) as pipe:
                for job_id in job_ids:
                    pipe.hgetall(keys.job(job_id))
                return pipe.execute()

        raw = self.transport.read("get", all_of) if job_ids else []
        return [
            job_record(job_id, fields_of(fields)) if fields else None
            for job_id, fields in zip(job_ids, raw, strict=True)
        ]

    def records(self, job_ids: Sequence[str]) -> list[JobRecord | StoreError]:
        """:meth:`get` for many jobs, in one round trip: for each, its record, or
        :class:`~resumeq.core.errors.JobNotFound` / :class:`~resumeq.core.errors.CorruptRecord`."""

        def read(r: redis.Redis) -> list[Any]:
            with r.pipeline(transaction=False) as pipe:
                for job_id in job_ids:
                    pipe.hgetall(keys.job(job_id))
                return pipe.execute()

        replies = self.transport.read("records", read) if job_ids else []
        out: list[JobRecord | StoreError] = []
        for job_id, fields in zip(job_ids, replies, strict=True):
            try:
                if not fields:
                    raise JobNotFound(f"no job {job_id}", job_id=job_id)
                decoded = fields_of(fields)
                out.append(job_record(job_id, decoded, check_spec=True))
            except StoreError as exc:
                out.append(exc)
        return out

    def texts(self, job_ids: Sequence[str]) -> list[str]:
        """Each job's durable prefix, in one round trip ("" for a job that has none)."""

        def all_of(r: redis.Redis) -> list[Any]:
            with r.pipeline(transaction=False) as pipe:
                for job_id in job_ids:
                    pipe.get(keys.text(job_id))
                return pipe.execute()

        return [decode_text(raw) for raw in self.transport.read("text", all_of)] if job_ids else []

    def text_size(self, job_id: str) -> tuple[int, int]:
        """The job's revision and its text's length in bytes, read together."""

        def both(r: redis.Redis) -> list[Any]:
            with r.pipeline(transaction=True) as pipe:
                pipe.hget(keys.job(job_id), "revision")
                pipe.strlen(keys.text(job_id))
                return pipe.execute()

        revision, size = self.transport.read("text size", both)
        if revision is None:
            raise JobNotFound(f"no job {job_id}", job_id=job_id)
        return int(revision), int(size)

    def snapshot(self, job_id: str) -> tuple[JobRecord, str]:
        """The record and its text as of one revision, read in one transaction: the text
        is never ahead of the revision (a follower resumes after it without repeats)."""

        def both(r: redis.Redis) -> list[Any]:
            with r.pipeline(transaction=True) as pipe:
                pipe.hgetall(keys.job(job_id))
                pipe.get(keys.text(job_id))
                return pipe.execute()

        fields, raw = self.transport.read("snapshot", both)
        if not fields:
            raise JobNotFound(f"no job {job_id}", job_id=job_id)
        record = job_record(job_id, fields_of(fields))
        return record, decode_text(raw)

    def text(self, job_id: str) -> str:
        """The durable prefix (the whole text once the job is done)."""
        return decode_text(self.transport.read("text", lambda r: r.get(keys.text(job_id))))

    def text_bytes(self, job_id: str) -> int:
        """Length of the stored prefix in bytes (UTF-8) of a job whose events are not
        trimmed (a trimmed job's text may be stored compressed: see ``text_offsets``)."""
        return int(self.transport.read("text_bytes", lambda r: r.strlen(keys.text(job_id))))

    def attempt_texts(self, bases: Sequence[tuple[str, int]]) -> list[tuple[int, str]]:
        """For each ``(job id, byte offset)``, in one round trip: the length of the job's
        stored prefix in bytes, and its text from that offset on (a character boundary:
        where an attempt's text began). For jobs whose events are not trimmed."""

        def read(r: redis.Redis) -> list[Any]:
            with r.pipeline(transaction=False) as pipe:
                for job_id, offset in bases:
                    pipe.strlen(keys.text(job_id))
                    pipe.getrange(keys.text(job_id), non_negative(offset, "offset"), -1)
                return pipe.execute()

        replies = self.transport.read("attempt_texts", read) if bases else []
        it = iter(replies)
        return [
            (int(size), (tail or b"").decode("utf-8", errors="replace"))
            for size, tail in zip(it, it, strict=True)
        ]

    def ledger(self, job_id: str) -> list[dict[str, Any]]:
        raw = self.transport.read("ledger", lambda r: r.lrange(keys.ledger(job_id), 0, -1))
        return [json.loads(decode(item)) for item in raw]
