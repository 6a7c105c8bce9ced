"""Leases: taking a queued job's lease (acquire), keeping it (renew, many at once), taking
over one whose owner is gone (reap, many at once), and the leases' index read back.

A lease is the job's lease key holding the owner's fencing token; every write of an
attempt presents that token (:mod:`resumeq.store.attempts`).
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal, cast

import redis

from resumeq.core.errors import InvalidTransition, StoreError
from resumeq.core.models import Acquired, Lease, lease_holder
from resumeq.store import keys
from resumeq.store.codec import check_owner, decode, job_record, pairs, positive
from resumeq.store.transport import (
    WRITE_TRIES,
    Planner,
    ScriptCall,
    Transport,
    planned,
    redis_errors,
    refused,
)


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


class Leases:
    """The leases of jobs: who holds a job, until when."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport

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
            check_owner(worker),
            self.transport.request_id(),  # the nonce of the fencing token
            positive(ttl_ms, "ttl_ms"),
            prompt_hash or "",
        ]
        status, *rest = self.transport.run("acquire", job_keys, args, job_id, tries=WRITE_TRIES)
        if status == "ok":
            return self._acquired(job_id, rest, ttl_ms)
        if status == "busy":
            raise InvalidTransition(
                f"job {job_id} already has a lease", job_id=job_id, state="running"
            )
        if status == "conflict":
            raise InvalidTransition(
                f"job {job_id}: prompt hash differs from the stored one ({decode(rest[0])[:12]}…); "
                "a cursor is never spliced onto an edited prompt",
                job_id=job_id,
                state="conflict",
            )
        refused(status, rest, job_id, "acquire")

    def renew(self, lease: Lease) -> Lease:
        """Extend the lease by its TTL; refused once it is lost or the job cancelled."""
        job_id = lease.job_id
        status, *rest = self.transport.run(
            "renew", _renew_keys(job_id), [lease.token, lease.ttl_ms], job_id
        )
        return self._renewed(lease, [decode(status), *rest])

    def renew_many(self, leases: Sequence[Lease]) -> list[Lease | StoreError]:
        """Renew many leases in one round trip (a pipeline, not a transaction): for each,
        the extended lease, or the error :meth:`renew` would have raised. Redis out of
        reach is raised, for all of them."""
        if not leases:
            return []
        with redis_errors("renew"), self.transport.redis.pipeline(transaction=False) as pipe:
            for lease in leases:
                args: list[str | int] = [lease.token, lease.ttl_ms]
                self.transport.scripts.queue(pipe, "renew", _renew_keys(lease.job_id), args)
            replies = pipe.execute(raise_on_error=False)
        out: list[Lease | StoreError] = []
        for lease, reply in zip(leases, replies, strict=True):
            try:
                if isinstance(reply, Exception):
                    with redis_errors("renew"):
                        raise reply
                out.append(self._renewed(lease, [decode(reply[0]), *reply[1:]]))
            except StoreError as exc:
                out.append(exc)
        return out

    def _renewed(self, lease: Lease, reply: list[Any]) -> Lease:
        status, *rest = reply
        if status != "ok":
            refused(status, rest, lease.job_id, "renew")
        return replace(lease, deadline_ms=int(rest[0]))

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
            check_owner(janitor),
            self.transport.request_id(),  # the nonce of the fencing token
            positive(ttl_ms, "ttl_ms"),
            dead_token,
        ]
        status, *rest = self.transport.run("reap", job_keys, args, job_id, tries=WRITE_TRIES)
        if status == "ok":
            acquired = self._acquired(job_id, rest, ttl_ms)
            return ReapResult("reaped", acquired=acquired, state="stalled")
        if status == "alive":
            return ReapResult("alive", state="running")
        if status == "not_running":
            return ReapResult("gone", state=decode(rest[0]))
        if status == "not_found":
            return ReapResult("gone")
        refused(status, rest, job_id, "reap")

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
        planner = Leases(Planner(self.transport, {}))
        reap = functools.partial(planner.reap, janitor=janitor, ttl_ms=ttl_ms)
        calls = [planned(functools.partial(reap, j, dead_token=dead.get(j, ""))) for j in job_ids]
        sent = [c for c in calls if isinstance(c, ScriptCall)]
        replies = iter(self.transport.run_many(sent, "reap"))
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
                    out.append(ReapResult("gone", state=decode(rest[0])))
                elif status == "not_found":
                    out.append(ReapResult("gone"))
                else:
                    refused(status, rest, call.job_id, "reap")
            except (StoreError, ValueError) as exc:  # a record that cannot be read back
                out.append(exc)
        return out

    def expired_leases(self, *, limit: int = 100) -> list[str]:
        """Ids of jobs whose lease deadline (Redis server time) has passed."""
        return self.transport.before(keys.LEASES, 0, limit, "expired_leases")

    def leases_held_by(self, workers: Collection[str]) -> dict[str, str]:
        """Job id → fencing token of every lease held by one of ``workers`` (by the name in
        its token): read when workers died, not on every check (O(leases), pipelined)."""
        if not workers:
            return {}
        job_ids = [
            decode(j) for j in self.transport.read("leases", lambda r: r.zrange(keys.LEASES, 0, -1))
        ]
        held: dict[str, str] = {}
        for start in range(0, len(job_ids), 1000):
            batch = job_ids[start : start + 1000]

            def tokens(r: redis.Redis, batch: list[str] = batch) -> list[Any]:
                return cast(list[Any], r.mget([keys.lease(j) for j in batch]))

            for job_id, token in zip(
                batch, self.transport.read("lease tokens", tokens), strict=True
            ):
                if token is not None and lease_holder(decode(token)) in workers:
                    held[job_id] = decode(token)
        return held

    def _acquired(self, job_id: str, rest: list[Any], ttl_ms: int) -> Acquired:
        token, deadline, *flat = rest
        lease = Lease(job_id=job_id, token=decode(token), deadline_ms=int(deadline), ttl_ms=ttl_ms)
        return Acquired(lease=lease, record=job_record(job_id, pairs(flat), check_spec=True))


def _renew_keys(job_id: str) -> list[str]:
    return [keys.job(job_id), keys.lease(job_id), keys.LEASES]
