"""The fenced job store: a small API over the Lua scripts.

Every method is one round trip (one script, or one read). Every refusal a script answers
becomes a typed exception from :mod:`resumeq.core.errors`; redis-py's errors are translated
here, once. The store works on a bytes-mode Redis client (the one RQ uses too).

No write is re-sent blindly. Each carries a request id, kept in the record by the write
that applied it; when Redis does not answer, the write is sent again unchanged, and one
that had been applied answers as it did instead of being refused or applied twice (the
client must not retry on its own: see :mod:`resumeq.store.connection`).
"""

from __future__ import annotations

import functools
import json
import re
import secrets
import time
import uuid
import zlib
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, NoReturn, TypeVar, cast

import redis

from resumeq.core import names
from resumeq.core.defaults import LIMIT_DEFAULTS, STORE_DEFAULTS, LimitDefaults, StoreDefaults
from resumeq.core.errors import (
    CorruptRecord,
    IdempotencyConflict,
    InvalidTransition,
    JobCancelled,
    JobNotFound,
    LeaseLost,
    RedisUnavailable,
    ReplicaLagging,
    SpillExhausted,
    StaleRevision,
    StoreError,
)
from resumeq.core.models import (
    Acquired,
    CreateResult,
    FlushResult,
    JobRecord,
    Lease,
    ResponsePosition,
    lease_holder,
)
from resumeq.core.spec_rules import CheckedSpec, quick_spec
from resumeq.store import keys
from resumeq.store.connection import connect
from resumeq.store.scripts import Scripts

if TYPE_CHECKING:
    from resumeq.core.settings import StoreSettings
    from resumeq.core.spec import JobSpec, Limits

R = TypeVar("R")

#: The queue names (defined with the keys, so that a command line can name them without
#: loading the store).
DEFAULT_QUEUE = keys.DEFAULT_QUEUE
SPILL_QUEUE = keys.SPILL_QUEUE
#: How often a write is sent when Redis does not answer, and the pause before the first
#: re-send (doubled each time).
WRITE_TRIES = 3
RETRY_PAUSE_S = 0.1
#: The most provider series the metrics show (``resumeq stats --forget-provider`` retires one).
MAX_PROVIDER_SERIES = 200
#: The writes that add an event at a revision they answer (``{'ok', revision, ...}``):
#: with ``[store] durability = "replica"`` each waits for a replica, then marks its
#: revision durable for the followers.
REPLICATED = frozenset(("flush", "finish", "release", "cancel", "fail", "drop", "requeue"))

#: A queue name (the HTTP API's OpenAPI document states the same).
QUEUE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$"
_QUEUE_RE = re.compile(QUEUE_PATTERN)
_OWNER_RE = re.compile(r"^[A-Za-z0-9_.@-]{1,100}$")


def decode(value: Any) -> str:
    """A reply element as text (the store uses a bytes-mode client, like RQ)."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


_s = decode

#: An ended job's text, once its events are trimmed, is stored compressed (zlib) after
#: these two bytes — which no UTF-8 text starts with (0xFF never occurs in UTF-8).
PACKED_TEXT = b"\xffz"


def decode_text(raw: Any) -> str:
    """A text key's value as text, whether stored as written or compressed."""
    if raw is None:
        return ""
    if isinstance(raw, bytes) and raw.startswith(PACKED_TEXT):
        return zlib.decompress(raw[len(PACKED_TEXT) :]).decode("utf-8")
    return decode(raw)


def pack_text(raw: bytes) -> bytes | None:
    """The compressed form of a text key's value, if it is smaller."""
    if not raw or raw.startswith(PACKED_TEXT):
        return None
    packed = PACKED_TEXT + zlib.compress(raw, 6)
    return packed if len(packed) < len(raw) else None


def _pairs(flat: list[Any]) -> dict[str, str]:
    it = iter(_s(v) for v in flat)
    return dict(zip(it, it, strict=True))


def check_queue(name: str) -> str:
    if not _QUEUE_RE.fullmatch(name):
        raise ValueError(f"malformed queue name {name!r}")
    return name


def _spilled_page(r: redis.Redis, *, low: int | str, start: int, count: int) -> Any:
    return r.zrangebyscore(keys.SPILLED, low, "+inf", start=start, num=count, withscores=True)


def _check_owner(name: str) -> str:
    if not _OWNER_RE.fullmatch(name):
        raise ValueError(f"malformed worker or janitor id {name!r}")
    return name


@contextmanager
def redis_errors(op: str) -> Iterator[None]:
    """redis-py's errors as resumeq's, each message naming ``op`` and the cause.

    A refused login (wrong credentials, or none where Redis requires them) says so; it is a
    :class:`RedisUnavailable` too, since nothing gets through until it is fixed. redis-py
    raises it as an ``AuthenticationError`` (with the NOAUTH or WRONGPASS code taken off),
    an ``AuthenticationWrongNumberOfArgsError``, or, from servers it does not map, as a
    response error whose text starts with the code.
    """
    try:
        yield
    except redis.RedisError as exc:
        text = str(exc)
        none_given = ("NOAUTH", "HELLO must be called", "Authentication required")
        if isinstance(
            exc, redis.AuthenticationError | redis.AuthenticationWrongNumberOfArgsError
        ) or (isinstance(exc, redis.ResponseError) and text.startswith(("WRONGPASS", *none_given))):
            if text.startswith(none_given):
                text = (
                    "none were given and this Redis requires them "
                    "(redis://USER:PASSWORD@host:port/db; no USER for the default user)"
                )
            raise RedisUnavailable(f"{op}: Redis refused the credentials: {text}") from exc
        if isinstance(exc, redis.ConnectionError | redis.TimeoutError | redis.ReadOnlyError):
            # READONLY: a replica promoted away from under us (a failover): try again later.
            raise RedisUnavailable(f"{op}: Redis unreachable: {exc}") from exc
        raise StoreError(f"{op}: Redis answered an error: {exc}") from exc


def request_id() -> str:
    """A write's request id: what makes a re-send of it recognisable."""
    return secrets.token_hex(8)


class ReapResult:
    """What a reap found: ``reaped`` (with the janitor's lease), ``alive`` or ``gone``."""

    __slots__ = ("acquired", "state", "status")

    def __init__(
        self,
        status: Literal["reaped", "alive", "gone"],
        *,
        acquired: Acquired | None = None,
        state: str | None = None,
    ) -> None:
        self.status = status
        self.acquired = acquired
        self.state = state

    def __repr__(self) -> str:
        return f"ReapResult({self.status!r}, state={self.state!r})"


@dataclass(frozen=True)
class ResponseToStop:
    """A background response to cancel at the provider (:data:`keys.STOP_RESPONSES`)."""

    member: str
    job_id: str
    response_id: str
    provider: str
    since_ms: int


class Store:
    """Jobs in Redis, written only through fenced scripts."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        settings: StoreSettings | StoreDefaults | None = None,
        limits: Limits | LimitDefaults | None = None,
    ) -> None:
        self.redis = client
        #: Providers this process registered already (:meth:`_note_provider`).
        self._providers_noted: set[str] = set()
        self.settings: StoreSettings | StoreDefaults = settings or STORE_DEFAULTS
        #: The limits specs are validated against (None: the defaults); a config file's
        #: digest gives them as plain values (:mod:`resumeq.core.config_digest`).
        self.limits = limits
        self._scripts = Scripts(client)

    @property
    def replicated(self) -> bool:
        """Whether a write counts only once a replica acknowledged it (``[store]
        durability = "replica"``)."""
        return self.settings.durability == "replica"

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> Store:
        try:
            client = connect(url)
        except ValueError as exc:
            raise StoreError(f"invalid Redis URL: {exc}") from None
        return cls(client, **kwargs)

    # -- producer side -------------------------------------------------------------------

    def create(
        self,
        spec: JobSpec | Mapping[str, Any],
        *,
        queue: str = DEFAULT_QUEUE,
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
            request_id(),
            _check_owner(owner) if owner else "",
            request_hash or "",
        ]
        status, *rest = self._run("create", job_keys, args, job_id, tries=WRITE_TRIES)
        bound_id = _s(rest[0])
        if status == "created":  # with its first attempt's outbox entry, unless sent again
            follow_up = _s(rest[1]) if len(rest) > 1 else None
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
        self._refused(status, rest, job_id, "create")

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
            *_ending_keys(job_id),
            keys.STOP_RESPONSES,
            *self._idempotency_key_of(job_id),
        ]
        args: list[str | int] = [reason, self.settings.retention_s, request_id()]
        return self._write("cancel", job_keys, args, job_id)

    # -- background responses to stop at the provider ----------------------------------

    def leases_held_by(self, workers: Collection[str]) -> dict[str, str]:
        """Job id → fencing token of every lease held by one of ``workers`` (by the name in
        its token): read when workers died, not on every check (O(leases), pipelined)."""
        if not workers:
            return {}
        job_ids = [decode(j) for j in self._read("leases", lambda r: r.zrange(keys.LEASES, 0, -1))]
        held: dict[str, str] = {}
        for start in range(0, len(job_ids), 1000):
            batch = job_ids[start : start + 1000]

            def tokens(r: redis.Redis, batch: list[str] = batch) -> list[Any]:
                return cast(list[Any], r.mget([keys.lease(j) for j in batch]))

            for job_id, token in zip(batch, self._read("lease tokens", tokens), strict=True):
                if token is not None and lease_holder(decode(token)) in workers:
                    held[job_id] = decode(token)
        return held

    def responses_to_stop(self, limit: int = 100) -> list[ResponseToStop]:
        """Background responses that may still be generating for nobody, oldest first."""
        got = self._read(
            "responses_to_stop",
            lambda r: r.zrange(keys.STOP_RESPONSES, 0, limit - 1, withscores=True),
        )
        out: list[ResponseToStop] = []
        for member, score in cast(list[Any], got):
            job_id, response_id, provider = [*decode(member).split(" ", 2), "", ""][:3]
            out.append(ResponseToStop(decode(member), job_id, response_id, provider, int(score)))
        return out

    def stop_responses(self, responses: Sequence[tuple[str, str, str]]) -> None:
        """Add ``(job id, response id, provider)``: responses to cancel at the provider."""
        if responses:
            now = int(time.time() * 1000)
            members = {" ".join(r): now for r in responses}
            self._read("stop_responses", lambda r: r.zadd(keys.STOP_RESPONSES, members, nx=True))

    def responses_stopped(self, members: Sequence[str]) -> None:
        """Those were cancelled (or cannot be): forget them."""
        if members:
            self._read("responses_stopped", lambda r: r.zrem(keys.STOP_RESPONSES, *members))

    # -- operator side (the spill lane) ---------------------------------------------------

    def requeue(
        self,
        job_id: str,
        *,
        queue: str | None = None,
        provider: str | None = None,
        budget: int | None = None,
        floor: int | None = None,
        expected_revision: int | None = None,
    ) -> int:
        """Send a spilled job back to a queue, maybe another one, another provider, a
        larger budget or another floor. Answers the new revision.

        Naming another provider profile re-pins the prompt hash to the edited spec: the
        operator chose to continue the stored prefix there. A new ``budget`` must leave
        room past what was already spent, and the floor must fit in what is left (neither
        is part of the prompt hash): :class:`ValueError` naming the field, nothing written.
        """
        spec_json, new_hash = "", ""
        if provider is not None or budget is not None or floor is not None:
            record = self.get(job_id)
            update: dict[str, Any] = {}
            if provider is not None:
                update["provider"] = provider
            if budget is not None:
                if budget <= record.spent_output_tokens:
                    raise ValueError(
                        f"budget_tokens: {budget} leaves nothing past the "
                        f"{record.spent_output_tokens} tokens already spent"
                    )
                update["budget_tokens"] = budget
            if floor is not None:
                left = (budget or record.budget_tokens) - record.spent_output_tokens
                if not 1 <= floor <= left:
                    raise ValueError(
                        f"floor_tokens: {floor} must be from 1 to the {left} tokens left "
                        "(else the job spills again at once)"
                    )
                update["floor_tokens"] = floor
            from resumeq.core.spec import parse_spec  # noqa: PLC0415

            edited = record.spec.model_dump(mode="json") | update
            spec = parse_spec(edited, limits=self.limits)
            spec_json, new_hash = spec.to_json(), spec.prompt_hash()
        job_keys = [
            keys.job(job_id),
            keys.QUEUED,
            keys.SPILLED,
            keys.events(job_id),
            keys.outbox(job_id),
            keys.OUTBOX,
        ]
        args: list[str | int] = [
            check_queue(queue) if queue is not None else "",
            spec_json,
            new_hash,
            _optional(expected_revision),
            request_id(),
            budget if budget is not None else "",
            floor if floor is not None else "",
        ]
        return self._write("requeue", job_keys, args, job_id, expected_revision)

    def drop(self, job_id: str, *, reason: str = "dropped by operator") -> int:
        """Give up on a spilled job (terminal; its partial text stays readable)."""
        job_keys = [
            keys.job(job_id),
            keys.SPILLED,
            keys.events(job_id),
            keys.text(job_id),
            keys.ledger(job_id),
            keys.outbox(job_id),
            keys.OUTBOX,
            keys.ENDED,
            keys.TOTALS,
            *self._idempotency_key_of(job_id),
        ]
        args: list[str | int] = [reason, self.settings.retention_s, request_id()]
        return self._write("drop", job_keys, args, job_id)

    def spilled(self, *, limit: int = 1000) -> list[str]:
        """Ids of spilled jobs, oldest spill first."""
        ids = self._read("spilled", lambda r: r.zrange(keys.SPILLED, 0, limit - 1))
        return [_s(i) for i in ids]

    def spilled_after(self, after: tuple[int, str] | None, count: int) -> list[tuple[str, int]]:
        """``(job id, spilled ms)`` of up to ``count`` spilled jobs after ``after`` (a
        spill time and id) in the spill index's order: oldest spill first, ties by id."""
        low: int | str = after[0] if after is not None else "-inf"
        found: list[tuple[str, int]] = []
        offset = 0
        while len(found) < count:
            page = functools.partial(_spilled_page, low=low, start=offset, count=count)
            rows = self._read("spilled", page)
            if not rows:
                break
            offset += len(rows)
            for member, score in rows:
                entry = (_s(member), int(score))
                if after is None or (entry[1], entry[0]) > after:
                    found.append(entry)
        return found[:count]

    def fail_unreadable(self, job_id: str, *, reason: str) -> int:
        """End a job whose record cannot be read back as ``failed`` (janitor only): no
        field of it is trusted. Answers the new revision."""
        try:
            idem = self._idempotency_key_of(job_id)  # expires with the job, if it names it
        except ValueError:
            idem = []  # that field is as unreadable as the rest
        job_keys = [*_ending_keys(job_id), *idem]
        args: list[str | int] = [job_id, reason, self.settings.retention_s]
        return self._write("fail", job_keys, args, job_id)

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
            *self._idempotency_key_of(job_id),
        ]
        status, *rest = self._run("purge", job_keys, [job_id], job_id, tries=WRITE_TRIES)
        if status != "ok":
            self._refused(status, rest, job_id, "purge")
        return int(rest[0])

    # -- reads ---------------------------------------------------------------------------

    def ping(self) -> None:
        """Redis answers, or :class:`~resumeq.core.errors.RedisUnavailable`."""
        self._read("ping", lambda r: r.ping())

    def get(self, job_id: str) -> JobRecord:
        fields = self._read("get", lambda r: r.hgetall(keys.job(job_id)))
        if not fields:
            raise JobNotFound(f"no job {job_id}", job_id=job_id)
        return _record(job_id, {_s(k): _s(v) for k, v in fields.items()})

    def get_many(self, job_ids: Sequence[str]) -> list[JobRecord | None]:
        """Each job's record, in one round trip (None for a job that is gone)."""

        def all_of(r: redis.Redis) -> list[Any]:
            with r.pipeline(transaction=False) as pipe:
                for job_id in job_ids:
                    pipe.hgetall(keys.job(job_id))
                return pipe.execute()

        raw = self._read("get", all_of) if job_ids else []
        return [
            _record(job_id, {_s(k): _s(v) for k, v in fields.items()}) if fields else None
            for job_id, fields in zip(job_ids, raw, strict=True)
        ]

    def texts(self, job_ids: Sequence[str]) -> list[str]:
        """Each job's durable prefix, in one round trip ("" for a job that has none)."""

        def all_of(r: redis.Redis) -> list[Any]:
            with r.pipeline(transaction=False) as pipe:
                for job_id in job_ids:
                    pipe.get(keys.text(job_id))
                return pipe.execute()

        return [decode_text(raw) for raw in self._read("text", all_of)] if job_ids else []

    def text_size(self, job_id: str) -> tuple[int, int]:
        """The job's revision and its text's length in bytes, read together."""

        def both(r: redis.Redis) -> list[Any]:
            with r.pipeline(transaction=True) as pipe:
                pipe.hget(keys.job(job_id), "revision")
                pipe.strlen(keys.text(job_id))
                return pipe.execute()

        revision, size = self._read("text size", both)
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

        fields, raw = self._read("snapshot", both)
        if not fields:
            raise JobNotFound(f"no job {job_id}", job_id=job_id)
        record = _record(job_id, {_s(k): _s(v) for k, v in fields.items()})
        return record, decode_text(raw)

    def text(self, job_id: str) -> str:
        """The durable prefix (the whole text once the job is done)."""
        return decode_text(self._read("text", lambda r: r.get(keys.text(job_id))))

    def text_bytes(self, job_id: str) -> int:
        """Length of the stored prefix in bytes (UTF-8) of a job whose events are not
        trimmed (a trimmed job's text may be stored compressed: see ``text_offsets``)."""
        return int(self._read("text_bytes", lambda r: r.strlen(keys.text(job_id))))

    def queued_before(self, age_ms: int, *, limit: int = 200) -> list[str]:
        """Ids of jobs queued at least ``age_ms`` ago (Redis server time), oldest first."""
        return self._before(keys.QUEUED, age_ms, limit, "queued_before")

    def ledger(self, job_id: str) -> list[dict[str, Any]]:
        raw = self._read("ledger", lambda r: r.lrange(keys.ledger(job_id), 0, -1))
        return [json.loads(_s(item)) for item in raw]

    def expired_leases(self, *, limit: int = 100) -> list[str]:
        """Ids of jobs whose lease deadline (Redis server time) has passed."""
        return self._before(keys.LEASES, 0, limit, "expired_leases")

    # -- the outbox ----------------------------------------------------------------------

    def outbox(self, job_id: str) -> dict[str, str]:
        """What must still follow the job's last commit: field → entry."""
        raw = self._read("outbox", lambda r: r.hgetall(keys.outbox(job_id)))
        return {_s(k): _s(v) for k, v in raw.items()}

    def outbox_done(self, job_id: str, field: str, entry: str) -> int:
        """An outbox entry was carried out: remove it if it is still ``entry``. Answers
        how many entries the job has left."""
        job_keys = [keys.outbox(job_id), keys.OUTBOX]
        status, *rest = self._run("outbox_done", job_keys, [job_id, field, entry], job_id,
                                  tries=WRITE_TRIES)  # fmt: skip
        if status != "ok":
            self._refused(status, rest, job_id, "outbox_done")
        return int(rest[0])

    def outbox_prune(self, job_id: str) -> None:
        """Forget the job in the outbox index if its outbox is empty (it expired with a
        job that ended while entries were pending), atomically: a commit adding an entry
        meanwhile keeps it."""
        self._run("outbox_done", [keys.outbox(job_id), keys.OUTBOX], [job_id, "", ""], job_id,
                  tries=WRITE_TRIES)  # fmt: skip

    def outbox_replace(self, job_id: str, field: str, entry: str, new: str) -> bool:
        """Replace an outbox entry if it is still ``entry``; answers whether it was."""
        status, *_ = self._run("outbox_set", [keys.outbox(job_id)], [field, entry, new], job_id,
                               tries=WRITE_TRIES)  # fmt: skip
        return bool(status == "ok")

    def append_ledger(
        self,
        job_id: str,
        *,
        attempt: int,
        entry: Mapping[str, Any],
        counts_response: str | None = None,
    ) -> bool:
        """Record an attempt that ended without an exit of its own (stopped by a cancel,
        fenced out): at most one record per attempt. ``counts_response``: the background
        response whose output past the cursor the record counts (nobody counts it again:
        :meth:`amend_ledger`). Answers whether it was written."""
        self._note_provider(entry)
        job_keys = [keys.job(job_id), keys.ledger(job_id), *_totals_keys(entry)]
        args: list[str | int] = [
            attempt,
            _ledger_json(entry),
            _totals_json(entry),
            counts_response or "",
        ]
        status, *rest = self._run("ledger_append", job_keys, args, job_id, tries=WRITE_TRIES)
        if status == "not_found":
            return False
        if status not in ("ok", "recorded"):
            self._refused(status, rest, job_id, "ledger_append")
        return bool(status == "ok")

    # -- events after the end ------------------------------------------------------------

    def mark_ended(self, *, limit: int = 1000) -> int:
        """With replica durability: mark durable the last revision of every ended job no
        marker covers yet (its ending write was never confirmed by a replica — retried out,
        or its marker lost in a failover), so that its followers stop holding it. One write
        of this connection and a ``WAIT 1`` after it: a replica that acknowledges it holds
        every write before it. Answers how many jobs were marked; :class:`ReplicaLagging`
        if no replica acknowledged."""

        def unmarked(r: redis.Redis) -> list[tuple[str, int]]:
            ids = [_s(i) for i in r.zrange(keys.ENDED, 0, limit - 1)]
            with r.pipeline(transaction=False) as pipe:
                for job_id in ids:
                    pipe.hmget(keys.job(job_id), ["revision", "durable_revision"])
                found = pipe.execute()
            return [
                (job_id, int(rev))
                for job_id, (rev, marked) in zip(ids, found, strict=True)
                if rev is not None and int(rev) > int(marked or 0)
            ]

        revisions = self._read("ended jobs unmarked", unmarked)
        if not revisions:
            return 0
        with redis_errors("mark ended"), self.redis.pipeline(transaction=False) as pipe:
            pipe.incr(keys.DURABILITY_PROBE)
            pipe.execute_command("WAIT", 1, self.settings.replica_timeout_ms)  # type: ignore[no-untyped-call]
            _, acked = pipe.execute()
            self._acknowledged("mark ended", int(acked), revisions)
        return len(revisions)

    def ended_before(self, age_ms: int, *, limit: int = 200) -> list[str]:
        """Ids of jobs that ended at least ``age_ms`` ago and whose events stream is not
        trimmed yet, oldest first."""
        return self._before(keys.ENDED, age_ms, limit, "ended_before")

    def trim_events(self, job_id: str) -> int:
        """Remove an ended job's events stream, keeping in the job hash where each text
        delta ended so a late follower reads the rest from the text; store the text again,
        compressed when that is smaller (else at its exact size), and drop what only a
        running job needs. Answers how many entries were removed (0 when there was nothing
        to trim: the job is gone, not ended, or trimmed already)."""
        job_keys = [keys.job(job_id), keys.events(job_id), keys.text(job_id), keys.ENDED]
        raw = self._read("text", lambda r: r.get(keys.text(job_id))) or b""
        raw = raw.encode() if isinstance(raw, str) else raw
        packed = pack_text(raw)
        args: list[str | int | bytes] = [job_id, len(raw), packed or ""]
        status, *rest = self._run("trim_events", job_keys, args, job_id, tries=WRITE_TRIES)
        if status == "ok":
            return int(rest[0])
        if status in ("not_found", "not_ended", "already_trimmed"):
            return 0
        self._refused(status, rest, job_id, "trim_events")

    def amend_ledger(self, job_id: str, *, response_id: str, provider: str, tokens: int) -> bool:
        """Count what a cancelled job's background response made past the cursor, once it
        was stopped: into the record of the attempt that made it, and the totals (at most
        once per response). Answers whether it was counted now."""
        entry = {"provider": provider}
        self._note_provider(entry)
        deltas = {"output_tokens_billed": tokens, "naive_output_tokens_billed": tokens}
        job_keys = [keys.job(job_id), keys.ledger(job_id), *_totals_keys(entry)]
        args: list[str | int] = [response_id, tokens, json.dumps(deltas) if tokens else ""]
        status, *rest = self._run("ledger_amend", job_keys, args, job_id, tries=WRITE_TRIES)
        if status in ("not_found", "counted", "no_record"):
            return False
        if status != "ok":
            self._refused(status, rest, job_id, "ledger_amend")
        return True

    def _note_provider(self, entry: Mapping[str, Any] | None) -> None:
        """Register the provider a ledger record is about to count for, once per process,
        before the record's totals are written: the metrics list every provider with
        totals (a registered one with none yet shows zeros)."""
        provider = (entry or {}).get("provider")
        if not provider or provider in self._providers_noted:
            return
        now_ms = int(time.time() * 1000)
        self._read("providers", lambda r: r.zadd(keys.PROVIDERS, {provider: now_ms}, nx=True))
        self._providers_noted.add(provider)

    def providers(self, limit: int = MAX_PROVIDER_SERIES) -> list[str]:
        """The provider profiles with running totals, by name: the first ``limit`` of them
        to have been counted. A store written before the registry existed is registered
        from its totals' keys, once."""
        names = self._read("providers", lambda r: r.zrange(keys.PROVIDERS, 0, limit - 1))
        if not names:
            prefix = keys.totals_of("x")[:-1]

            def seed(r: redis.Redis) -> list[Any]:
                found = [_s(k)[len(prefix) :] for k in r.scan_iter(match=f"{prefix}*", count=500)]
                if found:
                    r.zadd(keys.PROVIDERS, dict.fromkeys(found, 0), nx=True)
                return found[:limit]

            names = self._read("providers", seed)
        return sorted(_s(n) for n in names)

    def forget_provider(self, provider: str) -> bool:
        """Retire a provider's series: its running totals and its place in the registry
        (the totals of all providers together keep what it counted). Answers whether it
        was registered."""
        key = keys.totals_of(provider)

        def forget(r: redis.Redis) -> Any:
            with r.pipeline() as pipe:
                pipe.zrem(keys.PROVIDERS, provider)
                pipe.delete(key)
                return pipe.execute()

        removed, _ = self._read("forget_provider", forget)
        self._providers_noted.discard(provider)
        return bool(removed)

    def totals(self, provider: str | None = None, *, day: str | None = None) -> dict[str, int]:
        """The running totals (all jobs', or one provider's), or those of the ledger records
        written on ``day`` (``YYYY-MM-DD``, UTC; kept 40 days)."""
        if day is not None:
            key = keys.totals_day(day)
        else:
            key = keys.totals_of(provider) if provider else keys.TOTALS
        raw = self._read("totals", lambda r: r.hgetall(key))
        return {_s(k): int(v) for k, v in raw.items()}

    def forget_expired(self, count: int) -> int:
        """Remove from the index of every job the oldest entries (up to ``count`` looked
        at) whose job is gone (retention ran out); answers how many went."""
        oldest = [_s(m) for m in self._read("jobs", lambda r: r.zrange(keys.JOBS, 0, count - 1))]
        if not oldest:
            return 0
        with self.redis.pipeline(transaction=False) as pipe:
            for job_id in oldest:
                pipe.exists(keys.job(job_id))
            alive = pipe.execute()
        gone = [job_id for job_id, n in zip(oldest, alive, strict=True) if not n]
        return int(self.redis.zrem(keys.JOBS, *gone)) if gone else 0

    def live_counts(self) -> dict[str, int]:
        """How many jobs are in each state that is not terminal, now."""
        indexes = {
            "queued": keys.QUEUED,
            "running": keys.RUNNING,
            "stalled": keys.STALLED,
            "spilled": keys.SPILLED,
        }

        def counts(r: redis.Redis) -> list[Any]:
            with r.pipeline(transaction=False) as pipe:
                for key in indexes.values():
                    pipe.zcard(key)
                return pipe.execute()

        return dict(zip(indexes, (int(n) for n in self._read("live_counts", counts)), strict=True))

    def in_state(self, state: str, *, limit: int, offset: int = 0) -> list[str]:
        """Ids of jobs in a state that is not terminal, longest there first."""
        index = {"queued": keys.QUEUED, "running": keys.RUNNING, "stalled": keys.STALLED,
                 "spilled": keys.SPILLED}.get(state)  # fmt: skip
        if index is None:
            raise ValueError(f"no index of {state!r} jobs (queued, running, stalled, spilled)")
        ids = self._read("in_state", lambda r: r.zrange(index, offset, offset + limit - 1))
        return [_s(i) for i in ids]

    # -- hook runs -----------------------------------------------------------------------

    def claim_hook(
        self, job_id: str, hook: str, *, token: str, ttl_ms: int
    ) -> Literal["ok", "done", "busy"]:
        """Take the lease of a hook run: ``ok``, ``done`` (it ran already) or ``busy``
        (another run holds it)."""
        job_keys = [keys.job(job_id), keys.hook_lease(job_id, hook)]
        args: list[str | int] = [hook, token, _positive(ttl_ms, "ttl_ms")]
        status, *rest = self._run("hook_claim", job_keys, args, job_id, tries=WRITE_TRIES)
        for answer in ("ok", "done", "busy"):
            if status == answer:
                return answer
        self._refused(status, rest, job_id, "hook_claim")

    def renew_hook(self, job_id: str, hook: str, *, token: str, ttl_ms: int) -> bool:
        """Extend a hook run's lease; answers False once it is no longer this run's."""
        status, *_ = self._run(
            "hook_renew", [keys.hook_lease(job_id, hook)], [token, ttl_ms], job_id
        )
        return bool(status == "ok")

    def hook_done(self, job_id: str, hook: str, *, token: str) -> None:
        """Record that the hook ran: nobody runs it again."""
        job_keys = [keys.job(job_id), keys.hook_lease(job_id, hook), keys.outbox(job_id),
                    keys.OUTBOX]  # fmt: skip
        status, *rest = self._run(
            "hook_done", job_keys, [job_id, hook, token], job_id, tries=WRITE_TRIES
        )
        if status != "ok":
            self._refused(status, rest, job_id, "hook_done")

    def hook_ran(self, job_id: str, hook: str) -> bool:
        """Whether the hook has run for the job."""
        done = self._read("hook_ran", lambda r: r.hexists(keys.job(job_id), f"hook_done:{hook}"))
        return bool(done)

    def hook_running(self, job_id: str, hook: str) -> bool:
        """Whether a run of the hook holds its lease."""
        held = self._read("hook_running", lambda r: r.exists(keys.hook_lease(job_id, hook)))
        return bool(held)

    def outbox_pending(self, age_ms: int, *, limit: int = 100) -> list[str]:
        """Ids of jobs whose outbox has held an entry for at least ``age_ms``."""
        return self._before(keys.OUTBOX, age_ms, limit, "outbox_pending")

    # -- owner side ----------------------------------------------------------------------

    def acquire(
        self, job_id: str, *, worker: str, ttl_ms: int, prompt_hash: str | None = None
    ) -> Acquired:
        """Take a queued job's lease: attempt + 1, ``queued`` → ``running``.

        With ``prompt_hash``, a job whose stored hash differs is refused with
        :class:`~resumeq.core.errors.InvalidTransition` (state ``conflict``).
        """
        job_keys = [
            keys.job(job_id),
            keys.lease(job_id),
            keys.LEASES,
            keys.QUEUED,
            keys.events(job_id),
            keys.text(job_id),
            keys.outbox(job_id),
            keys.OUTBOX,
            keys.RUNNING,
        ]
        args: list[str | int] = [
            _check_owner(worker),
            request_id(),  # the nonce of the fencing token
            _positive(ttl_ms, "ttl_ms"),
            prompt_hash or "",
        ]
        status, *rest = self._run("acquire", job_keys, args, job_id, tries=WRITE_TRIES)
        if status == "ok":
            return self._acquired(job_id, rest, ttl_ms)
        if status == "busy":
            raise InvalidTransition(
                f"job {job_id} already has a lease", job_id=job_id, state="running"
            )
        if status == "conflict":
            raise InvalidTransition(
                f"job {job_id}: prompt hash differs from the stored one ({_s(rest[0])[:12]}…); "
                "a cursor is never spliced onto an edited prompt",
                job_id=job_id,
                state="conflict",
            )
        self._refused(status, rest, job_id, "acquire")

    def renew(self, lease: Lease) -> Lease:
        """Extend the lease by its TTL; refused once it is lost or the job cancelled."""
        job_id = lease.job_id
        status, *rest = self._run("renew", _renew_keys(job_id), [lease.token, lease.ttl_ms], job_id)
        return self._renewed(lease, [_s(status), *rest])

    def renew_many(self, leases: Sequence[Lease]) -> list[Lease | StoreError]:
        """Renew many leases in one round trip (a pipeline, not a transaction): for each,
        the extended lease, or the error :meth:`renew` would have raised. Redis out of
        reach is raised, for all of them."""
        if not leases:
            return []
        with redis_errors("renew"), self.redis.pipeline(transaction=False) as pipe:
            for lease in leases:
                self._scripts.queue(pipe, "renew", _renew_keys(lease.job_id),
                                    [lease.token, lease.ttl_ms])  # fmt: skip
            replies = pipe.execute(raise_on_error=False)
        out: list[Lease | StoreError] = []
        for lease, reply in zip(leases, replies, strict=True):
            try:
                if isinstance(reply, Exception):
                    with redis_errors("renew"):
                        raise reply
                out.append(self._renewed(lease, [_s(reply[0]), *reply[1:]]))
            except StoreError as exc:
                out.append(exc)
        return out

    def _renewed(self, lease: Lease, reply: list[Any]) -> Lease:
        status, *rest = reply
        if status != "ok":
            self._refused(status, rest, lease.job_id, "renew")
        return replace(lease, deadline_ms=int(rest[0]))

    def flush(
        self,
        lease: Lease,
        *,
        expected_revision: int,
        delta: str,
        tokens: int,
        exact: bool = True,
        extend_lease: bool = True,
        hidden_bytes: int = 0,
        request: str | None = None,
        response: ResponsePosition | None = None,
    ) -> FlushResult:
        """Checkpoint ``delta`` (``tokens`` output tokens) onto the prefix.

        One round trip: token and revision checks, APPEND, cursor and revision update,
        the event, and (``extend_lease``) the lease extension.

        ``exact`` says whether this attempt's total count is exact after the flush: an
        attempt that counted chunk by chunk (a lower bound) and then learns its total (a
        final usage chunk, a tokenizer call, an estimate) sends the difference with the
        label. ``tokens`` is never negative: no write lowers the cursor. The owner of a
        ``stalled`` job (a janitor) may flush too: a dead attempt's estimate.

        ``hidden_bytes`` is output that is not text (reasoning) in the same span: counted,
        for a janitor's estimate of an attempt that died.

        ``response``: the background response the delta came from and the last event of it
        the stored text then includes, written with the text so that they never disagree.

        Sent once: a caller that got no answer sends it again with the same ``request``
        id, and a flush that had been applied answers as it did.
        """
        if tokens < 0:
            raise ValueError(f"a flush never lowers the cursor (tokens {tokens})")
        job_id = lease.job_id
        job_keys = [
            keys.job(job_id),
            keys.text(job_id),
            keys.lease(job_id),
            keys.events(job_id),
            keys.LEASES,
        ]
        args: list[str | int] = [
            lease.token,
            _non_negative(expected_revision, "expected_revision"),
            delta,
            tokens,
            "1" if exact else "0",
            lease.ttl_ms if extend_lease else 0,
            request or request_id(),
            _non_negative(hidden_bytes, "hidden_bytes"),
            *(response.args() if response is not None else ("", "", "")),
            "1" if self.replicated else "0",
        ]
        status, *rest = self._run("flush", job_keys, args, job_id)
        if status != "ok":
            self._refused(status, rest, job_id, "flush", expected_revision)
        return FlushResult(
            revision=int(rest[0]), spent_output_tokens=int(rest[1]), prefix_bytes=int(rest[2])
        )

    def note_response(self, lease: Lease, response: ResponsePosition) -> None:
        """Record the background response the lease's attempt made, as soon as it is named
        (before any of its output): a cut after it reattaches instead of buying it again."""
        self._response(lease, "note", response.args())

    def forget_response(self, lease: Lease) -> None:
        """Forget the job's background response: the next attempts do not read it."""
        self._response(lease, "forget", ("", "", ""))

    def _response(self, lease: Lease, mode: str, args: Sequence[str]) -> None:
        job_id = lease.job_id
        job_keys = [keys.job(job_id), keys.lease(job_id), keys.text(job_id)]
        status, *rest = self._run("response", job_keys, [lease.token, mode, *args], job_id)
        if status != "ok":
            self._refused(status, rest, job_id, f"response {mode}")

    def finish(
        self,
        lease: Lease,
        *,
        state: Literal["done", "failed"],
        finish_reason: str = "",
        error: str = "",
        ledger: Mapping[str, Any] | None = None,
        expected_revision: int | None = None,
        hooks: Sequence[str] = (),
    ) -> int:
        """End the job as ``done`` or ``failed``; answers the new revision. A done job
        gets its ``hooks`` in its outbox in the same step (each stays there until it has
        run); its idempotency key expires with it."""
        job_id = lease.job_id
        self._note_provider(ledger)
        job_keys = [
            keys.job(job_id),
            keys.lease(job_id),
            keys.LEASES,
            keys.events(job_id),
            keys.text(job_id),
            keys.ledger(job_id),
            keys.outbox(job_id),
            keys.OUTBOX,
            *_ENDING_INDEXES,
            *_totals_keys(ledger),
            *self._idempotency_key_of(job_id),
        ]
        args: list[str | int] = [
            lease.token,
            _optional(expected_revision),
            state,
            finish_reason,
            error,
            _ledger_json(ledger),
            self.settings.retention_s,
            request_id(),
            _totals_json(ledger),
            *(hooks if state == "done" else ()),
        ]
        return self._write("finish", job_keys, args, job_id, expected_revision)

    def release(
        self,
        lease: Lease,
        *,
        to: Literal["queued", "abandoned", "spilled"],
        reason: str,
        ledger: Mapping[str, Any] | None = None,
        expected_revision: int | None = None,
        delay_ms: int = 0,
        progressed: bool = True,
    ) -> int:
        """Apply the gate's exit and give up the lease; answers the new revision. The next
        attempt (``queued``: after ``delay_ms``; ``spilled``: on the spill lane) goes into
        the outbox in the same step. ``progressed``: whether the attempt delivered output
        (a run of attempts that did not is kept, for pacing retries).

        A second spill of the same job is refused with
        :class:`~resumeq.core.errors.SpillExhausted`.
        """
        job_id = lease.job_id
        self._note_provider(ledger)
        job_keys = [
            keys.job(job_id),
            keys.lease(job_id),
            keys.LEASES,
            keys.events(job_id),
            keys.QUEUED,
            keys.SPILLED,
            keys.text(job_id),
            keys.ledger(job_id),
            keys.outbox(job_id),
            keys.OUTBOX,
            *_ENDING_INDEXES,
            *_totals_keys(ledger),
            *(self._idempotency_key_of(job_id) if to == "abandoned" else []),
        ]
        args: list[str | int] = [
            lease.token,
            _optional(expected_revision),
            to,
            reason,
            _ledger_json(ledger),
            self.settings.retention_s,
            request_id(),
            _non_negative(delay_ms, "delay_ms"),
            SPILL_QUEUE,
            _totals_json(ledger),
            "1" if progressed else "0",
        ]
        return self._write("release", job_keys, args, job_id, expected_revision)

    # -- janitor side --------------------------------------------------------------------

    def reap(self, job_id: str, *, janitor: str, ttl_ms: int, dead_token: str = "") -> ReapResult:
        """Take over a running job whose lease is gone (``running`` → ``stalled``), or
        still held by ``dead_token``: an owner known dead before its lease expired."""
        job_keys = [
            keys.job(job_id),
            keys.lease(job_id),
            keys.LEASES,
            keys.events(job_id),
            keys.RUNNING,
            keys.STALLED,
        ]
        args: list[str | int] = [
            job_id,
            _check_owner(janitor),
            request_id(),  # the nonce of the fencing token
            _positive(ttl_ms, "ttl_ms"),
            dead_token,
        ]
        status, *rest = self._run("reap", job_keys, args, job_id, tries=WRITE_TRIES)
        if status == "ok":
            acquired = self._acquired(job_id, rest, ttl_ms)
            return ReapResult("reaped", acquired=acquired, state="stalled")
        if status == "alive":
            return ReapResult("alive", state="running")
        if status == "not_running":
            return ReapResult("gone", state=_s(rest[0]))
        if status == "not_found":
            return ReapResult("gone")
        self._refused(status, rest, job_id, "reap")

    # -- many jobs at once (a janitor after a process died with hundreds of streams) -------
    #
    # Each write below is built by the single-job method itself, run against a planner
    # that stops where the method would send its script (so the keys and arguments are
    # exactly the method's, request id included); the scripts then go to Redis together in
    # one pipeline, not a transaction: each is atomic on its own, as it would be alone, and
    # one job's refusal leaves the others alone. Each answer is the single method's result
    # or the error it would have raised; Redis out of reach is raised for all of them, after
    # the pipeline was sent again unchanged (each write's request id makes a re-send that
    # was applied answer as it did).

    def write_many(
        self,
        writes: Sequence[Callable[[Store], object]],
        *,
        idempotency: Mapping[str, str | None] | None = None,
    ) -> list[int | Exception]:
        """Many fenced writes in one round trip, each given as a call of one of this
        store's write methods whose script answers ``{'ok', n, ...}`` on success (release,
        finish, flush, outbox_done, …), e.g. ``lambda s: s.release(lease, to=…)``.
        Answers, for each, ``n`` (the new revision, the entries left) or the error.

        ``idempotency`` (job id → its idempotency key, from a record just read) spares
        the read that finish and release to ``abandoned`` make for it."""
        calls = [self._plan(write, idempotency) for write in writes]
        replies = self._run_many([c for c in calls if isinstance(c, ScriptCall)], "write_many")
        answers = iter(replies)
        out: list[int | Exception] = []
        for call in calls:
            if not isinstance(call, ScriptCall):
                out.append(call)
                continue
            reply = next(answers)
            if isinstance(reply, Exception):
                out.append(reply)
                continue
            try:
                status, *rest = reply
                if status != "ok":
                    self._refused(status, rest, call.job_id, call.name)
                out.append(int(rest[0]))
            except (StoreError, ValueError) as exc:
                out.append(exc)
        return out

    def reap_many(
        self,
        job_ids: Sequence[str],
        *,
        janitor: str,
        ttl_ms: int,
        dead_tokens: Mapping[str, str] | None = None,
    ) -> list[ReapResult | Exception]:
        """:meth:`reap` for many jobs in one round trip; for each, what it found or the
        error (a :class:`~resumeq.core.errors.CorruptRecord` for a record that cannot be read).
        ``dead_tokens``: job id → the token of an owner known dead."""
        dead = dead_tokens or {}

        def reap(job_id: str) -> Callable[[Store], object]:
            token = dead.get(job_id, "")
            return lambda store: store.reap(
                job_id, janitor=janitor, ttl_ms=ttl_ms, dead_token=token
            )

        calls = [self._plan(reap(job_id)) for job_id in job_ids]
        replies = iter(self._run_many([c for c in calls if isinstance(c, ScriptCall)], "reap"))
        out: list[ReapResult | Exception] = []
        for call in calls:
            reply = call if not isinstance(call, ScriptCall) else next(replies)
            if isinstance(reply, Exception):
                out.append(reply)
                continue
            assert isinstance(call, ScriptCall)
            status, *rest = reply
            try:
                if status == "ok":
                    acquired = self._acquired(call.job_id, rest, ttl_ms)
                    out.append(ReapResult("reaped", acquired=acquired, state="stalled"))
                elif status == "alive":
                    out.append(ReapResult("alive", state="running"))
                elif status == "not_running":
                    out.append(ReapResult("gone", state=_s(rest[0])))
                elif status == "not_found":
                    out.append(ReapResult("gone"))
                else:
                    self._refused(status, rest, call.job_id, "reap")
            except (StoreError, ValueError) as exc:  # a record that cannot be read back
                out.append(exc)
        return out

    def attempt_texts(self, bases: Sequence[tuple[str, int]]) -> list[tuple[int, str]]:
        """For each ``(job id, byte offset)``, in one round trip: the length of the job's
        stored prefix in bytes, and its text from that offset on (a character boundary:
        where an attempt's text began). For jobs whose events are not trimmed."""

        def read(r: redis.Redis) -> list[Any]:
            with r.pipeline(transaction=False) as pipe:
                for job_id, offset in bases:
                    pipe.strlen(keys.text(job_id))
                    pipe.getrange(keys.text(job_id), _non_negative(offset, "offset"), -1)
                return pipe.execute()

        replies = self._read("attempt_texts", read) if bases else []
        it = iter(replies)
        return [
            (int(size), (tail or b"").decode("utf-8", errors="replace"))
            for size, tail in zip(it, it, strict=True)
        ]

    def outboxes(self, job_ids: Sequence[str]) -> list[dict[str, str]]:
        """:meth:`outbox` for many jobs, in one round trip."""

        def read(r: redis.Redis) -> list[Any]:
            with r.pipeline(transaction=False) as pipe:
                for job_id in job_ids:
                    pipe.hgetall(keys.outbox(job_id))
                return pipe.execute()

        replies = self._read("outboxes", read) if job_ids else []
        return [{_s(k): _s(v) for k, v in raw.items()} for raw in replies]

    def records(self, job_ids: Sequence[str]) -> list[JobRecord | StoreError]:
        """:meth:`get` for many jobs, in one round trip: for each, its record, or
        :class:`~resumeq.core.errors.JobNotFound` / :class:`~resumeq.core.errors.CorruptRecord`."""

        def read(r: redis.Redis) -> list[Any]:
            with r.pipeline(transaction=False) as pipe:
                for job_id in job_ids:
                    pipe.hgetall(keys.job(job_id))
                return pipe.execute()

        replies = self._read("records", read) if job_ids else []
        out: list[JobRecord | StoreError] = []
        for job_id, fields in zip(job_ids, replies, strict=True):
            try:
                if not fields:
                    raise JobNotFound(f"no job {job_id}", job_id=job_id)
                decoded = {_s(k): _s(v) for k, v in fields.items()}
                out.append(_record(job_id, decoded, check_spec=True))
            except StoreError as exc:
                out.append(exc)
        return out

    def _plan(
        self,
        write: Callable[[Store], object],
        idempotency: Mapping[str, str | None] | None = None,
    ) -> ScriptCall | Exception:
        """The script call ``write`` would make, or what it raised before making one."""
        try:
            write(_Planner(self, idempotency or {}))
        except _Planned as planned:
            return planned.call
        except (StoreError, ValueError) as exc:
            return exc
        raise AssertionError("the write made no script call")

    def _run_many(self, calls: Sequence[ScriptCall], op: str) -> list[list[Any] | Exception]:
        """Send ``calls`` in one pipeline; each answer as :meth:`_run` answers, or the error
        Redis answered for that one script."""
        if not calls:
            return []
        out: list[list[Any] | Exception] = []
        for call, reply in zip(calls, self._send_many(calls, op), strict=True):
            if isinstance(reply, Exception):
                try:
                    with redis_errors(call.name):
                        raise reply
                except RedisUnavailable:
                    raise  # (a failover: READONLY) every other call would fail too
                except StoreError as exc:
                    out.append(exc)
            elif not isinstance(reply, list) or not reply:
                out.append(StoreError(f"{call.name}: job {call.job_id}: answered {reply!r}"))
            else:
                out.append([_s(reply[0]), *reply[1:]])
        return out

    def _send_many(self, calls: Sequence[ScriptCall], op: str) -> list[Any]:
        """The pipeline of ``calls``, sent again unchanged up to ``WRITE_TRIES`` times when
        Redis does not answer; its raw replies (an error in place of a script that raised)."""
        pause = RETRY_PAUSE_S
        for left in range(WRITE_TRIES - 1, -1, -1):
            try:
                with redis_errors(op):
                    return self._send_pipeline(calls, op)
            except RedisUnavailable:
                if not left:
                    raise
                time.sleep(pause)
                pause *= 2
        raise AssertionError("unreachable")

    def _send_pipeline(self, calls: Sequence[ScriptCall], op: str) -> list[Any]:
        """One pipeline of ``calls``; with replica durability, ended by ``WAIT 1`` when any
        of them is :data:`REPLICATED`, and each applied one's revision marked durable."""
        wait = self.replicated and any(call.name in REPLICATED for call in calls)
        with self.redis.pipeline(transaction=False) as pipe:
            for call in calls:
                self._scripts.queue(pipe, call.name, call.keys, call.args)
            if wait:
                pipe.execute_command("WAIT", 1, self.settings.replica_timeout_ms)  # type: ignore[no-untyped-call]
            replies: list[Any] = pipe.execute(raise_on_error=False)
        if not wait:
            return replies
        acked = replies.pop()
        applied = [
            (call.job_id, int(reply[1]))
            for call, reply in zip(calls, replies, strict=True)
            if call.name in REPLICATED
            and isinstance(reply, list)
            and len(reply) > 1
            and _s(reply[0]) == "ok"
        ]
        if not applied:
            return replies  # nothing written that a replica must hold
        if isinstance(acked, Exception):  # e.g. a demoted primary refuses WAIT
            raise ReplicaLagging(f"{op}: WAIT failed: {acked}") from acked
        self._acknowledged(op, int(acked), applied)
        return replies

    # -- plumbing ------------------------------------------------------------------------

    def _write(
        self,
        name: str,
        job_keys: list[str],
        args: list[str | int],
        job_id: str,
        expected_revision: int | None = None,
    ) -> int:
        """Run a write script whose success answers ``{'ok', revision}``."""
        status, *rest = self._run(name, job_keys, args, job_id, tries=WRITE_TRIES)
        if status != "ok":
            self._refused(status, rest, job_id, name, expected_revision)
        return int(rest[0])

    def _run(
        self,
        name: str,
        job_keys: list[str],
        args: Sequence[str | int | bytes],
        job_id: str,
        *,
        tries: int = 1,
    ) -> list[Any]:
        """Run a script; when Redis does not answer, send it again unchanged up to
        ``tries`` times (a write's request id makes a re-send that was applied answer as
        it did)."""
        pause = RETRY_PAUSE_S
        for left in range(tries - 1, -1, -1):
            try:
                with redis_errors(name):
                    reply = self._send(name, job_keys, args, job_id)
                return [_s(reply[0]), *reply[1:]]
            except RedisUnavailable:
                if not left:
                    raise
                time.sleep(pause)
                pause *= 2
        raise AssertionError("unreachable")

    def _send(
        self, name: str, job_keys: list[str], args: Sequence[str | int | bytes], job_id: str
    ) -> list[Any]:
        """Run script ``name`` once (with replica durability, as :meth:`_send_pipeline`
        runs a batch of one)."""
        if not (self.replicated and name in REPLICATED):
            return self._scripts.run(name, job_keys, args)
        (reply,) = self._send_pipeline([ScriptCall(name, job_keys, args, job_id)], name)
        if isinstance(reply, Exception):
            raise reply
        if not isinstance(reply, list) or not reply:
            raise TypeError(f"script {name} answered {reply!r}, not a status table")
        return reply

    def _acknowledged(self, op: str, acked: int, revisions: Sequence[tuple[str, int]]) -> None:
        """After ``WAIT 1``: raise :class:`ReplicaLagging` if no replica acknowledged the
        writes, else mark each job's revision durable for its followers."""
        if acked < 1:
            raise ReplicaLagging(
                f"{op}: no replica acknowledged the write within "
                f"{self.settings.replica_timeout_ms} ms (durability = replica)"
            )
        if not revisions:
            return
        with self.redis.pipeline(transaction=False) as pipe:
            for job_id, revision in revisions:
                self._scripts.queue(
                    pipe, "durable", [keys.job(job_id), keys.events(job_id)], [revision]
                )
            pipe.execute()

    def _read(self, op: str, fn: Callable[[redis.Redis], R]) -> R:
        """A read (idempotent), tried again once if Redis does not answer."""
        for left in (1, 0):
            try:
                with redis_errors(op):
                    return fn(self.redis)
            except RedisUnavailable:
                if not left:
                    raise
                time.sleep(RETRY_PAUSE_S)
        raise AssertionError("unreachable")

    def _before(self, index: str, age_ms: int, limit: int, op: str) -> list[str]:
        """Ids in a zset scored by time whose score is at least ``age_ms`` old (Redis
        server time), oldest first."""

        def ids(r: redis.Redis) -> list[Any]:
            sec, usec = r.time()
            cutoff = sec * 1000 + usec // 1000 - age_ms
            return r.zrangebyscore(index, "-inf", cutoff, start=0, num=limit)

        return [_s(i) for i in self._read(op, ids)]

    def _idempotency_key_of(self, job_id: str) -> list[str]:
        """The key of the job's idempotency key, if it has one (set once, at create)."""
        idem = self._read("idempotency key", lambda r: r.hget(keys.job(job_id), "idempotency_key"))
        return _idempotency_keys(decode(idem) if idem else None)

    def _acquired(self, job_id: str, rest: list[Any], ttl_ms: int) -> Acquired:
        token, deadline, *flat = rest
        lease = Lease(job_id=job_id, token=_s(token), deadline_ms=int(deadline), ttl_ms=ttl_ms)
        return Acquired(lease=lease, record=_record(job_id, _pairs(flat), check_spec=True))

    def _refused(
        self,
        status: str,
        rest: list[Any],
        job_id: str,
        op: str,
        expected_revision: int | None = None,
    ) -> NoReturn:
        detail = _s(rest[0]) if rest else ""
        if status == "not_found":
            raise JobNotFound(f"{op}: no job {job_id}", job_id=job_id)
        if status == "cancelled":
            raise JobCancelled(f"{op}: job {job_id} was cancelled", job_id=job_id)
        if status == "lease_lost":
            raise LeaseLost(
                f"{op}: job {job_id}: this fencing token no longer holds the lease",
                job_id=job_id,
            )
        if status == "stale_revision":
            raise StaleRevision(
                f"{op}: job {job_id} is at revision {detail}, not {expected_revision}",
                job_id=job_id,
                expected=expected_revision if expected_revision is not None else -1,
                current=int(detail),
            )
        if status == "spill_exhausted":
            raise SpillExhausted(
                f"{op}: job {job_id} has spilled once already; spill is not a loop",
                job_id=job_id,
                state="spilled",
            )
        if status == "corrupt":
            raise CorruptRecord(
                f"{op}: job {job_id}: corrupt record: field {detail} is missing or invalid",
                job_id=job_id,
            )
        if status == "bad_argument":
            raise ValueError(f"{op}: job {job_id}: {detail}")
        if status == "wrong_state":
            raise InvalidTransition(f"{op}: job {job_id} is {detail}", job_id=job_id, state=detail)
        raise StoreError(f"{op}: job {job_id}: unexpected script answer {status!r} {detail}")


def _renew_keys(job_id: str) -> list[str]:
    return [keys.job(job_id), keys.lease(job_id), keys.LEASES]


def _ending_keys(job_id: str) -> list[str]:
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
        *_ENDING_INDEXES,
        keys.TOTALS,
    ]


#: The indexes a script that ends a job (or an attempt) takes it out of or puts it in.
_ENDING_INDEXES = (keys.RUNNING, keys.STALLED, keys.ENDED)


def _totals_keys(entry: Mapping[str, Any] | None) -> list[str]:
    """The running totals a ledger record adds to: all jobs', its provider's, and today's
    (UTC, by this process's clock: a record written at midnight may count for either day)."""
    provider = (entry or {}).get("provider")
    return [
        keys.TOTALS,
        keys.totals_of(provider) if provider else keys.TOTALS,
        keys.totals_day(time.strftime("%Y-%m-%d", time.gmtime())),
    ]


def _totals_json(entry: Mapping[str, Any] | None) -> str:
    """What a ledger record adds to the totals; a partial record (a tool's, a test's)
    counts as an attempt and nothing more."""
    if entry is None:
        return ""
    from resumeq.core.ledger import AttemptRecord  # noqa: PLC0415 - the writers' model, not a reader's

    try:
        deltas = AttemptRecord.model_validate(entry).totals()
    except ValueError:
        deltas = {"attempts": 1}
    return json.dumps(deltas, separators=(",", ":"))


def _idempotency_keys(key: str | None) -> list[str]:
    return [keys.idempotency(key)] if key else []


def _record(job_id: str, fields: dict[str, str], *, check_spec: bool = False) -> JobRecord:
    """The record of a job hash, or :class:`~resumeq.core.errors.CorruptRecord`. Its spec is
    validated when first used, or now with ``check_spec`` (what a worker or a janitor is
    about to act on: a spec it cannot read fails the job there, not in its attempt)."""
    try:
        record = JobRecord.from_hash(fields)
    except ValueError as exc:
        raise CorruptRecord(f"job {job_id}: corrupt record: {exc}", job_id=job_id) from None
    if check_spec:
        record.spec  # noqa: B018 - validated now: CorruptRecord here
    return record


def _ledger_json(entry: Mapping[str, Any] | None) -> str:
    return "" if entry is None else json.dumps(dict(entry), separators=(",", ":"))


def _optional(value: int | None) -> str | int:
    return "" if value is None else value


def _positive(value: int, name: str) -> int:
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    return value


def _non_negative(value: int, name: str) -> int:
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


# -- many jobs at once: the planner -----------------------------------------------------


class ScriptCall:
    """One run of a store script, as a write method built it."""

    __slots__ = ("args", "job_id", "keys", "name")

    def __init__(
        self, name: str, job_keys: list[str], args: Sequence[str | int | bytes], job_id: str
    ) -> None:
        self.name, self.keys, self.args, self.job_id = name, job_keys, list(args), job_id


class _Planned(Exception):
    """Not an error: how a planned call leaves the write method that built it."""

    def __init__(self, call: ScriptCall) -> None:
        super().__init__(call.name)
        self.call = call


class _Planner(Store):
    """A store whose write methods stop where they would run their script, raising the
    call instead (reads still go to Redis). ``idempotency``: job id → idempotency key,
    known already."""

    def __init__(self, store: Store, idempotency: Mapping[str, str | None]) -> None:
        # The store's own state, shared (no super().__init__(): it would register the
        # scripts again, and nothing is sent from here).
        self.__dict__.update(store.__dict__)
        self._idempotency = idempotency

    def _run(
        self,
        name: str,
        job_keys: list[str],
        args: Sequence[str | int | bytes],
        job_id: str,
        *,
        tries: int = 1,
    ) -> list[Any]:
        raise _Planned(ScriptCall(name, job_keys, args, job_id))

    def _idempotency_key_of(self, job_id: str) -> list[str]:
        if job_id in self._idempotency:
            return _idempotency_keys(self._idempotency[job_id])
        return super()._idempotency_key_of(job_id)
