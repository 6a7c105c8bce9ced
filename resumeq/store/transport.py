"""The script transport every piece of the store shares: how a script is sent, sent again
and answered.

Every refusal a script answers becomes a typed exception from :mod:`resumeq.core.errors`
(:func:`refused`); redis-py's errors are translated here, once (:func:`redis_errors`). The
store works on a bytes-mode Redis client (the one RQ uses too).

No write is re-sent blindly. Each carries a request id (:func:`request_id`), kept in the
record by the write that applied it; when Redis does not answer, the write is sent again
unchanged, and one that had been applied answers as it did instead of being refused or
applied twice (the client must not retry on its own: see :mod:`resumeq.store.connection`).

Many writes at once (a janitor after a process died with hundreds of streams) are built by
the single-job methods themselves, run over a :class:`Planner`: a transport that stops where
the method would send its script (so the keys and arguments are exactly the method's,
request id included). The scripts then go to Redis together in one pipeline
(:meth:`Transport.run_many`), not a transaction: each is atomic on its own, as it would be
alone, and one job's refusal leaves the others alone. Redis out of reach is raised for all
of them, after the pipeline was sent again unchanged (each write's request id makes a
re-send that was applied answer as it did).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import redis

from resumeq.core.errors import (
    CorruptRecord,
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
from resumeq.store import keys
from resumeq.store.codec import decode
from resumeq.store.scripts import Scripts

if TYPE_CHECKING:
    from resumeq.core.defaults import StoreDefaults
    from resumeq.core.settings import StoreSettings

R = TypeVar("R")

#: How often a write is sent when Redis does not answer, and the pause before the first
#: re-send (doubled each time).
WRITE_TRIES = 3
RETRY_PAUSE_S = 0.1
#: The writes that add an event at a revision they answer (``{'ok', revision, ...}``):
#: with ``[store] durability = "replica"`` each waits for a replica, then marks its
#: revision durable for the followers.
REPLICATED = frozenset(("flush", "finish", "release", "cancel", "fail", "drop", "requeue"))


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


class ScriptCall:
    """One run of a store script, as a write method built it."""

    __slots__ = ("args", "job_id", "keys", "name")

    def __init__(
        self, name: str, job_keys: list[str], args: Sequence[str | int | bytes], job_id: str
    ) -> None:
        self.name, self.keys, self.args, self.job_id = name, job_keys, list(args), job_id


class Transport:
    """The Redis client, its scripts and the store's settings, with the one way each piece
    of the store sends a script or a read."""

    def __init__(self, client: redis.Redis, settings: StoreSettings | StoreDefaults) -> None:
        self.redis = client
        self.settings = settings
        self.scripts = Scripts(client)

    @property
    def replicated(self) -> bool:
        """Whether a write counts only once a replica acknowledged it (``[store]
        durability = "replica"``)."""
        return self.settings.durability == "replica"

    @staticmethod
    def request_id() -> str:
        """A new write's request id (:func:`request_id`, looked up when called: a test
        that replaces it there replaces it for every piece)."""
        return request_id()

    def write(
        self,
        name: str,
        job_keys: list[str],
        args: list[str | int],
        job_id: str,
        expected_revision: int | None = None,
    ) -> int:
        """Run a write script whose success answers ``{'ok', revision}``."""
        status, *rest = self.run(name, job_keys, args, job_id, tries=WRITE_TRIES)
        if status != "ok":
            refused(status, rest, job_id, name, expected_revision)
        return int(rest[0])

    def run(
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
                return [decode(reply[0]), *reply[1:]]
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
            return self.scripts.run(name, job_keys, args)
        (reply,) = self._send_pipeline([ScriptCall(name, job_keys, args, job_id)], name)
        if isinstance(reply, Exception):
            raise reply
        if not isinstance(reply, list) or not reply:
            raise TypeError(f"script {name} answered {reply!r}, not a status table")
        return reply

    def read(self, op: str, fn: Callable[[redis.Redis], R]) -> R:
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

    def before(self, index: str, age_ms: int, limit: int, op: str) -> list[str]:
        """Ids in a zset scored by time whose score is at least ``age_ms`` old (Redis
        server time), oldest first."""

        def ids(r: redis.Redis) -> list[Any]:
            sec, usec = r.time()
            cutoff = sec * 1000 + usec // 1000 - age_ms
            return r.zrangebyscore(index, "-inf", cutoff, start=0, num=limit)

        return [decode(i) for i in self.read(op, ids)]

    def idempotency_key_of(self, job_id: str) -> list[str]:
        """The key of the job's idempotency key, if it has one (set once, at create)."""
        idem = self.read("idempotency key", lambda r: r.hget(keys.job(job_id), "idempotency_key"))
        return idempotency_keys(decode(idem) if idem else None)

    # -- many scripts in one round trip ----------------------------------------------------

    def run_many(self, calls: Sequence[ScriptCall], op: str) -> list[list[Any] | Exception]:
        """Send ``calls`` in one pipeline; each answer as :meth:`run` answers, or the error
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
                out.append([decode(reply[0]), *reply[1:]])
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
                self.scripts.queue(pipe, call.name, call.keys, call.args)
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
            and decode(reply[0]) == "ok"
        ]
        if not applied:
            return replies  # nothing written that a replica must hold
        if isinstance(acked, Exception):  # e.g. a demoted primary refuses WAIT
            raise ReplicaLagging(f"{op}: WAIT failed: {acked}") from acked
        self.acknowledged(op, int(acked), applied)
        return replies

    def acknowledged(self, op: str, acked: int, revisions: Sequence[tuple[str, int]]) -> None:
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
                self.scripts.queue(
                    pipe, "durable", [keys.job(job_id), keys.events(job_id)], [revision]
                )
            pipe.execute()


# -- many jobs at once: the planner -------------------------------------------------------


class _Planned(Exception):
    """Not an error: how a planned call leaves the write method that built it."""

    def __init__(self, call: ScriptCall) -> None:
        super().__init__(call.name)
        self.call = call


class Planner(Transport):
    """A transport that stops where a write would run its script, raising the call instead
    (reads still go to Redis). ``idempotency``: job id → idempotency key, known already."""

    def __init__(self, transport: Transport, idempotency: Mapping[str, str | None]) -> None:
        # The transport's own state, shared (no super().__init__(): it would register the
        # scripts again, and nothing is sent from here).
        self.__dict__.update(transport.__dict__)
        self._idempotency = idempotency

    def run(
        self,
        name: str,
        job_keys: list[str],
        args: Sequence[str | int | bytes],
        job_id: str,
        *,
        tries: int = 1,
    ) -> list[Any]:
        raise _Planned(ScriptCall(name, job_keys, args, job_id))

    def idempotency_key_of(self, job_id: str) -> list[str]:
        if job_id in self._idempotency:
            return idempotency_keys(self._idempotency[job_id])
        return super().idempotency_key_of(job_id)


def planned(write: Callable[[], object]) -> ScriptCall | Exception:
    """The script call ``write`` (a write method over a :class:`Planner`) would make, or
    what it raised before making one."""
    try:
        write()
    except _Planned as planned:
        return planned.call
    except (StoreError, ValueError) as exc:
        return exc
    raise AssertionError("the write made no script call")


# -- answers ----------------------------------------------------------------------------


def refused(
    status: str,
    rest: list[Any],
    job_id: str,
    op: str,
    expected_revision: int | None = None,
) -> NoReturn:
    """A script's refusal as the typed exception it stands for."""
    detail = decode(rest[0]) if rest else ""
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


def idempotency_keys(key: str | None) -> list[str]:
    return [keys.idempotency(key)] if key else []
